-- gen_durable demo: a checkout workflow as a durable finite state machine,
-- then deliveries that fan out into parcels and wait for a carrier's signal.
--
--   reserve ──> charge ──> ship ──> done
--
-- Each step is a PL/pgSQL handler run by the engine's background workers.
-- A step's own writes and the instance's move to the next step commit in one
-- transaction, so every effect happens exactly once: the ledger below ends up
-- with exactly 3 rows per order, even though some charges fail and are retried.
--
-- Run by `make demo` on a throwaway cluster configured with
--   shared_preload_libraries = 'gen_durable'
--   gen_durable.database     = 'demo'
--   gen_durable.queues       = 'default:2'

\set QUIET on
\pset null '-'
SET client_min_messages = warning;

\echo '== 1. CREATE EXTENSION gen_durable'
CREATE EXTENSION gen_durable;

\echo '== 2. The shop: orders, and a ledger with one row per step that ran'
CREATE SCHEMA shop;

CREATE TABLE shop.orders (
    order_no    int PRIMARY KEY,
    amount      numeric(10, 2) NOT NULL,
    instance_id bigint NOT NULL          -- the gen_durable instance driving it
);

CREATE TABLE shop.ledger (
    order_no int  NOT NULL,
    step     text NOT NULL,
    attempt  int  NOT NULL,              -- ctx.attempt of the run that committed
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (order_no, step)              -- a step that ran twice would fail here
);

\echo '== 3. Three step handlers: f(state jsonb, ctx gd.context) RETURNS gd.outcome'

