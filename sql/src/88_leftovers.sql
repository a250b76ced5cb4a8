-- ---------------------------------------------------------------------------
-- After an update: the functions of the earlier version this one does not
-- define (every function this script defines was written by its transaction).
-- Nothing to do in a fresh install.
-- ---------------------------------------------------------------------------

DO $$
DECLARE
    leftover regprocedure;
BEGIN
    FOR leftover IN
        SELECT p.oid FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
         WHERE d.classid = 'pg_proc'::regclass AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
           AND d.refobjid = (SELECT e.oid FROM pg_extension e WHERE e.extname = 'gen_durable')
           AND p.xmin <> pg_current_xact_id()::xid
    LOOP
        EXECUTE format('DROP FUNCTION %s', leftover);
    END LOOP;
END $$;
