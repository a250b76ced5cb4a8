/*
 * executor.cpp — an executor's round: run a batch of runnable steps of its
 * queue, and when there were none, sleep until the next scheduled row comes
 * due or the poll interval passes, whichever is sooner.  A batch is at most
 * batch_size steps, and as many as ran in batch_time at the previous
 * batch's pace: short steps share a commit, slow ones do not hold each
 * other's commit (and row locks) back — unless it ran a batch step's call,
 * which cannot be split: paced by steps, a slow one would shrink its batches
 * to one row, so the next round asks for batch_size again.  An idle executor
 * starts again at batch_size.
 */
#include "gen_durable.hpp"
#include "picker.hpp"
#include "rounds.hpp"
#include "step_runner.hpp"

extern "C" {
#include "utils/timestamp.h"
}

namespace {

/* Steps the next pick asks for while busy; 0: batch_size. */
int pick_limit = 0;

/* How many steps of the batch just run fit in batch_time. */
int steps_fitting_batch_time(int ran, TimestampTz started)
{
    int64 elapsed_us = Max(GetCurrentTimestamp() - started, static_cast<int64>(1));
    int64 fitting = static_cast<int64>(gd_batch_time_ms) * 1000 * ran / elapsed_us;
    return static_cast<int>(Max(static_cast<int64>(1), Min(fitting, static_cast<int64>(gd_batch_size))));
}

} // namespace

long gd_executor_round(WorkerSlot *slot, const char *queue)
{
    int limit = pick_limit > 0 ? Min(pick_limit, gd_batch_size) : gd_batch_size;
    TimestampTz started = GetCurrentTimestamp();
    BatchRun run = gd_execute_batch(queue, limit, slot);
    if (run.ran > 0) {
        pick_limit = run.ran_batch_calls ? 0 : steps_fitting_batch_time(run.ran, started);
        return 0; /* there may be more: look again at once */
    }
    pick_limit = 0;
    TimestampTz due = gd_next_due(queue);
    long sleep_ms = gd_poll_interval_ms;
    if (due != 0) {
        long until_due = static_cast<long>((due - GetCurrentTimestamp()) / 1000) + 1;
        sleep_ms = Max(1L, Min(sleep_ms, until_due));
    }
    return sleep_ms;
}
