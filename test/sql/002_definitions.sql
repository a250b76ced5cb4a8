-- gd_define_fsm / gd_define_step: definitions, versions and refusals.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.noop(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE sql AS $$ SELECT gd_done() $$;
CREATE FUNCTION t.wrong_args(state json, ctx gd.context) RETURNS gd.outcome
LANGUAGE sql AS $$ SELECT gd_done() $$;
CREATE FUNCTION t.wrong_result(state jsonb, ctx gd.context) RETURNS jsonb
LANGUAGE sql AS $$ SELECT state $$;
CREATE FUNCTION t.one_arg(state jsonb) RETURNS gd.outcome
LANGUAGE sql AS $$ SELECT gd_done() $$;

SELECT gd_define_fsm('defs', initial => 'a', queue => 'manual', state_defaults => '{"n": 1}');
SELECT gd_define_step('defs', 'a', 't.noop(jsonb, gd.context)'::regprocedure,
                      max_attempts => 4, backoff => '2s', max_backoff => '1m', timeout => '10s');
SELECT gd_define_step('defs', 'ext');   -- no handler: an external step
SELECT fsm, version, step, handler, max_attempts, backoff, max_backoff, timeout
  FROM gd.steps WHERE fsm = 'defs' ORDER BY step;
SELECT name, version, initial_step, queue, state_defaults, owner FROM gd.fsms WHERE name = 'defs';
-- A queue named by an FSM becomes known.
SELECT name, paused FROM gd.queues ORDER BY name;

-- Defining again updates in place (scripts can be re-run).
SELECT gd_define_step('defs', 'a', 't.noop(jsonb, gd.context)'::regprocedure, max_attempts => 2);
SELECT step, max_attempts, backoff FROM gd.steps WHERE fsm = 'defs' AND step = 'a';

-- Handlers of the wrong signature are refused.
SELECT t.try($$SELECT gd_define_step('defs', 'b', 't.wrong_args(json, gd.context)'::regprocedure)$$);
SELECT t.try($$SELECT gd_define_step('defs', 'b', 't.wrong_result(jsonb, gd.context)'::regprocedure)$$);
SELECT t.try($$SELECT gd_define_step('defs', 'b', 't.one_arg(jsonb)'::regprocedure)$$);
SELECT count(*) AS refused_steps_stored FROM gd.steps WHERE fsm = 'defs' AND step = 'b';

-- Bad arguments.
SELECT t.try($$SELECT gd_define_fsm('', initial => 'a')$$);
SELECT t.try($$SELECT gd_define_fsm(NULL, initial => 'a')$$);
SELECT t.try($$SELECT gd_define_fsm('x', initial => NULL)$$);
SELECT t.try($$SELECT gd_define_fsm('x', initial => 'a', version => 0)$$);
SELECT t.try($$SELECT gd_define_fsm('x', initial => 'a', state_defaults => '[1]')$$);
SELECT t.try($$SELECT gd_define_fsm('x', initial => 'a', queue => '')$$);
SELECT t.try($$SELECT gd_define_step('nope', 'a')$$);
SELECT t.try($$SELECT gd_define_step('defs', 'a', version => 7)$$);
SELECT t.try($$SELECT gd_define_step('defs', '')$$);
SELECT t.try($$SELECT gd_define_step('defs', 'c', max_attempts => 0)$$);
SELECT t.try($$SELECT gd_define_step('defs', 'c', backoff => '-1s')$$);
SELECT t.try($$SELECT gd_define_step('defs', 'c', timeout => '0s')$$);
SELECT count(*) AS nothing_half_written FROM gd.fsms WHERE name = 'x';

-- Versions: gd_define_step goes to the newest version unless told.
SELECT gd_define_fsm('defs', initial => 'a', queue => 'manual', version => 2);
SELECT gd_define_step('defs', 'a', 't.noop(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('defs', 'ext', version => 1, max_attempts => 9);
SELECT version, step, max_attempts FROM gd.steps WHERE fsm = 'defs' ORDER BY version, step;

-- A definition with instances cannot be deleted, renamed or truncated away;
-- one without can (and its steps go with it).
SELECT gd_define_fsm('in_use', initial => 'a', queue => 'manual');
SELECT gd_define_step('in_use', 'a');
SELECT gd_insert('in_use') IS NOT NULL AS inserted;
SELECT gd_define_fsm('unused', initial => 'a', queue => 'manual');
SELECT gd_define_step('unused', 'a');
SELECT t.try($$DELETE FROM gd._fsms WHERE name = 'in_use'$$);
SELECT t.try($$UPDATE gd._fsms SET version = 5 WHERE name = 'in_use'$$);
SELECT t.try($$TRUNCATE gd._fsms CASCADE$$);
UPDATE gd._fsms SET state_defaults = '{"kept": true}' WHERE name = 'in_use';
DELETE FROM gd._fsms WHERE name = 'unused';
SELECT name, state_defaults, (SELECT count(*) FROM gd.steps s WHERE s.fsm = f.name) AS steps
  FROM gd.fsms f WHERE name IN ('in_use', 'unused');
DELETE FROM gd._instances WHERE fsm = 'in_use';
DELETE FROM gd._fsms WHERE name = 'in_use';
SELECT count(*) AS in_use_gone FROM gd.fsms WHERE name = 'in_use';
