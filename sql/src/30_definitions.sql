-- ---------------------------------------------------------------------------
-- Defining FSMs
-- ---------------------------------------------------------------------------

-- steps: the version's steps in the same call, an object of step names to
-- gd_define_step's options ({"reserve": {"handler": "shop.reserve(jsonb, gd.context)",
-- "max_attempts": 5}, "charge": {}}: a step without a handler is external).
-- history: each finished step of the version's instances is kept in gd.step_history
-- (NULL: as the version is defined, false for a new one).
-- from_version: the steps of that version of the FSM that steps does not
-- name are defined in this one as they are there (a new version that
-- changes a step or two names only those), and its on_cancel unless the
-- call names one.
-- on_cancel: the step a gd_cancel of a live instance of the version sends it
-- to, its compensation (NULL: a cancel just ends it); one of the version's
-- steps once the call has defined them (42704 otherwise, nothing defined).
-- One definition of a name at a time: an engine lock no role can take from SQL (src/engine_locks.cpp).
CREATE OR REPLACE FUNCTION gd._lock_fsm_name(name text) RETURNS void
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_lock_fsm_name';

CREATE OR REPLACE FUNCTION @extschema@.gd_define_fsm(name text, initial text, queue text DEFAULT 'default',
                                          version int DEFAULT 1, state_defaults jsonb DEFAULT '{}',
                                          steps jsonb DEFAULT NULL, history boolean DEFAULT NULL,
                                          from_version int DEFAULT NULL, on_cancel text DEFAULT NULL)
RETURNS int LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

-- The first role to define a name owns the FSM; later versions keep that
-- owner, and only its members may define them.  A version defined again as
-- it is changes nothing; differently, only while it has no instances (they
-- would move, to another queue say): define a new version instead.  Whether
-- a version keeps a history is fixed when it is first defined.
CREATE OR REPLACE FUNCTION gd._define_fsm(name text, initial text, queue text, version int, state_defaults jsonb,
                                          steps jsonb, history boolean, from_version int, on_cancel text)
RETURNS int LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    caller oid := gd._caller();
    fsm_name text := _define_fsm.name;
    fsm_version int := _define_fsm.version;
    owner oid;
    defined gd._fsms;
    step_name text;
    options jsonb;
