'use strict';
// ctx.idempotencyKey against a payment service that charges, then answers
// after the worker gave up: every retry, and the step run again after its
// lease was reclaimed, sends the same key, so nothing is charged twice.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const http = require('http');
const { Client, Worker, nextStep, done } = require('..');
const { DSN, scope, running, captureLog } = require('./support');

/** A payment service: a charge is made (once per Idempotency-Key) before the answer, which comes `delayMs` later. */
async function paymentService(delayMs) {
  const charges = new Map(); // key -> {order, charge}
  const calls = [];
  const server = http.createServer((request, response) => {
    let body = '';
    request.on('data', (chunk) => { body += chunk; });
    request.on('end', () => {
      const key = request.headers['idempotency-key'];
      const { order } = JSON.parse(body);
      calls.push({ order, key });
      if (!charges.has(key)) charges.set(key, { order, charge: `ch_${charges.size + 1}` });
      setTimeout(() => {
        response.setHeader('content-type', 'application/json');
        response.end(JSON.stringify(charges.get(key)));
      }, calls.filter((c) => c.key === key).length === 1 ? delayMs : 0);
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}/charges`;
  return { url, charges, calls, close: () => new Promise((resolve) => server.close(resolve)) };
}

test('retries and a reclaimed lease send the same key: no order is charged twice', async (t) => {
  const s = await scope();
  const fsm = s.name('order');
  await s.define(fsm, 'pay', { pay: { max_attempts: 5, backoff: '10 milliseconds' }, ship: null });
  const client = await Client.connect(DSN);
  const psp = await paymentService(300);
  t.after(async () => { await psp.close(); await client.end(); await s.end(); });

  // The first answer for each key comes after the worker's 100 ms timeout: the
  // charge was made, the handler raised, the step is retried.
  const charge = async (state, ctx) => {
    const answer = await fetch(psp.url, {
      method: 'POST', body: JSON.stringify({ order: state.order }),
      headers: { 'idempotency-key': ctx.idempotencyKey }, signal: AbortSignal.timeout(100),
    });
    return nextStep('ship', { ...state, charge: (await answer.json()).charge });
  };
  const orders = Array.from({ length: 20 }, (_, order) => ({ state: { order } }));
  const ids = await client.insertAll(fsm, orders);
  const w = new Worker(DSN, {
    handlers: { [`${fsm}/pay`]: charge, [`${fsm}/ship`]: async (state) => done(state) },
    queues: [s.queue], concurrency: 2, wait: 0.2, name: s.name('w'), log: captureLog(),
  });
  await running(w, () => s.allIn(ids));

  // One more order whose worker charges and then hangs until its lease is
  // reclaimed: the step runs again, on another worker, with the same key.
  let charged;
  const chargedOnce = new Promise((resolve) => { charged = resolve; });
  let wakeUp;
  const reclaimed = new Promise((resolve) => { wakeUp = resolve; });
  const hangs = new Worker(DSN, {
    handlers: {
      [`${fsm}/pay`]: async (state, ctx) => {
        await fetch(psp.url, { method: 'POST', body: JSON.stringify({ order: state.order }),
          headers: { 'idempotency-key': ctx.idempotencyKey } }).then((r) => r.json());
        charged();
        await reclaimed;
        return nextStep('ship', { ...state, charge: 'from the hung worker' }); // too late: dropped
      },
    },
    queues: [s.queue], lease: 60, wait: 0.2, name: s.name('hangs'), log: captureLog(),
  });
  const hung = hangs.run({ signals: false });
  const late = await client.insert(fsm, { order: 20 });
  await chargedOnce;
  await s.db.query("UPDATE gd._instances SET lease_expires_at = now() - interval '1 second' WHERE id = $1", [late]);
  await s.db.query('SELECT gd._reclaim_leases(10)');
  const w2 = new Worker(DSN, {
    handlers: { [`${fsm}/pay`]: charge, [`${fsm}/ship`]: async (state) => done(state) },
    queues: [s.queue], wait: 0.2, name: s.name('w2'), log: captureLog(),
  });
  await running(w2, () => s.allIn([late]));
  wakeUp();
  hangs.stop();
  await hung;

  const callsPerOrder = new Map();
  for (const call of psp.calls) callsPerOrder.set(call.order, (callsPerOrder.get(call.order) ?? []).concat(call.key));
  assert.equal(callsPerOrder.size, 21);
  for (const [order, keys] of callsPerOrder) {
    assert.ok(keys.length >= 2, `order ${order} was sent again (${keys.length} calls)`);
    assert.equal(new Set(keys).size, 1, `order ${order} sent one key`);
  }
  const chargesPerOrder = new Map();
  for (const { order } of psp.charges.values()) chargesPerOrder.set(order, (chargesPerOrder.get(order) ?? 0) + 1);
  assert.deepEqual([...chargesPerOrder.values()], Array(21).fill(1));
  const { rows } = await s.db.query(
    "SELECT (result->>'order')::int AS order, result->>'charge' AS charge FROM gd.instances WHERE id = ANY($1) AND status = 'done'",
    [ids.concat(late)]);
  const chargeOf = new Map([...psp.charges.values()].map((c) => [c.order, c.charge]));
  assert.equal(rows.length, 21);
  for (const row of rows) assert.equal(row.charge, chargeOf.get(row.order), `order ${row.order} kept its charge`);
});
