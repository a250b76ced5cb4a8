#!/usr/bin/env node
'use strict';
/*
 * One workload through one system, for test/bench/bench.py (`make bench`).
 *
 *   node peers.js SYSTEM WORKLOAD N
 *
 *   SYSTEM    gdext     gen_durable's external-worker path: this file's own worker
 *                       (gd_claim batches that wait in the server, a batch's handlers
 *                       and gd_complete_all in one transaction; BENCH_GDEXT_NOTIFY=1:
 *                       claims woken by LISTEN gd_work instead; BENCH_GDEXT_CALL_MS:
 *                       each handler first waits that long, a call over the network;
 *                       BENCH_GDEXT_STEP_TRANSACTIONS=1: the client libraries' way,
 *                       each handler outside any transaction, its write and its
 *                       gd_complete in a transaction of its own)
 *             pgboss    pg-boss (boss.work, batches)
 *             graphile  graphile-worker (run(), local queue, batched completions)
 *             pgq       PgQ: CALL bench.pgq_consume (test/bench/peers.sql) on worker
 *                       connections, the consumer driving its own ticks
 *             dbos      DBOS Transact: workflows and steps in this process, a DBOS
 *                       queue (see DbosPeer)
 *   WORKLOAD  setup     install the system's schema and queues (once)
 *             w1        N single jobs enqueued in one call, each job one ledger INSERT
 *             w2        N jobs one at a time: enqueue, wait for completion; latencies
 *             w3        N chains of three jobs (a -> b -> c), the ledger INSERT at c
 *             w4        one parent that enqueues N children; a final job runs when
 *                       the last child is done (gen_durable: gd_spawn and its join;
 *                       the peers: a counter row the children decrement)
 *             backlog   enqueue N jobs due in a day (W5's waiting rows), no workers
 *             steady    (W7) workers for w1 running; each line on stdin names how many
 *                       jobs to enqueue now (payload {n, t: enqueue time}), answered by
 *                       a line once enqueued; `stop` ends it
 *             work      (gdext only) W1's work alone: N ledger INSERTs from the
 *                       worker's lanes as its handler does them, no queue
 *             producers (W10) workers for w1 running; BENCH_W10_PRODUCERS (16)
 *                       producers, each on a connection of its own, enqueue one
 *                       job per call (one transaction) for N seconds, with the
 *                       system's single-job API; each call's time is its commit
 *                       latency
 *
 * Environment: BENCH_HOST (the server's socket dir), BENCH_PORT, NODE_PATH (the
 * node_modules with pg, pg-boss and graphile-worker) and the knobs below;
 * BENCH_GDEXT_WORKER_HOST/_PORT: where gen_durable's external worker's lanes
 * connect instead (PgBouncer in transaction mode, for W10).
 *
 * Protocol with bench.py: once its workers are started and idle this prints a
 * JSON line {"ready": ...}; it then waits for a line on stdin, runs the
 * workload, prints one JSON line with its results, stops its workers and
 * exits 0.  Throughput is computed by bench.py from the ledger's server-side
 * timestamps, so this process's own clock does not matter for it.
 */
const readline = require('readline');
const { Client, Pool } = require('pg');

const SYSTEM = process.argv[2];
const WORKLOAD = process.argv[3];
const N = parseInt(process.argv[4] || '0', 10);
const CONN = {
  host: process.env.BENCH_HOST,
  port: parseInt(process.env.BENCH_PORT, 10),
  database: 'bench',
  user: 'postgres',
};
const env = (name, dflt) => (process.env[name] !== undefined && process.env[name] !== '' ? process.env[name] : dflt);
const KNOBS = {
  gdext: { lanes: +env('BENCH_GDEXT_LANES', 4), batch: +env('BENCH_GDEXT_BATCH', 128),
           oneTransaction: env('BENCH_GDEXT_ONE_TRANSACTION', '0') === '1',
           notify: env('BENCH_GDEXT_NOTIFY', '0') === '1',
           callMs: +env('BENCH_GDEXT_CALL_MS', 0),
           stepTransactions: env('BENCH_GDEXT_STEP_TRANSACTIONS', '0') === '1' },
  pgboss: { workers: +env('BENCH_PGBOSS_WORKERS', 2), batch: +env('BENCH_PGBOSS_BATCH', 1000),
            poolSize: +env('BENCH_PGBOSS_POOL', 10) },
  graphile: { concurrency: +env('BENCH_GRAPHILE_CONCURRENCY', 16),
              localQueue: +env('BENCH_GRAPHILE_LOCAL_QUEUE', 64),
              completeDelay: +env('BENCH_GRAPHILE_COMPLETE_DELAY', 0) },
  pgq: { pollMs: +env('BENCH_PGQ_POLL_MS', 10) },
  dbos: { workers: +env('BENCH_DBOS_WORKERS', 16), pollMs: +env('BENCH_DBOS_POLL_MS', 50),
          queue: env('BENCH_DBOS_QUEUE', '1') === '1', enqueuers: +env('BENCH_DBOS_ENQUEUERS', 1) },
};
const TIMEOUT_MS = 1000 * +env('BENCH_TIMEOUT', 180);
const W2_BUDGET_MS = 1000 * +env('BENCH_W2_BUDGET', 120);
const W10_PRODUCERS = +env('BENCH_W10_PRODUCERS', 16);

