-- External workers: gd_claim, gd_heartbeat, gd_complete, gd_release and the
-- reaper's lease reclaim, called here as a worker would.  Queue 'claims' has no
-- background executors: its in-database steps run through gd._execute.
-- (NOTIFY gd_work is tested by test/specs/external_notify.spec.)
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
CREATE FUNCTION t.pack(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.ledger (instance_id, step, attempt) VALUES (ctx.id, ctx.step, ctx.attempt);
    RETURN gd_next('ship', state || '{"packed": true}');
END $$;
-- fetch (external) -> pack (in-database) -> ship (external)
SELECT gd_define_fsm('xw', initial => 'fetch', queue => 'claims');
SELECT gd_define_step('xw', 'fetch', max_attempts => 2, backoff => '10 minutes', max_backoff => '1 hour',
                      backoff_jitter => false);
SELECT gd_define_step('xw', 'pack', 't.pack(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('xw', 'ship');

-- The counters before: stale outcomes, reaped leases and released claims are counted.
CREATE TABLE t.stats_before AS SELECT event, count FROM gd.stats;

-- A label per instance, to read results without ids.
CREATE VIEW t.xw AS
SELECT i.state->>'n' AS n, i.status, i.step, i.external, i.attempt, i.lease_owner,
       i.lease_token IS NOT NULL AS has_token, i.state - 'n' AS state, i.result, i.error
  FROM gd.instances i WHERE i.fsm = 'xw';

-- Refusals.
SELECT t.try($$SELECT * FROM gd_claim('nowhere', 'w')$$);
SELECT t.try($$SELECT * FROM gd_claim(NULL, 'w')$$);
SELECT t.try($$SELECT * FROM gd_claim('claims', NULL)$$);
SELECT t.try($$SELECT * FROM gd_claim('claims', '')$$);
SELECT t.try($$SELECT * FROM gd_claim('claims', 'w', 0)$$);
SELECT t.try($$SELECT * FROM gd_claim('claims', 'w', 1001)$$);
SELECT t.try($$SELECT * FROM gd_claim('claims', 'w', NULL)$$);
SELECT t.try($$SELECT * FROM gd_claim('claims', 'w', 1, '0s')$$);
SELECT t.try($$SELECT * FROM gd_claim('claims', 'w', 1, '-1s')$$);
SELECT t.try($$SELECT gd_heartbeat(NULL, 1)$$);
SELECT t.try($$SELECT gd_heartbeat(1, NULL)$$);
SELECT t.try($$SELECT gd_heartbeat(1, 1, '0s')$$);
SELECT t.try($$SELECT gd_complete(NULL, 1, gd_done())$$);
SELECT t.try($$SELECT gd_complete(1, 1, NULL)$$);
SELECT t.try($$SELECT gd_release(1, NULL)$$);
-- Nothing to claim yet.
SELECT count(*) FROM gd_claim('claims', 'w1');

-- Best first: priority, then eligibility, then id.  Rows scheduled later,
-- and steps with a handler, are not claimed.
SELECT gd_insert('xw', '{"n": "a"}', priority => 5) > 0 AS inserted;
SELECT gd_insert('xw', '{"n": "b"}', priority => -1) > 0 AS inserted;
SELECT gd_insert('xw', '{"n": "c"}', priority => 5) > 0 AS inserted;
SELECT gd_insert('xw', '{"n": "later"}', priority => -9, schedule_in => '1 hour') > 0 AS inserted;
SELECT gd_insert('xw', '{"n": "in_db"}', step => 'pack', priority => 10) > 0 AS inserted;
SELECT state->>'n' AS n, step, (ctx).attempt, (ctx).step AS ctx_step, (ctx).queue AS ctx_queue, (ctx).signals,
       (ctx).children, (ctx).timed_out, (ctx).fsm AS ctx_fsm, (ctx).id = id AS ctx_id_matches,
       lease_token IS NOT NULL AS has_token
  FROM gd_claim('claims', 'w1', 2);
SELECT n, status, lease_owner, has_token FROM t.xw ORDER BY n;
-- The lease: gen_durable.lease by default (30s in this suite), or as asked.
SELECT lease_expires_at - updated_at AS lease FROM gd.instances WHERE state->>'n' = 'b';
SELECT state->>'n' AS n FROM gd_claim('claims', 'w2', 10, lease => '2 minutes');
SELECT lease_expires_at - updated_at AS lease FROM gd.instances WHERE state->>'n' = 'c';
-- Each claim has its own token.
SELECT count(DISTINCT lease_token) AS tokens FROM gd.instances WHERE fsm = 'xw' AND status = 'executing';
SELECT count(*) AS nothing_left FROM gd_claim('claims', 'w3', 10);

-- A paused queue yields nothing.
UPDATE gd._instances SET status = 'runnable', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
 WHERE state->>'n' = 'c';
SELECT gd_pause('claims');
SELECT count(*) AS while_paused FROM gd_claim('claims', 'w1');
SELECT gd_resume('claims');
SELECT state->>'n' AS n FROM gd_claim('claims', 'w1', lease => '1 hour');

SELECT id AS a_id, lease_token AS a_token FROM gd.instances WHERE state->>'n' = 'a' \gset
SELECT id AS b_id, lease_token AS b_token FROM gd.instances WHERE state->>'n' = 'b' \gset
SELECT id AS c_id, lease_token AS c_token FROM gd.instances WHERE state->>'n' = 'c' \gset

-- Heartbeats extend the lease from now: by the length it was given, or by `extend`.
UPDATE gd._instances SET lease_expires_at = now() + interval '10 seconds', updated_at = now() - interval '20 seconds'
 WHERE id = :b_id;
SELECT gd_heartbeat(:b_id, :b_token) AS kept;
SELECT lease_expires_at - updated_at AS extended_by, lease_expires_at > now() + interval '29 seconds' AS from_now
  FROM gd.instances WHERE id = :b_id;
SELECT gd_heartbeat(:b_id, :b_token, '5 minutes') AS kept;
SELECT lease_expires_at - updated_at AS extended_by FROM gd.instances WHERE id = :b_id;
SELECT gd_heartbeat(:b_id, :b_token + 1000) AS other_token, gd_heartbeat(-1, :b_token) AS no_such_row;

-- gd_complete applies the outcome as an in-database step's: gd_next to an
-- in-database step hands the instance to the executors (here gd._execute),
-- whose gd_next back to an external step makes it claimable again.
SELECT gd_complete(:b_id, :b_token, gd_next('pack', '{"n": "b", "fetched": 1}')) AS applied;
SELECT n, status, step, external, attempt, lease_owner, has_token, state FROM t.xw WHERE n = 'b';
SELECT gd._execute('claims', 10) AS ran;
SELECT n, status, step, external, state FROM t.xw WHERE n IN ('b', 'in_db') ORDER BY n;
SELECT step FROM t.ledger WHERE instance_id = :b_id;
SELECT gd_cancel(id, 'not needed') FROM gd.instances WHERE state->>'n' = 'in_db';
SELECT state->>'n' AS n, step, (ctx).step AS ctx_step, lease_token AS b_token2 FROM gd_claim('claims', 'w1', 1) \gset
SELECT :'n' AS n, :'step' AS step, :'ctx_step' AS ctx_step;
SELECT gd_complete(:b_id, :b_token2, gd_done('{"shipped": true}')) AS applied;
SELECT n, status, step, result, lease_owner, has_token FROM t.xw WHERE n = 'b';
SELECT finished_at IS NOT NULL AS finished FROM gd.instances WHERE id = :b_id;
-- The token is spent: a second completion is stale and dropped.
SELECT gd_complete(:b_id, :b_token2, gd_stop('{"late": true}')) AS applied;
SELECT n, status, result, error FROM t.xw WHERE n = 'b';
SELECT status FROM gd_await(:b_id, '1s');

-- A bad outcome raises 22023 and changes nothing: the claim is kept.
SELECT t.try(format('SELECT gd_complete(%s, %s, gd_next(%L))', :a_id, :a_token, 'nowhere'));
SELECT t.try(format('SELECT gd_complete(%s, %s, ROW(%L, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome)',
                    :a_id, :a_token, 'zzz'));
SELECT n, status, has_token FROM t.xw WHERE n = 'a';

-- gd_retry: the attempt is counted and the step stays external, after the
-- given backoff (or the step's); past max_attempts (2) the instance fails.
SELECT gd_complete(:a_id, :a_token, gd_retry('{"why": "busy"}'::jsonb)) AS applied;
SELECT n, status, step, external, attempt, error, has_token FROM t.xw WHERE n = 'a';
SELECT round(extract(epoch FROM eligible_at - now()) / 60) AS minutes_ahead FROM gd.instances WHERE id = :a_id;
UPDATE gd._instances SET eligible_at = now() - interval '1 second' WHERE id = :a_id;
SELECT (ctx).attempt, lease_token AS a_token FROM gd_claim('claims', 'w1') \gset
SELECT :attempt AS ctx_attempt;
SELECT gd_complete(:a_id, :a_token, gd_retry('{"why": "still busy"}'::jsonb, '0s')) AS applied;
SELECT n, status, step, attempt, error FROM t.xw WHERE n = 'a';

-- gd_stop fails at once; gd_wait_signal parks, and the signal's wake makes
-- the external step claimable again with ctx.signals.
SELECT gd_complete(:c_id, :c_token, gd_wait_signal('{go}', then_step => 'ship')) AS applied;
SELECT status, step, wait_names, wait_then_step, lease_token IS NULL AS lease_cleared FROM gd.instances WHERE id = :c_id;
SELECT gd_signal(:c_id, 'go', '{"gate": 7}');
SELECT n, status, step, external FROM t.xw WHERE n = 'c';
SELECT step, (ctx).signals->0->'payload' AS payload, (ctx).signals->0->>'name' AS name, lease_token AS c_token
  FROM gd_claim('claims', 'w1') \gset
SELECT :'step' AS step, :'payload' AS payload, :'name' AS name;
SELECT gd_complete(:c_id, :c_token, gd_stop('{"reason": "refused"}')) AS applied;
SELECT n, status, error, has_token FROM t.xw WHERE n = 'c';

-- gd_release hands a claim back unrun: runnable, same attempt, no lease.
SELECT gd_insert('xw', '{"n": "rel"}') AS rel_id \gset
SELECT lease_token AS rel_token FROM gd_claim('claims', 'w1') \gset
SELECT gd_release(:rel_id, :rel_token + 1) AS other_token;
SELECT gd_release(:rel_id, :rel_token) AS released;
SELECT n, status, attempt, lease_owner, has_token, error FROM t.xw WHERE n = 'rel';
SELECT gd_complete(:rel_id, :rel_token, gd_done()) AS after_release;

-- A cancelled instance's claim is stale.
SELECT lease_token AS rel_token FROM gd_claim('claims', 'w1') \gset
SELECT gd_cancel(:rel_id, 'not needed');
SELECT gd_complete(:rel_id, :rel_token, gd_done()) AS after_cancel, gd_heartbeat(:rel_id, :rel_token) AS heartbeat;
SELECT n, status FROM t.xw WHERE n = 'rel';

-- Expired leases are reclaimed (here in the same transaction as the expiry,
-- so the background reaper cannot get there first): the step runs again at
-- once with the attempt counted; past max_attempts the instance fails.
SELECT gd_insert('xw', '{"n": "lost1"}') AS lost1_id, gd_insert('xw', '{"n": "lost2"}') AS lost2_id \gset
SELECT gd_insert('xw', '{"n": "alive"}') AS alive_id \gset
SELECT count(*) FROM gd_claim('claims', 'dead-worker', 3, '1 hour');
UPDATE gd._instances SET attempt = 2 WHERE id = :lost2_id;
SELECT lease_token AS lost1_token FROM gd.instances WHERE id = :lost1_id \gset
BEGIN;
UPDATE gd._instances SET lease_expires_at = now() - interval '1 second', updated_at = now() - interval '1 hour 1 second'
 WHERE id IN (:lost1_id, :lost2_id, :alive_id);
-- An expired lease not yet reclaimed still owns the row: a heartbeat keeps it.
SELECT gd_heartbeat(:alive_id, lease_token) AS alive_kept FROM gd.instances WHERE id = :alive_id;
SELECT gd._reclaim_leases(100) AS reclaimed;
COMMIT;
SELECT n, status, step, external, attempt, lease_owner, has_token, error FROM t.xw
 WHERE n IN ('lost1', 'lost2', 'alive') ORDER BY n;
SELECT eligible_at <= clock_timestamp() AS at_once FROM gd.instances WHERE id = :lost1_id;
-- The dead worker's late completion is dropped.
SELECT gd_complete(:lost1_id, :lost1_token, gd_done('{"late": true}')) AS applied;
SELECT n, status, result FROM t.xw WHERE n = 'lost1';
SELECT status, error->>'message' AS message FROM gd_await(:lost2_id, '1s');

-- In an FSM version with a history, an attempt lost to an expired lease has
-- its row (kind lost, the lease's error, the worker that held it), and the
-- attempt that completes it its own.
SELECT gd_define_fsm('xw_history', initial => 'fetch', queue => 'claims', history => true,
                     steps => '{"fetch": {}}') AS version;
SELECT gd_insert('xw_history') AS hist_id \gset
SELECT count(*) FROM gd_claim('claims', 'vanished-worker', 1, '1 hour', fsms => ARRAY['xw_history']);
BEGIN;
UPDATE gd._instances SET lease_expires_at = now() - interval '1 second' WHERE id = :hist_id;
SELECT gd._reclaim_leases(100) AS reclaimed;
COMMIT;
SELECT id AS hist_claimed, lease_token AS hist_token FROM gd_claim('claims', 'second-worker', 1, '1 hour',
                                                                    fsms => ARRAY['xw_history']) \gset
SELECT gd_complete(:hist_claimed, :hist_token, gd_done()) AS completed;
SELECT attempt, step, kind, error->>'kind' AS error_kind, worker FROM gd_history(:hist_id);
DELETE FROM gd._instances WHERE fsm = 'xw_history';
DELETE FROM gd._fsms WHERE name = 'xw_history';

-- gd._expire_leases is the reaper's entry: it reclaims, and returns when it
-- next has work (the earliest lease to expire before its next round anyway,
-- reaper_interval from now, or external work coming due).
BEGIN;
SELECT gd._expire_leases() IS NOT DISTINCT FROM least(
         (SELECT min(lease_expires_at) FROM gd.instances WHERE status = 'executing'
             AND lease_expires_at < now() + current_setting('gen_durable.reaper_interval')::interval),
         (SELECT min(eligible_at) FROM gd.instances WHERE status = 'runnable' AND external AND eligible_at > now()))
       AS next_due;
COMMIT;

-- External work scheduled for later is announced when it comes due.  A look
-- that finds none returns where it ended (the reaper's next look starts
-- there) and leaves the table's mark; one that announces moves the mark and
-- returns NULL (the next look starts from the mark, which a rollback takes
-- back with the NOTIFY).
BEGIN;
SELECT (SELECT until FROM gd._external_due_announced) AS mark_before,
       gd._announce_due_external(now() - interval '1 minute') AS looked_until \gset
SELECT :'looked_until'::timestamptz = now() AS looked_until_now,
       (SELECT until FROM gd._external_due_announced) = :'mark_before' AS mark_kept;
SELECT gd_insert('xw', '{"n": "due"}', eligible_at => now() + interval '1 hour') AS due_id \gset
UPDATE gd._instances SET eligible_at = now() - interval '30 seconds', updated_at = now() - interval '1 hour'
 WHERE id = :due_id;
-- Due 30 s ago: a look from now passes it by (the second of overlap is all it looks back) ...
SELECT gd._announce_due_external(now()) IS NOT NULL AS passed_by;
-- ... a look from before it announces it.
SELECT gd._announce_due_external(now() - interval '1 minute') IS NULL AS announced;
SELECT until = now() AS mark_moved FROM gd._external_due_announced;
ROLLBACK;

-- gd_complete_all: a batch of completions in one statement, one row per
-- position in order.  A bad outcome anywhere completes none; a claim no
-- longer owned, or named a second time, is stale.
SELECT gd_insert('xw', '{"n": "all1"}', priority => -10) AS all1_id,
       gd_insert('xw', '{"n": "all2"}', priority => -10) AS all2_id,
       gd_insert('xw', '{"n": "all3"}', priority => -10) AS all3_id \gset
SELECT array_agg(id ORDER BY id) AS all_ids, array_agg(lease_token ORDER BY id) AS all_tokens
  FROM gd_claim('claims', 'batcher', 3) \gset
SELECT (:'all_ids'::bigint[]) = ARRAY[:all1_id, :all2_id, :all3_id]::bigint[] AS claimed_the_three;
SELECT t.try(format('SELECT * FROM gd_complete_all(%L, %L, ARRAY[gd_done(), gd_next(%L), gd_done()])',
                    :'all_ids', :'all_tokens', 'nowhere'));
SELECT n, status, has_token FROM t.xw WHERE n LIKE 'all_' ORDER BY n;
SELECT gd_complete((:'all_ids'::bigint[])[3], (:'all_tokens'::bigint[])[3], gd_done('{"alone": true}')) AS all3_alone;
SELECT r.position, r.id = (:'all_ids'::bigint[])[(r.position - 1) % 3 + 1] AS id_in_place, r.completed
  FROM gd_complete_all(ARRAY[:all1_id, :all2_id, :all3_id, :all1_id],
                       (:'all_tokens'::bigint[]) || (:'all_tokens'::bigint[])[1],
                       ARRAY[gd_done('{"k": 1}'), gd_next('pack', '{"n": "all2", "batched": true}'),
                             gd_done('{"late": true}'), gd_done('{"k": "again"}')])
       WITH ORDINALITY AS r(id, completed, position)
 ORDER BY r.position;
SELECT n, status, step, external, has_token, state, result FROM t.xw WHERE n LIKE 'all_' ORDER BY n;
SELECT count(*) AS rows_for_empty_arrays FROM gd_complete_all('{}', '{}', '{}');
SELECT t.try($$SELECT * FROM gd_complete_all(NULL, '{1}', ARRAY[gd_done()])$$);
SELECT t.try($$SELECT * FROM gd_complete_all('{1}', '{1,2}', ARRAY[gd_done()])$$);
SELECT t.try($$SELECT * FROM gd_complete_all('{1}', '{1}', '{}')$$);
SELECT t.try($$SELECT * FROM gd_complete_all('{NULL}', '{1}', ARRAY[gd_done()])$$);
SELECT t.try($$SELECT * FROM gd_complete_all('{1}', '{1}', ARRAY[NULL::gd.outcome])$$);
SELECT t.try($$SELECT * FROM gd_complete_all('{{1}}', '{{1}}', ARRAY[[gd_done()]])$$);

-- Counted: 6 stale outcomes dropped (b twice completed, rel after release
-- and after cancel, lost1 after reclaim, all3 and the second all1 in the
-- batch), 3 leases reaped (lost1, lost2, the history's), 1 claim released.
SELECT s.event, s.count - b.count AS counted FROM gd.stats s JOIN t.stats_before b USING (event)
 WHERE s.event IN ('outcome_stale', 'reaped', 'drained') ORDER BY 1;

-- Clean up the claims so later suites see no leases.
UPDATE gd._instances SET status = 'cancelled', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
 WHERE fsm = 'xw' AND status IN ('runnable', 'executing');

-- ctx.idempotency_key names one visit of a step: every attempt of it (a
-- retry, a reclaimed lease, a failed instance retried) sees the same key, the
-- next visit (a loop back to the same step) another.  In-database steps see
-- it too.
CREATE TABLE t.keys_seen (seen serial, step text, attempt int, key text);
CREATE FUNCTION t.note_key(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.keys_seen (step, attempt, key) VALUES (ctx.step, ctx.attempt, ctx.idempotency_key);
    IF ctx.attempt = 1 THEN
        RETURN gd_retry('{"why": "first attempt"}', '1 millisecond');
    END IF;
    RETURN gd_next('pay');
END $$;
SELECT gd_define_fsm('idem', initial => 'note', queue => 'claims');
SELECT gd_define_step('idem', 'note', 't.note_key(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('idem', 'pay', max_attempts => 5);
SELECT gd_insert('idem', '{}') AS idem_id \gset
-- Claim 'pay' as the worker named, record the key its ctx carries, complete
-- the claim with the outcome given.
CREATE FUNCTION t.pay_once(worker text, outcome gd.outcome) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    claimed record;
BEGIN
    SELECT * INTO claimed FROM gd_claim('claims', worker, 1, '1 hour', fsms => '{idem}');
    INSERT INTO t.keys_seen (step, attempt, key) VALUES ('pay', (claimed.ctx).attempt, (claimed.ctx).idempotency_key);
    IF outcome IS DISTINCT FROM NULL THEN   -- (IS NOT NULL: no field of it NULL)
        PERFORM gd_complete(claimed.id, claimed.lease_token, outcome);
    END IF;
    RETURN (claimed.ctx).attempt;
END $$;
SELECT gd._execute('claims', 10) AS ran;
SELECT pg_sleep(0.01);
SELECT gd._execute('claims', 10) AS ran;
-- pay, attempt 1: the worker gave up on a slow answer (a retry)
SELECT t.pay_once('w1', gd_retry('{"why": "timed out"}', '1 millisecond')) AS attempt;
SELECT pg_sleep(0.01);
-- pay, attempt 2: the worker dies; its lease is reclaimed
SELECT t.pay_once('w2', NULL) AS attempt;
BEGIN;
UPDATE gd._instances SET lease_expires_at = now() - interval '1 second' WHERE id = :idem_id;
SELECT gd._reclaim_leases(100) AS reclaimed;
COMMIT;
-- pay, attempt 3, another worker: loops back to pay, a new visit
SELECT t.pay_once('w3', gd_next('pay')) AS attempt;
-- pay, attempt 1 of the second visit: stops; then the failed instance is retried
SELECT t.pay_once('w3', gd_stop('{"why": "card declined"}')) AS attempt;
SELECT gd_retry(:idem_id) AS retried;
SELECT t.pay_once('w1', gd_done()) AS attempt;
SELECT status FROM gd.instances WHERE id = :idem_id;
-- The keys in the order they were first seen: one per visit, each a UUID.
SELECT k.step, k.attempt, f.key_number, k.key ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' AS uuid
  FROM t.keys_seen k
  JOIN (SELECT key, row_number() OVER (ORDER BY min(seen)) AS key_number FROM t.keys_seen GROUP BY key) f USING (key)
 ORDER BY k.seen;

-- A step's timeout holds for external steps: the lease never runs past the
-- claim + the timeout, whatever the heartbeats ask; at the deadline the
-- reaper ends the claim (error.kind 'timeout', the attempt counted, retried
-- after the step's backoff).  ctx.deadline tells the worker (and an
-- in-database handler) when that is.
SELECT gd_define_fsm('slow', initial => 'call', queue => 'claims');
SELECT gd_define_step('slow', 'call', timeout => '2 seconds', backoff => '1 minute');
SELECT gd_insert('slow', '{}') AS slow_id \gset
BEGIN;   -- (the reaper cannot end the claim before this transaction does)
SELECT id AS slow_claim, lease_token AS slow_token, (ctx).deadline AS slow_deadline
  FROM gd_claim('claims', 'w1', 1, '1 hour', fsms => '{slow}') \gset
SELECT :'slow_deadline'::timestamptz - claimed_at AS deadline_after, lease_expires_at - claimed_at AS lease
  FROM gd._instances WHERE id = :slow_id;
SELECT gd_heartbeat(:slow_id, :slow_token, '1 hour') AS kept,
       lease_expires_at = :'slow_deadline'::timestamptz AS capped_at_deadline
  FROM gd._instances WHERE id = :slow_id;
-- Past the deadline: a heartbeat no longer keeps the claim; the reaper ends it.
UPDATE gd._instances SET claimed_at = claimed_at - interval '3 seconds',
                         lease_expires_at = lease_expires_at - interval '3 seconds' WHERE id = :slow_id;
SELECT gd_heartbeat(:slow_id, :slow_token, '1 hour') AS kept;
SELECT gd._reclaim_leases(100) AS reclaimed;
COMMIT;
SELECT status, attempt, error->>'kind' AS kind, error->>'message' AS message, error->>'worker' AS worker,
       eligible_at > now() + interval '29 seconds' AS after_backoff   -- (1 minute, jittered)
  FROM gd.instances WHERE id = :slow_id;
SELECT gd_complete(:slow_id, :slow_token, gd_done()) AS late_completion;
-- Without a timeout there is no deadline; an in-database handler sees its own.
CREATE FUNCTION t.note_deadline(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    RETURN gd_done(jsonb_build_object('deadline_in', extract(epoch FROM ctx.deadline - clock_timestamp())));
END $$;
SELECT gd_define_fsm('timed_db', initial => 'note', queue => 'claims');
SELECT gd_define_step('timed_db', 'note', 't.note_deadline(jsonb, gd.context)'::regprocedure, timeout => '5 seconds');
SELECT gd_insert('timed_db', '{}') AS timed_db_id \gset
SELECT gd._execute('claims', 10) AS ran;
SELECT (result->>'deadline_in')::float BETWEEN 4 AND 5 AS deadline_five_seconds_on FROM gd.instances WHERE id = :timed_db_id;
SELECT gd_insert('idem', '{}', step => 'pay') AS no_timeout_id \gset
SELECT (ctx).deadline IS NULL AS no_deadline FROM gd_claim('claims', 'w1', 1, fsms => '{idem}') WHERE id = :no_timeout_id;
UPDATE gd._instances SET status = 'cancelled', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
 WHERE fsm IN ('idem', 'slow') AND status IN ('runnable', 'executing');

-- gd_claim(wait => ...): with nothing to claim it waits in the server up to
-- that long, then returns nothing (woken at the commit of new work: TAP
-- 020_external_worker, 049_poolers).  It refuses to wait where it could not
-- see new work, or would hold a writing transaction's locks.
SELECT count(*) AS claimed, clock_timestamp() - statement_timestamp() >= interval '50 milliseconds' AS waited
  FROM gd_claim('claims', 'w1', 1, wait => '50 milliseconds', fsms => '{idem}');
SELECT t.try($$SELECT * FROM gd_claim('claims', 'w1', 1, wait => '-1 second')$$);
SELECT t.try($$SELECT * FROM gd_claim('claims', 'w1', 1, wait => '2 hours')$$);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT t.try($$SELECT * FROM gd_claim('claims', 'w1', 1, wait => '1 second', fsms => '{idem}')$$);
ROLLBACK;
BEGIN;
CREATE TEMP TABLE written (n int);
SELECT t.try($$SELECT * FROM gd_claim('claims', 'w1', 1, wait => '1 second', fsms => '{idem}')$$);
ROLLBACK;

-- NOTIFY gd_work is sent only while some session listens on it.
SELECT count AS notified_before FROM gd.stats WHERE event = 'work_notified' \gset
SELECT gd_insert('idem', '{}', step => 'pay') > 0 AS inserted;
SELECT count - :notified_before AS notified_unheard FROM gd.stats WHERE event = 'work_notified';
LISTEN gd_work;
\o /dev/null
SELECT gd_insert('idem', '{}', step => 'pay') > 0 AS inserted;   -- (and the notification, which names a pid)
\o
SELECT count - :notified_before AS notified_while_listening FROM gd.stats WHERE event = 'work_notified';
UNLISTEN *;
SELECT gd_insert('idem', '{}', step => 'pay') > 0 AS inserted;
SELECT count - :notified_before AS notified_after_unlisten FROM gd.stats WHERE event = 'work_notified';
UPDATE gd._instances SET status = 'cancelled' WHERE fsm = 'idem' AND status = 'runnable';
