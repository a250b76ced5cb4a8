-- ---------------------------------------------------------------------------
-- Concurrency keys: at most a limit of holders of a key run at once
-- ---------------------------------------------------------------------------
-- An instance with concurrency_key 'name' or 'name:partition' runs only while
-- fewer than the name's limit (1 if unconfigured) of instances hold that
-- exact key.  What holding is, is the limit's scope: 'step' (the default)
-- while running (runnable or executing: a wait on a signal or on children
-- lets the key go, taken again on resuming), 'run' while live (from
-- admission to the instance's end, through waits, children and retries).
-- Keys belong to tenants: an instance counts only against instances of the
-- same owner, so no role can occupy or see another's keys — unless an
-- administrator made the name's limit shared (gd_set_concurrency_limit(...,
-- shared => true)), and every owner's instances holding the key count
-- together.  The others are "gated": runnable, but out of the pick indexes,
-- so a key with a million waiting rows costs a pick nothing.  Admission and
-- release under one key are serialised by a transaction-scoped engine lock
-- on it, so the count is exact; the state is the rows themselves, so a
-- crash or an expired lease cannot leave a slot taken.

CREATE TABLE IF NOT EXISTS gd._concurrency_limits (
    name   text PRIMARY KEY,
    max    int NOT NULL CHECK (max > 0),
    shared boolean NOT NULL DEFAULT false,  -- counted across owners, not per owner
    scope  text NOT NULL DEFAULT 'step' CHECK (scope IN ('step', 'run'))  -- held while running, or while live
);

-- Rows holding a key (in either scope: the status says which count them), or waiting for one.
CREATE INDEX IF NOT EXISTS instances_key_holders ON gd._instances (concurrency_key, owner, status)
    WHERE concurrency_key IS NOT NULL AND NOT gated
      AND status IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children');
CREATE INDEX IF NOT EXISTS instances_key_gated ON gd._instances (concurrency_key, owner, priority, eligible_at, id)
    WHERE gated AND status = 'runnable';

-- The limit of a key: its name's, or 1 per owner, per step, when the name has none.
CREATE OR REPLACE FUNCTION gd._key_limit(key text) RETURNS gd._concurrency_limits
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT l FROM gd._concurrency_limits l WHERE l.name = split_part(key, ':', 1)),
                    ROW(split_part(key, ':', 1), 1, false, 'step')::gd._concurrency_limits)
$$;

