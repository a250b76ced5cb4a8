-- ---------------------------------------------------------------------------
-- What users read: the tables through views
-- ---------------------------------------------------------------------------
-- Each view belongs to the extension's owner, so it reads the closed tables,
-- and its predicate tests the reading role (current_user), so it shows each
-- role the rows of the FSMs it may use: gd._may_use's rule, written out,
-- because a view may call only what its reader may execute.  They are
-- security barriers, so a reader's own functions in a query never see rows
-- before the predicate has filtered them, and none can be written to.

-- Instances of the FSMs the reader may use.
CREATE OR REPLACE VIEW gd.instances WITH (security_barrier) AS
SELECT i.* FROM gd._instances i
 WHERE pg_has_role(i.owner, 'MEMBER')
    OR i.fsm IN (SELECT g.fsm FROM gd._grants g WHERE pg_has_role(g.role, 'MEMBER'));

-- Their inboxes.
CREATE OR REPLACE VIEW gd.signals WITH (security_barrier) AS
SELECT s.* FROM gd._signals s WHERE EXISTS (SELECT FROM gd.instances i WHERE i.id = s.instance_id);

-- Their step history (FSM versions defined with history => true).
CREATE OR REPLACE VIEW gd.step_history WITH (security_barrier) AS
SELECT h.instance_id, h.attempt, h.step, h.kind, h.started_at, h.ended_at, h.ended_at - h.started_at AS duration,
       h.error, h.worker, h.state, h.detail
  FROM gd._step_history h WHERE EXISTS (SELECT FROM gd.instances i WHERE i.id = h.instance_id);

-- The changes the engine makes to an instance's status, by whom (src/instance_status.cpp).
CREATE OR REPLACE VIEW gd.status_changes AS SELECT * FROM gd.read_status_changes();

-- Definitions of the FSMs the reader may use.
CREATE OR REPLACE VIEW gd.fsms WITH (security_barrier) AS
SELECT f.* FROM gd._fsms f
 WHERE pg_has_role(f.owner, 'MEMBER')
    OR f.name IN (SELECT g.fsm FROM gd._grants g WHERE pg_has_role(g.role, 'MEMBER'));
CREATE OR REPLACE VIEW gd.steps WITH (security_barrier) AS
SELECT s.* FROM gd._steps s WHERE EXISTS (SELECT FROM gd.fsms f WHERE f.name = s.fsm AND f.version = s.version);

-- Grants of the FSMs the reader owns, and those to roles it is a member of.
CREATE OR REPLACE VIEW gd.grants WITH (security_barrier) AS
SELECT g.* FROM gd._grants g
 WHERE pg_has_role(g.role, 'MEMBER')
    OR EXISTS (SELECT FROM gd._fsms f WHERE f.name = g.fsm AND pg_has_role(f.owner, 'MEMBER'));

-- Schedules the reader owns (as a member of their owner), and those of the FSMs it owns.
CREATE OR REPLACE VIEW gd.schedules WITH (security_barrier) AS
SELECT s.name, s.cron, s.time_zone, s.fsm, s.owner, s.enabled, s.overlap, s.catch_up, s.next_run_at,
       s.last_run_at, s.last_instance_id, s.runs, s.skipped, s.state, s.queue, s.priority, s.last_error,
       s.buffered_at, s.created_at
  FROM gd._schedules s
 WHERE pg_has_role(s.owner, 'MEMBER')
    OR EXISTS (SELECT FROM gd._fsms f WHERE f.name = s.fsm AND pg_has_role(f.owner, 'MEMBER'));

-- Configuration, the same for every reader.
CREATE OR REPLACE VIEW gd.queues AS SELECT q.* FROM gd._queues q;
CREATE OR REPLACE VIEW gd.rate_limits AS SELECT l.* FROM gd._rate_limits l;
CREATE OR REPLACE VIEW gd.concurrency_limits AS SELECT l.* FROM gd._concurrency_limits l;
CREATE OR REPLACE VIEW gd.owner_weights AS SELECT w.* FROM gd._owner_weights w;

CREATE OR REPLACE FUNCTION gd._read_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
        MESSAGE = format('gen_durable: %s.%s is read-only', TG_TABLE_SCHEMA, TG_TABLE_NAME),
        HINT = 'Use the gd_* functions; an administrator may change the tables of gd._* directly.';
