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
