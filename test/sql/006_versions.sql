-- Versions: new instances take the newest version; running ones keep theirs.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.v1_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
    SELECT gd_next('finish', state || jsonb_build_object('first_step_version', ctx.version))
$$;
CREATE FUNCTION t.v2_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
    SELECT gd_next('finish', state || jsonb_build_object('first_step_version', ctx.version, 'new', true))
$$;
CREATE FUNCTION t.report(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
    SELECT gd_done(state || jsonb_build_object('finished_by_version', ctx.version))
$$;

SELECT gd_define_fsm('v', initial => 'start', queue => 'versions', state_defaults => '{"v1_default": true}');
SELECT gd_define_step('v', 'start', 't.v1_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('v', 'finish', 't.report(jsonb, gd.context)'::regprocedure);

SELECT gd_insert('v') AS old_id \gset
SELECT gd._execute('versions', 10);   -- the old instance is now at 'finish' of version 1

-- Version 2: other defaults, another first step.
SELECT gd_define_fsm('v', initial => 'begin', queue => 'versions', version => 2, state_defaults => '{"v2_default": true}');
SELECT gd_define_step('v', 'begin', 't.v2_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('v', 'finish', 't.report(jsonb, gd.context)'::regprocedure);
SELECT gd_insert('v') AS new_id \gset
SELECT id = :old_id AS old, version, step FROM gd.instances WHERE fsm = 'v' ORDER BY id;

SELECT gd._execute('versions', 10);
SELECT gd._execute('versions', 10);
SELECT id = :old_id AS old, version, status, result FROM gd.instances WHERE fsm = 'v' ORDER BY id;

-- A version's steps are its own: the newest version has no 'start'.
SELECT t.try($$SELECT gd_insert('v', step => 'start')$$);

-- Version 3 defined without its steps yet: inserts keep taking version 2
-- until version 3's initial step exists.
SELECT gd_define_fsm('v', initial => 'begin', queue => 'versions', version => 3);
SELECT gd_insert('v') AS v3_pending_id \gset
SELECT version FROM gd.instances WHERE id = :v3_pending_id;
SELECT gd_define_step('v', 'begin', 't.v2_step(jsonb, gd.context)'::regprocedure, version => 3);
SELECT gd_insert('v') AS v3_id \gset
SELECT version FROM gd.instances WHERE id = :v3_id;

-- An FSM none of whose versions can start refuses inserts with 42704.
SELECT gd_define_fsm('v_unready', initial => 'start', queue => 'versions');
SELECT t.try($$SELECT gd_insert('v_unready')$$);

-- Defining a version again as it is changes nothing; otherwise, while it has
-- instances, it is refused (they would move to another queue, or restart
-- elsewhere): define a new version instead.
SELECT gd_define_fsm('v', initial => 'begin', queue => 'versions', version => 2, state_defaults => '{"v2_default": true}');
SELECT t.try($$SELECT gd_define_fsm('v', initial => 'begin', queue => 'elsewhere', version => 2, state_defaults => '{"v2_default": true}')$$);
SELECT t.try($$SELECT gd_define_fsm('v', initial => 'finish', queue => 'versions', version => 2, state_defaults => '{"v2_default": true}')$$);
SELECT t.try($$SELECT gd_define_fsm('v', initial => 'begin', queue => 'versions', version => 2)$$);
SELECT version, initial_step, queue, state_defaults FROM gd.fsms WHERE name = 'v' ORDER BY version;
-- A version without instances may still change.
SELECT gd_define_fsm('v_unready', initial => 'go', queue => 'versions_other');
SELECT initial_step, queue FROM gd.fsms WHERE name = 'v_unready';

-- One call: the version and its steps together.
SELECT gd_set_rate_limit('v_one_api', 10, '1 second');
SELECT gd_define_fsm('v_one', initial => 'start', queue => 'versions', steps => $${
    "start":  {"handler": "t.v1_step(jsonb, gd.context)", "max_attempts": 5, "backoff": "2s", "timeout": "1 minute"},
    "finish": {"handler": "t.report(jsonb, gd.context)", "rate_limit": "v_one_api"},
    "review": {}
}$$);
SELECT step, handler, max_attempts, backoff, max_backoff, timeout, rate_limit
  FROM gd.steps WHERE fsm = 'v_one' ORDER BY step;
SELECT gd_insert('v_one') AS one_id \gset
SELECT gd._execute('versions', 10);
SELECT gd._execute('versions', 10);
SELECT status, result FROM gd.instances WHERE id = :one_id;
-- Defining it again as it is, steps included, is a no-op.
SELECT gd_define_fsm('v_one', initial => 'start', queue => 'versions', steps => $${
    "start":  {"handler": "t.v1_step(jsonb, gd.context)", "max_attempts": 5, "backoff": "2s", "timeout": "1 minute"},
    "finish": {"handler": "t.report(jsonb, gd.context)", "rate_limit": "v_one_api"},
    "review": {}
}$$);

-- The next version from this one: only the step that changes is named; the
-- others are defined as they are in version 1.
SELECT gd_define_fsm('v_one', initial => 'start', queue => 'versions', version => 2, from_version => 1,
                     steps => '{"finish": {"handler": "t.v2_step(jsonb, gd.context)"}}') AS version;
SELECT version, step, handler, max_attempts, backoff, timeout, rate_limit
  FROM gd.steps WHERE fsm = 'v_one' ORDER BY version, step;
-- Again, as it is: a no-op.
SELECT gd_define_fsm('v_one', initial => 'start', queue => 'versions', version => 2, from_version => 1,
                     steps => '{"finish": {"handler": "t.v2_step(jsonb, gd.context)"}}') AS version;
SELECT t.try($$SELECT gd_define_fsm('v_one', 'start', 'versions', version => 3, from_version => 7)$$);
SELECT t.try($$SELECT gd_define_fsm('v_one', 'start', 'versions', version => 2, from_version => 2)$$);
