// The external 'charge' step of examples/shop.sql, in Node.js (the client installed: clients/node/README.md):
//
//   node examples/shop_worker.js 'postgresql://app@localhost/app'
const { Worker, nextStep, retry, stop } = require('gen-durable');

const worker = new Worker(process.argv[2], { queues: ['shop'], log: console });

// Charge the card through a payment provider (simulated here).  Runs outside
// the database, so it may run more than once (a retry after the provider's
// late answer, a worker that dies mid-step): pass the provider the key of this
// visit of the step, the same on every attempt.
worker.step('shop_order', 'charge', async (state, ctx) => {
  const idempotencyKey = ctx.idempotencyKey;
  const amount = state.amount ?? 0;
  if (amount <= 0) return stop({ reason: 'nothing to charge', amount });
  if (state.card === 'flaky' && ctx.attempt < 2) return retry({ reason: 'provider timeout' }, 0.5);
  await new Promise((resolve) => setTimeout(resolve, 200)); // the provider's round trip
  return nextStep('receipt', { ...state, charged: amount, payment_ref: idempotencyKey });
});

worker.run().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
