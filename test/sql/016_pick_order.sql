-- The pick: best first (priority, then eligibility, then id), across
-- priorities in one round, and never a row scheduled later, wherever it
-- sorts among the due rows.  Queue 'picks' has no background executors
-- (gd._execute runs its rounds here).
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE TABLE t.pick_log (seq bigserial PRIMARY KEY, n text NOT NULL);
CREATE FUNCTION t.log_pick(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.pick_log (n) VALUES (state->>'n');
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('picked', initial => 'only', queue => 'picks');
SELECT gd_define_step('picked', 'only', 't.log_pick(jsonb, gd.context)'::regprocedure);

-- In id order; the names say the priority and when the row is due.
SELECT count(gd_insert('picked', jsonb_build_object('n', n), priority => p, eligible_at => now() + due))
  FROM (VALUES ('p0 -2min', 0, interval '-2 minutes'),
               ('p0 -5min', 0, interval '-5 minutes'),
               ('p0 +1h', 0, interval '1 hour'),
               ('p-5 +1h', -5, interval '1 hour'),
               ('p7 -10min first', 7, interval '-10 minutes'),
               ('p-5 -1min', -5, interval '-1 minute'),
               ('p7 -10min second', 7, interval '-10 minutes'),
               ('p3 +2h', 3, interval '2 hours'),
               ('p10 -1min', 10, interval '-1 minute')) v(n, p, due);

-- Rounds of 4: the first crosses three priorities (and one holding only a
-- scheduled row); the scheduled rows stay.
SELECT gd._execute('picks', 4) AS round_1;
SELECT gd._execute('picks', 4) AS round_2;
SELECT gd._execute('picks', 4) AS round_3;
SELECT string_agg(n, ', ' ORDER BY seq) AS run_order FROM t.pick_log;
SELECT state->>'n' AS n, status FROM gd.instances WHERE fsm = 'picked' AND status <> 'done' ORDER BY id;

-- A scheduled row runs once due, alone in its priority.  (Made due by hand,
-- announced as the engine announces what it makes runnable: the queue's
-- frontier would otherwise find it only at its next scan from the front.)
CREATE FUNCTION t.make_due(n text) RETURNS void LANGUAGE sql AS $$
    WITH due AS (UPDATE gd._instances SET eligible_at = now() - interval '1 second'
                  WHERE fsm = 'picked' AND state->>'n' = make_due.n
                  RETURNING queue, priority, owner, fairness_lane, eligible_at, id)
    SELECT gd._wake_on_commit(queue, priority, owner, fairness_lane, eligible_at, id) FROM due
$$;
SELECT t.make_due('p3 +2h');
SELECT gd._execute('picks', 4) AS round_4;
SELECT n AS last_run FROM t.pick_log ORDER BY seq DESC LIMIT 1;

-- A paused queue picks nothing, and its rows wait in their place.
SELECT t.make_due('p-5 +1h');
SELECT gd_pause('picks');
SELECT gd._execute('picks', 4) AS while_paused;
SELECT gd_resume('picks');
SELECT gd._execute('picks', 4) AS resumed;
SELECT n AS last_run FROM t.pick_log ORDER BY seq DESC LIMIT 1;
