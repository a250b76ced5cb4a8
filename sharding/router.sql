-- The router of a sharded gen_durable (sharding/README.md): run in the router
-- database, after CREATE EXTENSION plproxy and the cluster's definition
-- (CREATE SERVER gd_partitions FOREIGN DATA WRAPPER plproxy OPTIONS (p0 ...,
-- p1 ...); CREATE USER MAPPING ... SERVER gd_partitions).  It defines the
-- API users call, with the engine's names and signatures, over PL/Proxy
-- functions (gd_router.*): an instance goes to the partition its correlation
-- key (else its limit key) hashes to (hashtext, as PL/Proxy takes it modulo
-- the partition count), or to one chosen at random without a key; an id names its partition
-- (id % N: see partition.sql); definitions, grants and limits go to every
-- partition.  A partition's error reaches the caller as the engine raised it.
\set ON_ERROR_STOP on
CREATE SCHEMA IF NOT EXISTS gd_router;

-- Where an instance with this key lives, or a partition at random for none.
-- An instance's key is its correlation key, else its concurrency key, else
-- its rate limit key: the instances that share a limit key and no
-- correlation key share a partition, where the limit holds for all of them.
CREATE OR REPLACE FUNCTION gd_router.partition_for(key text) RETURNS int LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN key IS NULL THEN (random() * 2147483646)::int ELSE hashtext(key) END
$$;
-- The partition an id was made on (its low bits: PL/Proxy keeps those under the partition count).
CREATE OR REPLACE FUNCTION gd_router.partition_of(id bigint) RETURNS int LANGUAGE sql IMMUTABLE AS $$
    SELECT (id & 2147483647)::int
$$;
-- How many partitions the cluster has: its server's pN options (read here,
-- with no call to any partition, so a server that is down stops only the
-- calls that go to it).
CREATE OR REPLACE FUNCTION gd_router.partition_count() RETURNS int LANGUAGE sql STABLE AS $$
    SELECT count(*)::int FROM pg_catalog.pg_foreign_server s, pg_catalog.unnest(s.srvoptions) o
     WHERE s.srvname = 'gd_partitions' AND o ~ '^p[0-9]+='
$$;

-- ------------------------------------------------ one partition, by key or id
CREATE OR REPLACE FUNCTION gd_router.insert(fsm text, state jsonb, step text, queue text, priority int,
                                            concurrency_key text, correlation_key text, correlation_scope text[],
                                            rate_limit text, weight int, eligible_at timestamptz,
                                            schedule_in interval, on_duplicate text, trace_context text)
RETURNS bigint LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON gd_router.partition_for(coalesce(correlation_key, concurrency_key, rate_limit));
    SELECT gd_insert(fsm, state, step, queue, priority, concurrency_key, correlation_key, correlation_scope,
                     rate_limit, weight, eligible_at, schedule_in, on_duplicate, trace_context);
$$;
CREATE OR REPLACE FUNCTION gd_router.insert_all_on(partition int, fsm text, entries jsonb) RETURNS SETOF bigint
LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON partition;
    SELECT gd_insert_all(fsm, entries);
$$;
-- Each entry to its key's partition (as gd_router.partition_for),
-- one call per partition; the ids come back in the entries' order, as the
-- engine's do (a partition's ids are in its entries' order; if it dropped a
-- duplicate, its ids fill its first entries' places).
CREATE OR REPLACE FUNCTION gd_router.insert_all(fsm text, entries jsonb) RETURNS SETOF bigint LANGUAGE sql AS $$
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
CREATE OR REPLACE FUNCTION gd_router.signal(target bigint, name text, payload jsonb, dedup_key text, missing_ok boolean)
RETURNS boolean LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON gd_router.partition_of(target);
    SELECT gd_signal(target, name, payload, dedup_key, missing_ok);
$$;
CREATE OR REPLACE FUNCTION gd_router.signal(target text, name text, payload jsonb, dedup_key text, missing_ok boolean)
RETURNS boolean LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON hashtext(target);
    SELECT gd_signal(target, name, payload, dedup_key, missing_ok);
$$;
CREATE OR REPLACE FUNCTION gd_router.await(id bigint, timeout interval, until text)
RETURNS TABLE(status text, step text, attempt int, result jsonb, error jsonb) LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON gd_router.partition_of(id);
    SELECT status, step, attempt, result, error FROM gd_await(id, timeout, until);
