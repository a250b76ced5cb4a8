-- gd_drain: a tenant runs its own steps in its test's session and
-- transaction, deterministically (queue 'drain_q' has no executors).
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE ROLE regress_drain_owner;
CREATE ROLE regress_drain_other;
GRANT USAGE ON SCHEMA t TO regress_drain_owner, regress_drain_other;
GRANT EXECUTE ON FUNCTION t.try(text) TO regress_drain_owner, regress_drain_other;
CREATE TABLE t.drain_ledger (instance bigint, step text, by_role text);
GRANT INSERT, SELECT ON t.drain_ledger TO regress_drain_owner, regress_drain_other;
CREATE FUNCTION t.drain_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.drain_ledger VALUES (ctx.id, ctx.step, current_user);
    RETURN CASE ctx.step
        WHEN 'a' THEN gd_next('b', state || '{"a": true}')
        WHEN 'loop' THEN gd_next('loop')
        WHEN 'inner' THEN gd_next('b', jsonb_build_object('inner', gd_drain('drain_q')))
        ELSE gd_done(state) END;
END $$;

SET ROLE regress_drain_owner;
SELECT gd_define_fsm('drained', initial => 'a', queue => 'drain_q', steps => $${
    "a": {"handler": "t.drain_step(jsonb, gd.context)"},
    "b": {"handler": "t.drain_step(jsonb, gd.context)"},
    "loop": {"handler": "t.drain_step(jsonb, gd.context)"},
    "inner": {"handler": "t.drain_step(jsonb, gd.context)"}
}$$);
SELECT gd_set_concurrency_limit('drain_key', 1);
RESET ROLE;
GRANT EXECUTE ON FUNCTION gd_set_concurrency_limit(text, int, boolean, text) TO regress_drain_owner;
SET ROLE regress_drain_owner;
SELECT gd_set_concurrency_limit('drain_key', 1);
RESET ROLE;
SET ROLE regress_drain_other;
SELECT gd_define_fsm('other_drained', initial => 'a', queue => 'drain_q', steps => $${
    "a": {"handler": "t.drain_step(jsonb, gd.context)"},
    "b": {"handler": "t.drain_step(jsonb, gd.context)"}
}$$);
SELECT gd_insert('other_drained') IS NOT NULL AS other_inserted;

-- The owner drains: each instance's two steps, and the instance waiting for
-- room under its key once the first ends; not another tenant's, nor what is
-- scheduled for later.
SET ROLE regress_drain_owner;
SELECT count(gd_insert('drained', jsonb_build_object('n', n))) FROM generate_series(1, 3) n;
SELECT count(gd_insert('drained', '{"keyed": true}', concurrency_key => 'drain_key')) FROM generate_series(1, 2);
SELECT gd_insert('drained', '{"later": true}', schedule_in => '1 hour') AS later_id \gset
SELECT gd_drain('drain_q') AS steps_ran;
SELECT status, count(*) FROM gd.instances WHERE fsm = 'drained' GROUP BY status ORDER BY status;
SELECT by_role, count(*) FROM t.drain_ledger GROUP BY by_role;
-- with_scheduled: what is due later runs now.
SELECT gd_drain('drain_q', with_scheduled => true) AS scheduled_ran;
SELECT status, result FROM gd.instances WHERE id = :later_id;
-- Nothing left: 0.
SELECT gd_drain('drain_q') AS nothing_left;
RESET ROLE;
SELECT status, count(*) FROM gd.instances WHERE fsm = 'other_drained' GROUP BY status;

-- In a transaction rolled back, nothing is left behind.
SET ROLE regress_drain_owner;
BEGIN;
SELECT gd_insert('drained', '{"rolled": "back"}') IS NOT NULL AS inserted;
SELECT gd_drain('drain_q') AS ran_in_transaction;
SELECT status FROM gd.instances WHERE state->>'rolled' = 'back';
ROLLBACK;
SELECT count(*) AS rolled_back FROM gd.instances WHERE state->>'rolled' = 'back';

-- A step that never ends stops at max_steps.
SELECT gd_insert('drained', step => 'loop') AS loop_id \gset
SELECT gd_drain('drain_q', max_steps => 25) AS capped;
SELECT status, step, attempt FROM gd.instances WHERE id = :loop_id;
SELECT gd_cancel(:loop_id);

