-- Batch steps: a step defined with batch => N runs up to N of its runnable
-- instances in one call of its handler, f(states jsonb[], ctxs gd.context[])
-- RETURNS gd.outcome[], one outcome per instance, in their order; each
-- instance's transition commits with the round.  A raise, a NULL or a wrong
-- number of outcomes fails the attempt of every instance of the call.  The
-- steps run in this session (gd._execute, gd_drain) on queue batch_q, which
-- has no executors.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
-- Each call of a batch handler: the ids and the n of the states it was given.
CREATE TABLE t.batch_calls (call serial, step text, ids bigint[], ns int[]);
CREATE FUNCTION t.batch_step(states jsonb[], ctxs gd.context[]) RETURNS gd.outcome[] LANGUAGE plpgsql AS $$
DECLARE
    outcomes gd.outcome[] := '{}';
    i int;
BEGIN
    INSERT INTO t.batch_calls (step, ids, ns)
    SELECT ctxs[1].step, array_agg(ctxs[k].id ORDER BY k), array_agg((states[k]->>'n')::int ORDER BY k)
      FROM generate_subscripts(states, 1) k;
    FOR i IN 1 .. cardinality(states) LOOP
        IF states[i]->>'do' = 'raise' AND ctxs[i].attempt = 1 THEN
            RAISE EXCEPTION 'batch raised at instance %', states[i]->>'n';
        END IF;
        outcomes := outcomes || CASE states[i]->>'do'
            WHEN 'next' THEN gd_next('second', states[i] || jsonb_build_object('batch_size', cardinality(states)))
            WHEN 'wait' THEN gd_wait_signal(ARRAY['go'])
            WHEN 'retry' THEN CASE WHEN ctxs[i].attempt = 1 THEN gd_retry('{"why": "later"}', backoff => '0s')
                                   ELSE gd_done(jsonb_build_object('n', states[i]->'n', 'attempt', ctxs[i].attempt)) END
            ELSE gd_done(jsonb_build_object('n', states[i]->'n', 'id', ctxs[i].id, 'attempt', ctxs[i].attempt))
        END;
    END LOOP;
    IF states[1]->>'do' = 'short' THEN
        RETURN outcomes[2:];
    ELSIF states[1]->>'do' = 'null' THEN
        RETURN NULL;
    ELSIF states[1]->>'do' = 'null_element' THEN
        RETURN outcomes[1:cardinality(outcomes) - 1] || NULL::gd.outcome;
    END IF;
    RETURN outcomes;
