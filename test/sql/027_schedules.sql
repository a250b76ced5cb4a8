-- Schedules (sql/src/68_schedules.sql, src/cron.cpp, src/schedules.cpp):
-- cron expressions and their next ticks, time zones across DST, bad input,
-- and the firing the reaper does, driven here by hand at fixed instants in
-- 2031 (after the reaper's clock: it leaves those ticks alone).
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
SET TimeZone = 'UTC';
SET DateStyle = 'ISO';

-- ---------------------------------------------------------------- the next five ticks
CREATE TEMP TABLE cron_cases (n serial, cron text, zone text, after timestamptz);
INSERT INTO cron_cases (cron, zone, after) VALUES
    ('*/15 * * * *',            'UTC', '2026-01-01 00:07:30Z'),
    ('5-59/20 * * * *',         'UTC', '2026-01-01 00:00:00Z'),   -- a step from a range's start
    ('7/25 0 * * *',            'UTC', '2026-01-01 00:00:00Z'),   -- N/step: N to the end
    ('0 9-17/4 * * MON-FRI',    'UTC', '2026-01-02 12:00:00Z'),   -- 2026-01-02 is a Friday
    ('59 23 31 12 *',           'UTC', '2026-12-31 23:59:00Z'),   -- the year's last minute, strictly after
    ('0 0 29 2 *',              'UTC', '2026-01-01 00:00:00Z'),   -- Feb 29: leap years only
    ('0 0 13 * FRI',            'UTC', '2026-01-01 00:00:00Z'),   -- both restricted: the 13th OR a Friday
    ('0 0 1-7 * */7',           'UTC', '2026-01-01 00:00:00Z'),   -- */7 is a star: days 1-7 AND Sunday
    ('0 0 1 jan,JUL *',         'UTC', '2026-01-01 00:00:00Z'),   -- names, any case
    ('0 12 * * 7',              'UTC', '2026-01-01 00:00:00Z'),   -- 7 is Sunday
    ('*/20 * * * * *',          'UTC', '2026-01-01 00:00:59.5Z'), -- six fields: seconds first
    ('@hourly',                 'UTC', '2026-01-01 00:00:00Z'),
    ('@weekly',                 'UTC', '2026-01-01 00:00:00Z'),
    ('@every 90 seconds',       'UTC', '2026-01-01 00:00:00Z'),   -- multiples since the Unix epoch
    ('@every 1 day',            'Europe/Berlin', '2026-03-27 12:00:00Z'),
    -- Europe/Berlin: clocks forward 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z)
    ('30 2 * * *',              'Europe/Berlin', '2026-03-27 12:00:00Z'),   -- 02:30 missing: at 03:00 CEST
    ('*/30 * * * *',            'Europe/Berlin', '2026-03-29 00:15:00Z'),   -- the gap's ticks fire once
    -- Europe/Berlin: clocks back 2026-10-25 03:00 CEST -> 02:00 CET (01:00Z)
    ('30 2 * * *',              'Europe/Berlin', '2026-10-23 12:00:00Z'),   -- 02:30 twice: the first only
    ('*/30 * * * *',            'Europe/Berlin', '2026-10-24 23:45:00Z'),
    ('0 * * * *',               'Europe/Berlin', '2026-10-24 23:30:00Z'),
    -- America/New_York: forward 2026-03-08 02:00 EST (07:00Z), back 2026-11-01 02:00 EDT (06:00Z)
    ('0 2 * * *',               'America/New_York', '2026-03-06 12:00:00Z'),
    ('30 1 * * *',              'America/New_York', '2026-10-30 12:00:00Z'),
    ('*/20 1 * * *',            'America/New_York', '2026-11-01 05:00:00Z'),
    -- from inside the repeated hour (01:10 EST, 06:10Z): its wall times ticked already, in EDT
    ('30 1 * * *',              'America/New_York', '2025-11-02 06:10:00Z'),
    ('*/20 1 * * *',            'America/New_York', '2025-11-02 06:10:00Z'),
    -- Australia/Lord_Howe: back 2026-04-05 02:00 -> 01:30 (15:00Z), forward 2026-10-04 02:00 -> 02:30 (15:30Z)
    ('45 1 * * *',              'Australia/Lord_Howe', '2026-04-04 15:10:00Z'),   -- 01:45 twice: from the second
    ('15 2 * * *',              'Australia/Lord_Howe', '2026-10-03 12:00:00Z'),
    -- America/Sao_Paulo: forward 2018-11-04 00:00 -> 01:00 (03:00Z): midnight that day is 01:00
    ('0 0 * * *',               'America/Sao_Paulo', '2018-11-02 12:00:00Z');
