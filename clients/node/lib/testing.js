'use strict';
/**
 * Testing FSMs: one transaction, rolled back at the end, in which a test runs
 * in-database steps (gd_drain), claims and runs external steps with their
 * handlers, ends waits and joins, and moves its clock (gen_durable.now).  Put
 * the FSM on a queue no executor serves and nothing happens behind the test's
 * back.
 *
 *   test('a parcel never shipped', () => testTransaction(DSN, async (t) => {
 *     const order = await t.client.insert('checkout', { sku: 'tea' }); // defined on queue checkout_test
 *     await t.drain('checkout_test');                                      // reserve
 *     await t.runExternal('checkout_test', { 'checkout/charge': charge });
 *     await t.drain('checkout_test');                                      // ship: waits a day for 'shipped'
 *     await t.advance({ days: 1, seconds: 1 });
 *     await t.drain('checkout_test');                                      // the wait timed out
 *     assert.equal((await t.client.get(order)).status, 'done');
 *   }));
 */
const { Client, connect } = require('./client');
const { interval } = require('./outcomes');
const { statements } = require('./sql');
const { Worker, claimFrom, failedAttempt } = require('./worker');

/** Run `body(t)` in a transaction on a connection of its own, rolled back when it ends; resolves to its result. */
async function testTransaction(config, body, { apiSchema = null } = {}) {
  const { client: connection } = await connect(config, { pooler: false });
  try {
    await connection.query('BEGIN');
    const { rows } = await connection.query('SELECT pg_catalog.now() AS now');
    return await body(new TestTransaction(connection, apiSchema, rows[0].now));
  } finally {
    await connection.query('ROLLBACK').catch(() => {});
    await connection.end();
  }
}

class TestTransaction {
  constructor(connection, apiSchema, now) {
    this.connection = connection; // the transaction's pg client
    this.client = new Client(connection, { apiSchema }); // the API, in the transaction
    this.apiSchema = apiSchema;
    this.now = now; // the test's clock: the transaction's start, until advance() moves it
  }

  /** gd_drain: the queue's in-database steps due by the test's clock, and the waits and joins due. */
  drain(queue, options) { return this.client.drain(queue, options); }

  /** Move the test's clock forward. */
  advance({ days = 0, hours = 0, minutes = 0, seconds = 0 } = {}) {
    return this.setClock(new Date(this.now.getTime() + (((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000));
  }

  async setClock(now) {
    await this.connection.query("SELECT pg_catalog.set_config('gen_durable.now', $1, true)", [now.toISOString()]);
    this.now = now;
    return now;
  }

  /**
   * Claim the external steps of `queue` due by the test's clock, of the FSMs
   * `handlers` has handlers for ({'fsm/step': handler}, or a Worker), run each
   * handler as a worker would (its queries on ctx.connection in the test's
   * transaction; one that throws is a failed attempt, its writes undone) and
   * complete it.  Resolves to how many ran.
   */
  async runExternal(queue, handlers, { batch = 100 } = {}) {
    const worker = handlers instanceof Worker ? handlers : new Worker(null, { handlers });
    const fsms = [...new Set([...worker.handlers.keys()].map((k) => k.split('/')[0]))].sort();
    const sql = await statements(this.connection, this.apiSchema);
    const { rows } = await this.connection.query(sql.claim, [queue, 'test', batch, interval(60), fsms, null]);
    const claims = [];
    for (const row of rows) {
      const claim = claimFrom(row, this.connection);
      if (worker.handlers.has(`${claim.fsm}/${claim.step}`)) claims.push(claim);
      else await this.connection.query(sql.release, [claim.id, claim.token]);
    }
    let ran = 0;
    for (const group of worker.groups(claims)) {
      const outcomes = await this.call(worker, group);
      for (const [i, claim] of group.entries()) {
        await this.connection.query(sql.complete, [claim.id, claim.token, JSON.stringify(outcomes[i])]);
        ran++;
      }
    }
    return ran;
  }

  /** The outcomes of a group (a batch handler's claims of one step, or one claim), as a worker gets them; the
   *  writes of a handler that throws, or returns no outcomes, undone. */
  async call(worker, group) {
    await this.connection.query('SAVEPOINT gd_test_step');
    try {
      const contexts = group.map((c) => ({ ...c.ctx, signal: new AbortController().signal }));
      const returned = await worker.callGroup(group, contexts);
      const outcomes = Worker.outcomesOf(returned, group);
      await this.connection.query(outcomes ? 'RELEASE SAVEPOINT gd_test_step' : 'ROLLBACK TO SAVEPOINT gd_test_step');
      return outcomes ?? worker.notOutcomes(returned, group, 'test');
    } catch (e) {
      await this.connection.query('ROLLBACK TO SAVEPOINT gd_test_step');
      return group.map(() => failedAttempt(e, 'test'));
    }
  }
}

module.exports = { testTransaction, TestTransaction };
