-- ---------------------------------------------------------------------------
-- Signals, waits, child fan-out and operations on instances
-- ---------------------------------------------------------------------------

-- A parked instance consumes the pending signals it waits for and resumes.
-- The caller holds the instance's row lock (the step that parked it, or
-- gd_signal), so no signal can slip between the check and the park.
CREATE OR REPLACE FUNCTION gd._wake_if_signalled(instance_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    parked gd._instances;
    consumed jsonb;
BEGIN
    SELECT * INTO parked FROM gd._instances i WHERE i.id = instance_id;
    IF parked.status IS DISTINCT FROM 'awaiting_signal' THEN
        RETURN false;
    END IF;
    WITH taken AS (
        UPDATE gd._signals s SET consumed_at = clock_timestamp()
         WHERE s.instance_id = parked.id AND s.consumed_at IS NULL AND s.name = ANY (parked.wait_names)
        RETURNING s.id, s.name, s.payload, s.dedup_key, s.delivered_at)
    SELECT jsonb_agg(jsonb_build_object('name', t.name, 'payload', t.payload, 'dedup_key', t.dedup_key,
                                        'delivered_at', t.delivered_at) ORDER BY t.id)
      INTO consumed FROM taken t;
    IF consumed IS NULL THEN
        RETURN false;
    END IF;
    PERFORM gd._resume_parked(parked, jsonb_build_object('signals', consumed));
    RETURN true;
END $$;

-- missing_ok: a target that is not (or no longer) a live instance returns
-- NULL instead of raising P0002 (a webhook delivered again after the end).
CREATE OR REPLACE FUNCTION @extschema@.gd_signal(target bigint, name text, payload jsonb DEFAULT '{}',
                                      dedup_key text DEFAULT NULL, missing_ok boolean DEFAULT false)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION @extschema@.gd_signal(target text, name text, payload jsonb DEFAULT '{}',
                                      dedup_key text DEFAULT NULL, missing_ok boolean DEFAULT false)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

-- Store a signal in the inbox of a live instance the caller may use.  An
-- instance it may not use is "not live" at once: the row is looked at
-- before it is locked, so another tenant's running step never holds the
-- caller back (which would tell it the instance exists).
CREATE OR REPLACE FUNCTION gd._deliver_signal(caller oid, target bigint, signal_name text, signal_payload jsonb,
                                   signal_dedup_key text, missing_ok boolean)
RETURNS boolean LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    inst gd._instances;
    stored bigint;
BEGIN
    IF target IS NULL THEN
        PERFORM gd._bad_argument('a signal needs a target instance');
    END IF;
    IF signal_name IS NULL OR signal_name = '' THEN
        PERFORM gd._bad_argument('a signal needs a name');
    END IF;
    PERFORM gd._check_length(signal_name, 'signal name'), gd._check_length(signal_dedup_key, 'dedup_key');
    IF signal_payload IS NULL THEN
        PERFORM gd._bad_argument(format('payload of signal %L must not be NULL', signal_name));
    END IF;
    SELECT * INTO inst FROM gd._instances i WHERE i.id = target;
    IF FOUND AND gd._may_use_instance(caller, inst.owner, inst.fsm) THEN
        -- Waits for a step in progress on the instance: it may be about to park.
        SELECT * INTO inst FROM gd._instances i WHERE i.id = target FOR UPDATE;
    ELSE
        inst := NULL;
    END IF;
    IF (inst.id IS NULL OR NOT inst.status = ANY (gd._live_statuses())) AND missing_ok THEN
        RETURN NULL;
    END IF;
    IF inst.id IS NULL OR NOT inst.status = ANY (gd._live_statuses()) THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = format('gen_durable: signal %L: instance %s is not a live instance', signal_name, target),
            DETAIL = CASE WHEN inst.id IS NOT NULL THEN format('It is %s.', inst.status) ELSE 'It does not exist.' END;
    END IF;
    INSERT INTO gd._signals AS s (instance_id, name, payload, dedup_key)
    VALUES (inst.id, signal_name, signal_payload, signal_dedup_key)
    ON CONFLICT (instance_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING s.id INTO stored;
    IF stored IS NULL THEN
        RETURN false;      -- this dedup_key was already delivered to this instance
    END IF;
    IF inst.status = 'awaiting_signal' AND signal_name = ANY (inst.wait_names) THEN
        PERFORM gd._wake_if_signalled(inst.id);
    END IF;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION gd._signal(target bigint, name text, payload jsonb, dedup_key text, missing_ok boolean)
RETURNS boolean
LANGUAGE sql AS $$ SELECT gd._deliver_signal(gd._caller(), target, name, payload, dedup_key, missing_ok) $$;

-- Signal by correlation key: the instance holding the key in its scope, in
-- the key spaces of the owners whose instances the caller may use.
CREATE OR REPLACE FUNCTION gd._signal(target text, name text, payload jsonb, dedup_key text, missing_ok boolean)
RETURNS boolean LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    caller oid := gd._caller();
    holders bigint[];
BEGIN
    SELECT array_agg(i.id ORDER BY i.id) INTO holders FROM gd._instances i
     WHERE i.correlation_key = target AND i.status = ANY (i.correlation_scope)
       AND gd._may_use_instance(caller, i.owner, i.fsm);
    IF holders IS NULL AND missing_ok THEN
        RETURN NULL;
    END IF;
    IF holders IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = format('gen_durable: signal %L: no live instance holds correlation key %L', name, target);
    END IF;
    IF cardinality(holders) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'cardinality_violation',
            MESSAGE = format('gen_durable: signal %L: correlation key %L is held by instances of %s owners',
                             name, target, cardinality(holders)),
            DETAIL = format('Instances %s hold it.', array_to_string(holders, ', ')),
            HINT = 'Signal the instance by its id.';
    END IF;
    RETURN gd._deliver_signal(caller, holders[1], name, payload, dedup_key, missing_ok);
END $$;

-- A spawn: insert the children (each an insert option object with an fsm)
-- under the parent about to park, with the rights of `caller`, who produced
-- the outcome (the FSM's owner for an in-database step, the completing
-- worker's role for an external one); returns how many.
CREATE OR REPLACE FUNCTION gd._spawn_children(caller oid, parent_id bigint, children jsonb) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    child jsonb;
    spawned int := 0;
    plain_fsm text;
BEGIN
    IF children IS NULL OR jsonb_typeof(children) <> 'array' THEN
        PERFORM gd._bad_argument(format('gd_spawn needs a JSON array of insert options, got %s',
                                        coalesce(children::text, 'NULL')));
    END IF;
    plain_fsm := gd._plain_entries_fsm(children, NULL);
    IF plain_fsm IS NOT NULL THEN
        SELECT count(*) INTO spawned FROM gd._insert_plain(caller, plain_fsm, children, parent_id);
        RETURN spawned;
    END IF;
    FOR child IN SELECT c FROM jsonb_array_elements(children) c LOOP
        IF jsonb_typeof(child) = 'object' AND NOT child ? 'fsm' THEN
            PERFORM gd._bad_argument(format('each child needs an fsm, got %s', child));
        END IF;
        PERFORM gd._insert_entry(caller, NULL, child, 'error', parent_id);
        spawned := spawned + 1;
    END LOOP;
    RETURN spawned;
END $$;

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
