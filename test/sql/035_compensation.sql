-- Cancellation that compensates: gd_cancel of a live instance whose FSM
-- version names an on_cancel step sends it there (runnable, attempt 1,
-- marked compensating, ctx.cancelled saying why and where it was); the
-- compensation's end leaves it cancelled.  Queue 'comp_q' has no executor:
-- steps run by gd_drain, in this session.  Then the saga of examples/saga.sql.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup

-- Each step notes what it saw: its step, attempt and ctx.cancelled (without its time).
CREATE TABLE t.comp_seen (instance bigint, step text, attempt int, cancelled jsonb);
CREATE FUNCTION t.comp_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.comp_seen VALUES (ctx.id, ctx.step, ctx.attempt, ctx.cancelled - 'at');
    IF ctx.step = 'bad_undo' THEN
        RAISE EXCEPTION 'the refund service is down';
    END IF;
    IF ctx.step = 'self' THEN
        PERFORM gd_cancel(ctx.id, 'from its own step');
    END IF;
    RETURN CASE ctx.step
        WHEN 'work' THEN gd_next('wait')
        WHEN 'self' THEN gd_next('finish')
        WHEN 'wait' THEN gd_wait_signal(ARRAY['go'], then_step => 'finish')
        WHEN 'spawn' THEN gd_spawn('[{"fsm": "comp_leaf"}, {"fsm": "comp", "step": "wait"}]', 'finish')
        WHEN 'finish' THEN gd_done('{"finished": true}')
        -- a compensation of two steps: the instance stays compensating between them
        WHEN 'undo' THEN gd_next('undo_more', state || '{"undone": true}')
        ELSE gd_done(jsonb_build_object('compensated', true, 'was_at', ctx.cancelled->>'step'))
    END;
END $$;
\set h '{"handler": "t.comp_step(jsonb, gd.context)"}'
SELECT gd_define_fsm('comp', 'work', queue => 'comp_q', on_cancel => 'undo', history => true, steps => format($${
    "work": %1$s, "wait": %1$s, "finish": %1$s, "self": %1$s, "spawn": %1$s, "undo": %1$s, "undo_more": %1$s
}$$, :'h')::jsonb);
SELECT gd_define_fsm('comp_leaf', 'wait', queue => 'comp_q', steps => format($${
    "wait": %1$s, "finish": %1$s
}$$, :'h')::jsonb);
SELECT name, version, on_cancel FROM gd.fsms WHERE name LIKE 'comp%' ORDER BY name;

-- Parked on a signal, cancelled: to its compensation step, runnable, attempt 1, marked.
SELECT gd_insert('comp', '{"order": 1}') AS parked_id \gset
SELECT gd_drain('comp_q') AS steps_ran;
SELECT status, step FROM gd.instances WHERE id = :parked_id;
SELECT gd_cancel(:parked_id, 'customer changed their mind') AS cancelled;
SELECT status, step, attempt, wait_names, error, cancelled - 'at' AS cancelled,
       (cancelled->>'at')::timestamptz <= clock_timestamp() AS at_known
  FROM gd.instances WHERE id = :parked_id;
-- A second cancel while compensating: false, and nothing changes.
SELECT updated_at AS compensating_since FROM gd.instances WHERE id = :parked_id \gset
SELECT gd_cancel(:parked_id, 'again') AS cancelled_again;
SELECT status, step, cancelled->>'reason' AS reason, updated_at = :'compensating_since' AS unchanged
  FROM gd.instances WHERE id = :parked_id;
-- A signal for the wait it left wakes nothing; the compensation runs its two steps and ends cancelled.
SELECT gd_signal(:parked_id, 'go') AS stored;
SELECT gd_drain('comp_q') AS steps_ran;
SELECT status, step, result, error - 'at' AS error, error->'at' = cancelled->'at' AS error_is_the_mark
  FROM gd.instances WHERE id = :parked_id;
SELECT gd_cancel(:parked_id, 'once more') AS cancel_after_end;
SELECT status, step, error->>'reason' AS reason FROM gd_await(:parked_id, '1s');
-- What the handlers saw: no ctx.cancelled before the cancel, why and where after.
SELECT step, attempt, cancelled FROM t.comp_seen WHERE instance = :parked_id ORDER BY step DESC;
-- Its history: the steps before the cancel, then the compensation's.
SELECT step, kind FROM gd_history(:parked_id);

