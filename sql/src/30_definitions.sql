-- ---------------------------------------------------------------------------
-- Defining FSMs
-- ---------------------------------------------------------------------------

CREATE FUNCTION @extschema@.gd_define_fsm(name text, initial text, queue text DEFAULT 'default',
                                          version int DEFAULT 1, state_defaults jsonb DEFAULT '{}')
RETURNS int LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    fsm_name text := gd_define_fsm.name;
    fsm_version int := gd_define_fsm.version;
BEGIN
    IF fsm_name IS NULL OR fsm_name = '' THEN
        PERFORM gd._bad_argument('FSM name must not be empty');
    END IF;
    PERFORM gd._check_length(fsm_name, 'FSM name'), gd._check_length(initial, 'initial step name');
    IF initial IS NULL OR initial = '' THEN
        PERFORM gd._bad_argument(format('initial step of FSM %L must not be empty', fsm_name));
    END IF;
    IF fsm_version IS NULL OR fsm_version < 1 THEN
        PERFORM gd._bad_argument(format('version of FSM %L must be a positive integer, got %s',
                                        fsm_name, coalesce(fsm_version::text, 'NULL')));
    END IF;
    IF state_defaults IS NULL OR jsonb_typeof(state_defaults) <> 'object' THEN
        PERFORM gd._bad_argument(format('state_defaults of FSM %L must be a JSON object, got %s',
                                        fsm_name, coalesce(state_defaults::text, 'NULL')));
    END IF;
    IF queue IS NULL OR queue = '' OR length(queue) > 63 THEN
        PERFORM gd._bad_argument(format('queue of FSM %L must be a name of 1 to 63 bytes', fsm_name));
    END IF;
    PERFORM gd._check_owns(fsm_name);
    INSERT INTO gd.queues (name) VALUES (queue) ON CONFLICT DO NOTHING;
    INSERT INTO gd.fsms AS f (name, version, initial_step, queue, state_defaults, owner)
    VALUES (fsm_name, fsm_version, initial, queue, state_defaults, current_user::regrole)
    ON CONFLICT ON CONSTRAINT fsms_pkey DO UPDATE
       SET initial_step = excluded.initial_step, queue = excluded.queue,
           state_defaults = excluded.state_defaults, owner = excluded.owner;
    RETURN fsm_version;
END $$;

