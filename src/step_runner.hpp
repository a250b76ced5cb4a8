/*
 * step_runner.hpp — running a batch of picked steps to their transitions (step_runner.cpp).
 */
#pragma once

#include "gen_durable.hpp"
#include "picker.hpp"

/*
 * Pick up to `limit` steps of the queue and run each to its transition, in
 * the caller's transaction and SPI connection; gd_await callers are woken at
 * commit.  Rows are copied into CurrentMemoryContext.  Reports progress in
 * `slot` when given; picks only `drain`'s instances when given.
 */
struct BatchRun {
    int ran;              /* steps run */
    bool ran_batch_calls; /* some ran in a batch step's handler call */
};
BatchRun gd_execute_batch(const char *queue, int limit, WorkerSlot *slot, const DrainScope *drain = nullptr);
