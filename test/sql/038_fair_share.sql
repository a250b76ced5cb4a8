-- Fair share: a pick shares its batch between the lanes of a priority that
-- have work due — between owners by their weights (gd_set_owner_weight, an
-- administrator's), an owner's part evenly between its fairness keys — so a
-- flood of one owner leaves another's due work its part of the next round.
-- Priorities still come first.  Queues 'fair_picks' and 'fair_claims' have
-- no background executors: gd._execute runs the rounds here, gd_claim claims.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE ROLE regress_gd_fair_a;
CREATE ROLE regress_gd_fair_b;
CREATE TABLE t.fair_round (n int NOT NULL);
INSERT INTO t.fair_round VALUES (0);
CREATE TABLE t.fair_log (seq bigserial PRIMARY KEY, round int NOT NULL, who text NOT NULL, k text);
GRANT USAGE ON SCHEMA t TO regress_gd_fair_a, regress_gd_fair_b;
GRANT SELECT ON t.fair_round TO regress_gd_fair_a, regress_gd_fair_b;
GRANT INSERT ON t.fair_log TO regress_gd_fair_a, regress_gd_fair_b;
GRANT USAGE ON SEQUENCE t.fair_log_seq_seq TO regress_gd_fair_a, regress_gd_fair_b;
CREATE FUNCTION t.fair_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.fair_log (round, who, k)
    VALUES ((SELECT n FROM t.fair_round), replace(current_user, 'regress_gd_fair_', ''), state->>'k');
    RETURN gd_done();
END $$;
-- One round of at most `batch` steps: what it ran, per owner and key.
CREATE FUNCTION t.fair_run(batch int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    this_round int;
BEGIN
    UPDATE t.fair_round SET n = n + 1 RETURNING n INTO this_round;
    PERFORM gd._execute('fair_picks', batch);
    RETURN coalesce((SELECT string_agg(c.who || coalesce('/' || c.k, '') || ' ' || c.ran, ', ' ORDER BY c.who, c.k)
                       FROM (SELECT l.who, l.k, count(*) AS ran FROM t.fair_log l WHERE l.round = this_round
                              GROUP BY l.who, l.k) c), 'nothing');
END $$;
SET ROLE regress_gd_fair_a;
SELECT gd_define_fsm('fair_a', initial => 'one', queue => 'fair_picks',
                     steps => '{"one": {"handler": "t.fair_step(jsonb, gd.context)"}}') AS version;
RESET ROLE;
SET ROLE regress_gd_fair_b;
SELECT gd_define_fsm('fair_b', initial => 'one', queue => 'fair_picks',
                     steps => '{"one": {"handler": "t.fair_step(jsonb, gd.context)"}}') AS version;
RESET ROLE;

-- A's 12 steps were inserted first, B's 3 after: first in, but not first
-- served.  Each round of 4 gives B its part (half: equal weights) while it
-- has steps due, and A the rest; A alone then has whole rounds.
SET ROLE regress_gd_fair_a;
SELECT count(gd_insert('fair_a')) FROM generate_series(1, 12);
RESET ROLE;
SET ROLE regress_gd_fair_b;
SELECT count(gd_insert('fair_b')) FROM generate_series(1, 3);
RESET ROLE;
SELECT t.fair_run(4) AS round_1;
SELECT t.fair_run(4) AS round_2;
SELECT t.fair_run(4) AS round_3;
SELECT t.fair_run(4) AS round_4;
SELECT t.fair_run(4) AS round_5;

-- Weights: A's 3 to B's 1, both with a backlog — A 3 steps of each 4, B 1.
SELECT gd_set_owner_weight('regress_gd_fair_a', 3);
SELECT owner, weight FROM gd.owner_weights;
SET ROLE regress_gd_fair_a;
SELECT count(gd_insert('fair_a')) FROM generate_series(1, 8);
RESET ROLE;
SET ROLE regress_gd_fair_b;
SELECT count(gd_insert('fair_b')) FROM generate_series(1, 8);
RESET ROLE;
SELECT t.fair_run(4) AS weighted_1;
SELECT t.fair_run(4) AS weighted_2;
-- What one owner leaves, the other takes: A's last 2, B's 6.
SELECT t.fair_run(8) AS weighted_3;
-- Back to 1 (the row goes): half and half again.
SELECT gd_set_owner_weight('regress_gd_fair_a', 1);
SELECT count(*) AS weights_left FROM gd.owner_weights;
SET ROLE regress_gd_fair_a;
SELECT count(gd_insert('fair_a')) FROM generate_series(1, 4);
RESET ROLE;
SET ROLE regress_gd_fair_b;
SELECT count(gd_insert('fair_b')) FROM generate_series(1, 4);
RESET ROLE;
SELECT t.fair_run(4) AS even_1;
SELECT t.fair_run(4) AS even_2;

-- Fairness keys share an owner's part: A's one 'small' step runs in the
-- first round beside its 'big' backlog; B's flood leaves A its half.
SET ROLE regress_gd_fair_a;
SELECT count(gd_insert('fair_a', '{"k": "big"}', fairness_key => 'big')) FROM generate_series(1, 6);
SELECT gd_insert('fair_a', '{"k": "small"}', fairness_key => 'small') IS NOT NULL AS inserted;
RESET ROLE;
SET ROLE regress_gd_fair_b;
SELECT count(gd_insert('fair_b')) FROM generate_series(1, 6);
RESET ROLE;
SELECT fairness_key, count(*), count(DISTINCT fairness_lane) AS lanes FROM gd.instances
 WHERE fsm = 'fair_a' AND status = 'runnable' GROUP BY fairness_key ORDER BY fairness_key;
SELECT t.fair_run(4) AS keyed_1;
SELECT t.fair_run(4) AS keyed_2;
SELECT t.fair_run(8) AS keyed_3;
-- In gd_insert_all's entries too.
SET ROLE regress_gd_fair_a;
SELECT count(*) FROM gd_insert_all('fair_a', '[{"state": {"k": "x"}, "fairness_key": "x"},
                                               {"state": {"k": "y"}, "fairness_key": "y"},
                                               {"state": {"k": "y"}, "fairness_key": "y"}]');
RESET ROLE;
SELECT t.fair_run(2) AS entries_1;
SELECT t.fair_run(2) AS entries_2;

-- More keys with steps due than rows in a round: one each, the ones left
-- out changing from round to round — three keys of 2 steps, rounds of 2,
-- each key runs twice in three rounds.
SET ROLE regress_gd_fair_a;
SELECT count(gd_insert('fair_a', jsonb_build_object('k', k), fairness_key => k))
  FROM unnest(ARRAY['p', 'q', 'r', 'p', 'q', 'r']) k;
RESET ROLE;
SELECT t.fair_run(2) IS DISTINCT FROM 'nothing' AS ran_1, t.fair_run(2) IS DISTINCT FROM 'nothing' AS ran_2,
       t.fair_run(2) IS DISTINCT FROM 'nothing' AS ran_3;
SELECT l.k, count(*) AS runs, count(DISTINCT l.round) AS rounds FROM t.fair_log l
 WHERE l.round > (SELECT n FROM t.fair_round) - 3 GROUP BY l.k ORDER BY l.k;
SELECT count(*) AS left_over FROM gd.instances WHERE fsm = 'fair_a' AND status = 'runnable';

-- Priorities come first: B's two steps of priority -1 before any of A's.
SET ROLE regress_gd_fair_a;
SELECT count(gd_insert('fair_a')) FROM generate_series(1, 5);
RESET ROLE;
SET ROLE regress_gd_fair_b;
SELECT count(gd_insert('fair_b', priority => -1)) FROM generate_series(1, 2);
RESET ROLE;
SELECT t.fair_run(3) AS prioritised_1;
SELECT t.fair_run(10) AS prioritised_2;

-- A child takes its parent's fairness key, unless its entry gives one.
CREATE FUNCTION t.fair_parent(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
    SELECT CASE ctx.step WHEN 'spawn' THEN gd_spawn('[{"fsm": "fair_a"}, {"fsm": "fair_a", "fairness_key": "own"}]',
                                                    then_step => 'end')
                         ELSE gd_done() END
$$;
SET ROLE regress_gd_fair_a;
SELECT gd_define_fsm('fair_parent', initial => 'spawn', queue => 'fair_picks',
                     steps => '{"spawn": {"handler": "t.fair_parent(jsonb, gd.context)"},
                                "end": {"handler": "t.fair_parent(jsonb, gd.context)"}}') AS version;
SELECT gd_insert('fair_parent', fairness_key => 'family') AS parent \gset
RESET ROLE;
SELECT t.fair_run(1) AS spawned;
SELECT fairness_key, fairness_lane = gd._fairness_lane(fairness_key) AS its_lane FROM gd.instances
 WHERE parent_id = :parent ORDER BY id;
SELECT t.fair_run(10) AS children;

-- gd_claim shares its claims the same way: A's 6 external steps and B's 2, 4 at a time.
SET ROLE regress_gd_fair_a;
SELECT gd_define_fsm('fair_ext_a', initial => 'one', queue => 'fair_claims', steps => '{"one": {}}') AS version;
SELECT count(gd_insert('fair_ext_a')) FROM generate_series(1, 6);
RESET ROLE;
SET ROLE regress_gd_fair_b;
SELECT gd_define_fsm('fair_ext_b', initial => 'one', queue => 'fair_claims', steps => '{"one": {}}') AS version;
SELECT count(gd_insert('fair_ext_b')) FROM generate_series(1, 2);
RESET ROLE;
SELECT fsm, count(*) FROM gd_claim('fair_claims', 'w1', max => 4) GROUP BY fsm ORDER BY fsm;
SELECT fsm, count(*) FROM gd_claim('fair_claims', 'w1', max => 4) GROUP BY fsm ORDER BY fsm;

-- Bad input, refused with nothing changed.
SELECT t.try($$SELECT gd_set_owner_weight('regress_gd_fair_b', 0)$$);
SELECT t.try($$SELECT gd_set_owner_weight('regress_gd_fair_b', 1001)$$);
SELECT t.try($$SELECT gd_set_owner_weight('regress_gd_fair_b', NULL)$$);
SELECT t.try($$SELECT gd_set_owner_weight(NULL, 2)$$);
SELECT t.try($$SELECT gd_set_owner_weight('no_such_role', 2)$$);
SELECT t.try($$SELECT gd_insert('fair_a', fairness_key => '')$$);
SELECT t.try($$SELECT gd_insert('fair_a', fairness_key => repeat('k', 1001))$$);
-- An administrator's act: not every role's.
SET ROLE regress_gd_fair_b;
SELECT t.try($$SELECT gd_set_owner_weight('regress_gd_fair_b', 5)$$);
RESET ROLE;
SELECT count(*) AS weights, (SELECT count(*) FROM gd.instances WHERE fsm = 'fair_a' AND status = 'runnable') AS runnable
  FROM gd.owner_weights;

DELETE FROM gd._instances WHERE fsm LIKE 'fair%';
DELETE FROM gd._fsms WHERE name LIKE 'fair%';
DROP FUNCTION t.fair_step(jsonb, gd.context), t.fair_parent(jsonb, gd.context), t.fair_run(int);
DROP TABLE t.fair_log, t.fair_round;
REVOKE ALL ON SCHEMA t FROM regress_gd_fair_a, regress_gd_fair_b;
DROP ROLE regress_gd_fair_a, regress_gd_fair_b;