const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

// The external worker's lanes: through a pooler when bench.py puts one in front of the server.
const WORKER_CONN = process.env.BENCH_GDEXT_WORKER_PORT
  ? { ...CONN, host: process.env.BENCH_GDEXT_WORKER_HOST, port: parseInt(process.env.BENCH_GDEXT_WORKER_PORT, 10) }
  : CONN;

async function connect(name, where = CONN) {
  const c = new Client({ ...where, application_name: `bench ${SYSTEM} ${name}` });
  // A connection terminated while idle (W9) fails its next query, where the
  // caller handles it; the event alone must not end the process.
  c.on('error', (e) => { if (!c.lost) console.error(`bench ${SYSTEM} ${name}: ${e.message}`); c.lost = true; });
  await c.connect();
  return c;
}

function waitForLine() {
  return new Promise((resolve) => {
    const rl = readline.createInterface({ input: process.stdin });
    rl.once('line', (line) => { rl.close(); resolve(line); });
    rl.once('close', () => resolve(null));
  });
}

const LEDGER_INSERT = 'INSERT INTO bench.peer_ledger (job_id, payload) VALUES ($1, $2::jsonb)';
// W4's child for the peers: its ledger row and the counter, in one statement.
const CHILD_SQL = `WITH l AS (INSERT INTO bench.peer_ledger (job_id, payload) VALUES ($1, $2::jsonb))
                   UPDATE bench.peer_fanout SET remaining = remaining - 1 WHERE parent = $3 RETURNING remaining`;

// Completion notices for W2 (pg-boss, graphile-worker, PgQ have no "await"):
// a trigger on the peer's own job table (or PgQ's ledger, written in the
// transaction that finishes the batch) NOTIFYs bench_done with the job's id.
class DoneListener {
  constructor() { this.waiters = new Map(); this.early = new Set(); }
  async start() {
    this.client = await connect('w2 listener');
    this.client.on('notification', (m) => {
      const w = this.waiters.get(m.payload);
      if (w) { this.waiters.delete(m.payload); w(); } else { this.early.add(m.payload); }
    });
    await this.client.query('LISTEN bench_done');
  }
  wait(id, ms) {
    id = String(id);
    if (this.early.delete(id)) return Promise.resolve(true);
    return new Promise((resolve) => {
      const t = setTimeout(() => { this.waiters.delete(id); resolve(false); }, ms);
      this.waiters.set(id, () => { clearTimeout(t); resolve(true); });
    });
  }
  async stop() { await this.client.end(); }
}

// ---------------------------------------------------------------- gen_durable, external path

class GdExt {
  constructor() { this.stopping = false; this.generation = 0; this.wakers = new Set(); }

  async setup() { /* peers.sql defined the FSMs */ }

  async startWorkers(workload) {
    const k = KNOBS.gdext;
    if (k.oneTransaction && k.stepTransactions) throw new Error('gdext: one transaction, or one per step?');
    if (k.notify) await this.listen();
    this.lanes = [];
    for (let i = 0; i < k.lanes; i++) {
      const lane = { c: await connect(`lane ${i}`, WORKER_CONN) };
      lane.done = workload === 'work' ? Promise.resolve() : this.lane(lane, i, k.batch);
      this.lanes.push(lane);
    }
  }

  // LISTEN gd_work; a lost connection (W9 terminates it) is made again, the lanes woken to look.
  async listen() {
    this.listener = await connect('listener');
    this.listener.on('notification', (m) => {
      if (m.payload === 'ext') this.wakeOne();
    });
    this.listener.on('error', () => {
      if (this.stopping) return;
      setTimeout(() => this.listen().then(() => this.wakeAll(), () => {}), 100);
    });
    await this.listener.query('LISTEN gd_work');
  }

  wakeAll() { this.generation++; for (const w of this.wakers) w(); }

  // One notification wakes one idle lane: waking them all sends every lane
  // to claim the same rows and all but one find nothing.  A lane that comes
  // back with a full batch wakes the next (there may be more).
  wakeOne() {
    this.generation++;
    const [w] = this.wakers;
    if (w) w();
  }

  // W1's work alone, as this worker does it but with no queue: n ledger
  // INSERTs over the lanes, one round trip each, a commit per batch.
  async workAlone(n) {
    const k = KNOBS.gdext;
    let next = 1;
    await Promise.all(this.lanes.map(async ({ c }) => {
      while (next <= n) {
        await c.query('BEGIN');
        for (let i = 0; i < k.batch && next <= n; i++) {
          const id = next++;
          await c.query(LEDGER_INSERT, [id, { n: id }]);
        }
        await c.query('COMMIT');
      }
    }));
  }

