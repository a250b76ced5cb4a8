-- A saga: reserve stock -> charge the card -> ship once packed; a cancel
-- after the charge refunds it and releases the stock (the FSM's on_cancel
-- step, `compensate`).  Every step is in-database here, on queue 'saga'.
-- Run with psql (docs/reference.md, "Cancellation that compensates";
-- test/sql/035_compensation.sql runs this file as it is).  Every name is
-- qualified, or found on a search_path pinned on its function (see
-- examples/shop.sql for why).  The API functions are in the extension's schema:
SELECT e.extnamespace::pg_catalog.regnamespace AS api FROM pg_catalog.pg_extension e
 WHERE e.extname OPERATOR(pg_catalog.=) 'gen_durable' \gset
CREATE SCHEMA IF NOT EXISTS saga;
CREATE TABLE IF NOT EXISTS saga.stock (item text PRIMARY KEY, available int NOT NULL CHECK (available >= 0));
CREATE TABLE IF NOT EXISTS saga.payments (order_id bigint PRIMARY KEY, amount numeric NOT NULL,
                                          refunded boolean NOT NULL DEFAULT false);
CREATE TABLE IF NOT EXISTS saga.shipments (order_id bigint PRIMARY KEY, item text NOT NULL);

CREATE OR REPLACE FUNCTION saga.reserve(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql SET search_path = pg_catalog, :api, pg_temp AS $$
BEGIN
    UPDATE saga.stock SET available = available - 1 WHERE item = state->>'item';
    RETURN gd_next('charge', state || '{"reserved": true}');
END $$;

CREATE OR REPLACE FUNCTION saga.charge(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql SET search_path = pg_catalog, :api, pg_temp AS $$
BEGIN
    INSERT INTO saga.payments (order_id, amount) VALUES (ctx.id, (state->>'amount')::numeric);
    RETURN gd_next('ship', state || '{"charged": true}');
END $$;

-- Ships once the warehouse signals 'packed'.
CREATE OR REPLACE FUNCTION saga.ship(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql SET search_path = pg_catalog, :api, pg_temp AS $$
BEGIN
    IF jsonb_array_length(ctx.signals) = 0 THEN
        RETURN gd_wait_signal(ARRAY['packed']);
    END IF;
    INSERT INTO saga.shipments VALUES (ctx.id, state->>'item');
    RETURN gd_done(jsonb_build_object('shipped', state->'item'));
END $$;

-- The compensation: undoes what the state says was done.  ctx.cancelled says
-- why, and where the order was ({reason, step, attempt, status, ...}).
CREATE OR REPLACE FUNCTION saga.compensate(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql SET search_path = pg_catalog, :api, pg_temp AS $$
BEGIN
    IF (state->>'charged')::boolean THEN
        UPDATE saga.payments SET refunded = true WHERE order_id = ctx.id;
    END IF;
    IF (state->>'reserved')::boolean THEN
        UPDATE saga.stock SET available = available + 1 WHERE item = state->>'item';
    END IF;
    RETURN gd_done(jsonb_build_object('refunded', coalesce((state->>'charged')::boolean, false),
                                      'released', coalesce((state->>'reserved')::boolean, false),
                                      'cancelled_at', ctx.cancelled->>'step'));
END $$;

SELECT :api.gd_define_fsm('saga_order', initial => 'reserve', queue => 'saga', on_cancel => 'compensate', steps => $${
    "reserve":    {"handler": "saga.reserve(jsonb, gd.context)"},
    "charge":     {"handler": "saga.charge(jsonb, gd.context)"},
    "ship":       {"handler": "saga.ship(jsonb, gd.context)"},
    "compensate": {"handler": "saga.compensate(jsonb, gd.context)", "max_attempts": 10}
}$$);
