-- Bad input, everywhere: every SQL function of the API called with NULLs,
-- wrong types, empty and huge (1 MB) strings, malformed and deeply nested
-- jsonb, unknown names, negative and huge intervals; and handlers that
-- return garbage, raise, loop past their timeout, COMMIT, or drop tables.
--
-- Each call prints its SQLSTATE and message (ids masked as N, long messages
-- clipped), then a verdict against the contract (the SQL reference, errors):
--   want 'ok'     the call succeeds
--   want 'pg'     a plain PostgreSQL error before the function runs (a
--                 literal of the wrong type, no such signature): acceptable
--   want SQLSTATE that SQLSTATE, with a message starting "gen_durable:"
-- A line ending in "<-- DEVIATION" is a case where the engine does not meet
-- the contract today: the expected output records it so the suite stays
-- green, and the deviation is reported; fixing the engine turns the line into
-- a plain verdict (update expected/030_bad_input.out then).
-- Steps run through gd._execute on queues no background executor serves.
-- The server must never crash and no instance may be lost or corrupted: the
-- invariants are checked at the end.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup

CREATE FUNCTION t.bad_clip(message text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(m) > 110 THEN left(m, 110) || '...(' || length(message) || ' chars)' ELSE m END
      FROM (SELECT regexp_replace(regexp_replace(message, '(instance|function|Instance) \d+', '\1 N', 'g'),
                                  '\s+', ' ', 'g') AS m) x
$$;

CREATE FUNCTION t.bad_try(want text, statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    code text := 'ok';
    message text;
    verdict text;
BEGIN
    BEGIN
        EXECUTE statement;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
    END;
    verdict := CASE
        WHEN want = 'ok' THEN CASE WHEN code = 'ok' THEN 'as expected' ELSE 'want success  <-- DEVIATION' END
        WHEN want = 'pg' THEN CASE WHEN code = 'ok' THEN 'want an error  <-- DEVIATION' ELSE 'plain PostgreSQL error (acceptable)' END
        WHEN code = 'ok' THEN 'want ' || want || '  <-- DEVIATION'
        WHEN code <> want THEN 'want ' || want || '  <-- DEVIATION'
        WHEN message NOT LIKE 'gen_durable: %' THEN 'want a gen_durable: message  <-- DEVIATION'
        ELSE 'as expected' END;
    RETURN code || coalesce(' ' || t.bad_clip(message), '') || '  => ' || verdict;
END $$;

-- FSMs of this file: bad (in-database, queue bad_q), bad_x (external, queue bad_xq).
CREATE FUNCTION t.bad_ok(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql
AS $$ SELECT gd_done() $$;
CREATE FUNCTION t.bad_wrong_result(state jsonb, ctx gd.context) RETURNS jsonb LANGUAGE sql
AS $$ SELECT state $$;
SELECT gd_define_fsm('bad', initial => 'a', queue => 'bad_q');
SELECT gd_define_step('bad', 'a', 't.bad_ok(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('bad_x', initial => 'e', queue => 'bad_xq');
SELECT gd_define_step('bad_x', 'e', NULL, max_attempts => 3);
SELECT gd_define_step('bad_x', 'f', NULL);

-- Instances of earlier suites are below this id (some delete theirs by hand).
CREATE TABLE t.bad_start AS SELECT coalesce(max(id), 0) AS last_id FROM gd.instances;

-- 1 MB strings: one that compresses (repeat) and one that does not (md5s).
CREATE TABLE t.bad_big AS
SELECT repeat('x', 1000000) AS x, (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 31250) i) AS r;
SELECT length(x) AS x_bytes, length(r) AS r_bytes FROM t.bad_big;

-- =========================================================================
-- gd_define_fsm(name, initial, queue, version, state_defaults)
-- =========================================================================
SELECT t.bad_try('22023', $$SELECT gd_define_fsm(NULL, 'a')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('', 'a')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', '')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', '')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', repeat('q', 64))$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', 0)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', -1)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', 1, NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', 1, 'null')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', 1, '[]')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', 1, '"text"')$$);
SELECT t.bad_try('pg', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', 'abc')$$);
SELECT t.bad_try('pg', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', 2147483648)$$);
SELECT t.bad_try('pg', $$SELECT gd_define_fsm('bad_n', 'a', state_defaults => '{"a": ')$$);
SELECT t.bad_try('pg', $$SELECT gd_define_fsm(1, 2)$$);
SELECT t.bad_try('pg', $$SELECT gd_define_fsm()$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm((SELECT x FROM t.bad_big), 'a', 'bad_q')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm((SELECT r FROM t.bad_big), 'a', 'bad_q')$$);
-- steps: an object of step names to gd_define_step's options.
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', steps => '[]')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', steps => '{"a": 1}')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', steps => '{"a": {"handlr": "t.x()"}}')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', steps => '{"a": {"max_attempts": "many"}}')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', steps => '{"a": {"max_attempts": 0}}')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', steps => '{"a": {"backoff": "soon"}}')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', steps => '{"": {}}')$$);
SELECT t.bad_try('42883', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', steps => '{"a": {"handler": "t.no_such(jsonb, gd.context)"}}')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', steps => '{"a": {"handler": 42}}')$$);
SELECT t.bad_try('42883', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', steps => '{"a": {"handler": "bad_handler(jsonb, gd.context)"}}')$$);
-- Nothing was defined by the refused calls.
SELECT count(*) AS refused_fsms_defined FROM gd.fsms WHERE name LIKE 'bad\_n%' OR length(name) > 1000;

-- =========================================================================
-- gd_define_step(fsm, step, handler, max_attempts, backoff, max_backoff, timeout, version)
-- =========================================================================
SELECT t.bad_try('42704', $$SELECT gd_define_step(NULL, 'a')$$);
SELECT t.bad_try('42704', $$SELECT gd_define_step('bad_nope', 'a')$$);
SELECT t.bad_try('42704', $$SELECT gd_define_step('bad', 'a', version => 99)$$);
SELECT t.bad_try('42704', $$SELECT gd_define_step('bad', 'a', version => 0)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', '')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'a', max_attempts => NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'a', max_attempts => 0)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'a', max_attempts => -5)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'a', backoff => NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'a', backoff => '-1s')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'a', max_backoff => NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'a', max_backoff => '-1 year')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'a', timeout => '0s')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'a', timeout => '-1s')$$);
SELECT t.bad_try('pg', $$SELECT gd_define_step('bad', 'a', backoff => 'soon')$$);
SELECT t.bad_try('pg', $$SELECT gd_define_step('bad', 'a', max_attempts => 'many')$$);
-- Handlers of the wrong signature.
SELECT t.bad_try('42883', $$SELECT gd_define_step('bad', 'a', 'now()'::regprocedure)$$);
SELECT t.bad_try('42883', $$SELECT gd_define_step('bad', 'a', 'jsonb_build_object()'::regprocedure)$$);
SELECT t.bad_try('42P13', $$SELECT gd_define_step('bad', 'a', 't.bad_wrong_result(jsonb, gd.context)'::regprocedure)$$);
SELECT t.bad_try('pg', $$SELECT gd_define_step('bad', 'a', 't.no_such_function(jsonb, gd.context)'::regprocedure)$$);
SELECT t.bad_try('pg', $$SELECT gd_define_step('bad', 'a', 'not a function')$$);
-- A handler OID that names no function at all.
SELECT t.bad_try('42883', $$SELECT gd_define_step('bad', 'b_dangling', 999999999::regprocedure)$$);
-- Intervals too large to be used as microseconds (the engine stores backoff
-- and max_backoff as int8 microseconds).
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'b_huge_backoff', 't.bad_ok(jsonb, gd.context)'::regprocedure, backoff => '1000000 years', max_backoff => '1000000 years')$$);
-- Delays, timeouts and leases are capped at 100 years (longer means never).
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', 'b_long', 't.bad_ok(jsonb, gd.context)'::regprocedure, timeout => '178000000 years')$$);
SELECT t.bad_try('ok', $$SELECT gd_define_step('bad', 'b_long', 't.bad_ok(jsonb, gd.context)'::regprocedure, timeout => '99 years')$$);
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', (SELECT r FROM t.bad_big))$$);
-- The steps of 'bad' after all this: a (the real one), b_long, and what was wrongly accepted.
SELECT step, handler IS NULL AS external, max_attempts, backoff, timeout FROM gd.steps WHERE fsm = 'bad' ORDER BY step;
-- Undo what was wrongly accepted, so the rest of the file does not depend on it.
DELETE FROM gd._steps WHERE fsm = 'bad' AND step IN ('b_dangling', 'b_huge_backoff');

