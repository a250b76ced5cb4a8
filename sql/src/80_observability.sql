-- ---------------------------------------------------------------------------
-- Observability: counters, queue statistics; garbage collection
-- ---------------------------------------------------------------------------

CREATE FUNCTION gd._stats(OUT event text, OUT count bigint, OUT total_ms float8, OUT max_ms float8,
                          OUT since timestamptz)
    RETURNS SETOF record LANGUAGE c AS 'MODULE_PATHNAME', 'gd_stats';
CREATE FUNCTION gd._count(event text, amount bigint DEFAULT 1) RETURNS void
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_count_event';

-- The engine's counters since the last reset or server start, cluster-wide;
-- step events also carry the time spent in the step.
CREATE VIEW gd.stats AS SELECT * FROM gd._stats();

CREATE FUNCTION @extschema@.gd_stats_reset() RETURNS void
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_stats_reset';
REVOKE ALL ON FUNCTION @extschema@.gd_stats_reset() FROM PUBLIC;

-- Per queue (known or configured): instances per status, the runnable ones split into eligible now
-- and scheduled later, the age of the oldest eligible one, and pause state.
CREATE VIEW gd.queue_stats AS
SELECT q.name AS queue,
       coalesce(s.runnable, 0) AS runnable,
       coalesce(s.scheduled, 0) AS scheduled,
       coalesce(s.executing, 0) AS executing,
       coalesce(s.awaiting_signal, 0) AS awaiting_signal,
       coalesce(s.awaiting_children, 0) AS awaiting_children,
       coalesce(s.done, 0) AS done,
       coalesce(s.failed, 0) AS failed,
       coalesce(s.cancelled, 0) AS cancelled,
       s.oldest_runnable_age,
       q.paused
  FROM (SELECT k.name, k.paused FROM gd.queues k
        UNION ALL
        SELECT c.name, false FROM unnest(gd._configured_queues()) c(name)
         WHERE NOT EXISTS (SELECT FROM gd.queues k WHERE k.name = c.name)) q
  LEFT JOIN (
      SELECT i.queue,
             count(*) FILTER (WHERE i.status = 'runnable' AND i.eligible_at <= now()) AS runnable,
             count(*) FILTER (WHERE i.status = 'runnable' AND i.eligible_at > now()) AS scheduled,
             count(*) FILTER (WHERE i.status = 'executing') AS executing,
             count(*) FILTER (WHERE i.status = 'awaiting_signal') AS awaiting_signal,
             count(*) FILTER (WHERE i.status = 'awaiting_children') AS awaiting_children,
             count(*) FILTER (WHERE i.status = 'done') AS done,
             count(*) FILTER (WHERE i.status = 'failed') AS failed,
             count(*) FILTER (WHERE i.status = 'cancelled') AS cancelled,
             now() - min(i.eligible_at) FILTER (WHERE i.status = 'runnable' AND i.eligible_at <= now())
                 AS oldest_runnable_age
        FROM gd.instances i GROUP BY i.queue) s ON s.queue = q.name;

-- GC: terminal instances that finished longer than `retention` ago, with
-- their signals, in one small batch; returns how many instances went.  A
-- child is kept while its parent is live (the parent's join reads it).
CREATE INDEX instances_finished ON gd.instances (finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');

CREATE FUNCTION gd._gc(retention interval, batch int DEFAULT 1000) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    swept int;
BEGIN
    WITH victims AS (
        SELECT i.id FROM gd.instances i
         WHERE i.status IN ('done', 'failed', 'cancelled') AND i.finished_at < clock_timestamp() - retention
           AND (i.parent_id IS NULL OR NOT EXISTS (
                   SELECT FROM gd.instances p
                    WHERE p.id = i.parent_id
                      AND p.status IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children')))
         ORDER BY i.finished_at LIMIT batch
         FOR UPDATE SKIP LOCKED),
    signals_gone AS (
        DELETE FROM gd.signals s USING victims v WHERE s.instance_id = v.id)
    DELETE FROM gd.instances i USING victims v WHERE i.id = v.id;
    GET DIAGNOSTICS swept = ROW_COUNT;
    PERFORM gd._count('gc_swept', swept);
    -- Token buckets nobody has used for longer than the retention and that
    -- have refilled (a new one would be the same), or whose limit is gone.
    DELETE FROM gd.rate_buckets b
     WHERE b.key IN (SELECT k.key FROM gd.rate_buckets k
                       LEFT JOIN gd.rate_limits l ON l.name = split_part(k.key, ':', 1)
                      WHERE k.refilled_at < clock_timestamp() - retention
                        AND (l.name IS NULL
                             OR (coalesce(k.reserved_until, k.refilled_at) < clock_timestamp()
                                 AND k.refilled_at + (l.burst - k.tokens) * l.per / l.rate < clock_timestamp()))
                      LIMIT batch FOR UPDATE OF k SKIP LOCKED);
    RETURN swept;
END $$;

-- Hot, update-heavy queue tables: vacuum them early and without throttling,
-- so dead row versions are reclaimed before they pile up.
ALTER TABLE gd.instances SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                              autovacuum_vacuum_insert_scale_factor = 0.05,
                              autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE gd.signals SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_cost_delay = 0);
