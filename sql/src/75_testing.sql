-- ---------------------------------------------------------------------------
-- Testing: run a tenant's steps in the test's own session
-- ---------------------------------------------------------------------------
-- gd_drain runs the runnable in-database steps of a queue that belong to the
-- caller's FSMs (those whose owner it is a member of), in the calling
-- transaction, one after another as the executors would, and the steps they
-- lead to, until none is left: a test inserts, drains, and asserts, with no
-- background timing involved when no executor serves the queue (leave it out
-- of gen_durable.queues).  When no step is left it does what the reaper
-- would have done by then for those instances (waits that time out, joins,
-- the caller's schedules' ticks), and goes on.  "Then" is the session's now:
-- gen_durable.now, which a test sets (SET LOCAL) to move its clock; claims
-- (gd_claim) go by it too.  Signals and external steps take their own calls,
-- as in production; a test run in a transaction it rolls back leaves
-- nothing behind.

CREATE OR REPLACE FUNCTION @extschema@.gd_drain(queue text, with_scheduled boolean DEFAULT false,
                                                max_steps int DEFAULT 1000)
RETURNS int LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._drain_round(queue text, max int, member oid, with_scheduled boolean) RETURNS int
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_drain_round';

CREATE OR REPLACE FUNCTION gd._drain_due(queue text, member oid) RETURNS int
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_drain_due';

CREATE OR REPLACE FUNCTION gd._drain(queue text, with_scheduled boolean, max_steps int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    caller oid := gd._caller();
    total int := 0;
    ran int;
BEGIN
    IF max_steps IS NULL OR max_steps < 1 THEN
        PERFORM gd._bad_argument(format('max_steps must be at least 1, got %s', coalesce(max_steps::text, 'NULL')));
    END IF;
    PERFORM gd._known_queue(queue);
    LOOP
        ran := gd._drain_round(queue, least(100, max_steps - total), caller, coalesce(with_scheduled, false));
        total := total + ran;
        EXIT WHEN total >= max_steps;
        CONTINUE WHEN ran > 0;
        EXIT WHEN gd._drain_due(queue, caller) = 0;   -- nothing timed out, joined or ticked: done
    END LOOP;
    RETURN total;
END $$;