  sleepUntilWoken(ms) {
    return new Promise((resolve) => {
      const w = () => { clearTimeout(t); this.wakers.delete(w); resolve(); };
      const t = setTimeout(w, ms);
      this.wakers.add(w);
    });
  }

  // One lane's loop; a lost connection (W9 terminates it) rolls its batch back
  // (the claim is still leased: the lease expires and the reaper hands it
  // on) and the lane goes on with a new one.
  async lane(lane, i, batch) {
    const name = `bench-node-${process.pid}-${i}`;
    while (!this.stopping) {
      try {
        await this.laneRound(lane.c, name, batch);
      } catch (e) {
        if (this.stopping) return;
        lane.c.end().catch(() => {});
        await sleep(100);
        lane.c = await connect(`lane ${i}`, WORKER_CONN).catch(() => lane.c);
      }
    }
  }

  async laneRound(c, name, batch) {
    const k = KNOBS.gdext;
    const gen = this.generation;
    // One transaction: the claim commits with the effects and completions
    // (nothing to lease out: a crash rolls the claim back).  Otherwise the
    // claim commits first and the lease covers the work.
    if (k.oneTransaction) await c.query('BEGIN');
    // Without NOTIFY, a claim that finds nothing waits in the server (1 s, so that a stop is quick).
    const { rows } = await c.query(
      "SELECT id, fsm, step, state, lease_token::text AS token FROM gd_claim('ext', $1, $2, wait => $3::interval)",
      [name, batch, k.notify ? null : '1 second']);
    if (rows.length === 0) {
      if (k.oneTransaction) await c.query('COMMIT');
      if (k.notify && gen === this.generation && !this.stopping) await this.sleepUntilWoken(1000); // poll: a safety net
      return;
    }
    if (k.notify && rows.length === batch) this.wakeOne();
    if (k.stepTransactions) {
      for (const r of rows) {
        await this.call();
        await c.query('BEGIN');
        await this.complete(c, [r], [await this.handle(c, r)]);
        await c.query('COMMIT');
      }
      return;
    }
    // The batch's effects and its completions commit together: a step's
    // effect in this database happens exactly once.
    if (!k.oneTransaction) await c.query('BEGIN');
    const outcomes = [];
    for (const r of rows) {
      await this.call();
      outcomes.push(await this.handle(c, r));
    }
    await this.complete(c, rows, outcomes);
    await c.query('COMMIT');
  }

  call() { return KNOBS.gdext.callMs > 0 ? sleep(KNOBS.gdext.callMs) : null; }

  complete(c, rows, outcomes) {
    return c.query(`SELECT count(*) FROM gd_complete_all($1::bigint[], $2::bigint[], ARRAY(
                      SELECT CASE o.kind WHEN 'done' THEN gd_done(o.arg)
                                         WHEN 'next' THEN gd_next(o.step, o.arg)
                                         WHEN 'spawn' THEN gd_spawn(o.arg, o.step) END
                        FROM unnest($3::text[], $4::text[], $5::jsonb[]) WITH ORDINALITY AS o(kind, step, arg, n)
                       ORDER BY o.n))`, [rows.map((r) => r.id), rows.map((r) => r.token), outcomes.map((o) => o[0]),
      outcomes.map((o) => o[1]), outcomes.map((o) => JSON.stringify(o[2]))]);
  }

  async handle(c, r) {
    switch (`${r.fsm}/${r.step}`) {
      case 'x1/only':
      case 'x4_child/work':
        await c.query(LEDGER_INSERT, [r.id, r.state]);
        return ['done', null, {}];
      case 'x3/a': return ['next', 'b', { ...r.state, a: true }];
      case 'x3/b': return ['next', 'c', { ...r.state, b: true }];
      case 'x3/c':
        await c.query(LEDGER_INSERT, [r.id, r.state]);
        return ['done', null, r.state];
      case 'x4_parent/split': {
        const children = [];
        for (let i = 1; i <= r.state.children; i++) children.push({ fsm: 'x4_child', state: { i } });
        return ['spawn', 'join', children];
      }
      case 'x4_parent/join':
        await c.query(LEDGER_INSERT, [-1, r.state]);
        return ['done', null, {}];
      default: throw new Error(`gdext: no handler for ${r.fsm}/${r.step}`);
    }
  }

  async enqueue(workload, n) {
    const c = await connect('client');
    const fsm = { w1: 'x1', w3: 'x3', w4: 'x4_parent' }[workload];
    const state = workload === 'w4' ? `jsonb_build_object('children', ${n})` : "jsonb_build_object('n', g)";
    const count = workload === 'w4' ? 1 : n;
    // One call for the lot, as the peers' bulk APIs.
    await c.query(`SELECT count(*) FROM gd_insert_all($1, (SELECT jsonb_agg(jsonb_build_object('state', ${state}))
                     FROM generate_series(1, $2::int) g))`, [fsm, count]);
    await c.end();
  }


