-- The router of a sharded gen_durable (sharding/README.md): run in the router
-- database, after CREATE EXTENSION plproxy and the cluster's definition
-- (CREATE SERVER gd_partitions FOREIGN DATA WRAPPER plproxy OPTIONS (p0 ...,
-- p1 ...); CREATE USER MAPPING ... SERVER gd_partitions), with
--   psql -v api_schema=S -f sharding/router.sql
-- S is the API schema: the schema CREATE EXTENSION gen_durable put the gd_*
-- functions in on the partitions (default public), and where the router's
-- are made here.  It defines the API users call, with the engine's names
-- and signatures, over PL/Proxy functions (gd_router.*): an instance goes to
-- the partition its correlation key (else its limit key) hashes to
-- (hashtext, as PL/Proxy takes it modulo the partition count), or to one
-- chosen at random without a key; an id names its partition (id % N: see
-- partition.sql); definitions, grants and limits go to every partition.  A
-- partition's error reaches the caller as the engine raised it.
--
-- No name resolves through a caller's search_path: a role that may create
-- schemas on a partition could make one named after another role, first on
-- that role's default search_path ("$user", public), and have its own
-- gd_signal run as that role.  So every call a partition receives names the
-- API schema or pg_catalog, and the router's functions qualify their names
-- or pin their search_path.
\set ON_ERROR_STOP on
\if :{?api_schema}
\else
    \set api_schema public
\endif
BEGIN;
SET LOCAL search_path = '';
-- (No notice that a DROP ... IF EXISTS below found nothing to drop.)
SET LOCAL client_min_messages = warning;

-- A gd_router schema another role made first would let that role replace
-- what is made in it.
DO $$
DECLARE
    owner name := (SELECT r.rolname FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner
                    WHERE n.nspname = 'gd_router' AND r.rolname <> current_user AND NOT r.rolsuper);
BEGIN
    IF owner IS NOT NULL THEN
        RAISE EXCEPTION 'gen_durable sharding: schema gd_router belongs to %, neither you nor a superuser', owner;
    END IF;
END $$;
CREATE SCHEMA IF NOT EXISTS gd_router;

-- Where an instance with this key lives, or a partition at random for none.
-- An instance's key is its correlation key, else its concurrency key, else
-- its rate limit key: the instances that share a limit key and no
-- correlation key share a partition, where the limit holds for all of them.
-- (Here and below, names are qualified where a function's search_path is
-- not pinned: the caller's would resolve them.)
CREATE OR REPLACE FUNCTION gd_router.partition_for(key text) RETURNS int LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN key IS NULL THEN (pg_catalog.random() OPERATOR(pg_catalog.*) 2147483646)::int
                ELSE pg_catalog.hashtext(key) END
$$;
-- The partition an id was made on (its low bits: PL/Proxy keeps those under the partition count).
CREATE OR REPLACE FUNCTION gd_router.partition_of(id bigint) RETURNS int LANGUAGE sql IMMUTABLE AS $$
    SELECT (id OPERATOR(pg_catalog.&) 2147483647)::int
$$;
-- How many partitions the cluster has: its server's pN options (read here,
-- with no call to any partition, so a server that is down stops only the
-- calls that go to it).
CREATE OR REPLACE FUNCTION gd_router.partition_count() RETURNS int LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.count(*)::int FROM pg_catalog.pg_foreign_server s, pg_catalog.unnest(s.srvoptions) o
     WHERE s.srvname OPERATOR(pg_catalog.=) 'gd_partitions' AND o OPERATOR(pg_catalog.~) '^p[0-9]+='
$$;

-- Signatures an earlier router.sql made that the ones below replace: left
-- beside them, they would make a call that leaves out the new arguments
-- ambiguous.  (gd_define_step and its PL/Proxy function before
-- backoff_jitter, before batch, and before chain.)  And results an earlier one returned that have grown: a
-- function's result cannot change in place (queue_stats_all before held,
-- with the view over it, made again below).
DROP FUNCTION IF EXISTS gd_router.queue_stats_all() CASCADE;
-- (gd_define_fsm and its PL/Proxy function before from_version, and before on_cancel.)
DROP FUNCTION IF EXISTS gd_router.define_fsm_all(text, text, text, int, jsonb, jsonb, boolean),
                        gd_router.define_fsm_all(text, text, text, int, jsonb, jsonb, boolean, int);