SELECT c.n, c.cron, c.zone,
       (SELECT string_agg(to_char(t, 'YYYY-MM-DD HH24:MI:SS'), ', ')
          FROM gd_cron_ticks(c.cron, c.zone, c.after, 5) t) AS next_five_utc
  FROM cron_cases c ORDER BY c.n;

-- Property: over 400 ticks of each expression, every tick is after the one before.
WITH ticks AS (
    SELECT c.cron, c.zone, t, lag(t) OVER (PARTITION BY c.n ORDER BY t) AS previous,
           row_number() OVER (PARTITION BY c.n ORDER BY t) AS k
      FROM cron_cases c, gd_cron_ticks(c.cron, c.zone, '2026-01-01Z', 400) t
     WHERE c.cron NOT LIKE '@every%' AND c.cron NOT LIKE '*/20 * * * * *')
SELECT count(*) > 3000 AS enough_ticks,
       bool_and(previous IS NULL OR t > previous) AS strictly_increasing,
       bool_and(extract(second FROM t AT TIME ZONE zone) = 0) AS on_whole_minutes
  FROM ticks;
-- Every tick is at a wall time the fields allow, through a year of DST changes.
SELECT count(*) AS ticks,
       bool_and(extract(minute FROM t AT TIME ZONE 'America/New_York') IN (5, 25, 45)
                AND extract(hour FROM t AT TIME ZONE 'America/New_York') BETWEEN 9 AND 17
                AND extract(isodow FROM t AT TIME ZONE 'America/New_York') BETWEEN 1 AND 5) AS fields_hold
  FROM gd_cron_ticks('5-45/20 9-17 * * 1-5', 'America/New_York', '2026-01-01Z', 10000) t;
