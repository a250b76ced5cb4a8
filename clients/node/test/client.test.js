'use strict';
// Client: each API call, its results and its errors.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const pg = require('pg');
const { Client, behindPooler } = require('..');
const { DSN, admin, scope } = require('./support');

const HANDLER = 'public.node_client_step(jsonb, gd.context)';

before(async () => {
  const db = await admin();
  await db.query(`
CREATE OR REPLACE FUNCTION public.node_client_step(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'start' AND state ? 'wait' THEN
        RETURN gd_wait_signal(ARRAY['go'], then_step => 'finish');
    ELSIF ctx.step = 'start' THEN
        RETURN gd_next('finish', state || '{"started": true}');
    ELSIF state ? 'fail' THEN
        RAISE EXCEPTION 'asked to fail';
    ELSIF state ? 'stop' THEN
        RETURN gd_stop('{"why": "asked to stop"}');
    END IF;
    RETURN gd_done(jsonb_build_object('state', state, 'signals', jsonb_array_length(coalesce(ctx.signals, '[]'))));
END $$`);
  await db.end();
});

async function setup(t) {
  const s = await scope();
  const fsm = s.name('order');
  await s.define(fsm, 'start', { start: HANDLER, finish: { handler: HANDLER, max_attempts: 1 } });
  const client = await Client.connect(DSN);
  t.after(async () => { await client.end(); await s.end(); });
  return { s, fsm, client };
}

test('insert, drain, wait and get', async (t) => {
  const { s, fsm, client } = await setup(t);
  const id = await client.insert(fsm, { sku: 'tea' }, { correlationKey: s.name('key'), priority: 3 });
  assert.equal(typeof id, 'number');
  assert.equal(await client.drain(s.queue), 2);
  const settled = await client.wait(id, { timeout: 5, until: 'terminal' });
  assert.deepEqual(settled, { status: 'done', step: 'finish', attempt: 1,
    result: { state: { sku: 'tea', started: true }, signals: 0 }, error: null });
  const row = await client.get(id);
  assert.deepEqual([row.id, row.fsm, row.status, row.queue, row.correlationKey],
    [id, fsm, 'done', s.queue, s.name('key')]);
  assert.equal(await client.get(-1), null);
});

test('insert options, duplicates and scheduling', async (t) => {
  const { s, fsm, client } = await setup(t);
  const key = s.name('dup');
  const first = await client.insert(fsm, {}, { correlationKey: key });
  assert.equal(await client.insert(fsm, {}, { correlationKey: key, onDuplicate: 'existing' }), first);
  assert.equal(await client.insert(fsm, {}, { correlationKey: key, onDuplicate: 'skip' }), null);
  await assert.rejects(client.insert(fsm, {}, { correlationKey: key }), { code: '23505' });
  const later = await client.insert(fsm, {}, { scheduleIn: 3600 });
  assert.equal(await client.drain(s.queue), 2);
  assert.equal((await s.status(later)).status, 'runnable');
  assert.equal(await client.drain(s.queue, { withScheduled: true }), 2);
  assert.equal((await s.status(later)).status, 'done');
  await assert.rejects(client.insert(fsm, {}, { colour: 'red' }), TypeError);
});

test('insert: debounce and throttle', async (t) => {
  const { s, fsm, client } = await setup(t);
  const key = s.name('debounced');
  const first = await client.insert(fsm, { n: 1 }, { correlationKey: key, debounce: 60 });
  assert.equal(await client.insert(fsm, { n: 2 }, { correlationKey: key, debounce: 120 }), first);
  const { rows: [row] } = await s.db.query(
    "SELECT state->>'n' AS n, extract(epoch FROM eligible_at - now())::int AS wait FROM gd.instances WHERE id = $1",
    [first]);
  assert.equal(row.n, '2');
  assert.ok(row.wait >= 110 && row.wait <= 120, `runs 120 s after the later insert, not ${row.wait}`);
  const throttled = s.name('throttled');
  assert.notEqual(await client.insert(fsm, {}, { correlationKey: throttled, throttle: 3600 }), null);
  assert.equal(await client.insert(fsm, {}, { correlationKey: throttled, throttle: 3600 }), null);
  assert.notEqual(await client.insert(fsm, {}, { correlationKey: throttled, throttle: 3600, onThrottle: 'queue' }),
    null);
  const bulk = s.name('bulk');
  const ids = await client.insertAll(fsm, [{ correlationKey: bulk, throttle: 3600 },
    { correlationKey: bulk, throttle: 3600 }, { correlationKey: bulk, throttle: 3600, onThrottle: 'queue' }]);
  assert.equal(ids.length, 2, 'the second dropped, the third queued');
  const fair = await client.insert(fsm, {}, { fairnessKey: 'tenant-7' });
  const [child] = await client.insertAll(fsm, [{ fairnessKey: 'tenant-8' }]);
  const { rows } = await s.db.query('SELECT fairness_key FROM gd.instances WHERE id = ANY ($1) ORDER BY id',
    [[fair, child]]);
  assert.deepEqual(rows.map((r) => r.fairness_key), ['tenant-7', 'tenant-8']);
});

