-- Chains: an executor runs an instance's next step in the same round when it
-- can run it now (gd_next without a delay, same queue, in the database), and
-- writes the row once, where the chain stops.  Every step still counts: its
-- effects, its ctx (attempt 1, a visit key of its own, no signals of the step
-- before), its row of the step history, its statistics.  A step that raises
-- loses only its own effects; chain => false keeps a step out of chains;
-- gen_durable.chain_limit bounds a chain.  The steps run on queue default,
-- served by the engine's executors; a round is one transaction, so the steps
-- of one round share the top transaction's id.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
-- A round's time budget long enough that the chains below are cut by nothing else on a slow machine.
ALTER SYSTEM SET gen_durable.batch_time = '10s';
SELECT pg_reload_conf();
SELECT pg_sleep(0.5);

CREATE TABLE t.chain_effects (instance bigint, step text, attempt int, xid xid8, visit text, signals jsonb,
                              n int);
-- a -> b -> c -> done, each step noting what it saw; state.raise_at: the step that raises on its first attempt.
CREATE FUNCTION t.chain_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.chain_effects
    VALUES (ctx.id, ctx.step, ctx.attempt, pg_current_xact_id(), ctx.idempotency_key, ctx.signals,
            (state->>'n')::int);
    IF state->>'raise_at' = ctx.step AND ctx.attempt = 1 THEN
        RAISE EXCEPTION 'step % raised', ctx.step;
    END IF;
    RETURN CASE ctx.step
        WHEN 'wait' THEN gd_wait_signal(ARRAY['go'], then_step => 'a')
        WHEN 'a' THEN gd_next('b', state || '{"a": true}')
        WHEN 'b' THEN gd_next('c', state || '{"b": true}', delay => (state->>'delay_b')::interval)
        WHEN 'c' THEN gd_done(state || '{"c": true}')
        WHEN 'loop' THEN CASE WHEN (state->>'n')::int < 5 THEN gd_next('loop', state || jsonb_build_object('n', (state->>'n')::int + 1))
                              ELSE gd_done(state) END
    END;
END $$;
CREATE FUNCTION t.define_chain(fsm text, b_chains boolean DEFAULT true) RETURNS void LANGUAGE sql AS $$
    SELECT gd_define_fsm(fsm, initial => 'a', queue => 'default', history => true,
                         steps => jsonb_build_object(
                             'wait', jsonb_build_object('handler', 't.chain_step(jsonb, gd.context)'),
                             'a', jsonb_build_object('handler', 't.chain_step(jsonb, gd.context)'),
                             'b', jsonb_build_object('handler', 't.chain_step(jsonb, gd.context)', 'chain', b_chains),
                             'c', jsonb_build_object('handler', 't.chain_step(jsonb, gd.context)',
                                                     'backoff', '0s'),
                             'loop', jsonb_build_object('handler', 't.chain_step(jsonb, gd.context)')));
$$;
SELECT t.define_chain('chained'), t.define_chain('split', b_chains => false);
CREATE FUNCTION t.await_all(fsm_name text) RETURNS TABLE (status text, instances bigint) LANGUAGE plpgsql AS $$
DECLARE
    instance bigint;
BEGIN
    FOR instance IN SELECT i.id FROM gd.instances i WHERE i.fsm = fsm_name LOOP
        PERFORM gd_await(instance, '60s', until => 'terminal');
    END LOOP;
    RETURN QUERY SELECT i.status::text, count(*) FROM gd.instances i WHERE i.fsm = fsm_name GROUP BY 1;
END $$;
-- Per instance of an FSM: its steps in order, how many rounds (top transactions) they ran in.
CREATE VIEW t.chain_rounds AS
SELECT i.fsm, e.instance, string_agg(e.step || '#' || e.attempt, ' ' ORDER BY e.xid, e.step) AS steps,
       count(DISTINCT e.xid) AS rounds
  FROM t.chain_effects e JOIN gd.instances i ON i.id = e.instance GROUP BY 1, 2;