SELECT pg_catalog.format('DROP FUNCTION IF EXISTS %1$I.gd_define_fsm(text, text, text, int, jsonb, jsonb, boolean), '
                         '%1$I.gd_define_fsm(text, text, text, int, jsonb, jsonb, boolean, int)', :'api_schema') \gexec
-- (gd_signal and its PL/Proxy functions before expires.)
DROP FUNCTION IF EXISTS gd_router.signal(bigint, text, jsonb, text, boolean), gd_router.signal(text, text, jsonb, text, boolean);
SELECT pg_catalog.format('DROP FUNCTION IF EXISTS %1$I.gd_signal(bigint, text, jsonb, text, boolean), '
                         '%1$I.gd_signal(text, text, jsonb, text, boolean)', :'api_schema') \gexec
DROP FUNCTION IF EXISTS gd_router.define_step_all(text, text, text, int, interval, interval, interval, int, text, text);
SELECT pg_catalog.format('DROP FUNCTION IF EXISTS %I.gd_define_step(text, text, text, int, interval, interval, interval, '
                         'int, text, text)', :'api_schema') \gexec
DROP FUNCTION IF EXISTS gd_router.define_step_all(text, text, text, int, interval, interval, interval, int, text, text,
                                                  boolean);
SELECT pg_catalog.format('DROP FUNCTION IF EXISTS %I.gd_define_step(text, text, text, int, interval, interval, interval, '
                         'int, text, text, boolean)', :'api_schema') \gexec
DROP FUNCTION IF EXISTS gd_router.define_step_all(text, text, text, int, interval, interval, interval, int, text, text,
                                                  boolean, int, interval);
SELECT pg_catalog.format('DROP FUNCTION IF EXISTS %I.gd_define_step(text, text, text, int, interval, interval, interval, '
                         'int, text, text, boolean, int, interval)', :'api_schema') \gexec
-- (gd_insert and its PL/Proxy function before fairness_key.)
DROP FUNCTION IF EXISTS gd_router.insert(text, jsonb, text, text, int, text, text, text[], text, int, timestamptz,
                                         interval, text, text, interval, interval, text);
SELECT pg_catalog.format('DROP FUNCTION IF EXISTS %I.gd_insert(text, jsonb, text, text, int, text, text, text[], text, '
                         'int, timestamptz, interval, text, text, interval, interval, text)', :'api_schema') \gexec

