-- ---------------------------------------------------------------------------
-- Garbage collection: finished instances, idle buckets and throttles; early vacuum of the hot tables
-- ---------------------------------------------------------------------------

-- GC: terminal instances that finished longer than `retention` ago, and not
-- before `after`, with their signals, in one small batch; returns how many
-- instances went and the latest finished_at among them.  Their signals and
-- step history go with them.  A child is kept
-- while its parent is live (the parent's join reads it).  The collector
-- passes the previous batch's latest as `after` (src/gc.cpp): the index
-- entries before it are of rows it deleted, which a held MVCC horizon keeps
-- in the index, and each batch would walk them all again.
CREATE INDEX IF NOT EXISTS instances_finished ON gd._instances (finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');

CREATE OR REPLACE FUNCTION gd._gc(retention interval, batch int DEFAULT 1000, after timestamptz DEFAULT '-infinity',
                                  OUT swept int, OUT last_finished timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    WITH victims AS (
        SELECT i.id, i.finished_at FROM gd._instances i
         WHERE i.status IN ('done', 'failed', 'cancelled') AND i.finished_at < clock_timestamp() - retention
           AND i.finished_at >= after
           AND (i.parent_id IS NULL OR NOT EXISTS (
                   SELECT FROM gd._instances p
                    WHERE p.id = i.parent_id
                      AND p.status IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children')))
         ORDER BY i.finished_at LIMIT batch
         FOR UPDATE SKIP LOCKED),
    signals_gone AS (
        DELETE FROM gd._signals s USING victims v WHERE s.instance_id = v.id),
    history_gone AS (
        DELETE FROM gd._step_history h USING victims v WHERE h.instance_id = v.id),
    gone AS (
        DELETE FROM gd._instances i USING victims v WHERE i.id = v.id RETURNING v.finished_at)
    SELECT count(*), max(gone.finished_at) INTO swept, last_finished FROM gone;
    PERFORM gd._count('gc_swept', swept);
    -- Token buckets nobody has used for longer than the retention and that
    -- have refilled (a new one would be the same), or whose limit is gone.
    DELETE FROM gd._rate_buckets b
     WHERE (b.scope, b.key) IN (
               SELECT k.scope, k.key FROM gd._rate_buckets k
                 LEFT JOIN gd._rate_limits l ON l.name = split_part(k.key, ':', 1)
                WHERE k.refilled_at < clock_timestamp() - retention
                  AND (l.name IS NULL
                       OR (coalesce(k.reserved_until, k.refilled_at) < clock_timestamp()
                           AND k.refilled_at + (l.burst - k.tokens) * l.per / l.rate < clock_timestamp()))
                LIMIT batch FOR UPDATE OF k SKIP LOCKED);
    -- Throttled keys whose next start has passed: they hold nothing back.
    DELETE FROM gd._throttles t
     WHERE (t.owner, t.key) IN (SELECT k.owner, k.key FROM gd._throttles k WHERE k.next_start < clock_timestamp()
                                 LIMIT batch FOR UPDATE SKIP LOCKED);
END $$;

-- Hot, update-heavy queue tables: vacuum them early and without throttling,
-- so dead row versions are reclaimed before they pile up.
ALTER TABLE gd._instances SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                              autovacuum_vacuum_insert_scale_factor = 0.05,
                              autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE gd._signals SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_cost_delay = 0);
