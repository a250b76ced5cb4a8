-- ---------------------------------------------------------------------------
-- Counters: the engine's event counters behind gd.stats
-- ---------------------------------------------------------------------------

-- The engine's counters since the last reset or server start, cluster-wide
-- (the gd.stats view); step events also carry the time spent in the step.
CREATE OR REPLACE FUNCTION gd.read_stats(OUT event text, OUT count bigint, OUT total_ms float8, OUT max_ms float8,
                              OUT since timestamptz)
    RETURNS SETOF record LANGUAGE c AS 'MODULE_PATHNAME', 'gd_stats';
CREATE OR REPLACE FUNCTION gd._count(event text, amount bigint DEFAULT 1) RETURNS void
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_count_event';

CREATE OR REPLACE FUNCTION @extschema@.gd_stats_reset() RETURNS void
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_stats_reset';

-- ---------------------------------------------------------------------------
-- Labelled counters (src/labelled_stats.cpp): per FSM step, queue and limit
-- ---------------------------------------------------------------------------

-- Every row of the shared tables, for every database (the engine's owner only).
CREATE OR REPLACE FUNCTION gd._step_stats_rows(OUT database text, OUT fsm text, OUT step text, OUT kind text,
                                               OUT count bigint, OUT total_ms float8, OUT max_ms float8,
                                               OUT p50_ms float8, OUT p95_ms float8, OUT p99_ms float8,
                                               OUT latency_le float8[], OUT latency_bucket bigint[],
                                               OUT since timestamptz, OUT latency_histogram bigint[],
                                               OUT version int)
    RETURNS SETOF record LANGUAGE c AS 'MODULE_PATHNAME', 'gd_read_step_stats';
CREATE OR REPLACE FUNCTION gd._limit_stats_rows(OUT database text, OUT kind text, OUT name text, OUT partition text,
                                                OUT fsm text, OUT step text, OUT wanted bigint, OUT granted bigint,
                                                OUT throttled bigint, OUT contended bigint)
    RETURNS SETOF record LANGUAGE c AS 'MODULE_PATHNAME', 'gd_read_limit_stats';
-- Per queue: the executors' figures now and the queue's counters (queue names are no secret: gd.queues).
CREATE OR REPLACE FUNCTION gd.read_queue_counters(OUT database text, OUT queue text, OUT executors int,
                                                  OUT in_flight bigint, OUT batch_size int, OUT saturation float8,
                                                  OUT picks bigint, OUT rows_asked bigint, OUT rows_picked bigint,
                                                  OUT drained bigint, OUT reclaimed bigint, OUT stale_outcomes bigint)
    RETURNS SETOF record LANGUAGE c AS 'MODULE_PATHNAME', 'gd_read_queue_counters';
CREATE OR REPLACE FUNCTION gd._count_limit(kind text, key text, wanted int, granted int, throttled int, contended int)
    RETURNS void LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_count_limit_event';

-- Who may read a labelled row: members of pg_monitor every row; others the
-- rows of this database's FSMs they may use, and the unlabelled "(other)" row.
CREATE OR REPLACE FUNCTION gd._may_read_label(caller oid, database text, fsm text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_has_role(caller, 'pg_monitor', 'USAGE') OR database IS NULL
        OR (database = current_database() AND (fsm IS NULL OR gd._may_use(caller, fsm)))
$$;

-- gd.step_stats: per (database, FSM, step, outcome kind, FSM version).
CREATE OR REPLACE FUNCTION gd.read_step_stats(OUT database text, OUT fsm text, OUT step text, OUT kind text,
                                              OUT count bigint, OUT total_ms float8, OUT max_ms float8,
                                              OUT p50_ms float8, OUT p95_ms float8, OUT p99_ms float8,
                                              OUT latency_le float8[], OUT latency_bucket bigint[],
                                              OUT since timestamptz, OUT latency_histogram bigint[],
                                              OUT version int)
    RETURNS SETOF record LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._read_step_stats(OUT database text, OUT fsm text, OUT step text, OUT kind text,
                                               OUT count bigint, OUT total_ms float8, OUT max_ms float8,
                                               OUT p50_ms float8, OUT p95_ms float8, OUT p99_ms float8,
                                               OUT latency_le float8[], OUT latency_bucket bigint[],
                                               OUT since timestamptz, OUT latency_histogram bigint[],
                                               OUT version int)
RETURNS SETOF record LANGUAGE sql AS $$
    SELECT s.* FROM gd._step_stats_rows() s WHERE gd._may_read_label(gd._caller(), s.database, s.fsm)
$$;

-- gd.limit_stats: per (database, limit kind, name), each name's most throttled partitions after it.
CREATE OR REPLACE FUNCTION gd.read_limit_stats(OUT database text, OUT kind text, OUT name text, OUT partition text,
                                               OUT fsm text, OUT step text, OUT wanted bigint, OUT granted bigint,
                                               OUT throttled bigint, OUT contended bigint)
    RETURNS SETOF record LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
-- Partitions (parts of tenants' keys) only to members of pg_monitor.
CREATE OR REPLACE FUNCTION gd._read_limit_stats(OUT database text, OUT kind text, OUT name text, OUT partition text,
                                                OUT fsm text, OUT step text, OUT wanted bigint, OUT granted bigint,
                                                OUT throttled bigint, OUT contended bigint)
RETURNS SETOF record LANGUAGE sql AS $$
    SELECT l.* FROM gd._limit_stats_rows() l
     WHERE gd._may_read_label(gd._caller(), l.database, l.fsm)
       AND (l.partition IS NULL OR pg_has_role(gd._caller(), 'pg_monitor', 'USAGE'))
$$;