-- ------------------------------------------------------- the PL/Proxy functions
-- Each runs `query` on the partitions `run_on` names (RUN ON), @api@ in it
-- being the API schema.  (PL/Proxy casts the parameters it sends to their
-- types by name, those of pg_catalog unqualified: pg_catalog comes first on
-- a search_path that does not name it after another schema.)
SELECT pg_catalog.format($proxy$CREATE OR REPLACE FUNCTION gd_router.%s RETURNS %s LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON %s;
    %s;
$$$proxy$, signature, returns, run_on, pg_catalog.replace(query, '@api@', pg_catalog.quote_ident(:'api_schema')))
  FROM (VALUES
    -- One partition, by key or id.
    ($$insert(fsm text, state jsonb, step text, queue text, priority int, concurrency_key text, correlation_key text,
              correlation_scope text[], rate_limit text, weight int, eligible_at timestamptz, schedule_in interval,
              on_duplicate text, trace_context text, debounce interval, throttle interval, on_throttle text,
              fairness_key text)$$,
     'bigint', 'gd_router.partition_for(coalesce(correlation_key, concurrency_key, rate_limit))',
     $$SELECT @api@.gd_insert(fsm, state, step, queue, priority, concurrency_key, correlation_key, correlation_scope,
                              rate_limit, weight, eligible_at, schedule_in, on_duplicate, trace_context, debounce,
                              throttle, on_throttle, fairness_key)$$),
    ('insert_all_on(partition int, fsm text, entries jsonb)', 'SETOF bigint', 'partition',
     'SELECT @api@.gd_insert_all(fsm, entries)'),
    ('signal(target bigint, name text, payload jsonb, dedup_key text, missing_ok boolean, expires interval)', 'boolean',
     'gd_router.partition_of(target)', 'SELECT @api@.gd_signal(target, name, payload, dedup_key, missing_ok, expires)'),
    ('signal(target text, name text, payload jsonb, dedup_key text, missing_ok boolean, expires interval)', 'boolean',
     'pg_catalog.hashtext(target)', 'SELECT @api@.gd_signal(target, name, payload, dedup_key, missing_ok, expires)'),
    ('await(id bigint, timeout interval, until text)',
     'TABLE(status text, step text, attempt int, result jsonb, error jsonb)', 'gd_router.partition_of(id)',
     'SELECT status, step, attempt, result, error FROM @api@.gd_await(id, timeout, until)'),
    ($$history(id bigint)$$,
     $$TABLE(attempt int, step text, kind text, started_at timestamptz, ended_at timestamptz, duration interval,
            error jsonb, worker text, entry int, state jsonb, detail jsonb)$$, 'gd_router.partition_of(id)',
     'SELECT attempt, step, kind, started_at, ended_at, duration, error, worker, entry, state, detail FROM @api@.gd_history(id)'),
    ('cancel(id bigint, reason text)', 'boolean', 'gd_router.partition_of(id)', 'SELECT @api@.gd_cancel(id, reason)'),
    ('retry(id bigint)', 'boolean', 'gd_router.partition_of(id)', 'SELECT @api@.gd_retry(id)'),
    ('rewind(id bigint, step text, state jsonb)', 'boolean', 'gd_router.partition_of(id)',
     'SELECT @api@.gd_rewind(id, step, state)'),
    -- A fork starts on its source's partition.
    ('fork(id bigint, entry int, state jsonb)', 'bigint', 'gd_router.partition_of(id)',
     'SELECT @api@.gd_fork(id, entry, state)'),
    -- A schedule lives on the partition its name hashes to (on every
    -- partition it would fire once per partition); the instances it starts
    -- run there.
    ($$schedule(name text, cron text, fsm text, state jsonb, time_zone text, queue text, priority int, overlap text,
                catch_up text, enabled boolean)$$, 'void', 'pg_catalog.hashtext(name)',
     'SELECT @api@.gd_schedule(name, cron, fsm, state, time_zone, queue, priority, overlap, catch_up, enabled)'),
    -- gd_unschedule, gd_pause_schedule or gd_resume_schedule, as `action` says.
    ('change_schedule(name text, action text)', 'boolean', 'pg_catalog.hashtext(name)',
     $$SELECT CASE WHEN action OPERATOR(pg_catalog.=) 'unschedule' THEN @api@.gd_unschedule(name)
                   WHEN action OPERATOR(pg_catalog.=) 'pause' THEN @api@.gd_pause_schedule(name)
                   ELSE @api@.gd_resume_schedule(name) END$$),
    -- Every partition at once.  (A handler and a role are named as text
    -- here: the router has neither the handlers' functions nor, perhaps, the
    -- roles; each partition resolves them.  Each partition applies a
    -- definition in its own transaction: one that a partition refuses may
    -- hold on others; definitions can be made again.)
    ($$define_fsm_all(name text, initial text, queue text, version int, state_defaults jsonb, steps jsonb,
                      history boolean, from_version int, on_cancel text)$$, 'SETOF int', 'ALL',
     $$SELECT @api@.gd_define_fsm(name, initial, queue, version, state_defaults, steps, history, from_version,
                                  on_cancel)$$),
    ($$define_step_all(fsm text, step text, handler text, max_attempts int, backoff interval, max_backoff interval,
                       timeout interval, version int, rate_limit text, queue text, backoff_jitter boolean,
                       batch int, batch_wait interval, chain boolean)$$,
     'SETOF int', 'ALL',
     $$SELECT 1 FROM @api@.gd_define_step(fsm, step, handler::pg_catalog.regprocedure, max_attempts, backoff,
                                          max_backoff, timeout, version, rate_limit, queue, backoff_jitter,
                                          batch, batch_wait, chain)$$),
    ('grant_all(fsm text, role text, granted boolean)', 'SETOF boolean', 'ALL',
     $$SELECT CASE WHEN granted THEN (SELECT true FROM @api@.gd_grant(fsm, role::pg_catalog.regrole))
                   ELSE @api@.gd_revoke(fsm, role::pg_catalog.regrole) END$$),
    ('accept_grant_all(fsm text, role text)', 'SETOF boolean', 'ALL',
     'SELECT @api@.gd_accept_grant(fsm, role::pg_catalog.regrole)'),
    ('set_paused_all(queue text, paused boolean)', 'SETOF boolean', 'ALL',
     'SELECT CASE WHEN paused THEN @api@.gd_pause(queue) ELSE @api@.gd_resume(queue) END'),
    ('set_rate_limit_all(name text, rate int, per interval, burst int, shared boolean)', 'SETOF int', 'ALL',
     'SELECT 1 FROM @api@.gd_set_rate_limit(name, rate, per, burst, shared)'),
    -- Each partition migrates its instances in its own transaction.
    ('migrate_all(fsm text, from_version int, to_version int, step_map jsonb)', 'SETOF int', 'ALL',
     'SELECT @api@.gd_migrate(fsm, from_version, to_version, step_map)'),
    ('set_owner_weight_all(owner text, weight int)', 'SETOF int', 'ALL',
     'SELECT 1 FROM @api@.gd_set_owner_weight(owner::pg_catalog.regrole, weight)'),
    ('set_concurrency_limit_all(name text, max int, shared boolean, scope text)', 'SETOF int', 'ALL',
     'SELECT 1 FROM @api@.gd_set_concurrency_limit(name, max, shared, scope)'),
    ('drop_limit_all(name text, rate boolean)', 'SETOF boolean', 'ALL',
     'SELECT CASE WHEN rate THEN @api@.gd_drop_rate_limit(name) ELSE @api@.gd_drop_concurrency_limit(name) END'),
    -- What the views below gather.
    ($$queue_stats_all(OUT partition text, OUT queue text, OUT runnable bigint, OUT scheduled bigint,
                       OUT executing bigint, OUT awaiting_signal bigint, OUT awaiting_children bigint, OUT done bigint,
                       OUT failed bigint, OUT cancelled bigint, OUT paused boolean, OUT held bigint)$$, 'SETOF record',
     'ALL',
     $$SELECT pg_catalog.current_database()::pg_catalog.text AS partition, queue, runnable, scheduled, executing,
              awaiting_signal, awaiting_children, done, failed, cancelled, paused, held FROM gd.queue_stats$$),
    ($$schedules_all(OUT partition text, OUT name text, OUT cron text, OUT fsm text, OUT enabled boolean,
                     OUT next_run_at timestamptz, OUT runs bigint)$$, 'SETOF record', 'ALL',
     $$SELECT pg_catalog.current_database()::pg_catalog.text AS partition, name, cron, fsm, enabled, next_run_at,
              runs::bigint FROM gd.schedules$$),
    -- A partition created later (gd_router.copy_definitions).
    ('definitions_of(partition int)', 'SETOF jsonb', 'partition', 'SELECT gd_sharding.definitions()'),
    ('apply_definitions_on(partition int, definitions jsonb)', 'SETOF int', 'partition',
     'SELECT gd_sharding.apply_definitions(definitions)')
  ) AS p(signature, returns, run_on, query) \gexec

