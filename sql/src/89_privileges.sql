-- ---------------------------------------------------------------------------
-- Privileges: closed tables and internals, open views and API
-- ---------------------------------------------------------------------------

-- The tables, sequences and internal functions are the extension owner's alone.
REVOKE ALL ON ALL TABLES IN SCHEMA gd FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA gd FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA gd FROM PUBLIC;

-- What every role may read and call: the views, the functions behind them,
-- and the API (the doors in the extension's schema).
GRANT USAGE ON SCHEMA gd TO PUBLIC;
GRANT SELECT ON gd.instances, gd.signals, gd.fsms, gd.steps, gd.grants, gd.queues, gd.rate_limits,
                gd.concurrency_limits, gd.workers, gd.stats, gd.queue_stats TO PUBLIC;
GRANT EXECUTE ON FUNCTION gd.read_workers(), gd.read_stats(), gd.configured_queues() TO PUBLIC;

-- Administration: for roles an administrator grants it to.
REVOKE ALL ON FUNCTION @extschema@.gd_set_rate_limit(text, int, interval, int, boolean),
                       @extschema@.gd_drop_rate_limit(text),
                       @extschema@.gd_set_concurrency_limit(text, int, boolean),
                       @extschema@.gd_drop_concurrency_limit(text),
                       @extschema@.gd_pause(text), @extschema@.gd_resume(text),
                       @extschema@.gd_stats_reset()
    FROM PUBLIC;