-- The statuses in which an instance holds a key of that scope.
CREATE OR REPLACE FUNCTION gd._holding_statuses(scope text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE scope WHEN 'run' THEN gd._live_statuses() ELSE ARRAY['runnable', 'executing'] END
$$;

-- How many instances hold the key: of key_owner, or of every owner when shared.
-- (The live statuses, a constant, let the planner match instances_key_holders'
-- predicate whatever the scope.)  Planned for that index whatever the statistics say (as the
-- engine's kept plans are, src/kept_plans.cpp): an insert's session plans
-- it once, perhaps while the table looks empty, and keeps the plan while a
-- bulk insert fills the table.
CREATE OR REPLACE FUNCTION gd._key_holders(key_owner oid, key text, policy gd._concurrency_limits) RETURNS int
LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
BEGIN
    IF policy.shared THEN
        RETURN (SELECT count(*) FROM gd._instances i
                 WHERE i.concurrency_key = key AND NOT i.gated AND i.status = ANY (gd._live_statuses())
                   AND i.status = ANY (gd._holding_statuses(policy.scope)));
    END IF;
    RETURN (SELECT count(*) FROM gd._instances i
             WHERE i.concurrency_key = key AND i.owner = key_owner AND NOT i.gated
               AND i.status = ANY (gd._live_statuses()) AND i.status = ANY (gd._holding_statuses(policy.scope)));
END $$;

-- Serialise admission and release under one key, in one owner's key space
-- (or in all of them for a shared limit), until the transaction ends: an
-- engine lock no role can take from SQL (src/engine_locks.cpp).  False in an
-- engine worker when another transaction holds it (the worker does not wait:
-- the reaper's repair makes the room later).
CREATE OR REPLACE FUNCTION gd._lock_key(key_owner oid, key text, shared boolean) RETURNS boolean
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_lock_key';

-- How many more instances of key_owner may run under the key now (locks the
-- key; none when an engine worker could not lock it).
CREATE OR REPLACE FUNCTION gd._key_room(key_owner oid, key text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    policy gd._concurrency_limits := gd._key_limit(key);
BEGIN
    IF NOT gd._lock_key(key_owner, key, policy.shared) THEN
        RETURN 0;
    END IF;
    RETURN policy.max - gd._key_holders(key_owner, key, policy);
END $$;

-- Should an instance of key_owner about to run under this key wait its
-- turn?  Counts it.  One resuming from a wait (`resuming`) still holds a
-- key of the run scope: it goes on.
CREATE OR REPLACE FUNCTION gd._must_gate(key_owner oid, key text, resuming boolean DEFAULT false) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF key IS NULL OR (resuming AND (gd._key_limit(key)).scope = 'run') THEN
        RETURN false;
    END IF;
    IF gd._key_room(key_owner, key) > 0 THEN
        PERFORM gd._count_limit('concurrency', key, 1, 1, 0, 0);
        RETURN false;
    END IF;
    PERFORM gd._count('concurrency_throttled'), gd._count_limit('concurrency', key, 1, 0, 1, 0);
    RETURN true;
END $$;

-- Whether an instance an operator moves to another step (gd_rewind, a
-- compensating gd_cancel) waits for its key, by the status it was in: a
-- running one keeps its turn; a parked one still holds a key of the run
-- scope, else waits its turn as a resumed one does; a failed one takes its
-- key again, or waits.
CREATE OR REPLACE FUNCTION gd._gated_when_moved(was gd.status, gated boolean, key_owner oid, key text)
RETURNS boolean LANGUAGE sql AS $$
    SELECT CASE WHEN was IN ('runnable', 'executing') THEN gated
                ELSE gd._must_gate(key_owner, key, resuming => was <> 'failed') END
$$;

-- The best waiting instances under a key, as many as `room`: key_owner's,
-- or for a shared limit every owner's (each owner's best, one index descent
-- for each owner waiting, then the best of those).
CREATE OR REPLACE FUNCTION gd._gated_best(key_owner oid, key text, shared boolean, room int) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT shared THEN
        RETURN QUERY
        SELECT w.id FROM gd._instances w
         WHERE w.concurrency_key = key AND w.owner = key_owner AND w.gated AND w.status = 'runnable'
         ORDER BY w.priority, w.eligible_at, w.id LIMIT room FOR UPDATE SKIP LOCKED;
        RETURN;
    END IF;
    RETURN QUERY
    WITH RECURSIVE owners(owner) AS (
        (SELECT w.owner::oid FROM gd._instances w
          WHERE w.concurrency_key = key AND w.gated AND w.status = 'runnable'
          ORDER BY w.owner::oid LIMIT 1)
        UNION ALL
        SELECT n.owner FROM owners o CROSS JOIN LATERAL (
            SELECT w.owner::oid AS owner FROM gd._instances w
             WHERE w.concurrency_key = key AND w.gated AND w.status = 'runnable' AND w.owner::oid > o.owner
             ORDER BY w.owner::oid LIMIT 1) n)
    SELECT b.id FROM owners o CROSS JOIN LATERAL (
        SELECT w.id, w.priority, w.eligible_at FROM gd._instances w
         WHERE w.concurrency_key = key AND w.owner = o.owner AND w.gated AND w.status = 'runnable'
         ORDER BY w.priority, w.eligible_at, w.id LIMIT room FOR UPDATE OF w SKIP LOCKED) b
     ORDER BY b.priority, b.eligible_at, b.id LIMIT room;
END $$;

-- Let the best waiting instances under each (owner, key) pair run, as far as
-- there is room, taking the keys in the runners' order.  Returns how many
-- (src/transition.cpp).
CREATE OR REPLACE FUNCTION gd._ungate(owners oid[], keys text[]) RETURNS int
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_ungate';

-- The reaper's repair: keys with waiting instances and room (only hand edits
-- of gd._instances should leave any).  Counted as concurrency_repaired.
CREATE OR REPLACE FUNCTION gd._repair_keys() RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    repaired int := 0;
BEGIN
    SELECT gd._ungate(coalesce(array_agg(k.owner), '{}'), coalesce(array_agg(k.key), '{}')) INTO repaired
      FROM (SELECT DISTINCT w.owner::oid AS owner, w.concurrency_key AS key FROM gd._instances w
             WHERE w.gated AND w.status = 'runnable') k
     WHERE (gd._key_limit(k.key)).max > gd._key_holders(k.owner, k.key, gd._key_limit(k.key));
    PERFORM gd._count('concurrency_repaired', repaired);
    RETURN repaired;
END $$;

-- Delete the limit of that name from `limits` (gd._concurrency_limits or
-- gd._rate_limits); true when there was one.
CREATE OR REPLACE FUNCTION gd._drop_limit(limits regclass, name text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    dropped int;
BEGIN
    EXECUTE format('DELETE FROM %s l WHERE l.name = $1', limits) USING gd._check_limit_name(name);
    GET DIAGNOSTICS dropped = ROW_COUNT;
    RETURN dropped > 0;
END $$;

CREATE OR REPLACE FUNCTION gd._check_limit_name(name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF name IS NULL OR name = '' OR position(':' IN name) > 0 OR octet_length(name) > 63 THEN
        PERFORM gd._bad_argument(format('limit name must be a name of 1 to 63 bytes without '':'', got %s',
                                        coalesce(quote_literal(left(name, 80)), 'NULL')));
    END IF;
    RETURN name;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.gd_set_concurrency_limit(name text, max int, shared boolean DEFAULT false,
                                                                 scope text DEFAULT 'step')
RETURNS void LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._set_concurrency_limit(name text, max int, shared boolean, scope text) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    PERFORM gd._check_limit_name(name);
    IF max IS NULL OR max < 1 THEN
        PERFORM gd._bad_argument(format('concurrency limit %L must be at least 1, got %s',
                                        name, coalesce(max::text, 'NULL')));
    END IF;
    IF shared IS NULL THEN
        PERFORM gd._bad_argument(format('shared of concurrency limit %L must not be NULL', name));
    END IF;
    IF scope IS NULL OR scope NOT IN ('step', 'run') THEN
        PERFORM gd._bad_argument(format('scope of concurrency limit %L must be ''step'' or ''run'', got %s',
                                        name, coalesce(quote_literal(left(scope, 80)), 'NULL')));
    END IF;
    INSERT INTO gd._concurrency_limits AS l (name, max, shared, scope) VALUES (name, max, shared, scope)
    ON CONFLICT ON CONSTRAINT _concurrency_limits_pkey
    DO UPDATE SET max = excluded.max, shared = excluded.shared, scope = excluded.scope;
    -- a raised limit, or a scope narrowed to steps, admits waiting instances now
    PERFORM gd._ungate(array_agg(k.owner), array_agg(k.key))
       FROM (SELECT DISTINCT w.owner::oid AS owner, w.concurrency_key AS key FROM gd._instances w
              WHERE w.gated AND w.status = 'runnable' AND split_part(w.concurrency_key, ':', 1) = name) k;
END $$;

-- Back to the default of 1 per owner.
CREATE OR REPLACE FUNCTION @extschema@.gd_drop_concurrency_limit(name text) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._drop_concurrency_limit(name text) RETURNS boolean
LANGUAGE sql AS $$ SELECT gd._drop_limit('gd._concurrency_limits', name) $$;
