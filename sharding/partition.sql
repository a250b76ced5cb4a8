-- A partition of a sharded gen_durable (sharding/README.md): run in each
-- partition database, after CREATE EXTENSION gen_durable, with
--   psql -v partition=P -v partitions=N -f sharding/partition.sql
-- (N a power of two, 0 <= P < N).  Instance ids then encode the partition:
-- id % N = P, so the router sends every id-addressed call to exactly one
-- partition with no lookup table.  Idempotent: run it again after a restore
-- (pg_dump keeps a sequence's position, not its increment).
\set ON_ERROR_STOP on
SET client_min_messages = warning;
BEGIN;
-- Nothing here resolves through the search_path of the role running it: a
-- schema named after that role, first on its default search_path, could be
-- another role's (one that may create schemas in this database).
SET LOCAL search_path = '';
SELECT pg_catalog.set_config('gd_sharding.partition', :'partition', true),
       pg_catalog.set_config('gd_sharding.partitions', :'partitions', true) \gset
-- The extension's API schema, where apply_definitions finds the API.
SELECT e.extnamespace::pg_catalog.regnamespace AS api FROM pg_catalog.pg_extension e
 WHERE e.extname = 'gen_durable' \gset
DO $$
DECLARE
    p int := current_setting('gd_sharding.partition')::int;
    n int := current_setting('gd_sharding.partitions')::int;
    next_id bigint;
BEGIN
    IF n < 1 OR n & (n - 1) <> 0 OR p < 0 OR p >= n THEN
        RAISE EXCEPTION 'gen_durable sharding: partitions must be a power of two and 0 <= partition < partitions, got % of %', p, n;
    END IF;
    -- the next id of this partition above every id already there
    SELECT (coalesce(max(id), 0) / n + 1) * n + p INTO next_id FROM gd._instances;
    EXECUTE format('ALTER SEQUENCE gd._instances_id_seq INCREMENT BY %s RESTART WITH %s', n, next_id);
END $$;

-- What the router's gd_router.copy_definitions() uses to give a partition
-- created later (or restored empty) another partition's definitions:
-- gd_sharding.definitions() describes them, gd_sharding.apply_definitions()
-- makes them here, each FSM as its owner (who must exist on this server).
-- (A gd_sharding schema another role made first would let that role
-- replace what the router's administrator runs here.)
DO $$
DECLARE
    owner name := (SELECT r.rolname FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner
                    WHERE n.nspname = 'gd_sharding' AND r.rolname <> current_user AND NOT r.rolsuper);
BEGIN
    IF owner IS NOT NULL THEN
        RAISE EXCEPTION 'gen_durable sharding: schema gd_sharding belongs to %, neither you nor a superuser', owner;
    END IF;
END $$;
CREATE SCHEMA IF NOT EXISTS gd_sharding;
-- (search_path pg_catalog: a handler's name comes out with its schema, a
-- role's quoted where it must be.)
CREATE OR REPLACE FUNCTION gd_sharding.definitions() RETURNS jsonb LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT jsonb_build_object(
        'fsms', coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'name', f.name, 'initial', f.initial_step, 'queue', f.queue, 'version', f.version,
                    'state_defaults', f.state_defaults, 'history', f.history, 'owner', f.owner::text,
                    'on_cancel', f.on_cancel,
                    'steps', coalesce((SELECT jsonb_object_agg(s.step, jsonb_strip_nulls(jsonb_build_object(
                                  'handler', s.handler::text, 'max_attempts', s.max_attempts,
                                  'backoff', s.backoff, 'max_backoff', s.max_backoff, 'timeout', s.timeout,
                                  'rate_limit', s.rate_limit, 'queue', s.queue,
                                  'backoff_jitter', s.backoff_jitter, 'batch', nullif(s.batch, 1),
                                  'batch_wait', nullif(s.batch_wait, interval '0'),
                                  'chain', nullif(s.chain, true))))
                                FROM gd.steps s WHERE s.fsm = f.name AND s.version = f.version), '{}'))
                    ORDER BY f.name, f.version) FROM gd.fsms f), '[]'),
        'grants', coalesce((SELECT jsonb_agg(jsonb_build_object('fsm', g.fsm, 'role', g.role::text,
                                                                'accepted', g.accepted)) FROM gd.grants g), '[]'),
        'rate_limits', coalesce((SELECT jsonb_agg(to_jsonb(l)) FROM gd.rate_limits l), '[]'),
        'concurrency_limits', coalesce((SELECT jsonb_agg(to_jsonb(l)) FROM gd.concurrency_limits l), '[]'),
        'owner_weights', coalesce((SELECT jsonb_agg(jsonb_build_object('owner', w.owner::text, 'weight', w.weight))
                                     FROM gd.owner_weights w), '[]'))
$$;
-- Each FSM is defined as its owner.  Each grant is made as the FSM's owner
-- makes it (so not accepted, unless to one of the owner's own roles), then
-- accepted if it was on the source partition.  (A role is set as regrole
-- writes it, quoted where it must be.  search_path pinned: the API is found
-- in the extension's schema, nothing in a schema a tenant could create.)
CREATE OR REPLACE FUNCTION gd_sharding.apply_definitions(definitions jsonb) RETURNS int LANGUAGE plpgsql
SET search_path = pg_catalog, :api, pg_temp AS $$
DECLARE
    item jsonb;
    applied int := 0;
BEGIN
    FOR item IN SELECT jsonb_array_elements(definitions->'fsms') LOOP
        EXECUTE format('SET LOCAL ROLE %s', (item->>'owner')::regrole);
        PERFORM gd_define_fsm(item->>'name', item->>'initial', item->>'queue', (item->>'version')::int,
                              item->'state_defaults', item->'steps', (item->>'history')::boolean,
                              (item->>'from_version')::int, item->>'on_cancel');
        RESET ROLE;
        applied := applied + 1;
    END LOOP;
    FOR item IN SELECT jsonb_array_elements(definitions->'rate_limits') LOOP
        PERFORM gd_set_rate_limit(item->>'name', (item->>'rate')::int, (item->>'per')::interval,
                                  (item->>'burst')::int, (item->>'shared')::boolean);
    END LOOP;
    FOR item IN SELECT jsonb_array_elements(definitions->'concurrency_limits') LOOP
        PERFORM gd_set_concurrency_limit(item->>'name', (item->>'max')::int, (item->>'shared')::boolean,
                                         coalesce(item->>'scope', 'step'));
    END LOOP;
    FOR item IN SELECT jsonb_array_elements(coalesce(definitions->'owner_weights', '[]')) LOOP
        PERFORM gd_set_owner_weight((item->>'owner')::regrole, (item->>'weight')::int);
    END LOOP;
    FOR item IN SELECT jsonb_array_elements(definitions->'grants') LOOP
        EXECUTE format('SET LOCAL ROLE %s', (SELECT f.owner FROM gd.fsms f WHERE f.name = item->>'fsm' LIMIT 1));
        PERFORM gd_grant(item->>'fsm', (item->>'role')::regrole);
        RESET ROLE;
        IF (item->>'accepted')::boolean THEN
            PERFORM gd_accept_grant(item->>'fsm', (item->>'role')::regrole);
        END IF;
    END LOOP;
    RETURN applied;
END $$;
-- For the router's mapped user (a superuser or the engine's owner) only.
REVOKE ALL ON FUNCTION gd_sharding.definitions(), gd_sharding.apply_definitions(jsonb) FROM PUBLIC;
COMMIT;
