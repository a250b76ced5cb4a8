'use strict';
// testTransaction: an order FSM (reserve in SQL -> charge, external -> ship in
// SQL, which waits a day for 'shipped') taken through every path in one
// transaction, its clock moved a day, nothing left behind.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { Worker, nextStep, testTransaction } = require('..');
const { DSN, scope } = require('./support');

test('an order through every step in one transaction', async (t) => {
  const s = await scope();
  t.after(() => s.end());
  const fsm = s.name('order');
  const attempts = [];
  const charge = async (state, ctx) => {
    attempts.push(ctx.attempt);
    if (ctx.attempt === 1) throw new Error('the payment service timed out');
    await ctx.connection.query(`INSERT INTO charges_${s.tag} VALUES ($1, $2)`, [ctx.id, ctx.idempotencyKey]);
    return nextStep('ship', { ...state, charged: true });
  };
  await testTransaction(DSN, async (tx) => {
    // The FSM, its handler and the charges' table, in the transaction: rolled back with it.
    await tx.connection.query(`CREATE FUNCTION public.order_step_${s.tag}(state jsonb, ctx gd.context)
      RETURNS gd.outcome LANGUAGE plpgsql AS $$
      BEGIN
          RETURN CASE
              WHEN ctx.step = 'reserve' THEN gd_next('charge', state || '{"reserved": true}')
              WHEN ctx.timed_out THEN gd_done(state || '{"shipped": false}')
              WHEN jsonb_array_length(ctx.signals) > 0 THEN gd_done(state || '{"shipped": true}')
              ELSE gd_wait_signal(ARRAY['shipped'], timeout => '1 day') END;
      END $$`);
    const handler = `public.order_step_${s.tag}(jsonb, gd.context)`;
    await tx.connection.query("SELECT gd_define_fsm($1, 'reserve', $2, steps => $3)", [fsm, s.queue, JSON.stringify({
      reserve: { handler }, charge: { backoff: '10 minutes' }, ship: { handler } })]);
    await tx.connection.query(`CREATE TABLE charges_${s.tag} (instance bigint, key uuid)`);

    const shipped = await tx.client.insert(fsm, { sku: 'tea' });
    const lost = await tx.client.insert(fsm, { sku: 'mate' });
    const handlers = { [`${fsm}/charge`]: charge };
    assert.equal(await tx.drain(s.queue), 2); // reserve, both
    assert.equal(await tx.runExternal(s.queue, handlers), 2); // charge: the service timed out
    assert.equal(await tx.runExternal(s.queue, handlers), 0); // retried in 10 minutes, not before
    await tx.advance({ minutes: 11 });
    assert.equal(await tx.runExternal(s.queue, handlers), 2); // charged
    assert.deepEqual(attempts, [1, 1, 2, 2]);
    assert.equal(await tx.drain(s.queue), 2); // ship: each waits for 'shipped'
    await tx.client.signal(shipped, 'shipped');
    await tx.advance({ days: 1, seconds: 1 });
    await tx.drain(s.queue); // one shipped, one timed out
    const done = await tx.client.get(shipped);
    const timedOut = await tx.client.get(lost);
    assert.deepEqual([done.status, timedOut.status], ['done', 'done']);
    assert.deepEqual(done.result, { sku: 'tea', reserved: true, charged: true, shipped: true });
    assert.equal(timedOut.result.shipped, false);
    const { rows } = await tx.connection.query(`SELECT count(*)::int AS n FROM charges_${s.tag}`);
    assert.equal(rows[0].n, 2);
  });
  const { rows } = await s.db.query('SELECT count(*)::int AS n FROM gd.fsms WHERE name = $1', [fsm]);
  assert.equal(rows[0].n, 0, 'rolled back: the FSM, its instances and its table');
});

test('a batch handler runs once for its claims, as the worker calls it', async (t) => {
  const s = await scope();
  t.after(() => s.end());
  const fsm = s.name('batched');
  const calls = [];
  const worker = new Worker(DSN);
  worker.step(fsm, 'charge', async (states, ctxs) => {
    calls.push(ctxs.length);
    if (calls.length === 1) { // one outcome short: a failed attempt of each, its writes undone
      await ctxs[0].connection.query(`INSERT INTO charges_${s.tag} VALUES ($1)`, [ctxs[0].id]);
      return states.slice(1).map((state) => nextStep('ship', state));
    }
    return states.map((state) => nextStep('ship', { ...state, charged: true }));
  }, { batch: true });
  await testTransaction(DSN, async (tx) => {
    await tx.connection.query(`CREATE FUNCTION public.batched_step_${s.tag}(state jsonb, ctx gd.context)
      RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_next('charge') $$`);
    const handler = `public.batched_step_${s.tag}(jsonb, gd.context)`;
    await tx.connection.query("SELECT gd_define_fsm($1, 'reserve', $2, steps => $3)", [fsm, s.queue, JSON.stringify({
      reserve: { handler }, charge: { backoff: '10 minutes' }, ship: { handler } })]);
    await tx.connection.query(`CREATE TABLE charges_${s.tag} (instance bigint)`);
    const orders = [];
    for (const n of [1, 2, 3]) orders.push(await tx.client.insert(fsm, { n }));
    assert.equal(await tx.drain(s.queue), 3); // reserve
    assert.equal(await tx.runExternal(s.queue, worker), 3); // one call, one outcome short
    const { rows } = await tx.connection.query(`SELECT count(*)::int AS n FROM charges_${s.tag}`);
    assert.equal(rows[0].n, 0, "the failed call's writes are undone");
    await tx.advance({ minutes: 11 });
    assert.equal(await tx.runExternal(s.queue, worker), 3); // one call, an outcome each
    assert.deepEqual(calls, [3, 3]);
    for (const id of orders) assert.equal((await tx.client.get(id)).step, 'ship');
  });
});