END $$;
CREATE FUNCTION t.single_second(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
    SELECT gd_done(state - 'do')
$$;
CREATE FUNCTION t.not_an_array(states jsonb[], ctxs gd.context[]) RETURNS gd.outcome LANGUAGE sql AS $$
    SELECT gd_done()
$$;

SELECT gd_define_fsm('batched', initial => 'first', queue => 'batch_q', steps => $${
    "first": {"handler": "t.batch_step(jsonb[], gd.context[])", "batch": 5, "backoff": "0s", "max_attempts": 2},
    "second": {"handler": "t.single_second(jsonb, gd.context)"}
}$$);
SELECT step, handler, batch, batch_wait FROM gd.steps WHERE fsm = 'batched' ORDER BY step;

-- Five runnable instances, one call of the handler; outcome i is instance i's.
CREATE TABLE t.batch_cases (n int PRIMARY KEY, id bigint);
INSERT INTO t.batch_cases
SELECT n, gd_insert('batched', jsonb_build_object('n', n, 'do', d))
  FROM unnest('{next,done,wait,retry,next}'::text[]) WITH ORDINALITY AS c(d, n);
SELECT gd._execute('batch_q', 100) AS steps_run;
SELECT call, step, ns, ids = (SELECT array_agg(id ORDER BY n) FROM t.batch_cases) AS ids_in_order FROM t.batch_calls;
SELECT c.n, i.status, i.step, i.attempt, i.state - 'do' AS state, i.result - 'id' AS result,
       (i.result->>'id')::bigint = c.id AS own_id, i.error->>'message' AS error
  FROM t.batch_cases c JOIN gd.instances i USING (id) ORDER BY c.n;
-- The next round: the retried one runs in a batch of its own, the second steps one by one.
SELECT gd._execute('batch_q', 100) AS steps_run;
SELECT call, step, ns FROM t.batch_calls WHERE call > 1;
SELECT c.n, i.status, i.step, i.attempt, i.result - 'id' AS result
  FROM t.batch_cases c JOIN gd.instances i USING (id) ORDER BY c.n;

-- Seven instances, a batch of 5: two calls in one round, 5 and 2.
TRUNCATE t.batch_calls, t.batch_cases;
INSERT INTO t.batch_cases SELECT n, gd_insert('batched', jsonb_build_object('n', n, 'do', 'done')) FROM generate_series(1, 7) n;
SELECT gd._execute('batch_q', 100) AS steps_run;
SELECT step, ns FROM t.batch_calls ORDER BY call;
SELECT count(*) FILTER (WHERE status = 'done' AND (result->>'n')::int = c.n) AS done_with_own_result
  FROM t.batch_cases c JOIN gd.instances i USING (id);

-- A handler that raises: the call's effects roll back, and each instance of
-- the batch has a failed attempt recorded; the next round runs them again.
TRUNCATE t.batch_calls, t.batch_cases;
INSERT INTO t.batch_cases
SELECT n, gd_insert('batched', jsonb_build_object('n', n, 'do', CASE n WHEN 2 THEN 'raise' ELSE 'done' END))
  FROM generate_series(1, 3) n;
SELECT gd._execute('batch_q', 100) AS steps_run;
SELECT count(*) AS calls_kept FROM t.batch_calls;
SELECT c.n, i.status, i.attempt, i.error->>'sqlstate' AS sqlstate, i.error->>'message' AS message
  FROM t.batch_cases c JOIN gd.instances i USING (id) ORDER BY c.n;
SELECT gd._execute('batch_q', 100) AS steps_run;
SELECT step, ns FROM t.batch_calls ORDER BY call;
SELECT c.n, i.status, i.attempt, i.result - 'id' AS result FROM t.batch_cases c JOIN gd.instances i USING (id) ORDER BY c.n;

-- A wrong number of outcomes, a NULL array, a NULL outcome: the attempt of
-- every instance of the call fails (22023), nothing it wrote stays.
SELECT gd_define_fsm('batched_bad', initial => 'first', queue => 'batch_q', steps => $${
    "first": {"handler": "t.batch_step(jsonb[], gd.context[])", "batch": 3, "max_attempts": 1}
}$$);
TRUNCATE t.batch_calls, t.batch_cases;
INSERT INTO t.batch_cases
SELECT n, gd_insert('batched_bad', jsonb_build_object('n', n, 'do', (ARRAY['short', 'null', 'null_element'])[(n + 2) / 3]))
  FROM generate_series(1, 9) n;
SELECT gd._execute('batch_q', 100) AS steps_run;
SELECT count(*) AS calls_kept FROM t.batch_calls;
SELECT c.n, i.status, i.attempt, i.error->>'sqlstate' AS sqlstate, i.error->>'message' AS message
  FROM t.batch_cases c JOIN gd.instances i USING (id) ORDER BY c.n;

-- batch_wait: a batch that cannot fill waits, up to batch_wait from its
-- oldest instance's last change; a full one runs at once; gd_drain with
-- with_scheduled runs the waiting ones now.
SELECT gd_define_step('batched', 'first', 't.batch_step(jsonb[], gd.context[])', batch => 3,
                      batch_wait => '1 hour', backoff => '0s');
TRUNCATE t.batch_calls, t.batch_cases;
INSERT INTO t.batch_cases SELECT n, gd_insert('batched', jsonb_build_object('n', n, 'do', 'done')) FROM generate_series(1, 2) n;
SELECT gd._execute('batch_q', 100) AS steps_run;
SELECT c.n, i.status, i.eligible_at > now() + interval '59 minutes' AS waits_an_hour
  FROM t.batch_cases c JOIN gd.instances i USING (id) ORDER BY c.n;
INSERT INTO t.batch_cases SELECT n, gd_insert('batched', jsonb_build_object('n', n, 'do', 'done')) FROM generate_series(3, 5) n;
SELECT gd._execute('batch_q', 100) AS steps_run;
SELECT step, ns FROM t.batch_calls ORDER BY call;
SELECT gd_drain('batch_q', with_scheduled => true) AS drained;
SELECT step, ns FROM t.batch_calls ORDER BY call;
SELECT count(*) FILTER (WHERE status = 'done') AS done FROM t.batch_cases c JOIN gd.instances i USING (id);

-- The next version defined from this one keeps its batch.
SELECT gd_define_fsm('batched', initial => 'first', queue => 'batch_q', version => 2, from_version => 1);
SELECT version, step, batch, batch_wait FROM gd.steps WHERE fsm = 'batched' ORDER BY version, step;

-- Refused, changing nothing: a batch or batch_wait out of bounds or NULL
-- (22023), a handler that does not fit the kind of step (42883, 42P13).
CREATE TABLE t.steps_before AS SELECT * FROM gd.steps;
SELECT t.try($$SELECT gd_define_step('batched', 'first', 't.batch_step(jsonb[], gd.context[])', batch => 0)$$);
SELECT t.try($$SELECT gd_define_step('batched', 'first', 't.batch_step(jsonb[], gd.context[])', batch => 1001)$$);
SELECT t.try($$SELECT gd_define_step('batched', 'first', 't.batch_step(jsonb[], gd.context[])', batch => NULL)$$);
SELECT t.try($$SELECT gd_define_step('batched', 'first', 't.batch_step(jsonb[], gd.context[])', batch => 5,
                                     batch_wait => '-1s')$$);
SELECT t.try($$SELECT gd_define_step('batched', 'first', 't.batch_step(jsonb[], gd.context[])', batch => 5,
                                     batch_wait => '2 hours')$$);
SELECT t.try($$SELECT gd_define_step('batched', 'first', 't.batch_step(jsonb[], gd.context[])', batch => 5,
                                     batch_wait => NULL)$$);
SELECT t.try($$SELECT gd_define_step('batched', 'first', 't.single_second(jsonb, gd.context)', batch => 5)$$);
SELECT t.try($$SELECT gd_define_step('batched', 'first', 't.batch_step(jsonb[], gd.context[])')$$);
SELECT t.try($$SELECT gd_define_step('batched', 'first', 't.not_an_array(jsonb[], gd.context[])', batch => 5)$$);
SELECT t.try($$SELECT gd_define_fsm('batched', initial => 'first', queue => 'batch_q', steps => '{"first": {"handler": "t.batch_step(jsonb[], gd.context[])", "batch": "five"}}')$$);
SELECT t.try($$SELECT gd_define_fsm('batched', initial => 'first', queue => 'batch_q', steps => '{"first": {"handler": "t.batch_step(jsonb[], gd.context[])", "batch": 5, "batch_wait": "soon"}}')$$);
SELECT t.try($$SELECT gd_define_fsm('batched_new', initial => 'first', queue => 'batch_q', steps => '{"first": {"handler": "t.batch_step(jsonb[], gd.context[])", "batch": 1}}')$$);
SELECT (SELECT count(*) FROM (SELECT * FROM gd.steps EXCEPT SELECT * FROM t.steps_before) d) AS changed,
       (SELECT count(*) FROM (SELECT * FROM t.steps_before EXCEPT SELECT * FROM gd.steps) d) AS lost,
       (SELECT count(*) FROM gd.fsms WHERE name = 'batched_new') AS new_fsms;

-- An external step may be a batch step too: its workers take its claimed
-- rows in batches (gd.steps tells them how many).
SELECT gd_define_step('batched', 'outside', batch => 10, version => 2);
SELECT step, handler, batch FROM gd.steps WHERE fsm = 'batched' AND version = 2 AND step = 'outside';

-- Clean up.
SELECT count(gd_cancel(id, 'test over')) >= 0 AS cancelled FROM gd.instances WHERE fsm IN ('batched', 'batched_bad')
   AND status NOT IN ('done', 'failed', 'cancelled');
DELETE FROM gd._instances WHERE fsm IN ('batched', 'batched_bad');
DELETE FROM gd._fsms WHERE name IN ('batched', 'batched_bad');
DROP TABLE t.batch_calls, t.batch_cases, t.steps_before;
DROP FUNCTION t.batch_step(jsonb[], gd.context[]), t.single_second(jsonb, gd.context),
    t.not_an_array(jsonb[], gd.context[]);
