-- Child fan-out and join, cancel (cascading), retry, pause and resume.
-- Queue 'fanq' has no background executors (gd._execute steps it); the
-- background reaper, woken when a child ends, resumes parents.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.leaf(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF state ? 'fail' THEN
        RETURN gd_stop(jsonb_build_object('leaf', state->'n'));
    END IF;
    IF state ? 'wait' THEN
        RETURN gd_wait_signal('{go}');
    END IF;
    RETURN gd_done(jsonb_build_object('square', (state->>'n')::int * (state->>'n')::int));
END $$;
CREATE FUNCTION t.fan(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'split' THEN
        RETURN gd_spawn(state->'children', then_step => 'join', state => state - 'children');
    END IF;
    RETURN gd_done(jsonb_build_object(
        'children', (SELECT jsonb_agg(jsonb_build_object('status', c->'status', 'result', c->'result',
                                                         'error', c->'error', 'fsm', c->'fsm')
                                      ORDER BY (c->>'id')::bigint)
                       FROM jsonb_array_elements(ctx.children) c)));
END $$;
SELECT gd_define_fsm('leaf', initial => 'work', queue => 'fanq');
SELECT gd_define_step('leaf', 'work', 't.leaf(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('fan', initial => 'split', queue => 'fanq');
SELECT gd_define_step('fan', 'split', 't.fan(jsonb, gd.context)'::regprocedure, max_attempts => 1);
SELECT gd_define_step('fan', 'join', 't.fan(jsonb, gd.context)'::regprocedure);

-- Three children (one fails) and a grandchild fan: the parent resumes when all have ended.
SELECT gd_insert('fan', '{"children": [
    {"fsm": "leaf", "state": {"n": 2}},
    {"fsm": "leaf", "state": {"n": 3, "fail": true}},
    {"fsm": "fan", "state": {"children": [{"fsm": "leaf", "state": {"n": 4}}]}}
]}') AS parent_id \gset
SELECT gd._execute('fanq', 1);
SELECT status, step, wait_then_step FROM gd.instances WHERE id = :parent_id;
SELECT fsm, status FROM gd.instances WHERE parent_id = :parent_id ORDER BY id;
SELECT id AS inner_id FROM gd.instances WHERE parent_id = :parent_id AND fsm = 'fan' \gset
SELECT gd._execute('fanq', 10);   -- the leaves, and the inner fan parks on its own child
SELECT gd._execute('fanq', 10);   -- the grandchild
SELECT t.until_status(:inner_id, 'runnable');
SELECT gd._execute('fanq', 10);   -- the inner fan joins
SELECT t.until_status(:parent_id, 'runnable');
SELECT step FROM gd.instances WHERE id = :parent_id;
SELECT gd._execute('fanq', 10);
SELECT status, result FROM gd_await(:parent_id, '1s');

-- An empty fan-out resumes at once.
SELECT gd_insert('fan', '{"children": []}') AS empty_id \gset
SELECT gd._execute('fanq', 1);
SELECT status, step, resume FROM gd.instances WHERE id = :empty_id;
SELECT gd._execute('fanq', 1);

-- A child without an fsm is a bad outcome: the step fails and nothing is spawned.
SELECT gd_insert('fan', '{"children": [{"state": {}}]}') AS bad_id \gset
SELECT gd._execute('fanq', 1);
SELECT status, attempt, error->>'message' AS message FROM gd.instances WHERE id = :bad_id;
SELECT count(*) FROM gd.instances WHERE parent_id = :bad_id;

-- Cancel cascades to live children; a cancelled child counts as ended for its parent.
SELECT gd_insert('fan', '{"children": [{"fsm": "leaf", "state": {"wait": true}},
                                       {"fsm": "leaf", "state": {"n": 1}}]}') AS cancel_id \gset
SELECT gd._execute('fanq', 1);
SELECT gd._execute('fanq', 10);
SELECT status, count(*) FROM gd.instances WHERE parent_id = :cancel_id GROUP BY 1 ORDER BY 1;
SELECT gd_cancel(:cancel_id, 'customer changed their mind');
SELECT gd_cancel(:cancel_id, 'again') AS cancel_again;
SELECT status, error FROM gd.instances WHERE id = :cancel_id;
SELECT status, count(*) FROM gd.instances WHERE parent_id = :cancel_id GROUP BY 1 ORDER BY 1;
SELECT * FROM gd_await(:cancel_id, '1s');

SELECT gd_insert('fan', '{"children": [{"fsm": "leaf", "state": {"wait": true}}]}') AS waiting_parent \gset
SELECT gd._execute('fanq', 1);
SELECT gd._execute('fanq', 10);
SELECT id AS waiting_child FROM gd.instances WHERE parent_id = :waiting_parent \gset
SELECT gd_cancel(:waiting_child);
SELECT t.until_status(:waiting_parent, 'runnable');
SELECT status, step, resume->'children'->0->>'status' AS child_status FROM gd.instances WHERE id = :waiting_parent;
SELECT gd._execute('fanq', 10);

-- gd_retry: a failed instance runs again at its failed step with attempts reset.
SELECT gd_insert('leaf', '{"n": 5, "fail": true}') AS failing_id \gset
SELECT gd._execute('fanq', 10);
SELECT status, attempt FROM gd.instances WHERE id = :failing_id;
SELECT gd_retry(:failing_id);
SELECT status, step, attempt, error FROM gd.instances WHERE id = :failing_id;
SELECT gd_retry(:failing_id) AS retry_runnable;
SELECT gd_retry(-1) AS retry_missing;

-- Pause and resume a queue.
SELECT gd_insert('leaf', '{"n": 6}') AS paused_id \gset
SELECT gd_pause('fanq');
SELECT gd_pause('fanq') AS pause_again;
SELECT gd._execute('fanq', 10) AS ran_while_paused;
SELECT gd_resume('fanq');
SELECT gd._execute('fanq', 10) > 0 AS ran_after_resume;
SELECT t.try($$SELECT gd_pause('nowhere')$$);
SELECT t.try($$SELECT gd_spawn('{}', 'join')$$);
SELECT t.try($$SELECT gd_spawn('[]', NULL)$$);
