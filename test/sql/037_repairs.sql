-- Repairing and changing in-flight work: gd_rewind moves a failed, stopped
-- or stuck instance back to a step; gd_fork starts a new instance from an
-- entry of an instance's step history; gd_migrate moves live instances to
-- another version of their FSM.  Each leaves a history row saying who did
-- it and where the instance was.  Queue 'mend' has no background
-- executors: gd_drain runs its steps.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.mend_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step, ctx.attempt);
    CASE ctx.step
        WHEN 'reserve' THEN
            RETURN gd_next('charge', state || '{"reserved": true}');
        WHEN 'charge' THEN
            IF (state->>'amount')::int > 100 THEN
                RETURN gd_stop(jsonb_build_object('why', 'card declined', 'amount', state->'amount'));
            END IF;
            RETURN gd_wait_signal(ARRAY['shipped'], then_step => 'close', state => state || '{"charged": true}');
        ELSE
            RETURN gd_done(jsonb_build_object('signals', ctx.signals, 'state', state));
    END CASE;
END $$;
SELECT gd_define_fsm('mend', initial => 'reserve', queue => 'mend', history => true,
                     steps => '{"reserve": {"handler": "t.mend_step(jsonb, gd.context)"},
                                "charge": {"handler": "t.mend_step(jsonb, gd.context)"},
                                "close": {"handler": "t.mend_step(jsonb, gd.context)"}}') AS version;

-- A stopped instance, rewound to charge with a corrected amount, runs from there.
SELECT gd_insert('mend', '{"amount": 500}') AS stopped \gset
SELECT gd_drain('mend') AS steps;
SELECT status, step, error->>'why' AS why FROM gd.instances WHERE id = :stopped;
SELECT gd_rewind(:stopped, 'charge', '{"amount": 50, "reserved": true}');
SELECT status, step, attempt, state, error, gated FROM gd.instances WHERE id = :stopped;
SELECT gd_drain('mend') AS steps;
SELECT status, step, state->>'charged' AS charged FROM gd.instances WHERE id = :stopped;
-- Its history: the steps, the rewind (who, from where, the state it set), the step after it.
SELECT entry, step, kind, worker = session_user AS by_me, state, detail
  FROM gd_history(:stopped) ORDER BY entry;

-- A stuck instance (parked on a signal that will not come) rewound to the
-- step that parked it, its state kept, its inbox as it was (a signal no
-- wait takes stays there).
SELECT gd_insert('mend', '{"amount": 10}') AS stuck \gset
SELECT gd_drain('mend') AS steps;
SELECT status, step FROM gd.instances WHERE id = :stuck;
SELECT gd_signal(:stuck, 'late', '{"n": 1}');
SELECT gd_rewind(:stuck, 'charge');
SELECT status, step, wait_names, state FROM gd.instances WHERE id = :stuck;
SELECT name FROM gd.signals WHERE instance_id = :stuck;
SELECT gd_drain('mend') AS steps;
SELECT gd_signal(:stuck, 'shipped', '{"carrier": "post"}');
SELECT gd_drain('mend') AS steps;
SELECT status, result->'signals'->0->>'name' AS resumed_by FROM gd.instances WHERE id = :stuck;
SELECT name FROM gd.signals WHERE instance_id = :stuck ORDER BY name;

-- A done or cancelled instance is not rewound (false, nothing changed); fork it.
SELECT gd_rewind(:stuck, 'reserve') AS rewound, status FROM gd.instances WHERE id = :stuck;

-- gd_fork: a new instance of the FSM from entry 2 of the stopped one (its
-- charge, with the state that step started with), or with a state given.
SELECT gd_fork(:stopped, 2) AS forked \gset
SELECT fsm, status, step, state, parent_id, correlation_key FROM gd.instances WHERE id = :forked;
SELECT entry, step, kind, state, (detail->>'forked_from')::bigint = :stopped AS from_stopped,
       detail - 'from_version' - 'forked_from' AS detail
  FROM gd_history(:forked);
SELECT gd_fork(:stopped, 2, '{"amount": 7}') AS forked_with_state \gset
SELECT step, state FROM gd.instances WHERE id = :forked_with_state;
SELECT gd_drain('mend') AS steps;
SELECT status, step FROM gd.instances WHERE id IN (:forked, :forked_with_state) ORDER BY id;

