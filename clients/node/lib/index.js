'use strict';
/** gen_durable from Node.js: the API (Client), an external worker (Worker), the outcomes steps return,
 *  testTransaction for tests, and the spans of in-database steps (StepSpanExporter). */
const { Client, connect, behindPooler } = require('./client');
const { Worker } = require('./worker');
const outcomes = require('./outcomes');
const { testTransaction } = require('./testing');
const { StepSpanExporter } = require('./step_span_exporter');

module.exports = {
  Client, Worker, connect, behindPooler,
  nextStep: outcomes.nextStep, retry: outcomes.retry, waitSignal: outcomes.waitSignal, spawn: outcomes.spawn,
  done: outcomes.done, stop: outcomes.stop, testTransaction, StepSpanExporter,
};