BEGIN
    PERFORM gd._check_not_empty(fsm_name, 'FSM name');
    PERFORM gd._check_length(fsm_name, 'FSM name'), gd._check_length(initial, 'initial step name');
    PERFORM gd._check_not_empty(initial, format('initial step of FSM %L', fsm_name));
    PERFORM gd._check_positive(fsm_version, format('version of FSM %L must be a positive integer', fsm_name));
    PERFORM gd._check_json(state_defaults, 'object', format('state_defaults of FSM %L must be a JSON object', fsm_name));
    PERFORM gd._check_queue_name(queue, format('FSM %L', fsm_name));
    IF on_cancel IS NOT NULL THEN
        PERFORM gd._check_not_empty(on_cancel, format('on_cancel step of FSM %L', fsm_name));
        PERFORM gd._check_length(on_cancel, 'on_cancel step name');
    END IF;
    -- One definition of a name at a time, so two roles cannot both take a new
    -- name (checked before too: a refused caller takes no lock).
    PERFORM gd._check_owns(caller, fsm_name);
    PERFORM gd._lock_fsm_name(fsm_name);
    PERFORM gd._check_owns(caller, fsm_name);
    owner := gd._fsm_owner(fsm_name);
    IF owner IS NULL THEN
        owner := caller;
        -- A new name: grants left by a definition deleted by hand are not inherited.
        DELETE FROM gd._grants g WHERE g.fsm = fsm_name;
    END IF;
    IF steps IS NOT NULL AND jsonb_typeof(steps) <> 'object' THEN
        PERFORM gd._bad_argument(format('steps of FSM %L must be a JSON object of step names to options, got %s',
                                        fsm_name, steps));
    END IF;
    IF from_version = fsm_version THEN
        PERFORM gd._bad_argument(format('from_version of FSM %L must be another version than %s', fsm_name,
                                        fsm_version));
    END IF;
    IF from_version IS NOT NULL THEN
        IF NOT EXISTS (SELECT FROM gd._fsms f WHERE f.name = fsm_name AND f.version = from_version) THEN
            RAISE EXCEPTION USING ERRCODE = 'undefined_object',
                MESSAGE = format('gen_durable: FSM %L has no version %s to define version %s from', fsm_name,
                                 from_version, fsm_version);
        END IF;
        steps := gd._steps_as_options(fsm_name, from_version) || coalesce(steps, '{}');
        on_cancel := coalesce(on_cancel, (SELECT f.on_cancel FROM gd._fsms f
                                            WHERE f.name = fsm_name AND f.version = from_version));
    END IF;
    SELECT * INTO defined FROM gd._fsms f WHERE f.name = fsm_name AND f.version = fsm_version;
    history := coalesce(history, defined.history, false);   -- left out: as it is
    IF FOUND AND defined.history <> history THEN
        PERFORM gd._bad_argument(
            format('FSM %L version %s is defined %s history: that cannot change', fsm_name, fsm_version,
                   CASE WHEN defined.history THEN 'with' ELSE 'without' END),
            format('Define version %s with history => %s instead.',
                   (SELECT max(f.version) + 1 FROM gd._fsms f WHERE f.name = fsm_name), history::text));
    END IF;
    IF FOUND AND (defined.initial_step, defined.queue, defined.state_defaults, defined.on_cancel)
                 IS DISTINCT FROM (initial, queue, state_defaults, on_cancel)
       AND EXISTS (SELECT FROM gd._instances i WHERE i.fsm = fsm_name AND i.version = fsm_version) THEN
        RAISE EXCEPTION USING ERRCODE = 'object_in_use',
            MESSAGE = format('gen_durable: FSM %L version %s has instances: it cannot be defined otherwise',
                             fsm_name, fsm_version),
            HINT = format('Define version %s instead: new instances take it, running ones keep theirs.',
                          (SELECT max(f.version) + 1 FROM gd._fsms f WHERE f.name = fsm_name));
    END IF;
    INSERT INTO gd._queues (name) VALUES (queue) ON CONFLICT DO NOTHING;
    INSERT INTO gd._fsms AS f (name, version, initial_step, queue, state_defaults, owner, history, on_cancel)
    VALUES (fsm_name, fsm_version, initial, queue, state_defaults, owner, history, on_cancel)
    ON CONFLICT ON CONSTRAINT _fsms_pkey DO UPDATE
       SET initial_step = excluded.initial_step, queue = excluded.queue, state_defaults = excluded.state_defaults,
           on_cancel = excluded.on_cancel
     WHERE (f.initial_step, f.queue, f.state_defaults, f.on_cancel)
           IS DISTINCT FROM (excluded.initial_step, excluded.queue, excluded.state_defaults, excluded.on_cancel);
    FOR step_name, options IN SELECT e.key, e.value FROM jsonb_each(steps) e ORDER BY e.key LOOP
        PERFORM gd._define_one_step(caller, fsm_name, fsm_version, step_name, options);
    END LOOP;
    IF on_cancel IS NOT NULL
       AND NOT EXISTS (SELECT FROM gd._steps s WHERE s.fsm = fsm_name AND s.version = fsm_version AND s.step = on_cancel)
    THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_object',
            MESSAGE = format('gen_durable: on_cancel step %L of FSM %L version %s is not one of its steps', on_cancel,
                             fsm_name, fsm_version),
            HINT = 'Name it in steps, or define the version again with on_cancel once gd_define_step has defined it.';
    END IF;
    RETURN fsm_version;
END $$;

-- The steps of an FSM version as gd_define_fsm's steps take them.
CREATE OR REPLACE FUNCTION gd._steps_as_options(fsm_name text, fsm_version int) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_object_agg(s.step, jsonb_strip_nulls(jsonb_build_object(
               'handler', s.handler, 'max_attempts', s.max_attempts, 'backoff', s.backoff,
               'max_backoff', s.max_backoff, 'timeout', s.timeout, 'rate_limit', s.rate_limit, 'queue', s.queue,
               'backoff_jitter', s.backoff_jitter, 'batch', nullif(s.batch, 1),
               'batch_wait', nullif(s.batch_wait, interval '0'), 'chain', nullif(s.chain, true)))), '{}')
      FROM gd._steps s WHERE s.fsm = fsm_name AND s.version = fsm_version
$$;

