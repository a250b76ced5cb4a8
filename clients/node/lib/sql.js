'use strict';
/**
 * The statements the client and the worker send.  Every name is qualified
 * with its schema: on the session's search_path ("$user", public) a role
 * that may create schemas could make one named after ours and put its own
 * gd_claim, or a to_jsonb(gd.context) (an exact type match beats
 * pg_catalog's polymorphic one), in our way.  Built-ins are pg_catalog's;
 * the API's functions are in the schema the extension was created in,
 * looked up once per connection (statements), or in the one given
 * (apiSchema: a PL/Proxy router's, sharding/README.md).
 */

// The schema of the API functions, quoted as an identifier.
const API_SCHEMA = `SELECT pg_catalog.quote_ident(n.nspname) AS api FROM pg_catalog.pg_extension e
                      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
                     WHERE e.extname OPERATOR(pg_catalog.=) 'gen_durable'`;

/** The statements that call the API, its functions in schema `api` (quoted). */
function apiStatements(api) {
  return {
    insert: `SELECT ${api}.gd_insert($1, $2, step => $3, queue => $4, priority => $5, concurrency_key => $6,
                            correlation_key => $7, correlation_scope => $8, rate_limit => $9, weight => $10,
                            eligible_at => $11, schedule_in => $12::interval, on_duplicate => $13,
                            trace_context => $14, debounce => $15::interval, throttle => $16::interval,
                            on_throttle => $17, fairness_key => $18) AS id`,
    insertAll: `SELECT i.id FROM ${api}.gd_insert_all($1, $2) AS i(id)`,
    // The target's type picks the overload: an instance id, or a correlation key.
    signalById: `SELECT ${api}.gd_signal($1::bigint, $2, $3, dedup_key => $4, missing_ok => $5, expires => $6::interval) AS sent`,
    signalByKey: `SELECT ${api}.gd_signal($1::text, $2, $3, dedup_key => $4, missing_ok => $5, expires => $6::interval) AS sent`,
    await: `SELECT status, step, attempt, result, error FROM ${api}.gd_await($1::bigint, $2::interval, $3)`,
    cancel: `SELECT ${api}.gd_cancel($1::bigint, $2) AS changed`,
    retry: `SELECT ${api}.gd_retry($1::bigint) AS changed`,
    rewind: `SELECT ${api}.gd_rewind($1::bigint, $2, $3::jsonb) AS changed`,
    fork: `SELECT ${api}.gd_fork($1::bigint, $2, $3::jsonb) AS id`,
    migrate: `SELECT ${api}.gd_migrate($1, $2, $3, $4::jsonb) AS moved`,
    drain: `SELECT ${api}.gd_drain($1, with_scheduled => $2, max_steps => $3) AS ran`,
    // Only steps of the FSMs the worker has handlers for (fsms).
    // secondsLeft: until the step's deadline (NULL: none), by the server's clock.
    claim: `SELECT c.id, c.fsm, c.version, c.step, c.state, pg_catalog.to_jsonb(c.ctx) AS ctx,
                   c.lease_token::text AS token,
                   pg_catalog.date_part('epoch', (pg_catalog.to_jsonb(c.ctx) OPERATOR(pg_catalog.->>) 'deadline')::pg_catalog.timestamptz
                                                 OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp())
                     AS "secondsLeft"
              FROM ${api}.gd_claim($1, $2, $3, $4::interval, fsms => $5::text[], wait => $6::interval) c`,
    // One completion statement for a batch: gd_outcome turns each JSON outcome into a gd.outcome.
    completeAll: `SELECT id, completed FROM ${api}.gd_complete_all($1::bigint[], $2::bigint[],
                    ARRAY(SELECT ${api}.gd_outcome(o) FROM pg_catalog.unnest($3::jsonb[]) WITH ORDINALITY AS u(o, n)
                           ORDER BY n))`,
    complete: `SELECT ${api}.gd_complete($1, $2, ${api}.gd_outcome($3)) AS completed`,
    release: `SELECT ${api}.gd_release($1, $2)`,
    heartbeat: `SELECT ${api}.gd_heartbeat($1, $2, $3::interval) AS kept`,
  };
}

const known = new WeakMap(); // pg.Client -> its statements
const named = new Map(); // an apiSchema given -> its statements

/** The apiSchema a client or a worker is given: null (look it up), or a schema's name as it is. */
function apiSchemaOption(apiSchema) {
  if (apiSchema != null && (typeof apiSchema !== 'string' || apiSchema === '' || apiSchema.includes('\0'))) {
    throw new TypeError(`apiSchema must be a schema's name, not ${JSON.stringify(apiSchema)}`);
  }
  return apiSchema ?? null;
}

/**
 * The statements that call the API in the connection's database: in schema
 * `apiSchema` if given, else in the extension's (looked up once).
 */
async function statements(client, apiSchema = null) {
  if (apiSchema != null) {
    if (!named.has(apiSchema)) named.set(apiSchema, apiStatements(`"${apiSchema.replace(/"/g, '""')}"`));
    return named.get(apiSchema);
  }
  if (!known.has(client)) {
    const { rows } = await client.query(API_SCHEMA);
    if (!rows.length) {
      throw Object.assign(new Error(`gen_durable: extension gen_durable is not installed in database ` +
        `"${client.database}" (CREATE EXTENSION gen_durable)`), { code: '42704' });
    }
    known.set(client, apiStatements(rows[0].api));
  }
  return known.get(client);
}

// The statements that call no API function.
const SQL = {
  get: `SELECT id, fsm, version, step, status, state, attempt, result, error, correlation_key, queue, parent_id,
               created_at, updated_at, finished_at FROM gd.instances WHERE id OPERATOR(pg_catalog.=) $1::bigint`,
  // The port the server listens on, to compare with the one the client reached.
  serverPort: "SELECT pg_catalog.current_setting('port') AS port",
  // The queues steps run on, as defined (a step's own, else its FSM's).
  queuesOfSteps: `SELECT DISTINCT coalesce(s.queue, f.queue) AS queue FROM gd.steps s
                    JOIN gd.fsms f ON f.name OPERATOR(pg_catalog.=) s.fsm AND f.version OPERATOR(pg_catalog.=) s.version
                    JOIN ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS h(fsm, step)
                      ON h.fsm OPERATOR(pg_catalog.=) s.fsm AND h.step OPERATOR(pg_catalog.=) s.step
                   ORDER BY 1`,
};

module.exports = { statements, apiSchemaOption, SQL };