END $$;
DO $$
DECLARE
    view_name text;
BEGIN
    FOREACH view_name IN ARRAY ARRAY['instances', 'signals', 'fsms', 'steps', 'grants', 'queues', 'rate_limits',
                                     'concurrency_limits', 'owner_weights', 'schedules', 'step_history'] LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON gd.%I '
                       'FOR EACH ROW EXECUTE FUNCTION gd._read_only()', view_name);
    END LOOP;
END $$;

-- The engine's workers; instance_id only where the reader may use the instance.
CREATE OR REPLACE FUNCTION gd.read_workers(OUT pid int, OUT kind text, OUT database text, OUT queue text,
                                OUT instance_id bigint, OUT since timestamptz)
    RETURNS SETOF record LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._read_workers(OUT pid int, OUT kind text, OUT database text, OUT queue text,
                                 OUT instance_id bigint, OUT since timestamptz)
RETURNS SETOF record LANGUAGE plpgsql AS $$
DECLARE
    caller oid := gd._caller();
BEGIN
    RETURN QUERY
    SELECT w.pid, w.kind, w.database, w.queue,
           CASE WHEN EXISTS (SELECT FROM gd._instances i
                              WHERE i.id = w.instance_id AND gd._may_use_instance(caller, i.owner, i.fsm))
                THEN w.instance_id END,
           w.since
      FROM gd._workers() w;
END $$;
CREATE OR REPLACE VIEW gd.workers AS SELECT * FROM gd.read_workers();

CREATE OR REPLACE VIEW gd.stats AS SELECT * FROM gd.read_stats();
CREATE OR REPLACE VIEW gd.step_stats AS SELECT * FROM gd.read_step_stats();
CREATE OR REPLACE VIEW gd.limit_stats AS SELECT * FROM gd.read_limit_stats();

-- Per queue (known or configured): the reader's instances per status, or
-- every instance's for members of pg_monitor (totals, never a row of
-- them), the runnable ones split into eligible now, scheduled later (a rate
-- limit's turn too) and held (eligible, but waiting for room under a
-- concurrency key: no executor can take them), the age of the oldest
-- eligible one not held, and pause state; then, since the last
-- reset, its executors now (how many, steps in flight, their pick size, their
-- busy share over the last seconds) and its counters (picks by executors and
-- gd_claim, rows asked and picked, claims drained, leases reclaimed, stale
-- outcomes).
CREATE OR REPLACE VIEW gd.queue_stats AS
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
       q.paused,
       coalesce(c.executors, 0) AS executors,
       coalesce(c.in_flight, 0) AS in_flight,
       coalesce(c.batch_size, 0) AS batch_size,
       coalesce(c.saturation, 0) AS saturation,
       coalesce(c.picks, 0) AS picks,
       coalesce(c.rows_asked, 0) AS rows_asked,
       coalesce(c.rows_picked, 0) AS rows_picked,
       coalesce(c.drained, 0) AS drained,
       coalesce(c.reclaimed, 0) AS reclaimed,
       coalesce(c.stale_outcomes, 0) AS stale_outcomes,
       coalesce(s.held, 0) AS held
  FROM (SELECT k.name, k.paused FROM gd._queues k
        UNION ALL
        SELECT c.name, false FROM unnest(gd.configured_queues()) c(name)
         WHERE NOT EXISTS (SELECT FROM gd._queues k WHERE k.name = c.name)) q
  LEFT JOIN (
      SELECT i.queue,
             count(*) FILTER (WHERE i.status = 'runnable' AND i.eligible_at <= now() AND NOT i.gated) AS runnable,
             count(*) FILTER (WHERE i.status = 'runnable' AND i.eligible_at <= now() AND i.gated) AS held,
             count(*) FILTER (WHERE i.status = 'runnable' AND i.eligible_at > now()) AS scheduled,
             count(*) FILTER (WHERE i.status = 'executing') AS executing,
             count(*) FILTER (WHERE i.status = 'awaiting_signal') AS awaiting_signal,
             count(*) FILTER (WHERE i.status = 'awaiting_children') AS awaiting_children,
             count(*) FILTER (WHERE i.status = 'done') AS done,
             count(*) FILTER (WHERE i.status = 'failed') AS failed,
             count(*) FILTER (WHERE i.status = 'cancelled') AS cancelled,
             now() - min(i.eligible_at) FILTER (WHERE i.status = 'runnable' AND i.eligible_at <= now()
                                                    AND NOT i.gated) AS oldest_runnable_age
        FROM gd._instances i
       WHERE (SELECT pg_has_role('pg_monitor', 'USAGE')) OR pg_has_role(i.owner, 'MEMBER')
          OR i.fsm IN (SELECT g.fsm FROM gd._grants g WHERE pg_has_role(g.role, 'MEMBER'))
       GROUP BY i.queue) s ON s.queue = q.name
  LEFT JOIN gd.read_queue_counters() c ON c.database = current_database() AND c.queue = q.name;