-- =========================================================================
-- gd_insert(fsm, state, step, queue, priority, concurrency_key, correlation_key,
--           correlation_scope, rate_limit, weight, eligible_at, schedule_in, on_duplicate)
-- =========================================================================
CREATE TABLE t.bad_count AS SELECT count(*) AS before FROM gd.instances;
SELECT t.bad_try('42704', $$SELECT gd_insert(NULL)$$);
SELECT t.bad_try('42704', $$SELECT gd_insert('')$$);
SELECT t.bad_try('42704', $$SELECT gd_insert('bad_nope')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', 'null')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', '[1, 2]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', '"text"')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', '42')$$);
SELECT t.bad_try('pg', $$SELECT gd_insert('bad', '{"a": 1')$$);
SELECT t.bad_try('pg', $$SELECT gd_insert('bad', '{"a": 1}}')$$);
SELECT t.bad_try('pg', $$SELECT gd_insert('bad', E'{"a": "\\u0000"}')$$);
SELECT t.bad_try('42704', $$SELECT gd_insert('bad', step => '')$$);
SELECT t.bad_try('42704', $$SELECT gd_insert('bad', step => 'nowhere')$$);
SELECT t.bad_try('42704', $$SELECT gd_insert('bad', queue => '')$$);
SELECT t.bad_try('42704', $$SELECT gd_insert('bad', queue => 'bad_no_queue')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', priority => NULL)$$);
SELECT t.bad_try('pg', $$SELECT gd_insert('bad', priority => 2147483648)$$);
SELECT t.bad_try('pg', $$SELECT gd_insert('bad', priority => 'high')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', weight => NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', weight => 0)$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', weight => -1)$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', correlation_key => '')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', correlation_scope => '{NULL}')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', correlation_scope => '{bogus}')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', correlation_scope => '{done,DONE}')$$);
SELECT t.bad_try('pg', $$SELECT gd_insert('bad', correlation_scope => 'done')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', on_duplicate => NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', on_duplicate => 'ignore')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', eligible_at => now(), schedule_in => '1s')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', schedule_in => '-1s')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', schedule_in => '-178000000 years')$$);
SELECT t.bad_try('pg', $$SELECT gd_insert('bad', schedule_in => 'later')$$);
SELECT t.bad_try('pg', $$SELECT gd_insert('bad', eligible_at => 'tomorrowish')$$);
SELECT t.bad_try('pg', $$SELECT gd_insert(42)$$);
SELECT t.bad_try('pg', $$SELECT gd_insert('bad', bogus => 1)$$);
-- A schedule too far ahead for a timestamp.
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', schedule_in => '178000000 years')$$);
-- Accepted (and harmless): far-off and infinite eligibility, an empty scope.
SELECT t.bad_try('ok', $$SELECT gd_insert('bad', eligible_at => 'infinity')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', eligible_at => '-infinity')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', schedule_in => '100000 years')$$);
SELECT t.bad_try('ok', $$SELECT gd_insert('bad', schedule_in => '100 years')$$);
SELECT t.bad_try('ok', $$SELECT gd_insert('bad', correlation_key => 'bad-k', correlation_scope => '{}')$$);
SELECT t.bad_try('ok', $$SELECT gd_insert('bad', correlation_key => 'bad-k', correlation_scope => '{}')$$);
SELECT t.bad_try('ok', $$SELECT gd_insert('bad', priority => -2147483648)$$);
-- Only the accepted calls inserted anything.
SELECT count(*) - (SELECT before FROM t.bad_count) AS inserted FROM gd.instances;