-- Refused: bad arguments, an unknown queue, a drain inside a step (the step fails).
SELECT t.try($$SELECT gd_drain('drain_q', max_steps => 0)$$);
SELECT t.try($$SELECT gd_drain(NULL)$$);
SELECT t.try($$SELECT gd_drain('no_such_queue')$$);
SELECT gd_insert('drained', step => 'inner') AS inner_id \gset
SELECT gd_drain('drain_q', max_steps => 1) AS inner_ran;
SELECT status, error->>'kind' AS kind, error->>'message' AS message FROM gd.instances WHERE id = :inner_id;
SELECT gd_cancel(:inner_id) AS inner_cancelled;
-- Nor in a session with a cursor open: a handler's cursors are closed when its step ends, and so would be this one.
BEGIN;
DECLARE open_cursor CURSOR FOR SELECT 1;
SELECT t.try($$SELECT gd_drain('drain_q')$$);
FETCH open_cursor;
COMMIT;
RESET ROLE;

-- One test transaction takes an order through an in-database step, an
-- external one (claimed and completed in it, retried after a backoff), a
-- family of children and its join, and a one-day wait that times out,
-- moving its clock with gen_durable.now: claims and drains find due what is
-- due by then, and the drain ends waits and joins as the reaper would.
CREATE FUNCTION t.drain_order_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE
        WHEN ctx.step = 'reserve' THEN gd_next('charge', state)
        WHEN ctx.step = 'pack' THEN gd_spawn('[{"fsm": "drained", "state": {}}, {"fsm": "drained", "state": {}}]', 'ship')
        WHEN ctx.timed_out THEN gd_done(state || jsonb_build_object('shipped', false))
        WHEN jsonb_array_length(ctx.signals) > 0 THEN gd_done(state || jsonb_build_object('shipped', true))
        ELSE gd_wait_signal(ARRAY['shipped'], timeout => '1 day') END;
END $$;
SET ROLE regress_drain_owner;
SELECT gd_define_fsm('drained_order', initial => 'reserve', queue => 'drain_q', steps => $${
    "reserve": {"handler": "t.drain_order_step(jsonb, gd.context)"},
    "charge": {},
    "pack": {"handler": "t.drain_order_step(jsonb, gd.context)"},
    "ship": {"handler": "t.drain_order_step(jsonb, gd.context)"}
}$$);
BEGIN;
SELECT gd_insert('drained_order', '{"sku": "tea"}') AS order_id \gset
SELECT gd_drain('drain_q') AS reserved;
SELECT id, step, lease_token AS token FROM gd_claim('drain_q', 'test', 10, '1 minute') \gset claim_
SELECT :claim_id = :order_id AS claimed_here, :'claim_step' AS step;
SELECT gd_complete(:claim_id, :claim_token, gd_retry('{"declined": true}', backoff => '1 hour')) AS declined;
SELECT count(*) AS not_due_yet FROM gd_claim('drain_q', 'test', 10, '1 minute');
SELECT set_config('gen_durable.now', (now() + interval '2 hours')::text, true) IS NOT NULL AS two_hours_later;
SELECT id, step, (ctx).attempt, lease_token AS token FROM gd_claim('drain_q', 'test', 10, '1 minute') \gset claim_
SELECT :claim_id = :order_id AS claimed_again, :'claim_step' AS step, :claim_attempt AS attempt;
SELECT gd_complete(:claim_id, :claim_token, gd_next('pack')) AS charged;
SELECT gd_drain('drain_q') AS packed_and_joined;
SELECT status, step FROM gd.instances WHERE id = :order_id;
SELECT set_config('gen_durable.now', (now() + interval '1 day 3 hours')::text, true) IS NOT NULL AS next_day;
SELECT gd_drain('drain_q') AS timed_out;
SELECT status, result FROM gd.instances WHERE id = :order_id;
ROLLBACK;
SHOW gen_durable.now;
SELECT t.try($$SET gen_durable.now = 'tomorrowish'$$);
RESET ROLE;

-- Clean up: roles are the cluster's, and outlive the database.
DELETE FROM gd._instances WHERE fsm IN ('drained', 'other_drained', 'drained_order');
DELETE FROM gd._fsms WHERE name IN ('drained', 'other_drained', 'drained_order');
DROP OWNED BY regress_drain_owner, regress_drain_other;
DROP ROLE regress_drain_owner, regress_drain_other;
