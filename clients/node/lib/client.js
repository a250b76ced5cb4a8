'use strict';
/**
 * The API from Node.js: one statement per call (so it goes through a
 * transaction pooler), on a connection of its own or on your pg.Client,
 * inside your transaction if you opened one.
 */
const pg = require('pg');
const { interval, insertEntry } = require('./outcomes');
const { statements, apiSchemaOption, SQL } = require('./sql');

const INSERT_OPTIONS = ['step', 'queue', 'priority', 'concurrencyKey', 'correlationKey', 'correlationScope',
  'rateLimit', 'weight', 'eligibleAt', 'scheduleIn', 'onDuplicate', 'traceContext', 'debounce', 'throttle',
  'onThrottle', 'fairnessKey'];

/** gd_insert's parameters, in order, the defaults where `options` says nothing. */
function insertParameters(fsm, state, options) {
  const unknown = Object.keys(options).filter((k) => !INSERT_OPTIONS.includes(k));
  if (unknown.length) throw new TypeError(`unknown insert options: ${unknown.join(', ')}`);
  const o = { priority: 0, weight: 1, onDuplicate: 'error', onThrottle: 'drop', ...options };
  return [fsm, JSON.stringify(state ?? {}), o.step ?? null, o.queue ?? null, o.priority, o.concurrencyKey ?? null,
    o.correlationKey ?? null, o.correlationScope ?? null, o.rateLimit ?? null, o.weight, o.eligibleAt ?? null,
    interval(o.scheduleIn) ?? null, o.onDuplicate, o.traceContext ?? null, interval(o.debounce) ?? null,
    interval(o.throttle) ?? null, o.onThrottle, o.fairnessKey ?? null];
}

/** A pooler (or another proxy) sits between us when the server does not listen on the port reached. */
function behindPooler(reachedPort, serverPort) {
  return reachedPort != null && String(reachedPort) !== String(serverPort);
}

/** A connected pg.Client, and whether a pooler is in between (asked, or seen). */
async function connect(config = {}, { pooler, applicationName } = {}) {
  const options = typeof config === 'string' ? { connectionString: config } : { ...config };
  if (applicationName) options.application_name = applicationName;
  const client = new pg.Client(options);
  client.on('error', () => {}); // a broken connection fails its next query, where the caller sees it
  await client.connect();
  if (pooler == null) {
    const { rows } = await client.query(SQL.serverPort);
    pooler = behindPooler(client.port, rows[0].port);
  }
  return { client, pooler };
}

const toId = (value) => (value == null ? value : Number(value));
const jsonOrNull = (value) => (value == null ? null : JSON.stringify(value));

function instanceFrom(row) {
  return {
    id: toId(row.id), fsm: row.fsm, version: row.version, step: row.step, status: row.status, state: row.state,
    attempt: row.attempt, result: row.result, error: row.error, correlationKey: row.correlation_key,
    queue: row.queue, parentId: toId(row.parent_id), createdAt: row.created_at, updatedAt: row.updated_at,
    finishedAt: row.finished_at,
  };
}

class Client {
  /**
   * Client.connect(config) opens a connection, Client.pool(config) a pool of them; new
   * Client(pgClientOrPool) uses yours as it is.
   * `apiSchema` names the schema of the API's functions (a PL/Proxy router's, which has no
   * extension); by default it is the extension's, looked up.
   */
  constructor(client, { own = false, apiSchema = null } = {}) {
    this.client = client;
    this.own = own;
    this.apiSchema = apiSchemaOption(apiSchema);
  }

  static async connect(config = {}, { pooler, apiSchema = null } = {}) {
    apiSchemaOption(apiSchema); // a bad one fails before a connection is opened
    return new Client((await connect(config, { pooler })).client, { own: true, apiSchema });
  }

