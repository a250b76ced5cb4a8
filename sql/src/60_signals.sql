-- ---------------------------------------------------------------------------
-- Signals: delivery into an instance's inbox, and the wait that consumes them
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
           AND (s.expires_at IS NULL OR s.expires_at > clock_timestamp())
        RETURNING s.id, s.name, s.payload, s.dedup_key, s.delivered_at)
    SELECT jsonb_agg(jsonb_build_object('name', t.name, 'payload', t.payload, 'dedup_key', t.dedup_key,
                                        'delivered_at', t.delivered_at) ORDER BY t.id)
      INTO consumed FROM taken t;
    IF consumed IS NULL THEN
        RETURN false;
    END IF;
    PERFORM gd._resume_parked(parked.id, jsonb_build_object('signals', consumed));
    RETURN true;
END $$;

-- missing_ok: a target that is not (or no longer) a live instance returns
-- NULL instead of raising P0002 (a webhook delivered again after the end).
-- expires: a signal not consumed within that long is not consumed at all (a
-- stale webhook is not taken by a later wait).
CREATE OR REPLACE FUNCTION @extschema@.gd_signal(target bigint, name text, payload jsonb DEFAULT '{}',
                                      dedup_key text DEFAULT NULL, missing_ok boolean DEFAULT false,
                                      expires interval DEFAULT NULL)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION @extschema@.gd_signal(target text, name text, payload jsonb DEFAULT '{}',
                                      dedup_key text DEFAULT NULL, missing_ok boolean DEFAULT false,
                                      expires interval DEFAULT NULL)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

-- Store a signal in the inbox of a live instance the caller may use.  An
-- instance it may not use is "not live" at once: the row is looked at
-- before it is locked, so another tenant's running step never holds the
-- caller back (which would tell it the instance exists).
CREATE OR REPLACE FUNCTION gd._deliver_signal(caller oid, target bigint, signal_name text, signal_payload jsonb,
                                   signal_dedup_key text, missing_ok boolean, signal_expires interval)
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
    IF signal_expires <= interval '0' THEN
        PERFORM gd._bad_argument(format('expires of signal %L must be a positive interval, got %s', signal_name,
                                        signal_expires));
    END IF;
    PERFORM gd._check_interval(signal_expires, 'expires');
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
    INSERT INTO gd._signals AS s (instance_id, name, payload, dedup_key, expires_at)
    VALUES (inst.id, signal_name, signal_payload, signal_dedup_key, clock_timestamp() + signal_expires)
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

CREATE OR REPLACE FUNCTION gd._signal(target bigint, name text, payload jsonb, dedup_key text, missing_ok boolean,
                                      expires interval)
RETURNS boolean
LANGUAGE sql AS $$ SELECT gd._deliver_signal(gd._caller(), target, name, payload, dedup_key, missing_ok, expires) $$;

-- Signal by correlation key: the instance holding the key in its scope, in
-- the caller's own key spaces (gd._own_roles) or, when none holds it there,
-- in those of the FSMs granted to it that it accepted: a grant it did not
-- accept never redirects its signals to another role's instance.
CREATE OR REPLACE FUNCTION gd._signal(target text, name text, payload jsonb, dedup_key text, missing_ok boolean,
                                      expires interval)
RETURNS boolean LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    caller oid := gd._caller();
    own oid[] := gd._own_roles(caller);
    holders bigint[];
BEGIN
    SELECT array_agg(i.id ORDER BY i.id) INTO holders FROM gd._instances i
     WHERE i.correlation_key = target AND i.status = ANY (i.correlation_scope)
       AND (own IS NULL OR i.owner = ANY (own));
    IF holders IS NULL AND own IS NOT NULL THEN
        SELECT array_agg(i.id ORDER BY i.id) INTO holders FROM gd._instances i
         WHERE i.correlation_key = target AND i.status = ANY (i.correlation_scope)
           AND i.fsm IN (SELECT g.fsm FROM gd._grants g WHERE g.accepted AND g.role = ANY (own));
    END IF;
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
    RETURN gd._deliver_signal(caller, holders[1], name, payload, dedup_key, missing_ok, expires);
END $$;
