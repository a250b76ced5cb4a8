-- ---------------------------------------------------------------------------
-- Fair share: how a queue's picks are shared between owners and keys
-- ---------------------------------------------------------------------------
-- A pick (and a claim) shares its batch between the lanes of a priority
-- that have work due: between owners by their weights, and an owner's part
-- evenly between its fairness keys (gd_insert's fairness_key).  The lanes
-- are the pick and claim indexes' (priority, owner, fairness_lane), and the
-- sharing is the picker's (src/picker.cpp): one owner's flood leaves every
-- other owner's due work its part of the next batch.

-- An owner's weight in the share (1 when it has no row here).
CREATE TABLE IF NOT EXISTS gd._owner_weights (
    owner  regrole PRIMARY KEY,
    weight int NOT NULL CHECK (weight BETWEEN 1 AND 1000)
);

-- A fairness key's lane among its owner's instances: its hash (0: none).
CREATE OR REPLACE FUNCTION gd._fairness_lane(fairness_key text) RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT coalesce(pg_catalog.hashtext(fairness_key), 0) $$;

CREATE OR REPLACE FUNCTION @extschema@.gd_set_owner_weight(owner regrole, weight int) RETURNS void
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

CREATE OR REPLACE FUNCTION gd._set_owner_weight(owner regrole, weight int) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
    IF owner IS NULL OR owner = 0 THEN
        PERFORM gd._bad_argument('owner must be a role');
    END IF;
    IF weight IS NULL OR weight NOT BETWEEN 1 AND 1000 THEN
        PERFORM gd._bad_argument(format('weight of owner %s must be from 1 to 1000, got %s', owner,
                                        coalesce(weight::text, 'NULL')));
    END IF;
    IF weight = 1 THEN
        DELETE FROM gd._owner_weights w WHERE w.owner = owner;
    ELSE
        INSERT INTO gd._owner_weights AS w (owner, weight) VALUES (owner, weight)
        ON CONFLICT ON CONSTRAINT _owner_weights_pkey DO UPDATE SET weight = excluded.weight;
    END IF;
END $$;
