/*
 * events.cpp — the transactional event stream (gen_durable.events =
 * transitions): each transition the engine writes for a step is also
 * written into the WAL as a transactional logical decoding message, prefix
 * "gen_durable", so it reaches logical decoding consumers (pg_recvlogical,
 * Debezium, wal2json) in commit order with the rows its transaction changed,
 * and not at all if that transaction rolls back.
 */
#include "executor.hpp"
#include "stats.hpp"

extern "C" {
#include "lib/stringinfo.h"
#include "replication/message.h"
#include "utils/json.h"
#include "utils/timestamp.h"
}

void gd_emit_transition_event(int64 id, const Transition &t)
{
    StringInfoData json;
    initStringInfo(&json);
    appendStringInfo(&json, "{\"id\": " INT64_FORMAT ", \"fsm\": ", id);
    escape_json(&json, t.fsm != nullptr ? t.fsm : "");
    appendStringInfo(&json, ", \"version\": %d, \"step\": ", t.version);
    escape_json(&json, t.ran_step != nullptr ? t.ran_step : "");
    appendStringInfo(&json, ", \"from\": \"%s\", \"to\": \"%s\", \"next_step\": ",
                     gd_status_name(t.claimed ? Status::executing : Status::runnable), gd_status_name(t.status));
    escape_json(&json, t.step);
    const char *kind = gd_step_kind(t.event);
    appendStringInfo(&json, ", \"kind\": \"%s\", \"attempt\": %d, \"at\": \"%s\"}",
                     kind != nullptr ? kind : gd_status_name(t.status), t.attempt,
                     timestamptz_to_str(GetCurrentTimestamp()));
    LogLogicalMessage("gen_durable", json.data, json.len, true);
    pfree(json.data);
}
