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

-- Take the tokens a batch of picked steps needs, in their order (row i:
-- owners[i]'s step of weights[i] tokens under instance_keys[i] and
-- step_keys[i], either NULL).  Each bucket the batch names is read and
-- locked once; each step takes `weight` tokens from every one of its keys'
-- buckets (its owner's, or the shared one) from what the steps before it
-- left, or none; the buckets are written once.  Per row, in order:
-- `admitted` when taken; otherwise the step does not run now and its
-- instance waits until `not_before`, when the tokens will be there (turns
-- are given out one after another, each reserved in its bucket), or a
-- minute from now when `undefined_limit` names a limit that was dropped; a
-- NULL `not_before`: another picker holds a bucket, try again next round.
-- The caller writes the instances' waits.
CREATE OR REPLACE FUNCTION gd._take_rate_tokens(owners oid[], instance_keys text[], step_keys text[], weights int[],
                                                OUT admitted boolean, OUT not_before timestamptz,
                                                OUT undefined_limit text)
RETURNS SETOF record LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := clock_timestamp();
    never timestamptz := clock_timestamp() + interval '100 years';
    -- The batch's buckets, by (scope, key); 'scope/key' names one.
    names text[];
    scopes regrole[];
    keys text[];
    rates int[];              -- their limit's (NULL: no such limit)
    pers float8[];            -- seconds
    bursts int[];
    locked boolean[];         -- read and locked here (else another picker holds it)
    mint_busy boolean[];      -- missing, and an open transaction is making it
    left_tokens float8[];
    refilled timestamptz[];
    reserved timestamptz[];
    touched boolean[];
    wanted bigint[];
    granted bigint[];
    throttled bigint[];
    contended bigint[];
    row_keys text[];
    row_buckets int[];
    row_levels float8[];
    row_turns timestamptz[];
    b int;
    n int;
    weight int;
    level float8;
    turn timestamptz;
    due timestamptz;
    bucket gd._rate_buckets;
    throttled_steps bigint := 0;
    contended_steps bigint := 0;
BEGIN
    SELECT coalesce(array_agg(u.scope::text || '/' || u.key ORDER BY u.scope, u.key), '{}'),
           coalesce(array_agg(u.scope ORDER BY u.scope, u.key), '{}'), coalesce(array_agg(u.key ORDER BY u.scope, u.key), '{}'),
           coalesce(array_agg(u.rate ORDER BY u.scope, u.key), '{}'), coalesce(array_agg(u.per ORDER BY u.scope, u.key), '{}'),
           coalesce(array_agg(u.burst ORDER BY u.scope, u.key), '{}')
      INTO names, scopes, keys, rates, pers, bursts
      FROM (SELECT DISTINCT CASE WHEN l.shared THEN 0 ELSE r.owner END::regrole AS scope, r.key, l.rate,
                   extract(epoch FROM l.per)::float8 AS per, l.burst
              FROM unnest(owners, instance_keys, step_keys) AS s(owner, instance_key, step_key)
             CROSS JOIN LATERAL (VALUES (s.owner, s.instance_key), (s.owner, s.step_key)) AS r(owner, key)
              LEFT JOIN gd._rate_limits l ON l.name = split_part(r.key, ':', 1)
             WHERE r.key IS NOT NULL) u;
    n := cardinality(names);
    locked := array_fill(false, ARRAY[n]);
    mint_busy := array_fill(false, ARRAY[n]);
    touched := array_fill(false, ARRAY[n]);
    left_tokens := array_fill(NULL::float8, ARRAY[n]);
    refilled := array_fill(NULL::timestamptz, ARRAY[n]);
    reserved := array_fill(NULL::timestamptz, ARRAY[n]);
    wanted := array_fill(0::bigint, ARRAY[n]);
    granted := array_fill(0::bigint, ARRAY[n]);
    throttled := array_fill(0::bigint, ARRAY[n]);
    contended := array_fill(0::bigint, ARRAY[n]);
    FOR pass IN 1..2 LOOP
        FOR bucket IN
            SELECT bk.* FROM gd._rate_buckets bk
              JOIN unnest(scopes, keys, rates) AS u(scope, key, rate) ON bk.scope = u.scope AND bk.key = u.key
             WHERE u.rate IS NOT NULL
             ORDER BY bk.scope, bk.key FOR UPDATE OF bk SKIP LOCKED
        LOOP
            b := array_position(names, bucket.scope::text || '/' || bucket.key);
            locked[b] := true;
            left_tokens[b] := bucket.tokens;
            refilled[b] := bucket.refilled_at;
            reserved[b] := bucket.reserved_until;
        END LOOP;
        EXIT WHEN pass = 2;
        -- Gone (GC) or never made (a step's limit, or a shared one): a full one.
        FOR b IN 1..n LOOP
            IF NOT locked[b] AND rates[b] IS NOT NULL
               AND NOT EXISTS (SELECT FROM gd._rate_buckets bk WHERE bk.scope = scopes[b] AND bk.key = keys[b])
               AND NOT gd._mint_bucket_unless_busy(scopes[b], keys[b], bursts[b], at) THEN
                mint_busy[b] := true;
            END IF;
        END LOOP;
    END LOOP;
    FOR i IN 1..coalesce(cardinality(owners), 0) LOOP
        weight := weights[i];
        admitted := false;
        not_before := NULL;
        undefined_limit := NULL;
        row_keys := ARRAY(SELECT DISTINCT k FROM unnest(ARRAY[instance_keys[i], step_keys[i]]) k
                           WHERE k IS NOT NULL ORDER BY 1);
        row_buckets := '{}';
        row_levels := '{}';
        row_turns := '{}';
        due := NULL;
        FOR k IN 1..cardinality(row_keys) LOOP
            b := coalesce(array_position(names, owners[i]::regrole::text || '/' || row_keys[k]),
                          array_position(names, '-/' || row_keys[k]));
            IF rates[b] IS NULL THEN
                throttled_steps := throttled_steps + 1;
                wanted[b] := wanted[b] + weight;
                throttled[b] := throttled[b] + 1;
                not_before := at + interval '1 minute';
                undefined_limit := split_part(row_keys[k], ':', 1);
                EXIT;
            END IF;
            IF NOT locked[b] THEN
                contended_steps := contended_steps + 1;
                contended[b] := contended[b] + 1;
                IF mint_busy[b] THEN
                    not_before := at + interval '1 second';   -- an open transaction is making it
                END IF;
                undefined_limit := '';   -- stop here
                EXIT;
            END IF;
            level := least(bursts[b]::float8, left_tokens[b] + extract(epoch FROM at - refilled[b]) * rates[b] / pers[b]);
            turn := NULL;
            IF level < weight THEN
                -- the next free turn: after the last one given out, and no sooner than the tokens refill
                turn := least(greatest(coalesce(reserved[b], at),
                                       at + make_interval(secs => least((weight - level) * pers[b] / rates[b], 3155760000))),
                              never);
                due := greatest(due, turn);
            END IF;
            row_buckets := row_buckets || b;
            row_levels := row_levels || level;
            row_turns := row_turns || turn;
        END LOOP;
        IF undefined_limit IS NOT NULL THEN
            undefined_limit := nullif(undefined_limit, '');
            RETURN NEXT;
            CONTINUE;
        END IF;
        FOR k IN 1..cardinality(row_buckets) LOOP
            b := row_buckets[k];
            touched[b] := true;
            wanted[b] := wanted[b] + weight;
            IF due IS NOT NULL THEN
                IF row_turns[k] IS NOT NULL THEN
                    reserved[b] := least(row_turns[k] + make_interval(secs => least(weight * pers[b] / rates[b], 3155760000)),
                                         never);
                    throttled[b] := throttled[b] + 1;
                END IF;
            ELSE
                left_tokens[b] := row_levels[k] - weight;
                refilled[b] := at;
                granted[b] := granted[b] + weight;
            END IF;
        END LOOP;
        IF due IS NOT NULL THEN
            throttled_steps := throttled_steps + 1;
            not_before := due;
        ELSE
            admitted := true;
        END IF;
        RETURN NEXT;
    END LOOP;
    UPDATE gd._rate_buckets bk SET tokens = u.tokens, refilled_at = u.refilled, reserved_until = u.reserved
      FROM unnest(scopes, keys, left_tokens, refilled, reserved, touched) AS u(scope, key, tokens, refilled, reserved, touched)
     WHERE u.touched AND bk.scope = u.scope AND bk.key = u.key;
    PERFORM gd._count('rate_limit_throttled', throttled_steps), gd._count('rate_limit_contended', contended_steps);
    PERFORM gd._count_limit('rate_limit', u.key, u.wanted::int, u.granted::int, u.throttled::int, u.contended::int)
       FROM unnest(keys, wanted, granted, throttled, contended) AS u(key, wanted, granted, throttled, contended)
      WHERE u.wanted + u.contended > 0;
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
