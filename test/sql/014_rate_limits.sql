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

-- 2 an hour, saving up to 3: five inserted at once, three run, two wait.
-- (Hourly rates throughout: the time the test itself takes refills a
-- bucket by a negligible fraction of a token.)
SELECT gd_set_rate_limit('api', 2, '1 hour', burst => 3);
SELECT name, rate, per, burst FROM gd.rate_limits WHERE name = 'api';
SELECT gd_stats_reset();
SELECT count(gd_insert('limited', rate_limit => 'api')) FROM generate_series(1, 5);
SELECT gd._execute('rl', 100) AS ran;
SELECT status, count(*), bool_and(eligible_at > now() + interval '20 minutes') AS pushed_back
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

-- The budget, counted: 10 an hour with a burst of 10, on a queue no
-- executor serves.  The burst runs at once; each step without a token is
-- postponed to its own turn, 6 minutes (a token) after the one before.
SELECT gd_define_fsm('budgeted', initial => 'call', queue => 'rl_budget');
SELECT gd_define_step('budgeted', 'call', 't.limited(jsonb, gd.context)'::regprocedure);
SELECT gd_set_rate_limit('budget', 10, '1 hour', burst => 10);
SELECT count(gd_insert('budgeted', rate_limit => 'budget')) FROM generate_series(1, 25);
SELECT gd._execute('rl_budget', 100) AS ran;
SELECT string_agg(left(status, 1), '' ORDER BY id) AS in_order,
       count(*) FILTER (WHERE status = 'done') AS ran,
       count(*) FILTER (WHERE status = 'runnable' AND eligible_at > now() + interval '5 minutes') AS postponed,
       count(DISTINCT eligible_at) FILTER (WHERE status = 'runnable') AS turns,
       max(eligible_at) FILTER (WHERE status = 'runnable') - min(eligible_at) FILTER (WHERE status = 'runnable')
         AS first_to_last_turn
  FROM gd.instances WHERE fsm = 'budgeted';
SELECT round(tokens::numeric, 1) AS tokens FROM gd._rate_buckets WHERE key = 'budget';
SELECT count(*) AS ran FROM t.ledger l JOIN gd.instances i ON i.id = l.instance_id WHERE i.fsm = 'budgeted';

-- The bucket refills by the clock: rather than wait, move its last refill
-- back.  Half an hour gives 5 tokens: a drain taking the postponed steps
-- before their turns (with_scheduled) runs the first 5, in turn order, and
-- postpones the other 10 again.
UPDATE gd._rate_buckets SET refilled_at = refilled_at - interval '30 minutes' WHERE key = 'budget';
SELECT gd_drain('rl_budget', with_scheduled => true) AS ran;
SELECT string_agg(left(status, 1), '' ORDER BY id) AS in_order,
       count(*) FILTER (WHERE status = 'done') AS ran,
       count(*) FILTER (WHERE status = 'runnable' AND eligible_at > now() + interval '5 minutes') AS postponed
  FROM gd.instances WHERE fsm = 'budgeted';
SELECT round(tokens::numeric, 1) AS tokens FROM gd._rate_buckets WHERE key = 'budget';

-- A day idle saves the burst, not a day's worth: of 15 waiting, 10 run.
SELECT count(gd_insert('budgeted', rate_limit => 'budget')) FROM generate_series(1, 5);
UPDATE gd._rate_buckets SET refilled_at = refilled_at - interval '1 day' WHERE key = 'budget';
SELECT gd_drain('rl_budget', with_scheduled => true) AS ran;
SELECT string_agg(left(status, 1), '' ORDER BY id) AS in_order,
       count(*) FILTER (WHERE status = 'done') AS ran,
       count(*) FILTER (WHERE status = 'runnable' AND eligible_at > now() + interval '5 minutes') AS postponed
  FROM gd.instances WHERE fsm = 'budgeted';
SELECT count(*) AS steps_run, count(DISTINCT l.instance_id) AS instances
  FROM t.ledger l JOIN gd.instances i ON i.id = l.instance_id WHERE i.fsm = 'budgeted';

-- The background executors hold to a budget the same way (queue default):
-- once they have picked all 25, 10 ran and 15 wait for their turns.
SELECT gd_define_fsm('budgeted_bg', initial => 'call', queue => 'default');
SELECT gd_define_step('budgeted_bg', 'call', 't.limited(jsonb, gd.context)'::regprocedure);
SELECT gd_set_rate_limit('budget_bg', 10, '1 hour', burst => 10);
SELECT count(gd_insert('budgeted_bg', rate_limit => 'budget_bg')) FROM generate_series(1, 25);
DO $$
BEGIN
    FOR i IN 1..600 LOOP
        EXIT WHEN (SELECT count(*) FILTER (WHERE status = 'done') + count(*) FILTER (
                              WHERE status = 'runnable' AND eligible_at > clock_timestamp() + interval '5 minutes')
                     FROM gd.instances WHERE fsm = 'budgeted_bg') = 25;
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT count(*) FILTER (WHERE status = 'done') AS ran,
       count(*) FILTER (WHERE status = 'runnable' AND eligible_at > now() + interval '5 minutes') AS postponed
  FROM gd.instances WHERE fsm = 'budgeted_bg';
-- (Cancelled, so that none of them runs during the files after this one.)
SELECT count(gd_cancel(id)) AS cancelled FROM gd.instances WHERE fsm = 'budgeted_bg' AND status = 'runnable';
