/*
 * transition.cpp — writing where an instance goes after a step: the next
 * step, a retry after exponential backoff, or a terminal status.  One kept
 * UPDATE plan writes every kind of transition, in the same transaction as
 * the step's own effects.
 */
#include "executor.hpp"

extern "C" {
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"
}

namespace {

SPIPlanPtr update_plan = nullptr;

void append_json_field(StringInfo json, const char *key, const char *value, bool first = false)
{
    if (!first)
        appendStringInfoString(json, ", ");
    escape_json(json, key);
    appendStringInfoString(json, ": ");
    if (value == nullptr)
        appendStringInfoString(json, "null");
    else
        escape_json(json, value);
}

} // namespace

void gd_apply_transition(int64 id, const Transition &t)
{
    if (update_plan == nullptr) {
        Oid types[9] = {INT8OID, TEXTOID, TEXTOID, JSONBOID, INT4OID, TIMESTAMPTZOID, JSONBOID, JSONBOID, BOOLOID};
        update_plan = SPI_prepare("UPDATE gd.instances SET status = $2, step = $3, state = coalesce($4, state),"
                                  "       attempt = $5, eligible_at = $6, result = $7, error = $8, external = $9,"
                                  "       updated_at = clock_timestamp(),"
                                  "       finished_at = CASE WHEN $2 IN ('done', 'failed', 'cancelled')"
                                  "                          THEN clock_timestamp() END"
                                  " WHERE id = $1",
                                  9, types);
        if (update_plan == nullptr)
            elog(ERROR, "gen_durable: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        SPI_keepplan(update_plan);
    }
    Datum args[9] = {Int64GetDatum(id),          CStringGetTextDatum(t.status), CStringGetTextDatum(t.step),
                     t.state,                    Int32GetDatum(t.attempt),      TimestampTzGetDatum(t.eligible_at),
                     t.result,                   t.error,                       BoolGetDatum(t.external)};
    char nulls[9] = {' ', ' ', ' ', t.state ? ' ' : 'n', ' ', ' ', t.result ? ' ' : 'n', t.error ? ' ' : 'n', ' '};
    if (SPI_execute_plan(update_plan, args, nulls, false, 0) != SPI_OK_UPDATE || SPI_processed != 1)
        elog(ERROR, "gen_durable: could not record the transition of instance " INT64_FORMAT, id);
}

Transition gd_retry_transition(const PickedInstance &row, const StepDefinition &def, Datum error,
                               int64 explicit_backoff_us)
{
    Transition t{};
    t.step = row.step;
    t.error = error;
    t.eligible_at = GetCurrentTimestamp();
    if (row.attempt >= def.max_attempts) {
        t.status = "failed";
        t.attempt = row.attempt;
        return t;
    }
    int64 delay_us = explicit_backoff_us;
    if (delay_us < 0) {
        /* backoff * 2^(attempt-1), capped; the shift is bounded so it cannot overflow */
        int doublings = Min(row.attempt - 1, 40);
        delay_us = def.backoff_us;
        for (int i = 0; i < doublings && delay_us < def.max_backoff_us; i++)
            delay_us *= 2;
        delay_us = Min(delay_us, def.max_backoff_us);
    }
    t.status = "runnable";
    t.attempt = row.attempt + 1;
    t.eligible_at += delay_us;
    return t;
}

Datum gd_error_json(const ErrorData *edata, const PickedInstance &row)
{
    StringInfoData json;
    initStringInfo(&json);
    appendStringInfoChar(&json, '{');
    append_json_field(&json, "sqlstate", unpack_sql_state(edata->sqlerrcode), true);
    append_json_field(&json, "message", edata->message);
    append_json_field(&json, "detail", edata->detail);
    append_json_field(&json, "step", row.step);
    appendStringInfo(&json, ", \"attempt\": %d}", row.attempt);
    Datum result = DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));
    pfree(json.data);
    return result;
}
