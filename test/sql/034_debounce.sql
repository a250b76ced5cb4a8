-- Debounce, throttle and singleton: insert options keyed by correlation key.
-- Queue 'burst' has no background executors: gd_drain runs its steps.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE TABLE t.runs (instance_id bigint, step text, state jsonb);
CREATE FUNCTION t.record_run(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.runs VALUES (ctx.id, ctx.step, state);
    RETURN CASE ctx.step WHEN 'first' THEN gd_next('second', delay => '1 hour') ELSE gd_done() END;
END $$;
SELECT gd_define_fsm('burst', initial => 'first', queue => 'burst', state_defaults => '{"source": "default"}');
SELECT gd_define_step('burst', 'first', 't.record_run(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('burst', 'second', 't.record_run(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('other', initial => 'first', queue => 'burst');
SELECT gd_define_step('other', 'first', 't.record_run(jsonb, gd.context)'::regprocedure);

-- Debounce: the first insert runs a quiet period after it...
SELECT gd_insert('burst', '{"n": 1}', correlation_key => 'doc-1', debounce => '10 minutes') AS debounced_id \gset
SELECT eligible_at BETWEEN now() + interval '9 minutes' AND clock_timestamp() + interval '10 minutes' AS in_ten_minutes,
       debounced_at = updated_at AS pending
  FROM gd.instances WHERE id = :debounced_id;
-- ...a later one within it joins it: its state replaces the first's (over the
-- defaults), the quiet period starts again, and its id is returned.
SELECT eligible_at AS first_eligible FROM gd.instances WHERE id = :debounced_id \gset
SELECT pg_sleep(0.01);
SELECT gd_insert('burst', '{"n": 2}', correlation_key => 'doc-1', debounce => '20 minutes') = :debounced_id
    AS joined_the_pending;
SELECT count(*) AS instances, min(state::text) AS state,
       min(eligible_at) > :'first_eligible'::timestamptz + interval '9 minutes' AS moved_later
  FROM gd.instances WHERE correlation_key = 'doc-1';
-- One run, with the last state.
BEGIN;
SELECT set_config('gen_durable.now', (now() + interval '30 minutes')::text, true) IS NOT NULL AS half_an_hour_later;
SELECT gd_drain('burst') AS steps_run;
COMMIT;
SELECT step, state FROM t.runs WHERE instance_id = :debounced_id ORDER BY step;
-- Once its first step has run, the key's holder no longer takes later
-- inserts: they are duplicates (on_duplicate), even while it waits.
SELECT step, status, debounced_at = updated_at AS pending FROM gd.instances WHERE id = :debounced_id;
SELECT regexp_replace(t.try($$SELECT gd_insert('burst', '{"n": 3}', correlation_key => 'doc-1', debounce => '1 minute')$$),
                      'Instance \d+', 'Instance N');
SELECT gd_insert('burst', '{"n": 3}', correlation_key => 'doc-1', debounce => '1 minute',
                 on_duplicate => 'existing') = :debounced_id AS existing_returned;
SELECT state FROM gd.instances WHERE id = :debounced_id;
-- A key held by an instance inserted without debounce, or of another FSM,
-- is a duplicate too: a debounced insert joins only a debounced instance of
-- its own FSM and first step.
SELECT gd_insert('burst', correlation_key => 'plain-1', schedule_in => '1 hour') AS plain_id \gset
SELECT gd_insert('burst', correlation_key => 'plain-1', debounce => '1 minute', on_duplicate => 'skip') IS NULL
    AS plain_not_joined;
SELECT gd_insert('other', correlation_key => 'shared-1', debounce => '1 minute') AS other_id \gset
SELECT gd_insert('burst', correlation_key => 'shared-1', debounce => '1 minute', on_duplicate => 'skip') IS NULL
    AS other_fsm_not_joined;
SELECT gd_insert('burst', step => 'second', correlation_key => 'shared-2', debounce => '1 minute') IS NOT NULL
    AS at_second;
SELECT gd_insert('burst', correlation_key => 'shared-2', debounce => '1 minute', on_duplicate => 'skip') IS NULL
    AS other_step_not_joined;
-- The instance is the insert's (and its join's) transaction's: rolled back, nothing changed.
SELECT gd_insert('burst', '{"n": 1}', correlation_key => 'doc-2', debounce => '1 minute') AS doc2_id \gset
BEGIN;
SELECT gd_insert('burst', '{"n": 2}', correlation_key => 'doc-2', debounce => '5 minutes') = :doc2_id AS joined;
ROLLBACK;
SELECT state->>'n' AS n, eligible_at < clock_timestamp() + interval '2 minutes' AS eligible_unchanged
  FROM gd.instances WHERE id = :doc2_id;
-- gd_insert_all's entries join like gd_insert (their ids returned).
SELECT array_agg(new_id) = ARRAY[:doc2_id, :doc2_id]::bigint[] AS both_joined FROM gd_insert_all('burst', '[
    {"state": {"n": 3}, "correlation_key": "doc-2", "debounce": "1 minute"},
    {"state": {"n": 4}, "correlation_key": "doc-2", "debounce": "1 minute"}
]') AS new_id;
SELECT state->>'n' AS n FROM gd.instances WHERE id = :doc2_id;
-- gd_spawn's children too: two debounced children of one key are one child.
CREATE FUNCTION t.fan_out(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
    SELECT gd_spawn('[{"fsm": "burst", "state": {"n": 1}, "correlation_key": "kid", "debounce": "1 minute"},
                      {"fsm": "burst", "state": {"n": 2}, "correlation_key": "kid", "debounce": "1 minute"}]',
                    then_step => 'end')
$$;
SELECT gd_define_fsm('burst_fan', initial => 'start', queue => 'burst');
SELECT gd_define_step('burst_fan', 'start', 't.fan_out(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('burst_fan', 'end', 't.record_run(jsonb, gd.context)'::regprocedure);
SELECT gd_insert('burst_fan') AS fan_id \gset
SELECT gd_drain('burst') AS steps_run;
SELECT count(*) AS children, min(state->>'n') AS n FROM gd.instances WHERE parent_id = :fan_id;

-- Throttle 'drop': at most one instance of a key per period; the rest are
-- not inserted (NULL).  A throttled key does not keep its instances unique.
SELECT gd_insert('burst', '{"n": 1}', correlation_key => 'mail-1', throttle => '1 hour') IS NOT NULL AS first_inserted;
SELECT gd_insert('burst', '{"n": 2}', correlation_key => 'mail-1', throttle => '1 hour') IS NULL AS second_dropped;
SELECT count(*) AS instances, min(correlation_scope::text) AS scope FROM gd.instances WHERE correlation_key = 'mail-1';
-- After the period the next one is inserted, and starts another period.
UPDATE gd._throttles SET next_start = now() - interval '1 second' WHERE key = 'mail-1';
SELECT gd_insert('burst', '{"n": 3}', correlation_key => 'mail-1', throttle => '1 hour') IS NOT NULL AS after_period;
SELECT gd_insert('burst', '{"n": 4}', correlation_key => 'mail-1', throttle => '1 hour') IS NULL AS dropped_again;
SELECT count(*) AS instances FROM gd.instances WHERE correlation_key = 'mail-1';
-- Throttle 'queue': each later insert starts a period after the one before.
SELECT array_agg(gd_insert('burst', jsonb_build_object('n', n), correlation_key => 'sync-1', throttle => '1 minute',
                           on_throttle => 'queue') ORDER BY n) AS queued_ids
  FROM generate_series(1, 3) n \gset
SELECT state->>'n' AS n, eligible_at - min(eligible_at) OVER () AS after_first
  FROM gd.instances WHERE id = ANY (:'queued_ids'::bigint[]) ORDER BY id;
-- An insert asked for later than the key's next free start starts when asked.
SELECT gd_insert('burst', correlation_key => 'sync-1', throttle => '1 minute', on_throttle => 'queue',
                 schedule_in => '1 day') AS late_id \gset
SELECT eligible_at > now() + interval '23 hours' AS as_asked FROM gd.instances WHERE id = :late_id;
-- An explicit scope keeps the key unique too: a duplicate takes no period.
SELECT gd_insert('burst', correlation_key => 'once-1', throttle => '1 hour', correlation_scope => '{runnable}') AS once_id \gset
UPDATE gd._throttles SET next_start = now() - interval '1 second' WHERE key = 'once-1';
SELECT gd_insert('burst', correlation_key => 'once-1', throttle => '1 hour', correlation_scope => '{runnable}',
                 on_duplicate => 'existing') = :once_id AS duplicate_existing;
SELECT next_start < now() AS period_not_taken FROM gd._throttles WHERE key = 'once-1';
-- gd_insert_all: a dropped entry returns no id.
SELECT count(*) AS inserted FROM gd_insert_all('burst', '[
    {"correlation_key": "bulk-mail", "throttle": "1 hour"},
    {"correlation_key": "bulk-mail", "throttle": "1 hour"},
    {"correlation_key": "bulk-mail", "throttle": "1 hour", "on_throttle": "queue"}
]');
-- The collector deletes the periods that have passed.
UPDATE gd._throttles SET next_start = now() - interval '1 second' WHERE key = 'bulk-mail';
SELECT count(*) AS throttles_before FROM gd._throttles \gset
SELECT swept FROM gd._gc('1 day');
SELECT :throttles_before - count(*) AS throttles_swept FROM gd._throttles;

-- Singleton: a correlation key with on_duplicate => 'existing'. The first
-- insert wins; the later ones return its id and change nothing.
SELECT gd_insert('burst', '{"n": 1}', correlation_key => 'job-1', on_duplicate => 'existing') AS singleton_id \gset
SELECT gd_insert('burst', '{"n": 2}', correlation_key => 'job-1', on_duplicate => 'existing') = :singleton_id
    AS later_returns_first;
SELECT count(*) AS instances, min(state->>'n') AS n FROM gd.instances WHERE correlation_key = 'job-1';

-- Refusals: 22023, a gen_durable: message, and nothing written.
SELECT count(*) AS instances_before FROM gd.instances \gset
SELECT count(*) AS throttles_before FROM gd._throttles \gset
SELECT t.try($$SELECT gd_insert('burst', debounce => '1 minute')$$);
SELECT t.try($$SELECT gd_insert('burst', throttle => '1 minute')$$);
SELECT t.try($$SELECT gd_insert('burst', correlation_key => 'x', debounce => '1 minute', throttle => '1 minute')$$);
SELECT t.try($$SELECT gd_insert('burst', correlation_key => 'x', debounce => '1 minute', schedule_in => '1 minute')$$);
SELECT t.try($$SELECT gd_insert('burst', correlation_key => 'x', debounce => '1 minute', eligible_at => now())$$);
SELECT t.try($$SELECT gd_insert('burst', correlation_key => 'x', debounce => '0')$$);
SELECT t.try($$SELECT gd_insert('burst', correlation_key => 'x', debounce => '-1 minute')$$);
SELECT t.try($$SELECT gd_insert('burst', correlation_key => 'x', debounce => '200 years')$$);
SELECT t.try($$SELECT gd_insert('burst', correlation_key => 'x', throttle => '0')$$);
SELECT t.try($$SELECT gd_insert('burst', correlation_key => 'x', throttle => '200 years')$$);
SELECT t.try($$SELECT gd_insert('burst', correlation_key => 'x', throttle => '1 minute', on_throttle => 'wait')$$);
SELECT t.try($$SELECT gd_insert('burst', correlation_key => 'x', throttle => '1 minute', on_throttle => NULL)$$);
SELECT t.try($$SELECT gd_insert_all('burst', '[{"correlation_key": "x", "debounce": 60}]')$$);
SELECT t.try($$SELECT gd_insert_all('burst', '[{"correlation_key": "x", "throttle": "soon"}]')$$);
SELECT t.try($$SELECT gd_insert_all('burst', '[{"correlation_key": "x", "throttle": "1 minute", "on_throttle": "later"}]')$$);
SELECT count(*) - :instances_before AS instances_written, (SELECT count(*) FROM gd._throttles) - :throttles_before
    AS throttles_written
  FROM gd.instances;
