-- gd_await: every status, woken by the engine (not by its timeout), cancellable,
-- and refused outside READ COMMITTED.  Queue 'default' is served by executors.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.quick(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep((state->>'sleep')::float8);
    IF state ? 'fail' THEN
        RETURN gd_stop(jsonb_build_object('why', state->'fail'));
    END IF;
    RETURN gd_done(jsonb_build_object('echo', state->'echo'));
END $$;
SELECT gd_define_fsm('aw', initial => 'go', queue => 'default', state_defaults => '{"sleep": 0}');
SELECT gd_define_step('aw', 'go', 't.quick(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('aw_manual', initial => 'go', queue => 'steps', state_defaults => '{"sleep": 0}');
SELECT gd_define_step('aw_manual', 'go', 't.quick(jsonb, gd.context)'::regprocedure);

-- done: the executor wakes us well before the 30 s timeout.
SELECT gd_insert('aw', '{"sleep": 0.3, "echo": "hi"}') AS done_id \gset
SELECT clock_timestamp() AS started \gset
SELECT * FROM gd_await(:done_id, '30s');
SELECT clock_timestamp() - :'started'::timestamptz < interval '10 seconds' AS woken_early;

-- failed
SELECT gd_insert('aw', '{"fail": "no stock"}') AS failed_id \gset
SELECT * FROM gd_await(:failed_id, '30s');

-- busy: nothing runs queue 'steps', so the timeout passes; the row is reported as it is.
SELECT gd_insert('aw_manual') AS busy_id \gset
SELECT * FROM gd_await(:busy_id, '100ms');
SELECT * FROM gd_await(:busy_id, '0s');

-- awaiting: parked instances settle the wait, unless until => 'terminal'.
UPDATE gd._instances SET status = 'awaiting_signal' WHERE id = :busy_id;
SELECT * FROM gd_await(:busy_id, '5s');
SELECT * FROM gd_await(:busy_id, '100ms', until => 'terminal');
UPDATE gd._instances SET status = 'runnable' WHERE id = :busy_id;

-- not_found
SELECT * FROM gd_await(-1, '1s');

-- Cancellable like any query.
\set VERBOSITY terse
SET statement_timeout = '300ms';
SELECT gd_await(:busy_id, '10s');
RESET statement_timeout;
\set VERBOSITY default

-- Refusals.
SELECT t.try($$SELECT gd_await(1, '-1s')$$);
SELECT t.try($$SELECT gd_await(1, NULL)$$);
SELECT t.try($$SELECT gd_await(NULL)$$);
SELECT t.try($$SELECT gd_await(1, until => 'forever')$$);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT t.try($$SELECT gd_await(1)$$);
ROLLBACK;

-- A step run in this session (gd._execute) also wakes awaiters at commit: the
-- awaited row settles and a second await returns at once.
SELECT gd._execute('steps', 10);
SELECT status, result FROM gd_await(:busy_id, '5s');

-- An instance inserted (or changed) by the awaiting transaction cannot move
-- on before it commits: refused at once, not waited out.
BEGIN;
SELECT gd_insert('aw_manual') AS mine \gset
SELECT t.try(format($$SELECT gd_await(%s, '10s')$$, :mine)) ~ '^25000 gen_durable: gd_await of instance \d+ in the transaction that wrote it' AS refused;
ROLLBACK;
