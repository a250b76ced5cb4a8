/*
 * executor.cpp — an executor's round: run a batch of runnable steps of its
 * queue, and when there were none, sleep until the next scheduled row comes
 * due or the poll interval passes, whichever is sooner.
 */
#include "executor.hpp"

extern "C" {
#include "utils/timestamp.h"
}

long gd_executor_round(WorkerSlot *slot, const char *queue)
{
    if (gd_execute_batch(queue, gd_batch_size, slot) > 0)
        return 0; /* there may be more: look again at once */
    TimestampTz due = gd_next_due(queue);
    long sleep_ms = gd_poll_interval_ms;
    if (due != 0) {
        long until_due = static_cast<long>((due - GetCurrentTimestamp()) / 1000) + 1;
        sleep_ms = Max(1L, Min(sleep_ms, until_due));
    }
    return sleep_ms;
}