-- Each entry to its key's partition (as gd_router.partition_for),
-- one call per partition; the ids come back in the entries' order, as the
-- engine's do (a partition's ids are in its entries' order; if it dropped a
-- duplicate or a throttled entry, its ids fill its first entries' places).
CREATE OR REPLACE FUNCTION gd_router.insert_all(fsm text, entries jsonb) RETURNS SETOF bigint LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    WITH placed AS (
        SELECT x.entry, x.n, gd_router.partition_for(coalesce(x.entry->>'correlation_key',
                                                              x.entry->>'concurrency_key', x.entry->>'rate_limit'))
                             & (gd_router.partition_count() - 1) AS partition
          FROM jsonb_array_elements(entries) WITH ORDINALITY AS x(entry, n)),
    grouped AS (
        SELECT partition, array_agg(n ORDER BY n) AS places, jsonb_agg(entry ORDER BY n) AS entries
          FROM placed GROUP BY partition)
    SELECT i.id
      FROM grouped g, LATERAL gd_router.insert_all_on(g.partition, fsm, g.entries) WITH ORDINALITY AS i(id, k)
     ORDER BY g.places[i.k]
$$;

-- ---------------------------------------------------------------- the API
-- PL/Proxy reports a partition's error as "<function>(<n>): [<database>]
-- REMOTE ERROR: <message>" and its own failure to reach a partition as
-- "PL/Proxy function <function>(<n>): [<database>] <libpq call>: <message>".  Raise the first
-- as the engine raised it (SQLSTATE, message, detail and hint; the partition
-- after the detail), the second as 08006 naming the partition; any other
-- error as it was.
CREATE OR REPLACE FUNCTION gd_router.raise_as_engine(code text, message text, detail text, hint text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    parts text[] := regexp_match(message, '^(?:PL/Proxy function )?\S+\(\d+\): \[([^]]*)\] (REMOTE [A-Z]+: )?(.*)$', 's');
    partition text := parts[1];
    remote_message text := rtrim(parts[3], E'\n');
BEGIN
    IF parts IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = coalesce(detail, ''),
                              HINT = coalesce(hint, '');
    ELSIF parts[2] IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'connection_failure',
              MESSAGE = format('gen_durable: partition %s is unreachable: %s', partition, remote_message);
    END IF;
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = remote_message,
          DETAIL = concat_ws(E'\n', nullif(regexp_replace(detail, '^Remote detail: ', ''), ''),
                             format('(on partition %s)', partition)),
          HINT = coalesce(regexp_replace(hint, '^Remote hint: ', ''), '');
END $$;

-- Each API function, in the API schema with the engine's signature: its
-- body runs the gd_router functions above, and an error it raises is raised
-- as the engine's (gd_router.raise_as_engine).
SELECT pg_catalog.format($function$
    CREATE OR REPLACE FUNCTION %I.%s RETURNS %s LANGUAGE plpgsql AS $body$
    DECLARE
        detail pg_catalog.text;
        hint pg_catalog.text;
    BEGIN
        %s;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
        PERFORM gd_router.raise_as_engine(SQLSTATE, SQLERRM, detail, hint);
    END $body$$function$, :'api_schema', signature, returns, body)
  FROM (VALUES
    ($$gd_insert(fsm text, state jsonb DEFAULT '{}', step text DEFAULT NULL, queue text DEFAULT NULL,
                 priority int DEFAULT 0, concurrency_key text DEFAULT NULL, correlation_key text DEFAULT NULL,
                 correlation_scope text[] DEFAULT NULL, rate_limit text DEFAULT NULL, weight int DEFAULT 1,
                 eligible_at timestamptz DEFAULT NULL, schedule_in interval DEFAULT NULL,
                 on_duplicate text DEFAULT 'error', trace_context text DEFAULT NULL,
                 debounce interval DEFAULT NULL, throttle interval DEFAULT NULL,
                 on_throttle text DEFAULT 'drop', fairness_key text DEFAULT NULL)$$, 'bigint',
     $$RETURN gd_router.insert(fsm, state, step, queue, priority, concurrency_key, correlation_key,
                               correlation_scope, rate_limit, weight, eligible_at, schedule_in, on_duplicate,
                               trace_context, debounce, throttle, on_throttle, fairness_key)$$),
    ('gd_insert_all(fsm text, entries jsonb)', 'SETOF bigint',
     'RETURN QUERY SELECT gd_router.insert_all(fsm, entries)'),
    ($$gd_signal(target bigint, name text, payload jsonb DEFAULT '{}', dedup_key text DEFAULT NULL,
                 missing_ok boolean DEFAULT false, expires interval DEFAULT NULL)$$, 'boolean',
     'RETURN gd_router.signal(target, name, payload, dedup_key, missing_ok, expires)'),
    ($$gd_signal(target text, name text, payload jsonb DEFAULT '{}', dedup_key text DEFAULT NULL,
                 missing_ok boolean DEFAULT false, expires interval DEFAULT NULL)$$, 'boolean',
     'RETURN gd_router.signal(target, name, payload, dedup_key, missing_ok, expires)'),
    ($$gd_await(id bigint, timeout interval DEFAULT '5s', until text DEFAULT 'settled')$$,
     'TABLE(status text, step text, attempt int, result jsonb, error jsonb)',
     'RETURN QUERY SELECT * FROM gd_router.await(id, timeout, until)'),
    ('gd_history(id bigint)',
     $$TABLE(attempt int, step text, kind text, started_at timestamptz, ended_at timestamptz, duration interval,
            error jsonb, worker text, entry int, state jsonb, detail jsonb)$$,
     'RETURN QUERY SELECT * FROM gd_router.history(id)'),
    ('gd_cancel(id bigint, reason text DEFAULT NULL)', 'boolean', 'RETURN gd_router.cancel(id, reason)'),
    ('gd_retry(id bigint)', 'boolean', 'RETURN gd_router.retry(id)'),
    ('gd_rewind(id bigint, step text, state jsonb DEFAULT NULL)', 'boolean', 'RETURN gd_router.rewind(id, step, state)'),
    ('gd_fork(id bigint, entry int, state jsonb DEFAULT NULL)', 'bigint', 'RETURN gd_router.fork(id, entry, state)'),
    ($$gd_migrate(fsm text, from_version int, to_version int, step_map jsonb DEFAULT '{}')$$, 'int',
     $$RETURN (SELECT CAST(pg_catalog.sum(n) AS int)
                 FROM gd_router.migrate_all(fsm, from_version, to_version, step_map) n)$$),
    ($$gd_define_fsm(name text, initial text, queue text DEFAULT 'default', version int DEFAULT 1,
                     state_defaults jsonb DEFAULT '{}', steps jsonb DEFAULT NULL, history boolean DEFAULT NULL,
                     from_version int DEFAULT NULL, on_cancel text DEFAULT NULL)$$,
     'int', $$RETURN (SELECT pg_catalog.max(v) FROM gd_router.define_fsm_all(name, initial, queue, version,
                                                                             state_defaults, steps, history,
                                                                             from_version, on_cancel) v)$$),
    ($$gd_define_step(fsm text, step text, handler text DEFAULT NULL, max_attempts int DEFAULT 3,
                      backoff interval DEFAULT '1s', max_backoff interval DEFAULT '5m',
                      timeout interval DEFAULT NULL, version int DEFAULT NULL, rate_limit text DEFAULT NULL,
                      queue text DEFAULT NULL, backoff_jitter boolean DEFAULT true, batch int DEFAULT 1,
                      batch_wait interval DEFAULT '0', chain boolean DEFAULT true)$$, 'void',
     $$PERFORM gd_router.define_step_all(fsm, step, handler, max_attempts, backoff, max_backoff, timeout,
                                         version, rate_limit, queue, backoff_jitter, batch, batch_wait, chain)$$),
    ('gd_grant(fsm text, role text)', 'void', 'PERFORM gd_router.grant_all(fsm, role, true)'),
    ('gd_revoke(fsm text, role text)', 'boolean',
     'RETURN (SELECT pg_catalog.bool_or(changed) FROM gd_router.grant_all(fsm, role, false) changed)'),
    ('gd_accept_grant(fsm text, role text DEFAULT NULL)', 'boolean',
     'RETURN (SELECT pg_catalog.bool_or(accepted) FROM gd_router.accept_grant_all(fsm, role) accepted)'),
    ('gd_pause(queue text)', 'boolean',
     'RETURN (SELECT pg_catalog.bool_or(changed) FROM gd_router.set_paused_all(queue, true) changed)'),
    ('gd_resume(queue text)', 'boolean',
     'RETURN (SELECT pg_catalog.bool_or(changed) FROM gd_router.set_paused_all(queue, false) changed)'),
    ('gd_set_rate_limit(name text, rate int, per interval, burst int DEFAULT NULL, shared boolean DEFAULT false)',
     'void', 'PERFORM gd_router.set_rate_limit_all(name, rate, per, burst, shared)'),
    ($$gd_set_concurrency_limit(name text, max int, shared boolean DEFAULT false, scope text DEFAULT 'step')$$, 'void',
     'PERFORM gd_router.set_concurrency_limit_all(name, max, shared, scope)'),
    ('gd_set_owner_weight(owner text, weight int)', 'void', 'PERFORM gd_router.set_owner_weight_all(owner, weight)'),
    ('gd_drop_rate_limit(name text)', 'boolean',
     'RETURN (SELECT pg_catalog.bool_or(dropped) FROM gd_router.drop_limit_all(name, true) dropped)'),
    ('gd_drop_concurrency_limit(name text)', 'boolean',
     'RETURN (SELECT pg_catalog.bool_or(dropped) FROM gd_router.drop_limit_all(name, false) dropped)'),
    ($$gd_schedule(name text, cron text, fsm text, state jsonb DEFAULT '{}', time_zone text DEFAULT 'UTC',
                   queue text DEFAULT NULL, priority int DEFAULT 0, overlap text DEFAULT 'allow',
                   catch_up text DEFAULT 'latest', enabled boolean DEFAULT true)$$, 'void',
     $$PERFORM gd_router.schedule(name, cron, fsm, state, time_zone, queue, priority, overlap, catch_up,
                                  enabled)$$),
    ('gd_unschedule(name text)', 'boolean', $$RETURN gd_router.change_schedule(name, 'unschedule')$$),
    ('gd_pause_schedule(name text)', 'boolean', $$RETURN gd_router.change_schedule(name, 'pause')$$),
    ('gd_resume_schedule(name text)', 'boolean', $$RETURN gd_router.change_schedule(name, 'resume')$$)
  ) AS api(signature, returns, body) \gexec

-- ----------------------------------------------------------------- views
-- (A view's names are resolved once, here.)
-- Every queue's instances per status over all partitions (and per partition: gd_router.queue_stats_all()).
CREATE OR REPLACE VIEW gd_router.queue_stats AS
SELECT queue, sum(runnable) AS runnable, sum(scheduled) AS scheduled, sum(executing) AS executing,
       sum(awaiting_signal) AS awaiting_signal, sum(awaiting_children) AS awaiting_children, sum(done) AS done,
       sum(failed) AS failed, sum(cancelled) AS cancelled, bool_or(paused) AS paused_somewhere, sum(held) AS held
  FROM gd_router.queue_stats_all() GROUP BY queue;
CREATE OR REPLACE VIEW gd_router.schedules AS SELECT * FROM gd_router.schedules_all();

-- ---------------------------------------------- a partition created later
-- Give partition `target` (new, or restored empty) the FSM definitions,
-- limits and grants of partition `source`; returns how many FSM versions.
CREATE OR REPLACE FUNCTION gd_router.copy_definitions(source int, target int) RETURNS int LANGUAGE sql AS $$
    SELECT gd_router.apply_definitions_on(target, d) FROM gd_router.definitions_of(source) d
$$;

-- ------------------------------------------------------------------ rights
-- Every router role may call the API: each partition checks the rights of
-- the user the role is mapped to.  Copying definitions reads and writes
-- every FSM of a partition: for the router's administrators only.
GRANT USAGE ON SCHEMA gd_router TO PUBLIC;
REVOKE ALL ON FUNCTION gd_router.copy_definitions(int, int), gd_router.definitions_of(int),
                       gd_router.apply_definitions_on(int, jsonb) FROM PUBLIC;
COMMIT;
