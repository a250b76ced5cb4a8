-- ---------------------------------------------------------------------------
-- External workers: claims, leases, NOTIFY gd_work
-- ---------------------------------------------------------------------------
-- A step without a handler is run by a worker outside the database.  The
-- worker claims it (gd_claim): the row becomes `executing` under a lease
-- owned by a fresh token.  The worker completes it with an outcome
-- (gd_complete), extends the lease while it works (gd_heartbeat), or hands it
-- back unrun (gd_release).  The reaper reclaims leases that expire
-- (gd._expire_leases): the step is runnable again and the attempt counted.
--
-- Workers LISTEN on channel gd_work: at the commit of whatever makes external
-- work runnable now, the engine sends NOTIFY gd_work, '<queue>' (at most once
-- per transaction and queue).  Triggers on gd._instances and gd._queues see
-- every such change, whichever path makes it; work scheduled for later is
-- announced by the reaper when it comes due.  Executors are never woken
-- through NOTIFY.

-- Each claim's lease token: a token names one claim, never reused.
CREATE SEQUENCE IF NOT EXISTS gd._lease_tokens;

-- gd_claim's pick: runnable external steps of a queue, by lane, each lane's best first.
CREATE INDEX IF NOT EXISTS instances_claim ON gd._instances (queue, priority, owner, fairness_lane, eligible_at, id)
    WHERE status = 'runnable' AND external AND NOT gated;
