-- The side-by-side comparison's schema, loaded by test/bench/bench.py
-- after test/bench/setup.sql: gen_durable's external-worker FSMs (queue
-- 'ext', run by test/bench/node/peers.js), PgQ's queue and its consumer, and
-- the ledger every peer writes.  graphile-worker and pg-boss create their own
-- schemas when peers.js starts them.
\set QUIET on
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pgq;
CREATE EXTENSION IF NOT EXISTS pgstattuple;   -- W6: exact dead tuples of the queue tables

-- The side effect of every peer's jobs (gen_durable's external worker too):
-- one row per job; W3 writes it at the third step, W4 per child and at the join.
-- Truncated before each run, so max(at) is the last completion of that run.
CREATE TABLE bench.peer_ledger (id bigserial PRIMARY KEY, job_id bigint NOT NULL, payload jsonb,
                                at timestamptz NOT NULL DEFAULT clock_timestamp());
-- W4 for the peers, which have no join: one counter row per parent.
CREATE TABLE bench.peer_fanout (parent text PRIMARY KEY, remaining int NOT NULL);
-- W4 ledger for gen_durable's in-database path.
CREATE TABLE bench.w4_ledger (LIKE bench.w1_ledger INCLUDING ALL);

-- ------------------------------------------------ gen_durable, external path
-- Same shapes as w1/w3/fan-out, every step external (handler NULL), queue 'ext'.
SELECT gd_define_fsm(name => 'x1', initial => 'only', queue => 'ext');
SELECT gd_define_step('x1', 'only', handler => NULL);
SELECT gd_define_fsm(name => 'x3', initial => 'a', queue => 'ext');
SELECT gd_define_step('x3', 'a', handler => NULL);
SELECT gd_define_step('x3', 'b', handler => NULL);
SELECT gd_define_step('x3', 'c', handler => NULL);
SELECT gd_define_fsm(name => 'x4_parent', initial => 'split', queue => 'ext');
SELECT gd_define_step('x4_parent', 'split', handler => NULL);
SELECT gd_define_step('x4_parent', 'join', handler => NULL);
SELECT gd_define_fsm(name => 'x4_child', initial => 'work', queue => 'ext');
SELECT gd_define_step('x4_child', 'work', handler => NULL);

-- ------------------------------------------------ gen_durable, W4 in-database
CREATE FUNCTION bench.w4_child(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench.w4_ledger (job_id, payload) VALUES (ctx.id, state);
    RETURN gd_done();
END $$;
CREATE FUNCTION bench.w4_parent(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'split' THEN
        RETURN gd_spawn((SELECT jsonb_agg(jsonb_build_object('fsm', 'w4_child', 'state', jsonb_build_object('i', i)))
                           FROM generate_series(1, (state->>'children')::int) i), then_step => 'join');
    END IF;
    INSERT INTO bench.w4_ledger (job_id, payload)
    VALUES (-ctx.id, jsonb_build_object('children', jsonb_array_length(ctx.children)));
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('w4_child', initial => 'work', queue => 'default');
SELECT gd_define_step('w4_child', 'work', 'bench.w4_child(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('w4_parent', initial => 'split', queue => 'default');
SELECT gd_define_step('w4_parent', 'split', 'bench.w4_parent(jsonb, gd.context)'::regprocedure, timeout => '5min');
SELECT gd_define_step('w4_parent', 'join', 'bench.w4_parent(jsonb, gd.context)'::regprocedure, timeout => '5min');

-- ------------------------------------------------ PgQ
-- One queue; its ticker is driven by the consumer itself (no pgqd): with
-- ticker_max_lag 0 a tick is made as soon as there are new events.
SELECT pgq.create_queue('bench');
SELECT pgq.set_queue_config('bench', 'ticker_max_lag', '0');
CREATE TABLE bench.pgq_control (stop boolean NOT NULL);
INSERT INTO bench.pgq_control VALUES (false);

-- The consumer loop, in SQL: tick, next_batch, one INSERT per event (or the
-- chain's next event, or the fan-out's children), finish_batch, COMMIT.  When
-- there is no batch it sleeps poll_ms and looks again, until pgq_control.stop.
-- (PgQ has no wake-up: its own daemon, pgqd, ticks every second by default.)
CREATE PROCEDURE bench.pgq_consume(consumer text, poll_ms int DEFAULT 10)
LANGUAGE plpgsql AS $$
DECLARE
    batch bigint;
    ev record;
    left_over int;
BEGIN
    PERFORM pgq.register_consumer('bench', consumer);
    COMMIT;
    LOOP
        PERFORM pgq.ticker('bench');
        COMMIT;
        batch := pgq.next_batch('bench', consumer);
        IF batch IS NULL THEN
            COMMIT;
            EXIT WHEN (SELECT stop FROM bench.pgq_control);
            PERFORM pg_sleep(poll_ms / 1000.0);
            CONTINUE;
        END IF;
        FOR ev IN SELECT e.ev_id, e.ev_type, e.ev_data FROM pgq.get_batch_events(batch) e LOOP
            CASE ev.ev_type
                WHEN 'w1', 'w3c' THEN
                    INSERT INTO bench.peer_ledger (job_id, payload) VALUES (ev.ev_id, ev.ev_data::jsonb);
                WHEN 'w3a' THEN
                    PERFORM pgq.insert_event('bench', 'w3b', ev.ev_data);
                WHEN 'w3b' THEN
                    PERFORM pgq.insert_event('bench', 'w3c', ev.ev_data);
                WHEN 'w4parent' THEN
                    INSERT INTO bench.peer_fanout VALUES (ev.ev_id::text, (ev.ev_data::jsonb->>'children')::int);
                    PERFORM pgq.insert_event('bench', 'w4child', jsonb_build_object('parent', ev.ev_id::text, 'i', i)::text)
                       FROM generate_series(1, (ev.ev_data::jsonb->>'children')::int) i;
                WHEN 'w4child' THEN
                    INSERT INTO bench.peer_ledger (job_id, payload) VALUES (ev.ev_id, ev.ev_data::jsonb);
                    UPDATE bench.peer_fanout SET remaining = remaining - 1
                     WHERE parent = ev.ev_data::jsonb->>'parent' RETURNING remaining INTO left_over;
                    IF left_over = 0 THEN
                        PERFORM pgq.insert_event('bench', 'w4final', jsonb_build_object('parent', ev.ev_data::jsonb->>'parent')::text);
                    END IF;
                WHEN 'w4final' THEN
                    INSERT INTO bench.peer_ledger (job_id, payload) VALUES (-1, ev.ev_data::jsonb);
                ELSE
                    RAISE EXCEPTION 'bench: unknown PgQ event type %', ev.ev_type;
            END CASE;
        END LOOP;
        PERFORM pgq.finish_batch(batch);
        COMMIT;
    END LOOP;
    PERFORM pgq.unregister_consumer('bench', consumer);
    COMMIT;
END $$;
