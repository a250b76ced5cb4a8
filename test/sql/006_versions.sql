-- Versions: new instances take the newest version; running ones keep theirs.
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
