-- Who may do what: a role uses only the FSMs it owns or was granted, in every
-- API function and in the views; the tables are closed; administration is
-- for roles granted it; handlers never run as a superuser unless one defined
-- the FSM.  (test/t/040_tenants.pl tries the attacks of one tenant on another.)
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE ROLE regress_gd_owner;
CREATE ROLE regress_gd_other;
CREATE ROLE regress_gd_team;
GRANT regress_gd_team TO regress_gd_other;
GRANT USAGE ON SCHEMA t TO regress_gd_owner, regress_gd_other;
GRANT EXECUTE ON FUNCTION t.try(text) TO regress_gd_owner, regress_gd_other;

CREATE FUNCTION t.private_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'park' THEN
        RETURN gd_wait_signal(ARRAY['go'], then_step => 'finish');
    END IF;
    RETURN gd_done(jsonb_build_object('ran_as', current_user, 'superuser',
                                      (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)));
END $$;

SET ROLE regress_gd_owner;
SELECT gd_define_fsm('private', initial => 'park', queue => 'sec');
SELECT gd_define_step('private', 'park', 't.private_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('private', 'finish', 't.private_step(jsonb, gd.context)'::regprocedure);
SELECT gd_insert('private', correlation_key => 'private-1') AS private_id \gset
SELECT count(*) AS owner_sees FROM gd.instances;
RESET ROLE;
SELECT gd._execute('sec', 10);                       -- parks on 'go'

-- Another role sees nothing and can do nothing with it.
SET ROLE regress_gd_other;
SELECT count(*) AS other_sees_instances, (SELECT count(*) FROM gd.signals) AS other_sees_signals FROM gd.instances;
SELECT t.try($$SELECT gd_insert('private')$$);
SELECT status FROM gd_await(:private_id, '0s');
SELECT replace(t.try(format('SELECT gd_signal(%s, %L)', :private_id, 'go')), :'private_id', 'N') AS try;
SELECT t.try($$SELECT gd_signal('private-1', 'go')$$);
SELECT gd_cancel(:private_id) AS cancelled, gd_retry(:private_id) AS retried;
SELECT t.try($$SELECT gd_define_fsm('private', initial => 'park', version => 2)$$);
SELECT t.try($$SELECT gd_define_step('private', 'evil', 't.private_step(jsonb, gd.context)'::regprocedure)$$);
SELECT t.try($$SELECT gd_grant('private', 'regress_gd_other')$$);
SELECT t.try($$UPDATE gd.instances SET status = 'done'$$), t.try($$UPDATE gd._instances SET status = 'done'$$),
       (SELECT count(*) FROM gd.instances) AS still_none;
SELECT t.try($$INSERT INTO gd._instances (fsm, version, step, state, queue, external, correlation_scope)
               VALUES ('private', 1, 'park', '{}', 'sec', false, '{}')$$);
-- Administration is refused.
SELECT t.try($$SELECT gd_pause('sec')$$);
SELECT t.try($$SELECT gd_set_rate_limit('x', 1, '1s')$$);
SELECT t.try($$SELECT gd_set_concurrency_limit('x', 1)$$);
SELECT t.try($$SELECT gd._execute('sec', 1)$$);
SELECT t.try($$SELECT gd_stats_reset()$$);
RESET ROLE;

-- A grant to a role counts for its members; the grantee can then work with it.
SET ROLE regress_gd_owner;
SELECT gd_grant('private', 'regress_gd_team');
RESET ROLE;
SET ROLE regress_gd_other;
SELECT count(*) AS other_sees_now FROM gd.instances;
SELECT gd_signal(:private_id, 'go', '{"from": "other"}') AS signalled;
SELECT gd_insert('private') IS NOT NULL AS other_inserted;
SELECT count(*) AS other_sees_signals FROM gd.signals;
RESET ROLE;
SELECT gd._execute('sec', 10);
SELECT status, result FROM gd_await(:private_id, '1s');   -- the handler ran as the owner, not a superuser

SET ROLE regress_gd_owner;
SELECT gd_revoke('private', 'regress_gd_team') AS revoked, gd_revoke('private', 'regress_gd_team') AS again;
RESET ROLE;
SET ROLE regress_gd_other;
SELECT count(*) AS other_sees_after_revoke FROM gd.instances;
RESET ROLE;

-- A monitoring role (examples/prometheus: a member of pg_monitor, with
-- SELECT on the aggregate views) sees every queue's true totals, and still
-- no instance, nor may it act on one.
CREATE ROLE regress_gd_exporter IN ROLE pg_monitor;
GRANT USAGE ON SCHEMA gd TO regress_gd_exporter;
GRANT SELECT ON gd.queue_stats, gd.stats, gd.workers TO regress_gd_exporter;
SET ROLE regress_gd_owner;
SELECT gd_insert('private') AS monitored_id \gset
RESET ROLE;
SET ROLE regress_gd_exporter;
SELECT runnable + awaiting_signal + done > 0 AS totals FROM gd.queue_stats WHERE queue = 'sec';
SELECT count(*) AS instances_seen FROM gd.instances;
SELECT gd_cancel(:monitored_id) AS cancelled;
RESET ROLE;
SET ROLE regress_gd_other;
SELECT runnable + awaiting_signal + done AS totals_of_another FROM gd.queue_stats WHERE queue = 'sec';
RESET ROLE;
DROP ROLE regress_gd_exporter;

-- The engine's rights are reached through the API's doors only: no SECURITY DEFINER function in the extension.
SELECT count(*) AS security_definer_functions
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'gen_durable'
 WHERE p.prosecdef;

DELETE FROM gd._instances WHERE fsm = 'private';
DELETE FROM gd._grants WHERE fsm = 'private';
DELETE FROM gd._steps WHERE fsm = 'private';
DELETE FROM gd._fsms WHERE name = 'private';
REVOKE ALL ON SCHEMA t FROM regress_gd_owner, regress_gd_other;
REVOKE ALL ON FUNCTION t.try(text) FROM regress_gd_owner, regress_gd_other;
DROP ROLE regress_gd_other, regress_gd_team, regress_gd_owner;