-- One step of gd_define_fsm's steps: its options as gd_define_step's arguments.
CREATE OR REPLACE FUNCTION gd._define_one_step(caller oid, fsm_name text, fsm_version int, step_name text, options jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    unknown text;
    handler regprocedure;
BEGIN
    IF jsonb_typeof(options) <> 'object' THEN
        PERFORM gd._bad_argument(format('the options of step %L must be a JSON object, got %s', step_name, options));
    END IF;
    SELECT string_agg(k, ', ') INTO unknown FROM jsonb_object_keys(options) k
     WHERE k NOT IN ('handler', 'max_attempts', 'backoff', 'max_backoff', 'timeout', 'rate_limit', 'queue',
                     'backoff_jitter', 'batch', 'batch_wait', 'chain');
    IF unknown IS NOT NULL THEN
        PERFORM gd._bad_argument(format('unknown option %s of step %L', unknown, step_name));
    END IF;
    IF options ? 'handler' AND jsonb_typeof(options->'handler') <> 'string' THEN
        PERFORM gd._bad_argument(format('the handler of step %L must be a function signature string, got %s',
                                        step_name, options->'handler'));
    END IF;
    BEGIN
        handler := options->>'handler';
    EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION USING ERRCODE = SQLSTATE,
            MESSAGE = format('gen_durable: the handler of step %L: %s', step_name, SQLERRM),
            HINT = 'Name the handler with its schema, as in shop.reserve(jsonb, gd.context): the engine resolves no name through search_path.';
    END;
    PERFORM gd._define_step_as(caller, fsm_name, step_name, handler,
                               gd._entry_int(options, 'max_attempts', 3),
                               coalesce(gd._entry_cast(options, 'backoff', NULL::interval), '1s'),
                               coalesce(gd._entry_cast(options, 'max_backoff', NULL::interval), '5m'),
                               gd._entry_cast(options, 'timeout', NULL::interval), fsm_version, options->>'rate_limit',
                               options->>'queue', gd._entry_bool(options, 'backoff_jitter', true),
                               gd._entry_int(options, 'batch', 1),
                               coalesce(gd._entry_cast(options, 'batch_wait', NULL::interval), '0'),
                               gd._entry_bool(options, 'chain', true));
END $$;

CREATE OR REPLACE FUNCTION @extschema@.gd_define_step(fsm text, step text, handler regprocedure DEFAULT NULL,
                                           max_attempts int DEFAULT 3, backoff interval DEFAULT '1s',
                                           max_backoff interval DEFAULT '5m', timeout interval DEFAULT NULL,
                                           version int DEFAULT NULL, rate_limit text DEFAULT NULL,
                                           queue text DEFAULT NULL, backoff_jitter boolean DEFAULT true,
                                           batch int DEFAULT 1, batch_wait interval DEFAULT '0',
                                           chain boolean DEFAULT true)
RETURNS void LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._define_step_as(caller oid, fsm text, step text, handler regprocedure, max_attempts int,
                                   backoff interval, max_backoff interval, timeout interval, version int,
                                   rate_limit text, queue text, backoff_jitter boolean, batch int,
                                   batch_wait interval, chain boolean)
RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    fsm_row gd._fsms;
    previous gd._steps;
BEGIN
    IF version IS NULL THEN
        fsm_row := gd._newest_fsm(fsm);
    ELSE
        SELECT * INTO fsm_row FROM gd._fsms f WHERE f.name = _define_step_as.fsm AND f.version = _define_step_as.version;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'undefined_object',
                MESSAGE = format('gen_durable: unknown FSM %L version %s', fsm, version);
        END IF;
    END IF;
    PERFORM gd._check_owns(caller, fsm_row.name), gd._check_length(step, 'step name');
    PERFORM gd._check_not_empty(step, format('step name of FSM %L', fsm));
    PERFORM gd._check_positive(max_attempts, format('max_attempts of step %L must be at least 1', step));
    IF backoff IS NULL OR backoff < interval '0' OR max_backoff IS NULL OR max_backoff < interval '0' THEN
        PERFORM gd._bad_argument(format('backoff and max_backoff of step %L must be non-negative intervals', step));
    END IF;
    PERFORM gd._check_interval(backoff, 'backoff'), gd._check_interval(max_backoff, 'max_backoff'),
            gd._check_interval(timeout, 'timeout');
    IF backoff_jitter IS NULL THEN
        PERFORM gd._bad_argument(format('backoff_jitter of step %L must be true or false, got NULL', step));
    END IF;
    IF chain IS NULL THEN
        PERFORM gd._bad_argument(format('chain of step %L must be true or false, got NULL', step));
    END IF;
    IF timeout < interval '1 millisecond' THEN
        PERFORM gd._bad_argument(format('timeout of step %L must be at least 1 millisecond, got %s', step, timeout));
    END IF;
    IF batch IS NULL OR batch NOT BETWEEN 1 AND 1000 THEN
        PERFORM gd._bad_argument(format('batch of step %L must be from 1 to 1000, got %s', step,
                                        coalesce(batch::text, 'NULL')));
    END IF;
    IF batch_wait IS NULL OR batch_wait < interval '0' OR batch_wait > interval '1 hour' THEN
        PERFORM gd._bad_argument(format('batch_wait of step %L must be from 0 to 1 hour, got %s', step,
                                        coalesce(batch_wait::text, 'NULL')));
    END IF;
    IF handler IS NOT NULL THEN
        PERFORM gd._check_handler(handler, step, fsm_row.owner, batch > 1);
    END IF;
    IF rate_limit IS NOT NULL THEN
        IF position(':' IN rate_limit) > 0 THEN
            PERFORM gd._bad_argument(format('rate_limit of step %L must name a limit, without a partition, got %L',
                                            step, rate_limit));
        END IF;
        PERFORM gd._rate_policy(gd._check_limit_name(rate_limit));
    END IF;
    IF queue IS NOT NULL THEN
        PERFORM gd._check_queue_name(queue, format('step %L', step));
        INSERT INTO gd._queues (name) VALUES (queue) ON CONFLICT DO NOTHING;
    END IF;
    SELECT * INTO previous FROM gd._steps s
     WHERE s.fsm = fsm_row.name AND s.version = fsm_row.version AND s.step = _define_step_as.step;
    INSERT INTO gd._steps AS s (fsm, version, step, handler, max_attempts, backoff, max_backoff, timeout, rate_limit,
                                queue, backoff_jitter, batch, batch_wait, chain)
    VALUES (fsm_row.name, fsm_row.version, step, handler::text, max_attempts, backoff, max_backoff, timeout, rate_limit,
            queue, backoff_jitter, batch, batch_wait, chain)
    ON CONFLICT ON CONSTRAINT _steps_pkey DO UPDATE
       SET handler = excluded.handler, max_attempts = excluded.max_attempts, backoff = excluded.backoff,
           max_backoff = excluded.max_backoff, timeout = excluded.timeout, rate_limit = excluded.rate_limit,
           queue = excluded.queue, backoff_jitter = excluded.backoff_jitter, batch = excluded.batch,
           batch_wait = excluded.batch_wait, chain = excluded.chain;
    IF previous.step IS NOT NULL AND previous.queue IS DISTINCT FROM queue THEN
        PERFORM gd._move_step(fsm_row.name, fsm_row.version, step, queue);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION gd._define_step(fsm text, step text, handler regprocedure, max_attempts int, backoff interval,
                                max_backoff interval, timeout interval, version int, rate_limit text, queue text,
                                backoff_jitter boolean, batch int, batch_wait interval, chain boolean)
RETURNS void LANGUAGE sql AS $$
    SELECT gd._define_step_as(gd._caller(), fsm, step, handler, max_attempts, backoff, max_backoff, timeout, version,
                              rate_limit, queue, backoff_jitter, batch, batch_wait, chain)
$$;

-- A handler is a plain function f(state jsonb, ctx gd.context) RETURNS
-- gd.outcome (no set, aggregate, window function or procedure) that the
-- FSM's owner may execute; the handler of a batch step (batch > 1),
-- f(states jsonb[], ctxs gd.context[]) RETURNS gd.outcome[].  The executors
-- check it again before every call (src/handler_call.cpp).
CREATE OR REPLACE FUNCTION gd._check_handler(handler regprocedure, step text, owner oid, batched boolean)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    proc pg_proc;
BEGIN
    SELECT * INTO proc FROM pg_proc p WHERE p.oid = handler;
    IF NOT FOUND OR handler = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_function',
            MESSAGE = format('gen_durable: handler %s of step %L is not a function', handler::oid, step);
    END IF;
    IF proc.prokind <> 'f' THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_function',
            MESSAGE = format('gen_durable: handler %s of step %L must be a plain function, not %s', handler, step,
                             CASE proc.prokind WHEN 'a' THEN 'an aggregate' WHEN 'w' THEN 'a window function'
                                               ELSE 'a procedure' END);
    END IF;
    IF NOT batched AND proc.pronargs = 2 AND proc.proargtypes[0] = 'jsonb[]'::regtype
       AND proc.proargtypes[1] = 'gd.context[]'::regtype THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_function',
            MESSAGE = format('gen_durable: handler %s of step %L must take (state jsonb, ctx gd.context)',
                             handler, step),
            HINT = 'A handler of (states jsonb[], ctxs gd.context[]) is a batch step''s: define the step with batch => 2 or more.';
    END IF;
    IF NOT batched AND NOT (proc.pronargs = 2 AND proc.proargtypes[0] = 'jsonb'::regtype
                            AND proc.proargtypes[1] = 'gd.context'::regtype) THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_function',
            MESSAGE = format('gen_durable: handler %s of step %L must take (state jsonb, ctx gd.context)',
                             handler, step);
    END IF;
    IF batched AND NOT (proc.pronargs = 2 AND proc.proargtypes[0] = 'jsonb[]'::regtype
                        AND proc.proargtypes[1] = 'gd.context[]'::regtype) THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_function',
            MESSAGE = format('gen_durable: handler %s of batch step %L must take (states jsonb[], ctxs gd.context[])',
                             handler, step);
    END IF;
    IF NOT batched AND (proc.prorettype <> 'gd.outcome'::regtype OR proc.proretset) THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_function_definition',
            MESSAGE = format('gen_durable: handler %s of step %L must return gd.outcome, not %s%s', handler, step,
                             CASE WHEN proc.proretset THEN 'SETOF ' ELSE '' END, proc.prorettype::regtype);
    END IF;
    IF batched AND (proc.prorettype <> 'gd.outcome[]'::regtype OR proc.proretset) THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_function_definition',
            MESSAGE = format('gen_durable: handler %s of batch step %L must return gd.outcome[], not %s%s', handler,
                             step, CASE WHEN proc.proretset THEN 'SETOF ' ELSE '' END, proc.prorettype::regtype);
    END IF;
    -- What a call by name needs: the schema's USAGE as well as EXECUTE (an OID reaches past the schema).
    IF NOT has_function_privilege(owner, handler, 'EXECUTE')
       OR NOT has_schema_privilege(owner, proc.pronamespace, 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('gen_durable: role %s, which handlers of step %L run as, may not execute %s',
                             owner::regrole, step, handler),
            DETAIL = format('It needs EXECUTE on the function and USAGE on schema %s.', proc.pronamespace::regnamespace);
    END IF;
END $$;

-- A function a step names as its handler (by its signature: see gd._steps)
-- cannot be dropped on its own by the FSM's owner (an event trigger, through a door so it may read the
-- steps whoever drops): it would fail the FSM's instances.  Another role
-- dropping its own function is not held back by a step of someone else's
-- naming it.  A drop of something it belongs to (DROP SCHEMA ... CASCADE,
-- DROP OWNED) takes it along; the step's instances then fail at once
-- (src/handler_call.cpp).
CREATE OR REPLACE FUNCTION gd.refuse_handler_drop() RETURNS event_trigger LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._refuse_handler_drop() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
    named record;
BEGIN
    -- The dropped function's signature as gd._steps keeps it: its name, and its
    -- argument types as regtype prints them under the door's search_path.
    SELECT d.object_identity, s.fsm, s.version, s.step INTO named
      FROM pg_event_trigger_dropped_objects() d
      JOIN gd._steps s ON s.handler = format('%s(%s)', quote_ident(d.address_names[1]) || '.' || quote_ident(d.address_names[2]),
                                             (SELECT string_agg(a::regtype::text, ',' ORDER BY n)
                                                FROM unnest(d.address_args) WITH ORDINALITY AS t(a, n)))
      JOIN gd._fsms f ON f.name = s.fsm AND f.version = s.version
     WHERE d.classid = 'pg_proc'::regclass AND d.original AND tg_tag IN ('DROP FUNCTION', 'DROP ROUTINE')
       AND pg_has_role(gd._caller(), f.owner, 'MEMBER')
     ORDER BY s.fsm, s.version, s.step LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'dependent_objects_still_exist',
            MESSAGE = format('gen_durable: cannot drop function %s: it is the handler of step %L of FSM %L version %s',
                             named.object_identity, named.step, named.fsm, named.version),
            HINT = 'Define the step with another handler first (gd_define_step).';
    END IF;
END $$;
DROP EVENT TRIGGER IF EXISTS gd_refuse_handler_drop;   -- (an update defines it again)
CREATE EVENT TRIGGER gd_refuse_handler_drop ON sql_drop EXECUTE FUNCTION gd.refuse_handler_drop();

-- ---------------------------------------------------------------------------
-- Outcome constructors (what a handler returns); gd_next, gd_retry,
-- gd_wait_signal and gd_spawn check their arguments in src/outcomes.cpp
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION @extschema@.gd_next(step text, state jsonb DEFAULT NULL, delay interval DEFAULT NULL)
RETURNS gd.outcome LANGUAGE c IMMUTABLE AS 'MODULE_PATHNAME', 'gd_next';

CREATE OR REPLACE FUNCTION @extschema@.gd_retry(error jsonb, backoff interval DEFAULT NULL)
RETURNS gd.outcome LANGUAGE c IMMUTABLE AS 'MODULE_PATHNAME', 'gd_retry_outcome';

CREATE OR REPLACE FUNCTION @extschema@.gd_wait_signal(names text[], timeout interval DEFAULT NULL, then_step text DEFAULT NULL,
                                           state jsonb DEFAULT NULL)
RETURNS gd.outcome LANGUAGE c IMMUTABLE AS 'MODULE_PATHNAME', 'gd_wait_signal';

CREATE OR REPLACE FUNCTION @extschema@.gd_spawn(children jsonb, then_step text, state jsonb DEFAULT NULL)
RETURNS gd.outcome LANGUAGE c IMMUTABLE AS 'MODULE_PATHNAME', 'gd_spawn';

CREATE OR REPLACE FUNCTION @extschema@.gd_done(result jsonb DEFAULT '{}')
RETURNS gd.outcome LANGUAGE sql IMMUTABLE
AS $$ SELECT ROW('done', NULL, NULL, NULL, NULL, NULL, coalesce(result, '{}'), NULL, NULL, NULL)::gd.outcome $$;

CREATE OR REPLACE FUNCTION @extschema@.gd_stop(error jsonb)
RETURNS gd.outcome LANGUAGE sql IMMUTABLE
AS $$ SELECT ROW('stop', NULL, NULL, NULL, coalesce(error, '{}'), NULL, NULL, NULL, NULL, NULL)::gd.outcome $$;

-- An outcome from its JSON form, as workers outside the database send it:
-- the constructor's name as "kind" and its arguments by name, intervals as
-- text ({"kind": "next", "step": "charge", "delay": "5 seconds"},
-- {"kind": "wait_signal", "names": ["paid"], "then_step": "ship"}, ...).
CREATE OR REPLACE FUNCTION @extschema@.gd_outcome(outcome jsonb) RETURNS gd.outcome
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    CASE outcome->>'kind'
    WHEN 'next' THEN
        RETURN @extschema@.gd_next(outcome->>'step', outcome->'state', (outcome->>'delay')::interval);
    WHEN 'retry' THEN
        RETURN @extschema@.gd_retry(coalesce(outcome->'error', '{}'), (outcome->>'backoff')::interval);
    WHEN 'wait_signal' THEN
        RETURN @extschema@.gd_wait_signal(ARRAY(SELECT jsonb_array_elements_text(outcome->'names')),
                                          (outcome->>'timeout')::interval, outcome->>'then_step', outcome->'state');
    WHEN 'spawn' THEN
        RETURN @extschema@.gd_spawn(outcome->'children', outcome->>'then_step', outcome->'state');
    WHEN 'done' THEN
        RETURN @extschema@.gd_done(coalesce(outcome->'result', '{}'));
    WHEN 'stop' THEN
        RETURN @extschema@.gd_stop(coalesce(outcome->'error', '{}'));
    ELSE
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('gen_durable: an outcome''s kind is next, retry, wait_signal, spawn, done or stop, got %s',
                             coalesce(outcome::text, 'NULL'));
    END CASE;
END $$;
