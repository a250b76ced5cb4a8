-- Retries: exponential backoff capped at max_backoff, explicit backoff, and
-- failure after max_attempts with the last error kept.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.always_fails(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step, ctx.attempt);
    RAISE EXCEPTION 'attempt % failed', ctx.attempt USING ERRCODE = 'P0001';
END $$;
CREATE FUNCTION t.asks_retry(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    RETURN gd_retry(jsonb_build_object('attempt', ctx.attempt), (state->>'backoff')::interval);
END $$;
CREATE FUNCTION t.succeeds_third_time(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step, ctx.attempt);
    IF ctx.attempt < 3 THEN
        RAISE EXCEPTION 'not yet';
    END IF;
    RETURN gd_done(jsonb_build_object('attempts', ctx.attempt));
END $$;

SELECT gd_define_fsm('r', initial => 'fail', queue => 'retries');
SELECT gd_define_step('r', 'fail', 't.always_fails(jsonb, gd.context)'::regprocedure,
                      max_attempts => 6, backoff => '10 seconds', max_backoff => '1 minute', backoff_jitter => false);
SELECT gd_define_step('r', 'ask', 't.asks_retry(jsonb, gd.context)'::regprocedure, max_attempts => 3);
SELECT gd_define_step('r', 'third', 't.succeeds_third_time(jsonb, gd.context)'::regprocedure, backoff => '0s');

-- Each failed attempt is scheduled backoff * 2^(attempt-1) later, capped at max_backoff:
-- 10s, 20s, 40s, 60s, 60s, then the sixth attempt fails the instance (no jitter here).
CREATE TABLE t.delays (attempt int, delay_s numeric);
SELECT gd_insert('r') AS fail_id \gset
DO $$
DECLARE
    before timestamptz;
    inst gd.instances;
BEGIN
    FOR i IN 1..6 LOOP
        -- make the instance eligible now, run it, and measure how far its retry was pushed
        UPDATE gd._instances SET eligible_at = now() - interval '1 second' WHERE fsm = 'r' AND step = 'fail';
        before := clock_timestamp();
        PERFORM gd._execute('retries', 1);
        SELECT * INTO inst FROM gd.instances WHERE fsm = 'r' AND step = 'fail';
        INSERT INTO t.delays VALUES (i, CASE WHEN inst.status = 'runnable'
                                             THEN round(extract(epoch FROM inst.eligible_at - before)) END);
    END LOOP;
END $$;
SELECT * FROM t.delays ORDER BY attempt;
SELECT status, attempt, error->>'message' AS last_error, error->>'attempt' AS error_attempt
  FROM gd.instances WHERE id = :fail_id;
SELECT count(*) AS rolled_back_attempts_in_ledger FROM t.ledger WHERE instance_id = :fail_id;

-- With backoff_jitter (the default) a retry waits between half and all of
-- its backoff: steps that failed together do not come back together.
SELECT gd_define_fsm('jittered', initial => 'fail', queue => 'retries',
                     steps => '{"fail": {"handler": "t.always_fails(jsonb, gd.context)", "backoff": "100 seconds"}}');
SELECT backoff_jitter FROM gd.steps WHERE fsm = 'jittered';
SELECT count(gd_insert('jittered')) AS inserted FROM generate_series(1, 20);
SELECT gd._execute('retries', 20) AS ran;
SELECT count(*) AS retried,
       bool_and(eligible_at - updated_at BETWEEN interval '49 seconds' AND interval '100 seconds') AS half_to_all,
       count(DISTINCT date_trunc('second', eligible_at)) > 1 AS spread
  FROM gd.instances WHERE fsm = 'jittered' AND attempt = 2;
UPDATE gd._instances SET status = 'cancelled' WHERE fsm = 'jittered';
SELECT t.try($$SELECT gd_define_step('jittered', 'fail', 't.always_fails(jsonb, gd.context)'::regprocedure, backoff_jitter => NULL)$$);

-- gd_retry with an explicit backoff overrides the step's; the error is the handler's own.
SELECT gd_insert('r', '{"backoff": "3 minutes"}', step => 'ask') AS ask_id \gset
SELECT gd._execute('retries', 1);
SELECT status, attempt, error, round(extract(epoch FROM eligible_at - now()) / 60) AS minutes_ahead
  FROM gd.instances WHERE id = :ask_id;

-- A step that succeeds on its third attempt: only that attempt's writes remain.
SELECT gd_insert('r', step => 'third') AS third_id \gset
SELECT gd._execute('retries', 10);
SELECT gd._execute('retries', 10);
SELECT gd._execute('retries', 10);
SELECT status, attempt, result FROM gd.instances WHERE id = :third_id;
SELECT attempt FROM t.ledger WHERE instance_id = :third_id;

-- A batch's handlers share one subtransaction until one raises: then that
-- one's attempt is recorded without running it again, and the others run
-- again each in its own subtransaction, so every effect commits once.
-- Sequences count the handler calls (a rollback does not undo nextval).
CREATE SEQUENCE t.mixed_calls;
CREATE SEQUENCE t.mixed_raises;
CREATE FUNCTION t.mixed(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('t.mixed_calls');
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step, ctx.attempt);
    IF (state->>'raise')::boolean AND ctx.attempt = 1 THEN
        PERFORM nextval('t.mixed_raises');
        RAISE EXCEPTION 'instance % raised', state->>'n';
    END IF;
    RETURN gd_done(jsonb_build_object('n', state->'n'));
END $$;
SELECT gd_define_fsm('mixed', initial => 'work', queue => 'retries');
SELECT gd_define_step('mixed', 'work', 't.mixed(jsonb, gd.context)'::regprocedure, backoff => '0s');
SELECT count(gd_insert('mixed', jsonb_build_object('n', n, 'raise', n = 3))) FROM generate_series(1, 5) n;
SELECT gd._execute('retries', 10) AS ran;
SELECT i.state->>'n' AS n, i.status, i.attempt, i.error->>'message' AS error,
       (SELECT count(*) FROM t.ledger l WHERE l.instance_id = i.id) AS effects
  FROM gd.instances i WHERE i.fsm = 'mixed' ORDER BY i.id;
-- 1, 2 and 3 together (3 raised), 1 and 2 again, then 4 and 5 each alone; 3 raised once.
SELECT last_value AS handler_calls FROM t.mixed_calls;
SELECT last_value AS raises FROM t.mixed_raises;
-- The next batch after a raise runs its handlers each alone, the one after together again.
SELECT count(gd_insert('mixed', jsonb_build_object('n', n, 'raise', n = 7))) FROM generate_series(6, 8) n;
SELECT gd._execute('retries', 10) AS ran;
SELECT last_value AS handler_calls FROM t.mixed_calls;
SELECT count(gd_insert('mixed', jsonb_build_object('n', n, 'raise', n = 10))) FROM generate_series(9, 10) n;
SELECT gd._execute('retries', 10) AS ran;
SELECT last_value AS handler_calls FROM t.mixed_calls;
SELECT i.state->>'n' AS n, i.status, i.attempt, i.error->>'message' AS error,
       (SELECT count(*) FROM t.ledger l WHERE l.instance_id = i.id) AS effects
  FROM gd.instances i WHERE i.fsm = 'mixed' ORDER BY i.id;
