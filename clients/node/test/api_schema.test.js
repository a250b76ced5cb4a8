'use strict';
// apiSchema: the API's functions in the schema given, nothing looked up, as
// on a PL/Proxy router (sharding/README.md), which has no extension. Here a
// database without gen_durable, with stubs of gd_insert (the extension's
// signature, returning 42) and gd_claim (recording its calls) in a schema
// whose name needs quoting.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('crypto');
const pg = require('pg');
const { Client, Worker, done } = require('..');
const { DSN, admin, running, captureLog } = require('./support');

const SCHEMA = 'Router API';
const database = `router_${crypto.randomBytes(4).toString('hex')}`;
const url = new URL(DSN);
url.pathname = `/${database}`;
const ROUTER = url.toString();

async function onRouter(sql) {
  const router = new pg.Client({ connectionString: ROUTER });
  await router.connect();
  try {
    return (await router.query(sql)).rows;
  } finally {
    await router.end();
  }
}

before(async () => {
  const db = await admin();
  try {
    const { rows: [signature] } = await db.query(`
      SELECT pg_get_function_arguments(p.oid) AS arguments, pg_get_function_result(p.oid) AS result
        FROM pg_proc p JOIN pg_extension e ON e.extnamespace = p.pronamespace
       WHERE e.extname = 'gen_durable' AND p.proname = 'gd_insert'`);
    await db.query(`CREATE DATABASE ${database}`);
    await onRouter(`
CREATE SCHEMA "Router API";
CREATE TABLE "Router API".claims (queue text, fsms text[]);
CREATE FUNCTION "Router API".gd_insert(${signature.arguments}) RETURNS ${signature.result} LANGUAGE sql AS 'SELECT 42';
CREATE FUNCTION "Router API".gd_claim(queue text, worker text, max int, lease interval, fsms text[], wait interval)
RETURNS TABLE (id bigint, fsm text, version int, step text, state jsonb, ctx jsonb, lease_token bigint)
LANGUAGE plpgsql AS 'BEGIN INSERT INTO "Router API".claims VALUES (queue, fsms); END';`);
  } finally {
    await db.end();
  }
});

after(async () => {
  const db = await admin();
  await db.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
  await db.end();
});

test('apiSchema: the client calls the schema given and looks nothing up', async () => {
  const client = await Client.connect(ROUTER, { apiSchema: SCHEMA });
  try {
    assert.equal(await client.insert('order', { sku: 'tea' }, { correlationKey: 'k' }), 42);
  } finally {
    await client.end();
  }
  const looking = await Client.connect(ROUTER);
  try {
    await assert.rejects(looking.insert('order'),
      { code: '42704', message: /extension gen_durable is not installed/ });
  } finally {
    await looking.end();
  }
  await assert.rejects(Client.connect(ROUTER, { apiSchema: '' }), TypeError);
});

test('apiSchema: the worker claims in the schema given', async () => {
  const worker = new Worker(ROUTER, {
    handlers: { 'order/pack': async () => done() }, queues: ['shop'], apiSchema: SCHEMA, wait: 0.1, name: 'stub',
    log: captureLog(),
  });
  let claims = [];
  await running(worker, async () => {
    for (let i = 0; i < 200 && !claims.length; i++) {
      claims = await onRouter('SELECT queue, fsms FROM "Router API".claims');
      if (!claims.length) await new Promise((r) => setTimeout(r, 50));
    }
  });
  assert.deepEqual(claims[0], { queue: 'shop', fsms: ['order'] });
});