-- gd_migrate: version 2 renames close to finish; instances of version 1
-- parked before close move, their wait resuming at finish.
SELECT gd_insert('mend', '{"amount": 1}') AS parked_v1 \gset
SELECT gd_drain('mend') AS steps;
SELECT gd_define_fsm('mend', initial => 'reserve', queue => 'mend', history => true, version => 2,
                     steps => '{"reserve": {"handler": "t.mend_step(jsonb, gd.context)"},
                                "charge": {"handler": "t.mend_step(jsonb, gd.context)"},
                                "finish": {"handler": "t.mend_step(jsonb, gd.context)"}}') AS version;
SELECT version, status, step, wait_then_step FROM gd.instances WHERE id = :parked_v1;
-- Unmapped: 'close' is not a step of version 2 — refused, nothing moved.
SELECT t.try($$SELECT gd_migrate('mend', 1, 2)$$);
SELECT version, wait_then_step FROM gd.instances WHERE id = :parked_v1;
SELECT gd_migrate('mend', 1, 2, '{"close": "finish"}') AS migrated;
SELECT version, status, step, wait_then_step FROM gd.instances WHERE id = :parked_v1;
SELECT kind, step, detail - 'by' AS detail FROM gd_history(:parked_v1) WHERE kind = 'migrate';
SELECT gd_signal(:parked_v1, 'shipped');
SELECT gd_drain('mend') AS steps;
SELECT version, status, step FROM gd.instances WHERE id = :parked_v1;
SELECT gd_migrate('mend', 1, 2, '{"close": "finish"}') AS migrated_again;

-- Rights: a role granted the FSM may use its instances, not rewrite them (42501, nothing changed).
CREATE ROLE regress_gd_mender;
CREATE ROLE regress_gd_stranger;
GRANT USAGE ON SCHEMA t TO regress_gd_mender, regress_gd_stranger;
SELECT gd_grant('mend', 'regress_gd_mender');
SELECT gd_insert('mend', '{"amount": 900}') AS declined \gset
SELECT gd_drain('mend') AS steps;
SET ROLE regress_gd_mender;
SELECT replace(t.try(format('SELECT gd_rewind(%s, %L)', :declined, 'charge')), :'declined', 'N') AS try;
SELECT replace(t.try(format('SELECT gd_fork(%s, 1)', :declined)), :'declined', 'N') AS try;
SELECT t.try($$SELECT gd_migrate('mend', 1, 2)$$);
RESET ROLE;
SELECT status, step FROM gd.instances WHERE id = :declined;
-- A role that may not use the FSM sees no instance to rewind, and none to fork.
SET ROLE regress_gd_stranger;
SELECT gd_rewind(:declined, 'charge') AS rewound;
SELECT replace(t.try(format('SELECT gd_fork(%s, 1)', :declined)), :'declined', 'N') AS try;
RESET ROLE;
SELECT gd_revoke('mend', 'regress_gd_mender');
REVOKE ALL ON SCHEMA t FROM regress_gd_mender, regress_gd_stranger;
DROP ROLE regress_gd_mender, regress_gd_stranger;

-- Bad input: 22023, 42704 or P0002, nothing changed.
SELECT replace(t.try(format('SELECT gd_rewind(%s, NULL)', :declined)), :'declined', 'N') AS try;
SELECT replace(t.try(format('SELECT gd_rewind(%s, %L)', :declined, 'nowhere')), :'declined', 'N') AS try;
SELECT replace(t.try(format('SELECT gd_rewind(%s, %L, %L)', :declined, 'charge', '[1]')), :'declined', 'N') AS try;
SELECT replace(t.try(format('SELECT gd_fork(%s, 99)', :declined)), :'declined', 'N') AS try;
SELECT replace(t.try(format('SELECT gd_fork(%s, NULL)', :declined)), :'declined', 'N') AS try;
SELECT replace(t.try(format('SELECT gd_fork(%s, 1, %L)', :declined, '"x"')), :'declined', 'N') AS try;
SELECT t.try('SELECT gd_fork(-1, 1)');
SELECT t.try($$SELECT gd_migrate('mend', 1, 1)$$);
SELECT t.try($$SELECT gd_migrate('mend', 1, 3)$$);
SELECT t.try($$SELECT gd_migrate('nope', 1, 2)$$);
SELECT t.try($$SELECT gd_migrate('mend', 1, 2, '{"close": "nowhere"}')$$);
SELECT t.try($$SELECT gd_migrate('mend', 1, 2, '["close"]')$$);
SELECT status, step, version FROM gd.instances WHERE id = :declined;
SELECT gd_rewind(NULL, 'charge') AS rewound_nothing;
