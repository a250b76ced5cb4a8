-- An order FSM mixing in-database steps and an external one:
--   reserve (SQL) -> charge (external: examples/shop_handlers.py) -> receipt (SQL)
-- Run with psql.  Every name is qualified, or found on a search_path pinned
-- on its function: first on your default search_path is a schema named
-- after you ("$user"), which any role that may create schemas in the
-- database could make, with a gd_define_fsm or a jsonb || of its own.  The
-- API functions are in the extension's schema:
SELECT e.extnamespace::pg_catalog.regnamespace AS api FROM pg_catalog.pg_extension e
 WHERE e.extname OPERATOR(pg_catalog.=) 'gen_durable' \gset
CREATE SCHEMA IF NOT EXISTS shop;
CREATE TABLE IF NOT EXISTS shop.receipts (order_id bigint PRIMARY KEY, amount numeric, payment_ref text);

CREATE OR REPLACE FUNCTION shop.reserve(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql SET search_path = pg_catalog, :api, pg_temp AS $$
BEGIN
    RETURN gd_next('charge', state || '{"reserved": true}');
END $$;

CREATE OR REPLACE FUNCTION shop.receipt(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql SET search_path = pg_catalog, :api, pg_temp AS $$
BEGIN
    INSERT INTO shop.receipts VALUES (ctx.id, (state->>'charged')::numeric, state->>'payment_ref');
    RETURN gd_done(jsonb_build_object('paid', state->'charged'));
END $$;

SELECT :api.gd_define_fsm('shop_order', initial => 'reserve', queue => 'shop');
SELECT :api.gd_define_step('shop_order', 'reserve', 'shop.reserve(jsonb, gd.context)'::pg_catalog.regprocedure);
SELECT :api.gd_define_step('shop_order', 'charge', NULL, max_attempts => 5, backoff => '1s');  -- external
SELECT :api.gd_define_step('shop_order', 'receipt', 'shop.receipt(jsonb, gd.context)'::pg_catalog.regprocedure);