-- A page of the instances the reader may use, filtered and ordered inside
-- the door, where the filters and the order reach the table's indexes (a
-- query on the security-barrier view gd.instances cannot hand its ORDER BY
-- and LIMIT down: it reads every row first).  Order: 'newest' (id
-- descending), 'oldest', or 'priority' (then id); the page starts after
-- (after_priority, after_id) in that order.  NULL filters match all;
-- key_prefix matches correlation keys that start with it, parent_id the
-- children of that instance.
CREATE OR REPLACE FUNCTION gd.read_instances(queue text DEFAULT NULL, fsm text DEFAULT NULL, status text DEFAULT NULL,
                                             step text DEFAULT NULL, key_prefix text DEFAULT NULL,
                                             created_from timestamptz DEFAULT NULL,
                                             created_to timestamptz DEFAULT NULL, sort text DEFAULT 'newest',
                                             after_id bigint DEFAULT NULL, after_priority int DEFAULT NULL,
                                             page_size int DEFAULT 50, parent_id bigint DEFAULT NULL)
    RETURNS SETOF gd.instances LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._read_instances(queue text, fsm text, status text, step text, key_prefix text,
                                              created_from timestamptz, created_to timestamptz, sort text,
                                              after_id bigint, after_priority int, page_size int, parent_id bigint)
RETURNS SETOF gd.instances LANGUAGE plpgsql AS $$
DECLARE
    conditions text := '';
BEGIN
    IF sort IS NULL OR sort NOT IN ('newest', 'oldest', 'priority') THEN
        PERFORM gd._bad_argument(format('sort must be newest, oldest or priority, got %L', sort));
    END IF;
    IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 10000 THEN
        PERFORM gd._bad_argument(format('page_size must be 1 to 10000, got %s', coalesce(page_size::text, 'NULL')));
    END IF;
    conditions := concat_ws(' AND ', 'gd._may_use_instance($1, i.owner, i.fsm)',
        CASE WHEN queue IS NOT NULL THEN 'i.queue = $2' END,
        CASE WHEN fsm IS NOT NULL THEN 'i.fsm = $3' END,
        CASE WHEN status IS NOT NULL THEN 'i.status = $4' END,
        CASE WHEN step IS NOT NULL THEN 'i.step = $5' END,
        CASE WHEN key_prefix IS NOT NULL THEN 'starts_with(i.correlation_key, $6)' END,
        CASE WHEN created_from IS NOT NULL THEN 'i.created_at >= $7' END,
        CASE WHEN created_to IS NOT NULL THEN 'i.created_at < $8' END,
        CASE WHEN parent_id IS NOT NULL THEN 'i.parent_id = $12' END,
        CASE WHEN after_id IS NOT NULL THEN
            CASE sort WHEN 'newest' THEN 'i.id < $9' WHEN 'oldest' THEN 'i.id > $9'
                      ELSE '(i.priority, i.id) > ($10, $9)' END END);
    RETURN QUERY EXECUTE format('SELECT i.* FROM gd._instances i WHERE %s ORDER BY %s LIMIT $11', conditions,
                                CASE sort WHEN 'newest' THEN 'i.id DESC' WHEN 'oldest' THEN 'i.id'
                                          ELSE 'i.priority, i.id' END)
        USING gd._caller(), queue, fsm, status, step, key_prefix, created_from, created_to, after_id,
              coalesce(after_priority, 0), page_size, parent_id;
END $$;
