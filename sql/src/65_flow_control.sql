-- ---------------------------------------------------------------------------
-- Flow control: concurrency keys
-- ---------------------------------------------------------------------------
-- An instance with concurrency_key 'name' or 'name:partition' runs only while
-- fewer than the name's limit (1 if unconfigured) of instances holding that
-- exact key are running (runnable or executing).  The others are "gated":
-- runnable, but out of the pick indexes, so a key with a million waiting rows
-- costs a pick nothing.  Admission and release of one key are serialised by a
-- transaction-scoped advisory lock on it, so the count is exact; the state is
-- the rows themselves, so a crash or an expired lease cannot leave a slot
-- taken.

CREATE TABLE gd.concurrency_limits (
    name text PRIMARY KEY,
    max  int NOT NULL CHECK (max > 0)
);

-- Rows holding or waiting for a key.
CREATE INDEX instances_key_running ON gd.instances (concurrency_key)
    WHERE concurrency_key IS NOT NULL AND NOT gated AND status IN ('runnable', 'executing');
CREATE INDEX instances_key_gated ON gd.instances (concurrency_key, priority, eligible_at, id)
    WHERE gated AND status = 'runnable';

CREATE FUNCTION gd._key_limit(key text) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT l.max FROM gd.concurrency_limits l WHERE l.name = split_part(key, ':', 1)), 1)
$$;

