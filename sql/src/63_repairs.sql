-- ---------------------------------------------------------------------------
-- Repairing and changing in-flight work: gd_rewind, gd_fork, gd_migrate
-- ---------------------------------------------------------------------------
-- Each runs in the caller's transaction, with the rights of the FSM's owner
-- (the caller must be a member of it: a grant to use an FSM's instances is
-- not one to rewrite their state), locks the instances it changes (waiting
-- for a round or a claim's completion that holds them, then looking again),
-- and leaves a row in the step history of each instance it changed — kind
-- rewind, fork or migrate, the state it set, and in detail who did it and
-- where the instance was — whether or not the FSM keeps a history of its
-- steps.

-- The caller may change this FSM's instances: a member of its owner (42501 otherwise).
CREATE OR REPLACE FUNCTION gd._check_repairer(caller oid, owner oid, fsm_name text, what text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT pg_has_role(caller, owner, 'MEMBER') THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('gen_durable: only the owner of FSM %L (%s) may %s its instances', fsm_name,
                             owner::regrole, what);
    END IF;
END $$;

-- A repair's row of the step history.
CREATE OR REPLACE FUNCTION gd._record_repair(instance_id bigint, kind text, step text, attempt int, state jsonb,
                                             detail jsonb) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO gd._step_history (instance_id, attempt, step, kind, started_at, ended_at, worker, state, detail)
    VALUES (instance_id, attempt, step, kind, clock_timestamp(), clock_timestamp(), session_user,
            state, detail || jsonb_build_object('by', gd._caller()::regrole::text))
$$;

-- An instance the caller may use, locked; NULL when there is none.
CREATE OR REPLACE FUNCTION gd._locked_instance(caller oid, instance_id bigint) RETURNS gd._instances
LANGUAGE plpgsql AS $$
DECLARE
    target gd._instances;
BEGIN
    -- Looked at before it is locked: see gd._deliver_signal.
    SELECT * INTO target FROM gd._instances i WHERE i.id = instance_id;
    IF NOT FOUND OR NOT gd._may_use_instance(caller, target.owner, target.fsm) THEN
        RETURN NULL;
    END IF;
    SELECT * INTO target FROM gd._instances i WHERE i.id = instance_id FOR UPDATE;
    RETURN target;
END $$;

-- Move a failed, stopped or stuck instance back to a step of its version.
CREATE OR REPLACE FUNCTION @extschema@.gd_rewind(id bigint, step text, state jsonb DEFAULT NULL) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._rewind(id bigint, step text, state jsonb) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    caller oid := gd._caller();
    target gd._instances := gd._locked_instance(caller, id);
BEGIN
    IF target.id IS NULL THEN
        RETURN false;
    END IF;
    PERFORM gd._check_repairer(caller, target.owner, target.fsm, 'rewind');
    IF step IS NULL THEN
        PERFORM gd._bad_argument('gd_rewind needs the step to go back to');
    END IF;
    PERFORM gd._step(target.fsm, target.version, step);
    IF state IS NOT NULL THEN
        PERFORM gd._check_json(state, 'object', 'state of gd_rewind must be a JSON object');
    END IF;
    IF NOT gd._rewind_instance(target.id, step, state) THEN
        RETURN false;   -- done or cancelled: gd_fork starts it again
    END IF;
    PERFORM gd._record_repair(target.id, 'rewind', step, 1, coalesce(state, target.state),
                              jsonb_build_object('from_step', target.step, 'from_status', target.status,
                                                 'from_attempt', target.attempt));
    RETURN true;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION USING ERRCODE = 'unique_violation',
        MESSAGE = format('gen_durable: instance %s cannot run again: its correlation key is taken', id);
END $$;

CREATE OR REPLACE FUNCTION gd._rewind_instance(id bigint, step text, state jsonb) RETURNS boolean
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_rewind_instance';

-- Start a new instance of the FSM's current version from an entry of an
-- instance's step history (its number in gd_history): at that entry's step,
-- with the state it started with, or `state`.
CREATE OR REPLACE FUNCTION @extschema@.gd_fork(id bigint, entry int, state jsonb DEFAULT NULL) RETURNS bigint
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._fork(id bigint, entry int, state jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    caller oid := gd._caller();
    source gd._instances;
    origin record;
    forked bigint;
BEGIN
    SELECT * INTO source FROM gd._instances i WHERE i.id = id;
    IF NOT FOUND OR NOT gd._may_use_instance(caller, source.owner, source.fsm) THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = format('gen_durable: instance %s not found', coalesce(id::text, 'NULL'));
    END IF;
    PERFORM gd._check_repairer(caller, source.owner, source.fsm, 'fork');
    IF state IS NOT NULL THEN
        PERFORM gd._check_json(state, 'object', 'state of gd_fork must be a JSON object');
    END IF;
    SELECT h.step, h.state INTO origin
      FROM (SELECT h.step, h.state, row_number() OVER (ORDER BY h.ended_at) AS n
              FROM gd._step_history h WHERE h.instance_id = source.id) h
     WHERE h.n = entry;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = format('gen_durable: instance %s has no history entry %s', id, coalesce(entry::text, 'NULL')),
            HINT = 'gd_history(id) numbers its entries; an FSM keeps them when defined with history => true.';
    END IF;
    IF coalesce(state, origin.state) IS NULL THEN
        PERFORM gd._bad_argument(format('history entry %s of instance %s kept no state: give gd_fork one', entry, id));
    END IF;
    forked := gd._insert_instance(caller, source.fsm, coalesce(state, origin.state), origin.step, NULL, source.priority,
                                  source.concurrency_key, NULL, NULL, source.rate_limit, source.weight, NULL, NULL,
                                  'error', NULL, source.trace_context, fairness_key => source.fairness_key);
    PERFORM gd._record_repair(forked, 'fork', origin.step, 1, coalesce(state, origin.state),
                              jsonb_build_object('forked_from', source.id, 'entry', entry,
                                                 'from_version', source.version));
    RETURN forked;
END $$;

-- Move the live instances of one version of an FSM to another, each to the
-- step step_map names for its step (a step the map leaves out keeps its name,
-- if the new version has it); all or none.  Returns how many moved.
CREATE OR REPLACE FUNCTION @extschema@.gd_migrate(fsm text, from_version int, to_version int,
                                                  step_map jsonb DEFAULT '{}') RETURNS int
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._migrate(fsm text, from_version int, to_version int, step_map jsonb) RETURNS int
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    caller oid := gd._caller();
    definition gd._fsms;
    unmapped text;
    ids bigint[];
    steps_before text[];
    steps_after text[];
    then_steps text[];
    moved int;
BEGIN
    SELECT * INTO definition FROM gd._fsms f WHERE f.name = fsm AND f.version = from_version;
    IF NOT FOUND OR NOT gd._may_use(caller, fsm) THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_object',
            MESSAGE = format('gen_durable: unknown FSM %L version %s', fsm, coalesce(from_version::text, 'NULL'));
    END IF;
    PERFORM gd._check_repairer(caller, definition.owner, fsm, 'migrate');
    IF NOT EXISTS (SELECT FROM gd._fsms f WHERE f.name = fsm AND f.version = to_version) THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_object',
            MESSAGE = format('gen_durable: unknown FSM %L version %s', fsm, coalesce(to_version::text, 'NULL'));
    END IF;
    IF to_version = from_version THEN
        PERFORM gd._bad_argument(format('gd_migrate moves instances to another version of %L, got %s twice', fsm,
                                        from_version));
    END IF;
    PERFORM gd._check_json(step_map, 'object', 'step_map of gd_migrate must be a JSON object of step names');
    SELECT string_agg(format('%s → %s', m.key, m.value), ', ') INTO unmapped
      FROM jsonb_each(step_map) m
     WHERE jsonb_typeof(m.value) <> 'string'
        OR NOT EXISTS (SELECT FROM gd._steps s WHERE s.fsm = fsm AND s.version = to_version AND s.step = m.value->>0);
    IF unmapped IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_object',
            MESSAGE = format('gen_durable: step_map names steps FSM %L version %s does not have: %s', fsm, to_version,
                             unmapped);
    END IF;
    -- The instances, locked in one order (a round or a claim's completion
    -- holding one is waited for), with the steps they go to.
    WITH locked AS (
        SELECT i.id, i.step, i.wait_then_step FROM gd._instances i
         WHERE i.fsm = fsm AND i.version = from_version AND i.status = ANY (gd._live_statuses())
         ORDER BY i.id FOR UPDATE OF i)
    SELECT coalesce(array_agg(l.id ORDER BY l.id), '{}'), array_agg(l.step ORDER BY l.id),
           array_agg(coalesce(step_map->>l.step, l.step) ORDER BY l.id),
           array_agg(coalesce(step_map->>l.wait_then_step, l.wait_then_step) ORDER BY l.id)
      INTO ids, steps_before, steps_after, then_steps
      FROM locked l;
    SELECT string_agg(DISTINCT quote_literal(w.step), ', ') INTO unmapped
      FROM unnest(steps_after || then_steps) w(step)
     WHERE w.step IS NOT NULL
       AND NOT EXISTS (SELECT FROM gd._steps s WHERE s.fsm = fsm AND s.version = to_version AND s.step = w.step);
    IF unmapped IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('gen_durable: instances of FSM %L version %s are at steps version %s does not have: %s',
                             fsm, from_version, to_version, unmapped),
            HINT = 'Map each of them to a step of the new version in step_map.';
    END IF;
    UPDATE gd._instances i
       SET version = to_version, step = m.step_after, wait_then_step = m.then_step,
           external = CASE WHEN i.status = 'executing' THEN i.external ELSE s.handler IS NULL END,
           (queue, home_queue) = (SELECT r.queue, r.home_queue FROM gd._route(s.queue, coalesce(i.home_queue, i.queue)) r),
           updated_at = clock_timestamp()
      FROM unnest(ids, steps_after, then_steps) m(id, step_after, then_step), gd._steps s
     WHERE i.id = m.id AND s.fsm = i.fsm AND s.version = to_version AND s.step = m.step_after;
    GET DIAGNOSTICS moved = ROW_COUNT;
    PERFORM gd._record_repair(i.id, 'migrate', i.step, i.attempt, i.state,
                              jsonb_build_object('from_version', from_version, 'to_version', to_version,
                                                 'from_step', m.step_before))
       FROM unnest(ids, steps_before) m(id, step_before) JOIN gd._instances i ON i.id = m.id;
    PERFORM gd._wake_on_commit(q.queue)
       FROM (SELECT DISTINCT i.queue FROM gd._instances i WHERE i.id = ANY (ids) AND i.status = 'runnable') q;
    RETURN moved;
END $$;