-- reserve: put the goods aside, then go to charge.
CREATE FUNCTION shop.reserve(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shop.ledger (order_no, step, attempt)
    VALUES ((state->>'order')::int, 'reserve', ctx.attempt);
    RETURN gd_next('charge', state || '{"reserved": true}');
END $$;

-- charge: take the money. Every 5th order hits a "card network timeout" on its
-- first attempt: the exception rolls back this attempt's ledger row, and the
-- engine runs the step again after the step's backoff (100ms).
CREATE FUNCTION shop.charge(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
DECLARE
    order_no int := (state->>'order')::int;
BEGIN
    INSERT INTO shop.ledger (order_no, step, attempt) VALUES (order_no, 'charge', ctx.attempt);
    IF ctx.attempt = 1 AND order_no % 5 = 0 THEN
        RAISE EXCEPTION 'card network timeout for order %', order_no;
    END IF;
    RETURN gd_next('ship', state || jsonb_build_object('charge_id', 'ch_' || ctx.id));
END $$;

-- ship: hand over to the carrier; the instance is done, with a result.
CREATE FUNCTION shop.ship(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shop.ledger (order_no, step, attempt)
    VALUES ((state->>'order')::int, 'ship', ctx.attempt);
    RETURN gd_done(jsonb_build_object(
        'tracking', 'TRK-' || lpad(state->>'order', 4, '0'),
        'charged',  format('%s %s', state->>'amount', state->>'currency')));
END $$;

\echo '== 4. Define the FSM "checkout" and its steps'
\o /dev/null
SELECT gd_define_fsm(name => 'checkout', initial => 'reserve', queue => 'default',
                     version => 1, state_defaults => '{"currency": "EUR"}');
SELECT gd_define_step('checkout', 'reserve', handler => 'shop.reserve(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('checkout', 'charge',  handler => 'shop.charge(jsonb, gd.context)'::regprocedure,
                      max_attempts => 3, backoff => '100ms');
SELECT gd_define_step('checkout', 'ship',    handler => 'shop.ship(jsonb, gd.context)'::regprocedure);
\o
SELECT s.step, s.handler, s.max_attempts, s.backoff
  FROM gd.steps s WHERE s.fsm = 'checkout'
 ORDER BY array_position('{reserve,charge,ship}', s.step);

\echo '== 5. Place 20 orders in one transaction (each gets an instance; the engine starts at COMMIT)'
BEGIN;
INSERT INTO shop.orders (order_no, amount, instance_id)
SELECT i, 10 + i * 2.5,
       gd_insert('checkout', jsonb_build_object('order', i, 'amount', 10 + i * 2.5))
  FROM generate_series(1, 20) AS i;
COMMIT;

\echo '== 6. gd_await every instance (returns as soon as it settles, or after 10s)'
CREATE TEMP TABLE awaited AS
SELECT o.order_no, o.instance_id, a.status, a.step, a.attempt, a.result, a.error
  FROM shop.orders o
 CROSS JOIN LATERAL gd_await(o.instance_id, '10s') AS a
 ORDER BY o.order_no;

SELECT i.id,
       o.order_no                      AS "order",
       a.status,
       c.attempt                       AS charge_attempts,
       a.result,
       round(extract(epoch FROM i.updated_at - i.created_at) * 1000) AS took_ms
  FROM awaited a
  JOIN shop.orders o USING (order_no)
  JOIN gd.instances i ON i.id = a.instance_id
  LEFT JOIN shop.ledger c ON c.order_no = o.order_no AND c.step = 'charge'
 ORDER BY o.order_no;
\echo 'Orders 5, 10, 15 and 20 raised "card network timeout" in their first charge: that attempt'
\echo 'was rolled back (its ledger row too), and the step ran again 100ms later (charge_attempts = 2).'
\echo

\echo '== 7. The ledger: exactly one row per order and step, retries included'
SELECT step, count(*) AS "rows", count(DISTINCT order_no) AS orders,
       count(*) FILTER (WHERE attempt > 1) AS "committed on a retry"
  FROM shop.ledger
 GROUP BY step ORDER BY min(at);

-- The demo checks itself: psql stops with an error if anything is off.
DO $$
DECLARE
    not_done int;
    wrong    int;
BEGIN
    SELECT count(*) INTO not_done FROM awaited WHERE status <> 'done';
    SELECT count(*) INTO wrong FROM (
        SELECT o.order_no FROM shop.orders o LEFT JOIN shop.ledger l USING (order_no)
         GROUP BY o.order_no HAVING count(l.step) <> 3) bad;
    IF not_done > 0 OR wrong > 0 THEN
        RAISE EXCEPTION 'demo check failed: % instance(s) not done, % order(s) without exactly 3 ledger rows',
            not_done, wrong;
    END IF;
END $$;
\echo 'OK: all 20 orders are done with exactly 3 ledger rows each: every step ran exactly once.'
\echo

\echo '== 8. Signals and fan-out: a delivery packs one parcel per item (child instances),'
\echo '      then waits up to 2s for the carrier''s "picked_up" signal'
--
--   pack ──spawn parcels──> (all parcels done) ──> await_pickup ──signal or timeout──> finish
--
CREATE TABLE shop.parcels (delivery text, item text, packed_by bigint);

CREATE FUNCTION shop.pack_parcel(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shop.parcels VALUES (state->>'delivery', state->>'item', ctx.id);
    RETURN gd_done(jsonb_build_object('item', state->'item'));
END $$;

CREATE FUNCTION shop.delivery(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    CASE ctx.step
    WHEN 'pack' THEN      -- one child instance per item; resume at await_pickup when all are done
        RETURN gd_spawn((SELECT jsonb_agg(jsonb_build_object('fsm', 'parcel',
                                    'state', jsonb_build_object('delivery', ctx.correlation_key, 'item', item)))
                           FROM jsonb_array_elements_text(state->'items') item),
                        then_step => 'await_pickup');
    WHEN 'await_pickup' THEN
        RETURN gd_wait_signal(ARRAY['picked_up'], timeout => '2s', then_step => 'finish',
                              state => state || jsonb_build_object('parcels', jsonb_array_length(ctx.children)));
    WHEN 'finish' THEN
        IF ctx.timed_out THEN
            RETURN gd_done(jsonb_build_object('parcels', state->'parcels', 'carrier', 'no show'));
        END IF;
        RETURN gd_done(jsonb_build_object('parcels', state->'parcels',
                                          'carrier', ctx.signals->0->'payload'->>'carrier'));
    END CASE;
END $$;

\o /dev/null
SELECT gd_define_fsm('parcel', initial => 'pack', queue => 'default');
SELECT gd_define_step('parcel', 'pack', 'shop.pack_parcel(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('delivery', initial => 'pack', queue => 'default');
SELECT gd_define_step('delivery', step, 'shop.delivery(jsonb, gd.context)'::regprocedure)
  FROM unnest(ARRAY['pack', 'await_pickup', 'finish']) step;
SELECT gd_insert('delivery', jsonb_build_object('items', items), correlation_key => key)
  FROM (VALUES ('delivery-1', '["tea", "cups"]'::jsonb), ('delivery-2', '["kettle"]'),
               ('delivery-3', '["tray", "spoons", "sugar"]')) AS d(key, items);
\o
\echo 'Each delivery first parks until its parcels are packed (gd_await says "awaiting"):'
SELECT i.correlation_key AS delivery, a.status, a.step
  FROM gd.instances i CROSS JOIN LATERAL gd_await(i.id, '10s') a
 WHERE i.fsm = 'delivery' ORDER BY i.id;
DO $$
BEGIN   -- the last parcel's commit wakes the reaper, which resumes its delivery
    WHILE EXISTS (SELECT FROM gd.instances WHERE fsm = 'delivery' AND status <> 'awaiting_signal') LOOP
        PERFORM pg_sleep(0.01);
    END LOOP;
END $$;
\echo 'Then, all parcels done, it parks again on the "picked_up" signal:'
SELECT i.correlation_key AS delivery, i.status, i.step, i.wait_names,
       (SELECT count(*) FROM gd.instances c WHERE c.parent_id = i.id AND c.status = 'done') AS parcels_done
  FROM gd.instances i WHERE i.fsm = 'delivery' ORDER BY i.id;

\echo 'The carrier signals deliveries 1 and 2 by correlation key; delivery 3 gets no signal:'
SELECT gd_signal('delivery-1', 'picked_up', '{"carrier": "DHL"}') AS "signal delivery-1",
       gd_signal('delivery-2', 'picked_up', '{"carrier": "UPS"}') AS "signal delivery-2";
CREATE TEMP TABLE deliveries AS
SELECT i.id, i.correlation_key AS delivery, a.status, a.result
  FROM gd.instances i CROSS JOIN LATERAL gd_await(i.id, '10s', until => 'terminal') a
 WHERE i.fsm = 'delivery';
SELECT d.delivery, d.status, d.result,
       round(extract(epoch FROM i.finished_at - i.wait_started) * 1000) AS ms_after_parking
  FROM deliveries d
  JOIN (SELECT id, finished_at, (SELECT max(updated_at) FROM gd.instances c WHERE c.parent_id = p.id) AS wait_started
          FROM gd.instances p) i USING (id)
 ORDER BY d.id;
\echo 'Deliveries 1 and 2 resumed as their signal committed; delivery 3 timed out after 2s (ctx.timed_out).'

DO $$
BEGIN
    IF (SELECT count(*) FROM gd.instances WHERE fsm = 'delivery' AND status = 'done') <> 3
       OR (SELECT count(*) FROM shop.parcels) <> 6
       OR (SELECT result->>'carrier' FROM gd.instances WHERE correlation_key = 'delivery-3') <> 'no show' THEN
        RAISE EXCEPTION 'demo check failed: deliveries, parcels or the timeout are not as expected';
    END IF;
END $$;
\echo 'OK: 3 deliveries done, 6 parcels packed once each, one pickup timed out.'
