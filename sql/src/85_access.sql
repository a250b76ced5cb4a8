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

-- Let a role, and its members, use the FSM's instances.  What finds
-- instances without naming their FSM (a signal by correlation key, a claim
-- without fsms) takes the grant into account once the grantee accepts it
-- (gd_accept_grant); a grant to one of the granting role's own roles
-- (gd._own_roles) is accepted by that act.
CREATE OR REPLACE FUNCTION @extschema@.gd_grant(fsm text, role regrole) RETURNS void
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._grant(fsm text, role regrole) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    own oid[] := gd._own_roles(gd._caller());
BEGIN
    PERFORM gd._check_grantor(fsm);
    IF role IS NULL THEN
        PERFORM gd._bad_argument('gd_grant needs a role');
    END IF;
    INSERT INTO gd._grants AS g (fsm, role, accepted) VALUES (fsm, role, own IS NULL OR role = ANY (own))
    ON CONFLICT ON CONSTRAINT _grants_pkey DO UPDATE SET accepted = true WHERE excluded.accepted;
END $$;

-- The FSM's owner takes a grant back; its grantee (a member of the role
-- granted) may drop it too.
CREATE OR REPLACE FUNCTION @extschema@.gd_revoke(fsm text, role regrole) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._revoke(fsm text, role regrole) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    gone int;
BEGIN
    IF role IS NULL OR NOT gd._is_own_role(gd._caller(), role) THEN
        PERFORM gd._check_grantor(fsm);
    END IF;
    DELETE FROM gd._grants g WHERE g.fsm = fsm AND g.role = role;
    GET DIAGNOSTICS gone = ROW_COUNT;
    RETURN gone > 0;
END $$;

-- Accept the grant of the FSM to `role` (default: the caller), one of the
-- caller's own roles (gd._own_roles): from then on a signal by correlation
-- key and a claim without fsms find the FSM's instances too.  False when
-- there is no such grant.
CREATE OR REPLACE FUNCTION @extschema@.gd_accept_grant(fsm text, role regrole DEFAULT NULL) RETURNS boolean
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';
CREATE OR REPLACE FUNCTION gd._accept_grant(fsm text, role regrole) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    grantee oid := coalesce(role::oid, gd._caller());
BEGIN
    IF NOT gd._is_own_role(gd._caller(), grantee) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('gen_durable: only %s and its members accept grants to it', grantee::regrole);
    END IF;
    UPDATE gd._grants g SET accepted = true WHERE g.fsm = fsm AND g.role = grantee;
    RETURN FOUND;
END $$;

-- Is `role` one of the caller's own roles (gd._own_roles)?
CREATE OR REPLACE FUNCTION gd._is_own_role(caller oid, role oid) RETURNS boolean
LANGUAGE sql STABLE AS $$ SELECT coalesce(role = ANY (gd._own_roles(caller)), true) $$;
