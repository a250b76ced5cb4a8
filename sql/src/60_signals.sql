-- ---------------------------------------------------------------------------
-- Signals, waits, child fan-out and operations on instances
-- ---------------------------------------------------------------------------

-- A parked instance consumes the pending signals it waits for and resumes.
-- The caller holds the instance's row lock (the step that parked it, or
-- gd_signal), so no signal can slip between the check and the park.
CREATE FUNCTION gd._wake_if_signalled(instance_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    parked gd.instances;
    consumed jsonb;
BEGIN
    SELECT * INTO parked FROM gd.instances i WHERE i.id = instance_id;
    IF parked.status IS DISTINCT FROM 'awaiting_signal' THEN
        RETURN false;
    END IF;
    WITH taken AS (
        UPDATE gd.signals s SET consumed_at = clock_timestamp()
         WHERE s.instance_id = parked.id AND s.consumed_at IS NULL AND s.name = ANY (parked.wait_names)
        RETURNING s.id, s.name, s.payload, s.dedup_key, s.delivered_at)
    SELECT jsonb_agg(jsonb_build_object('name', t.name, 'payload', t.payload, 'dedup_key', t.dedup_key,
                                        'delivered_at', t.delivered_at) ORDER BY t.id)
      INTO consumed FROM taken t;
    IF consumed IS NULL THEN
        RETURN false;
    END IF;
    PERFORM gd._resume(parked, jsonb_build_object('signals', consumed));
    RETURN true;
END $$;

CREATE FUNCTION @extschema@.gd_signal(target bigint, name text, payload jsonb DEFAULT '{}',
                                      dedup_key text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    inst gd.instances;
    stored bigint;
BEGIN
    IF target IS NULL THEN
        PERFORM gd._bad_argument('a signal needs a target instance');
    END IF;
    IF gd_signal.name IS NULL OR gd_signal.name = '' THEN
        PERFORM gd._bad_argument('a signal needs a name');
    END IF;
    PERFORM gd._check_length(gd_signal.name, 'signal name'), gd._check_length(gd_signal.dedup_key, 'dedup_key');
    IF gd_signal.payload IS NULL THEN
        PERFORM gd._bad_argument(format('payload of signal %L must not be NULL', gd_signal.name));
    END IF;
    -- Waits for a step in progress on the instance: it may be about to park.
    SELECT * INTO inst FROM gd.instances i WHERE i.id = target FOR UPDATE;
    IF NOT FOUND OR NOT inst.status = ANY (gd._live_statuses()) THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = format('gen_durable: signal %L: instance %s is not a live instance', gd_signal.name, target),
            DETAIL = CASE WHEN FOUND THEN format('It is %s.', inst.status) ELSE 'It does not exist.' END;
    END IF;
    INSERT INTO gd.signals AS s (instance_id, name, payload, dedup_key)
    VALUES (inst.id, gd_signal.name, gd_signal.payload, gd_signal.dedup_key)
    ON CONFLICT (instance_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING s.id INTO stored;
    IF stored IS NULL THEN
        RETURN false;      -- this dedup_key was already delivered to this instance
    END IF;
    IF inst.status = 'awaiting_signal' AND gd_signal.name = ANY (inst.wait_names) THEN
        PERFORM gd._wake_if_signalled(inst.id);
    END IF;
    RETURN true;
END $$;

-- Signal by correlation key: the instance holding the key in its scope.
CREATE FUNCTION @extschema@.gd_signal(target text, name text, payload jsonb DEFAULT '{}',
                                      dedup_key text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    holder bigint;
BEGIN
    SELECT i.id INTO holder FROM gd.instances i WHERE i.correlation_key = target AND i.status = ANY (i.correlation_scope);
    IF holder IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = format('gen_durable: signal %L: no live instance holds correlation key %L', name, target);
    END IF;
    RETURN @extschema@.gd_signal(holder, name, payload, dedup_key);
END $$;

-- A spawn: insert the children (each an insert option object with an fsm)
-- under the parent about to park; returns how many.
CREATE FUNCTION gd._spawn_children(parent_id bigint, children jsonb) RETURNS int
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
        SELECT count(*) INTO spawned FROM gd._insert_plain(plain_fsm, children, parent_id);
        RETURN spawned;
    END IF;
    FOR child IN SELECT c FROM jsonb_array_elements(children) c LOOP
        IF jsonb_typeof(child) = 'object' AND NOT child ? 'fsm' THEN
            PERFORM gd._bad_argument(format('each child needs an fsm, got %s', child));
        END IF;
        PERFORM gd._insert_entry(NULL, child, 'error', parent_id);
        spawned := spawned + 1;
    END LOOP;
    RETURN spawned;
END $$;

-- Cancel a live instance and its live descendants.
CREATE FUNCTION @extschema@.gd_cancel(id bigint, reason text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    target gd.instances;
    ended bigint;
    freed_key text;
    freed_keys text[] := '{}';
BEGIN
    SELECT * INTO target FROM gd.instances i WHERE i.id = gd_cancel.id FOR UPDATE;
    IF NOT FOUND OR NOT target.status = ANY (gd._live_statuses()) THEN
        RETURN false;
    END IF;
    FOR ended, freed_key IN
        WITH RECURSIVE tree AS (
            SELECT target.id AS id
            UNION ALL
            SELECT c.id FROM gd.instances c JOIN tree t ON c.parent_id = t.id
             WHERE c.status = ANY (gd._live_statuses()))
        UPDATE gd.instances i
           SET status = 'cancelled', error = jsonb_build_object('cancelled', coalesce(reason, '')), gated = false,
               wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,
               lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
               finished_at = clock_timestamp(), updated_at = clock_timestamp()
          FROM tree
         WHERE i.id = tree.id AND i.status = ANY (gd._live_statuses())
        RETURNING i.id, i.concurrency_key
    LOOP
        PERFORM gd._wake_awaiters_on_commit(ended);
        IF freed_key IS NOT NULL THEN
            freed_keys := freed_keys || freed_key;
        END IF;
    END LOOP;
    PERFORM gd._ungate(k) FROM (SELECT DISTINCT unnest(freed_keys) AS k ORDER BY 1) keys;
    IF target.parent_id IS NOT NULL THEN
        PERFORM gd._wake_reaper_on_commit();   -- a cancelled child counts as ended
    END IF;
    RETURN true;
END $$;

-- A failed instance runs again at the step that failed, attempts reset.
CREATE FUNCTION @extschema@.gd_retry(id bigint) RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    revived gd.instances;
BEGIN
    UPDATE gd.instances i
       SET status = 'runnable', attempt = 1, error = NULL, result = NULL, finished_at = NULL,
           gated = gd._must_gate(i.concurrency_key),
           eligible_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE i.id = gd_retry.id AND i.status = 'failed'
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

CREATE FUNCTION gd._set_paused(queue_name text, pause boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd._known_queue(queue_name);
    UPDATE gd.queues q SET paused = pause WHERE q.name = queue_name AND q.paused <> pause;
    IF FOUND AND NOT pause THEN
        PERFORM gd._wake_on_commit(queue_name);
    END IF;
    RETURN FOUND;
END $$;

-- Stop (or restart) picking steps of a queue; steps in flight finish. True if it changed.
CREATE FUNCTION @extschema@.gd_pause(queue text) RETURNS boolean
LANGUAGE sql AS $$ SELECT gd._set_paused(queue, true) $$;
CREATE FUNCTION @extschema@.gd_resume(queue text) RETURNS boolean
LANGUAGE sql AS $$ SELECT gd._set_paused(queue, false) $$;
