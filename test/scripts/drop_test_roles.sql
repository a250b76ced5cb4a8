-- `make installcheck` runs this in the database postgres after dropping the
-- test databases: the roles test/sql creates (regress_gd_*, regress_drain_*)
-- are the cluster's, and a run that failed half-way leaves some behind.  A
-- role that still owns something in another database is kept (and named).
SET client_min_messages = warning;
DO $$
DECLARE
    role name;
BEGIN
    FOR role IN SELECT rolname FROM pg_roles
                 WHERE rolname LIKE 'regress\_gd\_%' OR rolname LIKE 'regress\_drain\_%' LOOP
        BEGIN
            EXECUTE format('DROP OWNED BY %I', role);
            EXECUTE format('DROP ROLE %I', role);
        EXCEPTION WHEN dependent_objects_still_exist THEN
            RAISE WARNING 'test role % kept: %', role, SQLERRM;
        END;
    END LOOP;
END $$;
