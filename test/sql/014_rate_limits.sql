-- Rate limits: token buckets per limit and partition; a step without its
-- tokens stays runnable, pushed back until they will be there.  Queue 'rl'
-- has no background executors (gd._execute steps it).
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.limited(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step, ctx.attempt);
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('limited', initial => 'call', queue => 'rl');
SELECT gd_define_step('limited', 'call', 't.limited(jsonb, gd.context)'::regprocedure);

-- 2 per minute, saving up to 3: five inserted at once, three run, two wait.
SELECT gd_set_rate_limit('api', 2, '1 minute', burst => 3);
SELECT name, rate, per, burst FROM gd.rate_limits WHERE name = 'api';
SELECT gd_stats_reset();
SELECT count(gd_insert('limited', rate_limit => 'api')) FROM generate_series(1, 5);
SELECT gd._execute('rl', 100) AS ran;
SELECT status, count(*), bool_and(eligible_at > now() + interval '20 seconds') AS pushed_back
  FROM gd.instances WHERE fsm = 'limited' GROUP BY status ORDER BY status;
SELECT (SELECT count FROM gd.stats WHERE event = 'rate_limit_throttled') AS throttled;
SELECT gd._execute('rl', 100) AS ran_again;   -- nothing: the waiting ones are not eligible yet

-- Each partition has its own bucket; a weight takes that many tokens.
SELECT count(gd_insert('limited', rate_limit => 'api:' || p)) FROM unnest(ARRAY['a', 'a', 'a', 'b']) p;
SELECT gd_insert('limited', rate_limit => 'api:b', weight => 3) IS NOT NULL AS heavy;
SELECT gd._execute('rl', 100) AS ran;          -- a,a,a and b (3 tokens left... then 2): the heavy one waits
SELECT key, round(tokens::numeric, 1) AS tokens FROM gd._rate_buckets WHERE key LIKE 'api%' ORDER BY key;
SELECT rate_limit, weight, status FROM gd.instances WHERE fsm = 'limited' AND rate_limit LIKE 'api:%' ORDER BY id;

-- A step may name a limit too: every run of it takes a token.
SELECT gd_set_rate_limit('mailer', 1, '1 hour');
SELECT gd_define_step('limited', 'call', 't.limited(jsonb, gd.context)'::regprocedure, rate_limit => 'mailer');
SELECT count(gd_insert('limited')) FROM generate_series(1, 2);
SELECT gd._execute('rl', 100) AS ran;          -- one token an hour
SELECT gd_define_step('limited', 'call', 't.limited(jsonb, gd.context)'::regprocedure);

-- A dropped limit leaves its instances waiting (counted, logged once), not lost.
SELECT gd_set_rate_limit('doomed', 1, '1 second');
SELECT gd_insert('limited', rate_limit => 'doomed') AS doomed_id \gset
SELECT gd_drop_rate_limit('doomed'), gd_drop_rate_limit('doomed') AS again;
SELECT gd._execute('rl', 100) AS ran;
SELECT status, eligible_at > now() + interval '50 seconds' AS waits FROM gd.instances WHERE id = :doomed_id;

-- Refusals.
SELECT t.try($$SELECT gd_insert('limited', rate_limit => 'nope')$$);
SELECT t.try($$SELECT gd_insert('limited', rate_limit => ':p')$$);
SELECT t.try($$SELECT gd_insert('limited', rate_limit => 'api', weight => 4)$$);
SELECT t.try($$SELECT gd_set_rate_limit('x', 0, '1s')$$);
SELECT t.try($$SELECT gd_set_rate_limit('x', 1, '0s')$$);
SELECT t.try($$SELECT gd_set_rate_limit('x', 1, '1s', burst => 0)$$);
SELECT t.try($$SELECT gd_set_rate_limit('x:y', 1, '1s')$$);
SELECT t.try($$SELECT gd_define_step('limited', 'call', rate_limit => 'nope')$$);
SELECT t.try($$SELECT gd_define_step('limited', 'call', rate_limit => 'api:a')$$);

-- The budget, measured: 10 per second with a burst of 10 admits at most
-- 10 + 10 x 5 = 60 steps in the 5 seconds after the start (background
-- executors, queue 'default'; each step records when it ran).
SELECT gd_define_fsm('budgeted', initial => 'call', queue => 'default');
SELECT gd_define_step('budgeted', 'call', 't.limited(jsonb, gd.context)'::regprocedure);
SELECT gd_set_rate_limit('budget', 10, '1 second', burst => 10);
SELECT clock_timestamp() AS started \gset
SELECT count(gd_insert('budgeted', rate_limit => 'budget')) FROM generate_series(1, 100);
SELECT pg_sleep(5.5);
SELECT count(*) FILTER (WHERE l.at < :'started'::timestamptz + interval '5 seconds') <= 60 AS within_budget,
       count(*) FILTER (WHERE l.at < :'started'::timestamptz + interval '5 seconds') >= 30 AS kept_pace
  FROM t.ledger l JOIN gd.instances i ON i.id = l.instance_id WHERE i.fsm = 'budgeted';
