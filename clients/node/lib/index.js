'use strict';
/** gen_durable from Node.js: the API (Client), an external worker (Worker), the outcomes steps return, and
 *  testTransaction for tests. */
const { Client, connect, behindPooler } = require('./client');
const { Worker } = require('./worker');
const outcomes = require('./outcomes');
const { testTransaction } = require('./testing');

module.exports = {
  Client, Worker, connect, behindPooler,
  nextStep: outcomes.nextStep, retry: outcomes.retry, waitSignal: outcomes.waitSignal, spawn: outcomes.spawn,
  done: outcomes.done, stop: outcomes.stop, testTransaction,
};
