-- ---------------------------------------------------------------------------
-- Operations on instances and queues: cancel, retry, pause and resume
-- ---------------------------------------------------------------------------

-- Cancel a live instance the caller may use, and its live descendants.
CREATE OR REPLACE FUNCTION @extschema@.gd_cancel(id bigint, reason text DEFAULT NULL) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._cancel(id bigint, reason text) RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    caller oid := gd._caller();
    target gd._instances;
    ended bigint;
    freed_owner oid;
    freed_key text;
    freed_owners oid[] := '{}';
    freed_keys text[] := '{}';
    locked boolean := false;
BEGIN
    -- Looked at before it is locked: see gd._deliver_signal.
    SELECT * INTO target FROM gd._instances i WHERE i.id = _cancel.id;
    IF NOT FOUND OR NOT gd._may_use_instance(caller, target.owner, target.fsm) THEN
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
    IF NOT target.status = ANY (gd._live_statuses()) THEN
        RETURN false;
    END IF;
    FOR ended, freed_owner, freed_key IN
        WITH RECURSIVE tree AS (
            SELECT target.id AS id
            UNION ALL
            SELECT c.id FROM gd._instances c JOIN tree t ON c.parent_id = t.id
             WHERE c.status = ANY (gd._live_statuses()))
        UPDATE gd._instances i
           SET status = 'cancelled', gated = false,
               error = jsonb_build_object('kind', 'cancelled', 'message', 'gen_durable: cancelled' || coalesce(': ' || reason, ''),
                                          'reason', coalesce(reason, ''), 'step', i.step, 'attempt', i.attempt),
               wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,
               lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
               finished_at = clock_timestamp(), updated_at = clock_timestamp()
          FROM tree
         WHERE i.id = tree.id AND i.status = ANY (gd._live_statuses())
        RETURNING i.id, i.owner, i.concurrency_key
    LOOP
        PERFORM gd._wake_awaiters_on_commit(ended);
        IF freed_key IS NOT NULL THEN
            freed_owners := freed_owners || freed_owner;
            freed_keys := freed_keys || freed_key;
        END IF;
    END LOOP;
    PERFORM gd._ungate(k.owner, k.key)
       FROM (SELECT DISTINCT f.owner, f.key FROM unnest(freed_owners, freed_keys) AS f(owner, key)
              ORDER BY f.key, f.owner) k;
    IF target.parent_id IS NOT NULL THEN
        PERFORM gd._wake_reaper_on_commit();   -- a cancelled child counts as ended
    END IF;
    RETURN true;
END $$;

-- A failed instance the caller may use runs again at the step that failed, attempts reset.
CREATE OR REPLACE FUNCTION @extschema@.gd_retry(id bigint) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._retry(id bigint) RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    caller oid := gd._caller();
    revived gd._instances;
BEGIN
    UPDATE gd._instances i
       SET status = 'runnable', attempt = 1, error = NULL, result = NULL, finished_at = NULL,
           gated = gd._must_gate(i.owner, i.concurrency_key),
           eligible_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE i.id = _retry.id AND i.status = 'failed' AND gd._may_use_instance(caller, i.owner, i.fsm)
    RETURNING * INTO revived;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM gd._wake_on_commit(revived.queue);
    PERFORM gd._wake_awaiters_on_commit(revived.id);
    RETURN true;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION USING ERRCODE = 'unique_violation',
        MESSAGE = format('gen_durable: instance %s cannot run again: its correlation key is taken', id);
END $$;

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