test('insertAll', async (t) => {
  const { s, fsm, client } = await setup(t);
  const ids = await client.insertAll(fsm, [0, 1, 2, 3, 4].map((n) => ({ state: { n } })));
  assert.equal(ids.length, 5);
  assert.equal(await client.drain(s.queue), 10);
  // insert's options by their names here too
  const key = s.name('entry');
  const [keyed, later] = await client.insertAll(fsm, [{ state: { n: 5 }, correlationKey: key, priority: -1 },
    { state: { n: 6 }, scheduleIn: 3600 }]);
  const { rows } = await s.db.query('SELECT correlation_key, priority FROM gd.instances WHERE id = $1', [keyed]);
  assert.deepEqual(rows[0], { correlation_key: key, priority: -1 });
  assert.equal(await client.drain(s.queue), 2);
  assert.equal((await s.status(later)).status, 'runnable');
  await assert.rejects(client.insertAll(fsm, [{ onDuplicate: 'skip' }]), TypeError);
});

test('signal: dedup and missingOk', async (t) => {
  const { s, fsm, client } = await setup(t);
  const key = s.name('parked');
  const id = await client.insert(fsm, { wait: true }, { correlationKey: key });
  await client.drain(s.queue);
  assert.equal((await client.wait(id)).status, 'awaiting');
  assert.equal(await client.signal(key, 'go', { amount: 5 }, { dedupKey: 'evt-1' }), true);
  assert.equal(await client.signal(key, 'go', { amount: 5 }, { dedupKey: 'evt-1' }), false);
  assert.equal(await client.signal(id, 'note', {}, { expires: 60 }), true);
  const { rows } = await s.db.query(
    "SELECT extract(epoch FROM expires_at - delivered_at)::int AS s FROM gd.signals WHERE instance_id = $1 AND name = 'note'",
    [id]);
  assert.equal(rows[0].s, 60, 'expires: not consumed after 60 s');
  await client.drain(s.queue);
  assert.equal((await client.wait(id)).result.signals, 1);
  assert.equal(await client.signal(key, 'go', {}, { missingOk: true }), null);
  await assert.rejects(client.signal(key, 'go'), { code: 'P0002' });
});

test('cancel and retry', async (t) => {
  const { s, fsm, client } = await setup(t);
  const parked = await client.insert(fsm, { wait: true });
  await client.drain(s.queue);
  assert.equal(await client.cancel(parked, 'no longer wanted'), true);
  assert.equal(await client.cancel(parked), false);
  assert.equal((await client.get(parked)).error.kind, 'cancelled');
  const failing = await client.insert(fsm, { fail: true });
  await client.drain(s.queue);
  assert.equal((await s.status(failing)).status, 'failed');
  assert.equal(await client.retry(failing), true);
  assert.deepEqual(await s.status(failing), { status: 'runnable', step: 'finish', attempt: 1 });
});