$$;
CREATE OR REPLACE FUNCTION gd_router.cancel(id bigint, reason text) RETURNS boolean LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON gd_router.partition_of(id);
    SELECT gd_cancel(id, reason);
$$;
CREATE OR REPLACE FUNCTION gd_router.retry(id bigint) RETURNS boolean LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON gd_router.partition_of(id);
    SELECT gd_retry(id);
$$;
-- A schedule lives on the partition its name hashes to (on every partition
-- it would fire once per partition); the instances it starts run there.
CREATE OR REPLACE FUNCTION gd_router.schedule(name text, cron text, fsm text, state jsonb, time_zone text, queue text,
                                              priority int, overlap text, catch_up text, enabled boolean)
RETURNS void LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON hashtext(name);
    SELECT gd_schedule(name, cron, fsm, state, time_zone, queue, priority, overlap, catch_up, enabled);
$$;
-- gd_unschedule, gd_pause_schedule or gd_resume_schedule, as `action` says.
CREATE OR REPLACE FUNCTION gd_router.change_schedule(name text, action text) RETURNS boolean LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON hashtext(name);
    SELECT CASE action WHEN 'unschedule' THEN gd_unschedule(name)
                       WHEN 'pause' THEN gd_pause_schedule(name) ELSE gd_resume_schedule(name) END;
$$;

-- --------------------------------------------------- every partition at once
-- (A handler and a role are named as text here: the router has neither the
-- handlers' functions nor, perhaps, the roles; each partition resolves them.
-- Each partition applies a definition in its own transaction: one that a
-- partition refuses may hold on others; definitions can be made again.)
CREATE OR REPLACE FUNCTION gd_router.define_fsm_all(name text, initial text, queue text, version int,
                                                    state_defaults jsonb, steps jsonb, history boolean)
RETURNS SETOF int LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON ALL;
    SELECT gd_define_fsm(name, initial, queue, version, state_defaults, steps, history);
$$;
CREATE OR REPLACE FUNCTION gd_router.define_step_all(fsm text, step text, handler text, max_attempts int,
                                                     backoff interval, max_backoff interval, timeout interval,
                                                     version int, rate_limit text, queue text)
RETURNS SETOF int LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON ALL;
    SELECT 1 FROM gd_define_step(fsm, step, handler::regprocedure, max_attempts, backoff, max_backoff, timeout,
                                 version, rate_limit, queue);
$$;
CREATE OR REPLACE FUNCTION gd_router.grant_all(fsm text, role text, granted boolean) RETURNS SETOF boolean
LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON ALL;
    SELECT CASE WHEN granted THEN (SELECT true FROM gd_grant(fsm, role::regrole)) ELSE gd_revoke(fsm, role::regrole) END;
$$;
CREATE OR REPLACE FUNCTION gd_router.set_paused_all(queue text, paused boolean) RETURNS SETOF boolean
LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON ALL;
    SELECT CASE WHEN paused THEN gd_pause(queue) ELSE gd_resume(queue) END;
$$;
CREATE OR REPLACE FUNCTION gd_router.set_rate_limit_all(name text, rate int, per interval, burst int, shared boolean)
RETURNS SETOF int LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON ALL;
    SELECT 1 FROM gd_set_rate_limit(name, rate, per, burst, shared);
$$;
CREATE OR REPLACE FUNCTION gd_router.set_concurrency_limit_all(name text, max int, shared boolean)
RETURNS SETOF int LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON ALL;
    SELECT 1 FROM gd_set_concurrency_limit(name, max, shared);
$$;
CREATE OR REPLACE FUNCTION gd_router.drop_limit_all(name text, rate boolean) RETURNS SETOF boolean
LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON ALL;
    SELECT CASE WHEN rate THEN gd_drop_rate_limit(name) ELSE gd_drop_concurrency_limit(name) END;
$$;

-- ---------------------------------------------------------------- the API
-- PL/Proxy reports a partition's error as "<function>(<n>): [<database>]
-- REMOTE ERROR: <message>" and its own failure to reach a partition as
-- "PL/Proxy function <function>(<n>): [<database>] <libpq call>: <message>".  Raise the first
-- as the engine raised it (SQLSTATE, message, detail and hint; the partition
-- after the detail), the second as 08006 naming the partition; any other
-- error as it was.
CREATE OR REPLACE FUNCTION gd_router.raise_as_engine(code text, message text, detail text, hint text) RETURNS void
LANGUAGE plpgsql AS $$
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

