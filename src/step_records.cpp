/*
 * step_records.cpp — what a finished step leaves behind, whichever way it
 * ran (an executor's round, a backend's gd_drain or gd._execute, an
 * external worker's completion): its count and time in gd.stats and
 * gd.step_stats, and, for an FSM version defined with history => true, a
 * row of gd._step_history written in the step's own transaction, so it
 * commits or rolls back with the step.  The rows of a batch of transitions
 * written together (transition.cpp) are inserted together, in one
 * statement.
 */
#include "step_records.hpp"
#include "gen_durable.hpp"
#include "kept_plans.hpp"
#include "labelled_stats.hpp"
#include "transition.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/builtins.h"
}

#include <type_traits>

/* History rows to insert, as the INSERT's array arguments, in the memory of the batch's writer. */
struct HistoryBatch {
    int count, capacity;
    Datum *ids, *attempts, *steps, *kinds, *started, *ended, *errors, *workers, *states;
    bool *error_nulls, *state_nulls;
};
static_assert(std::is_trivially_destructible_v<HistoryBatch>, "a HistoryBatch lives in palloc'd memory");

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

Datum *datum_array(int count)
{
    return static_cast<Datum *>(palloc(sizeof(Datum) * Max(count, 1)));
}

/* Add the step's row to the batch (which has room); its columns are made at the first row, as most
 * batches, of FSMs without a history, have none. */
void add_row(HistoryBatch &batch, int64 id, const Transition &t)
{
    if (batch.ids == nullptr) {
        for (Datum **column : {&batch.ids, &batch.attempts, &batch.steps, &batch.kinds, &batch.started, &batch.ended,
                               &batch.errors, &batch.workers, &batch.states})
            *column = datum_array(batch.capacity);
        batch.error_nulls = static_cast<bool *>(palloc(sizeof(bool) * batch.capacity));
        batch.state_nulls = static_cast<bool *>(palloc(sizeof(bool) * batch.capacity));
    }
    TimestampTz ended = t.ran.started_at != 0 ? t.ran.started_at + t.ran.duration_us : GetCurrentTimestamp();
    int i = batch.count++;
    batch.ids[i] = Int64GetDatum(id);
    batch.attempts[i] = Int32GetDatum(t.ran.attempt);
    batch.steps[i] = CStringGetTextDatum(t.ran.step);
    batch.kinds[i] = CStringGetTextDatum(t.ran.lost ? "lost" : gd_step_kind(t.ran.event));
    batch.started[i] = TimestampTzGetDatum(t.ran.started_at != 0 ? t.ran.started_at : ended - t.ran.duration_us);
    batch.ended[i] = TimestampTzGetDatum(ended);
    batch.errors[i] = t.to.error;
    batch.error_nulls[i] = t.to.error == 0;
    batch.workers[i] = CStringGetTextDatum(t.ran.worker != nullptr ? t.ran.worker : this_runner());
    batch.states[i] = t.ran.state;
    batch.state_nulls[i] = t.ran.state == 0;
}

} // namespace

HistoryBatch *gd_begin_history(int capacity)
{
    auto *batch = static_cast<HistoryBatch *>(palloc0(sizeof(HistoryBatch)));
    batch->capacity = Max(capacity, 1);
    return batch;
}

void gd_write_history(HistoryBatch *batch)
{
    static SPIPlanPtr insert_plan = nullptr;
    int n = batch->count;
    if (n == 0)
        return;
    batch->count = 0;
    Datum args[9] = {gd_array_of(batch->ids, nullptr, n, INT8OID),
                     gd_array_of(batch->attempts, nullptr, n, INT4OID),
                     gd_array_of(batch->steps, nullptr, n, TEXTOID),
                     gd_array_of(batch->kinds, nullptr, n, TEXTOID),
                     gd_array_of(batch->started, nullptr, n, TIMESTAMPTZOID),
                     gd_array_of(batch->ended, nullptr, n, TIMESTAMPTZOID),
                     gd_array_of(batch->errors, batch->error_nulls, n, JSONBOID),
                     gd_array_of(batch->workers, nullptr, n, TEXTOID),
                     gd_array_of(batch->states, batch->state_nulls, n, JSONBOID)};
    if (gd_run_kept(insert_plan,
                    "INSERT INTO gd._step_history (instance_id, attempt, step, kind, started_at, ended_at, error, worker,"
                    "                              state)"
                    " SELECT * FROM unnest($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    {INT8ARRAYOID, INT4ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, TIMESTAMPTZARRAYOID,
                     JSONBARRAYOID, TEXTARRAYOID, JSONBARRAYOID},
                    args, false, 0) != SPI_OK_INSERT)
        elog(ERROR, "gen_durable: could not append %d rows to the step history", n);
}

void gd_record_finished_step(int64 id, const Transition &t, HistoryBatch *batch)
{
    if (!t.ran.lost) {
        gd_count_step(t.ran.event, t.ran.duration_us);
        gd_count_labelled_step(t.ran.fsm, t.ran.version, t.ran.step, t.ran.event, t.ran.duration_us);
    }
    if (!t.ran.history)
        return;
    if (batch != nullptr && batch->count < batch->capacity) {
        add_row(*batch, id, t);
        return;
    }
    HistoryBatch *alone = gd_begin_history(1);
    add_row(*alone, id, t);
    gd_write_history(alone);
}
