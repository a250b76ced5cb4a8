'use strict';
// Worker: external steps on several queues, the step's transaction, failed
// attempts, lost leases, unhandled steps, draining, reconnecting.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { Client, Worker, nextStep, done, waitSignal, spawn, retry, stop } = require('..');
const { DSN, scope, running, captureLog } = require('./support');

async function setup(t) {
  const s = await scope();
  const otherQueue = `${s.queue}_b`;
  const fsm = s.name('ship');
  // pack (external, the FSM's queue) -> label (external, a queue of its own) -> end
  await s.define(fsm, 'pack', { pack: null, label: { queue: otherQueue, max_attempts: 2 }, end: null });
  await s.db.query(`CREATE TABLE effects_${s.tag} (instance bigint, step text, attempt int)`);
  const client = await Client.connect(DSN);
  t.after(async () => {
    await s.db.query(`DROP TABLE effects_${s.tag}`);
    await client.end();
    await s.end();
  });
  const record = (ctx) => ctx.connection.query(`INSERT INTO effects_${s.tag} VALUES ($1, $2, $3)`,
    [ctx.id, ctx.step, ctx.attempt]);
  const handlers = (overrides = {}) => ({
    [`${fsm}/pack`]: async (state, ctx) => { await record(ctx); return nextStep('label', { ...state, packed: true }); },
    [`${fsm}/label`]: async (state, ctx) => { await record(ctx); return nextStep('end'); },
    [`${fsm}/end`]: async (state, ctx) => { await record(ctx); return done({ n: state.n, packed: state.packed }); },
    ...overrides,
  });
  const worker = (h, options = {}) => new Worker(DSN, {
    handlers: h, queues: [s.queue, otherQueue], wait: 0.5, lease: 5, name: s.name('w'), log: captureLog(), ...options,
  });
  const effects = async () => (await s.db.query(
    `SELECT instance::int, step, attempt FROM effects_${s.tag} ORDER BY 1, 2, 3`)).rows;
  return { s, fsm, otherQueue, client, handlers, worker, record, effects };
}

test('several queues, concurrency, and writes that commit exactly once with their outcomes', async (t) => {
  const { s, fsm, client, handlers, worker, effects } = await setup(t);
  const ids = await client.insertAll(fsm, Array.from({ length: 30 }, (_, n) => ({ state: { n } })));
  await running(worker(handlers(), { concurrency: 3, batch: 4 }), () => s.allIn(ids));
  const { rows } = await s.db.query("SELECT result->>'n' AS n FROM gd.instances WHERE id = ANY($1)", [ids]);
  assert.deepEqual(rows.map((r) => Number(r.n)).sort((a, b) => a - b), [...Array(30).keys()]);
  const all = await effects();
  assert.equal(all.length, 90);
  assert.equal(new Set(all.map((e) => JSON.stringify(e))).size, 90);
});

test('a compensation is told why it runs', async (t) => {
  const { s, client, worker } = await setup(t);
  const fsm = s.name('refunded');
  await s.db.query("SELECT gd_define_fsm($1, 'pack', $2, on_cancel => 'refund', steps => $3)",
    [fsm, s.queue, JSON.stringify({ pack: {}, refund: {} })]);
  const told = [];
  const id = await client.insert(fsm, { n: 7 });
  await running(worker({
    [`${fsm}/pack`]: async (state, ctx) => { told.push(ctx.cancelled); return waitSignal(['paid']); },
    [`${fsm}/refund`]: async (state, ctx) => { told.push(ctx.cancelled); return done({ refunded: state.n }); },
  }), async () => {
    await s.until(async () => (await s.status(id)).status === 'awaiting_signal', 'the wait');
    assert.equal(await client.cancel(id, 'out of stock'), true);
    await s.allIn([id], 'cancelled');
  });
  assert.equal(told[0], null);
  const { reason, step, attempt, status } = told[1];
  assert.deepEqual({ reason, step, attempt, status },
    { reason: 'out of stock', step: 'pack', attempt: 1, status: 'awaiting_signal' });
  assert.deepEqual((await client.get(id)).result, { refunded: 7 });
});

