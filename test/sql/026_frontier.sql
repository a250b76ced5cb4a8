-- Each queue's frontier (src/frontier.cpp): picks and claims start at each
-- priority's mark, not at the front of the index, so whatever makes a row
-- runnable before a mark must lower it.  A row missed here would wait for the
-- reaper's next look from the front (about a second later): each check below,
-- made at once, would see it missing.
-- Queue 'frontier' has no executors: its steps are external, claimed here.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
SELECT gd_define_fsm('edge', initial => 'work', queue => 'frontier');
SELECT gd_define_step('edge', 'work');
SELECT count(*) AS inserted FROM gd_insert_all('edge', '[{"state": {"n": 1}}, {"state": {"n": 2}}, {"state": {"n": 3}}]');

-- A claim rolled back gives its rows back: the next claim gets them.
BEGIN;
SELECT state->'n' AS claimed_then_rolled_back FROM gd_claim('frontier', 'w', 2) ORDER BY id;
ROLLBACK;
CREATE TABLE frontier_claims AS SELECT id, lease_token, state FROM gd_claim('frontier', 'w', 10);
SELECT array_agg((state->>'n')::int ORDER BY id) AS claimed_again FROM frontier_claims;
SELECT count(*) FILTER (WHERE completed) AS completed
  FROM gd_complete_all(ARRAY(SELECT id FROM frontier_claims ORDER BY id),
                       ARRAY(SELECT lease_token FROM frontier_claims ORDER BY id),
                       ARRAY(SELECT gd_done() FROM frontier_claims ORDER BY id));

-- A row inserted behind every mark (eligible an hour ago), and one of a
-- priority not seen yet, come first.
SELECT gd_insert('edge', '{"n": "late"}', eligible_at => now() - interval '1 hour') > 0 AS inserted_late;
SELECT gd_insert('edge', '{"n": "urgent"}', priority => -5) > 0 AS inserted_urgent;
SELECT gd_insert('edge', '{"n": "plain"}') > 0 AS inserted_plain;
TRUNCATE frontier_claims;
INSERT INTO frontier_claims SELECT id, lease_token, state FROM gd_claim('frontier', 'w', 10);
SELECT s.state->>'n' AS claimed_in_order
  FROM frontier_claims c JOIN gd.instances s USING (id)
 ORDER BY s.priority, s.eligible_at, s.id;

-- A lease that runs out puts its row back where it was: claimed again.
SELECT count(*) FILTER (WHERE completed) AS completed
  FROM gd_complete_all(ARRAY(SELECT id FROM frontier_claims WHERE state->>'n' <> 'plain' ORDER BY id),
                       ARRAY(SELECT lease_token FROM frontier_claims WHERE state->>'n' <> 'plain' ORDER BY id),
                       ARRAY(SELECT gd_done() FROM frontier_claims WHERE state->>'n' <> 'plain' ORDER BY id));
UPDATE gd._instances SET lease_expires_at = now() - interval '1 second'
 WHERE id = (SELECT id FROM frontier_claims WHERE state->>'n' = 'plain');
SELECT FROM gd._expire_leases(100);   -- the reaper's round (what it returns depends on other tests' rows)
SELECT state->>'n' AS reclaimed FROM gd_claim('frontier', 'w', 10);

-- A worker that may claim some FSMs' steps only passes the others' rows by:
-- its claims have a frontier of their own, so the others' stay where they are.
SELECT gd_define_fsm('edge_other', initial => 'work', queue => 'frontier');
SELECT gd_define_step('edge_other', 'work');
CREATE ROLE regress_gd_frontier_worker;
SELECT gd_grant('edge', 'regress_gd_frontier_worker');
SELECT count(*) AS inserted FROM gd_insert_all('edge_other', '[{"state": {"n": "o1"}}, {"state": {"n": "o2"}}]');
SELECT count(*) AS inserted FROM gd_insert_all('edge', '[{"state": {"n": "e1"}}]');
SET ROLE regress_gd_frontier_worker;
SELECT fsm, state->>'n' AS claimed_by_the_limited_worker FROM gd_claim('frontier', 'limited', 10);
RESET ROLE;
SELECT fsm, state->>'n' AS claimed_by_a_superuser FROM gd_claim('frontier', 'all', 10) ORDER BY id;

-- In-database steps, run here (queue 'frontier_db' has no executors): after
-- a batch has run, a row eligible before all of it is picked at once, as is
-- a row of a new priority, and then the rest.
CREATE OR REPLACE FUNCTION t.frontier_done(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS 'SELECT gd_done()';
SELECT gd_define_fsm('in_db', initial => 'only', queue => 'frontier_db');
SELECT gd_define_step('in_db', 'only', handler => 't.frontier_done(jsonb, gd.context)'::regprocedure);
SELECT count(*) AS inserted FROM gd_insert_all('in_db', (SELECT jsonb_agg(jsonb_build_object('state', jsonb_build_object('n', n)))
                                                           FROM generate_series(1, 50) n));
SELECT gd._execute('frontier_db', 100) AS first_batch;
SELECT gd_insert('in_db', '{"n": "plain"}') AS plain_id \gset
SELECT gd_insert('in_db', '{"n": "late"}', eligible_at => now() - interval '1 hour') AS late_id \gset
SELECT gd_insert('in_db', '{"n": "urgent"}', priority => -7) AS urgent_id \gset
SELECT gd._execute('frontier_db', 1) AS ran;
SELECT gd._execute('frontier_db', 1) AS ran;
SELECT gd._execute('frontier_db', 1) AS ran;
SELECT string_agg(state->>'n', ', ' ORDER BY finished_at) AS run_order
  FROM gd.instances WHERE id IN (:plain_id, :late_id, :urgent_id) AND status = 'done';
-- A round rolled back gives its rows back.
SELECT gd_insert('in_db', '{"n": "again"}') AS again_id \gset
BEGIN;
SELECT gd._execute('frontier_db', 10) AS ran_then_rolled_back;
ROLLBACK;
SELECT gd._execute('frontier_db', 10) AS ran;
SELECT status AS again FROM gd.instances WHERE id = :again_id;

-- What nothing announces — here a row made runnable again by hand, behind
-- the mark a round raised past it — the reaper finds: its look from the
-- front of each queue (about every second) lowers the mark to the row, and
-- a round picks it.  Picks themselves no longer look from the front, so
-- without that look the row would wait for ever.
SELECT gd_insert('in_db', '{"n": "by hand"}') AS by_hand_id \gset
SELECT gd._execute('frontier_db', 10) AS ran;
UPDATE gd._instances SET status = 'runnable', finished_at = NULL, eligible_at = now() - interval '1 hour'
 WHERE id = :by_hand_id;
DO $$
BEGIN
    FOR attempt IN 1..300 LOOP
        EXIT WHEN gd._execute('frontier_db', 10) > 0;
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT status AS by_hand_run_again, attempt FROM gd.instances WHERE id = :by_hand_id;
