/*
 * stats.hpp — the engine's event counters in shared memory (gd.stats).
 */
#pragma once

extern "C" {
#include "postgres.h"
#include "port/atomics.h"
}

/* Every event gd.stats reports, in its order. */
enum class StatEvent : int {
    step_next, step_retry, step_await, step_spawn, step_done, step_stop,
    pick, pick_rows, pick_demand, reaped, await_timeout, gc_swept, outcome_stale,
    rate_limit_throttled, rate_limit_contended, concurrency_throttled, concurrency_contended,
    reclaimed, drained, concurrency_repaired, labels_overflowed, work_notified,
    count_ /* number of events */
};
constexpr int GD_STAT_EVENTS = static_cast<int>(StatEvent::count_);

struct StatCounter {
    pg_atomic_uint64 count;
    pg_atomic_uint64 total_us; /* step events: time in the step */
    pg_atomic_uint64 max_us;
};

struct GdStats {
    StatCounter counters[GD_STAT_EVENTS];
    pg_atomic_uint64 reset_at; /* TimestampTz */
};

void gd_stats_init(GdStats *stats);
void gd_count(StatEvent event, uint64 amount = 1);
/* A step ended with this event after duration_us in the step. */
void gd_count_step(StatEvent event, int64 duration_us);
/* The telemetry kind of a step event ("next", "retry", ...); nullptr for any other. */
const char *gd_step_kind(StatEvent event);