test('a raising handler is a failed attempt and its writes are undone', async (t) => {
  const { s, fsm, client, handlers, worker, record, effects } = await setup(t);
  const calls = [];
  const id = await client.insert(fsm, { n: 1 });
  await running(worker(handlers({
    [`${fsm}/label`]: async (state, ctx) => {
      await record(ctx);
      calls.push(ctx.attempt);
      if (ctx.attempt === 1) throw new Error('the label printer jammed');
      return nextStep('end');
    },
  })), () => s.allIn([id]));
  assert.deepEqual(calls, [1, 2]);
  assert.deepEqual((await effects()).map((e) => [e.step, e.attempt]), [['end', 1], ['label', 2], ['pack', 1]]);
});

test('bad outcomes fail their attempt alone', async (t) => {
  const { s, fsm, client, handlers, worker } = await setup(t);
  const ids = await client.insertAll(fsm, [0, 1, 2, 3].map((n) => ({ state: { n } })));
  await running(worker(handlers({
    [`${fsm}/label`]: async (state) => {
      if (state.n === 0) return nextStep('no_such_step');
      if (state.n === 1) return 'not an outcome';
      return nextStep('end');
    },
  }), { batch: 10 }), async () => {
    await s.allIn(ids.slice(2));
    await s.allIn(ids.slice(0, 2), 'failed');
  });
  const { rows } = await s.db.query(
    "SELECT error->>'kind' AS kind, error->>'message' AS message FROM gd.instances WHERE id = ANY($1) ORDER BY id",
    [ids.slice(0, 2)]);
  assert.equal(rows[0].kind, 'retry');
  assert.match(rows[0].message, /no_such_step/);
  assert.match(rows[1].message, /not an outcome/);
});

test('a batch handler takes the claims of its step at once; its outcomes apply one per instance', async (t) => {
  const { s, client, worker, record, effects } = await setup(t);
  const fsm = s.name('batched');
  await s.define(fsm, 'pack', { pack: { batch: 10, max_attempts: 2, backoff: '0s' }, end: null });
  const calls = [];
  const pack = async (states, ctxs) => {
    calls.push(ctxs.map((ctx) => ctx.id));
    assert.ok(ctxs.every((ctx) => ctx.connection === ctxs[0].connection), 'one connection for the batch');
    for (const ctx of ctxs) await record(ctx); // one transaction: committed with all the outcomes, or none
    if (states.some((state, i) => state.fail && ctxs[i].attempt === 1)) throw new Error('one of the batch failed');
    return states.map((state) => (state.n % 2 === 0 ? done({ n: state.n, size: states.length })
      : nextStep('end', { ...state, size: states.length })));
  };
  const ids = await client.insertAll(fsm, [0, 1, 2, 3, 4].map((n) => ({ state: { n, fail: n === 3 } })));
  const w = worker({ [`${fsm}/end`]: (state) => done({ n: state.n, size: state.size, ended: true }) },
    { queues: [s.queue], batch: 10 });
  w.step(fsm, 'pack', pack, { batch: true });
  await running(w, () => s.allIn(ids));
  assert.deepEqual(calls, [ids, ids]); // one call for the five, in the claim's order; each failed: again, together
  assert.deepEqual(await Promise.all(ids.map(async (id) => (await client.get(id)).result)),
    [0, 1, 2, 3, 4].map((n) => (n % 2 === 0 ? { n, size: 5 } : { n, size: 5, ended: true })));
  assert.deepEqual((await effects()).map((e) => [e.instance, e.step, e.attempt]),
    ids.map((id) => [id, 'pack', 2])); // the first attempt's writes were rolled back with it
});

