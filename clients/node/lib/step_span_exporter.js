'use strict';
/**
 * StepSpanExporter: the spans of the in-database steps, made from the step
 * history (gd.step_history: FSM versions defined with history => true) with
 * their real start and end, each a child of its instance's trace context,
 * as the worker makes them for external steps (tracing.js) — whose rows it
 * skips, since their worker made their spans.  It hands them to an
 * OpenTelemetry SpanExporter (OTLPTraceExporter, InMemorySpanExporter, ...).
 *
 * What it has sent: a checkpoint per exporter name, the (ended_at,
 * instance_id) of the last row sent, in a table of the database (created if
 * missing), moved in the transaction that read the rows and only once the
 * SpanExporter reported them sent: a failed export, or a crash before the
 * commit, sends them again (at least once, never skipped).
 *
 * Why a row is never passed over: rows are read in (ended_at, instance_id)
 * order, and only those that ended before every transaction still open in
 * the database began (pg_stat_activity, read first in the transaction, so
 * before the rows' snapshot).  A step's row is written in its own
 * transaction and ends after it began, so a row not committed yet always
 * ends after that bound: every row below it is in the snapshot, and none
 * can later appear below the checkpoint.  This needs pg_stat_activity's
 * xact_start of every role's sessions: a member of pg_read_all_stats (or
 * pg_monitor).  An open transaction holds the export back, it loses nothing.
 */
const { connect } = require('./client');
const { openTelemetry, startStepSpan, endStepSpan } = require('./tracing');

const SUCCESS = 0; // @opentelemetry/core's ExportResultCode.SUCCESS
const LOCK_NOT_AVAILABLE = '55P03';

const SQL = {
  mayReadAllStats: "SELECT pg_has_role('pg_read_all_stats', 'USAGE') AS granted",
  createCheckpoints: (table) => `CREATE TABLE IF NOT EXISTS ${table} (
    exporter    text PRIMARY KEY,
    ended_at    timestamptz NOT NULL, -- the last step sent: when it ended,
    instance_id bigint NOT NULL       -- and its instance
  )`,
  startCheckpoint: (table) => `INSERT INTO ${table} VALUES ($1, $2, 0) ON CONFLICT (exporter) DO NOTHING`,
  checkpoint: (table) => `SELECT ended_at::text, instance_id FROM ${table} WHERE exporter = $1 FOR UPDATE NOWAIT`,
  bound: `SELECT least(clock_timestamp(), min(xact_start))::text AS bound FROM pg_stat_activity
           WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database())`,
  // The in-database steps (a handler) that ended after the checkpoint and before the bound (not the
  // history's rows of repairs: gd_rewind, gd_fork and gd_migrate ran no step).
  steps: `SELECT h.instance_id AS id, i.fsm, i.version, h.step, h.attempt, h.kind, h.error, h.worker,
                 i.trace_context AS "traceContext", h.ended_at::text AS "endedAt",
                 (extract(epoch FROM h.started_at) * 1000000)::bigint::text AS "startedUs",
                 (extract(epoch FROM h.ended_at) * 1000000)::bigint::text AS "endedUs"
            FROM gd.step_history h
            JOIN gd.instances i ON i.id = h.instance_id
            JOIN gd.steps s ON (s.fsm, s.version, s.step) = (i.fsm, i.version, h.step)
           WHERE s.handler IS NOT NULL AND h.kind NOT IN ('rewind', 'fork', 'migrate')
             AND (h.ended_at, h.instance_id) > ($1::timestamptz, $2::bigint) AND h.ended_at < $3::timestamptz
           ORDER BY h.ended_at, h.instance_id
           LIMIT $4`,
  advance: (table) => `UPDATE ${table} SET ended_at = $2, instance_id = $3 WHERE exporter = $1`,
};

/** A table name, maybe schema-qualified ("schema.table"), quoted. */
function quotedName(name) {
  return name.split('.').map((part) => `"${part.replace(/"/g, '""')}"`).join('.');
}

/** Microseconds since the epoch (text) as OpenTelemetry's HrTime: [seconds, nanoseconds]. */
function hrTime(microseconds) {
  const us = BigInt(microseconds);
  return [Number(us / 1000000n), Number(us % 1000000n) * 1000];
}