  async steady(k) {
    this.client = this.client || await connect('client');
    await this.client.query(`SELECT count(*) FROM gd_insert_all('x1', (SELECT jsonb_agg(jsonb_build_object('state',
                               jsonb_build_object('n', g, 't', extract(epoch FROM clock_timestamp()))))
                               FROM generate_series(1, $1::int) g))`, [k]);
  }
  /** W10: one function per producer, each enqueueing one job (its own transaction) on a connection of its own. */
  async producers(count) {
    this.producerConnections = await Promise.all(Array.from({ length: count }, (_, i) => connect(`producer ${i}`)));
    return this.producerConnections.map((c) => (n) => c.query(
      "SELECT gd_insert('x1', jsonb_build_object('n', $1::int, 't', extract(epoch FROM clock_timestamp())))", [n]));
  }

  async closeProducers() { for (const c of this.producerConnections) await c.end(); }

  async w2(n) {
    const c = await connect('w2 client');
    const run = async (i) => {
      const { rows } = await c.query('SELECT gd_insert($1, $2::jsonb) AS id', ['x1', { n: i }]);
      const r = await c.query("SELECT status FROM gd_await($1, '5s')", [rows[0].id]);
      return r.rows[0].status === 'done';
    };
    const res = await latencyLoop(n, run);
    await c.end();
    return res;
  }

  async stopWorkers() {
    this.stopping = true;
    for (const w of [...this.wakers]) w();
    for (const l of this.lanes) { await l.done; await l.c.end().catch(() => {}); }
    if (this.listener) await this.listener.end();
  }
}

// ---------------------------------------------------------------- pg-boss

class PgBossPeer {
  constructor() {
    const PgBoss = require('pg-boss');
    this.boss = new PgBoss({ ...CONN, application_name: 'bench pgboss', max: 10 });
    this.boss.on('error', (e) => console.error(`pg-boss error: ${e.message}`));
    this.pool = new Pool({ ...CONN, application_name: 'bench pgboss handlers', max: KNOBS.pgboss.poolSize });
    this.workerIds = [];
  }

  static QUEUES = ['w1', 'w2', 'w3a', 'w3b', 'w3c', 'w4parent', 'w4child', 'w4final'];

  async setup() {
    await this.boss.start();
    for (const q of PgBossPeer.QUEUES) {
      if (!(await this.boss.getQueue(q))) await this.boss.createQueue(q);
    }
  }

  async startWorkers(workload) {
    await this.boss.start();
    const k = KNOBS.pgboss;
    const queues = { w1: ['w1'], w2: ['w2'], w3: ['w3a', 'w3b', 'w3c'], w4: ['w4parent', 'w4child', 'w4final'] }[workload];
    for (const q of queues) {
      for (let i = 0; i < k.workers; i++) {
        // A batch handler; each job's effect in its own statement, run
        // concurrently on the handlers' pool; pg-boss completes the batch.
        const id = await this.boss.work(q, { batchSize: k.batch, pollingIntervalSeconds: 0.5 },
          (jobs) => Promise.all(jobs.map((job) => this.handle(q, job))));
        this.workerIds.push(id);
      }
    }
  }

  async handle(q, job) {
    switch (q) {
      case 'w1': case 'w2': case 'w3c':
        await this.pool.query(LEDGER_INSERT, [job.data.n, job.data]);
        return;
      case 'w3a': await this.boss.send('w3b', { ...job.data, a: true }); return;
      case 'w3b': await this.boss.send('w3c', { ...job.data, b: true }); return;
      case 'w4parent': {
        await this.pool.query('INSERT INTO bench.peer_fanout VALUES ($1, $2)', [job.id, job.data.children]);
        const children = [];
        for (let i = 1; i <= job.data.children; i++) children.push({ name: 'w4child', data: { parent: job.id, i } });
        await this.boss.insert(children);
        return;
      }
      case 'w4child': {
        const { rows } = await this.pool.query(CHILD_SQL, [job.data.i, job.data, job.data.parent]);
        if (rows[0].remaining === 0) await this.boss.send('w4final', { parent: job.data.parent });
        return;
      }
      case 'w4final': await this.pool.query(LEDGER_INSERT, [-1, job.data]); return;
      default: throw new Error(`pgboss: no handler for ${q}`);
    }
  }

  async enqueue(workload, n, startAfter) {
    if (workload === 'w4') { await this.boss.send('w4parent', { children: n }); return; }
    const name = { w1: 'w1', w3: 'w3a', backlog: 'w1' }[workload];
    const jobs = [];
    for (let i = 1; i <= n; i++) jobs.push(startAfter ? { name, data: { n: -i }, startAfter } : { name, data: { n: i } });
    await this.boss.insert(jobs);
  }

  async steady(k) {
    const t = Date.now() / 1000, jobs = [];
    for (let i = 1; i <= k; i++) jobs.push({ name: 'w1', data: { n: i, t } });
    await this.boss.insert(jobs);
  }

