'use strict';
// A step's timeout holds for external steps: at the deadline the engine ends
// the claim whatever the heartbeats say, the handler's ctx.signal aborts, its
// connection is no longer its own, and the lane goes on.  A drain has a limit.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { Client, Worker, done } = require('..');
const { DSN, scope, running, captureLog } = require('./support');

test('a handler past its deadline is aborted, the lane moves on, the engine counts the attempt', async (t) => {
  const s = await scope();
  const fsm = s.name('slow');
  await s.define(fsm, 'call', { call: { timeout: '1 second', max_attempts: 2, backoff: '500 milliseconds' } });
  const client = await Client.connect(DSN);
  t.after(async () => { await client.end(); await s.end(); });
  const seen = [];
  let lateQuery;
  const handler = async (state, ctx) => {
    seen.push({ n: state.n, attempt: ctx.attempt, deadline: ctx.deadline });
    if (state.n === 0) {
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      lateQuery = ctx.connection.query('SELECT 1').then(() => 'ran', (e) => e.message);
      return new Promise(() => {}); // and never answers
    }
    return done({ n: state.n, attempt: ctx.attempt });
  };
  const [slow, quick] = await client.insertAll(fsm, [{ state: { n: 0 }, priority: -1 }, { state: { n: 1 } }]);
  // One lane, one claim at a time (a deadline counts from the claim), a lease far longer than the
  // timeout: only the deadline can end an attempt.
  const w = new Worker(DSN, { handlers: { [`${fsm}/call`]: handler }, queues: [s.queue], batch: 1, lease: 60, wait: 0.2,
    name: s.name('w'), log: captureLog() });
  await running(w, async () => { await s.allIn([quick]); await s.allIn([slow], 'failed'); });
  assert.match(await lateQuery, /gen_durable: this step has ended/);
  assert.deepEqual(seen.map((e) => [e.n, e.attempt]), [[0, 1], [1, 1], [0, 2]]);
  assert.ok(seen.every((e) => e.deadline instanceof Date));
  const { rows } = await s.db.query("SELECT attempt, error->>'kind' AS kind FROM gd.instances WHERE id = $1", [slow]);
  assert.deepEqual(rows[0], { attempt: 2, kind: 'timeout' });
  assert.ok(w.log.messages.some((m) => m.includes('ran past its deadline')));
});

test('a drain waits drainTimeout for the handler in hand, then hands its step back', async (t) => {
  const s = await scope();
  const fsm = s.name('stuck');
  await s.define(fsm, 'call', { call: null });
  const client = await Client.connect(DSN);
  t.after(async () => { await client.end(); await s.end(); });
  let entered;
  const inside = new Promise((resolve) => { entered = resolve; });
  let aborted = false;
  const w = new Worker(DSN, {
    handlers: {
      [`${fsm}/call`]: (state, ctx) => {
        ctx.signal.addEventListener('abort', () => { aborted = true; });
        entered();
        return new Promise(() => {});
      },
    },
    queues: [s.queue], wait: 0.2, drainTimeout: 0.5, name: s.name('w'), log: captureLog(),
  });
  const id = await client.insert(fsm, {});
  const run = w.run({ signals: false });
  await inside;
  w.stop();
  await run;
  assert.ok(aborted);
  assert.deepEqual(await s.status(id), { status: 'runnable', step: 'call', attempt: 1 });
  assert.ok(w.log.messages.some((m) => m.includes("drain's limit")));
});
