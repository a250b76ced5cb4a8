'use strict';
/**
 * An external worker: runs the external steps (handler => NULL) of one or
 * more queues, as the Python client's Worker does (read its README for the
 * why of each rule):
 *
 *  - `concurrency` lanes, each with its own connection, claim up to `batch`
 *    steps at a time (round robin over `queues`) of the FSMs it has
 *    handlers for (gd_claim(fsms => ...): another FSM's steps on its queues,
 *    or a grant to its role, never come its way) and run their handlers one
 *    after another, outside any transaction: a step's transaction begins at
 *    its handler's first query through ctx.connection and commits with its
 *    outcome (gd_complete in it), exactly once; the steps that wrote nothing
 *    are completed together (gd_complete_all); a raising handler is a
 *    failed attempt, its writes undone; a lost lease rolls that step's
 *    writes back;
 *  - a lane with no work waits for it in the server: its claim of its home
 *    queue (lane i: queues[i % queues.length]) waits up to `wait` seconds
 *    for work of that queue to commit (gd_claim(wait => ...)), one
 *    statement, so it works through a transaction pooler; no LISTEN, no
 *    poll; stop() cancels the waiting claims;
 *  - a heartbeat extends every claim in hand every third of `lease`;
 *  - lost connections are opened again with backoff;
 *  - a step past its deadline (its timeout: the engine ends the claim
 *    there) is left behind: ctx.signal aborts, its writes are rolled back,
 *    ctx.connection refuses it, the lane goes on;
 *  - stop() (SIGTERM, SIGINT) drains: the step in hand finishes (within
 *    drainTimeout seconds, or is left behind and handed back), the rest of
 *    its batch goes back (gd_release), run() resolves;
 *  - the API's functions are called in the extension's schema, looked up
 *    once per connection, or in `apiSchema` if given;
 *  - with @opentelemetry/api installed, each step runs in a span
 *    (tracing.js): a child of its instance's trace context, with the
 *    instance, FSM, step, attempt and outcome; on `tracer` if given, else
 *    the global tracer provider's.
 *
 * A batch step's handler, registered with step(fsm, step, handler,
 * { batch: true }), is handler(states, ctxs) -> [outcome, ...]: called once
 * for the claims of its step that one claim brought (up to the worker's
 * `batch`), one outcome per claim in their order; the contexts share one
 * ctx.connection, whose transaction commits with every outcome of the
 * batch, and one ctx.signal; its deadline is its earliest claim's.  A throw,
 * another number of outcomes or a non-outcome among them is a failed attempt
 * of each.  A single claim is run as a group of one.
 */
const os = require('os');
const pg = require('pg');
const { connect, toId } = require('./client');
const { isOutcome, retry, interval } = require('./outcomes');
const { statements, apiSchemaOption, SQL } = require('./sql');
const { workerTracer, startStepSpan, endStepSpan, engineKind, inContext } = require('./tracing');

const INVALID_PARAMETER_VALUE = '22023';
const IN_FAILED_SQL_TRANSACTION = '25P02';
const QUERY_CANCELED = '57014';

// What became of a step whose handler did not end in time (Worker.call).
const OVERRAN = Symbol('overran');
const ABANDONED = Symbol('abandoned');
// The error a handler threw, on the failed attempt's outcome (for its span; not sent).
const THROWN = Symbol('thrown');

/**
 * ctx.connection: the lane's client, the handler's while its step runs.  The
 * handler runs outside any transaction: its first query through it begins
 * the step's transaction (BEGIN goes first: a client runs its queries in
 * order), which the lane ends with the step's outcome.  Ending the client is
 * the lane's.  Once the step has ended without its handler (past its
 * deadline, or the drain's limit: `abort`) the lane has moved on, and the
 * handler can no longer query it.
 */