  async producers(count) {
    const PgBoss = require('pg-boss');
    this.producer = new PgBoss({ ...CONN, application_name: 'bench pgboss producer', max: count,
                                 supervise: false, schedule: false });
    this.producer.on('error', (e) => console.error(`pg-boss producer error: ${e.message}`));
    await this.producer.start();
    return Array.from({ length: count }, () => (n) => this.producer.send('w1', { n, t: Date.now() / 1000 }));
  }

  async closeProducers() { await this.producer.stop({ graceful: false, wait: true }); }

  async w2(n) {
    const listener = new DoneListener();
    await listener.start();
    await this.pool.query(`CREATE OR REPLACE FUNCTION bench.pgboss_done() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN PERFORM pg_notify('bench_done', NEW.id::text); RETURN NULL; END $$`);
    await this.pool.query(`CREATE TRIGGER bench_done AFTER UPDATE ON pgboss.job FOR EACH ROW
        WHEN (NEW.name = 'w2' AND NEW.state = 'completed' AND OLD.state <> 'completed') EXECUTE FUNCTION bench.pgboss_done()`);
    try {
      return await latencyLoop(n, async (i) => {
        const id = await this.boss.send('w2', { n: i });
        // pg-boss polls (0.5 s at the least); its own way to skip the wait
        // is notifyWorker, for a worker in the sending process.
        for (const w of this.workerIds) this.boss.notifyWorker(w);
        return listener.wait(id, 5000);
      });
    } finally {
      await this.pool.query('DROP TRIGGER bench_done ON pgboss.job');
      await listener.stop();
    }
  }

  async stopWorkers() {
    await this.boss.stop({ graceful: true, wait: true, timeout: 15000 });
    await this.pool.end();
  }
}

// ---------------------------------------------------------------- graphile-worker

class GraphilePeer {
  constructor() {
    this.gw = require('graphile-worker');
    this.pool = new Pool({ ...CONN, application_name: 'bench graphile', max: KNOBS.graphile.concurrency + 4 });
    this.pool.on('error', (e) => console.error(`graphile pool: ${e.message}`));
  }

  async setup() {
    const utils = await this.gw.makeWorkerUtils({ pgPool: this.pool });
    await utils.migrate();
    await utils.release();
  }

  taskList() {
    const ledger = (helpers, jobId, data) => helpers.query(LEDGER_INSERT, [jobId, data]);
    return {
      w1: async (p, h) => { await ledger(h, p.n, p); },
      w2: async (p, h) => { await ledger(h, p.n, p); },
      w3a: async (p, h) => { await h.addJob('w3b', { ...p, a: true }); },
      w3b: async (p, h) => { await h.addJob('w3c', { ...p, b: true }); },
      w3c: async (p, h) => { await ledger(h, p.n, p); },
      w4parent: async (p, h) => {
        const parent = String(h.job.id);
        await h.query('INSERT INTO bench.peer_fanout VALUES ($1, $2)', [parent, p.children]);
        const specs = [];
        for (let i = 1; i <= p.children; i++) specs.push({ identifier: 'w4child', payload: { parent, i } });
        await h.addJobs(specs);
      },
      w4child: async (p, h) => {
        const { rows } = await h.query(CHILD_SQL, [p.i, p, p.parent]);
        if (rows[0].remaining === 0) await h.addJob('w4final', { parent: p.parent });
      },
      w4final: async (p, h) => { await ledger(h, -1, p); },
    };
  }

  async startWorkers() {
    const k = KNOBS.graphile;
    this.runner = await this.gw.run({
      pgPool: this.pool,
      concurrency: k.concurrency,
      noHandleSignals: true,
      pollInterval: +env('BENCH_GRAPHILE_POLL_MS', 2000),
      taskList: this.taskList(),
      logger: new this.gw.Logger(() => (level, message) => { if (level === 'error') console.error(message); }),
      preset: { worker: {
        localQueue: k.localQueue > 1 ? { size: k.localQueue } : undefined,
        completeJobBatchDelay: k.completeDelay,
        failJobBatchDelay: k.completeDelay,
      } },
    });
    this.utils = await this.gw.makeWorkerUtils({ pgPool: this.pool });
  }

  async enqueue(workload, n, runAt) {
    if (workload === 'w4') { await this.utils.addJob('w4parent', { children: n }); return; }
    const identifier = { w1: 'w1', w3: 'w3a', backlog: 'w1' }[workload];
    const specs = [];
    for (let i = 1; i <= n; i++) specs.push(runAt ? { identifier, payload: { n: -i }, runAt } : { identifier, payload: { n: i } });
    await this.utils.addJobs(specs);
  }

  async steady(k) {
    const t = Date.now() / 1000, specs = [];
    for (let i = 1; i <= k; i++) specs.push({ identifier: 'w1', payload: { n: i, t } });
    await this.utils.addJobs(specs);
  }