test('a batch handler returning too few outcomes, or not outcomes, fails the attempt of each', async (t) => {
  const { s, client, worker, record, effects } = await setup(t);
  const fsm = s.name('short');
  await s.define(fsm, 'pack', { pack: { batch: 10, max_attempts: 2, backoff: '0s' } });
  const sizes = [];
  const pack = async (states, ctxs) => {
    sizes.push(states.length);
    for (const ctx of ctxs) await record(ctx);
    return ctxs[0].attempt === 1 ? states.slice(1).map(() => done()) // one short
      : states.map((state, i) => (i === 1 ? { kind: 'done' } : done())); // one is no outcome
  };
  const ids = await client.insertAll(fsm, [0, 1, 2].map((n) => ({ state: { n } })));
  const w = worker({}, { queues: [s.queue], batch: 10 });
  w.step(fsm, 'pack', pack, { batch: true });
  await running(w, () => s.allIn(ids, 'failed'));
  assert.deepEqual(sizes, [3, 3]);
  const { rows } = await s.db.query(
    "SELECT attempt, error->>'message' AS message FROM gd.instances WHERE id = ANY($1) ORDER BY id", [ids]);
  for (const row of rows) {
    assert.equal(row.attempt, 2);
    assert.match(row.message, /not an outcome/);
  }
  assert.deepEqual(await effects(), []); // each attempt's writes rolled back
});

test('handlers run outside any transaction; their writes commit with the outcome', async (t) => {
  const { s, fsm, client, handlers, worker, record, effects } = await setup(t);
  const seen = [];
  const inTransaction = async (ctx) => (await s.db.query( // the lane's session, as the server sees it
    "SELECT state LIKE 'idle in transaction%' OR backend_xid IS NOT NULL AS open FROM pg_stat_activity WHERE pid = $1",
    [ctx.connection.processID])).rows[0].open;
  const ids = await client.insertAll(fsm, [0, 1, 2].map((n) => ({ state: { n } })));
  await running(worker(handlers({
    [`${fsm}/label`]: async (state, ctx) => {
      await new Promise((r) => setTimeout(r, 200)); // a call over the network
      seen.push(['calling', await inTransaction(ctx)]);
      await record(ctx);
      seen.push(['written', await inTransaction(ctx)]);
      return nextStep('end');
    },
  })), () => s.allIn(ids));
  assert.deepEqual(seen, [0, 1, 2].flatMap(() => [['calling', false], ['written', true]]));
  assert.equal((await effects()).length, 9);
});

