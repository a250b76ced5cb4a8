-- ---------------------------------------------------------------------------
-- Child fan-out: the children a gd_spawn outcome inserts
-- ---------------------------------------------------------------------------

-- A spawn: insert the children (each an insert option object with an fsm)
-- under the parent about to park, with the rights of `caller`, who produced
-- the outcome (the FSM's owner for an in-database step, the completing
-- worker's role for an external one); returns how many.
CREATE OR REPLACE FUNCTION gd._spawn_children(caller oid, parent_id bigint, children jsonb) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    child jsonb;
    spawned int := 0;
    plain_fsm text;
BEGIN
    IF children IS NULL OR jsonb_typeof(children) <> 'array' THEN
        PERFORM gd._bad_argument(format('gd_spawn needs a JSON array of insert options, got %s',
                                        coalesce(children::text, 'NULL')));
    END IF;
    plain_fsm := gd._plain_entries_fsm(children, NULL);
    IF plain_fsm IS NOT NULL THEN
        SELECT count(*) INTO spawned FROM gd._insert_plain(caller, plain_fsm, children, parent_id);
        RETURN spawned;
    END IF;
    FOR child IN SELECT c FROM jsonb_array_elements(children) c LOOP
        IF jsonb_typeof(child) = 'object' AND NOT child ? 'fsm' THEN
            PERFORM gd._bad_argument(format('each child needs an fsm, got %s', child));
        END IF;
        PERFORM gd._insert_entry(caller, NULL, child, 'error', parent_id);
        spawned := spawned + 1;
    END LOOP;
    RETURN spawned;
END $$;
