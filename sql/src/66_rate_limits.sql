-- ---------------------------------------------------------------------------
-- Rate limits: token buckets per key
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

-- The same for a picker (an executor, a claim), which may not wait for an
-- open transaction that is making that bucket: it tries again next round.
-- False when it would have to wait.
CREATE OR REPLACE FUNCTION gd._mint_bucket_unless_busy(scope regrole, key text, burst int, at timestamptz)
RETURNS boolean LANGUAGE plpgsql SET lock_timeout = '100ms' AS $$
BEGIN
    PERFORM gd._mint_bucket(scope, key, burst, at);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END $$;

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
-- the shared one), or none.  `admitted` when taken; otherwise the step does
-- not run now, and its instance waits until `not_before`: when the tokens
-- will be there, or a minute from now when `undefined_limit` names a limit
-- that was dropped.  A NULL `not_before`: another picker holds a bucket, try
-- again next round.  The caller writes the instance's wait.
CREATE OR REPLACE FUNCTION gd._take_rate_tokens(bucket_owner oid, keys text[], weight int,
                                                OUT admitted boolean, OUT not_before timestamptz,
                                                OUT undefined_limit text)
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
            PERFORM gd._count('rate_limit_throttled'), gd._count_limit('rate_limit', bucket_key, weight, 0, 1, 0);
            admitted := false;
            not_before := at + interval '1 minute';
            undefined_limit := split_part(bucket_key, ':', 1);
            RETURN;
        END IF;
        SELECT * INTO bucket FROM gd._rate_buckets b
         WHERE b.scope = gd._bucket_scope(bucket_owner, policy) AND b.key = bucket_key FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            -- gone (GC) or never made (a step's limit, or a shared one): a full one
            IF NOT gd._mint_bucket_unless_busy(gd._bucket_scope(bucket_owner, policy), bucket_key, policy.burst, at)
            THEN
                -- an open transaction is making it: look again in a second
                PERFORM gd._count('rate_limit_contended'), gd._count_limit('rate_limit', bucket_key, 0, 0, 0, 1);
                admitted := false;
                not_before := at + interval '1 second';
                RETURN;
            END IF;
            SELECT * INTO bucket FROM gd._rate_buckets b
             WHERE b.scope = gd._bucket_scope(bucket_owner, policy) AND b.key = bucket_key FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                PERFORM gd._count('rate_limit_contended'), gd._count_limit('rate_limit', bucket_key, 0, 0, 0, 1);
                admitted := false;
                RETURN;
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
        PERFORM gd._count('rate_limit_throttled');
        PERFORM gd._count_limit('rate_limit', t.key, weight, 0, (t.turn IS NOT NULL)::int, 0)
           FROM unnest(held, turns) AS t(key, turn);
        admitted := false;
        not_before := due;
        RETURN;
    END IF;
    UPDATE gd._rate_buckets b SET tokens = t.level - weight, refilled_at = at
      FROM unnest(held_scopes, held, levels) AS t(scope, key, level) WHERE b.scope = t.scope AND b.key = t.key;
    PERFORM gd._count_limit('rate_limit', k, weight, weight, 0, 0) FROM unnest(held) k;
    admitted := true;
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

-- Instances still naming it wait (counted, and a warning once per executor or
-- claiming session and name).
CREATE OR REPLACE FUNCTION @extschema@.gd_drop_rate_limit(name text) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._drop_rate_limit(name text) RETURNS boolean
LANGUAGE sql AS $$ SELECT gd._drop_limit('gd._rate_limits', name) $$;
