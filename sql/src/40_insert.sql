-- ---------------------------------------------------------------------------
-- Inserting instances
-- ---------------------------------------------------------------------------

-- The last start per correlation key of inserts with `throttle` (in the key
-- space of the FSMs' owner): the next instance of the key may start no
-- earlier than next_start.  A row whose next_start has passed says nothing
-- (the collector deletes it).
CREATE TABLE IF NOT EXISTS gd._throttles (
    owner      regrole NOT NULL,
    key        text NOT NULL,
    next_start timestamptz NOT NULL,
    PRIMARY KEY (owner, key)
);

-- When an insert throttled under `key` may start, asked to start at
-- `run_at`: then, or at the key's next free start ('queue'), or NULL when
-- the key started one too recently ('drop').  Locks the key's row until
-- commit, so concurrent inserts of one key take their turns one by one;
-- the caller moves next_start on only if it inserts.
CREATE OR REPLACE FUNCTION gd._throttle_slot(owner regrole, key text, run_at timestamptz, on_throttle text)
RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE
    next_free timestamptz;
BEGIN
    INSERT INTO gd._throttles AS t (owner, key, next_start) VALUES (owner, key, '-infinity')
    ON CONFLICT ON CONSTRAINT _throttles_pkey DO UPDATE SET next_start = t.next_start
    RETURNING t.next_start INTO next_free;
    IF next_free <= run_at THEN
        RETURN run_at;
    END IF;
    RETURN CASE on_throttle WHEN 'queue' THEN next_free END;
END $$;

-- A debounced insert finding its correlation key held by `occupant`: if the
-- occupant is a debounced instance of the same FSM, step and parent whose
-- first step has not started, it takes the later insert's state (over its
-- version's defaults) and runs at `run_at` instead; true then.  The UPDATE
-- waits for a step of the occupant that is running and, if that step moved
-- it on, leaves it alone: one run, with the last state.
CREATE OR REPLACE FUNCTION gd._debounce_join(occupant gd._instances, fsm text, first_step text, state jsonb,
                                             parent_id bigint, run_at timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    UPDATE gd._instances i
       SET state = (SELECT f.state_defaults FROM gd._fsms f WHERE f.name = i.fsm AND f.version = i.version)
                   || _debounce_join.state,
           eligible_at = run_at, updated_at = now(), debounced_at = now()
     WHERE i.id = occupant.id AND i.status = 'runnable' AND i.updated_at = i.debounced_at
       AND i.fsm = _debounce_join.fsm AND i.step = first_step
       AND i.parent_id IS NOT DISTINCT FROM _debounce_join.parent_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT occupant.gated THEN
        PERFORM gd._wake_on_commit(occupant.queue, occupant.priority, occupant.owner, occupant.fairness_lane, run_at,
                                   occupant.id);
    END IF;
    RETURN true;
END $$;

-- The one insert path behind gd_insert, gd_insert_all and gd_spawn, with
-- the rights of `caller`.  Returns the new id; for a duplicate correlation
-- key the debounced instance it joined, or else what on_duplicate says; NULL
-- when throttled away.
CREATE OR REPLACE FUNCTION gd._insert_instance(caller oid, fsm text, state jsonb, step text, queue text, priority int,
                                    concurrency_key text, correlation_key text, correlation_scope text[],
                                    rate_limit text, weight int, eligible_at timestamptz,
                                    schedule_in interval, on_duplicate text, parent_id bigint DEFAULT NULL,
                                    trace_context text DEFAULT NULL, debounce interval DEFAULT NULL,
                                    throttle interval DEFAULT NULL, on_throttle text DEFAULT 'drop',
                                    fairness_key text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    fsm_row gd._fsms;
    first gd._steps;
    route record;            -- the first step's queue, and the instance's home queue while away from it
    new_id bigint;
    occupant gd._instances;
    first_step text;
    run_at timestamptz;
    must_wait boolean;   -- gated: no room under the concurrency key yet
    timing_option text := CASE WHEN debounce IS NOT NULL THEN 'debounce' ELSE 'throttle' END;   -- named in a refusal
BEGIN
    fsm_row := gd._ready_fsm(fsm);
    PERFORM gd._check_may_use(caller, fsm_row.name);
    PERFORM gd._check_json(state, 'object', format('state of a %L instance must be a JSON object', fsm));
    first_step := coalesce(step, fsm_row.initial_step);
    first := gd._step(fsm_row.name, fsm_row.version, first_step);
    IF first_step <> fsm_row.initial_step AND NOT pg_has_role(caller, fsm_row.owner, 'MEMBER') THEN
        -- A grant lets a role start the FSM, not enter it past the steps its owner put first.
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('gen_durable: only the owner of FSM %L starts it at step %L', fsm_row.name, first_step),
            HINT = format('Start it at its initial step, %L.', fsm_row.initial_step);
    END IF;
    IF queue IS NULL THEN
        queue := fsm_row.queue;   -- registered when the FSM was defined
    ELSIF queue <> fsm_row.queue THEN
        queue := gd._known_queue(queue);
    END IF;
    route := gd._route(first.queue, queue);
    IF priority IS NULL THEN
        PERFORM gd._bad_argument('priority must not be NULL');
    END IF;
    IF weight IS NULL OR weight < 1 THEN
        PERFORM gd._bad_argument(format('weight must be at least 1, got %s', coalesce(weight::text, 'NULL')));
    END IF;
    IF eligible_at IS NOT NULL AND schedule_in IS NOT NULL THEN
        PERFORM gd._bad_argument('give eligible_at or schedule_in, not both');
    END IF;
    IF eligible_at = '-infinity' THEN   -- (infinity is "never": until retried or cancelled)
        PERFORM gd._bad_argument('eligible_at must not be -infinity');
    END IF;
    IF debounce IS NOT NULL OR throttle IS NOT NULL THEN
        IF correlation_key IS NULL THEN
            PERFORM gd._bad_argument('debounce and throttle need a correlation_key, the key they act on');
        ELSIF debounce IS NOT NULL AND throttle IS NOT NULL THEN
            PERFORM gd._bad_argument('give debounce or throttle, not both');
        ELSIF debounce IS NOT NULL AND (eligible_at IS NOT NULL OR schedule_in IS NOT NULL) THEN
            PERFORM gd._bad_argument('debounce sets when the instance runs: give no eligible_at or schedule_in with it');
        ELSIF coalesce(debounce, throttle) <= interval '0' THEN
            PERFORM gd._bad_argument(format('%s must be more than 0, got %s', timing_option, coalesce(debounce, throttle)));
        END IF;
        PERFORM gd._check_interval(coalesce(debounce, throttle), timing_option);
    END IF;
    IF on_throttle IS NULL OR on_throttle NOT IN ('drop', 'queue') THEN
        PERFORM gd._bad_argument(format('on_throttle must be drop or queue, got %L', on_throttle));
    END IF;
    run_at := coalesce(eligible_at, now());
    IF schedule_in IS NOT NULL THEN
        run_at := clock_timestamp() + gd._check_interval(schedule_in, 'schedule_in');
    ELSIF debounce IS NOT NULL THEN
        run_at := clock_timestamp() + debounce;
    END IF;
    IF correlation_scope IS NULL AND throttle IS NOT NULL THEN
        -- A throttled key spaces its instances out; it does not keep them unique.
        correlation_scope := '{}';
    ELSIF correlation_scope IS NULL THEN
        correlation_scope := gd._live_statuses();
    ELSIF array_ndims(correlation_scope) > 1 THEN
        PERFORM gd._bad_argument(format('correlation_scope must be a one-dimensional array of statuses, got %s',
                                        correlation_scope));
    ELSIF array_position(correlation_scope, NULL) IS NOT NULL
       OR NOT correlation_scope <@ (gd._live_statuses() || gd._terminal_statuses()) THEN
        PERFORM gd._bad_argument(format('correlation_scope %s holds an unknown status', correlation_scope),
                                 'Statuses are runnable, executing, awaiting_signal, awaiting_children, done, failed, cancelled.');
    ELSIF cardinality(correlation_scope) > 0 THEN
        -- A live instance always holds its key: one it let go of while waiting
        -- could be taken, and its resuming would then collide mid-run.
        correlation_scope := ARRAY(SELECT DISTINCT s FROM unnest(gd._live_statuses() || correlation_scope) s ORDER BY 1);
    END IF;
    IF correlation_key IS NULL THEN
        correlation_scope := NULL;   -- nothing to keep unique: a row's bytes saved in every version of it
    END IF;
    IF on_duplicate IS NULL OR on_duplicate NOT IN ('error', 'existing', 'skip') THEN
        PERFORM gd._bad_argument(format('on_duplicate must be error, existing or skip, got %L', on_duplicate));
    END IF;
    IF correlation_key = '' THEN
        PERFORM gd._bad_argument('correlation_key must not be empty');
    END IF;
    IF trace_context IS NOT NULL THEN
        PERFORM gd._check_traceparent(trace_context);
    ELSIF parent_id IS NOT NULL THEN
        trace_context := (SELECT p.trace_context FROM gd._instances p WHERE p.id = _insert_instance.parent_id);
    END IF;
    IF fairness_key = '' THEN
        PERFORM gd._bad_argument('fairness_key must not be empty');
    ELSIF fairness_key IS NOT NULL THEN
        PERFORM gd._check_length(fairness_key, 'fairness_key');
    ELSIF parent_id IS NOT NULL THEN
        fairness_key := (SELECT p.fairness_key FROM gd._instances p WHERE p.id = _insert_instance.parent_id);
    END IF;
    must_wait := false;
    IF correlation_key IS NOT NULL OR concurrency_key IS NOT NULL OR rate_limit IS NOT NULL THEN
        PERFORM gd._check_length(correlation_key, 'correlation_key'),
                gd._check_length(concurrency_key, 'concurrency_key'), gd._check_length(rate_limit, 'rate_limit');
        PERFORM gd._check_rate_limit(fsm_row.owner, rate_limit, weight);
        IF concurrency_key IS NOT NULL AND (concurrency_key = '' OR split_part(concurrency_key, ':', 1) = '') THEN
            PERFORM gd._bad_argument(format('concurrency_key must be name or name:partition, got %L', concurrency_key));
        END IF;
        must_wait := gd._must_gate(fsm_row.owner, concurrency_key);
    END IF;
    IF throttle IS NOT NULL THEN
        run_at := gd._throttle_slot(fsm_row.owner, correlation_key, run_at, on_throttle);
        IF run_at IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;

    LOOP
        INSERT INTO gd._instances AS i (status, fsm, version, owner, step, state, queue, home_queue, external, priority,
                                        concurrency_key, gated, correlation_key, correlation_scope, rate_limit,
                                        weight, eligible_at, parent_id, trace_context, updated_at, debounced_at,
                                        fairness_key, fairness_lane)
        VALUES (gd._status_after('insert', 'runnable'), fsm_row.name, fsm_row.version, fsm_row.owner, first_step,
                fsm_row.state_defaults || state,
                route.queue, route.home_queue, first.handler IS NULL, priority, concurrency_key, must_wait,
                correlation_key, correlation_scope, rate_limit, weight, run_at, parent_id, trace_context,
                now(), CASE WHEN debounce IS NOT NULL THEN now() END, fairness_key, gd._fairness_lane(fairness_key))
        ON CONFLICT (correlation_key, owner) WHERE correlation_key IS NOT NULL AND status = ANY (correlation_scope)
        DO NOTHING
        RETURNING i.id INTO new_id;
        IF new_id IS NOT NULL THEN
            IF NOT must_wait THEN
                PERFORM gd._wake_on_commit(route.queue, priority, fsm_row.owner, gd._fairness_lane(fairness_key),
                                           run_at, new_id);
            END IF;
            IF throttle IS NOT NULL THEN
                UPDATE gd._throttles t SET next_start = run_at + throttle
                 WHERE t.owner = fsm_row.owner AND t.key = _insert_instance.correlation_key;
            END IF;
            PERFORM gd._emit_inserted(ARRAY[new_id]);
            RETURN new_id;
        END IF;
        SELECT * INTO occupant FROM gd._instances i
         WHERE i.correlation_key = _insert_instance.correlation_key AND i.owner = fsm_row.owner
           AND i.status = ANY (i.correlation_scope);
        IF FOUND AND debounce IS NOT NULL THEN
            -- (Joined only if of the FSM inserted, which the caller may use.)
            IF gd._debounce_join(occupant, fsm_row.name, first_step, state, parent_id, run_at) THEN
                RETURN occupant.id;
            END IF;
            -- Not to be joined: a duplicate if it still holds the key (its step
            -- that ran meanwhile may have ended it).
            SELECT * INTO occupant FROM gd._instances i WHERE i.id = occupant.id AND i.status = ANY (i.correlation_scope);
        END IF;
        IF FOUND THEN
            EXIT;
        END IF;
        -- the occupant left the scope between our insert and our look-up: try again
    END LOOP;

    IF on_duplicate = 'skip' THEN
        RETURN NULL;
    END IF;
    IF NOT gd._may_use_instance(caller, occupant.owner, occupant.fsm) THEN
        -- In the owner's key space, but not the caller's to see: no id for it.
        RAISE EXCEPTION USING ERRCODE = 'unique_violation',
            MESSAGE = format('gen_durable: correlation key %L is already taken', correlation_key),
            DETAIL = 'An instance of an FSM you may not use holds it.';
    END IF;
    IF on_duplicate = 'existing' THEN
        RETURN occupant.id;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'unique_violation',
        MESSAGE = format('gen_durable: correlation key %L is already taken', correlation_key),
        DETAIL = format('Instance %s holds it.', occupant.id);
END $$;

CREATE OR REPLACE FUNCTION @extschema@.gd_insert(fsm text, state jsonb DEFAULT '{}', step text DEFAULT NULL,
                                      queue text DEFAULT NULL, priority int DEFAULT 0,
                                      concurrency_key text DEFAULT NULL, correlation_key text DEFAULT NULL,
                                      correlation_scope text[] DEFAULT NULL, rate_limit text DEFAULT NULL,
                                      weight int DEFAULT 1, eligible_at timestamptz DEFAULT NULL,
                                      schedule_in interval DEFAULT NULL, on_duplicate text DEFAULT 'error',
                                      trace_context text DEFAULT NULL, debounce interval DEFAULT NULL,
                                      throttle interval DEFAULT NULL, on_throttle text DEFAULT 'drop',
                                      fairness_key text DEFAULT NULL)
RETURNS bigint LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._insert(fsm text, state jsonb, step text, queue text, priority int, concurrency_key text,
                           correlation_key text, correlation_scope text[], rate_limit text, weight int,
                           eligible_at timestamptz, schedule_in interval, on_duplicate text, trace_context text,
                           debounce interval, throttle interval, on_throttle text, fairness_key text)
RETURNS bigint LANGUAGE sql
AS $$ SELECT gd._insert_instance(gd._caller(), fsm, state, step, queue, priority, concurrency_key, correlation_key,
                                 correlation_scope, rate_limit, weight, eligible_at, schedule_in, on_duplicate, NULL,
                                 trace_context, debounce, throttle, on_throttle, fairness_key) $$;

-- One insert option object (as in gd_insert_all and gd_spawn) into gd._insert_instance.
CREATE OR REPLACE FUNCTION gd._insert_entry(caller oid, default_fsm text, entry jsonb, on_duplicate text,
                                 parent_id bigint DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    unknown text;
BEGIN
    PERFORM gd._check_json(entry, 'object', 'each entry must be a JSON object of insert options');
    SELECT string_agg(k, ', ') INTO unknown FROM jsonb_object_keys(entry) k
     WHERE k NOT IN ('fsm', 'state', 'step', 'queue', 'priority', 'concurrency_key', 'correlation_key',
                     'correlation_scope', 'rate_limit', 'weight', 'eligible_at', 'schedule_in', 'trace_context',
                     'debounce', 'throttle', 'on_throttle', 'fairness_key');
    IF unknown IS NOT NULL THEN
        PERFORM gd._bad_argument(format('unknown insert option %s', unknown), format('In entry %s.', entry));
    END IF;
    IF entry ? 'correlation_scope' AND jsonb_typeof(entry->'correlation_scope') <> 'array' THEN
        PERFORM gd._bad_argument(format('insert option correlation_scope must be an array, got %s',
                                        entry->'correlation_scope'));
    END IF;
    RETURN gd._insert_instance(caller, coalesce(entry->>'fsm', default_fsm),
                      coalesce(entry->'state', '{}'),
                      entry->>'step', entry->>'queue',
                      gd._entry_int(entry, 'priority', 0),
                      entry->>'concurrency_key', entry->>'correlation_key',
                      CASE WHEN entry ? 'correlation_scope'
                           THEN ARRAY(SELECT jsonb_array_elements_text(entry->'correlation_scope')) END,
                      entry->>'rate_limit',
                      gd._entry_int(entry, 'weight', 1),
                      gd._entry_cast(entry, 'eligible_at', NULL::timestamptz),
                      gd._entry_cast(entry, 'schedule_in', NULL::interval),
                      on_duplicate, parent_id, entry->>'trace_context',
                      gd._entry_cast(entry, 'debounce', NULL::interval),
                      gd._entry_cast(entry, 'throttle', NULL::interval),
                      coalesce(entry->>'on_throttle', 'drop'), entry->>'fairness_key');
END $$;

-- The FSM of entries that need nothing but an insert each (objects with at
-- most an fsm, one for all, and a state object), or NULL: those go through
-- gd._insert_plain, the others one by one through gd._insert_entry.
CREATE OR REPLACE FUNCTION gd._plain_entries_fsm(entries jsonb, default_fsm text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN bool_and(jsonb_typeof(e) = 'object' AND e - 'fsm' - 'state' = '{}'
                              AND jsonb_typeof(coalesce(e->'state', '{}')) = 'object'
                              AND jsonb_typeof(coalesce(e->'fsm', to_jsonb(default_fsm))) = 'string')
                     AND count(DISTINCT coalesce(e->>'fsm', default_fsm)) = 1
                THEN min(coalesce(e->>'fsm', default_fsm)) END
      FROM jsonb_array_elements(entries) e
$$;

-- Insert plain entries (see above) of one FSM in one statement: what
-- gd._insert_instance does for each, with the look-ups and checks done once.
CREATE OR REPLACE FUNCTION gd._insert_plain(caller oid, fsm text, entries jsonb, parent_id bigint) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    fsm_row gd._fsms := gd._ready_fsm(fsm);
    first gd._steps;
    route record;
    inserted bigint[];
    parent gd._instances;   -- children inherit its trace and fairness key

BEGIN
    PERFORM gd._check_may_use(caller, fsm_row.name);
    first := gd._step(fsm_row.name, fsm_row.version, fsm_row.initial_step);
    route := gd._route(first.queue, fsm_row.queue);
    SELECT * INTO parent FROM gd._instances p WHERE p.id = _insert_plain.parent_id;
    WITH added AS (
        INSERT INTO gd._instances AS i (status, fsm, version, owner, step, state, queue, home_queue, external,
                                        correlation_scope, eligible_at, parent_id, trace_context, fairness_key,
                                        fairness_lane)
        SELECT gd._status_after('insert', 'runnable'), fsm_row.name, fsm_row.version, fsm_row.owner, fsm_row.initial_step,
               fsm_row.state_defaults || coalesce(x.e->'state', '{}'),
               route.queue, route.home_queue, first.handler IS NULL, NULL, now(),
               _insert_plain.parent_id, parent.trace_context, parent.fairness_key, gd._fairness_lane(parent.fairness_key)
          FROM jsonb_array_elements(entries) WITH ORDINALITY AS x(e, n)
         ORDER BY x.n
        RETURNING i.id)
    SELECT array_agg(added.id ORDER BY added.id) INTO inserted FROM added;
    PERFORM gd._wake_on_commit(route.queue, 0, fsm_row.owner, gd._fairness_lane(parent.fairness_key), now(), added_id)
       FROM unnest(inserted) added_id;
    PERFORM gd._emit_inserted(inserted);
    RETURN QUERY SELECT unnest(inserted);
END $$;

CREATE OR REPLACE FUNCTION @extschema@.gd_insert_all(fsm text, entries jsonb)
RETURNS SETOF bigint LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._insert_all(fsm text, entries jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd._check_json(entries, 'array', 'entries must be a JSON array of insert options');
    RETURN QUERY SELECT gd._insert_entries(gd._caller(), fsm, entries, 'skip', NULL, NULL);
END $$;

-- Insert option objects (a validated JSON array) with the rights of
-- `caller`, under `parent_id` when given; returns the new ids (not those
-- `on_duplicate` skipped).  `needs_fsm`: what to call an entry that must name
-- its fsm (NULL: entries may leave it to `default_fsm`).
CREATE OR REPLACE FUNCTION gd._insert_entries(caller oid, default_fsm text, entries jsonb, on_duplicate text,
                                              parent_id bigint, needs_fsm text) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    plain_fsm text := gd._plain_entries_fsm(entries, default_fsm);
    entry jsonb;
    new_id bigint;
BEGIN
    IF plain_fsm IS NOT NULL THEN
        RETURN QUERY SELECT gd._insert_plain(caller, plain_fsm, entries, parent_id);
        RETURN;
    END IF;
    FOR entry IN SELECT e FROM jsonb_array_elements(entries) e LOOP
        IF needs_fsm IS NOT NULL AND jsonb_typeof(entry) = 'object' AND NOT entry ? 'fsm' THEN
            PERFORM gd._bad_argument(format('each %s needs an fsm, got %s', needs_fsm, entry));
        END IF;
        new_id := gd._insert_entry(caller, default_fsm, entry, on_duplicate, parent_id);
        IF new_id IS NOT NULL THEN
            RETURN NEXT new_id;
        END IF;
    END LOOP;
END $$;