-- =========================================================================
-- gd_insert_all(fsm, entries)
-- =========================================================================
UPDATE t.bad_count SET before = (SELECT count(*) FROM gd.instances);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '{}')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '"[]"')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[1]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[null]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[[]]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{}, {"bogus": 1}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"on_duplicate": "error"}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"priority": "high"}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"priority": 1e20}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"priority": 2147483648}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"weight": 1.5}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"weight": null}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"state": []}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"state": null}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"correlation_scope": "done"}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"correlation_scope": ["done", null]}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"correlation_key": ""}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"schedule_in": "-1s"}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"eligible_at": "2030-01-01", "schedule_in": "1s"}]')$$);
-- Malformed values inside the entries: the engine parses them, so the error is its to word.
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"schedule_in": "later"}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"eligible_at": "tomorrowish"}]')$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{"schedule_in": {"s": 1}}]')$$);
SELECT t.bad_try('42704', $$SELECT gd_insert_all('bad', '[{"fsm": "bad_nope"}]')$$);
SELECT t.bad_try('42704', $$SELECT gd_insert_all(NULL, '[{}]')$$);
SELECT t.bad_try('42704', $$SELECT gd_insert_all('bad', '[{"step": 5}]')$$);
SELECT t.bad_try('42704', $$SELECT gd_insert_all('bad', '[{"queue": ["bad_q"]}]')$$);
SELECT t.bad_try('pg', $$SELECT gd_insert_all('bad', '[{]')$$);
-- One refused entry refuses the whole call: nothing of it stays.
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', '[{}, {}, {"weight": 0}]')$$);
SELECT t.bad_try('ok', $$SELECT gd_insert_all('bad', '[]')$$);
SELECT count(*) - (SELECT before FROM t.bad_count) AS inserted FROM gd.instances;

