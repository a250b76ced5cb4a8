// The ES module face of gen-durable: the CommonJS module's exports, by name.
import gd from './index.js';

export const {
  Client, Worker, connect, behindPooler, nextStep, retry, waitSignal, spawn, done, stop, testTransaction, StepSpanExporter,
} = gd;
export default gd;