test("the step's transaction is the worker's to end; a failed query fails the attempt", async (t) => {
  const { s, fsm, client, handlers, worker, record, effects } = await setup(t);
  const ids = await client.insertAll(fsm, [0, 1].map((n) => ({ state: { n, packed: true }, step: 'label' })));
  await running(worker(handlers({
    [`${fsm}/label`]: async (state, ctx) => {
      await record(ctx);
      if (state.n === 0) await ctx.connection.end();
      await ctx.connection.query('SELECT 1 / 0').catch(() => {}); // swallowed: the transaction stays aborted
      return nextStep('end');
    },
  })), () => s.allIn(ids, 'failed'));
  const { rows } = await s.db.query("SELECT error->>'message' AS message FROM gd.instances WHERE id = ANY($1) ORDER BY id",
    [ids]);
  assert.match(rows[0].message, /end\(\) is the worker's/);
  assert.match(rows[1].message, /its transaction was aborted/);
  assert.deepEqual(await effects(), [], 'their writes were rolled back');
});

test('every outcome', async (t) => {
  const { s, client, worker } = await setup(t);
  const fsm = s.name('all');
  const child = s.name('child');
  await s.define(child, 'work', { work: null });
  await s.define(fsm, 'a', { a: null, b: null, c: null, d: null, e: null });
  const stopped = await client.insert(fsm, {}, { step: 'e' });
  const id = await client.insert(fsm);
  await running(worker({
    [`${fsm}/a`]: () => waitSignal(['go'], { timeout: 60, thenStep: 'b' }),
    [`${fsm}/b`]: (state, ctx) => spawn([{ fsm: child }, { fsm: child }], 'c', { signal: ctx.signals[0].payload }),
    [`${fsm}/c`]: (state, ctx) => nextStep('d', { ...state, children: ctx.children.length }, 0.1),
    [`${fsm}/d`]: (state, ctx) => (ctx.attempt === 1 ? retry({ why: 'once more' }, 0) : nextStep('e', state)),
    [`${fsm}/e`]: (state) => (Object.keys(state).length ? done(state) : stop({ empty: true })),
    [`${child}/work`]: () => done({ child: true }),
  }, { queues: [s.queue] }), async () => {
    await s.until(async () => (await s.status(id)).status === 'awaiting_signal', 'the wait');
    await client.signal(id, 'go', { paid: 3 });
    await s.allIn([id]);
    await s.allIn([stopped], 'failed');
  });
  assert.deepEqual((await client.get(id)).result, { signal: { paid: 3 }, children: 2 });
  assert.equal((await client.get(stopped)).error.kind, 'stop');
});

test('the trace context reaches the handlers, the children inherit it', async (t) => {
  const { s, client, worker } = await setup(t);
  const fsm = s.name('traced');
  const child = s.name('traced_child');
  const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
  await s.define(child, 'work', { work: null });
  await s.define(fsm, 'a', { a: null, b: null });
  const id = await client.insert(fsm, {}, { traceContext: traceparent });
  await running(worker({
    [`${fsm}/a`]: (state, ctx) => spawn([{ fsm: child }], 'b', { seen: ctx.traceContext }),
    [`${fsm}/b`]: (state, ctx) => done({ ...state, children: ctx.children.map((c) => c.result) }),
    [`${child}/work`]: (state, ctx) => done({ seen: ctx.traceContext }),
  }, { queues: [s.queue] }), () => s.allIn([id]));
  assert.deepEqual((await client.get(id)).result, { seen: traceparent, children: [{ seen: traceparent }] });
});

test('steps without a handler are released, no attempt counted', async (t) => {
  const { s, fsm, client, handlers, worker } = await setup(t);
  const id = await client.insert(fsm, { n: 1 });
  const h = handlers();
  delete h[`${fsm}/pack`];
  const w = worker(h, { wait: 0.2 });
  await running(w, () => s.until(async () => w.log.messages.some((m) => m.includes('no handler')), 'the release'));
  assert.deepEqual(await s.status(id), { status: 'runnable', step: 'pack', attempt: 1 });
});

test('claims only steps of the FSMs it has handlers for', async (t) => {
  const { s, fsm, client, handlers, worker } = await setup(t);
  // Another FSM's steps on the same queue, ahead of these: a claim of any FSM's steps (a superuser's without
  // fsms) would get them, hand them back and pause for `wait`, again and again.
  const other = s.name('other');
  await s.define(other, 'pack', { pack: null });
  const others = await client.insertAll(other, Array(20).fill({ priority: 10 }));
  const ids = await client.insertAll(fsm, Array.from({ length: 20 }, (_, n) => ({ state: { n } })));
  const w = worker(handlers(), { batch: 5, wait: 30 });
  await running(w, () => s.allIn(ids, 'done', 10));
  assert.deepEqual(w.log.messages.filter((m) => m.includes('released')), []);
  const { rows: [stats] } = await s.db.query('SELECT drained::int FROM gd.queue_stats WHERE queue = $1', [s.queue]);
  assert.equal(stats.drained, 0);
  const { rows } = await s.db.query('SELECT DISTINCT status, step, attempt FROM gd.instances WHERE id = ANY($1)',
    [others]);
  assert.deepEqual(rows, [{ status: 'runnable', step: 'pack', attempt: 1 }]);
});

test('a handler for an FSM not defined yet holds nothing back', async (t) => {
  const { s, fsm, client, handlers, worker } = await setup(t);
  const later = s.name('later');
  const id = await client.insert(fsm, { n: 1 });
  const w = worker(handlers({ [`${later}/work`]: () => done() }), { wait: 0.2 });
  await running(w, async () => {
    await s.allIn([id]);
    await s.define(later, 'work', { work: null });
    await s.allIn([await client.insert(later)]);
  });
});

test("a lost lease rolls the step's writes back", async (t) => {
  const { s, fsm, client, handlers, worker, record, effects } = await setup(t);
  let entered;
  const inside = new Promise((r) => { entered = r; });
  let goOn;
  const released = new Promise((r) => { goOn = r; });
  const id = await client.insert(fsm, { n: 1, packed: true }, { step: 'label' });
  const w = worker(handlers({
    [`${fsm}/label`]: async (state, ctx) => {
      await record(ctx);
      entered();
      if (ctx.attempt === 1) await released;
      return nextStep('end');
    },
  }), { lease: 60 });
  await running(w, async () => {
    await inside;
    await s.db.query("UPDATE gd._instances SET lease_expires_at = now() - interval '1 second' WHERE id = $1", [id]);
    await s.db.query('SELECT gd._reclaim_leases(10)');
    goOn();
    await s.until(async () => w.log.messages.some((m) => m.includes('were lost')), 'the lost lease');
    await s.allIn([id]);
  });
  assert.deepEqual((await effects()).map((e) => [e.step, e.attempt]), [['end', 1], ['label', 2]]);
});

test('stop drains the batch in hand', async (t) => {
  const { s, fsm, client, handlers, worker, record, otherQueue } = await setup(t);
  let entered;
  const inside = new Promise((r) => { entered = r; });
  const ids = await client.insertAll(fsm, [0, 1, 2, 3, 4].map((n) => ({ step: 'label', state: { n, packed: true } })));
  const w = worker(handlers({
    [`${fsm}/label`]: async (state, ctx) => {
      await record(ctx);
      entered();
      await new Promise((r) => setTimeout(r, 500));
      return nextStep('end');
    },
  }), { queues: [otherQueue], batch: 5 });
  const run = w.run({ signals: false });
  await inside;
  w.stop();
  await run;
  const { rows } = await s.db.query(
    'SELECT step, status, attempt, lease_owner FROM gd.instances WHERE id = ANY($1) ORDER BY id', [ids]);
  assert.deepEqual(rows[0], { step: 'end', status: 'runnable', attempt: 1, lease_owner: null });
  assert.deepEqual(rows.slice(1), Array(4).fill({ step: 'label', status: 'runnable', attempt: 1, lease_owner: null }));
});

test('reconnects after its connections are killed', async (t) => {
  const { s, fsm, client, handlers, worker } = await setup(t);
  const ids = await client.insertAll(fsm, [0, 1, 2].map((n) => ({ state: { n } })));
  const w = worker(handlers());
  await running(w, async () => {
    await s.allIn(ids);
    await s.db.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1',
      [`gd worker ${s.name('w')}`]);
    const more = await client.insertAll(fsm, [3, 4, 5].map((n) => ({ state: { n } })));
    await s.allIn(more);
  });
  assert.ok(w.log.messages.some((m) => m.includes('reconnecting')));
});

test('a claim waits in the server until work commits, and stop() cancels it', async (t) => {
  const { s, fsm, client, handlers, worker } = await setup(t);
  const w = worker(handlers(), { wait: 30 });
  const run = w.run({ signals: false });
  await s.until(async () => (await s.db.query(
    "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' AND query LIKE $2",
    [`gd worker ${s.name('w')}`, '%gd_claim%'])).rows[0].n === 1, "the lane's claim waiting");
  const inserted = Date.now();
  const ids = await client.insertAll(fsm, [0, 1, 2].map((n) => ({ state: { n } })));
  await s.allIn(ids);
  assert.ok(Date.now() - inserted < 15000, 'woken by the commit, not at the end of its 30 s wait');
  const stopping = Date.now();
  w.stop();
  await run;
  assert.ok(Date.now() - stopping < 10000, 'stop() cancelled the waiting claim');
});

test('queues default to those the steps are defined on', async (t) => {
  const { s, otherQueue, handlers } = await setup(t);
  const w = new Worker(DSN, { handlers: handlers(), name: s.name('w') });
  await w.resolveQueues();
  assert.deepEqual([...w.queues].sort(), [s.queue, otherQueue].sort());
});
