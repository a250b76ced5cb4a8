-- ---------------------------------------------------------------------------
-- Internals implemented in C++
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION gd._wake_on_commit(queue text) RETURNS void
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_wake_on_commit';
-- The same, for a row at this key of the pick index (the queue's frontier starts there).
CREATE OR REPLACE FUNCTION gd._wake_on_commit(queue text, priority int, owner oid, fairness_lane int,
                                               eligible_at timestamptz, id bigint)
    RETURNS void LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_wake_on_commit';
CREATE OR REPLACE FUNCTION gd._wake_database_on_commit() RETURNS void
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_wake_database_on_commit';
CREATE OR REPLACE FUNCTION gd._await_publish(id bigint) RETURNS void
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_await_publish';
CREATE OR REPLACE FUNCTION gd._await_sleep(milliseconds int) RETURNS void
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_await_sleep';
CREATE OR REPLACE FUNCTION gd._written_here(row_xmin xid) RETURNS boolean
    LANGUAGE c STRICT STABLE AS 'MODULE_PATHNAME', 'gd_written_here';
CREATE OR REPLACE FUNCTION gd._engine_loaded() RETURNS boolean
    LANGUAGE c STABLE AS 'MODULE_PATHNAME', 'gd_engine_loaded';
CREATE OR REPLACE FUNCTION gd._wake_awaiters_on_commit(id bigint) RETURNS void
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_wake_awaiters_on_commit';
-- The event stream's events of instances just inserted (src/events.cpp; nothing when gen_durable.events is off).
CREATE OR REPLACE FUNCTION gd._emit_inserted(ids bigint[]) RETURNS void
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_emit_inserted';
-- The event stream's key: every message the engine writes carries the
-- HMAC-SHA256 of its content under it, which no other role can make.  One
-- per database, made by CREATE EXTENSION (not dumped: a restored database
-- gets its own); gd.event_key() hands it to a consumer (superusers, and
-- roles granted EXECUTE on it).
CREATE TABLE IF NOT EXISTS gd._event_key (key bytea NOT NULL CHECK (length(key) = 32));
CREATE UNIQUE INDEX IF NOT EXISTS event_key_one_row ON gd._event_key ((true));
CREATE OR REPLACE FUNCTION gd._new_event_key() RETURNS bytea
    LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'gd_new_event_key';
INSERT INTO gd._event_key SELECT gd._new_event_key() ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION gd.event_key() RETURNS bytea LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._event_key() RETURNS bytea LANGUAGE sql STABLE AS $$ SELECT k.key FROM gd._event_key k $$;
CREATE OR REPLACE FUNCTION gd._wake_reaper_on_commit() RETURNS void
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_wake_reaper_on_commit';
-- The instances at a step follow it to its new queue (NULL: their home
-- queue) when it is redefined there (src/transition.cpp).
CREATE OR REPLACE FUNCTION gd._move_step(fsm text, version int, step text, queue text) RETURNS void
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_move_step';
-- Resume a parked instance, its row locked by the caller, at its then_step
-- with `resume_with` for the next step's ctx (src/transition.cpp).
CREATE OR REPLACE FUNCTION gd._resume_parked(instance_id bigint, resume_with jsonb) RETURNS void
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_resume_parked_sql';
-- Runs steps in the calling session as an executor would (handlers as their
-- FSM's owners): for superusers only, like every gd._* function.
CREATE OR REPLACE FUNCTION gd._execute(queue text, max int DEFAULT 1) RETURNS int
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_execute';
CREATE OR REPLACE FUNCTION gd._interrupt_step(instance bigint, terminate boolean) RETURNS boolean
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_interrupt_step';
CREATE OR REPLACE FUNCTION gd._definitions_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_definitions_changed';
CREATE OR REPLACE FUNCTION gd._workers(OUT pid int, OUT kind text, OUT database text, OUT queue text,
                            OUT instance_id bigint, OUT since timestamptz)
    RETURNS SETOF record LANGUAGE c AS 'MODULE_PATHNAME', 'gd_workers';
-- The queue names of gen_durable.queues (a setting every role may read).
CREATE OR REPLACE FUNCTION gd.configured_queues() RETURNS text[]
    LANGUAGE c STABLE AS 'MODULE_PATHNAME', 'gd_configured_queues';

-- Executors cache definitions; any change to them invalidates the caches at commit.
CREATE OR REPLACE TRIGGER definitions_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON gd._fsms
    FOR EACH STATEMENT EXECUTE FUNCTION gd._definitions_changed();
CREATE OR REPLACE TRIGGER definitions_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON gd._steps
    FOR EACH STATEMENT EXECUTE FUNCTION gd._definitions_changed();

-- ---------------------------------------------------------------------------
-- Who may do what
-- ---------------------------------------------------------------------------
-- Every API function that reads or writes the engine's tables is a door
-- (src/door.cpp): `gd_NAME` runs its implementation `gd._NAME`, with the
-- same arguments, as the extension's owner under a search_path of
-- pg_catalog and pg_temp only, and gd._caller() tells the implementation
-- which role called the door.  Each implementation decides on that role's
-- rights with the functions below, before it reads or writes anything for
-- it; every name in it is qualified.
--
-- A role may use (insert, see, signal, await, cancel, retry, claim and
-- complete) the instances of an FSM whose owner it is a member of, or that
-- was granted (gd_grant) to a role it is a member of; it may define and
-- grant only FSMs whose owner it is a member of.  Superusers may do all.

-- The role that called the door being run.
CREATE OR REPLACE FUNCTION gd._caller() RETURNS oid
    LANGUAGE c STABLE AS 'MODULE_PATHNAME', 'gd_caller';

-- May `caller` use the instances of this FSM?
CREATE OR REPLACE FUNCTION gd._may_use(caller oid, fsm_name text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM gd._fsms f WHERE f.name = fsm_name AND pg_has_role(caller, f.owner, 'MEMBER'))
        OR EXISTS (SELECT FROM gd._grants g WHERE g.fsm = fsm_name AND pg_has_role(caller, g.role, 'MEMBER'))
$$;

-- May `caller` use this instance (of FSM fsm_name, owned by owner)?
CREATE OR REPLACE FUNCTION gd._may_use_instance(caller oid, owner oid, fsm_name text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_has_role(caller, owner, 'MEMBER')
        OR EXISTS (SELECT FROM gd._grants g WHERE g.fsm = fsm_name AND pg_has_role(caller, g.role, 'MEMBER'))
$$;

-- The roles whose key spaces are the caller's own, for what resolves without
-- naming an FSM (a signal by correlation key, a claim without a list of
-- FSMs): the roles it is a member of.  NULL for a superuser: every role's.
CREATE OR REPLACE FUNCTION gd._own_roles(caller oid) RETURNS oid[]
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN NOT (SELECT r.rolsuper FROM pg_roles r WHERE r.oid = caller)
                THEN ARRAY(SELECT r.oid FROM pg_roles r WHERE pg_has_role(caller, r.oid, 'MEMBER')) END
$$;

-- The FSMs whose instances a role finds without naming them: those owned by
-- its own roles (gd._own_roles), and those granted to one of them and accepted.
CREATE OR REPLACE FUNCTION gd._implicit_fsms(own_roles oid[]) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT ARRAY(SELECT f.name FROM gd._fsms f WHERE f.owner = ANY (own_roles)
                 UNION
                 SELECT g.fsm FROM gd._grants g WHERE g.accepted AND g.role = ANY (own_roles)
                 ORDER BY 1)
$$;

-- The owner of an FSM (of all its versions), or NULL for a new name.
CREATE OR REPLACE FUNCTION gd._fsm_owner(fsm_name text) RETURNS oid
LANGUAGE sql STABLE AS $$
    SELECT f.owner FROM gd._fsms f WHERE f.name = fsm_name LIMIT 1
$$;

CREATE OR REPLACE FUNCTION gd._check_may_use(caller oid, fsm_name text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT gd._may_use(caller, fsm_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('gen_durable: permission denied for FSM %L', fsm_name),
            HINT = 'Its owner can allow you with gd_grant(fsm, role).';
    END IF;
END $$;

-- The caller may define and grant this FSM: it is a member of its owner (any role, for a new name).
CREATE OR REPLACE FUNCTION gd._check_owns(caller oid, fsm_name text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    owner oid := gd._fsm_owner(fsm_name);
BEGIN
    IF owner IS NOT NULL AND NOT pg_has_role(caller, owner, 'MEMBER') THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('gen_durable: FSM %L belongs to another role', fsm_name);
    END IF;
END $$;

-- ---------------------------------------------------------------------------
-- Shared helpers of the SQL API
-- ---------------------------------------------------------------------------

-- The statuses and the table of their changes, as the engine's C++ knows
-- them (src/instance_status.cpp).  The gd.status domain, the partial indexes
-- on live rows and the queries that must match their predicates spell the
-- names out (test/t/060_instance_states.pl checks them against the table).
-- Every statement that writes a status names it with gd._status_after
-- (writer, status), which raises unless the table lets the writer write it,
-- and writes only over gd._statuses_before(writer); both fold to constants
-- when the statement is planned.
CREATE OR REPLACE FUNCTION gd._live_statuses() RETURNS text[] LANGUAGE c IMMUTABLE
    AS 'MODULE_PATHNAME', 'gd_live_statuses';
CREATE OR REPLACE FUNCTION gd._terminal_statuses() RETURNS text[] LANGUAGE c IMMUTABLE
    AS 'MODULE_PATHNAME', 'gd_terminal_statuses';
CREATE OR REPLACE FUNCTION gd.read_status_changes(OUT writer text, OUT from_status text, OUT to_status text, OUT by text)
    RETURNS SETOF record LANGUAGE c IMMUTABLE AS 'MODULE_PATHNAME', 'gd_status_changes';
CREATE OR REPLACE FUNCTION gd._statuses_before(writer text) RETURNS text[] LANGUAGE c IMMUTABLE STRICT
    AS 'MODULE_PATHNAME', 'gd_statuses_before_sql';
CREATE OR REPLACE FUNCTION gd._status_after(writer text, status text) RETURNS text LANGUAGE c IMMUTABLE STRICT
    AS 'MODULE_PATHNAME', 'gd_status_after';

-- 22023 with a gen_durable: message, and a DETAIL line only when there is one.
CREATE OR REPLACE FUNCTION gd._bad_argument(message text, detail text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF coalesce(detail, '') = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'gen_durable: ' || message;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'gen_durable: ' || message, DETAIL = detail;
END $$;

-- A W3C Trace Context traceparent (https://www.w3.org/TR/trace-context/):
-- version-trace_id-parent_id-flags in lowercase hex, neither id all zeros,
-- version ff invalid; a later version may append fields after a dash.
CREATE OR REPLACE FUNCTION gd._check_traceparent(traceparent text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'
       AND NOT traceparent ~ '^ff-' AND (traceparent ~ '^00-' AND length(traceparent) = 55 OR NOT traceparent ~ '^00-')
       AND substr(traceparent, 4, 32) <> repeat('0', 32) AND substr(traceparent, 37, 16) <> repeat('0', 16) THEN
        RETURN;
    END IF;
    PERFORM gd._bad_argument(format('trace_context must be a W3C traceparent, got %L', left(traceparent, 100)),
                             'version-trace_id-parent_id-flags in lowercase hex, as in '
                             '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01; neither id all zeros.');
END $$;

-- Refuse an empty name: "`what` must not be empty".
CREATE OR REPLACE FUNCTION gd._check_not_empty(value text, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR value = '' THEN
        PERFORM gd._bad_argument(what || ' must not be empty');
    END IF;
END $$;

-- Refuse a count under 1: "`what`, got <value>".
CREATE OR REPLACE FUNCTION gd._check_positive(value int, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR value < 1 THEN
        PERFORM gd._bad_argument(format('%s, got %s', what, coalesce(value::text, 'NULL')));
    END IF;
END $$;

-- Refuse a value that is not a JSON `kind` ('object', 'array'): "`what`, got <value>".
CREATE OR REPLACE FUNCTION gd._check_json(value jsonb, kind text, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR jsonb_typeof(value) <> kind THEN
        PERFORM gd._bad_argument(format('%s, got %s', what, coalesce(value::text, 'NULL')));
    END IF;
END $$;

-- Delays, timeouts and leases: not negative, and at most 100 years (longer
-- would overflow timestamps; it means "never" anyway).
CREATE OR REPLACE FUNCTION gd._check_interval(value interval, what text) RETURNS interval
    LANGUAGE c IMMUTABLE STRICT AS 'MODULE_PATHNAME', 'gd_check_interval_sql';

-- Names, keys and labels: short enough to index (and to quote in a message).
CREATE OR REPLACE FUNCTION gd._check_length(value text, what text, max_bytes int DEFAULT 1000) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF octet_length(value) > max_bytes THEN
        PERFORM gd._bad_argument(format('%s must be at most %s bytes, got %s bytes starting %L',
                                        what, max_bytes, octet_length(value), left(value, 40)));
    END IF;
    RETURN value;
END $$;

-- Where an instance runs a step: on the step's own queue, else on its home
-- queue (that of its other steps: its FSM's, or its insert's); home_queue is
-- the queue to come back to, while away from it.
CREATE OR REPLACE FUNCTION gd._route(step_queue text, home text, OUT queue text, OUT home_queue text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(step_queue, home), CASE WHEN step_queue <> home THEN home END
$$;

-- A queue a definition names (of_what: whose queue, for the message).
CREATE OR REPLACE FUNCTION gd._check_queue_name(queue text, of_what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF queue IS NULL OR queue = '' OR octet_length(queue) > 63 THEN
        PERFORM gd._bad_argument(format('queue of %s must be a name of 1 to 63 bytes', of_what));
    END IF;
END $$;

-- The newest version of an FSM, or 42704.
CREATE OR REPLACE FUNCTION gd._newest_fsm(fsm_name text) RETURNS gd._fsms
LANGUAGE plpgsql STABLE AS $$
DECLARE
    newest gd._fsms;
BEGIN
    SELECT * INTO newest FROM gd._fsms f WHERE f.name = fsm_name ORDER BY f.version DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_object',
            MESSAGE = format('gen_durable: unknown FSM %L', fsm_name);
    END IF;
    RETURN newest;
END $$;

-- The version new instances take: the newest whose initial step is defined
-- (a version being defined takes none yet), or 42704.
CREATE OR REPLACE FUNCTION gd._ready_fsm(fsm_name text) RETURNS gd._fsms
LANGUAGE plpgsql STABLE AS $$
DECLARE
    ready gd._fsms;
    newest gd._fsms;
BEGIN
    SELECT * INTO ready FROM gd._fsms f
     WHERE f.name = fsm_name
       AND EXISTS (SELECT FROM gd._steps s WHERE s.fsm = f.name AND s.version = f.version AND s.step = f.initial_step)
     ORDER BY f.version DESC LIMIT 1;
    IF NOT FOUND THEN
        newest := gd._newest_fsm(fsm_name);
        RAISE EXCEPTION USING ERRCODE = 'undefined_object',
            MESSAGE = format('gen_durable: FSM %L has no version that can start: initial step %L of version %s is not defined',
                             fsm_name, newest.initial_step, newest.version);
    END IF;
    RETURN ready;
END $$;

CREATE OR REPLACE FUNCTION gd._step(fsm_name text, fsm_version int, step_name text) RETURNS gd._steps
LANGUAGE plpgsql STABLE AS $$
DECLARE
    definition gd._steps;
BEGIN
    SELECT * INTO definition FROM gd._steps s
     WHERE s.fsm = fsm_name AND s.version = fsm_version AND s.step = step_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_object',
            MESSAGE = format('gen_durable: unknown step %L of FSM %L version %s', step_name, fsm_name, fsm_version);
    END IF;
    RETURN definition;
END $$;

-- A queue the engine knows: registered, or listed in gen_durable.queues (registered now).
CREATE OR REPLACE FUNCTION gd._known_queue(queue_name text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF queue_name IS NULL THEN
        PERFORM gd._bad_argument('queue must not be NULL');
    END IF;
    PERFORM FROM gd._queues q WHERE q.name = queue_name;
    IF NOT FOUND THEN
        IF NOT queue_name = ANY (gd.configured_queues()) THEN
            RAISE EXCEPTION USING ERRCODE = 'undefined_object',
                MESSAGE = format('gen_durable: unknown queue %L', queue_name),
                HINT = 'Name it in gen_durable.queues or in gd_define_fsm(queue => ...).';
        END IF;
        INSERT INTO gd._queues (name) VALUES (queue_name) ON CONFLICT DO NOTHING;
    END IF;
    RETURN queue_name;
END $$;

-- An integer option of an options object (an insert entry, a step's options), or
-- its default.
CREATE OR REPLACE FUNCTION gd._entry_int(entry jsonb, option text, default_value int) RETURNS int
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT entry ? option THEN
        RETURN default_value;
    END IF;
    IF jsonb_typeof(entry->option) <> 'number' OR (entry->>option)::numeric <> trunc((entry->>option)::numeric)
       OR abs((entry->>option)::numeric) > 2147483647 THEN
        PERFORM gd._bad_argument(format('option %s must be an integer, got %s', option, entry->option));
    END IF;
    RETURN (entry->>option)::int;
END $$;

-- A boolean option of an options object (JSON true or false), or default_value when absent.
CREATE OR REPLACE FUNCTION gd._entry_bool(entry jsonb, option text, default_value boolean) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT entry ? option THEN
        RETURN default_value;
    END IF;
    IF jsonb_typeof(entry->option) <> 'boolean' THEN
        PERFORM gd._bad_argument(format('option %s must be true or false, got %s', option, entry->option));
    END IF;
    RETURN (entry->option)::boolean;
END $$;

-- A string option of an options object as a timestamptz or interval (the type
-- of `kind`), or NULL when absent; anything else is a bad argument.
CREATE OR REPLACE FUNCTION gd._entry_cast(entry jsonb, option text, kind anyelement) RETURNS anyelement
LANGUAGE plpgsql STABLE AS $$
DECLARE
    cast_value kind%TYPE;
BEGIN
    IF NOT entry ? option OR entry->option = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(entry->option) <> 'string' THEN
        PERFORM gd._bad_argument(format('option %s must be a string, got %s', option, entry->option));
    END IF;
    BEGIN
        cast_value := (entry->>option);
    EXCEPTION WHEN data_exception THEN
        PERFORM gd._bad_argument(format('option %s: %s', option, SQLERRM));
    END;
    RETURN cast_value;
END $$;
