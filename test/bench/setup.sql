-- gen_durable benchmark schema: handlers, FSMs and the hand-written floor queue.
-- Run once on a fresh database by test/bench/run.sh (psql -v ON_ERROR_STOP=1).
\set QUIET on
CREATE EXTENSION gen_durable;
CREATE SCHEMA bench;

-- One ledger per workload, all the same shape: the side effect each job/step commits.
CREATE TABLE bench.w1_ledger    (id bigserial PRIMARY KEY, job_id bigint NOT NULL, payload jsonb,
                                 at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE bench.w2_ledger    (LIKE bench.w1_ledger INCLUDING ALL);
CREATE TABLE bench.w3_ledger    (LIKE bench.w1_ledger INCLUDING ALL);
CREATE TABLE bench.floor_ledger (LIKE bench.w1_ledger INCLUDING ALL);
CREATE TABLE bench.ceiling_ledger (LIKE bench.w1_ledger INCLUDING ALL);
-- Target of the bare autocommit-INSERT latency reference (W2's floor).
CREATE TABLE bench.commit_probe (LIKE bench.w1_ledger INCLUDING ALL);

-- ---------------------------------------------------------------- gen_durable
-- W1/W2: one step, one ledger row, done.
CREATE FUNCTION bench.one_step(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.fsm = 'w1' THEN
        INSERT INTO bench.w1_ledger (job_id, payload) VALUES (ctx.id, state);
    ELSE
        INSERT INTO bench.w2_ledger (job_id, payload) VALUES (ctx.id, state);
    END IF;
    RETURN gd_done();
END $$;

-- W3: a -> b -> c -> done; a and b only move the state on, c writes the ledger.
CREATE FUNCTION bench.three_steps(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    CASE ctx.step
        WHEN 'a' THEN RETURN gd_next('b', state || '{"a": true}');
        WHEN 'b' THEN RETURN gd_next('c', state || '{"b": true}');
        ELSE
            INSERT INTO bench.w3_ledger (job_id, payload) VALUES (ctx.id, state);
            RETURN gd_done(state);
    END CASE;
END $$;

-- WB: W1's work as a batch step: one call for up to its batch of instances,
-- one multi-row INSERT of their ledger rows, one gd_done each.
CREATE FUNCTION bench.batch_step(states jsonb[], ctxs gd.context[]) RETURNS gd.outcome[]
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench.w1_ledger (job_id, payload) SELECT (ctxs[k]).id, states[k] FROM generate_subscripts(states, 1) k;
    RETURN array_fill(gd_done(), ARRAY[cardinality(states)]);
END $$;

SELECT gd_define_fsm(name => 'w1', initial => 'only', queue => 'default');
SELECT gd_define_step('w1', 'only', handler => 'bench.one_step(jsonb, gd.context)'::regprocedure);
-- WB's batch step (its batch set by bench.py: BENCH_BATCH).
SELECT gd_define_fsm(name => 'wb', initial => 'only', queue => 'default');
SELECT gd_define_step('wb', 'only', handler => 'bench.batch_step(jsonb[], gd.context[])'::regprocedure, batch => 64);
SELECT gd_define_fsm(name => 'w2', initial => 'only', queue => 'default');
SELECT gd_define_step('w2', 'only', handler => 'bench.one_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm(name => 'w3', initial => 'a', queue => 'default');
SELECT gd_define_step('w3', 'a', handler => 'bench.three_steps(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('w3', 'b', handler => 'bench.three_steps(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('w3', 'c', handler => 'bench.three_steps(jsonb, gd.context)'::regprocedure);

-- ---------------------------------------------------------------- the floor
-- The minimal hand-written SKIP LOCKED queue a user would write instead.
CREATE TABLE bench.floor_jobs (
    id         bigserial PRIMARY KEY,
    status     text NOT NULL DEFAULT 'pending',
    payload    jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz
);
CREATE INDEX floor_jobs_pending ON bench.floor_jobs (id) WHERE status = 'pending';
CREATE TABLE bench.floor_runs (pid int NOT NULL, started_at timestamptz NOT NULL);

-- One worker: claim up to `batch` jobs, one ledger row and a status update per
-- job, commit; until a claim finds nothing.  Two of these run at once.
-- mode 'plain' is the floor.  The two others are diagnostics that add a
-- per-job subtransaction (as gen_durable runs each step in one, to roll a
-- failed handler back):
--   'subxact_all'     INSERT and UPDATE inside it: the row locked by the
--                     transaction is updated by a subtransaction, so its xmax
--                     becomes a MultiXact (the engine's pattern today);
--   'subxact_handler' only the INSERT inside it, the UPDATE in the transaction.
CREATE PROCEDURE bench.floor_worker(batch int DEFAULT 16, mode text DEFAULT 'plain')
LANGUAGE plpgsql AS $$
DECLARE
    job record;
    claimed int;
BEGIN
    IF mode NOT IN ('plain', 'subxact_all', 'subxact_handler') THEN
        RAISE EXCEPTION 'bench: unknown floor mode %', mode;
    END IF;
    INSERT INTO bench.floor_runs VALUES (pg_backend_pid(), clock_timestamp());
    COMMIT;
    LOOP
        claimed := 0;
        FOR job IN SELECT j.id, j.payload FROM bench.floor_jobs j
                    WHERE j.status = 'pending' ORDER BY j.id LIMIT batch
                    FOR UPDATE SKIP LOCKED LOOP
            IF mode = 'plain' THEN
                INSERT INTO bench.floor_ledger (job_id, payload) VALUES (job.id, job.payload);
                UPDATE bench.floor_jobs SET status = 'done', updated_at = clock_timestamp() WHERE id = job.id;
            ELSIF mode = 'subxact_all' THEN
                BEGIN
                    INSERT INTO bench.floor_ledger (job_id, payload) VALUES (job.id, job.payload);
                    UPDATE bench.floor_jobs SET status = 'done', updated_at = clock_timestamp() WHERE id = job.id;
                EXCEPTION WHEN OTHERS THEN
                    RAISE;
                END;
            ELSE
                BEGIN
                    INSERT INTO bench.floor_ledger (job_id, payload) VALUES (job.id, job.payload);
                EXCEPTION WHEN OTHERS THEN
                    RAISE;
                END;
                UPDATE bench.floor_jobs SET status = 'done', updated_at = clock_timestamp() WHERE id = job.id;
            END IF;
            claimed := claimed + 1;
        END LOOP;
        COMMIT;
        EXIT WHEN claimed = 0;
    END LOOP;
END $$;

-- ---------------------------------------------------------------- the work alone
-- W1's work with no queue at all: `jobs` ledger INSERTs in one transaction.
-- FLOOR_WORKERS of these at once give the ceiling that no queue running W1 on
-- this machine can pass.
CREATE PROCEDURE bench.ceiling_worker(first bigint, jobs int)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench.floor_runs VALUES (pg_backend_pid(), clock_timestamp());
    FOR i IN first .. first + jobs - 1 LOOP
        INSERT INTO bench.ceiling_ledger (job_id, payload) VALUES (i, jsonb_build_object('n', i));
    END LOOP;
END $$;

-- ---------------------------------------------------------------- fair share
-- W11: two tenants sharing queue 'default', each owning an FSM of one step
-- that writes this ledger (the tenant in `tenant`).
CREATE TABLE bench.fair_ledger (id bigserial PRIMARY KEY, tenant text NOT NULL, job_id bigint NOT NULL,
                                at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION bench.fair_step(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench.fair_ledger (tenant, job_id) VALUES (ctx.fsm, ctx.id);
    RETURN gd_done();
END $$;
CREATE ROLE bench_tenant_a;
CREATE ROLE bench_tenant_b;
GRANT USAGE ON SCHEMA bench TO bench_tenant_a, bench_tenant_b;
GRANT INSERT ON bench.fair_ledger TO bench_tenant_a, bench_tenant_b;
GRANT USAGE ON SEQUENCE bench.fair_ledger_id_seq TO bench_tenant_a, bench_tenant_b;
SET ROLE bench_tenant_a;
SELECT gd_define_fsm(name => 'fair_a', initial => 'only', queue => 'default',
                     steps => '{"only": {"handler": "bench.fair_step(jsonb, gd.context)"}}');
SET ROLE bench_tenant_b;
SELECT gd_define_fsm(name => 'fair_b', initial => 'only', queue => 'default',
                     steps => '{"only": {"handler": "bench.fair_step(jsonb, gd.context)"}}');
RESET ROLE;
