/*
 * events.cpp — the transactional event stream (gen_durable.events =
 * transitions): each change of an instance's step or status the engine
 * writes (a step's transition, an insert, a resumption, gd_retry, gd_cancel)
 * is also written into the WAL as a transactional logical decoding message,
 * prefix "gen_durable", so it reaches logical decoding consumers
 * (pg_recvlogical, Debezium, wal2json) in commit order with the rows its
 * transaction changed, and not at all if that transaction rolls back.
 *
 * Any role may write a message with that prefix (pg_logical_emit_message),
 * so each of the engine's carries its transaction's id ("xid") and, last,
 * "mac": the HMAC-SHA256 of the message up to it (with "}" in place of the
 * mac member) under the database's event key (gd._event_key, made at
 * CREATE EXTENSION; gd.event_key() for the consumer).  A consumer keeps the
 * messages whose mac checks and whose xid is the transaction it arrived in
 * (docs/reference.md, the event stream).
 */
#include "events.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
#include "instance_status.hpp"
#include "kept_plans.hpp"
#include "pg_compat.hpp"
#include "stats.hpp"
#include "transition.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "lib/stringinfo.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
}

namespace {

void append_string_or_null(StringInfo json, const char *value)
{
    if (value == nullptr)
        appendStringInfoString(json, "null");
    else
        escape_json(json, value);
}

/* The instance's columns an event names, as text: fsm, version, step, status, attempt. */
constexpr const char *EVENT_COLUMNS = "i.fsm, i.version::text, i.step, i.status, i.attempt::text";

constexpr int EVENT_KEY_BYTES = 32;
uint8 event_key[EVENT_KEY_BYTES];
Oid event_key_table = InvalidOid; /* the table event_key was read from: another after the extension was made again */

const uint8 *the_event_key()
{
    Oid table = get_relname_relid("_event_key", get_namespace_oid("gd", false));
    if (table == event_key_table && OidIsValid(table))
        return event_key;
    if (SPI_connect() != SPI_OK_CONNECT)
        elog(ERROR, "gen_durable: SPI_connect failed reading the event key");
    bool isnull = true;
    if (SPI_execute("SELECT k.key FROM gd._event_key k", true, 1) == SPI_OK_SELECT && SPI_processed == 1) {
        bytea *key = DatumGetByteaPP(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
        if (!isnull && VARSIZE_ANY_EXHDR(key) == EVENT_KEY_BYTES)
            memcpy(event_key, VARDATA_ANY(key), EVENT_KEY_BYTES);
        else
            isnull = true;
    }
    SPI_finish();
    if (isnull)
        elog(ERROR, "gen_durable: the event key (gd._event_key) is missing");
    event_key_table = table;
    return event_key;
}

/* End the event's JSON object with its "mac" member (see above). */
void sign(StringInfo json)
{
    pg_hmac_ctx *hmac = pg_hmac_create(PG_SHA256);
    uint8 mac[PG_SHA256_DIGEST_LENGTH];
    if (hmac == nullptr || pg_hmac_init(hmac, the_event_key(), EVENT_KEY_BYTES) < 0 ||
        pg_hmac_update(hmac, reinterpret_cast<const uint8 *>(json->data), json->len) < 0 ||
        pg_hmac_final(hmac, mac, sizeof(mac)) < 0)
        elog(ERROR, "gen_durable: signing an event failed: %s", hmac ? pg_hmac_error(hmac) : "out of memory");
    pg_hmac_free(hmac);
    json->len--; /* the closing brace, signed; the mac member goes before it */
    json->data[json->len] = '\0';
    appendStringInfoString(json, ", \"mac\": \"");
    for (uint8 byte : mac)
        appendStringInfo(json, "%02x", byte);
    appendStringInfoString(json, "\"}");
}

} // namespace

void gd_emit_event(const InstanceEvent &e)
{
    StringInfoData json;
    initStringInfo(&json);
    appendStringInfo(&json, "{\"id\": " INT64_FORMAT ", \"fsm\": ", e.id);
    append_string_or_null(&json, e.fsm);
    appendStringInfo(&json, ", \"version\": %d, \"step\": ", e.version);
    append_string_or_null(&json, e.step);
    appendStringInfoString(&json, ", \"from\": ");
    append_string_or_null(&json, e.from);
    appendStringInfoString(&json, ", \"to\": ");
    append_string_or_null(&json, e.to);
    appendStringInfoString(&json, ", \"next_step\": ");
    append_string_or_null(&json, e.next_step);
    appendStringInfoString(&json, ", \"kind\": ");
    append_string_or_null(&json, e.kind);
    appendStringInfo(&json, ", \"attempt\": %d, \"at\": \"%s\", \"xid\": %u}", e.attempt,
                     timestamptz_to_str(GetCurrentTimestamp()), GetTopTransactionId());
    sign(&json);
    gd_log_transactional_message("gen_durable", json.data, json.len);
    pfree(json.data);
}

void gd_emit_transition_event(int64 id, const Transition &t)
{
    const char *kind = gd_step_kind(t.ran.event);
    gd_emit_event(InstanceEvent{id, t.ran.fsm, t.ran.version, t.ran.step,
                                gd_status_name(t.ran.claimed ? Status::executing : Status::runnable),
                                gd_status_name(t.to.status), t.to.step, kind != nullptr ? kind : gd_status_name(t.to.status),
                                t.to.attempt});
}

InstanceEvent gd_event_before(int64 id, const char *kind)
{
    InstanceEvent e{};
    e.id = id;
    e.kind = kind;
    if (gd_events != GD_EVENTS_TRANSITIONS)
        return e;
    static SPIPlanPtr before_plan = nullptr;
    Datum args[1] = {Int64GetDatum(id)};
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT %s FROM gd._instances i WHERE i.id = $1", EVENT_COLUMNS);
    if (gd_run_kept(before_plan, sql, {INT8OID}, args, false, 1) == SPI_OK_SELECT && SPI_processed == 1) {
        HeapTuple row = SPI_tuptable->vals[0];
        TupleDesc desc = SPI_tuptable->tupdesc;
        e.fsm = SPI_getvalue(row, desc, 1);
        e.version = atoi(SPI_getvalue(row, desc, 2));
        e.step = SPI_getvalue(row, desc, 3);
        e.from = SPI_getvalue(row, desc, 4);
    }
    return e;
}

void gd_emit_event_after(InstanceEvent e)
{
    if (gd_events != GD_EVENTS_TRANSITIONS || e.fsm == nullptr)
        return;
    static SPIPlanPtr after_plan = nullptr;
    Datum args[1] = {Int64GetDatum(e.id)};
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT %s FROM gd._instances i WHERE i.id = $1", EVENT_COLUMNS);
    if (gd_run_kept(after_plan, sql, {INT8OID}, args, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        return;
    HeapTuple row = SPI_tuptable->vals[0];
    TupleDesc desc = SPI_tuptable->tupdesc;
    e.next_step = SPI_getvalue(row, desc, 3);
    e.to = SPI_getvalue(row, desc, 4);
    e.attempt = atoi(SPI_getvalue(row, desc, 5));
    gd_emit_event(e);
}

/* gd._emit_inserted(ids bigint[]): the events of instances just inserted (NULLs ignored). */
GD_SQL_FUNCTION(gd_emit_inserted)
{
    if (gd_events != GD_EVENTS_TRANSITIONS || PG_ARGISNULL(0))
        PG_RETURN_VOID();
    static SPIPlanPtr inserted_plan = nullptr;
    Datum args[1] = {PG_GETARG_DATUM(0)};
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT %s, i.id FROM gd._instances i WHERE i.id = ANY ($1) ORDER BY i.id",
             EVENT_COLUMNS);
    SPI_connect();
    if (gd_run_kept(inserted_plan, sql, {INT8ARRAYOID}, args, true, 0) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: reading inserted instances failed");
    for (uint64 r = 0; r < SPI_processed; r++) {
        HeapTuple row = SPI_tuptable->vals[r];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        gd_emit_event(InstanceEvent{DatumGetInt64(SPI_getbinval(row, desc, 6, &isnull)), SPI_getvalue(row, desc, 1),
                                    atoi(SPI_getvalue(row, desc, 2)), nullptr, nullptr, SPI_getvalue(row, desc, 4),
                                    SPI_getvalue(row, desc, 3), "inserted", atoi(SPI_getvalue(row, desc, 5))});
    }
    SPI_finish();
    PG_RETURN_VOID();
}

/* gd._new_event_key() → bytea: a new event key, from the strong random source. */
GD_SQL_FUNCTION(gd_new_event_key)
{
    bytea *key = static_cast<bytea *>(palloc(VARHDRSZ + EVENT_KEY_BYTES));
    SET_VARSIZE(key, VARHDRSZ + EVENT_KEY_BYTES);
    if (!pg_strong_random(VARDATA(key), EVENT_KEY_BYTES))
        ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("gen_durable: could not generate a random event key")));
    PG_RETURN_BYTEA_P(key);
}
