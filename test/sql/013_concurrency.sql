-- Concurrency keys: at most the limit of instances holding a key run at once;
-- the rest wait "gated", out of the pick index, admitted best first as room
-- is made.  Queue 'flow' has no background executors (gd._execute steps it).
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.keyed(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step, ctx.attempt);
    IF ctx.step = 'one' THEN
        RETURN gd_next('two');
    END IF;
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('keyed', initial => 'one', queue => 'flow');
SELECT gd_define_step('keyed', 'one', 't.keyed(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('keyed', 'two', 't.keyed(jsonb, gd.context)'::regprocedure);
SELECT gd_stats_reset();

-- An unconfigured name allows 1: the second and third instance of acct:1 wait;
-- acct:2 is another partition and runs alongside.
SELECT count(gd_insert('keyed', jsonb_build_object('n', n), concurrency_key => key, correlation_key => 'keyed-' || n))
  FROM (VALUES (1, 'acct:1'), (2, 'acct:1'), (3, 'acct:1'), (4, 'acct:2')) v(n, key);
SELECT correlation_key, concurrency_key, gated FROM gd.instances WHERE fsm = 'keyed' ORDER BY id;
SELECT count FROM gd.stats WHERE event = 'concurrency_throttled';
-- gd.queue_stats counts the waiting ones as held, not runnable: no executor
-- can take them.  On a queue whose only admitted instance is scheduled for
-- later, nothing is runnable and no runnable work is aging.
SELECT runnable, held FROM gd.queue_stats WHERE queue = 'flow';
SELECT gd_define_fsm('held_only', initial => 'one', queue => 'held_only',
                     steps => '{"one": {"handler": "t.keyed(jsonb, gd.context)"}}') AS version;
SELECT count(gd_insert('held_only', concurrency_key => 'solo', schedule_in => s))
  FROM unnest(ARRAY[interval '1 hour', NULL, NULL]) s;
SELECT runnable, scheduled, held, oldest_runnable_age FROM gd.queue_stats WHERE queue = 'held_only';
DELETE FROM gd._instances WHERE fsm = 'held_only';
DELETE FROM gd._fsms WHERE name = 'held_only';

-- Each round runs only the admitted: keyed-1 holds acct:1 through both its steps.
SELECT gd._execute('flow', 100) AS round_1;
SELECT gd._execute('flow', 100) AS round_2;
SELECT correlation_key, status, gated FROM gd.instances WHERE fsm = 'keyed' ORDER BY id;
SELECT gd._execute('flow', 100) AS round_3;
SELECT gd._execute('flow', 100) AS round_4;
SELECT gd._execute('flow', 100) AS round_5;
SELECT gd._execute('flow', 100) AS round_6;
SELECT correlation_key, status FROM gd.instances WHERE fsm = 'keyed' ORDER BY id;
-- The ledger shows acct:1's instances one after another, never interleaved.
SELECT string_agg(i.correlation_key || '.' || l.step, ' ' ORDER BY l.at) AS acct_1_order
  FROM t.ledger l JOIN gd.instances i ON i.id = l.instance_id WHERE i.concurrency_key = 'acct:1';

-- A configured limit of 2; waiting instances are admitted by priority; a
-- raised limit admits more at once.
SELECT gd_set_concurrency_limit('api', 2);
SELECT count(gd_insert('keyed', '{}', concurrency_key => 'api', priority => p, correlation_key => 'api-' || p))
  FROM unnest(ARRAY[5, 4, 3, 2, 1]) p;
SELECT correlation_key, gated FROM gd.instances WHERE concurrency_key = 'api' ORDER BY id;
SELECT gd._execute('flow', 100) AS ran;        -- api-5 and api-4 (first in): step one
SELECT gd._execute('flow', 100) AS ran;        -- their step two; then api-1 and api-2 (best priority) get in
SELECT correlation_key, status, gated FROM gd.instances WHERE concurrency_key = 'api' ORDER BY id;
SELECT gd_set_concurrency_limit('api', 10);
SELECT count(*) FILTER (WHERE gated) AS still_waiting FROM gd.instances WHERE concurrency_key = 'api';

-- finish the rest (each statement is a round: what a round admits runs in the next)
SELECT gd._execute('flow', 100) AS drain \gset
SELECT gd._execute('flow', 100) AS drain \gset
SELECT gd._execute('flow', 100) AS drain \gset
SELECT gd._execute('flow', 100) AS drain \gset
SELECT count(*) AS unfinished FROM gd.instances WHERE queue = 'flow' AND status <> 'done';

-- No head-of-line blocking: a waiting high-priority instance does not stop
-- unrelated lower-priority work.  (The holder is scheduled an hour ahead.)
SELECT gd_insert('keyed', '{}', concurrency_key => 'solo', schedule_in => '1 hour', correlation_key => 'solo-holder'),
       gd_insert('keyed', '{}', concurrency_key => 'solo', priority => -10, correlation_key => 'solo-waiting'),
       gd_insert('keyed', '{}', priority => 10, correlation_key => 'unkeyed') \gset
SELECT gd._execute('flow', 1) AS ran;
SELECT correlation_key, status, step, gated FROM gd.instances
 WHERE correlation_key IN ('solo-holder', 'solo-waiting', 'unkeyed') ORDER BY 1;

-- Cancelling a holder makes room for the next.
SELECT gd_insert('keyed', '{}', concurrency_key => 'c', correlation_key => 'c-1') AS c1,
       gd_insert('keyed', '{}', concurrency_key => 'c', correlation_key => 'c-2') AS c2 \gset
SELECT gated FROM gd.instances WHERE id = :c2;
SELECT gd_cancel(:c1);
SELECT gated FROM gd.instances WHERE id = :c2;

-- Refusals.
SELECT t.try($$SELECT gd_set_concurrency_limit('api', 0)$$);
SELECT t.try($$SELECT gd_set_concurrency_limit(NULL, 1)$$);
SELECT t.try($$SELECT gd_set_concurrency_limit('a:b', 1)$$);
SELECT t.try($$SELECT gd_insert('keyed', concurrency_key => '')$$);
SELECT t.try($$SELECT gd_insert('keyed', concurrency_key => ':p')$$);
SELECT gd_drop_concurrency_limit('api') AS dropped, gd_drop_concurrency_limit('api') AS dropped_again;

-- The background executors (queue 'default', 2 of them) never run two
-- instances of a key with limit 1 at once, nor three of a key with limit 2:
-- the handlers record start and end times.
CREATE TABLE t.spans (key text, instance_id bigint, started timestamptz, ended timestamptz);
CREATE FUNCTION t.span(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
DECLARE
    began timestamptz := clock_timestamp();
BEGIN
    PERFORM pg_sleep(0.02);
    INSERT INTO t.spans VALUES (state->>'key', ctx.id, began, clock_timestamp());
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('span', initial => 'run', queue => 'default');
SELECT gd_define_step('span', 'run', 't.span(jsonb, gd.context)'::regprocedure);
SELECT gd_set_concurrency_limit('pair', 2);
CREATE TABLE t.span_ids AS
SELECT gd_insert('span', jsonb_build_object('key', key), concurrency_key => key) AS id
  FROM (SELECT CASE WHEN g % 2 = 0 THEN 'serial' ELSE 'pair' END AS key FROM generate_series(1, 30) g) k;
SELECT count(*) FILTER (WHERE a.status = 'done') AS done
  FROM t.span_ids s CROSS JOIN LATERAL gd_await(s.id, '30s') a;
-- At each span's start, the spans of its key running (itself included): the
-- most at once is reached at some start.
SELECT s.key, max(at_once) <= CASE s.key WHEN 'pair' THEN 2 ELSE 1 END AS within_its_limit
  FROM (SELECT a.key,
               (SELECT count(*) FROM t.spans b WHERE b.key = a.key AND b.started <= a.started AND a.started < b.ended)
                   AS at_once
          FROM t.spans a) s
 GROUP BY s.key ORDER BY s.key;

-- A shared limit counts every owner's instances under the key together (an
-- administrator's act): two owners' instances under 'joint:x', limit 1 —
-- one runs, the other waits whoever owns it, and is admitted when the first
-- ends.
CREATE ROLE regress_gd_joint;
CREATE FUNCTION t.joint_h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
GRANT USAGE ON SCHEMA t TO regress_gd_joint;
SELECT gd_set_concurrency_limit('joint', 1, shared => true);
SELECT gd_define_fsm('joint_mine', initial => 'one', queue => 'joint',
                     steps => '{"one": {"handler": "t.joint_h(jsonb, gd.context)"}}') AS version;
SELECT gd_insert('joint_mine', concurrency_key => 'joint:x') AS joint_mine \gset
SET ROLE regress_gd_joint;
SELECT gd_define_fsm('joint_theirs', initial => 'one', queue => 'joint',
                     steps => '{"one": {"handler": "t.joint_h(jsonb, gd.context)"}}') AS version;
SELECT gd_insert('joint_theirs', concurrency_key => 'joint:x') AS joint_theirs \gset
RESET ROLE;
SELECT fsm, status, gated FROM gd.instances WHERE concurrency_key = 'joint:x' ORDER BY id;
SELECT gd._execute('joint', 100) AS ran;
SELECT fsm, status, gated FROM gd.instances WHERE concurrency_key = 'joint:x' ORDER BY id;
SELECT gd._execute('joint', 100) AS ran;
SELECT fsm, status FROM gd.instances WHERE concurrency_key = 'joint:x' ORDER BY id;
DELETE FROM gd._instances WHERE concurrency_key = 'joint:x';
DELETE FROM gd._fsms WHERE name IN ('joint_mine', 'joint_theirs');
SELECT gd_drop_concurrency_limit('joint');
DROP FUNCTION t.joint_h(jsonb, gd.context);
REVOKE ALL ON SCHEMA t FROM regress_gd_joint;
DROP ROLE regress_gd_joint;

-- A key of the run scope is held from admission to the instance's end:
-- through its wait on a signal, its wait on children, a retry, until it
-- fails; a gd_retry of it waits its turn again.  Orders of one customer run
-- one after another, whole; with the step scope (seat:1) the second order
-- runs while the first waits.  Queue 'whole' has no background executors:
-- gd_drain runs its steps.
SELECT gd_set_concurrency_limit('cust', 1, scope => 'run');
SELECT name, max, shared, scope FROM gd.concurrency_limits WHERE name = 'cust';
CREATE FUNCTION t.whole_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step, ctx.attempt);
    CASE ctx.step
        WHEN 'reserve' THEN
            IF state ? 'fail_once' AND ctx.attempt = 1 THEN
                RAISE EXCEPTION 'stock service unavailable';
            END IF;
            RETURN gd_wait_signal(ARRAY['paid'], then_step => 'pack');
        WHEN 'pack' THEN
            RETURN gd_spawn(jsonb_build_array(jsonb_build_object('fsm', 'cust_box', 'state', state)), 'ship');
        WHEN 'box' THEN
            RETURN gd_wait_signal(ARRAY['boxed'], then_step => 'boxed');
        WHEN 'ship' THEN
            IF state ? 'stop' AND ctx.attempt = 1 AND (SELECT count(*) FROM t.ledger l
                                                        WHERE l.instance_id = ctx.id AND l.step = 'ship') = 1 THEN
                RETURN gd_stop('{"why": "carrier refused"}');
            END IF;
            RETURN gd_done();
        ELSE
            RETURN gd_done();
    END CASE;
END $$;
SELECT gd_define_fsm('cust_order', initial => 'reserve', queue => 'whole',
                     steps => '{"reserve": {"handler": "t.whole_step(jsonb, gd.context)", "backoff": "0s"},
                                "pack": {"handler": "t.whole_step(jsonb, gd.context)"},
                                "ship": {"handler": "t.whole_step(jsonb, gd.context)"}}') AS version;
SELECT gd_define_fsm('cust_box', initial => 'box', queue => 'whole',
                     steps => '{"box": {"handler": "t.whole_step(jsonb, gd.context)"},
                                "boxed": {"handler": "t.whole_step(jsonb, gd.context)"}}') AS version;
SELECT gd_insert('cust_order', '{"fail_once": true, "stop": true}', concurrency_key => 'cust:1',
                 correlation_key => 'first') AS first,
       gd_insert('cust_order', '{}', concurrency_key => 'cust:1', correlation_key => 'second') AS second,
       gd_insert('cust_order', '{}', concurrency_key => 'cust:2', correlation_key => 'other') AS other,
       gd_insert('cust_order', '{}', concurrency_key => 'seat:1', correlation_key => 'seat-a') AS seat_a,
       gd_insert('cust_order', '{}', concurrency_key => 'seat:1', correlation_key => 'seat-b') AS seat_b \gset
CREATE VIEW t.orders AS
SELECT correlation_key AS order, status, step, gated FROM gd.instances
 WHERE fsm = 'cust_order' AND correlation_key IS NOT NULL ORDER BY id;
SELECT * FROM t.orders;
-- first fails its reservation once and retries it, then waits to be paid;
-- second stays out, other (another customer) and seat-a run; seat-a's wait
-- lets seat:1 go, so seat-b runs too.
SELECT gd_drain('whole', with_scheduled => true) AS steps;
SELECT * FROM t.orders;
SELECT gd_signal(:first, 'paid');
SELECT * FROM t.orders;
-- Paid, first resumes at once (it holds its key) and waits for its box.
SELECT gd_drain('whole') AS steps;
SELECT * FROM t.orders;
SELECT gd_signal(i.id, 'boxed') FROM gd.instances i WHERE i.parent_id = :first;
-- The box done, first ships, and is stopped: its end lets second in.
SELECT gd_drain('whole') AS steps;
SELECT * FROM t.orders;
SELECT error FROM gd.instances WHERE id = :first;
-- Retried, first waits for second's whole run.
SELECT gd_retry(:first);
SELECT * FROM t.orders;
SELECT gd_drain('whole') AS steps;
SELECT gd_signal(:second, 'paid');
SELECT gd_drain('whole') AS steps;
-- second's box done, second ships and ends: first is let in, ships again, and ends.
SELECT gd_signal(i.id, 'boxed') FROM gd.instances i WHERE i.parent_id = :second;
SELECT gd_drain('whole') AS steps;
SELECT * FROM t.orders WHERE "order" IN ('first', 'second');
-- cust:1's steps in the order they ran: first's run, second's, first's retry.
SELECT string_agg(i.correlation_key || '.' || l.step, ' ' ORDER BY l.at) AS cust_1_order
  FROM t.ledger l JOIN gd.instances i ON i.id = l.instance_id WHERE i.concurrency_key = 'cust:1';
-- seat:1's interleave.
SELECT string_agg(i.correlation_key || '.' || l.step, ' ' ORDER BY l.at) AS seat_1_order
  FROM t.ledger l JOIN gd.instances i ON i.id = l.instance_id WHERE i.concurrency_key = 'seat:1';

-- Narrowed to the step scope, a key lets its waiting instances in while its holder waits.
SELECT gd_insert('cust_order', '{}', concurrency_key => 'cust:3', correlation_key => 'third-a') AS third_a,
       gd_insert('cust_order', '{}', concurrency_key => 'cust:3', correlation_key => 'third-b') AS third_b \gset
SELECT gd_drain('whole') AS steps;
SELECT * FROM t.orders WHERE "order" LIKE 'third-%';
SELECT gd_set_concurrency_limit('cust', 1, scope => 'step');
SELECT * FROM t.orders WHERE "order" LIKE 'third-%';

-- A child cannot wait for its parent's key of the run scope: the step
-- fails, nothing spawned.
SELECT gd_set_concurrency_limit('cust', 1, scope => 'run');
CREATE FUNCTION t.greedy(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
    SELECT gd_spawn('[{"fsm": "cust_box", "concurrency_key": "cust:9"}]', 'end')
$$;
SELECT gd_define_fsm('greedy', initial => 'start', queue => 'whole',
                     steps => '{"start": {"handler": "t.greedy(jsonb, gd.context)", "max_attempts": 1},
                                "end": {"handler": "t.greedy(jsonb, gd.context)"}}') AS version;
SELECT gd_insert('greedy', concurrency_key => 'cust:9') AS greedy \gset
SELECT gd_drain('whole') AS steps;
SELECT status, error->>'sqlstate' AS sqlstate, error->>'message' AS message FROM gd.instances WHERE id = :greedy;
SELECT count(*) AS children FROM gd.instances WHERE parent_id = :greedy;

-- Refusals: an unknown scope, or none; nothing changed.
SELECT t.try($$SELECT gd_set_concurrency_limit('cust', 2, scope => 'forever')$$);
SELECT t.try($$SELECT gd_set_concurrency_limit('cust', 2, scope => NULL)$$);
SELECT name, max, scope FROM gd.concurrency_limits WHERE name = 'cust';
DROP VIEW t.orders;