class StepSpanExporter {
  /**
   * `config`: the database (a connection string or pg's options); `spanExporter`: where the spans go;
   * `name`: this exporter's checkpoint; `since`: where a new checkpoint starts (default: now);
   * `pageSize`: spans per export; `interval`: seconds between rounds of run(); `checkpointTable`: where
   * the checkpoints are kept; `resource`: the spans' (an OpenTelemetry Resource: the service's name).
   */
  constructor(config, {
    spanExporter, name = 'default', since = new Date(), pageSize = 500, interval = 5,
    checkpointTable = 'gd_trace_checkpoints', resource = null, log = { info() {}, warn: (m) => console.warn(m) },
  } = {}) {
    if (!spanExporter) throw new TypeError('a spanExporter is required');
    if (!(pageSize >= 1)) throw new RangeError('pageSize must be at least 1');
    openTelemetry('StepSpanExporter');
    // The spans are made by an SDK tracer whose ended spans this exporter collects, to hand them to the
    // SpanExporter itself: a provider's processors would not tell whether they were sent.
    const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
    this.ended = [];
    const collect = {
      onStart() {}, onEnd: (span) => this.ended.push(span), forceFlush: async () => {}, shutdown: async () => {},
    };
    this.tracer = new BasicTracerProvider({ spanProcessors: [collect], ...(resource ? { resource } : {}) })
      .getTracer('gen-durable step history');
    Object.assign(this, { config, spanExporter, name, since, pageSize, interval, log });
    this.table = quotedName(checkpointTable);
    this.client = null;
    this.stopping = false;
    this.wake = null;
  }

  async connection() {
    if (this.client !== null) return this.client;
    const { client } = await connect(this.config, { applicationName: `gd trace exporter ${this.name}` });
    try {
      if (!(await client.query(SQL.mayReadAllStats)).rows[0].granted) {
        throw new Error('the trace exporter\'s role must be a member of pg_read_all_stats (or pg_monitor): it reads ' +
          "the start of every session's transaction, not to pass over a step's row");
      }
      await client.query(SQL.createCheckpoints(this.table));
      await client.query(SQL.startCheckpoint(this.table), [this.name, this.since]);
    } catch (e) {
      await client.end().catch(() => {});
      throw e;
    }
    this.client = client;
    return client;
  }

  /** Send the spans of the steps that ended since the last call (a page of them at most); returns how many. */
  async exportOnce() {
    const client = await this.connection();
    try {
      await client.query('BEGIN');
      let checkpoint;
      try {
        [checkpoint] = (await client.query(SQL.checkpoint(this.table), [this.name])).rows;
      } catch (e) {
        if (e.code === LOCK_NOT_AVAILABLE) throw new Error(`another trace exporter named ${this.name} is running`);
        throw e;
      }
      const [{ bound }] = (await client.query(SQL.bound)).rows;
      const { rows } = await client.query(SQL.steps,
        [checkpoint.ended_at, checkpoint.instance_id, bound, this.pageSize]);
      if (rows.length > 0) {
        for (const row of rows) this.record(row);
        // Spans not sampled (their trace's flags say so) were not recorded, and are not sent.
        await this.send(this.ended.splice(0));
        const last = rows[rows.length - 1];
        await client.query(SQL.advance(this.table), [this.name, last.endedAt, last.id]);
      }
      await client.query('COMMIT');
      return rows.length;
    } catch (e) {
      // The connection is closed (its transaction with it) and opened again next time.
      this.client = null;
      await client.end().catch(() => {});
      throw e;
    }
  }

  /** A step's span, with its real start and end, into this.ended. */
  record(row) {
    const { span } = startStepSpan(this.tracer, { ...row, id: Number(row.id) }, hrTime(row.startedUs));
    endStepSpan(span, row.kind, row.error, hrTime(row.endedUs));
  }

  send(spans) {
    if (spans.length === 0) return Promise.resolve();
    return new Promise((resolve, reject) => {
      this.spanExporter.export(spans, (result) => {
        if (result.code === SUCCESS) resolve();
        else reject(result.error ?? new Error('the span exporter failed to send the spans'));
      });
    });
  }

  /** Export every `interval` seconds (at once while a page was full) until stop(); then close(). */
  async run() {
    while (!this.stopping) {
      let sent = 0;
      try {
        sent = await this.exportOnce();
      } catch (e) {
        this.log.warn(`trace exporter ${this.name}: ${e.message}`);
      }
      if (sent < this.pageSize) {
        await new Promise((resolve) => {
          this.wake = resolve;
          setTimeout(resolve, this.interval * 1000).unref();
        });
      }
    }
    await this.close();
  }

  /** End its connection and shut the SpanExporter down. */
  async close() {
    if (this.client !== null) await this.client.end().catch(() => {});
    this.client = null;
    await this.spanExporter.shutdown();
  }

  stop() {
    this.stopping = true;
    if (this.wake) this.wake();
  }
}

module.exports = { StepSpanExporter };