-- 1. Three steps, one round each instance: one transaction, every step seen as itself.
SELECT count(gd_insert('chained', jsonb_build_object('n', g))) FROM generate_series(1, 20) g;
SELECT * FROM t.await_all('chained');
SELECT steps, rounds, count(*) AS instances FROM t.chain_rounds WHERE fsm = 'chained' GROUP BY 1, 2;
-- each step a visit of its own (ctx.idempotency_key), attempt 1
SELECT count(DISTINCT e.visit) AS visits, count(*) AS steps, max(e.attempt) AS attempt
  FROM t.chain_effects e JOIN gd.instances i ON i.id = e.instance WHERE i.fsm = 'chained';
SELECT count(*) AS complete FROM gd.instances WHERE fsm = 'chained' AND result @> '{"a": true, "b": true, "c": true}';
-- the step history: a row per step, each with the state it started with
SELECT h.step, h.kind, count(*), bool_and(h.state ? 'a') AS after_a, bool_and(h.state ? 'b') AS after_b
  FROM gd.instances i CROSS JOIN LATERAL gd_history(i.id) h WHERE i.fsm = 'chained' GROUP BY 1, 2 ORDER BY 1;
-- the labelled statistics count every step
SELECT step, kind, count FROM gd.step_stats WHERE fsm = 'chained' ORDER BY 1, 2;

-- 2. chain => false on b: the row is written before b and after it.
SELECT count(gd_insert('split', jsonb_build_object('n', g))) FROM generate_series(1, 5) g;
SELECT * FROM t.await_all('split');
SELECT steps, rounds, count(*) AS instances FROM t.chain_rounds WHERE fsm = 'split' GROUP BY 1, 2;

-- 3. A delay ends the chain: c runs in a later round.
TRUNCATE t.chain_effects;
SELECT gd_insert('chained', '{"n": 100, "delay_b": "50ms"}') AS delayed \gset
SELECT status FROM gd_await(:delayed, '60s');
SELECT steps, rounds FROM t.chain_rounds WHERE instance = :delayed;

-- 4. c raises on its first attempt: a and b commit (one round, once), c's
-- attempt is counted, its effects gone; its retry runs alone.
SELECT gd_insert('chained', '{"n": 200, "raise_at": "c"}') AS raising \gset
SELECT status, result @> '{"a": true, "b": true, "c": true}' AS complete FROM gd_await(:raising, '60s');
SELECT steps, rounds FROM t.chain_rounds WHERE instance = :raising;
SELECT step, attempt, kind, error->>'message' AS error FROM gd_history(:raising) ORDER BY entry;

-- 5. A signal resumes the instance at a: a chained b sees no signals (a's visit had them).
SELECT gd_insert('chained', '{"n": 300}', step => 'wait') AS waiting \gset
SELECT status FROM gd_await(:waiting, '60s');
SELECT gd_signal(:waiting, 'go', '{"why": "paid"}');
SELECT status FROM gd_await(:waiting, '60s', until => 'terminal');
SELECT step, signals IS NOT NULL AND signals <> '[]' AS saw_signals FROM t.chain_effects
 WHERE instance = :waiting ORDER BY step;

-- 6. gen_durable.chain_limit = 2: no round runs more than two steps of an instance.
ALTER SYSTEM SET gen_durable.chain_limit = 2;
SELECT pg_reload_conf();
SELECT pg_sleep(0.5);
SELECT gd_insert('chained', '{"n": 1}', step => 'loop') AS looping \gset
SELECT status FROM gd_await(:looping, '60s');
SELECT sum(per_round) AS steps, count(*) AS rounds, max(per_round) AS most_in_a_round
  FROM (SELECT count(*) AS per_round FROM t.chain_effects WHERE instance = :looping GROUP BY xid) r;

-- Bad input: chain must be true or false.
SELECT t.try($$SELECT gd_define_step('chained', 'a', 't.chain_step(jsonb, gd.context)', chain => NULL)$$);
SELECT t.try($$SELECT gd_define_fsm('chained', initial => 'a', steps => '{"a": {"chain": "maybe"}}')$$);
SELECT chain FROM gd.steps WHERE fsm = 'chained' AND step = 'a';

ALTER SYSTEM RESET gen_durable.chain_limit;
ALTER SYSTEM RESET gen_durable.batch_time;
SELECT pg_reload_conf();
