-- gen_durable soak benchmark schema: the FSM, the steady producer and the
-- sampler.  Run once on a fresh database by test/bench/soak.sh.
\set QUIET on
CREATE EXTENSION gen_durable;
CREATE EXTENSION pgstattuple;  -- exact dead tuple counts, whatever pg_stat_user_tables says
CREATE SCHEMA soak;

-- Every instance starts at 'start'.  Plain ones are done there (one step);
-- the others ({"sig": true}) wait for the signal 'go', which the producer
-- sent in the inserting transaction, so the wait consumes it at once and
-- 'finish' runs next: two steps and one gd.signals row.
CREATE FUNCTION soak.step(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'start' AND (state->>'sig')::boolean THEN
        RETURN gd_wait_signal(ARRAY['go'], then_step => 'finish');
    END IF;
    RETURN gd_done(jsonb_build_object('n', state->'n'));
END $$;
SELECT gd_define_fsm(name => 'soak', initial => 'start', queue => 'default');
SELECT gd_define_step('soak', 'start', handler => 'soak.step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('soak', 'finish', handler => 'soak.step(jsonb, gd.context)'::regprocedure);

-- The producer: `rate` instances a second, committed every `tick_ms` (one
-- transaction per tick, each gd_insert its own call; every `signal_every`-th
-- instance is a signalled two-step one, 0 for none).  soak.sh calls it once
-- per second of load, `second` = 0, 1, 2, ..., from one psql session, so the
-- session goes idle (and reports its table statistics) between calls, as an
-- application's would.  It keeps to the wall clock from the start recorded
-- at second 0: a late tick inserts what is due, so the total is rate ×
-- seconds; soak.producer counts the late ticks.
CREATE TABLE soak.producer (started timestamptz NOT NULL, made bigint NOT NULL DEFAULT 0,
                            ticks int NOT NULL DEFAULT 0, late int NOT NULL DEFAULT 0,
                            worst_ms float8 NOT NULL DEFAULT 0);

CREATE PROCEDURE soak.produce(second int, rate int, tick_ms int DEFAULT 100, signal_every int DEFAULT 2)
LANGUAGE plpgsql AS $$
DECLARE
    per_second int := 1000 / tick_ms;
    started timestamptz;
    n bigint := rate::bigint * second;  -- instances made before this second
    due bigint;
    late_ticks int := 0;
    worst float8 := 0;
    id bigint;
    ahead float8;
    sig boolean;
BEGIN
    IF second = 0 THEN
        DELETE FROM soak.producer;
        INSERT INTO soak.producer (started) VALUES (clock_timestamp());
        COMMIT;
    END IF;
    SELECT p.started INTO STRICT started FROM soak.producer p;
    FOR k IN second * per_second + 1 .. (second + 1) * per_second LOOP
        due := rate::bigint * k * tick_ms / 1000;
        WHILE n < due LOOP
            n := n + 1;
            sig := signal_every > 0 AND n % signal_every = 0;
            id := gd_insert('soak', jsonb_build_object('n', n, 'sig', sig));
            IF sig THEN
                PERFORM gd_signal(id, 'go');
            END IF;
        END LOOP;
        COMMIT;
        ahead := extract(epoch FROM started + make_interval(secs => k * tick_ms / 1000.0) - clock_timestamp());
        IF ahead > 0 THEN
            PERFORM pg_sleep(ahead);
        ELSE
            late_ticks := late_ticks + 1;
            worst := greatest(worst, -ahead);
        END IF;
    END LOOP;
    UPDATE soak.producer p SET made = n, ticks = p.ticks + per_second, late = p.late + late_ticks,
                               worst_ms = greatest(p.worst_ms, worst * 1000);
    COMMIT;
END $$;

-- One sample, one line: what soak.sh prints every SOAK_SAMPLE seconds.
-- Sizes are pg_total_relation_size (heap + indexes + TOAST) in kB; the
-- pg_stat_user_tables figures are the statistics system's, as autovacuum
-- sees them; *_dead_exact are pgstattuple's, counted in the heap now.
CREATE FUNCTION soak.sample(
    OUT inserted bigint, OUT rows_total bigint, OUT live bigint, OUT finished bigint,
    OUT inst_live_tup bigint, OUT inst_dead_tup bigint, OUT inst_dead_exact bigint, OUT inst_kb bigint,
    OUT inst_autovacuums bigint,
    OUT sig_rows bigint, OUT sig_live_tup bigint, OUT sig_dead_tup bigint, OUT sig_dead_exact bigint,
    OUT sig_kb bigint, OUT sig_autovacuums bigint, OUT gc_swept bigint, OUT steps bigint, OUT step_done bigint,
    OUT lag_s numeric)
LANGUAGE sql AS $$
SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('gd.instances', 'id')::regclass), 0),
       i.total, i.live, i.finished,
       si.n_live_tup, si.n_dead_tup, (SELECT dead_tuple_count FROM pgstattuple('gd.instances')),
       pg_total_relation_size('gd._instances') / 1024, si.autovacuum_count,
       (SELECT count(*) FROM gd.signals),
       ss.n_live_tup, ss.n_dead_tup, (SELECT dead_tuple_count FROM pgstattuple('gd.signals')),
       pg_total_relation_size('gd._signals') / 1024, ss.autovacuum_count,
       (SELECT count FROM gd.stats WHERE event = 'gc_swept'),
       (SELECT sum(count) FROM gd.stats WHERE event LIKE 'step\_%'),
       (SELECT count FROM gd.stats WHERE event = 'step_done'),
       round(extract(epoch FROM coalesce(
           (SELECT oldest_runnable_age FROM gd.queue_stats WHERE queue = 'default'), '0'))::numeric, 2)
  FROM (SELECT count(*) AS total,
               count(*) FILTER (WHERE status IN ('runnable', 'executing', 'awaiting_signal',
                                                 'awaiting_children')) AS live,
               count(*) FILTER (WHERE status IN ('done', 'failed', 'cancelled')) AS finished
          FROM gd.instances) i,
       pg_stat_user_tables si, pg_stat_user_tables ss
 WHERE si.relid = 'gd._instances'::regclass AND ss.relid = 'gd._signals'::regclass
$$;
