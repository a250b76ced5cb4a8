-- Rate limits on external steps: gd_claim takes a step's tokens as the
-- executors do; a step refused waits, pushed back until its tokens will be
-- there (or a minute at a time while its limit is dropped), and is not
-- claimed meanwhile.  Queue 'rated_claims' has no executors.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
SELECT gd_set_rate_limit('claim_api', 2, '1 hour');
SELECT gd_set_rate_limit('claim_step', 1, '1 hour');
SELECT gd_define_fsm('rated', initial => 'call', queue => 'rated_claims');
SELECT gd_define_step('rated', 'call');
SELECT gd_define_fsm('step_rated', initial => 'call', queue => 'rated_claims');
SELECT gd_define_step('step_rated', 'call', rate_limit => 'claim_step');
SELECT count(*) AS inserted
  FROM (SELECT gd_insert('rated', jsonb_build_object('n', n), rate_limit => 'claim_api')
          FROM generate_series(1, 5) n) i;
SELECT count(*) AS inserted FROM (SELECT gd_insert('step_rated') FROM generate_series(1, 3) n) i;

-- The burst of each limit is claimed, the rest is pushed back and waits.
SELECT fsm, count(*) AS claimed FROM gd_claim('rated_claims', 'rated worker', 20) GROUP BY fsm ORDER BY fsm;
SELECT fsm, status, eligible_at > now() + interval '10 minutes' AS pushed_back, count(*)
  FROM gd.instances WHERE fsm IN ('rated', 'step_rated') GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;
SELECT count(*) AS claimed_again FROM gd_claim('rated_claims', 'rated worker', 20);

-- A dropped limit: its instances wait a minute at a time, unclaimed.
UPDATE gd._instances SET eligible_at = now() WHERE fsm = 'rated' AND status = 'runnable';
SELECT gd_drop_rate_limit('claim_api');
SELECT count(*) AS claimed_without_limit FROM gd_claim('rated_claims', 'rated worker', 20);
SELECT count(*) AS waiting_a_minute
  FROM gd.instances
 WHERE fsm = 'rated' AND status = 'runnable'
   AND eligible_at BETWEEN now() + interval '50 seconds' AND now() + interval '70 seconds';

DELETE FROM gd._instances WHERE fsm IN ('rated', 'step_rated');
SELECT gd_drop_rate_limit('claim_step');
