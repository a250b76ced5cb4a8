-- An order FSM mixing in-database steps and an external one:
--   reserve (SQL) -> charge (external: examples/shop_handlers.py) -> receipt (SQL)
CREATE SCHEMA IF NOT EXISTS shop;
CREATE TABLE IF NOT EXISTS shop.receipts (order_id bigint PRIMARY KEY, amount numeric, payment_ref text);

CREATE OR REPLACE FUNCTION shop.reserve(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    RETURN gd_next('charge', state || '{"reserved": true}');
END $$;

CREATE OR REPLACE FUNCTION shop.receipt(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shop.receipts VALUES (ctx.id, (state->>'charged')::numeric, state->>'payment_ref');
    RETURN gd_done(jsonb_build_object('paid', state->'charged'));
END $$;

SELECT gd_define_fsm('shop_order', initial => 'reserve', queue => 'shop');
SELECT gd_define_step('shop_order', 'reserve', 'shop.reserve(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('shop_order', 'charge', NULL, max_attempts => 5, backoff => '1s');  -- external
SELECT gd_define_step('shop_order', 'receipt', 'shop.receipt(jsonb, gd.context)'::regprocedure);