  async producers(count) {
    this.producerPool = new Pool({ ...CONN, application_name: 'bench graphile producer', max: count });
    this.producerUtils = await this.gw.makeWorkerUtils({ pgPool: this.producerPool });
    return Array.from({ length: count }, () => (n) => this.producerUtils.addJob('w1', { n, t: Date.now() / 1000 }));
  }

  async closeProducers() { await this.producerUtils.release(); await this.producerPool.end(); }

  async w2(n) {
    const listener = new DoneListener();
    await listener.start();
    await this.pool.query(`CREATE OR REPLACE FUNCTION bench.graphile_done() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN PERFORM pg_notify('bench_done', OLD.id::text); RETURN NULL; END $$`);
    await this.pool.query(`CREATE TRIGGER bench_done AFTER DELETE ON graphile_worker._private_jobs
        FOR EACH ROW EXECUTE FUNCTION bench.graphile_done()`);
    try {
      return await latencyLoop(n, async (i) => {
        const job = await this.utils.addJob('w2', { n: i });
        return listener.wait(job.id, 5000);
      });
    } finally {
      await this.pool.query('DROP TRIGGER bench_done ON graphile_worker._private_jobs');
      await listener.stop();
    }
  }

  async stopWorkers() {
    await this.runner.stop();
    if (this.utils) await this.utils.release();
    await this.pool.end();
  }
}

// ---------------------------------------------------------------- PgQ

class PgqPeer {
  async setup() { /* peers.sql created the queue */ }

  async startWorkers() {
    this.consumer = await connect('consumer');
    await this.consumer.query('UPDATE bench.pgq_control SET stop = false');
    const name = `bench_${process.pid}`;
    this.done = this.consumer.query('CALL bench.pgq_consume($1, $2)', [name, KNOBS.pgq.pollMs]);
    this.done.catch(() => {});
    this.client = await connect('client');
    for (;;) {  // ready once the consumer is registered (it reads events after that)
      const { rows } = await this.client.query(
        'SELECT 1 FROM pgq.get_consumer_info() WHERE queue_name = $1 AND consumer_name = $2', ['bench', name]);
      if (rows.length) break;
      await sleep(20);
    }
  }

  async enqueue(workload, n) {
    const c = this.client || await connect('client');
    if (workload === 'w4') {
      await c.query("SELECT pgq.insert_event('bench', 'w4parent', jsonb_build_object('children', $1::int)::text)", [n]);
    } else if (workload === 'backlog') {
      // W5: a consumer that lags (registered, never reads) keeps these events
      // in the queue's tables; W1's consumer registers after them.
      await c.query("SELECT pgq.register_consumer('bench', 'laggard')");
      for (let done = 0; done < n; done += 50000) {
        await c.query("SELECT count(pgq.insert_event('bench', 'w1', jsonb_build_object('n', -g)::text)) FROM generate_series($1::int, $2::int) g",
          [done + 1, Math.min(n, done + 50000)]);
      }
      await c.query("SELECT pgq.force_tick('bench')");
    } else {
      const type = { w1: 'w1', w3: 'w3a' }[workload];
      await c.query('BEGIN');
      await c.query("SELECT count(pgq.insert_event('bench', $1, jsonb_build_object('n', g)::text)) FROM generate_series(1, $2::int) g", [type, n]);
      await c.query('COMMIT');
    }
    if (!this.client) await c.end();
  }

  async steady(k) {
    await this.client.query("SELECT count(pgq.insert_event('bench', 'w1', jsonb_build_object('n', g, 't', extract(epoch FROM clock_timestamp()))::text)) FROM generate_series(1, $1::int) g", [k]);
  }

  async w2(n) {
    const listener = new DoneListener();
    await listener.start();
    await this.client.query(`CREATE OR REPLACE FUNCTION bench.pgq_done() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN PERFORM pg_notify('bench_done', NEW.job_id::text); RETURN NULL; END $$`);
    await this.client.query(`CREATE TRIGGER bench_done AFTER INSERT ON bench.peer_ledger
        FOR EACH ROW EXECUTE FUNCTION bench.pgq_done()`);
    try {
      return await latencyLoop(n, async (i) => {
        const { rows } = await this.client.query(
          "SELECT pgq.insert_event('bench', 'w1', jsonb_build_object('n', $1::int)::text) AS id", [i]);
        return listener.wait(rows[0].id, 5000);
      });
    } finally {
      await this.client.query('DROP TRIGGER bench_done ON bench.peer_ledger');
      await listener.stop();
    }
  }

  async stopWorkers() {
    await this.client.query('UPDATE bench.pgq_control SET stop = true');
    await this.done;
    await this.client.query('UPDATE bench.pgq_control SET stop = false');
    await this.consumer.end();
    await this.client.end();
  }
}

// ---------------------------------------------------------------- DBOS

