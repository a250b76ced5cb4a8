'use strict';
// Traces: every step a span under the caller's trace — the worker's around
// its handlers, StepSpanExporter's for the in-database steps from the step
// history — into the SDK's in-memory exporter: parentage, timing and
// attributes of a 3-step FSM with a child and an external step; the
// exporter's checkpoint (nothing sent twice, a failed export sent again);
// no span for a repair's row (a gd_rewind's).
const { test } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('crypto');
const http = require('http');
const { SpanKind, SpanStatusCode } = require('@opentelemetry/api');
const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { Client, Worker, StepSpanExporter, nextStep } = require('..');
const { DSN, scope, running, captureLog } = require('./support');

/** order: reserve (SQL: spawns an audit, then charge) -> charge (external) -> ship (SQL: done); audit: check (SQL). */
async function setup(t) {
  const s = await scope();
  const order = s.name('order');
  const audit = s.name('audit');
  await s.db.query(`
    CREATE FUNCTION reserve_${s.tag}(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
      SELECT pg_sleep(0.01); SELECT gd_spawn('[{"fsm": "${audit}"}]', 'charge') $$;
    CREATE FUNCTION check_${s.tag}(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
      SELECT pg_sleep(0.01); SELECT gd_done('{"ok": true}') $$;
    CREATE FUNCTION ship_${s.tag}(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
      SELECT gd_done() $$`);
  const define = (fsm, initial, steps) => s.db.query('SELECT gd_define_fsm($1, $2, $3, steps => $4, history => true)',
    [fsm, initial, s.queue, JSON.stringify(steps)]);
  await define(audit, 'check', { check: { handler: `public.check_${s.tag}(jsonb, gd.context)` } });
  await define(order, 'reserve', {
    reserve: { handler: `public.reserve_${s.tag}(jsonb, gd.context)` },
    charge: { backoff: '0s', backoff_jitter: false },
    ship: { handler: `public.ship_${s.tag}(jsonb, gd.context)` },
  });
  const client = await Client.connect(DSN);
  const memory = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(memory)] });
  const traceId = crypto.randomBytes(16).toString('hex');
  const callerSpanId = crypto.randomBytes(8).toString('hex');
  const exporter = (options = {}) => new StepSpanExporter(DSN, {
    spanExporter: memory, name: s.name('exporter'), since: new Date(Date.now() - 60000), log: captureLog(), ...options,
  });
  t.after(async () => {
    await s.db.query(`DROP TABLE IF EXISTS gd_trace_checkpoints_${s.tag}`);
    await client.end();
    await s.end();
  });
  return {
    s, order, audit, client, memory, provider, traceId, callerSpanId, exporter,
    traceparent: `00-${traceId}-${callerSpanId}-01`,
    /** This test's spans, in order of their start. */
    spans: () => memory.getFinishedSpans().filter((span) => span.spanContext().traceId === traceId)
      .sort((a, b) => micros(a.startTime) - micros(b.startTime)),
  };
}

const micros = ([seconds, nanos]) => seconds * 1e6 + Math.round(nanos / 1000);

/** Run the order through: drain, the worker (charge fails once, then goes on), drain. */
async function runOrder({ s, order, client, provider, traceparent }) {
  const id = await client.insert(order, {}, { traceContext: traceparent });
  await client.drain(s.queue); // reserve, the audit's check, and the order resumes at charge
  const worker = new Worker(DSN, {
    queues: [s.queue], wait: 0.5, name: s.name('worker'), log: captureLog(), tracer: provider.getTracer('test'),
    handlers: {
      [`${order}/charge`]: async (state, ctx) => {
        if (ctx.attempt === 1) throw new Error('the card was declined');
        return nextStep('ship');
      },
    },
  });
  await running(worker, () => s.until(async () => (await s.status(id)).step === 'ship', 'charge'));
  await client.drain(s.queue);
  assert.equal((await s.status(id)).status, 'done');
  return id;
}