-- Serialise admission and release under one key until the transaction ends.
CREATE FUNCTION gd._lock_key(key text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    lock_id bigint := hashtextextended('gen_durable concurrency key ' || key, 0);
BEGIN
    IF NOT pg_try_advisory_xact_lock(lock_id) THEN
        PERFORM gd._count('concurrency_contended');
        PERFORM pg_advisory_xact_lock(lock_id);
    END IF;
END $$;

-- How many more instances may run under the key now (locks the key).
CREATE FUNCTION gd._key_room(key text) RETURNS int
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd._lock_key(key);
    RETURN gd._key_limit(key) - (SELECT count(*) FROM gd.instances i
                                   WHERE i.concurrency_key = key AND NOT i.gated
                                     AND i.status IN ('runnable', 'executing'));
END $$;

-- Should an instance about to run under this key wait its turn?  Counts it.
CREATE FUNCTION gd._must_gate(key text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF key IS NULL OR gd._key_room(key) > 0 THEN
        RETURN false;
    END IF;
    PERFORM gd._count('concurrency_throttled');
    RETURN true;
END $$;

-- Let the best waiting instances of a key run, as far as there is room.
-- Returns how many.
CREATE FUNCTION gd._ungate(key text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    room int := gd._key_room(key);
    admitted int := 0;
    queue_name text;
BEGIN
    IF room <= 0 THEN
        RETURN 0;
    END IF;
    FOR queue_name IN
        UPDATE gd.instances i SET gated = false
         WHERE i.id IN (SELECT w.id FROM gd.instances w
                         WHERE w.concurrency_key = key AND w.gated AND w.status = 'runnable'
                         ORDER BY w.priority, w.eligible_at, w.id LIMIT room FOR UPDATE SKIP LOCKED)
        RETURNING i.queue
    LOOP
        PERFORM gd._wake_on_commit(queue_name);
        admitted := admitted + 1;
    END LOOP;
    RETURN admitted;
END $$;

-- The reaper's repair: keys with waiting instances and room (only hand edits
-- of gd.instances should leave any).  Counted as concurrency_repaired.
CREATE FUNCTION gd._repair_keys() RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    repaired int := 0;
BEGIN
    SELECT coalesce(sum(gd._ungate(k.key)), 0) INTO repaired
      FROM (SELECT DISTINCT w.concurrency_key AS key FROM gd.instances w
             WHERE w.gated AND w.status = 'runnable') k
     WHERE gd._key_limit(k.key) > (SELECT count(*) FROM gd.instances i
                                     WHERE i.concurrency_key = k.key AND NOT i.gated
                                       AND i.status IN ('runnable', 'executing'));
    PERFORM gd._count('concurrency_repaired', repaired);
    RETURN repaired;
END $$;

CREATE FUNCTION gd._check_limit_name(name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF name IS NULL OR name = '' OR position(':' IN name) > 0 THEN
        PERFORM gd._bad_argument(format('limit name must be a non-empty name without '':'', got %s',
                                        coalesce(quote_literal(name), 'NULL')));
    END IF;
    RETURN name;
END $$;

CREATE FUNCTION @extschema@.gd_set_concurrency_limit(name text, max int) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    PERFORM gd._check_limit_name(name);
    IF max IS NULL OR max < 1 THEN
        PERFORM gd._bad_argument(format('concurrency limit %L must be at least 1, got %s',
                                        name, coalesce(max::text, 'NULL')));
    END IF;
    INSERT INTO gd.concurrency_limits AS l (name, max) VALUES (name, max)
    ON CONFLICT ON CONSTRAINT concurrency_limits_pkey DO UPDATE SET max = excluded.max;
    -- a raised limit admits waiting instances now
    PERFORM gd._ungate(k.key)
       FROM (SELECT DISTINCT w.concurrency_key AS key FROM gd.instances w
              WHERE w.gated AND w.status = 'runnable' AND split_part(w.concurrency_key, ':', 1) = name) k;
END $$;

-- Back to the default of 1.
CREATE FUNCTION @extschema@.gd_drop_concurrency_limit(name text) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    DELETE FROM gd.concurrency_limits l WHERE l.name = gd._check_limit_name(name);
    RETURN FOUND;
END $$;

-- ---------------------------------------------------------------------------
-- Flow control: rate limits
-- ---------------------------------------------------------------------------
-- A rate limit allows `rate` tokens per `per`, saving up at most `burst`.
-- Each partition of a limit ('name:partition') has its own token bucket.  A
-- step of an instance inserted with rate_limit (and of a step defined with
-- one) takes `weight` tokens when it is picked; without enough tokens the
-- instance stays runnable and becomes eligible again when they will be
-- there, each at its own turn.  Buckets are made by gd_set_rate_limit and by the insert that first
-- names a partition, so pickers normally only update them.

CREATE TABLE gd.rate_limits (
    name  text PRIMARY KEY,
    rate  int NOT NULL CHECK (rate > 0),
    per   interval NOT NULL CHECK (per > '0'),
    burst int NOT NULL CHECK (burst > 0)
);

CREATE TABLE gd.rate_buckets (
    key            text PRIMARY KEY,
    tokens         float8 NOT NULL,
    refilled_at    timestamptz NOT NULL,
    -- Throttled steps are given turns one after another up to here, so a
    -- backlog is not re-picked and pushed back again and again.
    reserved_until timestamptz
);

-- The policy of a rate limit key, or 42704.
CREATE FUNCTION gd._rate_policy(key text) RETURNS gd.rate_limits
LANGUAGE plpgsql STABLE AS $$
DECLARE
    policy gd.rate_limits;
BEGIN
    SELECT * INTO policy FROM gd.rate_limits l WHERE l.name = split_part(key, ':', 1);
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_object',
            MESSAGE = format('gen_durable: unknown rate limit %L', split_part(key, ':', 1)),
            HINT = 'Define it first with gd_set_rate_limit(name, rate, per).';
    END IF;
    RETURN policy;
END $$;

-- A full bucket for the key, unless it exists.
CREATE FUNCTION gd._mint_bucket(key text, burst int) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO gd.rate_buckets (key, tokens, refilled_at) VALUES (key, burst, clock_timestamp())
    ON CONFLICT DO NOTHING
$$;

-- Validate an insert's rate limit and weight, and make its bucket.
CREATE FUNCTION gd._check_rate_limit(key text, weight int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    policy gd.rate_limits;
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
    PERFORM gd._mint_bucket(key, policy.burst);
END $$;

-- Take `weight` tokens from every key's bucket, or none.  Returns NULL when
-- taken; otherwise the instance (locked by the caller) does not run now:
-- 'throttled' (pushed back until the tokens will be there), 'contended'
-- (another picker holds a bucket: try again next round) or 'undefined:NAME'
-- (the limit was dropped: pushed back a minute at a time).
CREATE FUNCTION gd._admit_rate(instance_id bigint, keys text[], weight int) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    bucket_key text;
    policy gd.rate_limits;
    bucket gd.rate_buckets;
    level float8;
    held text[] := '{}';
    levels float8[] := '{}';
    turns timestamptz[] := '{}';
    turn timestamptz;
    due timestamptz := NULL;
    at timestamptz := clock_timestamp();
BEGIN
    FOR bucket_key IN SELECT DISTINCT k FROM unnest(keys) k WHERE k IS NOT NULL ORDER BY 1 LOOP
        SELECT * INTO policy FROM gd.rate_limits l WHERE l.name = split_part(bucket_key, ':', 1);
        IF NOT FOUND THEN
            UPDATE gd.instances i SET eligible_at = at + interval '1 minute' WHERE i.id = instance_id;
            PERFORM gd._count('rate_limit_throttled');
            RETURN 'undefined:' || split_part(bucket_key, ':', 1);
        END IF;
        SELECT * INTO bucket FROM gd.rate_buckets b WHERE b.key = bucket_key FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            PERFORM gd._mint_bucket(bucket_key, policy.burst);   -- gone (GC) or never made: a full one
            SELECT * INTO bucket FROM gd.rate_buckets b WHERE b.key = bucket_key FOR UPDATE SKIP LOCKED;
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
            turn := greatest(coalesce(bucket.reserved_until, at),
                             at + make_interval(secs => (weight - level) * extract(epoch FROM policy.per) / policy.rate));
            due := greatest(due, turn);
        END IF;
        held := held || bucket_key;
        levels := levels || level;
        turns := turns || turn;
    END LOOP;
    IF due IS NOT NULL THEN
        UPDATE gd.rate_buckets b
           SET reserved_until = t.turn + make_interval(secs => weight * extract(epoch FROM l.per) / l.rate)
          FROM unnest(held, turns) AS t(key, turn), gd.rate_limits l
         WHERE b.key = t.key AND t.turn IS NOT NULL AND l.name = split_part(t.key, ':', 1);
        UPDATE gd.instances i SET eligible_at = due WHERE i.id = instance_id;
        PERFORM gd._count('rate_limit_throttled');
        RETURN 'throttled';
    END IF;
    UPDATE gd.rate_buckets b SET tokens = t.level - weight, refilled_at = at
      FROM unnest(held, levels) AS t(key, level) WHERE b.key = t.key;
    RETURN NULL;
END $$;

CREATE FUNCTION @extschema@.gd_set_rate_limit(name text, rate int, per interval, burst int DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    PERFORM gd._check_limit_name(name);
    IF rate IS NULL OR rate < 1 THEN
        PERFORM gd._bad_argument(format('rate of rate limit %L must be at least 1, got %s', name, coalesce(rate::text, 'NULL')));
    END IF;
    IF per IS NULL OR per <= interval '0' THEN
        PERFORM gd._bad_argument(format('per of rate limit %L must be a positive interval, got %s', name, coalesce(per::text, 'NULL')));
    END IF;
    IF burst IS NOT NULL AND burst < 1 THEN
        PERFORM gd._bad_argument(format('burst of rate limit %L must be at least 1, got %s', name, burst));
    END IF;
    INSERT INTO gd.rate_limits AS l (name, rate, per, burst) VALUES (name, rate, per, coalesce(burst, rate))
    ON CONFLICT ON CONSTRAINT rate_limits_pkey
    DO UPDATE SET rate = excluded.rate, per = excluded.per, burst = excluded.burst;
    PERFORM gd._mint_bucket(name, coalesce(burst, rate));
END $$;

-- Instances still naming it wait (counted, and logged once by each executor).
CREATE FUNCTION @extschema@.gd_drop_rate_limit(name text) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    DELETE FROM gd.rate_limits l WHERE l.name = gd._check_limit_name(name);
    RETURN FOUND;
END $$;