-- Runnable, not yet run: its compensation starts from there; an FSM without on_cancel just ends.
SELECT gd_define_fsm('comp_plain', 'work', queue => 'comp_q', steps => format('{"work": %s}', :'h')::jsonb);
SELECT gd_insert('comp') AS fresh_id, gd_insert('comp_plain') AS plain_id \gset
SELECT gd_cancel(:fresh_id) AS fresh_cancelled, gd_cancel(:plain_id, 'not needed') AS plain_cancelled;
SELECT id = :fresh_id AS fresh, status, step, attempt, error, cancelled - 'at' AS cancelled
  FROM gd.instances WHERE id IN (:fresh_id, :plain_id) ORDER BY id;
SELECT gd_drain('comp_q') AS steps_ran;
SELECT status, result, error->>'reason' AS reason FROM gd.instances WHERE id = :fresh_id;

-- Parked on children: the parent compensates; of its children, the one whose
-- FSM has on_cancel compensates too, the other ends cancelled.
SELECT gd_insert('comp', step => 'spawn') AS parent_id \gset
SELECT gd_drain('comp_q') AS steps_ran;
SELECT c.fsm, c.status, c.step FROM gd.instances c WHERE c.parent_id = :parent_id ORDER BY c.fsm;
SELECT gd_cancel(:parent_id, 'order void') AS cancelled;
SELECT id = :parent_id AS parent, fsm, status, step, cancelled->>'status' AS was, error->>'reason' AS ended_for
  FROM gd.instances WHERE :parent_id IN (id, parent_id) ORDER BY id;
SELECT gd_drain('comp_q') AS steps_ran;
SELECT id = :parent_id AS parent, fsm, status, result FROM gd.instances WHERE :parent_id IN (id, parent_id) ORDER BY id;

-- A handler that cancels its own instance: the compensation stands, not the step's gd_next.
SELECT gd_insert('comp', step => 'self') AS self_id \gset
SELECT gd_drain('comp_q') AS steps_ran;
SELECT status, result FROM gd.instances WHERE id = :self_id;
SELECT step, cancelled->>'step' AS was_at FROM t.comp_seen WHERE instance = :self_id ORDER BY step DESC;

-- Under a concurrency key the compensating instance keeps its room: the next waits until it ends.
SELECT gd_insert('comp', concurrency_key => 'comp_key') AS keyed_id \gset
SELECT gd_insert('comp', concurrency_key => 'comp_key') AS waiting_id \gset
SELECT gd_cancel(:keyed_id) AS cancelled;
SELECT id = :keyed_id AS keyed, status, step, gated FROM gd.instances WHERE id IN (:keyed_id, :waiting_id) ORDER BY id;
SELECT gd_drain('comp_q') AS steps_ran;
SELECT id = :keyed_id AS keyed, status, step, gated FROM gd.instances WHERE id IN (:keyed_id, :waiting_id) ORDER BY id;
SELECT gd_cancel(:waiting_id) AS cleanup;
SELECT gd_drain('comp_q') AS steps_ran;

-- A compensation that raises is retried as any step, and fails past its
-- attempts (the instance stays marked; a cancel of it is a no-op).
SELECT gd_define_fsm('comp_fail', 'wait', queue => 'comp_q', on_cancel => 'bad_undo', history => true, steps => format($${
    "wait": %1$s, "finish": %1$s,
    "bad_undo": {"handler": "t.comp_step(jsonb, gd.context)", "max_attempts": 2, "backoff": "0s"}
}$$, :'h')::jsonb);
SELECT gd_insert('comp_fail') AS failing_id \gset
SELECT gd_drain('comp_q') AS steps_ran;
SELECT gd_cancel(:failing_id, 'refund it') AS cancelled;
SELECT gd_drain('comp_q', with_scheduled => true) AS steps_ran;
SELECT status, step, attempt, error->>'message' AS message, cancelled->>'reason' AS reason
  FROM gd.instances WHERE id = :failing_id;
