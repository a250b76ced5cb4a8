-- ---------------------------------------------------------------------------
-- Child fan-out: the children a gd_spawn outcome inserts
-- ---------------------------------------------------------------------------

-- A spawn: insert the children (each an insert option object with an fsm)
-- under the parent about to park, with the rights of `caller`, who produced
-- the outcome (the FSM's owner for an in-database step, the completing
-- worker's role for an external one); returns how many.  A child may not
-- wait under a key of the run scope its parent holds: the parent holds it
-- until it ends, after its children.
CREATE OR REPLACE FUNCTION gd._spawn_children(caller oid, parent_id bigint, children jsonb) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    held_key text;
BEGIN
    PERFORM gd._check_json(children, 'array', 'gd_spawn needs a JSON array of insert options');
    SELECT p.concurrency_key INTO held_key FROM gd._instances p
     WHERE p.id = _spawn_children.parent_id AND (gd._key_limit(p.concurrency_key)).scope = 'run'
       AND EXISTS (SELECT FROM jsonb_array_elements(children) c WHERE c->>'concurrency_key' = p.concurrency_key);
    IF held_key IS NOT NULL THEN
        PERFORM gd._bad_argument(format('a child cannot wait for concurrency key %L: its parent holds it for its whole'
                                        ' run, until after its children end', held_key));
    END IF;
    RETURN (SELECT count(*) FROM gd._insert_entries(caller, NULL, children, 'error', parent_id, 'child'));
END $$;
