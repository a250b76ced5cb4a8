-- Handlers run with the privileges of the role that defined the FSM, never as
-- the superuser the executors connect as.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE ROLE regress_gd_alice LOGIN;
GRANT USAGE ON SCHEMA t TO regress_gd_alice;
GRANT INSERT ON t.ledger TO regress_gd_alice;
CREATE TABLE t.secret (s text);
INSERT INTO t.secret VALUES ('superuser eyes only');

CREATE FUNCTION t.whoami(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt, run_as) VALUES (ctx.id, ctx.step, ctx.attempt, current_user);
    IF state ? 'peek' THEN
        PERFORM * FROM t.secret;
    END IF;
    RETURN gd_done(jsonb_build_object('user', current_user));
END $$;

SET ROLE regress_gd_alice;
SELECT gd_define_fsm('alices', initial => 'who', queue => 'default');
SELECT gd_define_step('alices', 'who', 't.whoami(jsonb, gd.context)'::regprocedure, max_attempts => 1);
SELECT gd_insert('alices') AS plain_id \gset
SELECT gd_insert('alices', '{"peek": true}') AS peek_id \gset
RESET ROLE;

SELECT owner FROM gd.fsms WHERE name = 'alices';
SELECT status, result FROM gd_await(:plain_id, '30s');
-- Reading the superuser's table is refused: the handler is not a superuser.
SELECT status, error->>'sqlstate' AS sqlstate, error->>'message' AS message FROM gd_await(:peek_id, '30s');
SELECT run_as FROM t.ledger WHERE instance_id IN (:plain_id, :peek_id);

DELETE FROM gd._instances WHERE fsm = 'alices';
DELETE FROM gd._fsms WHERE name = 'alices';
REVOKE ALL ON SCHEMA t FROM regress_gd_alice;
REVOKE ALL ON t.ledger FROM regress_gd_alice;
DROP ROLE regress_gd_alice;
