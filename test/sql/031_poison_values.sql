-- Values that would poison a queue later are refused where they are given,
-- with a gen_durable: message (22023).  Queue 'poison' has no background
-- executor: gd._execute steps it.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.poison_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF state ? 'wait_names' THEN
        -- an outcome built by hand, past gd_wait_signal's own check
        RETURN ROW('await', NULL, NULL, NULL, NULL, NULL, NULL, (state->>'wait_names')::text[], NULL, NULL)::gd.outcome;
    END IF;
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('poison', initial => 'go', queue => 'poison');
SELECT gd_define_step('poison', 'go', 't.poison_step(jsonb, gd.context)'::regprocedure, max_attempts => 1);

-- An eligibility of -infinity (gd.queue_stats could not subtract it);
-- infinity means never.
SELECT t.try($$SELECT gd_insert('poison', eligible_at => '-infinity')$$);
SELECT t.try($$SELECT gd_insert_all('poison', '[{"eligible_at": "-infinity"}]')$$);
SELECT gd_insert('poison', eligible_at => 'infinity') AS never \gset
SELECT status, eligible_at FROM gd.queue_stats q, gd.instances i WHERE q.queue = 'poison' AND i.id = :never;

-- A limit name longer than the executors keep (63 bytes): it would be cut,
-- then never found.
SELECT t.try(format($$SELECT gd_set_rate_limit(%L, 1, '1s')$$, repeat('r', 64)));
SELECT t.try(format($$SELECT gd_set_concurrency_limit(%L, 1)$$, repeat('c', 64)));
SELECT t.try(format($$SELECT gd_define_step('poison', 'go', 't.poison_step(jsonb, gd.context)'::regprocedure, rate_limit => %L)$$,
                    repeat('r', 64)));
SELECT gd_set_rate_limit(repeat('r', 63), 1, '1s');   -- 63 bytes are fine
-- A refill period past timestamps' range.
SELECT t.try($$SELECT gd_set_rate_limit('slow', 1, '1000 years')$$);

-- A timeout below a millisecond would round to none at all.
SELECT t.try($$SELECT gd_define_step('poison', 'timed', 't.poison_step(jsonb, gd.context)'::regprocedure, timeout => '0.4ms')$$);
SELECT t.try($$SELECT gd_define_step('poison', 'timed', 't.poison_step(jsonb, gd.context)'::regprocedure, timeout => '1ms')$$);

-- Queue names are at most 63 bytes, not characters.
SELECT t.try(format($$SELECT gd_define_fsm('poison_q', 'go', queue => %L)$$, repeat('é', 32)));

-- A correlation scope of more than one dimension.
SELECT t.try($$SELECT gd_insert('poison', correlation_key => 'k2d', correlation_scope => '{{runnable},{done}}')$$);
-- A scope always holds the live statuses: a key let go while its instance
-- waited could be taken, and the instance's resuming would collide.
SELECT gd_insert('poison', correlation_key => 'k-done', correlation_scope => '{done}') AS scoped \gset
SELECT gd_insert('poison', correlation_key => 'k-none', correlation_scope => '{}') AS unscoped \gset
SELECT correlation_key, correlation_scope FROM gd.instances WHERE id IN (:scoped, :unscoped) ORDER BY id;
DELETE FROM gd._instances WHERE id IN (:scoped, :unscoped);

-- An outcome built by hand with a NULL or empty signal name fails its step
-- (it would park for ever).
SELECT gd_insert('poison', '{"wait_names": "{NULL}"}') AS null_name \gset
SELECT gd_insert('poison', '{"wait_names": "{\"\"}"}') AS empty_name \gset
SELECT gd._execute('poison', 10) AS ran;
SELECT status, error->>'sqlstate' AS sqlstate, error->>'message' AS message
  FROM gd.instances WHERE id IN (:null_name, :empty_name) ORDER BY id;

DELETE FROM gd._instances WHERE fsm = 'poison';
DELETE FROM gd._steps WHERE fsm = 'poison';
DELETE FROM gd._fsms WHERE name = 'poison';
SELECT gd_drop_rate_limit(repeat('r', 63));
