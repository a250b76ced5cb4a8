'use strict';
// What the tests share: the server (GD_TEST_DSN, a superuser's connection
// string to a database with gen_durable), and FSMs of their own per test on
// queues no executor serves, so each test decides when steps run.
const crypto = require('crypto');
const pg = require('pg');

const DSN = process.env.GD_TEST_DSN;

async function admin() {
  const db = new pg.Client({ connectionString: DSN });
  await db.connect();
  return db;
}

/** A test's own names and queue, on an admin connection. */
async function scope() {
  const db = await admin();
  const tag = crypto.randomBytes(4).toString('hex');
  const s = {
    db, tag, queue: `q_${tag}`,
    name: (what) => `${what}_${tag}`,
    /** gd_define_fsm with its steps: {step: handler signature, null (external), or an options object}. */
    async define(fsm, initial, steps, queue = s.queue) {
      const options = Object.fromEntries(Object.entries(steps).map(([step, spec]) =>
        [step, typeof spec === 'string' ? { handler: spec } : (spec ?? {})]));
      await db.query('SELECT gd_define_fsm($1, $2, $3, steps => $4)', [fsm, initial, queue, JSON.stringify(options)]);
    },
    async status(id) {
      const { rows } = await db.query('SELECT status, step, attempt FROM gd.instances WHERE id = $1', [id]);
      return rows[0];
    },
    async until(predicate, what = 'condition', timeout = 20) {
      const deadline = Date.now() + timeout * 1000;
      while (Date.now() < deadline) {
        if (await predicate()) return;
        await new Promise((r) => setTimeout(r, 50));
      }
      throw new Error(`timed out waiting for ${what}`);
    },
    async allIn(ids, status = 'done', timeout = 20) {
      await s.until(async () => {
        const { rows } = await db.query(
          'SELECT count(*)::int AS n FROM gd.instances WHERE id = ANY($1) AND status = $2', [ids, status]);
        return rows[0].n === ids.length;
      }, `${ids.length} ${status}`, timeout);
    },
    end: () => db.end(),
  };
  return s;
}

/** Run the worker for the callback, then stop it and wait for its drain. */
async function running(worker, body) {
  const run = worker.run({ signals: false });
  try {
    await body();
  } finally {
    worker.stop();
    await run;
  }
}

/** A log that keeps what it is told. */
function captureLog() {
  const messages = [];
  return { messages, info: (m) => messages.push(m), warn: (m) => messages.push(m) };
}

module.exports = { DSN, admin, scope, running, captureLog };
