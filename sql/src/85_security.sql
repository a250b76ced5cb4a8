-- ---------------------------------------------------------------------------
-- Who may do what
-- ---------------------------------------------------------------------------
-- The API functions run with the caller's rights.  A role may insert, see,
-- signal, await, cancel, retry, claim and complete instances of the FSMs it
-- owns (it defined them, or is a member of the owner) or was granted with
-- gd_grant; row-level security on gd.instances and gd.signals enforces it in
-- every function and in direct queries.  Handlers run as the FSM's owner.
-- Superusers (the engine's workers among them) see everything.  Limits,
-- pausing queues and the stats reset are for roles an administrator grants
-- them to.

CREATE TABLE gd.grants (
    fsm  text NOT NULL,
    role regrole NOT NULL,
    PRIMARY KEY (fsm, role)
);

-- May the current role use instances of this FSM?
CREATE FUNCTION gd._may_use(fsm_name text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM gd.fsms f WHERE f.name = fsm_name AND pg_has_role(f.owner, 'MEMBER'))
        OR EXISTS (SELECT FROM gd.grants g WHERE g.fsm = fsm_name AND pg_has_role(g.role, 'MEMBER'))
$$;

-- Does the current role own (every version of) this FSM?  True for a new name.
CREATE FUNCTION gd._owns(fsm_name text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT FROM gd.fsms f WHERE f.name = fsm_name AND NOT pg_has_role(f.owner, 'MEMBER'))
$$;

CREATE FUNCTION gd._check_may_use(fsm_name text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT gd._may_use(fsm_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('gen_durable: permission denied for FSM %L', fsm_name),
            HINT = 'Its owner can allow you with gd_grant(fsm, role).';
    END IF;
END $$;

CREATE FUNCTION gd._check_owns(fsm_name text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT gd._owns(fsm_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('gen_durable: FSM %L belongs to another role', fsm_name);
    END IF;
END $$;

CREATE FUNCTION @extschema@.gd_grant(fsm text, role regrole) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    PERFORM gd._newest_fsm(fsm);
    PERFORM gd._check_owns(fsm);
    IF role IS NULL THEN
        PERFORM gd._bad_argument('gd_grant needs a role');
    END IF;
    INSERT INTO gd.grants AS g (fsm, role) VALUES (fsm, role) ON CONFLICT DO NOTHING;
END $$;

CREATE FUNCTION @extschema@.gd_revoke(fsm text, role regrole) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    PERFORM gd._newest_fsm(fsm);
    PERFORM gd._check_owns(fsm);
    DELETE FROM gd.grants g WHERE g.fsm = fsm AND g.role = role;
    RETURN FOUND;
END $$;

-- Row-level security.
ALTER TABLE gd.instances ENABLE ROW LEVEL SECURITY;
CREATE POLICY instances_of_usable_fsms ON gd.instances
    USING (gd._may_use(fsm)) WITH CHECK (gd._may_use(fsm));
ALTER TABLE gd.signals ENABLE ROW LEVEL SECURITY;
CREATE POLICY signals_of_visible_instances ON gd.signals   -- the subquery sees only usable instances
    USING (EXISTS (SELECT FROM gd.instances i WHERE i.id = instance_id))
    WITH CHECK (EXISTS (SELECT FROM gd.instances i WHERE i.id = instance_id));
ALTER TABLE gd.fsms ENABLE ROW LEVEL SECURITY;
CREATE POLICY fsms_readable ON gd.fsms FOR SELECT USING (true);
CREATE POLICY fsms_defined_by_owner ON gd.fsms FOR INSERT WITH CHECK (pg_has_role(owner, 'MEMBER'));
CREATE POLICY fsms_changed_by_owner ON gd.fsms FOR UPDATE
    USING (pg_has_role(owner, 'MEMBER')) WITH CHECK (pg_has_role(owner, 'MEMBER'));
ALTER TABLE gd.steps ENABLE ROW LEVEL SECURITY;
CREATE POLICY steps_readable ON gd.steps FOR SELECT USING (true);
CREATE POLICY steps_defined_by_owner ON gd.steps FOR INSERT WITH CHECK (gd._owns(fsm));
CREATE POLICY steps_changed_by_owner ON gd.steps FOR UPDATE USING (gd._owns(fsm)) WITH CHECK (gd._owns(fsm));
ALTER TABLE gd.grants ENABLE ROW LEVEL SECURITY;
CREATE POLICY grants_readable ON gd.grants FOR SELECT USING (true);
CREATE POLICY grants_given_by_owner ON gd.grants FOR INSERT WITH CHECK (gd._owns(fsm));
CREATE POLICY grants_taken_by_owner ON gd.grants FOR DELETE USING (gd._owns(fsm));

-- What every role may touch (row-level security narrows it).
GRANT USAGE ON SCHEMA gd TO PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON gd.instances, gd.signals TO PUBLIC;
GRANT SELECT, INSERT, UPDATE ON gd.fsms, gd.steps TO PUBLIC;
GRANT SELECT, INSERT, DELETE ON gd.grants TO PUBLIC;
GRANT SELECT, INSERT ON gd.queues TO PUBLIC;
GRANT SELECT, INSERT, UPDATE ON gd.rate_buckets TO PUBLIC;
GRANT SELECT ON gd.rate_limits, gd.concurrency_limits, gd.workers, gd.stats, gd.queue_stats TO PUBLIC;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA gd TO PUBLIC;
-- Counts per queue as the caller may see them.
ALTER VIEW gd.queue_stats SET (security_invoker = true);

-- Administration: not for every role.
REVOKE ALL ON FUNCTION @extschema@.gd_set_rate_limit(text, int, interval, int),
                       @extschema@.gd_drop_rate_limit(text),
                       @extschema@.gd_set_concurrency_limit(text, int),
                       @extschema@.gd_drop_concurrency_limit(text),
                       @extschema@.gd_pause(text), @extschema@.gd_resume(text),
                       gd._gc(interval, int), gd._reap(), gd._expire_waits(int), gd._repair_keys()
    FROM PUBLIC;