// DBOS Transact: durable workflows run in this process, each step
// checkpointed in its system database (bench_dbos, on the same server; DBOS
// creates it).  W1 and W3 are workflows enqueued on a DBOS queue (one
// startWorkflow each: DBOS has no bulk enqueue), W4 a parent workflow that
// starts its children as child workflows and awaits them, W2 one workflow
// started and awaited.  A ledger INSERT is a DBOS step on a pg pool (a plain
// step: its effect is at least once, not in the checkpoint's transaction).
class DbosPeer {
  enqueuesOneByOne = true;

  constructor() {
    ({ DBOS: this.DBOS } = require('@dbos-inc/dbos-sdk'));
    // Connections: as many as the queue runs workflows at once, within the server's max_connections.
    this.connections = Math.min(KNOBS.dbos.workers + 2, 40);
    this.pool = new Pool({ ...CONN, application_name: 'bench dbos handlers', max: this.connections });
  }

  async setup() { await this.start(); }

  async start() {
    const { DBOS } = this;
    const ledger = (jobId, payload) => DBOS.runStep(() => this.pool.query(LEDGER_INSERT, [jobId, payload]),
      { name: 'ledger' });
    this.job = DBOS.registerWorkflow(async (state) => { await ledger(state.n, state); }, { name: 'job' });
    this.chain = DBOS.registerWorkflow(async (state) => {
      const a = await DBOS.runStep(async () => ({ ...state, a: true }), { name: 'a' });
      const b = await DBOS.runStep(async () => ({ ...a, b: true }), { name: 'b' });
      await ledger(b.n, b);
    }, { name: 'chain' });
    this.child = DBOS.registerWorkflow(async (state) => { await ledger(state.i, state); }, { name: 'child' });
    this.parent = DBOS.registerWorkflow(async (state) => {
      const handles = [];
      for (let i = 1; i <= state.children; i++) handles.push(await DBOS.startWorkflow(this.child)({ i }));
      for (const h of handles) await h.getResult();
      await ledger(-1, state);
    }, { name: 'parent' });
    DBOS.setConfig({
      name: 'bench',
      systemDatabaseUrl: `postgresql://postgres@localhost/bench_dbos?host=${encodeURIComponent(CONN.host)}&port=${CONN.port}`,
      systemDatabasePoolSize: this.connections + 6,
      logLevel: 'error',
    });
    await DBOS.launch();
    this.queue = await DBOS.registerQueue('bench', { workerConcurrency: KNOBS.dbos.workers,
                                                     minPollingIntervalMs: KNOBS.dbos.pollMs });
  }

  async startWorkers() { await this.start(); }

  // Workflows go through the queue (its concurrency and polling: BENCH_DBOS_WORKERS, BENCH_DBOS_POLL_MS), or
  // start at once in this process (BENCH_DBOS_QUEUE=0).
  get startOptions() { return KNOBS.dbos.queue ? { queueName: 'bench' } : {}; }

  async enqueue(workload, n) {
    const { DBOS } = this;
    if (workload === 'w4') { await DBOS.startWorkflow(this.parent, this.startOptions)({ children: n }); return; }
    const wf = { w1: this.job, w3: this.chain }[workload];
    // No bulk call: BENCH_DBOS_ENQUEUERS calls in flight at once, each starting the next job.
    let started = 0;
    const enqueuer = async () => {
      while (started < n) await DBOS.startWorkflow(wf, this.startOptions)({ n: ++started });
    };
    await Promise.all(Array.from({ length: KNOBS.dbos.enqueuers }, enqueuer));
  }

  async steady(k) {
    const t = Date.now() / 1000;
    for (let i = 1; i <= k; i++) await this.DBOS.startWorkflow(this.job, this.startOptions)({ n: i, t });
  }

  async w2(n) {
    return latencyLoop(n, async (i) => {
      const h = await this.DBOS.startWorkflow(this.job)({ n: i });
      await h.getResult();
      return true;
    });
  }

  async stopWorkers() {
    await this.DBOS.shutdown();
    await this.pool.end();
  }
}

// ---------------------------------------------------------------- workloads

async function latencyLoop(n, one) {
  for (let i = 0; i < 20; i++) await one(-1 - i);  // warm the connections and plans
  const ms = [];
  let lost = 0;
  const started = nowMs();
  for (let i = 1; i <= n; i++) {
    const t0 = nowMs();
    const ok = await one(i);
    ms.push(nowMs() - t0);
    if (!ok) lost++;
    if (nowMs() - started > W2_BUDGET_MS) break;
  }
  return { latencies_ms: ms, lost, stopped_early: ms.length < n };
}

async function waitLedger(c, sql, target) {
  const deadline = nowMs() + TIMEOUT_MS;
  for (;;) {
    const { rows } = await c.query(sql);
    const got = parseInt(rows[0].n, 10);
    if (got >= target || nowMs() > deadline) return got;
    await sleep(100);
  }
}

