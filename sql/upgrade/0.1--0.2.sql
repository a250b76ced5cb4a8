-- gen_durable 0.1 -> 0.2: the migration of the tables.  The rest of the
-- update is the 0.2 install script (sql/src/*.sql), which defines every
-- function, view, trigger and privilege again over the migrated tables and
-- then drops the functions 0.2 no longer has (sql/src/88_leftovers.sql).
-- It runs in ALTER EXTENSION's one transaction: it applies whole or not at all.
\echo Use "ALTER EXTENSION gen_durable UPDATE" to load this file. \quit

-- 0.1's tables were open, filtered by row security; 0.2's are closed (only
-- the extension's owner reads them: users go through the API and the views
-- of the same names).  Policies and every grant on them go.
DO $$
DECLARE
    closed record;
BEGIN
    FOR closed IN
        SELECT p.polname, c.relname FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
         WHERE c.relnamespace = 'gd'::regnamespace
    LOOP
        EXECUTE format('DROP POLICY %I ON gd.%I', closed.polname, closed.relname);
    END LOOP;
    FOR closed IN
        SELECT c.relname, c.relkind, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(a.grantee::regrole::text) END
               AS grantee
          FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
         WHERE c.relnamespace = 'gd'::regnamespace AND c.relkind IN ('r', 'S') AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('REVOKE ALL ON %s gd.%I FROM %s', CASE closed.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                       closed.relname, closed.grantee);
    END LOOP;
    FOR closed IN SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'gd'::regnamespace AND c.relrowsecurity LOOP
        EXECUTE format('ALTER TABLE gd.%I NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY', closed.relname);
    END LOOP;
END $$;

-- The tables take the names gd._*, their constraints (and the indexes behind
-- them) the names a fresh install gives them.
DO $$
DECLARE
    relation text;
BEGIN
    FOREACH relation IN ARRAY ARRAY['queues', 'fsms', 'steps', 'grants', 'instances', 'signals', 'concurrency_limits',
                                    'rate_limits', 'rate_buckets', 'external_due_announced', 'instances_id_seq',
                                    'signals_id_seq', 'lease_tokens'] LOOP
        EXECUTE format('ALTER %s gd.%I RENAME TO %I',
                       CASE WHEN relation LIKE '%seq' OR relation = 'lease_tokens' THEN 'SEQUENCE' ELSE 'TABLE' END,
                       relation, '_' || relation);
    END LOOP;
END $$;
DO $$
DECLARE
    named record;
BEGIN
    FOR named IN
        SELECT c.relname, k.conname FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
         WHERE c.relnamespace = 'gd'::regnamespace AND k.conname LIKE substr(c.relname, 2) || '\_%'
    LOOP
        EXECUTE format('ALTER TABLE gd.%I RENAME CONSTRAINT %I TO %I', named.relname, named.conname, '_' || named.conname);
    END LOOP;
END $$;

-- Instances: each in its owner's key space (correlation keys, concurrency
-- keys); home_queue for steps on queues of their own; debounced_at for
-- debounced inserts.  Rewrites the table.
ALTER TABLE gd._instances ADD COLUMN owner regrole, ADD COLUMN home_queue text, ADD COLUMN trace_context text,
    ADD COLUMN claimed_at timestamptz, ADD COLUMN visit_key uuid NOT NULL DEFAULT gen_random_uuid(),
    ADD COLUMN debounced_at timestamptz;
UPDATE gd._instances i SET owner = f.owner FROM gd._fsms f WHERE f.name = i.fsm AND f.version = i.version;
DO $$
DECLARE
    orphans bigint;
BEGIN
    SELECT count(*) INTO orphans FROM gd._instances WHERE owner IS NULL;
    IF orphans > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = format('gen_durable: %s instances belong to no defined FSM version', orphans),
            HINT = 'Delete them (SELECT fsm, version FROM gd.instances WHERE (fsm, version) NOT IN (SELECT name, version FROM gd.fsms)), then update again.';
    END IF;
END $$;
ALTER TABLE gd._instances ALTER COLUMN owner SET NOT NULL;
DROP INDEX gd.instances_correlation, gd.instances_key_running, gd.instances_key_gated;   -- made again, with the owner
DROP INDEX gd.instances_external_due;   -- made again without updated_at in its predicate

-- Limits: per owner unless shared.  Token buckets start full again, in the
-- key space of each owner.
ALTER TABLE gd._concurrency_limits ADD COLUMN shared boolean NOT NULL DEFAULT false,
    ADD COLUMN scope text NOT NULL DEFAULT 'step' CHECK (scope IN ('step', 'run'));
ALTER TABLE gd._signals ADD COLUMN expires_at timestamptz;
ALTER TABLE gd._rate_limits ADD COLUMN shared boolean NOT NULL DEFAULT false;
DELETE FROM gd._rate_buckets;
ALTER TABLE gd._rate_buckets ADD COLUMN scope regrole NOT NULL, DROP CONSTRAINT _rate_buckets_pkey,
    ADD CONSTRAINT _rate_buckets_pkey PRIMARY KEY (scope, key);

-- Steps may run on queues of their own; their retries' backoff has jitter;
-- a step may take its instances in batches, and stay out of chains.
ALTER TABLE gd._steps ADD COLUMN queue text REFERENCES gd._queues,
    ADD COLUMN backoff_jitter boolean NOT NULL DEFAULT true,
    ADD COLUMN batch int NOT NULL DEFAULT 1 CHECK (batch BETWEEN 1 AND 1000),
    ADD COLUMN batch_wait interval NOT NULL DEFAULT '0' CHECK (batch_wait >= '0'),
    ADD COLUMN chain boolean NOT NULL DEFAULT true;

-- Grants take effect on what resolves without naming the FSM once the
-- grantee accepts them; those made under 0.1 keep the effect they had.
ALTER TABLE gd._grants ADD COLUMN accepted boolean NOT NULL DEFAULT true;
ALTER TABLE gd._grants ALTER COLUMN accepted SET DEFAULT false;

-- A step names its handler by its signature, not its OID (pg_upgrade keeps no
-- function OID, and refuses a regprocedure column): the text as
-- regprocedure prints it under search_path pg_catalog, pg_temp.
DO $$
DECLARE
    path text := pg_catalog.current_setting('search_path');
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    ALTER TABLE gd._steps ALTER COLUMN handler TYPE text USING handler::text;
    PERFORM pg_catalog.set_config('search_path', path, true);
END $$;

-- FSM versions may keep a step history; handlers see their instance's trace
-- context, their step visit's idempotency key and their attempt's deadline.
ALTER TABLE gd._fsms ADD COLUMN history boolean NOT NULL DEFAULT false;
ALTER TYPE gd.context ADD ATTRIBUTE trace_context text, ADD ATTRIBUTE idempotency_key text,
    ADD ATTRIBUTE deadline timestamptz;

-- A gd_cancel may compensate: an FSM version names the step it runs
-- (on_cancel), the instance is marked while it runs it, its handler sees why.
ALTER TABLE gd._fsms ADD COLUMN on_cancel text;
ALTER TABLE gd._instances ADD COLUMN cancelled jsonb;
ALTER TYPE gd.context ADD ATTRIBUTE cancelled jsonb;

-- Fair share: picks share a queue between lanes (priority, owner, fairness
-- key); the pick and claim indexes are made again with the lane.
ALTER TABLE gd._instances ADD COLUMN fairness_key text, ADD COLUMN fairness_lane int NOT NULL DEFAULT 0;

-- An instance without a correlation key stores no scope (0.1's rows keep theirs).
ALTER TABLE gd._instances ALTER COLUMN correlation_scope DROP NOT NULL;
DROP INDEX IF EXISTS gd.instances_pick, gd.instances_claim;

-- What 0.2 defines with another result type.
DROP FUNCTION gd._key_limit(text);
DROP FUNCTION gd._announce_due_external();   -- takes where its caller's last look ended
