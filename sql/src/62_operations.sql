-- ---------------------------------------------------------------------------
-- Operations on instances and queues: cancel, retry, pause and resume
-- ---------------------------------------------------------------------------

-- Cancel a live instance the caller may use, and its live descendants: each
-- goes to its FSM version's on_cancel step when it names one (and the
-- instance is not compensating already), else ends cancelled.  False, and
-- nothing done, for an instance compensating already.
CREATE OR REPLACE FUNCTION @extschema@.gd_cancel(id bigint, reason text DEFAULT NULL) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._cancel(id bigint, reason text) RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    caller oid := gd._caller();
    target gd._instances;
    locked boolean := false;
BEGIN
    -- Looked at before it is locked: see gd._deliver_signal.
    SELECT * INTO target FROM gd._instances i WHERE i.id = _cancel.id;
    -- Compensating already: its compensation step runs on (the mark is never taken back).
    IF NOT FOUND OR NOT gd._may_use_instance(caller, target.owner, target.fsm) OR target.cancelled IS NOT NULL THEN
        RETURN false;
    END IF;
    -- A step of it an executor runs now is stopped: cancelled, and, if it
    -- ignores that for 2 s, its executor ended (its round rolls back).
    IF gd._interrupt_step(target.id, false) THEN
        FOR tries IN 1..40 LOOP
            BEGIN
                SELECT * INTO target FROM gd._instances i WHERE i.id = _cancel.id FOR UPDATE NOWAIT;
                locked := true;
                EXIT;
            EXCEPTION WHEN lock_not_available THEN
                PERFORM pg_sleep(0.05);
            END;
        END LOOP;
        IF NOT locked THEN
            PERFORM gd._interrupt_step(target.id, true);
        END IF;
    END IF;
    IF NOT locked THEN
        SELECT * INTO target FROM gd._instances i WHERE i.id = _cancel.id FOR UPDATE;
    END IF;
    IF NOT target.status = ANY (gd._live_statuses()) OR target.cancelled IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM gd._cancel_tree(target.id, reason);
    RETURN true;
END $$;

-- A failed instance the caller may use runs again at the step that failed, attempts reset.
CREATE OR REPLACE FUNCTION @extschema@.gd_retry(id bigint) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._retry(id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RETURN gd._revive(gd._caller(), id);
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION USING ERRCODE = 'unique_violation',
        MESSAGE = format('gen_durable: instance %s cannot run again: its correlation key is taken', id);
END $$;

-- The transitions themselves (src/transition.cpp).
CREATE OR REPLACE FUNCTION gd._revive(caller oid, id bigint) RETURNS boolean
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_revive';
CREATE OR REPLACE FUNCTION gd._cancel_tree(id bigint, reason text) RETURNS void
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_cancel_tree';
-- The error of a cancelled instance: why, and the step and attempt it was at
-- (a compensating instance's mark adds its status then, and when).
CREATE OR REPLACE FUNCTION gd._cancelled_error(reason text, step text, attempt int) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('kind', 'cancelled', 'message', 'gen_durable: cancelled' || coalesce(': ' || reason, ''),
                              'reason', coalesce(reason, ''), 'step', step, 'attempt', attempt)
$$;

-- Stop (or restart) picking steps of a queue; steps in flight finish. True if it changed.
CREATE OR REPLACE FUNCTION @extschema@.gd_pause(queue text) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION @extschema@.gd_resume(queue text) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._set_paused(queue_name text, pause boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd._known_queue(queue_name);
    UPDATE gd._queues q SET paused = pause WHERE q.name = queue_name AND q.paused <> pause;
    IF FOUND AND NOT pause THEN
        PERFORM gd._wake_on_commit(queue_name);
    END IF;
    RETURN FOUND;
END $$;
CREATE OR REPLACE FUNCTION gd._pause(queue text) RETURNS boolean
LANGUAGE sql AS $$ SELECT gd._set_paused(queue, true) $$;
CREATE OR REPLACE FUNCTION gd._resume(queue text) RETURNS boolean
LANGUAGE sql AS $$ SELECT gd._set_paused(queue, false) $$;

-- ---------------------------------------------------------------------------
-- Step history: what an instance of an FSM version defined with history => true did
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION @extschema@.gd_history(id bigint)
RETURNS TABLE(attempt int, step text, kind text, started_at timestamptz, ended_at timestamptz, duration interval,
              error jsonb, worker text, entry int, state jsonb, detail jsonb)
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._history(id bigint)
RETURNS TABLE(attempt int, step text, kind text, started_at timestamptz, ended_at timestamptz, duration interval,
              error jsonb, worker text, entry int, state jsonb, detail jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    target gd._instances;
BEGIN
    SELECT * INTO target FROM gd._instances i WHERE i.id = _history.id;
    IF NOT FOUND OR NOT gd._may_use_instance(gd._caller(), target.owner, target.fsm) THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = format('gen_durable: instance %s not found', coalesce(_history.id::text, 'NULL')),
            HINT = 'Finished instances are swept after gen_durable.retention, with their history.';
    END IF;
    RETURN QUERY
    SELECT h.attempt, h.step, h.kind, h.started_at, h.ended_at, h.ended_at - h.started_at, h.error, h.worker,
           (row_number() OVER (ORDER BY h.ended_at))::int, h.state, h.detail
      FROM gd._step_history h WHERE h.instance_id = target.id ORDER BY h.ended_at;
END $$;
