-- ---------------------------------------------------------------------------
-- Granting the use of an FSM (the model: "Who may do what" in 20_internals.sql)
-- ---------------------------------------------------------------------------

-- The caller may grant and revoke this FSM: it exists, and the caller is a member of its owner.
CREATE OR REPLACE FUNCTION gd._check_grantor(fsm text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM gd._newest_fsm(fsm);
    PERFORM gd._check_owns(gd._caller(), fsm);
END $$;

-- Let a role, and its members, use the FSM's instances.
CREATE OR REPLACE FUNCTION @extschema@.gd_grant(fsm text, role regrole) RETURNS void
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._grant(fsm text, role regrole) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    PERFORM gd._check_grantor(fsm);
    IF role IS NULL THEN
        PERFORM gd._bad_argument('gd_grant needs a role');
    END IF;
    INSERT INTO gd._grants AS g (fsm, role) VALUES (fsm, role) ON CONFLICT DO NOTHING;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.gd_revoke(fsm text, role regrole) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._revoke(fsm text, role regrole) RETURNS boolean
LANGUAGE sql AS $$
    SELECT gd._check_grantor(fsm);
    WITH gone AS (DELETE FROM gd._grants g WHERE g.fsm = _revoke.fsm AND g.role = _revoke.role RETURNING 1)
    SELECT count(*) > 0 FROM gone;
$$;
