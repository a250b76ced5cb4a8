'use strict';
/**
 * Outcomes: what a step returns, as in SQL (gd_next, gd_retry, ...).  Each
 * is the JSON form gd_outcome(jsonb) turns into a gd.outcome inside the
 * database, so a step run here ends as an in-database step would.
 * Durations are seconds (numbers).
 */

const OUTCOME = Symbol('gen_durable outcome');

function interval(seconds) {
  return seconds == null ? undefined : `${Number(seconds)} seconds`;
}

function outcome(kind, args) {
  const o = { kind };
  for (const [name, value] of Object.entries(args)) if (value !== undefined && value !== null) o[name] = value;
  Object.defineProperty(o, OUTCOME, { value: true });
  return o;
}

const isOutcome = (value) => value != null && value[OUTCOME] === true;

/* An entry's options (InsertOptions, camelCase) by their names in the engine's JSON entries. */
const ENTRY_OPTIONS = {
  fsm: 'fsm', state: 'state', step: 'step', queue: 'queue', priority: 'priority', concurrencyKey: 'concurrency_key',
  correlationKey: 'correlation_key', correlationScope: 'correlation_scope', rateLimit: 'rate_limit', weight: 'weight',
  eligibleAt: 'eligible_at', scheduleIn: 'schedule_in', traceContext: 'trace_context', debounce: 'debounce',
  throttle: 'throttle', onThrottle: 'on_throttle', fairnessKey: 'fairness_key',
};
/* The entry options given in seconds, sent as intervals. */
const INTERVAL_OPTIONS = new Set(['scheduleIn', 'debounce', 'throttle']);

/** An insert option object (as insert's, less onDuplicate) as gd_insert_all's entries and gd_spawn's children take it. */
function insertEntry(options) {
  const entry = {};
  for (const [name, value] of Object.entries(options)) {
    const key = ENTRY_OPTIONS[name];
    if (key === undefined) throw new TypeError(`unknown insert entry option: ${name}`);
    if (value === undefined || value === null) continue;
    entry[key] = INTERVAL_OPTIONS.has(name) ? interval(value) : value;
  }
  return entry;
}

/** Go on at `step` (with a new state, else the same), now or after `delay` seconds. */
const nextStep = (step, state, delay) => outcome('next', { step, state, delay: interval(delay) });
/** A failed attempt: the step runs again after `backoff` seconds (default: the step's), or the instance fails. */
const retry = (error = {}, backoff) => outcome('retry', { error, backoff: interval(backoff) });
/** Park until a signal of one of `names` arrives (or `timeout` passes), then go on at `thenStep`. */
const waitSignal = (names, { timeout, thenStep, state } = {}) =>
  outcome('wait_signal', { names: [...names], timeout: interval(timeout), then_step: thenStep, state });
/** Start child instances (insert option objects) and go on at `thenStep` once all have ended. */
const spawn = (children, thenStep, state) =>
  outcome('spawn', { children: [...children].map(insertEntry), then_step: thenStep, state });
/** End the instance with `result`. */
const done = (result = {}) => outcome('done', { result });
/** Fail the instance now, without a retry. */
const stop = (error = {}) => outcome('stop', { error });

module.exports = { nextStep, retry, waitSignal, spawn, done, stop, isOutcome, interval, insertEntry };