function stepConnection(client) {
  const controller = new AbortController();
  let running = 0;
  let began = false;
  const query = (...args) => {
    if (controller.signal.aborted) {
      return Promise.reject(new Error('gen_durable: this step has ended (past its deadline, or its worker stopped): ' +
        "its connection is no longer the handler's"));
    }
    if (!began) {
      began = true;
      client.query('BEGIN').catch(() => {}); // a failure fails the handler's query too
    }
    const result = client.query(...args);
    if (result && typeof result.then === 'function') {
      running++;
      const settled = () => { running--; };
      result.then(settled, settled);
    }
    return result;
  };
  const theLanes = (name) => () => {
    throw new Error(`gen_durable: ${name}() is the worker's: the step's writes commit with its outcome`);
  };
  const connection = new Proxy(client, {
    get(target, property) {
      if (property === 'query') return query;
      if (property === 'end' || property === 'release') return theLanes(property);
      const value = Reflect.get(target, property, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  return {
    connection,
    signal: controller.signal,
    abort: (reason) => controller.abort(reason),
    busy: () => running > 0,
    began: () => began,
  };
}

/** Waits between reconnect attempts: doubling from `first` up to `most` seconds, with jitter. */
class Backoff {
  constructor(first = 0.5, most = 30) { this.first = first; this.most = most; this.next = first; }
  delay() { const d = this.next * (0.5 + Math.random() / 2); this.next = Math.min(this.next * 2, this.most); return d; }
  reset() { this.next = this.first; }
}

const quietLog = { info() {}, warn: (m) => console.warn(m) };

class Worker {
  constructor(config = {}, {
    handlers = {}, queues = null, concurrency = 1, batch = 10, lease = 30, wait = 5, name = null,
    pooler = null, apiSchema = null, drainTimeout = 30, log = quietLog, tracer = null,
  } = {}) {
    if (concurrency < 1 || batch < 1) throw new RangeError('concurrency and batch must be at least 1');
    if (!(wait > 0 && wait <= 3600)) throw new RangeError('wait must be between 0 and 3600 seconds');
    Object.assign(this, { config, queues, concurrency, batch, lease, wait, pooler, drainTimeout, log });
    this.apiSchema = apiSchemaOption(apiSchema);
    this.tracer = workerTracer(tracer);
    this.name = name ?? `${os.hostname()}:${process.pid}`;
    this.handlers = new Map(Object.entries(handlers)); // 'fsm/step' -> handler
    this.batched = new Set(); // the 'fsm/step' whose handler takes a batch: (states, ctxs) -> outcomes
    this.stopping = false;
    this.waitingClaims = new Set(); // of the lanes whose claim waits in the server: {client, cancelled}
    this.inHand = new Map(); // claim id -> lease token
    this.sleepers = new Set();
    this.abandoners = new Set(); // of the handlers running: each called at the drain's limit
    this.drainTimer = null;
  }

  /** Run `handler(state, ctx)` for `step` of `fsm` (with `batch`: `handler(states, ctxs)` for the claims of the
   *  step that one claim brought, returning one outcome per claim); returns the worker. */
  step(fsm, step, handler, { batch = false } = {}) {
    const key = `${fsm}/${step}`;
    this.handlers.set(key, handler);
    if (batch) this.batched.add(key);
    else this.batched.delete(key);
    return this;
  }

  handlerOf(claim) { return this.handlers.get(`${claim.fsm}/${claim.step}`); }

  /** Does the claim's handler take a batch (an array of states and one of contexts)? */
  takesBatch(claim) { return this.batched.has(`${claim.fsm}/${claim.step}`); }

  /** [fsm, step] of each handler. */
  steps() { return [...this.handlers.keys()].map((k) => k.split('/')); }

  /** The FSMs it has handlers for: the only ones it claims steps of. */
  fsms() { return [...new Set(this.steps().map(([fsm]) => fsm))].sort(); }

  /** Drain and stop: no new claims; the batches in hand finish, their handlers within drainTimeout seconds. */
  stop() {
    if (!this.stopping) {
      this.drainTimer = setTimeout(() => { for (const abandon of this.abandoners) abandon(ABANDONED); },
        this.drainTimeout * 1000);
      this.drainTimer.unref();
    }
    this.stopping = true;
    for (const waiting of this.waitingClaims) if (!waiting.cancelled) waiting.cancelled = cancelStatement(waiting.client);
    for (const wake of this.sleepers) wake();
  }

  /** Serve until stop(); resolves once every lane has finished its batch. */
  async run({ signals = true } = {}) {
    if (this.handlers.size === 0) throw new Error('the worker has no handlers');
    const onSignal = () => this.stop();
    if (signals) { process.on('SIGTERM', onSignal); process.on('SIGINT', onSignal); }
    try {
      await this.resolveQueues();
      const heartbeat = this.heartbeat();
      this.log.info(`worker ${this.name} serving queues ${this.queues.join(', ')} with ${this.concurrency} lanes`);
      await Promise.all(Array.from({ length: this.concurrency }, (_, i) => this.lane(i)));
      this.stop();
      await heartbeat;
      this.log.info(`worker ${this.name} stopped`);
    } finally {
      clearTimeout(this.drainTimer);
      if (signals) { process.off('SIGTERM', onSignal); process.off('SIGINT', onSignal); }
    }
  }

  /** The statements that call the API on this connection (in `apiSchema` if given). */
  sql(client) {
    return statements(client, this.apiSchema);
  }

  connect(config = this.config) {
    return connect(config, { pooler: this.pooler, applicationName: `gd worker ${this.name}` });
  }

  async resolveQueues() {
    if (this.queues && this.queues.length) return;
    const steps = this.steps();
    const { client } = await this.connect();
    try {
      const { rows } = await client.query(SQL.queuesOfSteps, [steps.map((s) => s[0]), steps.map((s) => s[1])]);
      this.queues = rows.map((r) => r.queue);
    } finally {
      await client.end();
    }
    if (!this.queues.length) throw new Error(`none of the steps ${[...this.handlers.keys()]} is defined: give the worker its queues`);
  }

  /** Sleep unless stopping (stop() cuts it short). */
  sleep(seconds) {
    return new Promise((resolve) => {
      if (this.stopping) return resolve();
      const wake = () => { clearTimeout(timer); this.sleepers.delete(wake); resolve(); };
      const timer = setTimeout(wake, seconds * 1000);
      this.sleepers.add(wake);
    });
  }

  /** Run `body(client)` on a connection, reopened with backoff whenever it breaks, until stopping. */
  async connected(what, body) {
    const backoff = new Backoff();
    while (!this.stopping) {
      let client = null;
      try {
        ({ client } = await this.connect());
        backoff.reset();
        await body(client);
      } catch (e) {
        const delay = backoff.delay();
        this.log.warn(`worker ${this.name} ${what}: ${e.message}; reconnecting in ${delay.toFixed(1)} s`);
        await this.sleep(delay);
      } finally {
        if (client) await client.end().catch(() => {});
      }
    }
  }

  lane(index) {
    const home = this.queues[index % this.queues.length];
    return this.connected(`lane ${index}`, async (client) => {
      while (!this.stopping) await this.claimAndRun(client, home);
    });
  }

  /** Claim a batch from the first of the queues that has work, the lane's home queue last, its claim
   *  waiting in the server for work there; run it. */
  async claimAndRun(client, home) {
    const { claim } = await this.sql(client);
    const fsms = this.fsms();
    const start = this.queues.indexOf(home);
    for (let offset = 1; offset <= this.queues.length; offset++) {
      const queue = this.queues[(start + offset) % this.queues.length];
      const parameters = [queue, this.name, this.batch, interval(this.lease), fsms];
      const rows = queue === home ? await this.waitingClaim(client, claim, parameters)
        : (await client.query(claim, [...parameters, null])).rows;
      if (rows.length) {
        await this.runBatch(client, rows.map((r) => claimFrom(r, client)));
        return;
      }
    }
  }

  /** gd_claim, waiting up to `wait` seconds in the server for work; stop() cancels it (no rows then). */
  async waitingClaim(client, claim, parameters) {
    const waiting = { client, cancelled: null };
    this.waitingClaims.add(waiting);
    try {
      if (this.stopping) return [];
      return (await client.query(claim, [...parameters, interval(this.wait)])).rows;
    } catch (e) {
      if (waiting.cancelled && e.code === QUERY_CANCELED) return [];
      throw e;
    } finally {
      this.waitingClaims.delete(waiting);
      // The server has the cancel before the lane's next statement, which it would cancel instead.
      if (waiting.cancelled) await waiting.cancelled;
    }
  }

  async runBatch(client, claims) {
    for (const c of claims) this.inHand.set(c.id, c.token);
    const handled = claims.filter((c) => this.handlerOf(c));
    const unhandled = claims.filter((c) => !this.handlerOf(c));
    try {
      if (handled.length) await this.runAndComplete(client, handled);
      if (unhandled.length) {
        await this.release(client, unhandled, 'this worker has no handler for them');
        await this.sleep(this.wait);
      }
    } finally {
      for (const c of claims) this.inHand.delete(c.id);
    }
  }

  /**
   * Run the batch's handlers one after another, outside any transaction.  A
   * group whose handler began its transaction is completed in it at once;
   * the others together at the end, in one statement.  Draining: the claims
   * not run yet go back.
   */
  async runAndComplete(client, batch) {
    const groups = this.groups(batch);
    const ran = [];
    const outcomes = [];
    let next = 0;
    while (next < groups.length && !this.stopping) {
      const group = groups[next];
      const step = stepConnection(client);
      const groupOutcomes = await this.traced(group, () => this.call(client, group, step));
      if (groupOutcomes === ABANDONED) break; // goes back with the rest
      next++;
      if (groupOutcomes === OVERRAN) continue;
      if (step.began()) await this.completeInStepTransaction(client, group, groupOutcomes);
      else { ran.push(...group); outcomes.push(...groupOutcomes); }
    }
    if (ran.length) this.noteLostLeases(ran, await this.complete(client, ran, outcomes));
    await this.release(client, groups.slice(next).flat(), 'the worker is stopping');
  }

  /** The claims as their handlers are called, in their order: each alone, but those of a step whose handler
   *  takes a batch together, where the first of them is (one call for them). */
  groups(claims) {
    const grouped = [];
    const batches = new Map();
    for (const claim of claims) {
      const key = `${claim.fsm}/${claim.step}`;
      if (!this.takesBatch(claim)) grouped.push([claim]);
      else if (batches.has(key)) batches.get(key).push(claim);
      else {
        batches.set(key, [claim]);
        grouped.push(batches.get(key));
      }
    }
    return grouped;
  }

  /** Call the handler of a group of claims of one step (one, or a batch handler's) with their contexts: what it
   *  returned, as an array for one claim. */
  async callGroup(group, contexts) {
    const handler = this.handlerOf(group[0]);
    return this.takesBatch(group[0])
      ? handler(group.map((c) => c.state), contexts) : [await handler(group[0].state, contexts[0])];
  }

  /** callGroup's result when it is one outcome per claim; else null. */
  static outcomesOf(returned, group) {
    return Array.isArray(returned) && returned.length === group.length && returned.every(isOutcome) ? returned : null;
  }

  /** A failed attempt of each claim of a group whose handler returned something else than its outcomes. */
  notOutcomes(returned, group, worker) {
    return group.map(() => notAnOutcome(this.takesBatch(group[0]) ? returned : returned[0], worker));
  }

  /**
   * Run the handler of a group of claims of one step: one claim, or the
   * claims of a step whose handler takes a batch, called once with their
   * states and contexts (one ctx.connection, one ctx.signal).  Their
   * outcomes, in order (when it throws, or returns something else than one
   * outcome per claim: a failed attempt of each, its transaction rolled
   * back); OVERRAN when the group's deadline (its earliest claim's) passed
   * first (its writes undone, not completed: the engine ends the claims at
   * their deadlines and retries the steps); ABANDONED when the drain's limit
   * passed first (its writes undone, handed back).  Either way ctx.signal
   * aborts, and the handler can no longer query ctx.connection.
   */
  async call(client, group, step) {
    const deadlineOf = (c) => (c.deadline === null ? Infinity : c.deadline);
    const first = group.reduce((earliest, c) => (deadlineOf(c) < deadlineOf(earliest) ? c : earliest));
    const ids = group.map((c) => c.id).join(', ');
    const what = `${group.length > 1 ? 'instances' : 'instance'} ${ids} step ${first.step}`;
    const left = deadlineOf(first) - performance.now();
    if (left <= 0) {
      this.log.warn(`${what} was past its deadline before its handler started`);
      return OVERRAN;
    }
    let timer = null;
    let cutShort;
    const ended = new Promise((resolve) => {
      cutShort = resolve;
      if (left !== Infinity) timer = setTimeout(() => resolve(OVERRAN), left);
    });
    this.abandoners.add(cutShort); // resolved with ABANDONED at the drain's limit
    const contexts = group.map((c) => ({ ...c.ctx, signal: step.signal, connection: step.connection }));
    const handling = Promise.resolve().then(() => this.callGroup(group, contexts));
    let outcomes;
    try {
      outcomes = await Promise.race([handling, ended]);
    } catch (e) {
      await this.rollBack(client, step);
      this.log.info(`${what} raised ${e}`);
      return group.map(() => failedAttempt(e, this.name));
    } finally {
      clearTimeout(timer);
      this.abandoners.delete(cutShort);
    }
    if (outcomes === OVERRAN || outcomes === ABANDONED) {
      const why = outcomes === OVERRAN ? 'ran past its deadline' : "was still running at the drain's limit";
      step.abort(new Error(`gen_durable: ${what} ${why}`));
      handling.catch(() => {}); // no longer awaited
      if (step.busy()) {
        // Its query still runs on the lane's connection: nothing can be rolled back there until it
        // ends.  The connection is closed (the batch's other outcomes are lost with it: their claims
        // run again after their leases), the lane reconnects.
        client.connection.stream.destroy();
        throw new Error(`${what} ${why} while its query ran; the lane reconnects`);
      }
      await this.rollBack(client, step);
      this.log.warn(`${what} ${why}` + (outcomes === OVERRAN ? '; the engine retries it' : '; it is handed back'));
      return outcomes;
    }
    if (Worker.outcomesOf(outcomes, group)) return outcomes;
    await this.rollBack(client, step);
    return this.notOutcomes(outcomes, group, this.name);
  }

  /** Run a group of claims (`run`: Worker.call) in a span per claim, each ending with what became of its claim;
   *  the handler runs in the first one's context. */
  async traced(group, run) {
    if (this.tracer === null) return run();
    const spans = group.map((c) => startStepSpan(this.tracer, { ...c.ctx, worker: this.name }));
    let outcomes;
    try {
      outcomes = await inContext(spans[0].context, run);
    } catch (e) {
      for (const { span } of spans) endStepSpan(span, 'lost', e); // its lane reconnects: the leases expire
      throw e;
    }
    spans.forEach(({ span }, i) => {
      if (outcomes === OVERRAN) endStepSpan(span, 'retry', { message: 'the step ran past its deadline' });
      else if (outcomes === ABANDONED) endStepSpan(span, 'released', null);
      else endStepSpan(span, engineKind(outcomes[i]), outcomes[i][THROWN] ?? outcomes[i].error ?? null); // retry's, stop's
    });
    return outcomes;
  }

  async rollBack(client, step) {
    if (step.began()) await client.query('ROLLBACK');
  }

  /**
   * Complete a group in the transaction its handler began, and commit: its
   * writes with every outcome of the group, or none.  An outcome the engine
   * refuses, or a transaction a failed query of the handler's aborted:
   * rolled back, and a failed attempt of each.  A lost lease (a step runs
   * elsewhere): rolled back, none completed.
   */
  async completeInStepTransaction(client, group, outcomes) {
    let completed = [];
    let failure = null;
    try {
      for (let i = 0; i < group.length; i++) completed.push(await this.completeOne(client, group[i], outcomes[i]));
      const all = completed.every(Boolean);
      await client.query(all ? 'COMMIT' : 'ROLLBACK');
      if (!all) completed = group.map(() => false);
    } catch (e) {
      if (e.code === INVALID_PARAMETER_VALUE) failure = retry({ message: e.message, worker: this.name });
      else if (e.code === IN_FAILED_SQL_TRANSACTION) {
        failure = retry({ message: 'a query of the handler failed and its transaction was aborted', worker: this.name });
      } else throw e;
    }
    if (failure) {
      await client.query('ROLLBACK');
      completed = await this.complete(client, group, group.map(() => failure));
    }
    this.noteLostLeases(group, completed);
  }

  noteLostLeases(claims, completed) {
    const lost = claims.filter((c, i) => !completed[i]).map((c) => c.id);
    if (lost.length) {
      this.log.warn(`worker ${this.name}: the leases of instances ${lost.join(', ')} were lost (reclaimed: the ` +
        'steps run again); their outcomes and writes were not kept');
    }
  }

  /** All in one statement; when an outcome is refused, one by one, a refused one as a failed attempt. */
  async complete(client, claims, outcomes) {
    try {
      const { rows } = await client.query((await this.sql(client)).completeAll,
        [claims.map((c) => c.id), claims.map((c) => c.token), outcomes.map((o) => JSON.stringify(o))]);
      return rows.map((r) => r.completed);
    } catch (e) {
      if (e.code !== INVALID_PARAMETER_VALUE) throw e;
    }
    const completed = [];
    for (let i = 0; i < claims.length; i++) {
      try {
        completed.push(await this.completeOne(client, claims[i], outcomes[i]));
      } catch (e) {
        if (e.code !== INVALID_PARAMETER_VALUE) throw e;
        completed.push(await this.completeOne(client, claims[i], retry({ message: e.message, worker: this.name })));
      }
    }
    return completed;
  }

  async completeOne(client, claim, outcome) {
    const { complete } = await this.sql(client);
    const { rows } = await client.query(complete, [claim.id, claim.token, JSON.stringify(outcome)]);
    return rows[0].completed;
  }

  async release(client, claims, why) {
    const { release } = await this.sql(client);
    for (const c of claims) await client.query(release, [c.id, c.token]);
    if (claims.length) {
      this.log.warn(`worker ${this.name} released ${claims.length} claims (${why}): ` +
        claims.map((c) => `${c.fsm}/${c.step} #${c.id}`).join(', '));
    }
  }

  heartbeat() {
    return this.connected('heartbeat', async (client) => {
      while (!this.stopping) {
        await this.sleep(Math.max(this.lease / 3, 0.05));
        for (const [id, token] of [...this.inHand]) {
          const { rows } = await client.query((await this.sql(client)).heartbeat, [id, token, interval(this.lease)]);
          if (!rows[0].kept) this.inHand.delete(id); // lost: so will its completion be
        }
      }
    });
  }
}

/**
 * Cancel the statement `client` runs (a waiting claim).  Resolves once the
 * server has closed the cancel request's connection: it has signalled the
 * backend, which ignores a cancel that finds it between statements.
 */
function cancelStatement(client) {
  return new Promise((resolve) => {
    const connection = new pg.Connection();
    connection.on('connect', () => connection.cancel(client.processID, client.secretKey));
    connection.on('end', resolve);
    connection.on('error', resolve);
    if (client.host && client.host.startsWith('/')) connection.connect(`${client.host}/.s.PGSQL.${client.port}`);
    else connection.connect(client.port, client.host);
  });
}

/** A handler threw: the attempt failed, as when an in-database handler raises. */
function failedAttempt(error, worker) {
  const outcome = retry({ message: String(error.message ?? error), type: error.name ?? typeof error, worker });
  return Object.defineProperty(outcome, THROWN, { value: error instanceof Error ? error : new Error(String(error)) });
}

function notAnOutcome(value, worker) {
  return retry({ message: `the handler returned ${JSON.stringify(value)}, not an outcome`, worker });
}

function claimFrom(row, client) {
  const c = row.ctx;
  return {
    id: toId(row.id), fsm: row.fsm, version: row.version, step: row.step, state: row.state, token: row.token,
    // The step's deadline on this process's monotonic clock (null: none).
    deadline: row.secondsLeft === null ? null : performance.now() + row.secondsLeft * 1000,
    ctx: {
      id: toId(c.id), fsm: c.fsm, version: c.version, step: c.step, attempt: c.attempt,
      correlationKey: c.correlation_key ?? null, signals: c.signals ?? [], children: c.children ?? [],
      timedOut: Boolean(c.timed_out), queue: c.queue, traceContext: c.trace_context ?? null,
      idempotencyKey: c.idempotency_key, deadline: c.deadline ? new Date(c.deadline) : null,
      cancelled: c.cancelled ?? null, connection: client,
    },
  };
}

module.exports = { Worker, Backoff, claimFrom, failedAttempt, notAnOutcome };