SELECT gd_cancel(:failing_id) AS cancel_failed;
SELECT step, attempt, kind, error->>'message' AS message FROM gd_history(:failing_id);

-- An external compensation step: claimed with the same ctx.cancelled; a claim
-- of the step the cancel interrupted is stale.
SELECT gd_define_fsm('comp_ext', 'charge', queue => 'comp_q', on_cancel => 'refund',
                     steps => '{"charge": {}, "refund": {}}');
SELECT gd_insert('comp_ext', '{"amount": 5}') AS ext_id \gset
SELECT lease_token AS charge_token FROM gd_claim('comp_q', 'w1') \gset
SELECT status FROM gd.instances WHERE id = :ext_id;
SELECT gd_cancel(:ext_id, 'card declined later') AS cancelled;
SELECT gd_complete(:ext_id, :charge_token, gd_done()) AS stale_charge;
SELECT step, (ctx).cancelled - 'at' AS cancelled, lease_token AS refund_token FROM gd_claim('comp_q', 'w2') \gset
SELECT :'step' AS claimed_step, :'cancelled' AS claimed_ctx_cancelled;
SELECT gd_complete(:ext_id, :refund_token, gd_done('{"refunded": 5}')) AS refunded;
SELECT status, step, result, error->>'reason' AS reason FROM gd.instances WHERE id = :ext_id;

-- Bad on_cancel: refused, nothing defined.
SELECT t.try($$SELECT gd_define_fsm('comp_bad', 'a', queue => 'comp_q', on_cancel => 'nope', steps => '{"a": {}}')$$);
SELECT t.try($$SELECT gd_define_fsm('comp_bad', 'a', queue => 'comp_q', on_cancel => '', steps => '{"a": {}}')$$);
SELECT t.try($$SELECT gd_define_fsm('comp_bad', 'a', queue => 'comp_q', on_cancel => repeat('x', 1001))$$);
SELECT count(*) AS comp_bad_defined FROM gd.fsms WHERE name = 'comp_bad';
SELECT count(*) AS comp_bad_steps FROM gd.steps WHERE fsm = 'comp_bad';
-- A version with instances keeps its on_cancel; another version takes it from from_version.
SELECT t.try($$SELECT gd_define_fsm('comp_plain', 'work', queue => 'comp_q', on_cancel => 'work')$$);
SELECT gd_define_fsm('comp', 'work', queue => 'comp_q', version => 2, from_version => 1);
SELECT version, on_cancel FROM gd.fsms WHERE name = 'comp' ORDER BY version;

-- The saga of the docs, as it is: reserve -> charge -> ship; cancelled after
-- the charge, the charge is refunded and the stock released.
\set saga :abs_srcdir '/examples/saga.sql'
\set ECHO none
\i :saga
\set ECHO all
INSERT INTO saga.stock VALUES ('lamp', 3);
SELECT gd_insert('saga_order', '{"item": "lamp", "amount": 40}') AS shipped_order,
       gd_insert('saga_order', '{"item": "lamp", "amount": 25}') AS cancelled_order \gset
SELECT gd_drain('saga') AS steps_ran;
SELECT id = :shipped_order AS shipped, status, step FROM gd.instances WHERE fsm = 'saga_order' ORDER BY id;
SELECT available FROM saga.stock WHERE item = 'lamp';
SELECT order_id = :shipped_order AS shipped, amount, refunded FROM saga.payments ORDER BY order_id;
SELECT gd_signal(:shipped_order, 'packed') AS packed;
SELECT gd_cancel(:cancelled_order, 'customer cancelled') AS cancelled;
SELECT gd_drain('saga') AS steps_ran;
SELECT id = :shipped_order AS shipped, status, result, error->>'reason' AS reason
  FROM gd.instances WHERE fsm = 'saga_order' ORDER BY id;
SELECT available FROM saga.stock WHERE item = 'lamp';
SELECT order_id = :shipped_order AS shipped, amount, refunded FROM saga.payments ORDER BY order_id;
SELECT order_id = :shipped_order AS shipped, item FROM saga.shipments;
