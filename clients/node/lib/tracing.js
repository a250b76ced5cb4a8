'use strict';
/**
 * OpenTelemetry spans of steps: one span per step run, a child of the trace
 * its instance was inserted under (gd_insert's trace_context, a W3C
 * traceparent; inherited by spawned children), or a root where it has none.
 * The worker makes one around each handler it runs; StepSpanExporter
 * (step_span_exporter.js) makes them for the in-database steps from the step
 * history.  Both name and describe a step the same way, here.
 *
 * @opentelemetry/api is an optional peer dependency: without it the worker
 * runs as before, with no spans.
 */
let api = null;
try {
  api = require('@opentelemetry/api');
} catch (e) {
  if (e.code !== 'MODULE_NOT_FOUND') throw e;
}

const { version: CLIENT_VERSION } = require('../package.json');

/** The OpenTelemetry API, or an error naming what needs it. */
function openTelemetry(what) {
  if (api === null) throw new Error(`${what} needs @opentelemetry/api: npm install @opentelemetry/api`);
  return api;
}

// A traceparent as the engine accepts it: a later version than 00 may add fields after a dash.
const TRACEPARENT = /^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-|$)/;

/**
 * The context a step's span starts in: the instance's traceparent as a
 * remote parent, or the root context.  Parsed here rather than through
 * api.propagation, which extracts nothing unless the application registered
 * a propagator: the parentage must not depend on that.
 */
function parentContext(traceContext) {
  const parts = traceContext ? TRACEPARENT.exec(traceContext) : null;
  if (parts === null) return api.ROOT_CONTEXT;
  return api.trace.setSpanContext(api.ROOT_CONTEXT,
    { traceId: parts[1], spanId: parts[2], traceFlags: parseInt(parts[3], 16), isRemote: true });
}

/**
 * Start the span of a step: `step` has the instance's id, fsm, version,
 * step, attempt and traceContext, and who runs it (worker); `startTime`
 * when it started (default: now).  Returns the span and the context the
 * step runs in (its parent's, with the span).
 */
function startStepSpan(tracer, step, startTime) {
  const parent = parentContext(step.traceContext);
  const span = tracer.startSpan(`gen_durable step ${step.fsm}.${step.step}`, {
    kind: api.SpanKind.CONSUMER,
    startTime,
    attributes: {
      'gen_durable.instance_id': step.id,
      'gen_durable.fsm': step.fsm,
      'gen_durable.fsm_version': step.version,
      'gen_durable.step': step.step,
      'gen_durable.attempt': step.attempt,
      'gen_durable.worker': step.worker,
    },
  }, parent);
  return { span, context: api.trace.setSpan(parent, span) };
}

/**
 * End a step's span with its outcome — `kind` as gd.step_history names it:
 * next, retry, await, spawn, done, stop, lost (a lease expired), or released
 * (handed back by a draining worker) — and, for a failed attempt or a
 * stop, its error (an Error the handler threw, recorded as an exception, or
 * the outcome's error document): the span's status is then ERROR.
 */
function endStepSpan(span, kind, error, endTime) {
  span.setAttribute('gen_durable.outcome', kind);
  if (error != null) {
    const message = error instanceof Error ? error.message : (error.message ?? JSON.stringify(error));
    span.setStatus({ code: api.SpanStatusCode.ERROR, message: String(message) });
    if (error instanceof Error) span.recordException(error);
  }
  span.end(endTime);
}

/** The outcomes' kinds by the engine's names for them (gd.step_history, gd.step_stats). */
const ENGINE_KIND = { wait_signal: 'await' };
const engineKind = (outcome) => ENGINE_KIND[outcome.kind] ?? outcome.kind;

/** The worker's tracer: `tracer` if given, else the global one (a no-op unless the application set one
 *  up); null without @opentelemetry/api. */
function workerTracer(tracer) {
  if (tracer != null) return (openTelemetry("the worker's tracer option"), tracer);
  return api === null ? null : api.trace.getTracer('gen-durable', CLIENT_VERSION);
}

/** Run `body` in the context `context` (the step's span active: the handler's own spans are its children). */
const inContext = (context, body) => api.context.with(context, body);

module.exports = { openTelemetry, parentContext, startStepSpan, endStepSpan, engineKind, workerTracer, inContext };
