-- Signals, timed waits: an order waits for payment_confirmed and takes both
-- branches.  Queue 'sig' has no background executors: gd._execute steps it;
-- the background reaper ends timed-out waits.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.order_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    CASE ctx.step
        WHEN 'place' THEN
            RETURN gd_wait_signal('{payment_confirmed}', timeout => (state->>'wait')::interval,
                                  then_step => 'decide', state => state || '{"placed": true}');
        WHEN 'decide' THEN
            IF ctx.timed_out THEN
                RETURN gd_done('{"outcome": "expired"}');
            END IF;
            RETURN gd_done(jsonb_build_object('outcome', 'paid',
                           'payments', (SELECT jsonb_agg(s->'payload') FROM jsonb_array_elements(ctx.signals) s),
                           'names', (SELECT jsonb_agg(s->'name') FROM jsonb_array_elements(ctx.signals) s)));
    END CASE;
END $$;
SELECT gd_define_fsm('order_pay', initial => 'place', queue => 'sig', state_defaults => '{"wait": "1 hour"}');
SELECT gd_define_step('order_pay', 'place', 't.order_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('order_pay', 'decide', 't.order_step(jsonb, gd.context)'::regprocedure);

-- Paid: the order parks, ignores other signals, wakes on payment_confirmed.
SELECT gd_insert('order_pay', correlation_key => 'order-paid') AS paid_id \gset
SELECT gd._execute('sig', 10);
SELECT status, step, wait_names, wait_then_step, state FROM gd.instances WHERE id = :paid_id;
SELECT status FROM gd_await(:paid_id, '1s');
SELECT gd_signal(:paid_id, 'shipping_quote', '{"eur": 4}');
SELECT status FROM gd.instances WHERE id = :paid_id;
SELECT gd_signal('order-paid', 'payment_confirmed', '{"amount": 12}', dedup_key => 'pay-1');
SELECT gd_signal('order-paid', 'payment_confirmed', '{"amount": 12}', dedup_key => 'pay-1') AS redelivered;
SELECT status, step, resume->'signals'->0->'payload' AS seen FROM gd.instances WHERE id = :paid_id;
SELECT gd._execute('sig', 10);
SELECT status, result FROM gd_await(:paid_id, '1s');
-- The other signal is kept, unconsumed; the payment was consumed once.
SELECT name, payload, consumed_at IS NOT NULL AS consumed FROM gd.signals WHERE instance_id = :paid_id ORDER BY id;

-- Expired: no payment within the timeout; the reaper resumes it with ctx.timed_out.
SELECT gd_insert('order_pay', '{"wait": "300 milliseconds"}') AS late_id \gset
SELECT gd._execute('sig', 10);
SELECT status, wait_deadline IS NOT NULL AS has_deadline FROM gd.instances WHERE id = :late_id;
SELECT t.until_status(:late_id, 'runnable');
SELECT step, resume, updated_at - created_at >= interval '300 milliseconds' AS after_deadline
  FROM gd.instances WHERE id = :late_id;
SELECT gd._execute('sig', 10);
SELECT status, result FROM gd_await(:late_id, '1s');

-- A signal that arrives before the wait is kept and consumed by it at once.
SELECT gd_insert('order_pay') AS early_id \gset
SELECT gd_signal(:early_id, 'payment_confirmed', '{"amount": 1}');
SELECT gd_signal(:early_id, 'payment_confirmed', '{"amount": 2}');
SELECT gd._execute('sig', 1);
SELECT status, step FROM gd.instances WHERE id = :early_id;
SELECT gd._execute('sig', 1);
SELECT status, result FROM gd_await(:early_id, '1s');

-- A signal with an expiry that arrives before the wait is consumed by it only
-- while it has not expired: a stale one stays in the inbox, unconsumed.
SELECT gd_insert('order_pay') AS stale_id \gset
SELECT gd_signal(:stale_id, 'payment_confirmed', '{"amount": 3}', expires => '10 milliseconds') AS stale,
       gd_signal(:stale_id, 'payment_confirmed', '{"amount": 4}', expires => '1 hour') AS fresh;
SELECT pg_sleep(0.05);
SELECT gd._execute('sig', 1);
SELECT status, step, resume->'signals' @> '[{"payload": {"amount": 4}}]' AS took_fresh,
       jsonb_array_length(resume->'signals') AS taken FROM gd.instances WHERE id = :stale_id;
SELECT payload, consumed_at IS NULL AS unconsumed FROM gd.signals WHERE instance_id = :stale_id ORDER BY id;
SELECT gd._execute('sig', 1);
SELECT gd_insert('order_pay') AS all_stale_id \gset
SELECT gd_signal(:all_stale_id, 'payment_confirmed', expires => '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT gd._execute('sig', 1);
SELECT status, step FROM gd.instances WHERE id = :all_stale_id;
SELECT t.try(format('SELECT gd_signal(%s, %L, expires => %L)', :all_stale_id, 'x', '0'));
SELECT t.try(format('SELECT gd_signal(%s, %L, expires => %L)', :all_stale_id, 'x', '-1 minute'));
SELECT gd_cancel(:all_stale_id);

-- Refusals.
SELECT t.try($$SELECT gd_signal(-1, 'x')$$);
SELECT t.try(format('SELECT gd_signal(%s, %L)', :paid_id, 'x')) ~ '^P0002 .* is not a live instance \[It is done.\]$' AS done_refused;
SELECT t.try($$SELECT gd_signal('no-such-key', 'x')$$);
SELECT t.try(format('SELECT gd_signal(%s, %L)', :early_id, '')) ~ '^22023' AS empty_name_refused;
SELECT t.try(format('SELECT gd_signal(%s, %L, NULL)', :early_id, 'x')) ~ '^22023' AS null_payload_refused;
SELECT t.try($$SELECT gd_wait_signal('{}')$$);
SELECT t.try($$SELECT gd_wait_signal(NULL)$$);
SELECT t.try($$SELECT gd_wait_signal('{a,NULL}')$$);
SELECT t.try($$SELECT gd_wait_signal('{a}', timeout => '-1s')$$);

-- A step resumed by a signal that fails and is retried sees the same ctx.signals again.
CREATE FUNCTION t.flaky_after_signal(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'park' THEN
        RETURN gd_wait_signal(ARRAY['go'], then_step => 'use');
    END IF;
    IF ctx.attempt = 1 THEN
        RAISE EXCEPTION 'first try fails';
    END IF;
    RETURN gd_done(jsonb_build_object('attempt', ctx.attempt, 'payload', ctx.signals->0->'payload'));
END $$;
SELECT gd_define_fsm('flaky_sig', initial => 'park', queue => 'sig');
SELECT gd_define_step('flaky_sig', 'park', 't.flaky_after_signal(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('flaky_sig', 'use', 't.flaky_after_signal(jsonb, gd.context)'::regprocedure, backoff => '0s');
SELECT gd_insert('flaky_sig') AS flaky_id \gset
SELECT gd._execute('sig', 10);
SELECT gd_signal(:flaky_id, 'go', '{"n": 7}');
SELECT gd._execute('sig', 10);   -- attempt 1 of 'use' fails
SELECT status, step, attempt, resume->'signals'->0->'payload' AS kept FROM gd.instances WHERE id = :flaky_id;
SELECT gd._execute('sig', 10);   -- attempt 2 sees the signal
SELECT status, result FROM gd_await(:flaky_id, '1s');

-- missing_ok: a target that is not (or no longer) live returns NULL instead of P0002.
SELECT gd_signal(:flaky_id, 'late', missing_ok => true) IS NULL AS ended_by_id,
       gd_signal('nobody-holds-this', 'late', missing_ok => true) IS NULL AS no_holder,
       gd_signal(-1, 'late', missing_ok => true) IS NULL AS no_instance;
SELECT t.try($$SELECT gd_signal(-1, 'late')$$);