test('rewind, fork and migrate: repairs by the owner of the FSM', async (t) => {
  const { s, client } = await setup(t);
  const fsm = s.name('mended');
  const steps = (last) => JSON.stringify({ start: { handler: HANDLER }, [last]: { handler: HANDLER, max_attempts: 1 } });
  await s.db.query('SELECT gd_define_fsm($1, $2, $3, history => true, steps => $4)', [fsm, 'start', s.queue, steps('finish')]);
  // A stopped instance, rewound to finish with its state corrected, runs from there to done.
  const stopped = await client.insert(fsm, { stop: true });
  await client.drain(s.queue);
  assert.equal((await s.status(stopped)).status, 'failed');
  assert.equal(await client.rewind(stopped, 'finish', { state: { fixed: true } }), true);
  assert.deepEqual(await s.status(stopped), { status: 'runnable', step: 'finish', attempt: 1 });
  await client.drain(s.queue);
  assert.deepEqual(await client.wait(stopped), { status: 'done', step: 'finish', attempt: 1,
    result: { state: { fixed: true }, signals: 0 }, error: null });
  assert.equal(await client.rewind(stopped, 'start'), false, 'done: fork it instead');
  const { rows: history } = await s.db.query('SELECT entry, step, kind, detail FROM gd_history($1)', [stopped]);
  assert.deepEqual(history.map((h) => [h.entry, h.step, h.kind]),
    [[1, 'start', 'next'], [2, 'finish', 'stop'], [3, 'finish', 'rewind'], [4, 'finish', 'done']]);
  const { rows: [{ me }] } = await s.db.query('SELECT current_user AS me');
  assert.deepEqual(history[2].detail, { by: me, from_step: 'finish', from_status: 'failed', from_attempt: 1 });

  // A fork from entry 2 (finish, with the state it started with), or with a state of our own.
  const forked = await client.fork(stopped, 2);
  assert.equal(typeof forked, 'number');
  assert.deepEqual((await client.get(forked)).state, { stop: true, started: true });
  const mended = await client.fork(stopped, 2, { state: { fixed: 'again' } });
  await client.drain(s.queue);
  assert.equal((await s.status(forked)).status, 'failed', 'stopped again, as the original was');
  assert.deepEqual((await client.wait(mended)).result, { state: { fixed: 'again' }, signals: 0 });
  await assert.rejects(client.fork(stopped, 99), { code: 'P0002' });

  // Version 2 renames finish to close: a parked instance migrates, and resumes at close.
  const parked = await client.insert(fsm, { wait: true });
  await client.drain(s.queue);
  await s.db.query('SELECT gd_define_fsm($1, $2, $3, history => true, version => 2, steps => $4)',
    [fsm, 'start', s.queue, steps('close')]);
  await assert.rejects(client.migrate(fsm, 1, 2), { code: '22023' }); // finish: not a step of version 2
  assert.equal(await client.migrate(fsm, 1, 2, { finish: 'close' }), 1);
  await client.signal(parked, 'go');
  await client.drain(s.queue);
  assert.deepEqual(await s.status(parked), { status: 'done', step: 'close', attempt: 1 });
  assert.equal((await client.get(parked)).version, 2);

  // A role granted the FSM may use its instances, not repair them: 42501, nothing changed.
  const mender = s.name('mender');
  await s.db.query(`CREATE ROLE ${mender}`);
  await s.db.query('SELECT gd_grant($1, $2)', [fsm, mender]);
  const granted = await Client.connect(DSN);
  try {
    await granted.client.query(`SET ROLE ${mender}`);
    await assert.rejects(granted.rewind(forked, 'start'),
      (e) => e.code === '42501' && /only the owner of FSM/.test(e.message));
    await assert.rejects(granted.fork(forked, 1), { code: '42501' });
    await assert.rejects(granted.migrate(fsm, 2, 1), { code: '42501' });
  } finally {
    await granted.end();
    await s.db.query('SELECT gd_revoke($1, $2)', [fsm, mender]);
    await s.db.query(`DROP ROLE ${mender}`);
  }
  assert.deepEqual(await s.status(forked), { status: 'failed', step: 'finish', attempt: 1 });
});

test('errors carry the SQLSTATE and a gen_durable: message', async (t) => {
  const { s, fsm, client } = await setup(t);
  await assert.rejects(client.insert(s.name('nope')), (e) => e.code === '42704' && e.message.startsWith('gen_durable:'));
  await assert.rejects(client.insert(fsm, [1, 2]), { code: '22023' });
  await assert.rejects(client.wait(1, { until: 'someday' }), { code: '22023' });
});

test('an insert inside your transaction commits with it, or not at all', async (t) => {
  const { fsm, client: own } = await setup(t);
  const mine = new pg.Client({ connectionString: DSN });
  await mine.connect();
  t.after(() => mine.end());
  const client = new Client(mine);
  await mine.query('BEGIN');
  const kept = await client.insert(fsm);
  await mine.query('COMMIT');
  await mine.query('BEGIN');
  const dropped = await client.insert(fsm);
  await mine.query('ROLLBACK');
  assert.notEqual(await own.get(kept), null);
  assert.equal(await own.get(dropped), null);
});

test("Client.pool: an HTTP server's calls at once, a wait holding one connection, not the others", async (t) => {
  const s = await scope();
  const client = Client.pool(DSN, { max: 3 });
  t.after(async () => { await client.end(); await s.end(); });
  const fsm = s.name('pooled');
  await s.define(fsm, 'work', { work: null }); // external: nothing runs it
  const id = await client.insert(fsm);
  let waited = false;
  const waiting = client.wait(id, { timeout: 2 }).then((settled) => { waited = true; return settled; });
  const ids = await Promise.all(Array.from({ length: 10 }, (_, n) => client.insert(fsm, { n })));
  assert.equal(waited, false, 'the inserts did not queue behind the wait');
  assert.equal(new Set(ids).size, 10);
  assert.equal((await waiting).status, 'busy'); // its timeout: nothing ran it
  assert.equal(client.client.totalCount <= 3, true);
});

test('behindPooler', () => {
  assert.equal(behindPooler(6432, '5432'), true);
  assert.equal(behindPooler(5432, '5432'), false);
  assert.equal(behindPooler(undefined, '5432'), false);
});

after(() => {});