-- =========================================================================
-- Huge strings (1 MB) and deeply nested jsonb
-- =========================================================================
-- Names are keys of unique indexes: a 1 MB one must be refused by the
-- engine (22023), not by the index (54000 "index row requires ... bytes").
SELECT t.bad_try('22023', $$SELECT gd_define_step('bad', (SELECT x FROM t.bad_big))$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', correlation_key => (SELECT r FROM t.bad_big))$$);
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', correlation_key => (SELECT x FROM t.bad_big))$$);
-- An unknown 1 MB name: refused, the message names it (clipped here).
SELECT t.bad_try('42704', $$SELECT gd_insert((SELECT r FROM t.bad_big))$$);
SELECT t.bad_try('42704', $$SELECT gd_insert('bad', step => (SELECT r FROM t.bad_big))$$);
SELECT t.bad_try('42704', $$SELECT gd_insert('bad', queue => (SELECT r FROM t.bad_big))$$);
SELECT t.bad_try('42704', $$SELECT gd_pause((SELECT r FROM t.bad_big))$$);
SELECT t.bad_try('P0002', $$SELECT gd_signal((SELECT r FROM t.bad_big), 'go')$$);
-- Big values that are data, not names: accepted.
SELECT t.bad_try('ok', $$SELECT gd_insert('bad', jsonb_build_object('blob', (SELECT r FROM t.bad_big)))$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_big_initial', (SELECT r FROM t.bad_big), 'bad_q')$$);
SELECT t.bad_try('ok', $$SELECT gd_next('a', jsonb_build_object('blob', (SELECT x FROM t.bad_big)))$$);
SELECT t.bad_try('ok', $$SELECT gd_done(to_jsonb((SELECT r FROM t.bad_big)))$$);
-- 10,000 levels of nesting: PostgreSQL parses it; it is not an object.
SELECT t.bad_try('22023', $$SELECT gd_insert('bad', (repeat('[', 10000) || repeat(']', 10000))::jsonb)$$);
SELECT t.bad_try('22023', $$SELECT gd_insert_all('bad', (repeat('[', 10000) || repeat(']', 10000))::jsonb)$$);
SELECT t.bad_try('22023', $$SELECT gd_define_fsm('bad_n', 'a', 'bad_q', 1, (repeat('[', 10000) || repeat(']', 10000))::jsonb)$$);
-- ... inside an object it is valid state.
SELECT t.bad_try('ok', $$SELECT gd_insert('bad', ('{"deep": ' || repeat('[', 10000) || repeat(']', 10000) || '}')::jsonb)$$);
SELECT t.bad_try('ok', $$SELECT gd_insert('bad', ('{"deep": ' || repeat('{"a": ', 5000) || '1' || repeat('}', 5000) || '}')::jsonb)$$);
-- Deeper than PostgreSQL's stack allows: its own error, no crash.
SELECT t.bad_try('pg', $$SELECT gd_insert('bad', ('{"deep": ' || repeat('[', 1000000) || repeat(']', 1000000) || '}')::jsonb)$$);

-- =========================================================================
-- gd_signal(target bigint | text, name, payload, dedup_key)
-- =========================================================================
CREATE TABLE t.bad_target AS SELECT gd_insert('bad', correlation_key => 'bad-signal-target') AS id;
SELECT t.bad_try('22023', $$SELECT gd_signal(NULL::bigint, 'go')$$);
-- (A NULL key names no live instance: P0002 is fine; a NULL id should say NULL.)
SELECT t.bad_try('P0002', $$SELECT gd_signal(NULL::text, 'go')$$);
SELECT t.bad_try('pg', $$SELECT gd_signal(NULL, 'go')$$);
SELECT t.bad_try('P0002', $$SELECT gd_signal(-1, 'go')$$);
SELECT t.bad_try('P0002', $$SELECT gd_signal(9223372036854775807, 'go')$$);
SELECT t.bad_try('P0002', $$SELECT gd_signal('bad-no-such-key', 'go')$$);
SELECT t.bad_try('P0002', $$SELECT gd_signal('', 'go')$$);
SELECT t.bad_try('22023', format($$SELECT gd_signal(%s, NULL)$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('22023', format($$SELECT gd_signal(%s, '')$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('22023', $$SELECT gd_signal('bad-signal-target', NULL)$$);
SELECT t.bad_try('22023', format($$SELECT gd_signal(%s, 'go', NULL)$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('pg', format($$SELECT gd_signal(%s, 'go', '{bad')$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('pg', $$SELECT gd_signal(1.5, 'go')$$);
SELECT t.bad_try('pg', $$SELECT gd_signal(true, 'go')$$);
-- A 1 MB dedup key is an index key: refused by the engine, not the index.
SELECT t.bad_try('22023', format($$SELECT gd_signal(%s, 'go', '{}', (SELECT r FROM t.bad_big))$$, (SELECT id FROM t.bad_target)));
-- Accepted: any payload, an empty dedup key; a 1 MB signal name is refused (names are capped at 1,000 bytes).
SELECT t.bad_try('ok', format($$SELECT gd_signal(%s, 'go', '[1, 2]')$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('ok', format($$SELECT gd_signal(%s, 'go', 'null')$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('22023', format($$SELECT gd_signal(%s, (SELECT r FROM t.bad_big))$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('ok', format($$SELECT gd_signal(%s, 'go', '{}', '')$$, (SELECT id FROM t.bad_target)));
SELECT count(*) AS signals_stored FROM gd.signals WHERE instance_id = (SELECT id FROM t.bad_target);

-- =========================================================================
-- gd_await(id, timeout, until)
-- =========================================================================
SELECT t.bad_try('22023', $$SELECT * FROM gd_await(NULL)$$);
SELECT t.bad_try('22023', format($$SELECT * FROM gd_await(%s, NULL)$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('22023', format($$SELECT * FROM gd_await(%s, '-1s')$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('22023', format($$SELECT * FROM gd_await(%s, '-178000000 years')$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('22023', format($$SELECT * FROM gd_await(%s, '0s', NULL)$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('22023', format($$SELECT * FROM gd_await(%s, '0s', 'done')$$, (SELECT id FROM t.bad_target)));
SELECT t.bad_try('pg', $$SELECT * FROM gd_await('abc')$$);
-- Unknown ids are not an error: not_found, at once, however long the timeout.
SELECT status FROM gd_await(-1, '1 hour');
-- A timeout too long for a timestamp on a live instance: refused, not a 22008 from the deadline arithmetic.
SELECT t.bad_try('22023', format($$SELECT * FROM gd_await(%s, '178000000 years')$$, (SELECT id FROM t.bad_target)));
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT t.bad_try('25000', $$SELECT * FROM gd_await(-1, '0s')$$);
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT t.bad_try('25000', $$SELECT * FROM gd_await(-1, '0s')$$);
COMMIT;

-- =========================================================================
-- gd_cancel(id, reason), gd_retry(id), gd_pause(queue), gd_resume(queue)
-- =========================================================================
-- Not live / not failed / unknown: false, no error.
SELECT gd_cancel(NULL) AS cancel_null, gd_cancel(-1) AS cancel_unknown,
       gd_retry(NULL::bigint) AS retry_null, gd_retry(-1) AS retry_unknown,
       gd_retry((SELECT id FROM t.bad_target)) AS retry_live;
SELECT t.bad_try('pg', $$SELECT gd_retry(NULL)$$);
SELECT t.bad_try('pg', $$SELECT gd_cancel('abc')$$);
-- A 1 MB reason is stored as given.
CREATE TABLE t.bad_cancelled AS SELECT gd_insert('bad') AS id;
SELECT gd_cancel(id, (SELECT r FROM t.bad_big)) AS cancelled FROM t.bad_cancelled;
SELECT status, length(error->>'reason') AS reason_length, finished_at IS NOT NULL AS finished
  FROM gd.instances WHERE id = (SELECT id FROM t.bad_cancelled);
SELECT gd_cancel(id) AS cancel_again, gd_retry(id) AS retry_cancelled FROM t.bad_cancelled;
SELECT t.bad_try('22023', $$SELECT gd_pause(NULL)$$);
SELECT t.bad_try('42704', $$SELECT gd_pause('')$$);
SELECT t.bad_try('42704', $$SELECT gd_pause('bad_no_queue')$$);
SELECT t.bad_try('22023', $$SELECT gd_resume(NULL)$$);
SELECT t.bad_try('42704', $$SELECT gd_resume('bad_no_queue')$$);
SELECT t.bad_try('pg', $$SELECT gd_pause(1)$$);
SELECT gd_pause('bad_q') AS paused, gd_pause('bad_q') AS paused_again, gd_resume('bad_q') AS resumed, gd_resume('bad_q') AS resumed_again;

-- =========================================================================
-- External workers: gd_claim, gd_complete, gd_heartbeat, gd_release
-- =========================================================================
SELECT t.bad_try('22023', $$SELECT * FROM gd_claim(NULL, 'w')$$);
SELECT t.bad_try('42704', $$SELECT * FROM gd_claim('', 'w')$$);
SELECT t.bad_try('42704', $$SELECT * FROM gd_claim('bad_no_queue', 'w')$$);
SELECT t.bad_try('22023', $$SELECT * FROM gd_claim('bad_xq', NULL)$$);
SELECT t.bad_try('22023', $$SELECT * FROM gd_claim('bad_xq', '')$$);
SELECT t.bad_try('22023', $$SELECT * FROM gd_claim('bad_xq', 'w', NULL)$$);
SELECT t.bad_try('22023', $$SELECT * FROM gd_claim('bad_xq', 'w', 0)$$);
SELECT t.bad_try('22023', $$SELECT * FROM gd_claim('bad_xq', 'w', -1)$$);
SELECT t.bad_try('22023', $$SELECT * FROM gd_claim('bad_xq', 'w', 1001)$$);
SELECT t.bad_try('22023', $$SELECT * FROM gd_claim('bad_xq', 'w', 1, '0s')$$);
SELECT t.bad_try('22023', $$SELECT * FROM gd_claim('bad_xq', 'w', 1, '-1s')$$);
SELECT t.bad_try('pg', $$SELECT * FROM gd_claim('bad_xq', 'w', 'many')$$);
-- A lease too long for a timestamp (with work to claim): refused by the engine (22023), not a 22008.
CREATE TABLE t.bad_claimable AS SELECT gd_insert('bad_x') AS id;
SELECT t.bad_try('22023', $$SELECT * FROM gd_claim('bad_xq', 'w', 1, '178000000 years')$$);
SELECT status, lease_token IS NULL AS unclaimed FROM gd.instances WHERE id = (SELECT id FROM t.bad_claimable);
SELECT t.bad_try('22023', $$SELECT gd_complete(NULL, 1, gd_done())$$);
SELECT t.bad_try('22023', $$SELECT gd_complete(1, NULL, gd_done())$$);
SELECT t.bad_try('22023', $$SELECT gd_complete(-1, 1, NULL)$$);
SELECT t.bad_try('pg', $$SELECT gd_complete(-1, 1, 'garbage')$$);
SELECT t.bad_try('pg', $$SELECT gd_complete(-1, 1, '{}'::jsonb)$$);
SELECT t.bad_try('22023', $$SELECT gd_heartbeat(NULL, 1)$$);
SELECT t.bad_try('22023', $$SELECT gd_heartbeat(1, NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_heartbeat(1, 1, '0s')$$);
SELECT t.bad_try('22023', $$SELECT gd_heartbeat(1, 1, '-1 day')$$);
SELECT t.bad_try('22023', $$SELECT gd_release(NULL, 1)$$);
SELECT t.bad_try('22023', $$SELECT gd_release(1, NULL)$$);
-- Claims that do not exist: false (a stale outcome), never an error.
SELECT gd_complete(-1, -1, gd_done()) AS complete_unknown, gd_heartbeat(-1, -1) AS heartbeat_unknown,
       gd_release(-1, -1) AS release_unknown;

-- Complete a fresh claim with a given outcome; report the call and the instance after it.
CREATE FUNCTION t.bad_complete(want text, outcome text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    claimed record;
    answer text;
    after text;
BEGIN
    PERFORM gd_cancel(i.id) FROM gd.instances i WHERE i.fsm = 'bad_x' AND i.status IN ('runnable', 'executing');
    PERFORM gd_insert('bad_x');
    SELECT c.id, c.lease_token INTO claimed FROM gd_claim('bad_xq', 'w') c;
    answer := t.bad_try(want, format('SELECT gd_complete(%s, %s, %s)', claimed.id, claimed.lease_token, outcome));
    SELECT i.status || ' ' || i.step || ' attempt ' || i.attempt
           || CASE WHEN i.lease_token = claimed.lease_token THEN ', still claimed' ELSE '' END
           || CASE WHEN i.eligible_at = 'infinity' THEN ', eligible never'
                   WHEN i.eligible_at > now() + interval '1000 years' THEN ', eligible in over 1000 years'
                   WHEN i.eligible_at > now() + interval '1 minute' THEN ', eligible later'
                   ELSE '' END
      INTO after FROM gd.instances i WHERE i.id = claimed.id;
    RETURN answer || ' | ' || after;
END $$;
SELECT t.bad_complete('22023', $$'(zzz,,,,,,,,,)'$$);
SELECT t.bad_complete('22023', $$'(,,,,,,,,,)'$$);
SELECT t.bad_complete('22023', $$'(next,,,,,,,,,)'$$);
SELECT t.bad_complete('22023', $$gd_next('nowhere')$$);
SELECT t.bad_complete('22023', $$'(next,f,,-1s,,,,,,)'$$);
SELECT t.bad_complete('22023', $$'(retry,,,,,-1s,,,,)'$$);
SELECT t.bad_complete('22023', $$'(await,,,,,,,{},,)'$$);
SELECT t.bad_complete('22023', $$'(await,,,,,,,{go},-1s,)'$$);
SELECT t.bad_complete('22023', $$gd_wait_signal('{go}', then_step => 'nowhere')$$);
SELECT t.bad_complete('22023', $$'(schedule_childs,f,,,,,,,,)'$$);
SELECT t.bad_complete('22023', $$gd_spawn('[1]', 'f')$$);
SELECT t.bad_complete('22023', $$gd_spawn('[{"state": {}}]', 'f')$$);
SELECT t.bad_complete('42704', $$gd_spawn('[{"fsm": "bad_nope"}]', 'f')$$);
SELECT t.bad_complete('22023', $$gd_spawn('[{"fsm": "bad", "weight": 0}]', 'f')$$);
-- Delays too long for a timestamp: refused as a bad outcome (22023), the claim kept.
SELECT t.bad_complete('22023', $$gd_next('f', NULL, '178000000 years')$$);
SELECT t.bad_complete('22023', $$gd_next('f', NULL, '300000 years')$$);
SELECT t.bad_complete('22023', $$gd_retry('{}'::jsonb, '300000 years')$$);
SELECT t.bad_complete('22023', $$gd_wait_signal('{go}', '300000 years')$$);
-- Accepted: far but representable delays, garbage jsonb where any jsonb goes.
SELECT t.bad_complete('22023', $$gd_next('f', NULL, '1000 years')$$);
SELECT t.bad_complete('ok', $$gd_retry('[1, 2]'::jsonb)$$);
SELECT t.bad_complete('ok', $$gd_done('"just a string"')$$);
SELECT t.bad_complete('ok', $$gd_stop('null')$$);
SELECT t.bad_complete('ok', $$gd_spawn('[]', 'f')$$);
-- A heartbeat that would extend a lease past the end of time.
DO $$
DECLARE
    claimed record;
BEGIN
    PERFORM gd_cancel(i.id) FROM gd.instances i WHERE i.fsm = 'bad_x' AND i.status IN ('runnable', 'executing');
    PERFORM gd_insert('bad_x');
    SELECT c.id, c.lease_token INTO claimed FROM gd_claim('bad_xq', 'w') c;
    RAISE NOTICE 'heartbeat 178000000 years: %',
        t.bad_try('22023', format($f$SELECT gd_heartbeat(%s, %s, '178000000 years')$f$, claimed.id, claimed.lease_token));
    RAISE NOTICE 'heartbeat 10 years: %',
        t.bad_try('ok', format($f$SELECT gd_heartbeat(%s, %s, '10 years')$f$, claimed.id, claimed.lease_token));
    RAISE NOTICE 'still claimed: %', (SELECT i.lease_token = claimed.lease_token FROM gd.instances i WHERE i.id = claimed.id);
    RAISE NOTICE 'release: %', gd_release(claimed.id, claimed.lease_token);
    RAISE NOTICE 'release again: %', gd_release(claimed.id, claimed.lease_token);
END $$;

-- =========================================================================
-- Outcome constructors
-- =========================================================================
SELECT t.bad_try('22023', $$SELECT gd_next(NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_next('')$$);
SELECT t.bad_try('22023', $$SELECT gd_next('a', '[1]')$$);
SELECT t.bad_try('22023', $$SELECT gd_next('a', 'null')$$);
SELECT t.bad_try('22023', $$SELECT gd_next('a', NULL, '-1s')$$);
SELECT t.bad_try('22023', $$SELECT gd_next('a', NULL, '-178000000 years')$$);
SELECT t.bad_try('pg', $$SELECT gd_next('a', NULL, 'soon')$$);
SELECT t.bad_try('22023', $$SELECT gd_retry('{}'::jsonb, '-1s')$$);
-- (An untyped literal resolves to the outcome constructor, not to gd_retry(bigint).)
SELECT t.bad_try('ok', $$SELECT gd_retry('{}', '1s')$$);
SELECT t.bad_try('22023', $$SELECT gd_wait_signal(NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_wait_signal('{}')$$);
SELECT t.bad_try('22023', $$SELECT gd_wait_signal('{NULL}')$$);
SELECT t.bad_try('22023', $$SELECT gd_wait_signal('{go,NULL}')$$);
SELECT t.bad_try('22023', $$SELECT gd_wait_signal('{go}', '-1s')$$);
SELECT t.bad_try('22023', $$SELECT gd_wait_signal('{go}', NULL, NULL, '[]')$$);
-- A signal name gd_signal refuses ('') can never arrive: refuse the wait too.
SELECT t.bad_try('22023', $$SELECT gd_wait_signal('{""}')$$);
SELECT t.bad_try('22023', $$SELECT gd_wait_signal('{{a},{b}}')$$);
SELECT t.bad_try('pg', $$SELECT gd_wait_signal('go')$$);
SELECT t.bad_try('22023', $$SELECT gd_spawn(NULL, 'a')$$);
SELECT t.bad_try('22023', $$SELECT gd_spawn('{}', 'a')$$);
SELECT t.bad_try('22023', $$SELECT gd_spawn('[]', NULL)$$);
SELECT t.bad_try('22023', $$SELECT gd_spawn('[]', '')$$);
SELECT t.bad_try('22023', $$SELECT gd_spawn('[]', 'a', '1')$$);
SELECT t.bad_try('pg', $$SELECT gd_spawn('[', 'a')$$);
-- NULL means the default for these.
SELECT (gd_done(NULL)).result AS done_null, (gd_stop(NULL)).error AS stop_null, (gd_retry(NULL::jsonb)).error AS retry_null;

-- =========================================================================
-- gd_stats_reset()
-- =========================================================================
SELECT t.bad_try('pg', $$SELECT gd_stats_reset(1)$$);
SELECT t.bad_try('pg', $$SELECT gd_stats_reset(NULL)$$);
CREATE ROLE regress_gd_bad_input;
SET ROLE regress_gd_bad_input;
\set VERBOSITY sqlstate
SELECT gd_stats_reset();
\set VERBOSITY default
RESET ROLE;
DROP ROLE regress_gd_bad_input;
SELECT t.bad_try('ok', $$SELECT gd_stats_reset()$$);

-- =========================================================================
-- Handlers that misbehave (queue bad_q, run by gd._execute)
-- =========================================================================
CREATE TABLE t.bad_own (instance_id bigint);
CREATE FUNCTION t.bad_handler(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step, ctx.attempt);
    CASE state->>'do'
        WHEN 'null' THEN RETURN NULL;
        WHEN 'no_kind' THEN RETURN ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome;
        WHEN 'bad_kind' THEN RETURN ROW('explode', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome;
        WHEN 'next_nowhere' THEN RETURN gd_next('nowhere');
        WHEN 'next_no_step' THEN RETURN ROW('next', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome;
        WHEN 'next_neg_delay' THEN RETURN ROW('next', 'z', NULL, '-1 hour', NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome;
        WHEN 'next_bad_state' THEN RETURN gd_next('z', '[1]');
        WHEN 'next_array_state' THEN RETURN ROW('next', 'z', '[1]', NULL, NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome;
        WHEN 'retry_neg_backoff' THEN RETURN ROW('retry', NULL, NULL, NULL, '{}', '-1s', NULL, NULL, NULL, NULL)::gd.outcome;
        WHEN 'wait_no_names' THEN RETURN ROW('await', NULL, NULL, NULL, NULL, NULL, NULL, '{}', NULL, NULL)::gd.outcome;
        WHEN 'wait_null_names' THEN RETURN ROW('await', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome;
        WHEN 'wait_neg_timeout' THEN RETURN ROW('await', NULL, NULL, NULL, NULL, NULL, NULL, '{go}', '-1s', NULL)::gd.outcome;
        WHEN 'spawn_garbage' THEN RETURN gd_spawn('[1, "two"]', 'z');
        WHEN 'spawn_unknown' THEN RETURN gd_spawn('[{"fsm": "bad_nope"}]', 'z');
        WHEN 'spawn_not_array' THEN RETURN ROW('schedule_childs', 'z', NULL, NULL, NULL, NULL, NULL, NULL, NULL, '{"fsm": "bad"}')::gd.outcome;
        WHEN 'raise' THEN RAISE EXCEPTION 'handler gave up' USING ERRCODE = 'P0001', DETAIL = 'on purpose';
        WHEN 'raise_22023' THEN RAISE EXCEPTION 'not an engine error' USING ERRCODE = '22023';
        WHEN 'divide' THEN RETURN gd_next('z', jsonb_build_object('q', 1 / 0));
        WHEN 'loop' THEN LOOP END LOOP;
        WHEN 'sleep' THEN PERFORM pg_sleep(10); RETURN gd_done();
        WHEN 'commit' THEN COMMIT; RETURN gd_done();
        WHEN 'drop_own' THEN INSERT INTO t.bad_own VALUES (ctx.id); DROP TABLE t.bad_own; RETURN gd_next('z');
        WHEN 'use_own' THEN INSERT INTO t.bad_own VALUES (ctx.id); RETURN gd_next('z');
        WHEN 'drop_engine' THEN DROP TABLE gd._instances; RETURN gd_done();
        WHEN 'drop_extension' THEN DROP EXTENSION gen_durable CASCADE; RETURN gd_done();
        WHEN 'tamper' THEN UPDATE gd._instances SET status = 'done', step = 'nowhere' WHERE id = ctx.id; RETURN gd_next('z');
        WHEN 'huge_state' THEN RETURN gd_next('z', jsonb_build_object('blob', repeat('y', 1000000)));
        WHEN 'huge_delay' THEN RETURN gd_next('z', NULL, '178000000 years');
        WHEN 'overflow_delay' THEN RETURN gd_next('z', NULL, '300000 years');
        WHEN 'huge_wait' THEN RETURN gd_wait_signal('{go}', '178000000 years');
    END CASE;
END $$;
CREATE FUNCTION t.bad_last(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step, ctx.attempt);
    RETURN gd_done(jsonb_build_object('blob_length', length(state->>'blob')));
END $$;
CREATE FUNCTION t.bad_dropped(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
SELECT gd_define_fsm('bad_h', initial => 'h', queue => 'bad_hq');
SELECT gd_define_step('bad_h', 'h', 't.bad_handler(jsonb, gd.context)'::regprocedure,
                      max_attempts => 2, backoff => '0s', timeout => '300ms');
SELECT gd_define_step('bad_h', 'z', 't.bad_last(jsonb, gd.context)'::regprocedure);
-- A handler dropped after its step was defined.
SELECT gd_define_step('bad_h', 'dropped', 't.bad_dropped(jsonb, gd.context)'::regprocedure, max_attempts => 1);
SELECT t.bad_try('2BP01', $$DROP FUNCTION t.bad_dropped(jsonb, gd.context)$$);
SET session_replication_role = replica;   -- the drop goes anyway: no event trigger fires
DROP FUNCTION t.bad_dropped(jsonb, gd.context);
RESET session_replication_role;

CREATE TABLE t.bad_cases (name text PRIMARY KEY, id bigint);
INSERT INTO t.bad_cases
SELECT name, gd_insert('bad_h', jsonb_build_object('do', name))
  FROM unnest('{"null",no_kind,bad_kind,next_nowhere,next_no_step,next_neg_delay,next_bad_state,next_array_state,
                retry_neg_backoff,wait_no_names,wait_null_names,wait_neg_timeout,spawn_garbage,spawn_unknown,
                spawn_not_array,raise,raise_22023,divide,loop,sleep,commit,drop_own,use_own,drop_engine,
                drop_extension,tamper,huge_state,huge_delay,overflow_delay,huge_wait}'::text[]) AS c(name)
 ORDER BY name;
INSERT INTO t.bad_cases VALUES ('dropped_handler', gd_insert('bad_h', step => 'dropped'));
-- drop_own runs before use_own (same priority: by id; the cases were inserted by name).

-- Round 1 runs every case's first attempt; round 2 the second attempts
-- (max_attempts 2: then failed) and the 'z' steps of the cases that moved on; round 3 finds nothing left.  Each
-- round is its own transaction, so a retry with no backoff is eligible in the next.
SET client_min_messages = warning;   -- DROP EXTENSION ... CASCADE lists what it takes along
SELECT gd._execute('bad_hq', 100) AS round_1;
SELECT gd._execute('bad_hq', 100) AS round_2;
SELECT gd._execute('bad_hq', 100) AS round_3;
RESET client_min_messages;

SELECT c.name, i.status, i.step, i.attempt, i.error->>'sqlstate' AS sqlstate,
       t.bad_clip(i.error->>'message') AS message,
       CASE WHEN i.eligible_at = 'infinity' THEN 'never'
            WHEN i.eligible_at > now() + interval '1000 years' THEN 'over 1000 years'
            WHEN i.eligible_at > now() + interval '1 minute' THEN 'later' END AS eligible,
       CASE WHEN i.wait_deadline = 'infinity' THEN 'never'
            WHEN i.wait_deadline > now() + interval '1000 years' THEN 'over 1000 years' END AS wait_deadline
  FROM t.bad_cases c JOIN gd.instances i ON i.id = c.id ORDER BY c.name;
-- Where the handlers' outcomes break the contract:
--  - an outcome whose state is not a JSON object must be refused (22023) like
--    gd_next's own check, not stored as the instance's state;
--  - a delay or timeout too long for a timestamp (178,000,000 years) must be
--    refused (22023) or mean "never" (infinity), not wrap around to a finite
--    time; 300,000 years is not "a negative delay";
--  - a handler that writes its own gd.instances row (status 'done', step
--    'nowhere') and returns gd_next('z'): the engine's transition is the one
--    that counts (or the step fails); the row must never be left terminal
--    without finished_at.
SELECT c.name,
       CASE c.name
           WHEN 'next_array_state' THEN CASE WHEN jsonb_typeof(i.state) = 'object' THEN 'as expected'
                                             ELSE 'state stored as ' || jsonb_typeof(i.state) || '  <-- DEVIATION' END
           WHEN 'huge_delay' THEN CASE WHEN i.error->>'sqlstate' = '22023' OR i.eligible_at = 'infinity' THEN 'as expected'
                                       ELSE 'eligible at a finite time: the delay wrapped around  <-- DEVIATION' END
           WHEN 'huge_wait' THEN CASE WHEN i.error->>'sqlstate' = '22023' OR i.wait_deadline = 'infinity' THEN 'as expected'
                                      ELSE 'deadline at a finite time: the timeout wrapped around  <-- DEVIATION' END
           WHEN 'overflow_delay' THEN CASE WHEN i.error->>'message' LIKE '%negative%' THEN 'refused as a negative delay  <-- DEVIATION'
                                           ELSE 'as expected' END
           -- documented: a status set during the step (gd_cancel, or by hand) wins over its outcome
           WHEN 'tamper' THEN CASE WHEN i.status = 'done' AND i.step = 'nowhere' THEN 'as expected'
                                   ELSE 'the outcome overwrote the status set during the step  <-- DEVIATION' END
       END AS verdict
  FROM t.bad_cases c JOIN gd.instances i ON i.id = c.id
 WHERE c.name IN ('next_array_state', 'huge_delay', 'huge_wait', 'overflow_delay', 'tamper') ORDER BY c.name;
-- A failed attempt leaves no write behind: only the cases whose step 'h'
-- succeeded have its ledger row (one each), and their step 'z' one row each.
SELECT c.name, count(*) FILTER (WHERE l.step = 'h') AS h_rows, count(*) FILTER (WHERE l.step = 'z') AS z_rows
  FROM t.bad_cases c JOIN t.ledger l ON l.instance_id = c.id
 GROUP BY c.name ORDER BY c.name;
-- The engine's own tables and extension survived the handlers.
SELECT to_regclass('gd.instances') IS NOT NULL AS instances_table, to_regclass('t.bad_own') IS NULL AS own_table_dropped,
       (SELECT count(*) FROM pg_extension WHERE extname = 'gen_durable') AS extension;

-- A handler that deletes its own instance row.  The contract: the round
-- does not fail (a failed attempt of that instance, or the instance gone as
-- its handler chose), and the other rows of the round are unaffected.  (A
-- round failing with XX000 "could not record the transition" here would be
-- retried by a background executor every second: its queue stuck behind
-- this row; see test/t/034_poison.pl.)  Run with two rows per round.
CREATE TABLE t.bad_poison (name text PRIMARY KEY, id bigint, bystander bigint);
CREATE FUNCTION t.bad_vanish(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF state->>'do' = 'delete_self' THEN
        DELETE FROM gd._instances WHERE id = ctx.id;
    ELSIF state->>'do' = 'bystander' THEN
        NULL;
    END IF;
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('bad_v', initial => 'v', queue => 'bad_vq');
SELECT gd_define_step('bad_v', 'v', 't.bad_vanish(jsonb, gd.context)'::regprocedure, max_attempts => 2, backoff => '0s');
INSERT INTO t.bad_poison
SELECT 'delete_self', gd_insert('bad_v', '{"do": "delete_self"}', priority => -1), gd_insert('bad_v', '{"do": "bystander"}');
SELECT t.bad_try('ok', $$SELECT gd._execute('bad_vq', 2)$$);
SELECT coalesce((SELECT status || ' attempt ' || attempt FROM gd.instances WHERE id = p.id), 'gone') AS culprit,
       (SELECT status FROM gd.instances WHERE id = p.bystander) AS bystander
  FROM t.bad_poison p;
-- (Clean up: cancel the culprit if it is still live, then run what is left.)
SELECT count(gd_cancel(id, 'poison')) >= 0 AS cleaned FROM t.bad_poison;
SELECT gd._execute('bad_vq', 2) >= 0 AS ran;
SELECT (SELECT status FROM gd.instances WHERE id = p.bystander) AS bystander_at_the_end FROM t.bad_poison p;

-- =========================================================================
-- Afterwards: the server is up, nothing was lost or corrupted
-- =========================================================================
SELECT 1 AS server_up;
-- Every case instance still exists, exactly once.
SELECT count(*) AS cases, count(i.id) AS found FROM t.bad_cases c LEFT JOIN gd.instances i ON i.id = c.id;
-- Row-level invariants over every instance of this file (other suites edit
-- some of their rows by hand).
SELECT count(*) FILTER (WHERE status NOT IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children',
                                             'done', 'failed', 'cancelled')) AS bad_status,
       count(*) FILTER (WHERE status IN ('done', 'failed', 'cancelled') AND finished_at IS NULL) AS terminal_unfinished,
       count(*) FILTER (WHERE status NOT IN ('done', 'failed', 'cancelled') AND finished_at IS NOT NULL) AS live_finished,
       count(*) FILTER (WHERE status = 'runnable' AND (wait_names IS NOT NULL OR wait_deadline IS NOT NULL
                                                       OR wait_then_step IS NOT NULL)) AS runnable_waiting,
       count(*) FILTER (WHERE status = 'awaiting_signal' AND (wait_names IS NULL OR cardinality(wait_names) = 0)) AS waiting_on_nothing,
       count(*) FILTER (WHERE status = 'executing' AND (lease_token IS NULL OR NOT external)) AS executing_unleased,
       count(*) FILTER (WHERE status <> 'executing' AND lease_token IS NOT NULL) AS leased_not_executing,
       count(*) FILTER (WHERE jsonb_typeof(state) <> 'object') AS state_not_object,
       count(*) FILTER (WHERE NOT EXISTS (SELECT FROM gd.steps s WHERE s.fsm = i.fsm AND s.version = i.version AND s.step = i.step)
                          AND status NOT IN ('done', 'failed', 'cancelled')) AS live_at_unknown_step
  FROM gd.instances i WHERE i.fsm LIKE 'bad%';
SELECT count(*) AS orphan_signals FROM gd.signals s
 WHERE s.instance_id > (SELECT last_id FROM t.bad_start) AND NOT EXISTS (SELECT FROM gd.instances i WHERE i.id = s.instance_id);

-- An error prints its DETAIL line only when it has a detail: these two as
-- psql shows them, one without and one with.
\set SHOW_CONTEXT never
SELECT gd_define_fsm('bad_n', '');
SELECT gd_define_fsm('bad_hist', 'a', history => true) AS version;
-- (history left out is no change: the migration runs again)
SELECT gd_define_fsm('bad_hist', 'a') AS again, history FROM gd.fsms WHERE name = 'bad_hist';
SELECT gd_define_fsm('bad_hist', 'a', history => false);
DELETE FROM gd._fsms WHERE name = 'bad_hist';
