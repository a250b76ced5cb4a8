-- Handlers and owners that disappear.  DROP FUNCTION of a function a step
-- names is refused; when it goes anyway (with its schema, or DROP OWNED),
-- or its FSM's owner is dropped, the instances fail at once (no retry can
-- mend it), with the SQLSTATE and a message naming FSM, version and step.
-- Queue 'dropq' has no background executor.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE ROLE regress_gd_dropper;
CREATE SCHEMA drops;
CREATE FUNCTION drops.h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
CREATE FUNCTION drops.unused() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;
SELECT gd_define_fsm('dropped', 'go', queue => 'dropq');
SELECT gd_define_step('dropped', 'go', 'drops.h(jsonb, gd.context)'::regprocedure);

SELECT t.try($$DROP FUNCTION drops.h(jsonb, gd.context)$$);
DROP FUNCTION drops.unused();               -- no step names it

-- Gone with its schema: the step fails at once, attempt 1 of 3.
SELECT gd_insert('dropped') AS by_schema \gset
DROP SCHEMA drops CASCADE;
SELECT gd._execute('dropq', 10) AS ran;
SELECT status, attempt, error->>'sqlstate' AS sqlstate,
       regexp_replace(error->>'message', 'function \d+', 'function N') AS message
  FROM gd.instances WHERE id = :by_schema;

-- DROP OWNED takes a role's handler along; a handler of its that is not
-- its own stays, but it runs as nobody once the role is dropped.
CREATE FUNCTION t.anyones_h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
GRANT USAGE, CREATE ON SCHEMA t TO regress_gd_dropper;
SET ROLE regress_gd_dropper;
CREATE FUNCTION t.dropper_h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
SELECT gd_define_fsm('dropper', 'mine', queue => 'dropq');
SELECT gd_define_step('dropper', 'mine', 't.dropper_h(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('dropper', 'theirs', 't.anyones_h(jsonb, gd.context)'::regprocedure);
SELECT gd_insert('dropper') AS owned \gset
SELECT gd_insert('dropper', step => 'theirs') AS orphaned \gset
RESET ROLE;
REVOKE ALL ON SCHEMA t FROM regress_gd_dropper;
DROP OWNED BY regress_gd_dropper;
SELECT count(*) AS handler_left FROM pg_proc WHERE proname = 'dropper_h';
DROP ROLE regress_gd_dropper;
SELECT gd._execute('dropq', 10) AS ran;
SELECT step, status, attempt, error->>'sqlstate' AS sqlstate,
       regexp_replace(error->>'message', '(role|function) \d+', '\1 N') AS message
  FROM gd.instances WHERE id IN (:owned, :orphaned) ORDER BY id;

DELETE FROM gd._instances WHERE fsm IN ('dropped', 'dropper');
DELETE FROM gd._fsms WHERE name IN ('dropped', 'dropper');

-- A handler whose own SET search_path leaves the API's schema out does not
-- find gd_next: its attempt fails with 42883, and the error says why.
CREATE FUNCTION t.pinned_h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql
SET search_path = t AS $$ BEGIN RETURN gd_done(); END $$;
SELECT gd_define_fsm('pinned', 'go', queue => 'dropq',
                     steps => '{"go": {"handler": "t.pinned_h(jsonb, gd.context)", "max_attempts": 1}}') AS version;
SELECT gd_insert('pinned') AS pinned \gset
SELECT gd._execute('dropq', 10) AS ran;
SELECT status, error->>'sqlstate' AS sqlstate, error->>'hint' AS hint FROM gd.instances WHERE id = :pinned;
DELETE FROM gd._instances WHERE fsm = 'pinned';
DELETE FROM gd._fsms WHERE name = 'pinned';
DROP FUNCTION t.pinned_h(jsonb, gd.context);
