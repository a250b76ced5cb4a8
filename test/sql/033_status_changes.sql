-- The status table (src/instance_status.cpp): which writer may move an
-- instance from which status to which.  Every statement that writes a
-- status is made from it (test/t/060_instance_states.pl checks the
-- sources); here, what the table says, that a writer cannot write what it
-- does not allow, and that a step's transition does not write over an
-- instance its own handler ended.  A step that changes definitions while
-- the round goes on (the definitions cache empties itself) still moves on
-- by the definitions it read.  Queue 'stateq' has no background executor.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup

-- The table, writer by writer.
SELECT writer, coalesce(from_status, '(new)') AS from_status, to_status FROM gd.status_changes;
-- The diagram it draws: each status and the writers that leave it.
SELECT coalesce(from_status, '(new)') AS from_status,
       string_agg(DISTINCT to_status || ' by ' || writer, ', ') AS to_by
  FROM gd.status_changes GROUP BY 1 ORDER BY 1;
-- Every status is reached, and only terminal statuses are never left but by gd_retry or gd_rewind of a failed one.
SELECT s AS unreached FROM unnest(gd._live_statuses() || gd._terminal_statuses()) s
 WHERE s NOT IN (SELECT to_status FROM gd.status_changes);
SELECT DISTINCT from_status AS terminal_left FROM gd.status_changes
 WHERE from_status = ANY (gd._terminal_statuses());

-- What statements are made of: the statuses a writer moves instances out
-- of, and the status it writes, refused when the table does not allow it.
SELECT w AS writer, gd._statuses_before(w) AS before
  FROM unnest(ARRAY['insert', 'step', 'completion', 'claim', 'release', 'lease_expiry', 'crash', 'resume',
                    'revive', 'cancel', 'compensate', 'rewind']) w;
SELECT gd._status_after('claim', 'executing') AS claimed;
SELECT t.try($$SELECT gd._status_after('claim', 'done')$$);
SELECT t.try($$SELECT gd._status_after('revive', 'cancelled')$$);
SELECT t.try($$SELECT gd._status_after('nobody', 'runnable')$$);
SELECT t.try($$SELECT gd._status_after('cancel', 'paused')$$);

-- A handler that cancels its own instance, then returns: the cancel stands,
-- whatever the outcome (a wait is written alone, a next step with the
-- round's other plain transitions).
CREATE FUNCTION t.cancel_self(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd_cancel((ctx).id, 'from its own step');
    IF state->>'then' = 'wait' THEN
        RETURN gd_wait_signal(ARRAY['never'], then_step => 'after');
    END IF;
    RETURN gd_next('after');
END $$;
CREATE FUNCTION t.state_done(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
SELECT gd_define_fsm('self_cancel', 'first', queue => 'stateq');
SELECT gd_define_step('self_cancel', 'first', 't.cancel_self(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('self_cancel', 'after', 't.state_done(jsonb, gd.context)'::regprocedure);
SELECT gd_insert('self_cancel', '{"then": "wait"}') AS waits \gset
SELECT gd_insert('self_cancel', '{"then": "next"}') AS goes_on \gset
SELECT gd._execute('stateq', 10) AS ran;
SELECT state->>'then' AS then, status, step, attempt, coalesce(error->>'reason', error->>'message') AS reason, wait_names
  FROM gd.instances WHERE id IN (:waits, :goes_on) ORDER BY id;
SELECT gd._execute('stateq', 10) AS ran_after;

-- A step that defines an FSM (new definitions: the cache empties itself
-- mid-round) and then goes on to a step of its own with a queue of its own.
CREATE FUNCTION t.redefine(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd_define_fsm('defined_mid_round', 'only', queue => 'stateq');
    PERFORM gd_define_step('defined_mid_round', 'only', 't.state_done(jsonb, gd.context)'::regprocedure);
    RETURN gd_next('elsewhere');
END $$;
SELECT gd_define_fsm('redefiner', 'first', queue => 'stateq');
SELECT gd_define_step('redefiner', 'first', 't.redefine(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('redefiner', 'elsewhere', 't.state_done(jsonb, gd.context)'::regprocedure, queue => 'stateq2');
SELECT gd_insert('redefiner') AS redefiner \gset
SELECT gd._execute('stateq', 10) AS ran;
SELECT status, step, queue FROM gd.instances WHERE id = :redefiner;
SELECT gd._execute('stateq2', 10) AS ran_elsewhere;
SELECT status, step FROM gd.instances WHERE id = :redefiner;
SELECT count(*) AS defined FROM gd.fsms WHERE name = 'defined_mid_round';

DELETE FROM gd._instances WHERE fsm IN ('self_cancel', 'redefiner');
DELETE FROM gd._fsms WHERE name IN ('self_cancel', 'redefiner', 'defined_mid_round');
DROP FUNCTION t.cancel_self(jsonb, gd.context), t.redefine(jsonb, gd.context), t.state_done(jsonb, gd.context);