/** Export until `count` spans of the trace are in, at most 20 s (an open transaction holds the export back). */
async function exportUntil(exporter, spans, count) {
  const deadline = Date.now() + 20000;
  while (spans().length < count && Date.now() < deadline) {
    await exporter.exportOnce();
    if (spans().length < count) await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

test('every step a span under the caller\'s trace, with its instance, FSM, step, attempt and outcome', async (t) => {
  const setting = await setup(t);
  const { s, order, audit, spans, traceId, callerSpanId } = setting;
  const exporter = setting.exporter({ checkpointTable: `gd_trace_checkpoints_${s.tag}` });
  const id = await runOrder(setting);
  await exportUntil(exporter, spans, 5);

  const all = spans();
  assert.deepEqual(all.map((span) => [span.name, span.attributes['gen_durable.attempt'],
    span.attributes['gen_durable.outcome']]), [
    [`gen_durable step ${order}.reserve`, 1, 'spawn'],
    [`gen_durable step ${audit}.check`, 1, 'done'],
    [`gen_durable step ${order}.charge`, 1, 'retry'],
    [`gen_durable step ${order}.charge`, 2, 'next'],
    [`gen_durable step ${order}.ship`, 1, 'done'],
  ]);
  const { rows: [child] } = await s.db.query('SELECT id::int FROM gd.instances WHERE parent_id = $1', [id]);
  for (const span of all) {
    const step = span.attributes['gen_durable.step'];
    assert.equal(span.parentSpanContext.traceId, traceId, `${step}: in the caller's trace`);
    assert.equal(span.parentSpanContext.spanId, callerSpanId, `${step}: a child of the caller's span`);
    assert.equal(span.kind, SpanKind.CONSUMER);
    assert.equal(span.attributes['gen_durable.instance_id'], step === 'check' ? child.id : id);
    assert.equal(span.attributes['gen_durable.fsm'], step === 'check' ? audit : order);
    assert.equal(span.attributes['gen_durable.fsm_version'], 1);
    assert.ok(micros(span.startTime) < micros(span.endTime), `${step}: starts before it ends`);
  }
  for (let i = 1; i < all.length; i++) {
    assert.ok(micros(all[i - 1].endTime) <= micros(all[i].startTime),
      `${all[i - 1].name} ends before ${all[i].name} starts`);
  }
  // The worker's spans around its handler; the in-database steps' with the history's times.
  const [reserve, check, declined, charged, ship] = all;
  assert.equal(declined.attributes['gen_durable.worker'], s.name('worker'));
  assert.equal(charged.attributes['gen_durable.worker'], s.name('worker'));
  assert.equal(declined.status.code, SpanStatusCode.ERROR);
  assert.equal(declined.status.message, 'the card was declined');
  assert.deepEqual(declined.events.map((e) => [e.name, e.attributes['exception.message']]),
    [['exception', 'the card was declined']]);
  assert.equal(charged.status.code, SpanStatusCode.UNSET);
  const { rows: history } = await s.db.query(`
    SELECT h.instance_id::int AS id, h.step, h.worker,
           (extract(epoch FROM h.started_at) * 1000000)::bigint::text AS started,
           (extract(epoch FROM h.ended_at) * 1000000)::bigint::text AS ended
      FROM gd.step_history h WHERE h.instance_id IN ($1, $2) AND h.step <> 'charge' ORDER BY h.ended_at`,
  [id, child.id]);
  assert.deepEqual([reserve, check, ship].map((span) => [span.attributes['gen_durable.instance_id'],
    span.attributes['gen_durable.step'], span.attributes['gen_durable.worker'],
    String(micros(span.startTime)), String(micros(span.endTime))]),
  history.map((h) => [h.id, h.step, h.worker, h.started, h.ended]));
  assert.match(reserve.attributes['gen_durable.worker'], /^backend \(pid \d+\)$/, 'gd_drain ran it');
  await exporter.close();
});

test('the exporter\'s checkpoint: nothing sent twice, a failed export sent again, one exporter of a name', async (t) => {
  const setting = await setup(t);
  const { s, memory, spans } = setting;
  const table = `gd_trace_checkpoints_${s.tag}`;
  const failing = { export: (batch, done) => done({ code: 1, error: new Error('the collector is down') }), shutdown: async () => {} };
  const down = setting.exporter({ checkpointTable: table, spanExporter: failing });
  await runOrder(setting);
  await assert.rejects(down.exportOnce(), /the collector is down/);

  const exporter = setting.exporter({ checkpointTable: table, pageSize: 1 });
  await exportUntil(exporter, spans, 5); // two from the worker, three from the history, one a page
  assert.equal(spans().length, 5, 'what failed was sent again');
  const { rows: [checkpoint] } = await s.db.query(`SELECT instance_id::int FROM ${table} WHERE exporter = $1`,
    [s.name('exporter')]);
  assert.ok(checkpoint.instance_id > 0, 'the checkpoint moved');

  // Another exporter of that name, while one holds the checkpoint: refused; after a restart, nothing again.
  await s.db.query('BEGIN');
  await s.db.query(`SELECT FROM ${table} WHERE exporter = $1 FOR UPDATE`, [s.name('exporter')]);
  await assert.rejects(setting.exporter({ checkpointTable: table }).exportOnce(), /another trace exporter named/);
  await s.db.query('COMMIT');
  const restarted = setting.exporter({ checkpointTable: table });
  for (let round = 0; round < 3; round++) await restarted.exportOnce();
  assert.equal(spans().length, 5, 'nothing sent twice');
  assert.equal(memory.getFinishedSpans().filter((span) => span.attributes['gen_durable.fsm'] === setting.order).length, 4);
  for (const e of [down, exporter, restarted]) await e.close();
});

test('a step whose transaction commits late is not passed over', async (t) => {
  const setting = await setup(t);
  const { s, audit, client, traceparent, spans } = setting;
  const exporter = setting.exporter({ checkpointTable: `gd_trace_checkpoints_${s.tag}` });
  const late = await client.insert(audit, {}, { traceContext: traceparent });
  const open = await require('./support').admin();
  t.after(() => open.end());
  await open.query('BEGIN');
  await open.query('SELECT gd_drain($1)', [s.queue]); // its check ran, not committed yet
  const early = await client.insert(audit, {}, { traceContext: traceparent });
  assert.equal(await client.drain(s.queue), 1); // committed, and ended after the late one
  await exporter.exportOnce();
  assert.deepEqual(spans(), [], 'held back while a transaction that began before it is open');
  await open.query('COMMIT');
  await exportUntil(exporter, spans, 2);
  assert.deepEqual(spans().map((span) => span.attributes['gen_durable.instance_id']), [late, early]);
  await exporter.close();
});

test('a repair\'s row of the step history makes no span: a gd_rewind\'s, to a step of SQL', async (t) => {
  const setting = await setup(t);
  const { s, order, client, traceparent, spans } = setting;
  const exporter = setting.exporter({ checkpointTable: `gd_trace_checkpoints_${s.tag}` });
  const id = await client.insert(order, {}, { traceContext: traceparent });
  await client.drain(s.queue); // reserve, the audit's check; the order waits at charge for a worker
  assert.equal(await client.rewind(id, 'ship'), true);
  await client.drain(s.queue);
  assert.equal((await s.status(id)).status, 'done');
  const { rows: history } = await s.db.query('SELECT step, kind FROM gd_history($1) ORDER BY entry', [id]);
  assert.deepEqual(history.map((h) => `${h.step} ${h.kind}`), ['reserve spawn', 'ship rewind', 'ship done']);
  await exportUntil(exporter, spans, 3);
  await exporter.exportOnce(); // the rewind's row, if it made one, would come by now
  assert.deepEqual(spans().map((span) => [span.attributes['gen_durable.step'], span.attributes['gen_durable.outcome']]),
    [['reserve', 'spawn'], ['check', 'done'], ['ship', 'done']]);
  await exporter.close();
});

test('over OTLP (HTTP, JSON) to a collector: the in-database steps\' spans, under the caller\'s span', async (t) => {
  const setting = await setup(t);
  const { s, audit, client, traceparent, traceId, callerSpanId } = setting;
  const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-http');
  const received = [];
  const collector = http.createServer((request, response) => {
    let body = '';
    request.on('data', (chunk) => { body += chunk; });
    request.on('end', () => {
      received.push({ path: request.url, body: JSON.parse(body) });
      response.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise((resolve) => collector.listen(0, '127.0.0.1', resolve));
  t.after(() => collector.close());
  const exporter = setting.exporter({
    checkpointTable: `gd_trace_checkpoints_${s.tag}`,
    spanExporter: new OTLPTraceExporter({ url: `http://127.0.0.1:${collector.address().port}/v1/traces` }),
  });
  const id = await client.insert(audit, {}, { traceContext: traceparent });
  await client.drain(s.queue);
  const ours = () => received.flatMap((r) => r.body.resourceSpans.flatMap((rs) => rs.scopeSpans.flatMap((ss) => ss.spans)))
    .filter((span) => span.traceId === traceId);
  const deadline = Date.now() + 20000;
  while (ours().length === 0 && Date.now() < deadline) await exporter.exportOnce();
  await exporter.close();
  assert.ok(received.every((r) => r.path === '/v1/traces'));
  const [span] = ours();
  assert.equal(ours().length, 1);
  assert.equal(span.parentSpanId, callerSpanId);
  assert.equal(span.name, `gen_durable step ${audit}.check`);
  const attributes = Object.fromEntries(span.attributes.map((a) => [a.key, Object.values(a.value)[0]]));
  assert.equal(Number(attributes['gen_durable.instance_id']), id);
  assert.equal(attributes['gen_durable.outcome'], 'done');
});
