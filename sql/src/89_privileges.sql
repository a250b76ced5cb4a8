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
                gd.concurrency_limits, gd.owner_weights, gd.schedules, gd.step_history, gd.workers, gd.stats, gd.queue_stats,
                gd.step_stats, gd.limit_stats, gd.status_changes TO PUBLIC;
GRANT EXECUTE ON FUNCTION gd.read_workers(), gd.read_stats(), gd.read_status_changes(), gd.configured_queues(), gd.read_step_stats(),
                          gd.read_limit_stats(), gd.read_queue_counters(),
                          gd.read_instances(text, text, text, text, text, timestamptz, timestamptz, text, bigint, int,
                                            int, bigint) TO PUBLIC;

-- Administration: for roles an administrator grants it to.
REVOKE ALL ON FUNCTION @extschema@.gd_set_rate_limit(text, int, interval, int, boolean),
                       @extschema@.gd_drop_rate_limit(text),
                       @extschema@.gd_set_concurrency_limit(text, int, boolean, text),
                       @extschema@.gd_drop_concurrency_limit(text),
                       @extschema@.gd_set_owner_weight(regrole, int),
                       @extschema@.gd_pause(text), @extschema@.gd_resume(text),
                       @extschema@.gd_stats_reset()
    FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- Backups: pg_dump dumps the rows of the tables that hold users' data, and the
-- positions of the sequences (ids and lease tokens go on above the restored
-- ones).  Not gd._external_due_announced: derived, and made by the script.
-- ---------------------------------------------------------------------------
DO $$
DECLARE
    relation text;
BEGIN
    -- one call per statement: each updates the extension's catalog row
    FOREACH relation IN ARRAY ARRAY['gd._queues', 'gd._fsms', 'gd._steps', 'gd._grants', 'gd._instances', 'gd._signals',
                                    'gd._concurrency_limits', 'gd._owner_weights', 'gd._rate_limits', 'gd._rate_buckets', 'gd._schedules',
                                    'gd._step_history', 'gd._throttles',
                                    'gd._instances_id_seq', 'gd._signals_id_seq', 'gd._lease_tokens'] LOOP
        PERFORM pg_extension_config_dump(relation::regclass, '');
    END LOOP;
END $$;