-- The reaper: leases soonest to expire, and external work soonest to come
-- due (only work scheduled past its last change is the reaper's to
-- announce: work eligible by then was announced at that change's commit).
-- The predicate names lease_owner, which a claim never does, so a claim
-- cannot be planned on this index (from an empty table's statistics the
-- planner read a claim's whole backlog through it, and sorted it); and not
-- updated_at, which every transition writes: an indexed column there would
-- make no update of an instance HOT.
CREATE INDEX IF NOT EXISTS instances_lease ON gd._instances (lease_expires_at) WHERE status = 'executing';
CREATE INDEX IF NOT EXISTS instances_external_due ON gd._instances (eligible_at)
    WHERE status = 'runnable' AND external AND lease_owner IS NULL;

-- Up to when the reaper has announced scheduled external work (one row).
CREATE TABLE IF NOT EXISTS gd._external_due_announced (until timestamptz NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS external_due_announced_one_row ON gd._external_due_announced ((true));
INSERT INTO gd._external_due_announced VALUES ('-infinity') ON CONFLICT DO NOTHING;

-- ---------------------------------------------------------------------------
-- NOTIFY gd_work at commit (implemented in C++: src/notify.cpp)
-- ---------------------------------------------------------------------------

-- NOTIFY gd_work, queue when the transaction commits (once per queue).
CREATE OR REPLACE FUNCTION gd._notify_work_on_commit(queue text) RETURNS void
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_notify_work_on_commit';
-- Row trigger, arguments (queue column [, eligible_at column]): the row is
-- runnable external work of that queue, announced at commit if it is eligible
-- by then (always, without an eligible_at column), else by the reaper.
CREATE OR REPLACE FUNCTION gd._external_work_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_external_work_changed';

-- (Work waiting for room under its concurrency key is not claimable: it is
-- announced when admitted.)
CREATE OR REPLACE TRIGGER external_work_inserted AFTER INSERT ON gd._instances
    FOR EACH ROW WHEN (NEW.status = 'runnable' AND NEW.external AND NOT NEW.gated)
    EXECUTE FUNCTION gd._external_work_changed('queue', 'eligible_at');
CREATE OR REPLACE TRIGGER external_work_updated AFTER UPDATE ON gd._instances
    FOR EACH ROW WHEN (NEW.status = 'runnable' AND NEW.external AND NOT NEW.gated
                       AND (OLD.status <> 'runnable' OR NOT OLD.external OR OLD.gated
                            OR OLD.eligible_at <> NEW.eligible_at OR OLD.queue <> NEW.queue))
    EXECUTE FUNCTION gd._external_work_changed('queue', 'eligible_at');
-- A resumed queue: its external work can be claimed again.
CREATE OR REPLACE TRIGGER external_queue_resumed AFTER UPDATE ON gd._queues
    FOR EACH ROW WHEN (OLD.paused AND NOT NEW.paused)
    EXECUTE FUNCTION gd._external_work_changed('name');

-- ---------------------------------------------------------------------------
-- The worker's API
-- ---------------------------------------------------------------------------

-- gen_durable.lease, the default lease of a claim.
CREATE OR REPLACE FUNCTION gd._default_lease() RETURNS interval LANGUAGE sql STABLE
    AS $$ SELECT coalesce(current_setting('gen_durable.lease', true), '30s')::interval $$;

-- A lease or its extension: positive, at most 100 years (src/outcomes.cpp, as gd_heartbeat checks it).
CREATE OR REPLACE FUNCTION gd._check_lease(value interval, what text) RETURNS interval
    LANGUAGE c IMMUTABLE STRICT AS 'MODULE_PATHNAME', 'gd_check_lease_sql';

-- Claim up to `max` runnable external steps of a queue, best first (priority,
-- then eligibility, then id), skipping rows other claimers hold.  They are
-- `executing` under a lease of `lease` (default gen_durable.lease) when the
-- caller commits.  A paused queue yields nothing.  `fsms`: only steps of
-- these FSMs, those the caller may use (a worker names those it has
-- handlers for; one not defined yet holds nothing back); without it, those
-- of the caller's own FSMs and of the grants it accepted.  `wait`: when
-- there is nothing to claim, wait up to that long for work of the queue to
-- commit (src/claim_wait.cpp), and claim it.
CREATE OR REPLACE FUNCTION @extschema@.gd_claim(queue text, worker text, max int DEFAULT 1, lease interval DEFAULT NULL,
                                                fsms text[] DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS TABLE (id bigint, fsm text, version int, step text, state jsonb, ctx gd.context, lease_token bigint)
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._claim(queue text, worker text, max int, lease interval, fsms text[], wait interval)
RETURNS TABLE (id bigint, fsm text, version int, step text, state jsonb, ctx gd.context, lease_token bigint)
LANGUAGE plpgsql AS $$
DECLARE
    caller oid := gd._caller();
    claim_queue text := _claim.queue;
    claim_worker text := _claim.worker;
    claim_max int := _claim.max;
    lease_length interval := gd._check_lease(coalesce(_claim.lease, gd._default_lease()), 'lease');
    usable text[];   -- the FSMs claimed from; NULL: all (a superuser's claim without fsms)
    wait_until timestamptz;
    wait_ms int;
    claimed boolean;
BEGIN
    PERFORM gd._known_queue(claim_queue);
    IF claim_worker IS NULL OR claim_worker = '' THEN
        PERFORM gd._bad_argument('worker must name the claiming worker, got ' || coalesce(quote_literal(claim_worker), 'NULL'));
    END IF;
    IF claim_max IS NULL OR claim_max < 1 OR claim_max > 1000 THEN
        PERFORM gd._bad_argument(format('max must be between 1 and 1000, got %s', coalesce(claim_max::text, 'NULL')));
    END IF;
    -- (Sorted: the set names the claim frontier these claims share, src/picker.cpp.)
    IF array_position(fsms, NULL) IS NOT NULL THEN
        PERFORM gd._bad_argument('fsms must name FSMs, got a NULL');
    END IF;
    IF fsms IS NOT NULL THEN
        usable := ARRAY(SELECT DISTINCT f FROM unnest(fsms) f WHERE gd._may_use(caller, f) ORDER BY 1);
    ELSIF gd._own_roles(caller) IS NOT NULL THEN
        usable := gd._implicit_fsms(gd._own_roles(caller));
    END IF;
    IF _claim.wait IS NULL OR _claim.wait = interval '0' THEN
        RETURN QUERY SELECT * FROM gd._claim_steps(claim_queue, claim_worker, claim_max, lease_length, usable);
        RETURN;
    END IF;
    IF _claim.wait < interval '0' OR _claim.wait > interval '1 hour' THEN
        PERFORM gd._bad_argument(format('wait must be between 0 and 1 hour, got %s', _claim.wait));
    END IF;
    -- Asked before the first pick: a pick that finds nothing may have taken a transaction id itself
    -- (a row it tried to lock, claimed meanwhile by another worker).
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_transaction_state',
            MESSAGE = 'gen_durable: gd_claim cannot wait in a transaction that has written',
            DETAIL = 'It would hold that transaction''s locks while it waits.',
            HINT = 'Claim with wait in a transaction of its own (or without wait).';
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_transaction_state',
            MESSAGE = 'gen_durable: gd_claim cannot wait in a ' || current_setting('transaction_isolation')
                      || ' transaction',
            DETAIL = 'Its snapshot would never see the work that commits while it waits.',
            HINT = 'Claim with wait in a read committed transaction (or without wait).';
    END IF;
    wait_until := clock_timestamp() + _claim.wait;
    LOOP
        -- Published before the pick: work committed after it wakes the sleep below.
        PERFORM gd._claim_wait_publish(claim_queue);
        -- A pick that claims nothing is rolled back (a subtransaction), so the wait holds no row
        -- it locked and did not take (one its rate limit refused).
        BEGIN
            RETURN QUERY SELECT * FROM gd._claim_steps(claim_queue, claim_worker, claim_max, lease_length, usable);
            claimed := FOUND;
            IF NOT claimed THEN
                RAISE EXCEPTION USING ERRCODE = 'GDNC0';
            END IF;
        EXCEPTION WHEN SQLSTATE 'GDNC0' THEN
            NULL;
        END;
        EXIT WHEN claimed;
        wait_ms := ceil(extract(epoch FROM wait_until - clock_timestamp()) * 1000)::int;
        EXIT WHEN wait_ms <= 0;
        PERFORM gd._claim_wait_sleep(wait_ms);
    END LOOP;
    PERFORM gd._claim_wait_publish(NULL);
END $$;

-- The waiting claim's halves (src/claim_wait.cpp): be woken by work of the
-- queue (NULL: no longer), and sleep until woken or for `milliseconds`.
CREATE OR REPLACE FUNCTION gd._claim_wait_publish(queue text) RETURNS void
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_claim_wait_publish';
CREATE OR REPLACE FUNCTION gd._claim_wait_sleep(milliseconds int) RETURNS void
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_claim_wait_sleep';

-- The claim itself (src/claims.cpp): picked as the executors pick, under the
-- same rate limits, leased.
CREATE OR REPLACE FUNCTION gd._claim_steps(queue text, worker text, max int, lease interval, usable text[])
RETURNS TABLE (id bigint, fsm text, version int, step text, state jsonb, ctx gd.context, lease_token bigint)
    LANGUAGE c AS 'MODULE_PATHNAME', 'gd_claim_steps';

-- Extend a claim's lease to `extend` from now (default: the length the lease
-- was given).  False when the token no longer owns the row.
CREATE OR REPLACE FUNCTION @extschema@.gd_heartbeat(id bigint, lease_token bigint, extend interval DEFAULT NULL)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._heartbeat(id bigint, lease_token bigint, extend interval)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'gd_heartbeat';

-- Hand a claimed step back unrun (a worker shutting down): runnable again at
-- once, in its old place, no attempt counted.  False when the token no
-- longer owns the row.
CREATE OR REPLACE FUNCTION @extschema@.gd_release(id bigint, lease_token bigint)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._release(id bigint, lease_token bigint)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'gd_release';

-- Apply a claimed step's outcome, exactly as if an in-database handler had
-- returned it; false (outcome dropped) when the token no longer owns the row
-- (or the caller may not use it).
CREATE OR REPLACE FUNCTION @extschema@.gd_complete(id bigint, lease_token bigint, outcome gd.outcome)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._complete(id bigint, lease_token bigint, outcome gd.outcome)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'gd_complete';

-- gd_complete for a batch: position k of the three arrays is one claim and
-- its outcome.  One row per position, in order; completed is false where
-- the outcome was dropped as stale.  All in one lock and one UPDATE; a bad
-- outcome anywhere raises and completes none.
CREATE OR REPLACE FUNCTION @extschema@.gd_complete_all(ids bigint[], lease_tokens bigint[], outcomes gd.outcome[])
RETURNS TABLE (id bigint, completed boolean) LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._complete_all(ids bigint[], lease_tokens bigint[], outcomes gd.outcome[])
RETURNS TABLE (id bigint, completed boolean) LANGUAGE c AS 'MODULE_PATHNAME', 'gd_complete_all';

-- ---------------------------------------------------------------------------
-- The reaper's part
-- ---------------------------------------------------------------------------

-- Reclaim up to `batch` expired leases: each step runs again at once with
-- its attempt counted, or past max_attempts the instance fails.  Returns how
-- many (src/claims.cpp).
CREATE OR REPLACE FUNCTION gd._reclaim_leases(batch int) RETURNS int
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_reclaim_leases';

-- NOTIFY the queues whose scheduled external work came due since the last
-- announcement.  Work whose eligible_at is not after its updated_at was
-- eligible at the commit of that change, and announced then; the second of
-- overlap covers a row committed just after the previous announcement looked.
-- The table's mark moves only when something is announced, so that an idle
-- reaper writes nothing; but looking from it every round would walk the
-- entries of every immediate row since (under a held horizon all dead, none
-- removable).  So a look that announces nothing returns where it ended, and
-- the caller's next look starts there (`since`; NULL: from the table's
-- mark).  A look that announced returns NULL: its mark is the table's, which
-- rolls back with its NOTIFY.
CREATE OR REPLACE FUNCTION gd._announce_due_external(since timestamptz) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    due_queues text[];
BEGIN
    -- Read without a lock: two announcers at once only announce a queue twice.
    IF since IS NULL THEN
        SELECT a.until INTO since FROM gd._external_due_announced a;
    END IF;
    SELECT array_agg(DISTINCT i.queue) INTO due_queues FROM gd._instances i
     WHERE i.status = 'runnable' AND i.external AND i.lease_owner IS NULL AND i.eligible_at > i.updated_at
       AND i.eligible_at > since - interval '1 second' AND i.eligible_at <= now();
    IF due_queues IS NOT NULL THEN
        PERFORM gd._notify_work_on_commit(q) FROM unnest(due_queues) q;
        UPDATE gd._external_due_announced SET until = now();
        RETURN NULL;
    END IF;
    RETURN now();
END $$;

-- The reaper's duty to external work, in small batches: reclaim expired
-- leases, announce work that came due.  Returns when it next has something
-- to do (a lease expires or scheduled work comes due), or NULL
-- (src/claims.cpp: gd_expire_leases, which the reaper calls).
CREATE OR REPLACE FUNCTION gd._expire_leases(batch int DEFAULT 100) RETURNS timestamptz
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'gd_expire_leases_sql';
