-- Steps on queues of their own: gd_define_step(..., queue => ...) runs a
-- step on that queue (executors for in-database steps, gd_claim for external
-- ones); the instance's other steps run on its home queue (its FSM's, or its
-- insert's).  None of the queues here has background executors.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.routed_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step || '@' || ctx.queue, ctx.attempt);
    RETURN CASE ctx.step
        WHEN 'prepare' THEN gd_next('charge')
        WHEN 'start' THEN gd_next('finish')
        WHEN 'audit' THEN gd_next('finish')
        WHEN 'park' THEN gd_wait_signal(ARRAY['go'], then_step => 'audit')
        ELSE gd_done(jsonb_build_object('ran_on', ctx.queue)) END;
END $$;
SELECT gd_define_fsm('rq_other', initial => 'a', queue => 'rq_urgent');   -- makes rq_urgent known
SELECT gd_define_fsm('routed', initial => 'prepare', queue => 'rq_home');
SELECT gd_define_step('routed', 'prepare', 't.routed_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('routed', 'charge', queue => 'rq_payments');
SELECT gd_define_step('routed', 'audit', 't.routed_step(jsonb, gd.context)'::regprocedure, queue => 'rq_audits');
SELECT gd_define_step('routed', 'finish', 't.routed_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('routed', 'park', 't.routed_step(jsonb, gd.context)'::regprocedure);
SELECT step, queue FROM gd.steps WHERE fsm = 'routed' ORDER BY step;
SELECT name FROM gd.queues WHERE name LIKE 'rq\_%' ORDER BY name;

CREATE VIEW t.routed AS
SELECT i.state->>'n' AS n, i.status, i.step, i.queue, i.home_queue, i.external
  FROM gd.instances i WHERE i.fsm = 'routed';

SELECT gd_insert('routed', '{"n": "plain"}') AS plain_id \gset
SELECT gd_insert('routed', '{"n": "urgent"}', queue => 'rq_urgent') AS urgent_id \gset
-- Inserted at a step with a queue of its own: there, with its home kept.
SELECT gd_insert('routed', '{"n": "at_charge"}', step => 'charge') AS at_charge_id \gset
SELECT * FROM t.routed ORDER BY n;

-- prepare runs on the home queue and goes to charge, on rq_payments.
SELECT gd._execute('rq_home', 10) AS ran_home, gd._execute('rq_urgent', 10) AS ran_urgent;
SELECT * FROM t.routed ORDER BY n;
-- Only rq_payments' workers see charge.
SELECT count(*) AS claimed_on_home FROM gd_claim('rq_home', 'w');
SELECT count(*) AS claimed_on_urgent FROM gd_claim('rq_urgent', 'w');
SELECT gd_complete(id, lease_token, gd_next('audit')) FROM gd_claim('rq_payments', 'w', 10) ORDER BY id;
SELECT * FROM t.routed ORDER BY n;
-- audit runs on rq_audits, then finish back home: each instance's own home.
SELECT gd._execute('rq_home', 10) AS ran_home_before_audit;
SELECT gd._execute('rq_audits', 10) AS ran_audits;
SELECT * FROM t.routed ORDER BY n;
SELECT gd._execute('rq_home', 10) AS ran_home, gd._execute('rq_urgent', 10) AS ran_urgent;
SELECT state->>'n' AS n, status, result FROM gd.instances WHERE fsm = 'routed' ORDER BY 1;
SELECT l.step, count(*) FROM t.ledger l
  JOIN gd.instances i ON i.id = l.instance_id AND i.fsm = 'routed' GROUP BY l.step ORDER BY l.step;

-- A wait resumed at a step with a queue of its own: it resumes there.
SELECT gd_insert('routed', '{"n": "parked"}', step => 'park') AS parked_id \gset
SELECT gd._execute('rq_home', 10) AS ran;
SELECT gd_signal(:parked_id, 'go');
SELECT * FROM t.routed WHERE n = 'parked';

-- Redefining a step's queue moves the instances runnable at it; no queue
-- brings them home.
SELECT gd_insert('routed', '{"n": "moved"}', step => 'charge') AS moved_id \gset
SELECT gd_define_step('routed', 'charge', queue => 'rq_payments_2');
SELECT * FROM t.routed WHERE n = 'moved';
SELECT gd_define_step('routed', 'charge');
SELECT * FROM t.routed WHERE n = 'moved';
SELECT count(*) AS claimed_home FROM gd_claim('rq_home', 'w', 10);

-- The executors of a step's queue are woken for it: queue mail has one.
SELECT gd_define_fsm('routed_bg', initial => 'start', queue => 'rq_home', steps => $${
    "start": {"handler": "t.routed_step(jsonb, gd.context)"},
    "finish": {"handler": "t.routed_step(jsonb, gd.context)", "queue": "mail"}
}$$);
SELECT gd_insert('routed_bg') AS bg_id \gset
SELECT gd._execute('rq_home', 10) AS ran;
SELECT status, result FROM gd_await(:bg_id, timeout => '30s', until => 'terminal');

-- In gd_define_fsm's steps, and refused: an empty or too long name.
SELECT gd_define_fsm('routed_one', initial => 'go', queue => 'rq_home',
                     steps => '{"go": {"queue": "rq_one_step"}}');
SELECT step, queue FROM gd.steps WHERE fsm = 'routed_one';
SELECT t.try($$SELECT gd_define_step('routed', 'charge', queue => '')$$);
SELECT t.try($$SELECT gd_define_step('routed', 'charge', queue => repeat('q', 64))$$);
SELECT t.try($$SELECT gd_define_fsm('routed_one', initial => 'go', queue => 'rq_home', steps => '{"go": {"queue": ""}}')$$);
SELECT step, queue FROM gd.steps WHERE fsm = 'routed' AND step = 'charge';