  /**
   * A client over a pool of connections (pg.Pool, `max` of them): for an HTTP
   * server, whose requests call the API at once — a gd_await holds one
   * connection, not the others.  Each call is one statement, on whichever
   * connection is free; for an insert in your own transaction, use one of
   * the pool's clients: new Client(await pool.connect()).
   */
  static pool(config = {}, { max = 10, apiSchema = null } = {}) {
    apiSchemaOption(apiSchema);
    const options = typeof config === 'string' ? { connectionString: config } : { ...config };
    const pool = new pg.Pool({ ...options, max });
    pool.on('error', () => {}); // an idle connection that broke is dropped; the next call opens another
    return new Client(pool, { own: true, apiSchema });
  }

  async end() {
    if (this.own) await this.client.end();
  }

  /** The statements that call the API on this connection. */
  sql() {
    return statements(this.client, this.apiSchema);
  }

  async one(sql, parameters) {
    const { rows } = await this.client.query(sql, parameters);
    return rows[0];
  }

  /** gd_insert: the new instance's id (or the pending one a debounced insert joined), or null when
   * onDuplicate: 'skip' skipped it or onThrottle: 'drop' dropped it. */
  async insert(fsm, state = {}, options = {}) {
    return toId((await this.one((await this.sql()).insert, insertParameters(fsm, state, options))).id);
  }

  /** gd_insert_all: one instance per insert option object (insert's, less onDuplicate), in one statement. */
  async insertAll(fsm, entries) {
    const { rows } = await this.client.query((await this.sql()).insertAll,
      [fsm, JSON.stringify([...entries].map(insertEntry))]);
    return rows.map((r) => toId(r.id));
  }

  /** gd_signal: false for a duplicate dedupKey; null with missingOk when the target is not live;
   * not consumed after `expires` seconds. */
  async signal(target, name, payload = {}, { dedupKey = null, missingOk = false, expires = null } = {}) {
    const sql = await this.sql();
    const statement = typeof target === 'string' ? sql.signalByKey : sql.signalById;
    return (await this.one(statement,
      [target, name, JSON.stringify(payload), dedupKey, missingOk, interval(expires) ?? null])).sent;
  }

  /** gd_await: { status, step, attempt, result, error } once the instance settles (or ends: until 'terminal'). */
  async wait(id, { timeout = 5, until = 'settled' } = {}) {
    return this.one((await this.sql()).await, [id, interval(timeout), until]);
  }

  async cancel(id, reason = null) {
    return (await this.one((await this.sql()).cancel, [id, reason])).changed;
  }

  async retry(id) {
    return (await this.one((await this.sql()).retry, [id])).changed;
  }

  /** gd_rewind: a failed or stuck live instance back to `step` of its version, with `state` (else its own);
   * false when it is done or cancelled (fork it), or not one you may use.  Needs the FSM owner's rights. */
  async rewind(id, step, { state = null } = {}) {
    return (await this.one((await this.sql()).rewind, [id, step, jsonOrNull(state)])).changed;
  }

  /** gd_fork: the id of a new instance started at the step of entry `entry` (its number in gd_history) of
   * instance `id`'s step history, with the state that step started with, or `state`. */
  async fork(id, entry, { state = null } = {}) {
    return toId((await this.one((await this.sql()).fork, [id, entry, jsonOrNull(state)])).id);
  }

  /** gd_migrate: how many live instances of `fsm` moved from one version to another, each to the step
   * `stepMap` ({old: new}) names for its step (else one of the same name); all or none. */
  async migrate(fsm, fromVersion, toVersion, stepMap = {}) {
    return (await this.one((await this.sql()).migrate,
      [fsm, fromVersion, toVersion, JSON.stringify(stepMap ?? {})])).moved;
  }

  /** The instance's row of gd.instances, or null (none, or not one you may use). */
  async get(id) {
    const row = await this.one(SQL.get, [id]);
    return row ? instanceFrom(row) : null;
  }

  /** gd_drain, for tests: run your FSMs' runnable in-database steps of `queue` here, until none is left. */
  async drain(queue, { withScheduled = false, maxSteps = 1000 } = {}) {
    return (await this.one((await this.sql()).drain, [queue, withScheduled, maxSteps])).ran;
  }
}

module.exports = { Client, connect, behindPooler, toId };
