-- gd.stats counters (drive each event, read it), gd_stats_reset, gd.queue_stats,
-- gd.workers, and garbage collection.  Queue 'obs' has no background executors.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
-- gd.queue_stats shows queue 'mail' as 003_insert leaves it: one instance
-- runnable at an external step, which its executor never runs.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM gd.instances WHERE queue = 'mail') THEN
        PERFORM gd_define_fsm('mail_parked', initial => 'ext', queue => 'mail');
        PERFORM gd_define_step('mail_parked', 'ext');
        PERFORM gd_insert('mail_parked');
    END IF;
END $$;
CREATE FUNCTION t.observed(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    CASE state->>'do'
        WHEN 'next' THEN RETURN gd_next('finish', state || '{"do": "done"}');
        WHEN 'raise' THEN RAISE EXCEPTION 'boom';
        WHEN 'wait' THEN RETURN gd_wait_signal(ARRAY['never'], timeout => '0s', then_step => 'finish',
                                                state => state || '{"do": "done"}');
        WHEN 'spawn' THEN RETURN gd_spawn('[{"fsm": "obs", "state": {"do": "done"}}]', then_step => 'finish',
                                          state => state || '{"do": "done"}');
        WHEN 'stop' THEN RETURN gd_stop('{}');
        ELSE RETURN gd_done();
    END CASE;
END $$;
SELECT gd_define_fsm('obs', initial => 'start', queue => 'obs');
SELECT gd_define_step('obs', 'start', 't.observed(jsonb, gd.context)'::regprocedure, max_attempts => 1);
SELECT gd_define_step('obs', 'finish', 't.observed(jsonb, gd.context)'::regprocedure);

SELECT gd_stats_reset();
-- (the background executors' idle picks on other queues may count at any time)
SELECT count(*) AS events, sum(count) FILTER (WHERE event NOT LIKE 'pick%') AS total FROM gd.stats;
SELECT count(gd_insert('obs', jsonb_build_object('do', d), correlation_key => 'obs-' || d))
  FROM unnest(ARRAY['next', 'raise', 'wait', 'spawn', 'stop', 'done']) d;
SELECT gd._execute('obs', 100) AS first_round;         -- 6 steps; the spawn adds a child
SELECT t.until_status(id, 'runnable') FROM gd.instances WHERE correlation_key = 'obs-wait';  -- the reaper ends the 0 s wait
SELECT gd._execute('obs', 100) AS second_round;        -- next's finish, the child, the timed-out wait's finish
SELECT t.until_status(id, 'runnable') FROM gd.instances WHERE correlation_key = 'obs-spawn';  -- all children ended
SELECT gd._execute('obs', 100) AS third_round;         -- the spawner's finish
SELECT status, count(*) FROM gd.instances WHERE fsm = 'obs' GROUP BY 1 ORDER BY 1;

-- Each step event counted once per step of its kind, with its duration.
SELECT event, count, total_ms >= 0 AND max_ms >= 0 AND max_ms <= total_ms AS timed
  FROM gd.stats WHERE event LIKE 'step\_%' ORDER BY event;
SELECT (SELECT count FROM gd.stats WHERE event = 'pick_rows') AS pick_rows,
       (SELECT count FROM gd.stats WHERE event = 'pick') >= 3 AS picked,
       (SELECT count FROM gd.stats WHERE event = 'pick_demand') >= 300 AS demand,
       (SELECT count FROM gd.stats WHERE event = 'await_timeout') AS await_timeout;
SELECT gd_stats_reset();
SELECT sum(count) FILTER (WHERE event LIKE 'step\_%') AS steps_after_reset FROM gd.stats;
SELECT t.try($$SELECT gd._count('no_such_event', 1)$$);

-- gd.queue_stats: per queue and status; scheduled rows apart from eligible ones.
SELECT gd_insert('obs', '{"do": "done"}') IS NOT NULL AS eligible,
       gd_insert('obs', '{"do": "done"}', schedule_in => '1 hour') IS NOT NULL AS scheduled;
SELECT queue, runnable, scheduled, executing, awaiting_signal, awaiting_children, done, failed, cancelled,
       oldest_runnable_age >= interval '0' AS has_age, paused
  FROM gd.queue_stats WHERE queue IN ('obs', 'mail') ORDER BY queue;

-- gd.workers: the launcher and, for this database, a reaper, a collector and the executors.
SELECT kind, queue, count(*) FROM gd.workers WHERE database = current_database() OR kind = 'launcher'
 GROUP BY 1, 2 ORDER BY 1, 2;

-- GC: terminal instances past retention go, with their signals; live ones,
-- recent ones and the finished children of a live parent stay.  (The
-- background collector may sweep too: the outcome is the same.)
DELETE FROM gd._instances WHERE fsm = 'obs';
SELECT gd_insert('obs', correlation_key => 'gc-old') AS old_id \gset
SELECT gd_signal(:old_id, 'note');
SELECT gd_insert('obs', correlation_key => 'gc-recent') AS recent_id \gset
SELECT gd_insert('obs', correlation_key => 'gc-live-parent') AS live_id \gset
SELECT gd_insert('obs', correlation_key => 'gc-old-child') AS child_id \gset
UPDATE gd._instances SET parent_id = :live_id WHERE id = :child_id;
UPDATE gd._instances SET status = 'awaiting_children' WHERE id = :live_id;
UPDATE gd._instances SET status = 'done', finished_at = now() - interval '2 days' WHERE id IN (:old_id, :child_id);
UPDATE gd._instances SET status = 'done', finished_at = now() WHERE id = :recent_id;
SELECT gd_stats_reset();
SELECT (gd._gc(interval '1 day')).swept <= 1 AS swept_at_most_one;
SELECT correlation_key, status FROM gd.instances WHERE fsm = 'obs' ORDER BY 1;
SELECT (SELECT count FROM gd.stats WHERE event = 'gc_swept') >= 1 AS gc_swept_counted;
SELECT count(*) AS signals_left_of_swept FROM gd.signals WHERE instance_id = :old_id;
SELECT (gd._gc(interval '1 day')).swept AS swept_again;
-- Once the parent has ended, its old children go too.
UPDATE gd._instances SET status = 'cancelled', finished_at = now() WHERE id = :live_id;
SELECT (gd._gc(interval '1 day')).swept AS children_swept;
SELECT correlation_key, status FROM gd.instances WHERE fsm = 'obs' ORDER BY 1;
