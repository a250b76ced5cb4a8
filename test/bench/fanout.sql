-- W4 fan-out/join: one parent spawns :children children (queue 'default'),
-- each an in-database step inserting a ledger row; the parent resumes when
-- all are done.  Prints the time from insert to the parent's completion.
-- Run: psql -v children=10000 -f test/bench/fanout.sql  (on a served database)
\set ON_ERROR_STOP 1
CREATE EXTENSION IF NOT EXISTS gen_durable;
DROP SCHEMA IF EXISTS bench_fan CASCADE;
CREATE SCHEMA bench_fan;
CREATE TABLE bench_fan.ledger (instance_id bigint PRIMARY KEY);
CREATE FUNCTION bench_fan.child(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_fan.ledger VALUES (ctx.id);
    RETURN gd_done();
END $$;
CREATE FUNCTION bench_fan.parent(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'split' THEN
        RETURN gd_spawn((SELECT jsonb_agg(jsonb_build_object('fsm', 'bench_child', 'state', jsonb_build_object('i', i)))
                           FROM generate_series(1, (state->>'children')::int) i), then_step => 'join');
    END IF;
    RETURN gd_done(jsonb_build_object('children', jsonb_array_length(ctx.children),
        'done', (SELECT count(*) FROM jsonb_array_elements(ctx.children) c WHERE c->>'status' = 'done')));
END $$;
SELECT gd_define_fsm('bench_child', initial => 'work', queue => 'default');
SELECT gd_define_step('bench_child', 'work', 'bench_fan.child(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('bench_parent', initial => 'split', queue => 'default');
SELECT gd_define_step('bench_parent', 'split', 'bench_fan.parent(jsonb, gd.context)'::regprocedure, timeout => '5min');
SELECT gd_define_step('bench_parent', 'join', 'bench_fan.parent(jsonb, gd.context)'::regprocedure, timeout => '5min');

SELECT clock_timestamp() AS started \gset
SELECT gd_insert('bench_parent', jsonb_build_object('children', :children)) AS parent \gset
SELECT status, result FROM gd_await(:parent, '10 minutes', until => 'terminal');
SELECT (SELECT count(*) FROM bench_fan.ledger) AS ledger_rows,
       round(extract(epoch FROM clock_timestamp() - :'started'::timestamptz)::numeric, 2) AS seconds,
       round(:children / extract(epoch FROM clock_timestamp() - :'started'::timestamptz)) AS children_per_second,
       round(extract(epoch FROM (SELECT max(updated_at) - min(created_at) FROM gd.instances WHERE parent_id = :parent))::numeric, 2)
           AS spawn_to_last_child_seconds;
