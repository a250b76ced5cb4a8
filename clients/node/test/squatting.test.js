'use strict';
// Name squatting: a role that may create schemas makes one named after the
// worker's role, with functions named as the API's, a to_jsonb(gd.context)
// and an unnest(jsonb[]) (exact type matches beat pg_catalog's polymorphic
// ones). On the default search_path ("$user", public) they come first; the
// client names every function with its schema, so none of them ever runs.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const pg = require('pg');
const { Client, Worker, nextStep, done, waitSignal } = require('..');
const { DSN, scope, running, captureLog } = require('./support');

// Run by the squatter in the schema it made (VICTIM): a copy of every API
// function and of the built-ins the clients call, each recording that it ran.
const SQUAT = `
GRANT USAGE ON SCHEMA VICTIM TO VICTIM;
CREATE TABLE VICTIM.ran (function text);
GRANT INSERT ON VICTIM.ran TO VICTIM;
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT p.proname AS name, pg_get_function_arguments(p.oid) AS arguments,
                    pg_get_function_result(p.oid) AS result, p.proretset AS set
               FROM pg_proc p JOIN pg_extension e ON e.extnamespace = p.pronamespace
              WHERE e.extname = 'gen_durable' AND p.proname LIKE 'gd\\_%'
             UNION ALL VALUES ('to_jsonb', 'gd.context', 'jsonb', false), ('unnest', 'jsonb[]', 'SETOF jsonb', true),
                              ('unnest', 'text[]', 'SETOF text', true)
    LOOP
        EXECUTE format('CREATE FUNCTION VICTIM.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L', f.name, f.arguments,
                       f.result, format('BEGIN INSERT INTO VICTIM.ran VALUES (%L); RETURN%s; END', f.name,
                                        CASE WHEN f.set OR f.result = 'void' THEN '' ELSE ' NULL' END));
    END LOOP;
END $$`;

/** GD_TEST_DSN, as `role`. */
function as(role) {
  const url = new URL(DSN);
  url.username = role;
  return url.toString();
}

async function runAs(role, sql) {
  const connection = new pg.Client({ connectionString: as(role) });
  await connection.connect();
  try {
    await connection.query(sql);
  } finally {
    await connection.end();
  }
}

test('neither the client nor the worker calls a function of a schema named after their role', async (t) => {
  const s = await scope();
  const victim = s.name('alice');
  const squatter = s.name('mallory');
  const fsm = s.name('sq');
  t.after(async () => {
    await s.db.query('SELECT gd_revoke(fsm, role) FROM gd.grants WHERE fsm = $1', [fsm]);
    await s.db.query(`DROP OWNED BY ${victim}, ${squatter}`);
    await s.db.query(`DROP ROLE ${victim}, ${squatter}`);
    await s.end();
  });
  for (const role of [victim, squatter]) {
    await s.db.query(`CREATE ROLE ${role} LOGIN`);
    await s.db.query(`GRANT CREATE ON DATABASE ${s.db.escapeIdentifier(s.db.database)} TO ${role}`);
  }
  await runAs(squatter, `CREATE SCHEMA ${victim}; ${SQUAT.replaceAll('VICTIM', victim)}`);
  const squatted = async () => (await s.db.query(`SELECT function FROM ${victim}.ran ORDER BY 1`)).rows
    .map((r) => r.function);
  // The squat works on what names no schema.
  await runAs(victim, 'SELECT gd_heartbeat(0, 0), to_jsonb(NULL::gd.context)');
  assert.deepEqual(await squatted(), ['gd_heartbeat', 'to_jsonb']);
  await s.db.query(`TRUNCATE ${victim}.ran`);
  // An FSM of the superuser's, granted to the victim: a (external) -> b (external).
  await s.define(fsm, 'a', { a: null, b: { max_attempts: 1 } });
  await s.db.query('SELECT gd_grant($1, $2)', [fsm, victim]);

  const key = s.name('key');
  const worker = new Worker(as(victim), {
    name: s.name('w'), lease: 1, wait: 0.5, log: captureLog(), handlers: {
      [`${fsm}/a`]: (state) => (state.wait ? waitSignal(['go'], { thenStep: 'b' }) : nextStep('b')),
      [`${fsm}/b`]: async (state) => {
        await new Promise((r) => setTimeout(r, 400)); // past a heartbeat
        // A step to nowhere: gd_complete_all refuses the batch, gd_complete each claim.
        return state.bad ? nextStep('nowhere') : done();
      },
    },
  });
  const client = await Client.connect(as(victim));
  try {
    const waiting = await client.insert(fsm, { wait: true }, { correlationKey: key });
    const ids = await client.insertAll(fsm, [{}, { state: { bad: true } }]);
    const later = await client.insert(fsm, {}, { scheduleIn: 3600 });
    const ends = [];
    await running(worker, async () => {
      assert.equal((await client.wait(waiting, { timeout: 10 })).status, 'awaiting');
      assert.equal(await client.signal(key, 'go'), true);
      for (const id of [waiting, ...ids]) ends.push((await client.wait(id, { timeout: 10, until: 'terminal' })).status);
    });
    assert.deepEqual(ends, ['done', 'done', 'failed']);
    assert.equal(await client.retry(ids[1]), true);
    assert.equal(await client.cancel(later), true);
    assert.equal(await client.drain(s.queue), 0);
    assert.equal((await client.get(later)).status, 'cancelled');
  } finally {
    await client.end();
  }
  assert.deepEqual(worker.queues, [s.queue]);
  assert.deepEqual(await squatted(), []);
});
