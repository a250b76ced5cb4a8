-- ---------------------------------------------------------------------------
-- Flow control: concurrency keys
-- ---------------------------------------------------------------------------
-- An instance with concurrency_key 'name' or 'name:partition' runs only while
-- fewer than the name's limit (1 if unconfigured) of instances holding that
-- exact key are running (runnable or executing).  Keys belong to tenants: an
-- instance counts only against instances of the same owner, so no role can
-- occupy or see another's keys — unless an administrator made the name's
-- limit shared (gd_set_concurrency_limit(..., shared => true)), and every
-- owner's instances holding the key count together.  The others are
-- "gated": runnable, but out of the pick indexes, so a key with a million
-- waiting rows costs a pick nothing.  Admission and release under one key
-- are serialised by a transaction-scoped advisory lock on it, so the count
-- is exact; the state is the rows themselves, so a crash or an expired
-- lease cannot leave a slot taken.

CREATE TABLE IF NOT EXISTS gd._concurrency_limits (
    name   text PRIMARY KEY,
    max    int NOT NULL CHECK (max > 0),
    shared boolean NOT NULL DEFAULT false   -- counted across owners, not per owner
);

-- Rows holding or waiting for a key.
CREATE INDEX IF NOT EXISTS instances_key_running ON gd._instances (concurrency_key, owner)
    WHERE concurrency_key IS NOT NULL AND NOT gated AND status IN ('runnable', 'executing');
CREATE INDEX IF NOT EXISTS instances_key_gated ON gd._instances (concurrency_key, owner, priority, eligible_at, id)
    WHERE gated AND status = 'runnable';

-- The limit of a key: its name's, or 1 per owner when the name has none.
CREATE OR REPLACE FUNCTION gd._key_limit(key text) RETURNS gd._concurrency_limits
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT l FROM gd._concurrency_limits l WHERE l.name = split_part(key, ':', 1)),
                    ROW(split_part(key, ':', 1), 1, false)::gd._concurrency_limits)
$$;

-- How many instances hold the key and are running: of key_owner, or of every owner when shared.
CREATE OR REPLACE FUNCTION gd._key_running(key_owner oid, key text, shared boolean) RETURNS int
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF shared THEN
        RETURN (SELECT count(*) FROM gd._instances i
                 WHERE i.concurrency_key = key AND NOT i.gated AND i.status IN ('runnable', 'executing'));
    END IF;
    RETURN (SELECT count(*) FROM gd._instances i
             WHERE i.concurrency_key = key AND i.owner = key_owner AND NOT i.gated
               AND i.status IN ('runnable', 'executing'));
END $$;