-- Each API function, with the engine's signature: its body runs the
-- gd_router functions above, and an error it raises is raised as the
-- engine's (gd_router.raise_as_engine).
DO $generate$
DECLARE
    api record;
BEGIN
    FOR api IN SELECT * FROM (VALUES
        ($$gd_insert(fsm text, state jsonb DEFAULT '{}', step text DEFAULT NULL, queue text DEFAULT NULL,
                     priority int DEFAULT 0, concurrency_key text DEFAULT NULL, correlation_key text DEFAULT NULL,
                     correlation_scope text[] DEFAULT NULL, rate_limit text DEFAULT NULL, weight int DEFAULT 1,
                     eligible_at timestamptz DEFAULT NULL, schedule_in interval DEFAULT NULL,
                     on_duplicate text DEFAULT 'error', trace_context text DEFAULT NULL)$$, 'bigint',
         $$RETURN gd_router.insert(fsm, state, step, queue, priority, concurrency_key, correlation_key,
                                   correlation_scope, rate_limit, weight, eligible_at, schedule_in, on_duplicate,
                                   trace_context)$$),
        ('gd_insert_all(fsm text, entries jsonb)', 'SETOF bigint',
         'RETURN QUERY SELECT gd_router.insert_all(fsm, entries)'),
        ($$gd_signal(target bigint, name text, payload jsonb DEFAULT '{}', dedup_key text DEFAULT NULL,
                     missing_ok boolean DEFAULT false)$$, 'boolean',
         'RETURN gd_router.signal(target, name, payload, dedup_key, missing_ok)'),
        ($$gd_signal(target text, name text, payload jsonb DEFAULT '{}', dedup_key text DEFAULT NULL,
                     missing_ok boolean DEFAULT false)$$, 'boolean',
         'RETURN gd_router.signal(target, name, payload, dedup_key, missing_ok)'),
        ($$gd_await(id bigint, timeout interval DEFAULT '5s', until text DEFAULT 'settled')$$,
         'TABLE(status text, step text, attempt int, result jsonb, error jsonb)',
         'RETURN QUERY SELECT * FROM gd_router.await(id, timeout, until)'),
        ('gd_cancel(id bigint, reason text DEFAULT NULL)', 'boolean', 'RETURN gd_router.cancel(id, reason)'),
        ('gd_retry(id bigint)', 'boolean', 'RETURN gd_router.retry(id)'),
        ($$gd_define_fsm(name text, initial text, queue text DEFAULT 'default', version int DEFAULT 1,
                         state_defaults jsonb DEFAULT '{}', steps jsonb DEFAULT NULL, history boolean DEFAULT false)$$,
         'int', $$RETURN (SELECT max(v) FROM gd_router.define_fsm_all(name, initial, queue, version, state_defaults,
                                                                     steps, history) v)$$),
        ($$gd_define_step(fsm text, step text, handler text DEFAULT NULL, max_attempts int DEFAULT 3,
                          backoff interval DEFAULT '1s', max_backoff interval DEFAULT '5m',
                          timeout interval DEFAULT NULL, version int DEFAULT NULL, rate_limit text DEFAULT NULL,
                          queue text DEFAULT NULL)$$, 'void',
         $$PERFORM gd_router.define_step_all(fsm, step, handler, max_attempts, backoff, max_backoff, timeout,
                                             version, rate_limit, queue)$$),
        ('gd_grant(fsm text, role text)', 'void', 'PERFORM gd_router.grant_all(fsm, role, true)'),
        ('gd_revoke(fsm text, role text)', 'boolean',
         'RETURN (SELECT bool_or(changed) FROM gd_router.grant_all(fsm, role, false) changed)'),
        ('gd_pause(queue text)', 'boolean',
         'RETURN (SELECT bool_or(changed) FROM gd_router.set_paused_all(queue, true) changed)'),
        ('gd_resume(queue text)', 'boolean',
         'RETURN (SELECT bool_or(changed) FROM gd_router.set_paused_all(queue, false) changed)'),
        ('gd_set_rate_limit(name text, rate int, per interval, burst int DEFAULT NULL, shared boolean DEFAULT false)',
         'void', 'PERFORM gd_router.set_rate_limit_all(name, rate, per, burst, shared)'),
        ('gd_set_concurrency_limit(name text, max int, shared boolean DEFAULT false)', 'void',
         'PERFORM gd_router.set_concurrency_limit_all(name, max, shared)'),
        ('gd_drop_rate_limit(name text)', 'boolean',
         'RETURN (SELECT bool_or(dropped) FROM gd_router.drop_limit_all(name, true) dropped)'),
        ('gd_drop_concurrency_limit(name text)', 'boolean',
         'RETURN (SELECT bool_or(dropped) FROM gd_router.drop_limit_all(name, false) dropped)'),
        ($$gd_schedule(name text, cron text, fsm text, state jsonb DEFAULT '{}', time_zone text DEFAULT 'UTC',
                       queue text DEFAULT NULL, priority int DEFAULT 0, overlap text DEFAULT 'allow',
                       catch_up text DEFAULT 'latest', enabled boolean DEFAULT true)$$, 'void',
         $$PERFORM gd_router.schedule(name, cron, fsm, state, time_zone, queue, priority, overlap, catch_up,
                                      enabled)$$),
        ('gd_unschedule(name text)', 'boolean', $$RETURN gd_router.change_schedule(name, 'unschedule')$$),
        ('gd_pause_schedule(name text)', 'boolean', $$RETURN gd_router.change_schedule(name, 'pause')$$),
        ('gd_resume_schedule(name text)', 'boolean', $$RETURN gd_router.change_schedule(name, 'resume')$$)
    ) AS a(signature, returns, body) LOOP
        EXECUTE format($function$
            CREATE OR REPLACE FUNCTION %s RETURNS %s LANGUAGE plpgsql AS $body$
            DECLARE
                detail text;
                hint text;
            BEGIN
                %s;
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
                PERFORM gd_router.raise_as_engine(SQLSTATE, SQLERRM, detail, hint);
            END $body$$function$, api.signature, api.returns, api.body);
    END LOOP;
