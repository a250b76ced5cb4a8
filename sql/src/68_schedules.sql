-- ---------------------------------------------------------------------------
-- Schedules: an instance of an FSM at every tick of a cron expression
-- ---------------------------------------------------------------------------
-- The reaper fires them (gd._fire_schedules, each round before its other
-- duties): a tick's instance and the schedule's advance commit together,
-- and the instance's correlation key schedule:<name>:<tick>, kept through
-- done and failed, refuses the same tick a second time whatever happens
-- between (two engines alive during a promotion, a restored backup).

CREATE TABLE IF NOT EXISTS gd._schedules (
    name             text PRIMARY KEY,
    owner            regrole NOT NULL,   -- the role that made it: its instances are inserted with its rights
    cron             text NOT NULL,
    time_zone        text NOT NULL,
    fsm              text NOT NULL,
    state            jsonb NOT NULL CHECK (jsonb_typeof(state) = 'object'),
    queue            text,
    priority         int NOT NULL,
    overlap          text NOT NULL CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    catch_up         text NOT NULL CHECK (catch_up IN ('none', 'latest', 'all')),
    enabled          boolean NOT NULL,
    next_run_at      timestamptz,        -- the first tick neither fired nor skipped; NULL: no tick left
    last_run_at      timestamptz,        -- the tick of the newest instance it started
    last_instance_id bigint,
    buffered_at      timestamptz,        -- buffer_one: a tick waiting for the last instance to end
    runs             bigint NOT NULL DEFAULT 0,
    skipped          bigint NOT NULL DEFAULT 0,
    last_error       text,               -- why the last tick could not start (cleared by the next start)
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS schedules_due ON gd._schedules (next_run_at) WHERE enabled;
CREATE INDEX IF NOT EXISTS schedules_buffered ON gd._schedules (name) WHERE buffered_at IS NOT NULL;

-- The ticks of a cron expression (src/schedules.cpp).
CREATE OR REPLACE FUNCTION @extschema@.gd_cron_ticks(cron text, time_zone text DEFAULT 'UTC',
                                          after timestamptz DEFAULT now(), count int DEFAULT 5)
RETURNS SETOF timestamptz LANGUAGE c STABLE AS 'MODULE_PATHNAME', 'gd_cron_ticks';
CREATE OR REPLACE FUNCTION gd._cron_next(cron text, time_zone text, after timestamptz) RETURNS timestamptz
    LANGUAGE c STABLE STRICT AS 'MODULE_PATHNAME', 'gd_cron_next';
CREATE OR REPLACE FUNCTION gd._cron_missed(cron text, time_zone text, first timestamptz, before timestamptz, keep int,
                                           OUT kept timestamptz[], OUT total bigint)
    LANGUAGE c STABLE STRICT AS 'MODULE_PATHNAME', 'gd_cron_missed';

-- A tick as it appears in its instance's correlation key and state.
CREATE OR REPLACE FUNCTION gd._tick_text(tick timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT to_char(tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') $$;

-- The schedule, locked, if the caller is a member of its owner; 42704 when
-- there is none, 42501 when it is another role's.
CREATE OR REPLACE FUNCTION gd._own_schedule(schedule_name text) RETURNS gd._schedules
LANGUAGE plpgsql AS $$
DECLARE
    found_schedule gd._schedules;
BEGIN
    SELECT * INTO found_schedule FROM gd._schedules s WHERE s.name = schedule_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_object',
            MESSAGE = format('gen_durable: unknown schedule %L', schedule_name);
    END IF;
    IF NOT pg_has_role(gd._caller(), found_schedule.owner, 'MEMBER') THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('gen_durable: schedule %L belongs to role %s', schedule_name, found_schedule.owner),
            HINT = 'Only its owner (and the owner''s members) may change it; pick another name.';
    END IF;
    RETURN found_schedule;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.gd_schedule(name text, cron text, fsm text, state jsonb DEFAULT '{}',
                                        time_zone text DEFAULT 'UTC', queue text DEFAULT NULL,
                                        priority int DEFAULT 0, overlap text DEFAULT 'allow',
                                        catch_up text DEFAULT 'latest', enabled boolean DEFAULT true)
RETURNS void LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._schedule(name text, cron text, fsm text, state jsonb, time_zone text, queue text,
                                        priority int, overlap text, catch_up text, enabled boolean)
RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    caller oid := gd._caller();
    existing gd._schedules;
    first_tick timestamptz;
    keep_next boolean;
BEGIN
    IF name IS NULL OR name = '' THEN
        PERFORM gd._bad_argument('a schedule needs a name');
    END IF;
    PERFORM gd._check_length(name, 'name', 200);
    IF cron IS NULL THEN
        PERFORM gd._bad_argument('cron must not be NULL');
    END IF;
    IF time_zone IS NULL THEN
        PERFORM gd._bad_argument('time_zone must not be NULL');
    END IF;
    first_tick := gd._cron_next(cron, time_zone, clock_timestamp());   -- checks both (22023)
    IF fsm IS NULL THEN
        PERFORM gd._bad_argument('fsm must not be NULL');
    END IF;
    PERFORM gd._newest_fsm(fsm);
    PERFORM gd._check_may_use(caller, fsm);
    PERFORM gd._check_json(state, 'object', 'state must be a JSON object');
    IF queue IS NOT NULL THEN
        PERFORM gd._known_queue(queue);
    END IF;
    IF priority IS NULL THEN
        PERFORM gd._bad_argument('priority must not be NULL');
    END IF;
    IF overlap IS NULL OR overlap NOT IN ('allow', 'skip', 'buffer_one') THEN
        PERFORM gd._bad_argument(format('overlap must be allow, skip or buffer_one, got %L', overlap));
    END IF;
    IF catch_up IS NULL OR catch_up NOT IN ('none', 'latest', 'all') THEN
        PERFORM gd._bad_argument(format('catch_up must be none, latest or all, got %L', catch_up));
    END IF;
    IF enabled IS NULL THEN
        PERFORM gd._bad_argument('enabled must not be NULL');
    END IF;
    PERFORM FROM gd._schedules s WHERE s.name = _schedule.name;
    IF FOUND THEN
        existing := gd._own_schedule(name);
    END IF;
    -- A replacement keeping the timing keeps its place: a tick due now still fires.
    keep_next := existing.name IS NOT NULL AND existing.enabled
                 AND existing.cron = cron AND existing.time_zone = time_zone;
    INSERT INTO gd._schedules AS s (name, owner, cron, time_zone, fsm, state, queue, priority, overlap, catch_up,
                                    enabled, next_run_at)
    VALUES (name, caller, cron, time_zone, fsm, state, queue, priority, overlap, catch_up, enabled, first_tick)
    ON CONFLICT ON CONSTRAINT _schedules_pkey DO UPDATE
       SET cron = EXCLUDED.cron, time_zone = EXCLUDED.time_zone, fsm = EXCLUDED.fsm, state = EXCLUDED.state,
           queue = EXCLUDED.queue, priority = EXCLUDED.priority, overlap = EXCLUDED.overlap,
           catch_up = EXCLUDED.catch_up, enabled = EXCLUDED.enabled,
           next_run_at = CASE WHEN keep_next THEN s.next_run_at ELSE EXCLUDED.next_run_at END,
           buffered_at = CASE WHEN EXCLUDED.overlap = 'buffer_one' THEN s.buffered_at END;
    PERFORM gd._wake_reaper_on_commit();
END $$;

CREATE OR REPLACE FUNCTION @extschema@.gd_unschedule(name text) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._unschedule(name text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM gd._schedules s WHERE s.name = _unschedule.name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM gd._own_schedule(name);
    DELETE FROM gd._schedules s WHERE s.name = _unschedule.name;
    RETURN true;
END $$;

-- Pausing keeps the schedule and fires nothing; resuming fires from the
-- next tick on (none of those the pause passed over).  True when it changed.
CREATE OR REPLACE FUNCTION @extschema@.gd_pause_schedule(name text) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION @extschema@.gd_resume_schedule(name text) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._set_schedule_enabled(schedule_name text, enable boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    target gd._schedules := gd._own_schedule(schedule_name);
BEGIN
    IF target.enabled = enable THEN
        RETURN false;
    END IF;
    UPDATE gd._schedules s
       SET enabled = enable,
           next_run_at = CASE WHEN enable THEN gd._cron_next(s.cron, s.time_zone, clock_timestamp())
                              ELSE s.next_run_at END,
           buffered_at = NULL
     WHERE s.name = schedule_name;
    PERFORM gd._wake_reaper_on_commit();
    RETURN true;
END $$;
CREATE OR REPLACE FUNCTION gd._pause_schedule(name text) RETURNS boolean
LANGUAGE sql AS $$ SELECT gd._set_schedule_enabled(name, false) $$;
CREATE OR REPLACE FUNCTION gd._resume_schedule(name text) RETURNS boolean
LANGUAGE sql AS $$ SELECT gd._set_schedule_enabled(name, true) $$;

-- ---------------------------------------------------------------------------
-- The reaper's part
-- ---------------------------------------------------------------------------

-- Why a tick of the schedule cannot start now (its owner lost the right
-- to the FSM, the FSM or the queue went, ...), or NULL: the failures
-- gd._insert_instance would raise, found without raising.
CREATE OR REPLACE FUNCTION gd._tick_blocked(schedule gd._schedules) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT EXISTS (SELECT FROM gd._fsms f JOIN gd._steps s
                                  ON s.fsm = f.name AND s.version = f.version AND s.step = f.initial_step
                          WHERE f.name = schedule.fsm)
            THEN format('gen_durable: FSM %L has no version that can start', schedule.fsm)
        WHEN NOT gd._may_use(schedule.owner, schedule.fsm)
            THEN format('gen_durable: permission denied for FSM %L to role %s', schedule.fsm, schedule.owner)
        WHEN schedule.queue IS NOT NULL AND NOT EXISTS (SELECT FROM gd._queues q WHERE q.name = schedule.queue)
             AND NOT schedule.queue = ANY (gd.configured_queues())
            THEN format('gen_durable: unknown queue %L', schedule.queue)
    END
$$;

-- Start the instance of one tick; its id, or NULL when the tick had started
-- already (its key is taken) or cannot start (skipped: last_error says why).
-- No subtransaction: thousands a round would overflow each backend's cache
-- of them; what could raise is looked at first (gd._tick_blocked), and the
-- rare rest makes the reaper fire that round again carefully (below).
CREATE OR REPLACE FUNCTION gd._start_tick(INOUT schedule gd._schedules, tick timestamptz, OUT instance_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
    blocked text := gd._tick_blocked(schedule);
BEGIN
    IF blocked IS NOT NULL THEN
        schedule.skipped := schedule.skipped + 1;
        schedule.last_error := blocked;
        RAISE WARNING 'gen_durable: schedule % skipped its tick %: %', quote_literal(schedule.name),
            gd._tick_text(tick), blocked;
        RETURN;
    END IF;
    instance_id := gd._insert_instance(
        schedule.owner, schedule.fsm, schedule.state || jsonb_build_object('scheduled_at', gd._tick_text(tick)),
        NULL, schedule.queue, schedule.priority, NULL,
        format('schedule:%s:%s', schedule.name, gd._tick_text(tick)),
        gd._live_statuses() || gd._terminal_statuses(), NULL, 1, NULL, NULL, 'skip');
    IF instance_id IS NOT NULL THEN
        schedule.runs := schedule.runs + 1;
        schedule.last_run_at := tick;
        schedule.last_instance_id := instance_id;
        schedule.last_error := NULL;
    END IF;
END $$;

-- The same, any error skipping the tick (a subtransaction each).
CREATE OR REPLACE FUNCTION gd._start_tick_carefully(INOUT schedule gd._schedules, tick timestamptz,
                                                    OUT instance_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
    started record;
BEGIN
    SELECT * INTO started FROM gd._start_tick(schedule, tick);
    schedule := started.schedule;
    instance_id := started.instance_id;
EXCEPTION WHEN OTHERS THEN
    schedule.skipped := schedule.skipped + 1;
    schedule.last_error := SQLERRM;
    RAISE WARNING 'gen_durable: schedule % skipped its tick %: %', quote_literal(schedule.name), gd._tick_text(tick),
        SQLERRM;
END $$;

-- Is the newest instance this schedule started still live?
CREATE OR REPLACE FUNCTION gd._schedule_busy(schedule gd._schedules) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT schedule.last_instance_id IS NOT NULL
       AND EXISTS (SELECT FROM gd._instances i
                    WHERE i.id = schedule.last_instance_id AND i.status = ANY (gd._live_statuses()))
$$;

-- The common case in one statement each: up to `batch` schedules due by
-- `at` with one tick to fire (not missed), overlap allow, and nothing that
-- would stop the tick (gd._tick_blocked's cases, written set-wise); what
-- gd._insert_instance does for each, done for all.  Returns how many
-- schedules it advanced.
CREATE OR REPLACE FUNCTION gd._fire_plain_ticks(at timestamptz, serving_since timestamptz, batch int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    every_status text[] := ARRAY(SELECT DISTINCT st FROM unnest(gd._live_statuses() || gd._terminal_statuses()) st
                                  ORDER BY 1);
    names text[];
    ticks timestamptz[];
    ids bigint[];
BEGIN
    WITH due AS (
        SELECT d.* FROM gd._schedules d
         WHERE d.enabled AND d.next_run_at <= at AND d.next_run_at >= serving_since AND d.overlap = 'allow'
         ORDER BY d.next_run_at LIMIT batch FOR UPDATE SKIP LOCKED),
    ready AS (
        SELECT DISTINCT ON (d.name) d.name, d.next_run_at AS tick, d.state, d.priority, f.name AS fsm, f.version,
               f.owner, f.initial_step, f.state_defaults, st.handler IS NULL AS external,
               (gd._route(st.queue, coalesce(d.queue, f.queue))).*
          FROM due d
          JOIN gd._fsms f ON f.name = d.fsm
          JOIN gd._steps st ON st.fsm = f.name AND st.version = f.version AND st.step = f.initial_step
         WHERE gd._may_use(d.owner, d.fsm)
           AND (d.queue IS NULL OR d.queue = f.queue OR EXISTS (SELECT FROM gd._queues q WHERE q.name = d.queue))
         ORDER BY d.name, f.version DESC),
    started AS (
        INSERT INTO gd._instances AS i (status, fsm, version, owner, step, state, queue, home_queue, external,
                                        priority, correlation_key, correlation_scope, eligible_at)
        SELECT gd._status_after('insert', 'runnable'), r.fsm, r.version, r.owner, r.initial_step,
               r.state_defaults || r.state || jsonb_build_object('scheduled_at', gd._tick_text(r.tick)),
               r.queue, r.home_queue, r.external, r.priority,
               format('schedule:%s:%s', r.name, gd._tick_text(r.tick)), every_status, now()
          FROM ready r
        ON CONFLICT (correlation_key, owner) WHERE correlation_key IS NOT NULL AND status = ANY (correlation_scope)
        DO NOTHING
        RETURNING i.id, i.correlation_key,
                  gd._wake_on_commit(i.queue, i.priority, i.owner, i.fairness_lane, i.eligible_at, i.id))
    SELECT array_agg(r.name), array_agg(r.tick), array_agg(s.id) INTO names, ticks, ids
      FROM ready r LEFT JOIN started s ON s.correlation_key = format('schedule:%s:%s', r.name, gd._tick_text(r.tick));
    UPDATE gd._schedules s
       SET next_run_at = gd._cron_next(s.cron, s.time_zone, f.tick),
           runs = s.runs + (f.id IS NOT NULL)::int,
           last_run_at = CASE WHEN f.id IS NOT NULL THEN f.tick ELSE s.last_run_at END,
           last_instance_id = coalesce(f.id, s.last_instance_id),
           last_error = CASE WHEN f.id IS NOT NULL THEN NULL ELSE s.last_error END
      FROM unnest(names, ticks, ids) AS f(name, tick, id)
     WHERE s.name = f.name;
    PERFORM gd._emit_inserted(ids);
    RETURN coalesce(cardinality(names), 0);
END $$;

-- Fire one due schedule's tick (and, for ticks before `serving_since` —
-- missed while no reaper served this database — what catch_up says), and
-- write down how far it got.
CREATE OR REPLACE FUNCTION gd._fire_schedule(schedule gd._schedules, serving_since timestamptz, carefully boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    ticks timestamptz[];
    tick timestamptz;
    missed record;
BEGIN
    IF schedule.next_run_at < serving_since THEN
        missed := gd._cron_missed(schedule.cron, schedule.time_zone, schedule.next_run_at, serving_since,
                                  CASE schedule.catch_up WHEN 'none' THEN 0 WHEN 'latest' THEN 1 ELSE 1000 END);
        ticks := missed.kept;
        schedule.skipped := schedule.skipped + missed.total - cardinality(ticks);
        schedule.next_run_at := gd._cron_next(schedule.cron, schedule.time_zone, serving_since - interval '1 microsecond');
    ELSE
        ticks := ARRAY[schedule.next_run_at];
        schedule.next_run_at := gd._cron_next(schedule.cron, schedule.time_zone, schedule.next_run_at);
    END IF;
    FOREACH tick IN ARRAY ticks LOOP
        IF schedule.overlap <> 'allow' AND gd._schedule_busy(schedule) THEN
            IF schedule.overlap = 'buffer_one' AND schedule.buffered_at IS NULL THEN
                schedule.buffered_at := tick;
            ELSE
                schedule.skipped := schedule.skipped + 1;
            END IF;
            CONTINUE;
        END IF;
        schedule := CASE WHEN carefully THEN (gd._start_tick_carefully(schedule, tick)).schedule
                         ELSE (gd._start_tick(schedule, tick)).schedule END;
    END LOOP;
    UPDATE gd._schedules s
       SET next_run_at = schedule.next_run_at, last_run_at = schedule.last_run_at,
           last_instance_id = schedule.last_instance_id, buffered_at = schedule.buffered_at,
           runs = schedule.runs, skipped = schedule.skipped, last_error = schedule.last_error
     WHERE s.name = schedule.name;
END $$;

-- Fire due ticks: for up to `batch` schedules, their due tick (the common
-- case set-wise, gd._fire_plain_ticks; the others one by one), then the
-- ticks buffer_one held back whose previous instance has ended.  Each
-- schedule's row says how far it got, in the same transaction as the
-- instances.  Returns how many schedules it fired or skipped: `batch` means
-- there may be more.  `carefully`: each schedule and each tick in a
-- subtransaction of its own, a tick's error skipping the tick, any other
-- (its next tick cannot be computed) pausing the schedule — the reaper's
-- second try when a round raised; keep `batch` small.
CREATE OR REPLACE FUNCTION gd._fire_schedules(at timestamptz, serving_since timestamptz, batch int DEFAULT 500,
                                              carefully boolean DEFAULT false)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    schedule gd._schedules;
    fired int := 0;
BEGIN
    IF NOT carefully THEN
        fired := gd._fire_plain_ticks(at, serving_since, batch);
    END IF;
    FOR schedule IN
        SELECT * FROM gd._schedules s WHERE s.enabled AND s.next_run_at <= at
         ORDER BY s.next_run_at LIMIT batch - fired FOR UPDATE SKIP LOCKED
    LOOP
        IF NOT carefully THEN
            PERFORM gd._fire_schedule(schedule, serving_since, false);
        ELSE
            BEGIN
                PERFORM gd._fire_schedule(schedule, serving_since, true);
            EXCEPTION WHEN OTHERS THEN
                UPDATE gd._schedules s SET enabled = false, last_error = SQLERRM WHERE s.name = schedule.name;
                RAISE WARNING 'gen_durable: schedule % paused: %', quote_literal(schedule.name), SQLERRM;
            END;
        END IF;
        fired := fired + 1;
    END LOOP;

    FOR schedule IN
        SELECT * FROM gd._schedules s WHERE s.buffered_at IS NOT NULL AND s.enabled
         LIMIT batch FOR UPDATE SKIP LOCKED
    LOOP
        CONTINUE WHEN gd._schedule_busy(schedule);
        schedule := CASE WHEN carefully THEN (gd._start_tick_carefully(schedule, schedule.buffered_at)).schedule
                         ELSE (gd._start_tick(schedule, schedule.buffered_at)).schedule END;
        UPDATE gd._schedules s
           SET last_run_at = schedule.last_run_at, last_instance_id = schedule.last_instance_id, buffered_at = NULL,
               runs = schedule.runs, skipped = schedule.skipped, last_error = schedule.last_error
         WHERE s.name = schedule.name;
    END LOOP;
    RETURN fired;
END $$;

-- gd_drain's ticks (gd._drain_due): the due ticks, by `at`, of the schedules
-- whose owner `member` is a member of, fired one after another as each comes
-- due (none counted as missed: a test moves its clock on purpose), at most
-- `batch`.  Returns how many it fired or skipped.
CREATE OR REPLACE FUNCTION gd._fire_ticks_of(member oid, at timestamptz, batch int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    schedule gd._schedules;
    fired int := 0;
BEGIN
    WHILE fired < batch LOOP
        SELECT * INTO schedule FROM gd._schedules s
         WHERE s.enabled AND s.next_run_at <= at AND pg_catalog.pg_has_role(member, s.owner, 'MEMBER')
         ORDER BY s.next_run_at LIMIT 1 FOR UPDATE;
        EXIT WHEN NOT FOUND;
        PERFORM gd._fire_schedule(schedule, '-infinity', false);
        fired := fired + 1;
    END LOOP;
    RETURN fired;
END $$;

-- When the reaper must fire next: the earliest tick of an enabled schedule
-- (NULL: none).  A held-back tick is looked at every round.
CREATE OR REPLACE FUNCTION gd._next_tick_due() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(s.next_run_at) FROM gd._schedules s WHERE s.enabled
$$;
