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