END $generate$;

-- ----------------------------------------------------------------- views
CREATE OR REPLACE FUNCTION gd_router.queue_stats_all(OUT partition text, OUT queue text, OUT runnable bigint,
                                                     OUT scheduled bigint, OUT executing bigint,
                                                     OUT awaiting_signal bigint, OUT awaiting_children bigint,
                                                     OUT done bigint, OUT failed bigint, OUT cancelled bigint,
                                                     OUT paused boolean)
RETURNS SETOF record LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON ALL;
    SELECT current_database()::text AS partition, queue, runnable, scheduled, executing, awaiting_signal,
           awaiting_children, done, failed, cancelled, paused FROM gd.queue_stats;
$$;
-- Every queue's instances per status over all partitions (and per partition: gd_router.queue_stats_all()).
CREATE OR REPLACE VIEW gd_router.queue_stats AS
SELECT queue, sum(runnable) AS runnable, sum(scheduled) AS scheduled, sum(executing) AS executing,
       sum(awaiting_signal) AS awaiting_signal, sum(awaiting_children) AS awaiting_children, sum(done) AS done,
       sum(failed) AS failed, sum(cancelled) AS cancelled, bool_or(paused) AS paused_somewhere
  FROM gd_router.queue_stats_all() GROUP BY queue;
CREATE OR REPLACE FUNCTION gd_router.schedules_all(OUT partition text, OUT name text, OUT cron text, OUT fsm text,
                                                   OUT enabled boolean, OUT next_run_at timestamptz, OUT runs bigint)
RETURNS SETOF record LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON ALL;
    SELECT current_database()::text AS partition, name, cron, fsm, enabled, next_run_at, runs::bigint FROM gd.schedules;
$$;
CREATE OR REPLACE VIEW gd_router.schedules AS SELECT * FROM gd_router.schedules_all();

-- ---------------------------------------------- a partition created later
CREATE OR REPLACE FUNCTION gd_router.definitions_of(partition int) RETURNS SETOF jsonb LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON partition;
    SELECT gd_sharding.definitions();
$$;
CREATE OR REPLACE FUNCTION gd_router.apply_definitions_on(partition int, definitions jsonb) RETURNS SETOF int
LANGUAGE plproxy AS $$
    CLUSTER 'gd_partitions';
    RUN ON partition;
    SELECT gd_sharding.apply_definitions(definitions);
$$;
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
