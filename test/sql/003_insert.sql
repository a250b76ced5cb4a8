-- gd_insert and gd_insert_all: every option, and refusals that write nothing.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
-- What this file uses of 002_definitions: the handler t.noop, and the FSM 'defs'.
CREATE OR REPLACE FUNCTION t.noop(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE sql AS $$ SELECT gd_done() $$;
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM gd.fsms WHERE name = 'defs') THEN
        PERFORM gd_define_fsm('defs', initial => 'a', queue => 'manual', state_defaults => '{"n": 1}');
        PERFORM gd_define_step('defs', 'a', 't.noop(jsonb, gd.context)'::regprocedure);
    END IF;
END $$;
SELECT gd_define_fsm('order', initial => 'a', queue => 'manual', state_defaults => '{"currency": "EUR", "n": 0}');
SELECT gd_define_step('order', 'a', 't.noop(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('order', 'b', 't.noop(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('order', 'ext');

-- State is merged over the defaults (the insert wins); the initial step and queue come from the FSM.
SELECT gd_insert('order', '{"n": 5, "sku": "x"}') AS first_id \gset
SELECT fsm, version, step, state, status, queue, external, priority, attempt, correlation_key, correlation_scope
  FROM gd.instances WHERE id = :first_id;
SELECT eligible_at = created_at AS eligible_now FROM gd.instances WHERE id = :first_id;

-- Options: step (an external one), queue (listed in gen_durable.queues), priority.
SELECT gd_insert('order', step => 'ext', queue => 'mail', priority => -5) AS ext_id \gset
SELECT step, queue, external, priority, state FROM gd.instances WHERE id = :ext_id;
SELECT name FROM gd.queues ORDER BY name;

-- Scheduling: eligible_at, or schedule_in from now.
SELECT gd_insert('order', eligible_at => '2030-01-01 00:00+00') AS at_id \gset
SELECT eligible_at FROM gd.instances WHERE id = :at_id;
SELECT gd_insert('order', schedule_in => '1 hour') AS in_id \gset
SELECT eligible_at BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes' AS in_an_hour
  FROM gd.instances WHERE id = :in_id;

-- Correlation keys: unique among instances whose status is in their scope.
SELECT gd_insert('order', correlation_key => 'order-1') AS key_id \gset
SELECT t.try($$SELECT gd_insert('order', correlation_key => 'order-1')$$) ~ 'Instance \d+ holds it' AS error_names_occupant;
SELECT replace(t.try($$SELECT gd_insert('order', correlation_key => 'order-1')$$), 'Instance ' || :'key_id', 'Instance N');
SELECT gd_insert('order', correlation_key => 'order-1', on_duplicate => 'existing') = :key_id AS existing_returns_occupant;
SELECT gd_insert('order', correlation_key => 'order-1', on_duplicate => 'skip') IS NULL AS skip_returns_null;
SELECT count(*) FROM gd.instances WHERE correlation_key = 'order-1';
-- An empty scope disables uniqueness.
SELECT gd_insert('order', correlation_key => 'order-1', correlation_scope => '{}') IS NOT NULL AS unscoped_inserted;
SELECT count(*) FROM gd.instances WHERE correlation_key = 'order-1';
-- Once the occupant leaves the scope (done is not live), the key is free again...
UPDATE gd._instances SET status = 'done' WHERE id = :key_id;
SELECT gd_insert('order', correlation_key => 'order-1') > :key_id AS reused_after_done;
-- ...unless its scope keeps it reserved after completion.
SELECT gd_insert('order', correlation_key => 'order-2', correlation_scope => '{runnable,done}') AS kept_id \gset
UPDATE gd._instances SET status = 'done' WHERE id = :kept_id;
SELECT gd_insert('order', correlation_key => 'order-2', on_duplicate => 'existing') = :kept_id AS still_reserved;

-- Refusals: the right SQLSTATE, a gen_durable: message, and nothing written.
SELECT count(*) AS before FROM gd.instances \gset
SELECT t.try($$SELECT gd_insert('nope')$$);
SELECT t.try($$SELECT gd_insert(NULL)$$);
SELECT t.try($$SELECT gd_insert('order', '[1, 2]')$$);
SELECT t.try($$SELECT gd_insert('order', '"text"')$$);
SELECT t.try($$SELECT gd_insert('order', NULL)$$);
SELECT t.try($$SELECT gd_insert('order', step => 'zzz')$$);
SELECT t.try($$SELECT gd_insert('order', queue => 'nowhere')$$);
SELECT t.try($$SELECT gd_insert('order', priority => NULL)$$);
SELECT t.try($$SELECT gd_insert('order', weight => 0)$$);
SELECT t.try($$SELECT gd_insert('order', schedule_in => '-1 minute')$$);
SELECT t.try($$SELECT gd_insert('order', schedule_in => '1 minute', eligible_at => now())$$);
SELECT t.try($$SELECT gd_insert('order', correlation_key => 'k', correlation_scope => '{running}')$$);
SELECT t.try($$SELECT gd_insert('order', correlation_key => 'k', correlation_scope => '{NULL}')$$);
SELECT t.try($$SELECT gd_insert('order', correlation_key => 'k', on_duplicate => 'replace')$$);
SELECT t.try($$SELECT gd_insert('order', correlation_key => '')$$);
SELECT t.try($$SELECT gd_insert('order', rate_limit => 'api')$$);
SELECT count(*) - :before AS written_by_refusals FROM gd.instances;

-- gd_insert_all: one call, many instances; duplicates are dropped.
SELECT count(*) FROM gd_insert_all('order', '[
    {"state": {"n": 1}},
    {"state": {"n": 2}, "priority": 3, "correlation_key": "bulk-1"},
    {"state": {"n": 3}, "correlation_key": "bulk-1"},
    {"state": {"n": 4}, "step": "b", "schedule_in": "5 minutes"},
    {"fsm": "defs", "state": {"n": 5}}
]');
SELECT fsm, step, state->>'n' AS n, priority, correlation_key, eligible_at > now() AS scheduled
  FROM gd.instances WHERE state ? 'n' AND (state->>'n')::int BETWEEN 1 AND 5 AND id > :before ORDER BY id;
SELECT count(*) AS before FROM gd.instances \gset
SELECT t.try($$SELECT gd_insert_all('order', '{"state": {}}')$$);
SELECT t.try($$SELECT gd_insert_all('order', '[{"state": {}, "colour": "red"}]')$$);
SELECT t.try($$SELECT gd_insert_all('order', '[{"state": {}}, 7]')$$);
SELECT t.try($$SELECT gd_insert_all('order', '[{"priority": "high"}]')$$);
SELECT t.try($$SELECT gd_insert_all('order', '[{"priority": 1.5}]')$$);
SELECT t.try($$SELECT gd_insert_all('order', '[{"state": {}}, {"fsm": "nope"}]')$$);
SELECT count(*) - :before AS written_by_refusals FROM gd.instances;

-- Entries with nothing but a state (and one fsm for all) are inserted in one
-- statement: the same rows as one by one (defaults merged, the FSM's queue
-- and first step), ids in entry order; a state that is not an object, or a
-- second FSM, takes the one-by-one path and its refusals.
SELECT array_agg(new_id) AS plain_ids FROM gd_insert_all('order', '[
    {"state": {"n": 11}}, {"fsm": "order", "state": {"n": 12, "currency": "USD"}}, {}
]') AS new_id \gset
SELECT (:'plain_ids'::bigint[]) = (SELECT array_agg(id ORDER BY id) FROM unnest(:'plain_ids'::bigint[]) id) AS in_entry_order;
SELECT fsm, version, step, state, status, queue, external, priority, weight, gated, correlation_scope,
       eligible_at = created_at AS eligible_at_once
  FROM gd.instances WHERE id = ANY (:'plain_ids'::bigint[]) ORDER BY id;
SELECT count(*) AS before FROM gd.instances \gset
SELECT t.try($$SELECT gd_insert_all('order', '[{"state": {}}, {"state": [1]}]')$$);
SELECT t.try($$SELECT gd_insert_all('order', '[{"state": {}}, {"fsm": "nope", "state": {}}]')$$);
SELECT t.try($$SELECT gd_insert_all('nope', '[{"state": {}}]')$$);
SELECT count(*) - :before AS written_by_refusals FROM gd.instances;

-- Transactional: a rolled-back insert leaves nothing behind.
BEGIN;
SELECT gd_insert('order', '{"rolled": "back"}') IS NOT NULL AS inserted;
ROLLBACK;
SELECT count(*) FROM gd.instances WHERE state ? 'rolled';
