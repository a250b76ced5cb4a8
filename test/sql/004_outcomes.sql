-- Each outcome kind, and what counts as a failed attempt.  Steps run through
-- gd._execute, which runs them in this session exactly as an executor does;
-- the queue 'steps' is not served by background executors.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.act(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt, run_as) VALUES (ctx.id, ctx.step, ctx.attempt, current_user);
    CASE state->>'do'
        WHEN 'next' THEN RETURN gd_next('finish', state || '{"went": "next"}');
        WHEN 'next_keep' THEN RETURN gd_next('finish');
        WHEN 'next_later' THEN RETURN gd_next('finish', delay => '1 hour');
        WHEN 'done' THEN RETURN gd_done('{"paid": 42}');
        WHEN 'done_default' THEN RETURN gd_done();
        WHEN 'stop' THEN RETURN gd_stop('{"reason": "refused"}');
        WHEN 'retry' THEN RETURN gd_retry('{"reason": "busy"}'::jsonb, '0s');
        WHEN 'raise' THEN RAISE EXCEPTION 'card declined' USING ERRCODE = 'P0001', DETAIL = 'issuer said no';
        WHEN 'nothing' THEN RETURN NULL;
        WHEN 'bad_kind' THEN RETURN ROW('zzz', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome;
        WHEN 'no_kind' THEN RETURN ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome;
        WHEN 'unknown_step' THEN RETURN gd_next('nowhere');
        WHEN 'sleep' THEN PERFORM pg_sleep(5); RETURN gd_done();
        WHEN 'ctx' THEN RETURN gd_done(to_jsonb(ctx));
    END CASE;
END $$;
CREATE FUNCTION t.finish(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt, run_as) VALUES (ctx.id, ctx.step, ctx.attempt, current_user);
    RETURN gd_done(state);
END $$;

SELECT gd_define_fsm('o', initial => 'start', queue => 'steps');
SELECT gd_define_step('o', 'start', 't.act(jsonb, gd.context)'::regprocedure, max_attempts => 2, backoff => '0s');
SELECT gd_define_step('o', 'finish', 't.finish(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('o', 'slow', 't.act(jsonb, gd.context)'::regprocedure, max_attempts => 1, timeout => '200ms');

CREATE TABLE t.cases (name text PRIMARY KEY, id bigint);
INSERT INTO t.cases
SELECT name, gd_insert('o', jsonb_build_object('do', name), correlation_key => 'o-' || name)
  FROM unnest('{next,next_keep,next_later,done,done_default,stop,retry,raise,nothing,bad_kind,no_kind,unknown_step,ctx}'::text[]) AS c(name);
INSERT INTO t.cases VALUES ('sleep', gd_insert('o', '{"do": "sleep"}', step => 'slow'));

-- First round: every instance runs its first step once.
SELECT gd._execute('steps', 100) AS steps_run;
SELECT c.name, i.status, i.step, i.attempt, i.state - 'do' AS state, i.result - '{id,idempotency_key}'::text[] AS result,
       i.error - 'message' AS error, i.error->>'message' AS message
  FROM t.cases c JOIN gd.instances i ON i.id = c.id ORDER BY c.name;
-- The handler's own writes committed only for steps that succeeded.
SELECT c.name, count(l.*) AS ledger_rows
  FROM t.cases c LEFT JOIN t.ledger l ON l.instance_id = c.id GROUP BY c.name ORDER BY c.name;
-- The context a handler sees.
SELECT i.result - '{id,idempotency_key}'::text[] AS ctx,
       (i.result->>'idempotency_key')::uuid IS NOT NULL AS has_idempotency_key
  FROM t.cases c JOIN gd.instances i ON i.id = c.id WHERE c.name = 'ctx';

-- Second round: next steps run, failed attempts are retried (max_attempts 2: the last try).
SELECT gd._execute('steps', 100) AS steps_run;
SELECT c.name, i.status, i.step, i.attempt, i.result - '{id,idempotency_key}'::text[] AS result, i.error->>'sqlstate' AS sqlstate,
       i.finished_at IS NOT NULL AS finished
  FROM t.cases c JOIN gd.instances i ON i.id = c.id ORDER BY c.name;
-- Nothing left to run but the instance scheduled an hour ahead.
SELECT gd._execute('steps', 100) AS steps_run;
SELECT c.name, i.status, i.eligible_at > now() + interval '59 minutes' AS an_hour_ahead
  FROM t.cases c JOIN gd.instances i ON i.id = c.id WHERE i.status NOT IN ('done', 'failed');

-- The outcome constructors check their arguments.
SELECT t.try($$SELECT gd_next(NULL)$$);
SELECT t.try($$SELECT gd_next('a', '[1]')$$);
SELECT t.try($$SELECT gd_next('a', delay => '-1s')$$);
SELECT t.try($$SELECT gd_retry('{}'::jsonb, '-5 minutes')$$);
SELECT gd_retry(NULL::jsonb);
SELECT gd_done(), gd_stop(NULL);
-- gd_outcome builds the same outcome as the constructor its "kind" names.
SELECT k.name, gd_outcome(k.json) IS NOT DISTINCT FROM k.built AS same
  FROM (VALUES
    ('next', '{"kind": "next", "step": "b", "state": {"n": 1}, "delay": "5 seconds"}'::jsonb,
     gd_next('b', '{"n": 1}', '5 seconds')),
    ('retry', '{"kind": "retry", "error": {"why": "busy"}, "backoff": "2s"}', gd_retry('{"why": "busy"}'::jsonb, '2s')),
    ('retry without error', '{"kind": "retry"}', gd_retry('{}'::jsonb)),
    ('wait_signal', '{"kind": "wait_signal", "names": ["paid", "void"], "timeout": "1h", "then_step": "ship"}',
     gd_wait_signal('{paid,void}', '1h', 'ship')),
    ('spawn', '{"kind": "spawn", "children": [{"fsm": "c"}], "then_step": "join"}',
     gd_spawn('[{"fsm": "c"}]', 'join')),
    ('done', '{"kind": "done", "result": {"ok": true}}', gd_done('{"ok": true}')),
    ('done without result', '{"kind": "done"}', gd_done()),
    ('stop', '{"kind": "stop", "error": {"why": "no"}}', gd_stop('{"why": "no"}'))) AS k(name, json, built)
 ORDER BY k.name;
-- ... and refuses what no constructor would.
SELECT t.try($$SELECT gd_outcome('{"kind": "explode"}')$$);
SELECT t.try($$SELECT gd_outcome('{"step": "b"}')$$);
SELECT t.try($$SELECT gd_outcome('{"kind": "next"}')$$);
SELECT t.try($$SELECT gd_outcome('{"kind": "next", "step": "b", "delay": "-1s"}')$$);
SELECT t.try($$SELECT gd_outcome(NULL)$$);
SELECT t.try($$SELECT gd._execute('steps', 0)$$);