async function main() {
  const peer = { gdext: GdExt, pgboss: PgBossPeer, graphile: GraphilePeer, pgq: PgqPeer, dbos: DbosPeer }[SYSTEM];
  if (!peer) throw new Error(`unknown system ${SYSTEM}`);
  if (WORKLOAD === 'work' && SYSTEM !== 'gdext') throw new Error('the work-alone run is gdext\'s');
  const p = new peer();
  if (WORKLOAD === 'setup') {
    await p.setup();
    if (SYSTEM === 'pgboss') await p.boss.stop({ graceful: false, wait: true });
    if (SYSTEM === 'dbos') await p.stopWorkers();
    out({ setup: SYSTEM });
    return;
  }
  if (WORKLOAD === 'backlog') {
    out({ ready: true });
    await waitForLine();
    const t0 = nowMs();
    const later = new Date(Date.now() + 86400e3);
    if (SYSTEM === 'pgboss') {
      await p.boss.start();
      for (let done = 0; done < N; done += 50000) await p.enqueue('backlog', Math.min(50000, N - done), later.toISOString());
      await p.boss.stop({ graceful: false, wait: true });
    } else if (SYSTEM === 'graphile') {
      p.utils = await p.gw.makeWorkerUtils({ pgPool: p.pool });
      for (let done = 0; done < N; done += 50000) await p.enqueue('backlog', Math.min(50000, N - done), later);
      await p.utils.release();
      await p.pool.end();
    } else if (SYSTEM === 'pgq') {
      await p.enqueue('backlog', N);
    } else {
      throw new Error(`backlog: ${SYSTEM} is prepared by bench.py`);
    }
    out({ backlog: N, seconds: (nowMs() - t0) / 1000 });
    return;
  }

  if (WORKLOAD === 'steady') {
    await p.startWorkers('w1');
    if (SYSTEM === 'graphile') p.utils = await p.gw.makeWorkerUtils({ pgPool: p.pool });
    out({ ready: true, knobs: KNOBS[SYSTEM], pid: process.pid });
    const rl = readline.createInterface({ input: process.stdin });
    for await (const line of rl) {
      if (line === 'stop') break;
      await p.steady(parseInt(line, 10));
      out({ enqueued: parseInt(line, 10) });
    }
    if (p.client && SYSTEM === 'gdext') await p.client.end();
    await p.stopWorkers();
    return;
  }
  if (WORKLOAD === 'producers') {
    await p.startWorkers('w1');
    const producers = await p.producers(W10_PRODUCERS);
    const probe = await connect('probe');
    out({ ready: true, knobs: KNOBS[SYSTEM], pid: process.pid });
    await waitForLine();
    const { rows } = await probe.query('SELECT clock_timestamp() AS t');
    const ms = [];
    let produced = 0;
    const end = nowMs() + N * 1000;
    await Promise.all(producers.map(async (produce) => {
      while (nowMs() < end) {
        const t0 = nowMs();
        await produce(++produced);
        ms.push(nowMs() - t0);
      }
    }));
    const got = await waitLedger(probe, 'SELECT count(*) AS n FROM bench.peer_ledger', produced);
    out({ result: { produced, started_at: rows[0].t.toISOString(), commit_ms: ms, ledger: got } });
    await waitForLine();
    await probe.end();
    await p.closeProducers();
    await p.stopWorkers();
    return;
  }
  await p.startWorkers(WORKLOAD === 'w2' ? 'w2' : WORKLOAD);
  const probe = await connect('probe');
  out({ ready: true, knobs: KNOBS[SYSTEM], pid: process.pid });
  await waitForLine();

  let result;
  if (WORKLOAD === 'w2') {
    result = await p.w2(N);
  } else {
    const serverNow = async () => (await probe.query('SELECT clock_timestamp() AS t')).rows[0].t.toISOString();
    const t0 = nowMs();
    let enqueuedAt;
    if (WORKLOAD === 'work') {  // no queue: timed from the start of the work itself
      enqueuedAt = await serverNow();
      await p.workAlone(N);
    } else {
      // Timed from the enqueue's end, as the bulk calls commit at once; one
      // without a bulk call is timed from its start (its workers run meanwhile).
      const startedAt = await serverNow();
      await p.enqueue(WORKLOAD, N);
      enqueuedAt = p.enqueuesOneByOne ? startedAt : await serverNow();
    }
    const enqueueS = (nowMs() - t0) / 1000;
    let got;
    if (WORKLOAD === 'w4') {
      got = await waitLedger(probe, 'SELECT count(*) AS n FROM bench.peer_ledger WHERE job_id = -1', 1);
    } else {
      got = await waitLedger(probe, 'SELECT count(*) AS n FROM bench.peer_ledger', N);
    }
    result = { enqueue_s: enqueueS, enqueued_at: enqueuedAt, ledger: got,
               complete: WORKLOAD === 'w4' ? got >= 1 : got >= N };
  }
  out({ result, cpu: process.cpuUsage() });
  await waitForLine();  // bench.py reads the CPU of our connections' backends first
  await probe.end();
  await p.stopWorkers();
}

main().then(() => process.exit(0), (e) => { console.error(`peers.js ${SYSTEM} ${WORKLOAD}: ${e.stack || e}`); process.exit(1); });
