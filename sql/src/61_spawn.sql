-- ---------------------------------------------------------------------------
-- Child fan-out: the children a gd_spawn outcome inserts
-- ---------------------------------------------------------------------------

-- A spawn: insert the children (each an insert option object with an fsm)
-- under the parent about to park, with the rights of `caller`, who produced
-- the outcome (the FSM's owner for an in-database step, the completing
-- worker's role for an external one); returns how many.
CREATE OR REPLACE FUNCTION gd._spawn_children(caller oid, parent_id bigint, children jsonb) RETURNS int
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd._check_json(children, 'array', 'gd_spawn needs a JSON array of insert options');
    RETURN (SELECT count(*) FROM gd._insert_entries(caller, NULL, children, 'error', parent_id, 'child'));
END $$;