CREATE FUNCTION @extschema@.gd_define_step(fsm text, step text, handler regprocedure DEFAULT NULL,
                                           max_attempts int DEFAULT 3, backoff interval DEFAULT '1s',
                                           max_backoff interval DEFAULT '5m', timeout interval DEFAULT NULL,
                                           version int DEFAULT NULL, rate_limit text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    fsm_row gd.fsms;
    takes_state_and_context boolean;
    handler_result oid;
BEGIN
    IF version IS NULL THEN
        fsm_row := gd._newest_fsm(fsm);
    ELSE
        SELECT * INTO fsm_row FROM gd.fsms f WHERE f.name = gd_define_step.fsm AND f.version = gd_define_step.version;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'undefined_object',
                MESSAGE = format('gen_durable: unknown FSM %L version %s', fsm, version);
        END IF;
    END IF;
    PERFORM gd._check_owns(fsm_row.name), gd._check_length(step, 'step name');
    IF step IS NULL OR step = '' THEN
        PERFORM gd._bad_argument(format('step name of FSM %L must not be empty', fsm));
    END IF;
    IF max_attempts IS NULL OR max_attempts < 1 THEN
        PERFORM gd._bad_argument(format('max_attempts of step %L must be at least 1, got %s',
                                        step, coalesce(max_attempts::text, 'NULL')));
    END IF;
    IF backoff IS NULL OR backoff < interval '0' OR max_backoff IS NULL OR max_backoff < interval '0' THEN
        PERFORM gd._bad_argument(format('backoff and max_backoff of step %L must be non-negative intervals', step));
    END IF;
    PERFORM gd._check_interval(backoff, 'backoff'), gd._check_interval(max_backoff, 'max_backoff'),
            gd._check_interval(timeout, 'timeout');
    IF timeout <= interval '0' THEN
        PERFORM gd._bad_argument(format('timeout of step %L must be positive, got %s', step, timeout));
    END IF;
    IF handler IS NOT NULL THEN
        SELECT p.pronargs = 2 AND p.proargtypes[0] = 'jsonb'::regtype AND p.proargtypes[1] = 'gd.context'::regtype,
               p.prorettype
          INTO takes_state_and_context, handler_result
          FROM pg_proc p WHERE p.oid = handler;
        IF NOT FOUND OR handler = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'undefined_function',
                MESSAGE = format('gen_durable: handler %s of step %L is not a function', handler::oid, step);
        END IF;
        IF NOT takes_state_and_context THEN
            RAISE EXCEPTION USING ERRCODE = 'undefined_function',
                MESSAGE = format('gen_durable: handler %s of step %L must take (state jsonb, ctx gd.context)',
                                 handler, step);
        END IF;
        IF handler_result <> 'gd.outcome'::regtype THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_function_definition',
                MESSAGE = format('gen_durable: handler %s of step %L must return gd.outcome, not %s',
                                 handler, step, handler_result::regtype);
        END IF;
    END IF;
    IF rate_limit IS NOT NULL THEN
        IF position(':' IN rate_limit) > 0 THEN
            PERFORM gd._bad_argument(format('rate_limit of step %L must name a limit, without a partition, got %L',
                                            step, rate_limit));
        END IF;
        PERFORM gd._rate_policy(rate_limit);
    END IF;
    INSERT INTO gd.steps AS s (fsm, version, step, handler, max_attempts, backoff, max_backoff, timeout, rate_limit)
    VALUES (fsm_row.name, fsm_row.version, step, handler, max_attempts, backoff, max_backoff, timeout, rate_limit)
    ON CONFLICT ON CONSTRAINT steps_pkey DO UPDATE
       SET handler = excluded.handler, max_attempts = excluded.max_attempts, backoff = excluded.backoff,
           max_backoff = excluded.max_backoff, timeout = excluded.timeout, rate_limit = excluded.rate_limit;
END $$;

-- ---------------------------------------------------------------------------
-- Outcome constructors (what a handler returns)
-- ---------------------------------------------------------------------------

CREATE FUNCTION @extschema@.gd_next(step text, state jsonb DEFAULT NULL, delay interval DEFAULT NULL)
RETURNS gd.outcome LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF step IS NULL OR step = '' THEN
        PERFORM gd._bad_argument('gd_next needs a step');
    END IF;
    IF state IS NOT NULL AND jsonb_typeof(state) <> 'object' THEN
        PERFORM gd._bad_argument(format('state must be a JSON object, got %s', state));
    END IF;
    RETURN ROW('next', step, state, gd._check_interval(delay, 'delay'),
               NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome;
END $$;

CREATE FUNCTION @extschema@.gd_retry(error jsonb, backoff interval DEFAULT NULL)
RETURNS gd.outcome LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN ROW('retry', NULL, NULL, NULL, coalesce(error, '{}'), gd._check_interval(backoff, 'backoff'),
               NULL, NULL, NULL, NULL)::gd.outcome;
END $$;

CREATE FUNCTION @extschema@.gd_wait_signal(names text[], timeout interval DEFAULT NULL, then_step text DEFAULT NULL,
                                           state jsonb DEFAULT NULL)
RETURNS gd.outcome LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF names IS NULL OR cardinality(names) = 0 OR array_ndims(names) <> 1 OR array_position(names, NULL) IS NOT NULL
       OR array_position(names, '') IS NOT NULL THEN
        PERFORM gd._bad_argument(format('gd_wait_signal needs signal names, got %s', coalesce(names::text, 'NULL')));
    END IF;
    IF state IS NOT NULL AND jsonb_typeof(state) <> 'object' THEN
        PERFORM gd._bad_argument(format('state must be a JSON object, got %s', state));
    END IF;
    RETURN ROW('await', then_step, state, NULL, NULL, NULL, NULL, names, gd._check_interval(timeout, 'timeout'),
               NULL)::gd.outcome;
END $$;

CREATE FUNCTION @extschema@.gd_spawn(children jsonb, then_step text, state jsonb DEFAULT NULL)
RETURNS gd.outcome LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF children IS NULL OR jsonb_typeof(children) <> 'array' THEN
        PERFORM gd._bad_argument(format('gd_spawn needs a JSON array of insert options, got %s',
                                        coalesce(children::text, 'NULL')));
    END IF;
    IF then_step IS NULL OR then_step = '' THEN
        PERFORM gd._bad_argument('gd_spawn needs a then_step');
    END IF;
    IF state IS NOT NULL AND jsonb_typeof(state) <> 'object' THEN
        PERFORM gd._bad_argument(format('state must be a JSON object, got %s', state));
    END IF;
    RETURN ROW('schedule_childs', then_step, state, NULL, NULL, NULL, NULL, NULL, NULL, children)::gd.outcome;
END $$;

CREATE FUNCTION @extschema@.gd_done(result jsonb DEFAULT '{}')
RETURNS gd.outcome LANGUAGE sql IMMUTABLE
AS $$ SELECT ROW('done', NULL, NULL, NULL, NULL, NULL, coalesce(result, '{}'), NULL, NULL, NULL)::gd.outcome $$;

CREATE FUNCTION @extschema@.gd_stop(error jsonb)
RETURNS gd.outcome LANGUAGE sql IMMUTABLE
AS $$ SELECT ROW('stop', NULL, NULL, NULL, coalesce(error, '{}'), NULL, NULL, NULL, NULL, NULL)::gd.outcome $$;
