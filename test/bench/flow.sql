-- Flow control cost: steps per second through the 'default' queue
-- of a served database, for the same single-step work
--   plain  : no limits
--   keys   : 1,000 distinct concurrency keys (limit 1 each)
--   hot    : half the jobs on one hot rate-limited key (100/s), half unthrottled;
--            the figure is the unthrottled half's rate
-- Run: psql -v jobs=20000 -f test/bench/flow.sql   (a database gen_durable serves)
\set ON_ERROR_STOP 1
\pset footer off
CREATE EXTENSION IF NOT EXISTS gen_durable;
DROP SCHEMA IF EXISTS bench_flow CASCADE;
CREATE SCHEMA bench_flow;
CREATE TABLE bench_flow.ledger (instance_id bigint PRIMARY KEY, kind text, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION bench_flow.work(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_flow.ledger (instance_id, kind) VALUES (ctx.id, state->>'kind');
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('bench_flow', initial => 'work', queue => 'default') \gset
SELECT gd_define_step('bench_flow', 'work', 'bench_flow.work(jsonb, gd.context)'::regprocedure) \gset
SELECT gd_set_rate_limit('bench_hot', 100, '1 second') \gset
CREATE TABLE bench_flow.runs (workload text, jobs int, started timestamptz);

CREATE PROCEDURE bench_flow.run(workload text, jobs int) LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE bench_flow.ledger;
    PERFORM CASE workload
        WHEN 'plain' THEN gd_insert('bench_flow', '{"kind": "plain"}')
        WHEN 'keys' THEN gd_insert('bench_flow', '{"kind": "keyed"}', concurrency_key => 'k:' || (g % 1000))
        ELSE CASE WHEN g % 2 = 0 THEN gd_insert('bench_flow', '{"kind": "hot"}', rate_limit => 'bench_hot')
                  ELSE gd_insert('bench_flow', '{"kind": "free"}') END
        END
      FROM generate_series(1, jobs) g;
    INSERT INTO bench_flow.runs VALUES (workload, jobs, clock_timestamp());
    COMMIT;   -- the engine starts here
    WHILE (SELECT count(*) FROM bench_flow.ledger WHERE kind <> 'hot')
          < CASE workload WHEN 'hot' THEN jobs / 2 ELSE jobs END LOOP
        PERFORM pg_sleep(0.05);
        COMMIT;
    END LOOP;
    INSERT INTO bench_flow.runs
    SELECT workload || '_result', count(*), max(at) FROM bench_flow.ledger WHERE kind <> 'hot';
END $$;

CALL bench_flow.run('plain', :jobs);
CALL bench_flow.run('keys', :jobs);
CALL bench_flow.run('hot', :jobs);

SELECT s.workload, r.jobs AS steps,
       round(extract(epoch FROM r.started - s.started)::numeric, 2) AS seconds,
       round(r.jobs / extract(epoch FROM r.started - s.started)) AS steps_per_second
  FROM bench_flow.runs s JOIN bench_flow.runs r ON r.workload = s.workload || '_result'
 ORDER BY s.started;
SELECT event, count FROM gd.stats WHERE event LIKE 'rate%' OR event LIKE 'concurrency%';
-- The hot key's remaining instances would trickle on at 100/s: cancel them.
SELECT count(gd_cancel(i.id)) AS hot_cancelled FROM gd.instances i WHERE i.fsm = 'bench_flow' AND i.status = 'runnable';
