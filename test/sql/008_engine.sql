-- The background executors run 1,000 instances of a 3-step FSM to completion:
-- each step's side effect is written exactly once.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE TABLE t.effects (instance_id bigint, step text, PRIMARY KEY (instance_id, step));
CREATE FUNCTION t.three_steps(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.effects VALUES (ctx.id, ctx.step);
    RETURN CASE ctx.step
        WHEN 'reserve' THEN gd_next('charge', state || '{"reserved": true}')
        WHEN 'charge' THEN gd_next('ship', state || '{"charged": true}')
        ELSE gd_done(state || '{"shipped": true}')
    END;
END $$;
SELECT gd_define_fsm('checkout', initial => 'reserve', queue => 'default');
SELECT gd_define_step('checkout', 'reserve', 't.three_steps(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('checkout', 'charge', 't.three_steps(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('checkout', 'ship', 't.three_steps(jsonb, gd.context)'::regprocedure);

CREATE TABLE t.batch AS
SELECT gd_insert('checkout', jsonb_build_object('order', g), priority => g % 3) AS id
  FROM generate_series(1, 1000) g;

-- Wait for each instance (the engine wakes each await at its commit).
DO $$
DECLARE
    unfinished int := 0;
    settled text;
    instance record;
BEGIN
    FOR instance IN SELECT id FROM t.batch LOOP
        SELECT status INTO settled FROM gd_await(instance.id, '60s');
        IF settled <> 'done' THEN
            unfinished := unfinished + 1;
        END IF;
    END LOOP;
    RAISE NOTICE 'unfinished instances: %', unfinished;
END $$;

SELECT i.status, count(*) FROM t.batch b JOIN gd.instances i USING (id) GROUP BY 1;
SELECT count(*) AS effects, count(DISTINCT (instance_id, step)) AS distinct_effects
  FROM t.effects e JOIN t.batch b ON b.id = e.instance_id;
SELECT count(*) AS complete_results FROM gd.instances i JOIN t.batch b USING (id)
 WHERE i.result @> '{"reserved": true, "charged": true, "shipped": true}';
