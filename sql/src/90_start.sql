-- ---------------------------------------------------------------------------
-- Start serving this database now rather than at the executors' next check.
-- ---------------------------------------------------------------------------

DO $$
BEGIN
    IF NOT gd._engine_loaded() THEN
        RAISE WARNING 'gen_durable: the library is not in shared_preload_libraries, so no engine will run steps'
            USING HINT = 'Add gen_durable to shared_preload_libraries and restart the server.';
    END IF;
    PERFORM gd._wake_database_on_commit();
END $$;
