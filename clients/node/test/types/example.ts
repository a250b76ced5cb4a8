// The README's client and worker, typed: `tsc -p test/types` (048) checks
// lib/index.d.ts against the way it is meant to be used.
import {
  Client, Worker, nextStep, retry, done, waitSignal, spawn, stop, testTransaction, StepSpanExporter, type Context,
  type State, type TestTransaction,
} from 'gen-durable';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';

declare const psp: { charge(amount: number, options: { idempotencyKey: string; signal: AbortSignal }): Promise<string> };

async function main(): Promise<void> {
  const client = await Client.connect('postgresql://app@localhost/app');
  const order = await client.insert('checkout', { sku: 'tea' }, { correlationKey: 'order-1001' });
  await client.signal('order-1001', 'payment_confirmed', { amount: 12.5 }, { dedupKey: 'psp-evt-981' });
  if (order !== null) {
    const { status, result } = await client.wait(order, { timeout: 10, until: 'terminal' });
    console.log(status, result);
    // Repairs, as the FSM's owner: back to a step, a new instance from a history entry, another version.
    const rewound: boolean = await client.rewind(order, 'charge', { state: { sku: 'tea', amount: 12.5 } });
    const copy: number = await client.fork(order, 2);
    const moved: number = await client.migrate('checkout', 1, 2, { receipt: 'invoice' });
    console.log(rewound, copy, moved);
  }
  await client.end();

  const pooled = Client.pool('postgresql://app@localhost/app', { max: 20 }); // an HTTP server's
  const placed: number | null = await pooled.insert('checkout', { sku: 'tea' });
  await pooled.end();
  console.log(placed);

  const worker = new Worker('postgresql://app@localhost/app', { queues: ['payments'], concurrency: 4, wait: 5 });
  worker.step('checkout', 'charge', async (state: State, ctx: Context) => {
    const amount = typeof state.amount === 'number' ? state.amount : 0;
    if (amount <= 0) return stop({ reason: 'nothing to charge' });
    if (ctx.deadline !== null && ctx.attempt > 2) return retry({ reason: 'slow provider' }, 30);
    const ref = await psp.charge(amount, { idempotencyKey: ctx.idempotencyKey, signal: ctx.signal });
    await ctx.connection.query('INSERT INTO shop.payments VALUES ($1, $2)', [ctx.id, ref]);
    return nextStep('receipt', { ...state, paymentRef: ref });
  });
  worker.step('checkout', 'receipt', () => waitSignal(['delivered'], { timeout: 86400, thenStep: 'close' }));
  worker.step('checkout', 'close', () => spawn([{ fsm: 'survey', state: { order: 1 } }], 'end'));
  worker.step('checkout', 'end', () => done({ closed: true }));
  // The FSM's on_cancel step: told why a gd_cancel sent the order there, and where it was.
  worker.step('checkout', 'refund', (state: State, ctx: Context) =>
    done({ refunded: ctx.cancelled !== null && ctx.cancelled.step !== 'charge', reason: ctx.cancelled?.reason ?? '' }));
  // A batch step's handler: the claims of its step at once, one outcome each, one transaction for them all.
  worker.step('mail', 'send', async (states: State[], ctxs: Context[]) => {
    await ctxs[0].connection.query('INSERT INTO mail.sent SELECT unnest($1::bigint[])', [ctxs.map((ctx) => ctx.id)]);
    return states.map((state) => (state.to ? done() : stop({ reason: 'no address' })));
  }, { batch: true });
  await worker.run();

  // A test of it, in one transaction rolled back at the end.
  const settled: string = await testTransaction('postgresql://app@localhost/app_test', async (t: TestTransaction) => {
    const id = await t.client.insert('checkout', { sku: 'tea' }, { queue: 'checkout_test' });
    await t.drain('checkout_test');
    const ran: number = await t.runExternal('checkout_test', { 'checkout/charge': () => nextStep('receipt') });
    const later: Date = await t.advance({ days: 1, seconds: 1 });
    await t.drain('checkout_test', { maxSteps: 100 });
    const row = id === null ? null : await t.client.get(id);
    return `${ran} ${later.toISOString()} ${row?.status}`;
  });
  console.log(settled);

  // Traces: the worker's spans on an SDK's tracer, the in-database steps' from the step history.
  const memory = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(memory)] });
  const traced = new Worker('postgresql://app@localhost/app', { tracer: provider.getTracer('checkout') });
  traced.step('checkout', 'charge', () => nextStep('receipt'));
  const exporter = new StepSpanExporter('postgresql://monitor@localhost/app', {
    spanExporter: memory, name: 'checkout', since: new Date(), pageSize: 100, checkpointTable: 'tracing.checkpoints',
  });
  const sent: number = await exporter.exportOnce();
  await exporter.close();
  console.log(sent, memory.getFinishedSpans().length);
}

void main();
