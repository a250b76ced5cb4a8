/*
 * step_records.cpp — what a finished step leaves behind, whichever way it
 * ran (an executor's round, a backend's gd_drain or gd_run_here, an
 * external worker's completion): its count and time in gd.stats and
 * gd.step_stats, and, for an FSM version defined with history => true, a
 * row of gd._step_history written in the step's own transaction, so it
 * commits or rolls back with the step.
 */
#include "executor.hpp"
#include "labelled_stats.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/builtins.h"
}

namespace {

/* This process as a step's runner: "gen_durable executor default[0] app (pid 123)", or "backend (pid 123)". */
const char *this_runner()
{
    static char name[BGW_MAXLEN + 32];
    if (name[0] == '\0')
        snprintf(name, sizeof(name), "%s (pid %d)", MyBgworkerEntry != nullptr ? MyBgworkerEntry->bgw_name : "backend",
                 MyProcPid);
    return name;
}

void append_history(int64 id, const Transition &t)
{
    static SPIPlanPtr append_plan = nullptr;
    TimestampTz ended = t.started_at != 0 ? t.started_at + t.duration_us : GetCurrentTimestamp();
    TimestampTz started = t.started_at != 0 ? t.started_at : ended - t.duration_us;
    Datum args[8] = {Int64GetDatum(id),
                     Int32GetDatum(t.ran_attempt),
                     CStringGetTextDatum(t.ran_step),
                     CStringGetTextDatum(gd_step_kind(t.event)),
                     TimestampTzGetDatum(started),
                     TimestampTzGetDatum(ended),
                     t.error,
                     CStringGetTextDatum(t.worker != nullptr ? t.worker : this_runner())};
    char nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', t.error != 0 ? ' ' : 'n', ' '};
    if (gd_run_kept(append_plan,
                    "INSERT INTO gd._step_history (instance_id, attempt, step, kind, started_at, ended_at, error, worker)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    {INT8OID, INT4OID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, JSONBOID, TEXTOID}, args,
                    false, 0, nulls) != SPI_OK_INSERT)
        elog(ERROR, "gen_durable: could not append to the step history of instance " INT64_FORMAT, id);
}

} // namespace

void gd_record_finished_step(int64 id, const Transition &t)
{
    gd_count_step(t.event, t.duration_us);
    gd_count_labelled_step(t.fsm, t.ran_step, t.event, t.duration_us);
    if (t.history)
        append_history(id, t);
}
