-- Telemetry: gd.step_stats (counts per FSM, step and outcome kind; latency
-- quantiles and Prometheus buckets checked against the exact durations of
-- the step history), gd.queue_stats' counters and executor figures,
-- gd.limit_stats, the step history (gd_history, gd.step_history, rolled
-- back with its step, swept with its instance), trace context, the bounded
-- tables' "(other)" row, who sees what, and bad input.  Queues 'telemetry*'
-- have no background executors: gd._execute runs their steps here.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.timed(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'first' THEN
        PERFORM pg_sleep(coalesce((state->>'ms')::float8, 0) / 1000);
        RETURN gd_next('second');
    END IF;
    IF (state->>'fail_once')::boolean AND ctx.attempt = 1 THEN
        RAISE EXCEPTION 'first try fails';
    END IF;
    RETURN gd_done(jsonb_build_object('trace_context', ctx.trace_context));
END $$;
SELECT gd_define_fsm('tel_timed', initial => 'first', queue => 'telemetry', history => true,
                     steps => '{"first": {"handler": "t.timed(jsonb, gd.context)"},
                                "second": {"handler": "t.timed(jsonb, gd.context)", "backoff": "0s"}}');
SELECT gd_stats_reset();

-- 50 instances whose first step takes 2, 4, ..., 100 ms; 3 whose second step fails once.
SELECT count(gd_insert('tel_timed', jsonb_build_object('ms', 2 * n))) FROM generate_series(1, 50) n;
SELECT count(gd_insert('tel_timed', '{"fail_once": true}')) FROM generate_series(1, 3);
SELECT gd._execute('telemetry', 100) AS first_steps;
SELECT gd._execute('telemetry', 100) AS second_steps;
SELECT gd._execute('telemetry', 100) AS retried_steps;

-- Each step counted once under its FSM, version, step and outcome kind.
SELECT database = current_database() AS this_database, fsm, version, step, kind, count
  FROM gd.step_stats WHERE fsm = 'tel_timed' ORDER BY step, kind;
-- Versions are counted apart: an instance of each of two versions of one FSM.
SELECT gd_define_fsm('tel_versions', initial => 'second', queue => 'telemetry',
                     steps => '{"second": {"handler": "t.timed(jsonb, gd.context)"}}') AS version;
SELECT gd_insert('tel_versions') IS NOT NULL AS inserted_v1;
SELECT gd_define_fsm('tel_versions', initial => 'second', queue => 'telemetry', version => 2, from_version => 1)
    AS version;
SELECT gd_insert('tel_versions') IS NOT NULL AS inserted_v2;
SELECT gd._execute('telemetry', 100) AS ran;
SELECT version, step, kind, count FROM gd.step_stats WHERE fsm = 'tel_versions' ORDER BY version;
-- The quantiles within 10% of the exact ones, total and max exact, the
-- Prometheus buckets cumulative counts of the durations below each bound.
WITH exact AS (
    SELECT percentile_disc(0.50) WITHIN GROUP (ORDER BY d) AS p50,
           percentile_disc(0.95) WITHIN GROUP (ORDER BY d) AS p95,
           percentile_disc(0.99) WITHIN GROUP (ORDER BY d) AS p99,
           sum(d) AS total, max(d) AS max, array_agg(d) AS durations
      FROM (SELECT extract(epoch FROM h.duration) * 1000 AS d
              FROM gd.step_history h JOIN gd.instances i ON i.id = h.instance_id
             WHERE i.fsm = 'tel_timed' AND h.step = 'first') f)
SELECT abs(s.p50_ms / e.p50 - 1) < 0.1 AS p50_within_10pct,
       abs(s.p95_ms / e.p95 - 1) < 0.1 AS p95_within_10pct,
       abs(s.p99_ms / e.p99 - 1) < 0.1 AS p99_within_10pct,
       round(s.total_ms::numeric, 3) = round(e.total, 3) AS total_exact,
       round(s.max_ms::numeric, 3) = round(e.max, 3) AS max_exact,
       s.latency_bucket = ARRAY(SELECT (SELECT count(*) FROM unnest(e.durations) d WHERE d < le * 1000)
                                  FROM unnest(s.latency_le) WITH ORDINALITY AS b(le, n) ORDER BY n) AS buckets_exact,
       s.latency_bucket[cardinality(s.latency_bucket)] = s.count AS last_bucket_all
  FROM gd.step_stats s, exact e
 WHERE s.fsm = 'tel_timed' AND s.step = 'first';

-- The step history: in order, with attempts, kinds, the failed attempt's error and who ran it.
SELECT min(id) AS failing_id FROM gd.instances WHERE fsm = 'tel_timed' AND state ? 'fail_once' \gset
SELECT attempt, step, kind, error->>'message' AS error, duration >= '0' AND ended_at = started_at + duration AS timed,
       worker LIKE 'backend (pid %)' AS by_this_backend
  FROM gd_history(:failing_id);
SELECT count(*) AS history_rows FROM gd.step_history h JOIN gd.instances i ON i.id = h.instance_id WHERE i.fsm = 'tel_timed';
-- Written in the step's transaction: a round rolled back leaves none (its counters stay counted).
SELECT gd_insert('tel_timed') AS rolled_back_id \gset
BEGIN;
SELECT gd._execute('telemetry', 100) AS ran_then_rolled_back;
ROLLBACK;
SELECT count(*) AS history_of_rolled_back FROM gd.step_history WHERE instance_id = :rolled_back_id;
-- An FSM version without history keeps none; the flag cannot change on a
-- defined version (leaving it out, or NULL, keeps it as it is).
SELECT gd_define_fsm('tel_untimed', initial => 'second', queue => 'telemetry',
                     steps => '{"second": {"handler": "t.timed(jsonb, gd.context)"}}');
SELECT gd_insert('tel_untimed') AS untimed_id \gset
SELECT gd._execute('telemetry', 100) >= 1 AS ran;
SELECT status, (SELECT count(*) FROM gd_history(:untimed_id)) AS history FROM gd.instances WHERE id = :untimed_id;
SELECT t.try($$SELECT gd_define_fsm('tel_timed', initial => 'first', queue => 'telemetry')$$);
SELECT t.try($$SELECT gd_define_fsm('tel_untimed', initial => 'second', queue => 'telemetry', history => true)$$);
SELECT t.try($$SELECT gd_define_fsm('tel_untimed', initial => 'second', queue => 'telemetry', history => NULL)$$);
SELECT name, history FROM gd.fsms WHERE name IN ('tel_timed', 'tel_untimed') AND version = 1 ORDER BY name;
SELECT gd_define_fsm('tel_untimed', initial => 'second', queue => 'telemetry', version => 2, history => true);
SELECT t.try($$SELECT * FROM gd_history(-1)$$);
SELECT t.try($$SELECT * FROM gd_history(NULL)$$);

-- gd.queue_stats: the picks of this queue (each gd._execute asked for 100),
-- rows picked; the background executors' figures on queue default.
SELECT picks, rows_asked, rows_picked, executors, in_flight, saturation
  FROM gd.queue_stats WHERE queue = 'telemetry';
SELECT executors, batch_size > 0 AS has_batch_size, saturation BETWEEN 0 AND 1 AS saturation_is_a_share
  FROM gd.queue_stats WHERE queue = 'default';

-- External steps: claim to complete is the step's time, the worker its name;
-- a released claim counts as drained, an outcome for a lost lease as stale.
SELECT gd_define_fsm('tel_timed_ext', initial => 'call', queue => 'telemetry_ext', history => true,
                     steps => '{"call": {}}');
SELECT gd_insert('tel_timed_ext', trace_context => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01') AS ext_id \gset
SELECT gd_insert('tel_timed_ext') AS released_id \gset
SELECT (ctx).trace_context AS claimed_trace_context FROM gd_claim('telemetry_ext', 'worker-7', 2) WHERE id = :ext_id;
SELECT lease_token AS released_token FROM gd.instances WHERE id = :released_id \gset
SELECT lease_token AS ext_token FROM gd.instances WHERE id = :ext_id \gset
SELECT gd_release(:released_id, :released_token) AS released;
SELECT pg_sleep(0.05);
SELECT gd_complete(:ext_id, :ext_token, gd_done()) AS completed;
SELECT gd_complete(:ext_id, :ext_token, gd_done()) AS completed_again;
SELECT attempt, step, kind, worker, duration >= '50 ms' AS claim_to_complete FROM gd_history(:ext_id);
SELECT count, max_ms >= 50 AS timed FROM gd.step_stats WHERE fsm = 'tel_timed_ext';
SELECT picks, rows_asked, rows_picked, drained, stale_outcomes FROM gd.queue_stats WHERE queue = 'telemetry_ext';

-- gd.limit_stats: rate limit tokens and concurrency room, wanted and granted,
-- the partitions throttled most, and a step whose rate limit has no policy.
SELECT gd_define_fsm('tel_limited', initial => 'second', queue => 'telemetry_limits',
                     steps => '{"second": {"handler": "t.timed(jsonb, gd.context)"}}');
SELECT gd_set_rate_limit('tel_rate', rate => 1, per => '1 hour', burst => 2);
SELECT gd_set_concurrency_limit('tel_room', 1);
SELECT count(gd_insert('tel_limited', rate_limit => k)) FROM unnest(ARRAY['tel_rate:a', 'tel_rate:a', 'tel_rate:a', 'tel_rate:b']) k;
SELECT count(gd_insert('tel_limited', concurrency_key => 'tel_room:x')) FROM generate_series(1, 2);
SELECT gd._execute('telemetry_limits', 100) AS ran;
SELECT gd._execute('telemetry_limits', 100) AS ran_once_room_was_made;
SELECT kind, name, partition, wanted, granted, throttled, contended
  FROM gd.limit_stats WHERE name IN ('tel_rate', 'tel_room') ORDER BY kind, name, partition NULLS FIRST;
SELECT gd_set_rate_limit('tel_gone', rate => 10, per => '1 second');
SELECT gd_insert('tel_limited', rate_limit => 'tel_gone') AS gone_id \gset
SELECT gd_drop_rate_limit('tel_gone');
SELECT gd._execute('telemetry_limits', 100) AS held_back;
SELECT kind, name, fsm, step, throttled FROM gd.limit_stats WHERE kind = 'unknown_policy';
SELECT gd_cancel(:gone_id);

-- Trace context: handlers see it, children inherit it (or bring their own),
-- gd_insert_all's entries may carry it.
SELECT gd_insert('tel_timed', trace_context => '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01') AS traced_id \gset
SELECT gd._execute('telemetry', 100) >= 1, gd._execute('telemetry', 100) >= 1;
SELECT status, result->>'trace_context' AS seen_by_handler FROM gd.instances WHERE id = :traced_id;
CREATE FUNCTION t.traced_parent(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'spawn' THEN
        RETURN gd_spawn(jsonb_build_array(
            jsonb_build_object('fsm', 'tel_timed', 'state', jsonb_build_object('ms', 0)),
            jsonb_build_object('fsm', 'tel_timed', 'trace_context',
                               '00-11111111111111111111111111111111-2222222222222222-00')), then_step => 'end');
    END IF;
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('tel_traced_parent', initial => 'spawn', queue => 'telemetry',
                     steps => '{"spawn": {"handler": "t.traced_parent(jsonb, gd.context)"},
                                "end": {"handler": "t.traced_parent(jsonb, gd.context)"}}');
SELECT gd_insert('tel_traced_parent', trace_context => '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')
       AS parent_id \gset
SELECT gd._execute('telemetry', 100) >= 1 AS spawned;
SELECT state, trace_context FROM gd.instances WHERE parent_id = :parent_id ORDER BY id;
SELECT array_agg(id) AS inserted_all FROM gd_insert_all('tel_timed', '[{"state": {"ms": 0}},
    {"trace_context": "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-later"}]') id \gset
SELECT id = (:'inserted_all'::bigint[])[1] AS first, trace_context
  FROM gd.instances WHERE id = ANY (:'inserted_all') ORDER BY id;
SELECT traceparent, t.try(format('SELECT gd_insert(%L, trace_context => %L)', 'tel_timed', traceparent))
  FROM unnest(ARRAY['',
                    'not a traceparent',
                    '00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01',
                    '00-00000000000000000000000000000000-00f067aa0ba902b7-01',
                    '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01',
                    'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
                    '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra',
                    '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01']) traceparent;
SELECT t.try($$SELECT gd_insert_all('tel_timed', '[{"trace_context": "nope"}]')$$);

-- gd.read_instances, a page of the instances the reader may use (for dashboards): filters, order, keyset.
SELECT (SELECT array_agg(id) FROM gd.read_instances(fsm => 'tel_timed', page_size => 3))
       = (SELECT array_agg(id ORDER BY id DESC)
            FROM (SELECT id FROM gd.instances WHERE fsm = 'tel_timed' ORDER BY id DESC LIMIT 3) n) AS newest_first,
       (SELECT count(*) FROM gd.read_instances(fsm => 'tel_timed', status => 'failed')) AS failed,
       (SELECT count(*) FROM gd.read_instances(fsm => 'tel_timed', sort => 'oldest', page_size => 10000,
                                               after_id => (SELECT min(id) FROM gd.instances WHERE fsm = 'tel_timed')))
       = (SELECT count(*) - 1 FROM gd.instances WHERE fsm = 'tel_timed') AS keyset_after_the_first;
SELECT t.try($$SELECT * FROM gd.read_instances(sort => 'sideways')$$);
SELECT t.try($$SELECT * FROM gd.read_instances(page_size => 0)$$);

-- Who sees what: a role that may not use the FSMs sees neither their rows
-- nor the limits' partitions; as a member of pg_monitor it sees the
-- counters (not the instances' history).
CREATE ROLE tel_stranger;
GRANT USAGE ON SCHEMA t TO tel_stranger;
SET ROLE tel_stranger;
SELECT (SELECT count(*) FROM gd.step_stats WHERE fsm = 'tel_timed') AS step_rows,
       (SELECT count(*) FROM gd.limit_stats WHERE partition IS NOT NULL) AS partition_rows,
       (SELECT count(*) FROM gd.step_history) AS history_rows,
       (SELECT count(*) FROM gd.read_instances()) AS instances_read;
SELECT replace(t.try(format('SELECT * FROM gd_history(%s)', :failing_id)), :'failing_id', 'N');
SELECT t.try('SELECT * FROM gd._step_stats_rows()');
SELECT t.try($$SELECT gd._count_limit('rate_limit', 'forged', 1, 1, 0, 0)$$);
RESET ROLE;
GRANT pg_monitor TO tel_stranger;
SET ROLE tel_stranger;
SELECT (SELECT count(*) FROM gd.step_stats WHERE fsm = 'tel_timed') AS step_rows,
       (SELECT count(*) FROM gd.limit_stats WHERE partition IS NOT NULL) > 0 AS sees_partitions,
       (SELECT count(*) FROM gd.step_history) AS history_rows;
RESET ROLE;
REVOKE USAGE ON SCHEMA t FROM tel_stranger;
DROP ROLE tel_stranger;

-- Bounded: label sets beyond a table's room are counted under "(other)",
-- and the overflow in gd.stats; nothing is lost.  1,000 steps of one FSM.
SELECT gd_define_fsm('tel_wide', initial => 's1', queue => 'telemetry_wide',
                     steps => (SELECT jsonb_object_agg('s' || n, '{"handler": "t.timed(jsonb, gd.context)"}'::jsonb)
                                 FROM generate_series(1, 1000) n));
SELECT count(gd_insert('tel_wide', step => 's' || n)) FROM generate_series(1, 1000) n;
SELECT gd._execute('telemetry_wide', 1000) AS ran;
SELECT count(*) < 1000 AS bounded, sum(count) AS counted
  FROM gd.step_stats WHERE fsm IN ('tel_wide', '(other)');
SELECT (SELECT count FROM gd.step_stats WHERE fsm = '(other)') =
       (SELECT count FROM gd.stats WHERE event = 'labels_overflowed') AS overflow_counted;
SELECT t.try($$SELECT gd._count_limit('no_such_kind', 'k', 1, 1, 0, 0)$$);

-- gd_stats_reset empties them all.
SELECT gd_stats_reset();
SELECT (SELECT count(*) FROM gd.step_stats) AS step_rows, (SELECT count(*) FROM gd.limit_stats) AS limit_rows,
       (SELECT sum(picks + rows_asked + rows_picked + drained + reclaimed + stale_outcomes) FROM gd.queue_stats
         WHERE queue LIKE 'telemetry%') AS queue_counts;  -- (the background executors' queues pick at any time)

-- The collector sweeps an instance's history with it.
UPDATE gd._instances SET finished_at = now() - interval '2 days' WHERE id = :failing_id;
SELECT (gd._gc(interval '1 day')).swept >= 1 AS swept;
SELECT count(*) AS history_left FROM gd._step_history WHERE instance_id = :failing_id;