-- Serialise admission and release under one key, in one owner's key space
-- (or in all of them for a shared limit), until the transaction ends.
CREATE OR REPLACE FUNCTION gd._lock_key(key_owner oid, key text, shared boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    lock_id bigint := hashtextextended('gen_durable concurrency key '
                                       || CASE WHEN shared THEN '' ELSE key_owner::text || '/' END || key, 0);
BEGIN
    IF NOT pg_try_advisory_xact_lock(lock_id) THEN
        PERFORM gd._count('concurrency_contended');
        PERFORM pg_advisory_xact_lock(lock_id);
    END IF;
END $$;

-- How many more instances of key_owner may run under the key now (locks the key).
CREATE OR REPLACE FUNCTION gd._key_room(key_owner oid, key text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    policy gd._concurrency_limits := gd._key_limit(key);
BEGIN
    PERFORM gd._lock_key(key_owner, key, policy.shared);
    RETURN policy.max - gd._key_running(key_owner, key, policy.shared);
END $$;

-- Should an instance of key_owner about to run under this key wait its turn?  Counts it.
CREATE OR REPLACE FUNCTION gd._must_gate(key_owner oid, key text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF key IS NULL OR gd._key_room(key_owner, key) > 0 THEN
        RETURN false;
    END IF;
    PERFORM gd._count('concurrency_throttled');
    RETURN true;
END $$;

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

-- Let the best waiting instances under key_owner's key run, as far as there
-- is room.  Returns how many.
CREATE OR REPLACE FUNCTION gd._ungate(key_owner oid, key text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    room int := gd._key_room(key_owner, key);
    admitted int := 0;
    queue_name text;
BEGIN
    IF room <= 0 THEN
        RETURN 0;
    END IF;
    FOR queue_name IN
        UPDATE gd._instances i SET gated = false
         WHERE i.id IN (SELECT gd._gated_best(key_owner, key, (gd._key_limit(key)).shared, room))
        RETURNING i.queue
    LOOP
        PERFORM gd._wake_on_commit(queue_name);
        admitted := admitted + 1;
    END LOOP;
    RETURN admitted;
END $$;

-- The reaper's repair: keys with waiting instances and room (only hand edits
-- of gd._instances should leave any).  Counted as concurrency_repaired.
CREATE OR REPLACE FUNCTION gd._repair_keys() RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    repaired int := 0;
BEGIN
    SELECT coalesce(sum(gd._ungate(k.owner, k.key)), 0) INTO repaired
      FROM (SELECT DISTINCT w.owner::oid AS owner, w.concurrency_key AS key FROM gd._instances w
             WHERE w.gated AND w.status = 'runnable') k
     WHERE (gd._key_limit(k.key)).max > gd._key_running(k.owner, k.key, (gd._key_limit(k.key)).shared);
    PERFORM gd._count('concurrency_repaired', repaired);
    RETURN repaired;
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

CREATE OR REPLACE FUNCTION @extschema@.gd_set_concurrency_limit(name text, max int, shared boolean DEFAULT false)
RETURNS void LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._set_concurrency_limit(name text, max int, shared boolean) RETURNS void
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
    INSERT INTO gd._concurrency_limits AS l (name, max, shared) VALUES (name, max, shared)
    ON CONFLICT ON CONSTRAINT _concurrency_limits_pkey DO UPDATE SET max = excluded.max, shared = excluded.shared;
    -- a raised limit admits waiting instances now
    PERFORM gd._ungate(k.owner, k.key)
       FROM (SELECT DISTINCT w.owner::oid AS owner, w.concurrency_key AS key FROM gd._instances w
              WHERE w.gated AND w.status = 'runnable' AND split_part(w.concurrency_key, ':', 1) = name
              ORDER BY 2, 1) k;
END $$;

-- Back to the default of 1 per owner.
CREATE OR REPLACE FUNCTION @extschema@.gd_drop_concurrency_limit(name text) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._drop_concurrency_limit(name text) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    DELETE FROM gd._concurrency_limits l WHERE l.name = gd._check_limit_name(name);
    RETURN FOUND;
END $$;

-- ---------------------------------------------------------------------------
-- Flow control: rate limits
-- ---------------------------------------------------------------------------
-- A rate limit allows `rate` tokens per `per`, saving up at most `burst`.
-- Each owner has its own token bucket per limit and per partition
-- ('name:partition') of it, so no role can exhaust another's; a shared
-- limit (gd_set_rate_limit(..., shared => true), an administrator's act)
-- has one bucket per key for every owner.  A step of an instance inserted
-- with rate_limit (and of a step defined with one) takes `weight` tokens
-- when it is picked; without enough tokens the instance stays runnable and
-- becomes eligible again when they will be there, each at its own turn.
-- Buckets are made by the insert that first names a key (and by
-- gd_set_rate_limit for a shared limit), so pickers normally only update
-- them.

CREATE TABLE IF NOT EXISTS gd._rate_limits (
    name   text PRIMARY KEY,
    rate   int NOT NULL CHECK (rate > 0),
    per    interval NOT NULL CHECK (per > '0'),
    burst  int NOT NULL CHECK (burst > 0),
    shared boolean NOT NULL DEFAULT false   -- one bucket per key for all owners, not one per owner
);

CREATE TABLE IF NOT EXISTS gd._rate_buckets (
    key            text NOT NULL,
    tokens         float8 NOT NULL,
    refilled_at    timestamptz NOT NULL,
    -- Throttled steps are given turns one after another up to here, so a
    -- backlog is not re-picked and pushed back again and again.
    reserved_until timestamptz,
    scope          regrole NOT NULL, -- the owner whose steps take from it; 0 ('-') for a shared limit
    PRIMARY KEY (scope, key)
);

-- The policy of a rate limit key, or 42704.
CREATE OR REPLACE FUNCTION gd._rate_policy(key text) RETURNS gd._rate_limits
LANGUAGE plpgsql STABLE AS $$
DECLARE
    policy gd._rate_limits;
BEGIN
    SELECT * INTO policy FROM gd._rate_limits l WHERE l.name = split_part(key, ':', 1);
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_object',
            MESSAGE = format('gen_durable: unknown rate limit %L', split_part(key, ':', 1)),
            HINT = 'Define it first with gd_set_rate_limit(name, rate, per).';
    END IF;
    RETURN policy;
END $$;

-- The bucket scope of an owner's steps under a limit.
CREATE OR REPLACE FUNCTION gd._bucket_scope(bucket_owner oid, policy gd._rate_limits) RETURNS regrole
LANGUAGE sql IMMUTABLE AS $$ SELECT (CASE WHEN policy.shared THEN 0 ELSE bucket_owner END)::regrole $$;

-- A bucket for the key full at `at`, unless it exists.
CREATE OR REPLACE FUNCTION gd._mint_bucket(scope regrole, key text, burst int, at timestamptz DEFAULT clock_timestamp())
RETURNS void LANGUAGE sql AS $$
    INSERT INTO gd._rate_buckets (scope, key, tokens, refilled_at) VALUES (scope, key, burst, at)
    ON CONFLICT DO NOTHING
$$;

-- Validate an insert's rate limit and weight, and make its owner's bucket.
CREATE OR REPLACE FUNCTION gd._check_rate_limit(bucket_owner oid, key text, weight int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    policy gd._rate_limits;
BEGIN
    IF key IS NULL THEN
        RETURN;
    END IF;
    IF key = '' OR split_part(key, ':', 1) = '' THEN
        PERFORM gd._bad_argument(format('rate_limit must be name or name:partition, got %L', key));
    END IF;
    policy := gd._rate_policy(key);
    IF weight > policy.burst THEN
        PERFORM gd._bad_argument(format('weight %s exceeds the burst %s of rate limit %L: it could never run',
                                        weight, policy.burst, policy.name));
    END IF;
    PERFORM gd._mint_bucket(gd._bucket_scope(bucket_owner, policy), key, policy.burst);
END $$;

-- How long `tokens` take to refill under a policy; at most 100 years (a
-- longer wait means never, and its timestamp would overflow).
CREATE OR REPLACE FUNCTION gd._rate_wait(tokens float8, policy gd._rate_limits) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT make_interval(secs => least(tokens * extract(epoch FROM policy.per) / policy.rate, 3155760000))
$$;

-- Take `weight` tokens from every key's bucket (the instance owner's, or
-- the shared one), or none.  Returns NULL when taken; otherwise the
-- instance (locked by the caller) does not run now: 'throttled' (pushed
-- back until the tokens will be there), 'contended' (another picker holds
-- a bucket: try again next round) or 'undefined:NAME' (the limit was
-- dropped: pushed back a minute at a time).
CREATE OR REPLACE FUNCTION gd._admit_rate(instance_id bigint, bucket_owner oid, keys text[], weight int) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    bucket_key text;
    policy gd._rate_limits;
    bucket gd._rate_buckets;
    level float8;
    held_scopes regrole[] := '{}';
    held text[] := '{}';
    levels float8[] := '{}';
    turns timestamptz[] := '{}';
    turn timestamptz;
    due timestamptz := NULL;
    at timestamptz := clock_timestamp();
BEGIN
    FOR bucket_key IN SELECT DISTINCT k FROM unnest(keys) k WHERE k IS NOT NULL ORDER BY 1 LOOP
        SELECT * INTO policy FROM gd._rate_limits l WHERE l.name = split_part(bucket_key, ':', 1);
        IF NOT FOUND THEN
            UPDATE gd._instances i SET eligible_at = at + interval '1 minute' WHERE i.id = instance_id;
            PERFORM gd._count('rate_limit_throttled');
            RETURN 'undefined:' || split_part(bucket_key, ':', 1);
        END IF;
        SELECT * INTO bucket FROM gd._rate_buckets b
         WHERE b.scope = gd._bucket_scope(bucket_owner, policy) AND b.key = bucket_key FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            -- gone (GC) or never made (a step's limit, or a shared one): a full one
            PERFORM gd._mint_bucket(gd._bucket_scope(bucket_owner, policy), bucket_key, policy.burst, at);
            SELECT * INTO bucket FROM gd._rate_buckets b
             WHERE b.scope = gd._bucket_scope(bucket_owner, policy) AND b.key = bucket_key FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                PERFORM gd._count('rate_limit_contended');
                RETURN 'contended';
            END IF;
        END IF;
        level := least(policy.burst::float8,
                       bucket.tokens + extract(epoch FROM at - bucket.refilled_at) * policy.rate
                                       / extract(epoch FROM policy.per));
        turn := NULL;
        IF level < weight THEN
            -- the next free turn: after the last one given out, and no sooner than the tokens refill
            turn := least(greatest(coalesce(bucket.reserved_until, at), at + gd._rate_wait(weight - level, policy)),
                          at + interval '100 years');
            due := greatest(due, turn);
        END IF;
        held_scopes := held_scopes || bucket.scope;
        held := held || bucket_key;
        levels := levels || level;
        turns := turns || turn;
    END LOOP;
    IF due IS NOT NULL THEN
        UPDATE gd._rate_buckets b
           SET reserved_until = least(t.turn + gd._rate_wait(weight, l), at + interval '100 years')
          FROM unnest(held_scopes, held, turns) AS t(scope, key, turn), gd._rate_limits l
         WHERE b.scope = t.scope AND b.key = t.key AND t.turn IS NOT NULL AND l.name = split_part(t.key, ':', 1);
        UPDATE gd._instances i SET eligible_at = due WHERE i.id = instance_id;
        PERFORM gd._count('rate_limit_throttled');
        RETURN 'throttled';
    END IF;
    UPDATE gd._rate_buckets b SET tokens = t.level - weight, refilled_at = at
      FROM unnest(held_scopes, held, levels) AS t(scope, key, level) WHERE b.scope = t.scope AND b.key = t.key;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.gd_set_rate_limit(name text, rate int, per interval, burst int DEFAULT NULL,
                                              shared boolean DEFAULT false)
RETURNS void LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._set_rate_limit(name text, rate int, per interval, burst int, shared boolean) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    PERFORM gd._check_limit_name(name);
    IF rate IS NULL OR rate < 1 THEN
        PERFORM gd._bad_argument(format('rate of rate limit %L must be at least 1, got %s', name, coalesce(rate::text, 'NULL')));
    END IF;
    IF per IS NULL OR per <= interval '0' THEN
        PERFORM gd._bad_argument(format('per of rate limit %L must be a positive interval, got %s', name, coalesce(per::text, 'NULL')));
    END IF;
    PERFORM gd._check_interval(per, 'per');
    IF burst IS NOT NULL AND burst < 1 THEN
        PERFORM gd._bad_argument(format('burst of rate limit %L must be at least 1, got %s', name, burst));
    END IF;
    IF shared IS NULL THEN
        PERFORM gd._bad_argument(format('shared of rate limit %L must not be NULL', name));
    END IF;
    INSERT INTO gd._rate_limits AS l (name, rate, per, burst, shared)
    VALUES (name, rate, per, coalesce(burst, rate), shared)
    ON CONFLICT ON CONSTRAINT _rate_limits_pkey
    DO UPDATE SET rate = excluded.rate, per = excluded.per, burst = excluded.burst, shared = excluded.shared;
    IF shared THEN
        PERFORM gd._mint_bucket('-', name, coalesce(burst, rate));
    END IF;
END $$;

-- Instances still naming it wait (counted, and logged once by each executor).
CREATE OR REPLACE FUNCTION @extschema@.gd_drop_rate_limit(name text) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._drop_rate_limit(name text) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    DELETE FROM gd._rate_limits l WHERE l.name = gd._check_limit_name(name);
    RETURN FOUND;
END $$;