-- Both day fields restricted: the 1st, the 15th, or a Monday (Vixie's OR), in Berlin.
SELECT count(*) AS ticks,
       bool_and(extract(day FROM t AT TIME ZONE 'Europe/Berlin') IN (1, 15)
                OR extract(isodow FROM t AT TIME ZONE 'Europe/Berlin') = 1) AS either_day,
       bool_and(extract(hour FROM t AT TIME ZONE 'Europe/Berlin') = 2
                AND extract(minute FROM t AT TIME ZONE 'Europe/Berlin') = 30) AS at_0230
  FROM gd_cron_ticks('30 2 1,15 * MON', 'Europe/Berlin', '2026-01-01Z', 150) t;

-- Property: the ticks do not depend on where their search starts.  Around
-- every change of offset of six zones from 2018 to 2024 (30 minutes on Lord
-- Howe, 45-minute offsets on Chatham, midnight in Sao Paulo and Tehran), for
-- fixed times in and around the changing hours, wildcard hours, steps of
-- minutes and of seconds: from an instant every 7 min 13.25 s over 7 hours,
-- the next tick is the first after it of those enumerated from before.
CREATE TEMP TABLE dst_changes AS   -- (zone, the hour before its offset changes)
WITH zones (zone) AS (VALUES ('America/New_York'), ('Europe/Berlin'), ('Australia/Lord_Howe'), ('America/Sao_Paulo'),
                             ('Asia/Tehran'), ('Pacific/Chatham')),
     changing_days AS (
        SELECT z.zone, d FROM zones z, generate_series('2018-01-01 12:00Z'::timestamptz, '2024-12-31 12:00Z', '1 day') d
         WHERE (d AT TIME ZONE z.zone) - (d AT TIME ZONE 'UTC')
               <> ((d + interval '1 day') AT TIME ZONE z.zone) - ((d + interval '1 day') AT TIME ZONE 'UTC'))
SELECT c.zone, h AS hour_before
  FROM changing_days c, generate_series(c.d, c.d + interval '23 hours', '1 hour') h
 WHERE (h AT TIME ZONE c.zone) - (h AT TIME ZONE 'UTC')
       <> ((h + interval '1 hour') AT TIME ZONE c.zone) - ((h + interval '1 hour') AT TIME ZONE 'UTC');
CREATE TEMP TABLE dst_crons (cron text, ticks int);   -- (expression, ticks enough for 7 hours)
INSERT INTO dst_crons VALUES
    ('30 1 * * *', 3), ('59 1 * * *', 3), ('0 2 * * *', 3), ('30 2 * * *', 3), ('45 2 * * *', 3), ('0 3 * * *', 3),
    ('15 3 * * *', 3), ('30 23 * * *', 3), ('0 0 * * *', 3), ('30 0 * * *', 3), ('0 0 * * SUN', 3),
    ('0 * * * *', 12), ('*/15 * * * *', 40), ('*/7 * * * *', 80), ('*/20 * * * * *', 1400);
SELECT c.zone, count(DISTINCT c.hour_before) AS changes, count(*) AS checks,
       count(*) FILTER (WHERE (SELECT t FROM gd_cron_ticks(e.cron, c.zone, i, 1) t)
                              IS DISTINCT FROM (SELECT min(t) FROM unnest(r.ticks) t WHERE t > i)) AS disagreements
  FROM dst_changes c, dst_crons e,
       LATERAL (SELECT array_agg(t) FROM gd_cron_ticks(e.cron, c.zone, c.hour_before - interval '3 hours', e.ticks) t)
           AS r (ticks),
       generate_series(c.hour_before - interval '3 hours', c.hour_before + interval '4 hours', '7 min 13.25 s') i
 GROUP BY c.zone ORDER BY c.zone;
-- The reaper's next tick is the same: from inside the repeated hour, the next night's.
SELECT gd._cron_next('30 1 * * *', 'America/New_York', '2025-11-02 06:10Z') AS next_after_the_repeated_0130;

-- Past the range of timestamps: from -infinity the first ticks in it, none after its end (or from infinity).
SELECT c.cron, c.zone, c.after,
       (SELECT string_agg(t::text, ', ') FROM gd_cron_ticks(c.cron, c.zone, c.after, 3) t) AS first_three
  FROM (VALUES ('0 0 * * *', 'UTC', '-infinity'::timestamptz), ('30 1 * * *', 'America/New_York', '-infinity'),
               ('@every 1 day', 'UTC', '-infinity'), ('* * * * *', 'UTC', '294276-12-31 23:58:30Z'),
               ('@every 1 minute', 'UTC', '294276-12-31 23:58:30Z'), ('* * * * *', 'UTC', 'infinity')) c (cron, zone, after);
SELECT gd._cron_next('0 0 * * *', 'UTC', '-infinity') AS next_from_minus_infinity,
       gd._cron_next('0 0 * * *', 'UTC', 'infinity') AS next_from_infinity,
       gd._cron_missed('0 0 1 1 *', 'UTC', '-infinity', '4711-06-01 BC', 5) AS missed_from_minus_infinity;

-- A long enumeration can be cancelled: ten million ticks of an every-second
-- schedule (its catch-up after four months down) take seconds.
SELECT clock_timestamp() AS cancel_started \gset
SET statement_timeout = '100ms';
SELECT total FROM gd._cron_missed('* * * * * *', 'America/New_York', '2026-01-01Z', '2031-01-01Z', 1);
RESET statement_timeout;
SELECT clock_timestamp() - :'cancel_started'::timestamptz < interval '1 s' AS cancelled_promptly;

-- ---------------------------------------------------------------- bad expressions
SELECT e AS cron, t.try(format('SELECT gd_cron_ticks(%L)', e)) AS result
  FROM unnest(ARRAY['61 * * * *', '* 24 * * *', '* * * *', '* * * * * * *', '0 0 30 2 *', '0 0 31 4,6 *',
                    '*/0 * * * *', '5-3 * * * *', '0 0 * FOO *', '0 0 * * MON-', '1,,2 * * * *', '1, * * * *',
                    '@often', '@daily 5', '@every 0 seconds', '@every 1 month', '@every banana', '@every 1.5 seconds',
                    '', '   ',
                    -- other characters than ASCII: named whole, positions in characters
                    '0 0 * * é', '* * * * MÖN', '5é * * * *', 'ü ü ü ü ü ü ü', 'ä ä ä', '@täglich',
                    '* * * * ' || repeat('ä', 40), 'ä @every 1 minute']) e;
SELECT t.try($$SELECT gd_cron_ticks('* * * * *', 'Mars/Olympus_Mons')$$) AS unknown_zone;
-- A bare offset is refused: SET TIME ZONE '-7' is UTC-07:00, POSIX (pg_tzset, AT TIME ZONE) reads UTC+07:00.
SELECT z AS zone, t.try(format('SELECT gd_cron_ticks(%L, %L)', '0 12 * * *', z)) AS result
  FROM unnest(ARRAY['-7', '+7', '7', ' -7', '+05:30', '3.5', '0']) z;
-- Names are taken, POSIX strings with their signs (west positive) too.
SELECT z AS zone, (SELECT t FROM gd_cron_ticks('0 12 * * *', z, '2026-01-01Z', 1) t) AS noon
  FROM unnest(ARRAY['Etc/GMT+7', 'UTC+7', '<-07>7', '<+0530>-5:30', 'EST5EDT']) z;
SELECT t.try($$SELECT gd_cron_ticks('* * * * *', 'UTC', now(), -1)$$) AS bad_count;
SELECT t.try($$SELECT gd_cron_ticks(NULL)$$) AS null_cron;

-- ---------------------------------------------------------------- defining schedules
SELECT gd_define_fsm('report', initial => 'make', queue => 'scheduled');   -- external: instances stay live until claimed
SELECT gd_define_step('report', 'make');
SELECT gd_schedule('nightly', '0 3 * * *', 'report', '{"kind": "daily"}', time_zone => 'Europe/Berlin');
SELECT name, cron, time_zone, fsm, owner, enabled, overlap, catch_up, runs, skipped,
       next_run_at = gd_cron_ticks('0 3 * * *', 'Europe/Berlin', now(), 1) AS next_is_the_next_tick
  FROM gd.schedules;
-- Bad input changes nothing.
SELECT t.try($$SELECT gd_schedule('bad', '0 3 * *', 'report')$$) AS malformed_cron;
SELECT t.try($$SELECT gd_schedule('bad', '0 3 * * *', 'report', time_zone => 'Nowhere/Land')$$) AS unknown_zone;
SELECT t.try($$SELECT gd_schedule('bad', '0 3 * * *', 'no_such_fsm')$$) AS unknown_fsm;
SELECT t.try($$SELECT gd_schedule('bad', '0 3 * * *', 'report', overlap => 'queue')$$) AS unknown_overlap;
SELECT t.try($$SELECT gd_schedule('bad', '0 3 * * *', 'report', catch_up => 'some')$$) AS unknown_catch_up;
SELECT t.try($$SELECT gd_schedule('bad', '0 3 * * *', 'report', state => '[1]')$$) AS state_not_object;
SELECT t.try($$SELECT gd_schedule('', '0 3 * * *', 'report')$$) AS no_name;
SELECT t.try($$SELECT gd_schedule('bad', '0 3 * * *', 'report', queue => 'no_such_queue')$$) AS unknown_queue;
SELECT t.try($$SELECT gd_schedule('nightly', '0 4 * * *', 'report', overlap => 'bad')$$) AS bad_replacement;
SELECT count(*) AS schedules, min(cron) AS nightly_unchanged FROM gd.schedules;
SELECT t.try($$SELECT gd_pause_schedule('no_such')$$) AS pause_unknown;
SELECT gd_unschedule('no_such') AS unscheduled_unknown;

-- ---------------------------------------------------------------- firing, by hand
-- The schedules of this part are made disabled (the reaper leaves them
-- alone), and fire() enables one (unless told not to), its next tick moved
-- to `first_tick` when given, and fires it alone (the others disabled
-- meanwhile) at `at`, with the reaper serving since `since`; it shows what
-- happened.
CREATE FUNCTION pg_temp.fire(schedule_name text, first_tick text, at text, since text DEFAULT '2030-01-01Z',
                             enable boolean DEFAULT true)
RETURNS TABLE (fired int, runs bigint, skipped bigint, next_run_at timestamptz, buffered_at timestamptz,
               started text) LANGUAGE plpgsql AS $$
DECLARE
    before_max bigint := (SELECT coalesce(max(id), 0) FROM gd._instances);
    held text[];
BEGIN
    UPDATE gd._schedules s SET enabled = s.enabled OR enable,
           next_run_at = coalesce(first_tick::timestamptz, s.next_run_at)
     WHERE s.name = schedule_name;
    WITH paused AS (UPDATE gd._schedules s SET enabled = false WHERE s.name <> schedule_name AND s.enabled
                    RETURNING s.name)
    SELECT array_agg(name) INTO held FROM paused;
    fired := gd._fire_schedules(at::timestamptz, since::timestamptz);
    UPDATE gd._schedules s SET enabled = true WHERE s.name = ANY (held);
    SELECT s.runs, s.skipped, s.next_run_at, s.buffered_at INTO runs, skipped, next_run_at, buffered_at
      FROM gd._schedules s WHERE s.name = schedule_name;
    SELECT string_agg(i.state->>'scheduled_at', ' ' ORDER BY i.id) INTO started
      FROM gd._instances i WHERE i.id > before_max;
    RETURN NEXT;
END $$;

SELECT gd_schedule('minutely', '* * * * *', 'report', '{"n": 1}', enabled => false);
SELECT * FROM pg_temp.fire('minutely', '2031-01-01 00:00Z', '2031-01-01 00:00:00.2Z');
SELECT i.correlation_key, i.state, i.status, i.correlation_scope
  FROM gd._instances i WHERE i.correlation_key LIKE 'schedule:minutely:%';
-- The same tick again (a crash after the insert, a second engine): refused by its key.
SELECT * FROM pg_temp.fire('minutely', '2031-01-01 00:00Z', '2031-01-01 00:00:00.5Z');
-- Not yet due: nothing.
SELECT * FROM pg_temp.fire('minutely', NULL, '2031-01-01 00:00:59Z');

-- overlap = skip: the previous instance is still live (nobody claims it).
SELECT gd_schedule('minutely', '* * * * *', 'report', '{"n": 1}', overlap => 'skip');
SELECT * FROM pg_temp.fire('minutely', NULL, '2031-01-01 00:01:00Z');

-- overlap = buffer_one: one tick waits for the previous to end, more are skipped.
SELECT gd_schedule('minutely', '* * * * *', 'report', '{"n": 1}', overlap => 'buffer_one');
SELECT * FROM pg_temp.fire('minutely', NULL, '2031-01-01 00:02:00Z');
SELECT * FROM pg_temp.fire('minutely', NULL, '2031-01-01 00:03:00Z');
-- (The previous ends and the tick fires in one transaction: the reaper, which also fires held-back ticks, cannot come between.)
BEGIN;
SELECT count(*) FILTER (WHERE completed) AS previous_ended
  FROM gd_claim('scheduled', 'test', 10) c, LATERAL gd_complete(c.id, c.lease_token, gd_done()) AS completed;
SELECT * FROM pg_temp.fire('minutely', NULL, '2031-01-01 00:03:30Z');
COMMIT;

-- catch_up: the reaper started serving at 00:10:30, the next tick was 00:05.
SELECT gd_schedule('missed_' || c, '* * * * *', 'report', catch_up => c, enabled => false)
  FROM unnest(ARRAY['none', 'latest', 'all']) c;
SELECT 'none' AS catch_up, * FROM pg_temp.fire('missed_none', '2031-01-01 00:05Z', '2031-01-01 00:10:40Z', '2031-01-01 00:10:30Z');
SELECT 'latest' AS catch_up, * FROM pg_temp.fire('missed_latest', '2031-01-01 00:05Z', '2031-01-01 00:10:40Z', '2031-01-01 00:10:30Z');
SELECT 'all' AS catch_up, * FROM pg_temp.fire('missed_all', '2031-01-01 00:05Z', '2031-01-01 00:10:40Z', '2031-01-01 00:10:30Z');
-- Serving again inside a repeated hour (New York, 2031-11-02: 01:00-02:00
-- EDT, 05:00Z, then EST, 06:00Z): the 01:30 tick caught up is that night's
-- only one, the next is the next night's.
SELECT gd_schedule('nightly_ny', '30 1 * * *', 'report', time_zone => 'America/New_York', enabled => false);
SELECT * FROM pg_temp.fire('nightly_ny', '2031-11-01 05:30Z', '2031-11-02 06:20Z', '2031-11-02 06:10Z');
SELECT * FROM pg_temp.fire('nightly_ny', NULL, '2031-11-02 06:40Z', '2031-11-02 06:10Z');
SELECT gd_unschedule('nightly_ny');

-- A tick that cannot start (the FSM's owner took the right away) is skipped, said why, and the schedule goes on.
UPDATE gd._schedules SET fsm = 'no_longer_there' WHERE name = 'missed_none';
SELECT fired, runs, skipped FROM pg_temp.fire('missed_none', NULL, '2031-01-01 00:11:00Z', '2031-01-01 00:10:30Z');
SELECT last_error FROM gd.schedules WHERE name = 'missed_none';

-- Paused: nothing fires; resumed: from the next tick on.
SELECT gd_pause_schedule('minutely') AS paused, gd_pause_schedule('minutely') AS paused_again;
SELECT fired, started FROM pg_temp.fire('minutely', '2031-01-01 00:20Z', '2031-01-01 00:20:00Z', enable => false);
SELECT gd_resume_schedule('minutely') AS resumed;
SELECT next_run_at > now() AND next_run_at <= now() + interval '1 minute' AS resumes_at_the_next_tick
  FROM gd.schedules WHERE name = 'minutely';

-- ---------------------------------------------------------------- the reaper fires them
SELECT gd_schedule('every_second', '@every 1 second', 'report', '{"live": true}');
DO $$
BEGIN
    FOR i IN 1..100 LOOP
        EXIT WHEN (SELECT runs FROM gd.schedules WHERE name = 'every_second') >= 3;
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT runs >= 3 AS fired_by_the_reaper FROM gd.schedules WHERE name = 'every_second';
SELECT gd_pause_schedule('every_second') AS paused;
SELECT count(*) = count(DISTINCT correlation_key) AS one_instance_per_tick,
       bool_and((state->>'scheduled_at')::timestamptz = substr(correlation_key, length('schedule:every_second:') + 1)::timestamptz)
           AS key_names_the_tick,
       bool_and(date_trunc('second', (state->>'scheduled_at')::timestamptz) = (state->>'scheduled_at')::timestamptz)
           AS whole_seconds
  FROM gd._instances WHERE correlation_key LIKE 'schedule:every_second:%';

-- A tick whose insert raises (here a trigger an administrator put on the
-- table) makes the fast way raise; the reaper then fires the round again
-- carefully, each tick in a subtransaction: that one is skipped with its
-- error, the others fire.
CREATE FUNCTION pg_temp.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state ? 'poison' THEN
        RAISE EXCEPTION 'poisoned tick';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_poison BEFORE INSERT ON gd._instances FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_poison();
SELECT gd_schedule('poisoned', '* * * * *', 'report', '{"poison": true}', enabled => false);
SELECT t.try($$SELECT gd._fire_schedules('2031-01-01 00:00:30Z', '2030-01-01Z')$$) AS fast_way_raises
  FROM pg_temp.fire('poisoned', '2031-01-01 00:00Z', '2030-12-31Z');   -- (enabled, not yet due)
SELECT gd._fire_schedules('2031-01-01 00:00:30Z', '2030-01-01Z', 50, carefully => true) >= 1 AS fired_carefully;
SELECT runs, skipped, last_error FROM gd.schedules WHERE name = 'poisoned';
DROP TRIGGER refuse_poison ON gd._instances;
SELECT gd_unschedule('poisoned');
-- A schedule whose next tick cannot be computed (its zone gone from the tz
-- database, made here by hand) is paused, said why; the round goes on.
SELECT gd_schedule('lost_zone', '* * * * *', 'report', enabled => false);
UPDATE gd._schedules SET time_zone = 'Atlantis/Capital' WHERE name = 'lost_zone';
SELECT t.try($$SELECT gd._fire_schedules('2031-01-01 00:00:30Z', '2030-01-01Z')$$) AS fast_way_raises
  FROM pg_temp.fire('lost_zone', '2031-01-01 00:00Z', '2030-12-31Z');
SELECT gd._fire_schedules('2031-01-01 00:00:30Z', '2030-01-01Z', 20, carefully => true) >= 1 AS fired_carefully;
SELECT enabled, runs, last_error FROM gd.schedules WHERE name = 'lost_zone';
SELECT gd_unschedule('lost_zone');

-- ---------------------------------------------------------------- whose schedules
CREATE ROLE regress_gd_scheduler;
CREATE ROLE regress_gd_stranger;
GRANT USAGE ON SCHEMA t TO regress_gd_scheduler, regress_gd_stranger;
GRANT EXECUTE ON FUNCTION t.try(text) TO regress_gd_scheduler, regress_gd_stranger;
SELECT gd_grant('report', 'regress_gd_scheduler');
SET ROLE regress_gd_scheduler;
SELECT gd_schedule('team_report', '0 8 * * MON', 'report');
SELECT name, owner FROM gd.schedules ORDER BY name;
SELECT t.try($$SELECT gd_schedule('nightly', '0 1 * * *', 'report')$$) AS take_anothers_name;
SELECT t.try($$SELECT gd_unschedule('nightly')$$) AS drop_anothers;
SELECT t.try($$SELECT gd_pause_schedule('nightly')$$) AS pause_anothers;
RESET ROLE;
SET ROLE regress_gd_stranger;
SELECT count(*) AS schedules_a_stranger_sees FROM gd.schedules;
SELECT t.try($$SELECT gd_schedule('mine', '0 8 * * *', 'report')$$) AS schedule_an_fsm_not_granted;
SELECT t.try($$SELECT * FROM gd._schedules$$) AS read_the_table;
SELECT t.try($$SELECT gd._fire_schedules(now(), now())$$) AS fire_by_hand;
RESET ROLE;
SELECT name, owner FROM gd.schedules ORDER BY name;   -- the FSM's owner sees them all
SELECT gd_unschedule('team_report') AS unscheduled_by_superuser;

DELETE FROM gd._schedules;
DELETE FROM gd._instances WHERE fsm = 'report';
DELETE FROM gd._grants WHERE fsm = 'report';
REVOKE ALL ON SCHEMA t FROM regress_gd_scheduler, regress_gd_stranger;
REVOKE ALL ON FUNCTION t.try(text) FROM regress_gd_scheduler, regress_gd_stranger;
DROP ROLE regress_gd_scheduler, regress_gd_stranger;
