/*
 * labelled_stats.hpp — the engine's counters broken down by label set (per
 * database and FSM step, queue, or limit), in fixed-size shared tables:
 * gd.step_stats, the counters of gd.queue_stats, gd.limit_stats.
 */
#pragma once

#include "stats.hpp"

extern "C" {
#include "storage/lwlock.h"
}

/* Shared memory the tables take, and their locks' tranche (shmem.cpp asks for both). */
Size gd_labelled_stats_size();
constexpr int GD_LABELLED_STATS_LOCKS = 3;
/* At shared memory startup: find the tables (empty them first when `fresh`). */
void gd_labelled_stats_attach(void *memory, LWLockPadded *locks, bool fresh);
/* gd_stats_reset(): every table empty again. */
void gd_labelled_stats_reset();

/* A step of (fsm, version, step) in this database ended with a step event after duration_us. */
void gd_count_labelled_step(const char *fsm, int version, const char *step, StatEvent event, int64 duration_us);

/* What gd.queue_stats counts per queue of this database. */
enum class QueueEvent : int { picks, rows_asked, rows_picked, drained, reclaimed, stale_outcomes, count_ };
void gd_count_queue(const char *queue, QueueEvent event, uint64 amount = 1);
/* An executor's pick or a gd_claim: asked for `asked` steps of the queue, got `picked`. */
void gd_count_queue_pick(const char *queue, int asked, int picked);

/* A rate limit's tokens or a concurrency key's room, wanted and granted (key: name or name:partition). */
enum class LimitKind : int { rate_limit, concurrency, unknown_policy };
struct LimitCounts {
    uint64 wanted, granted, throttled, contended;
};
void gd_count_limit(LimitKind kind, const char *key, const LimitCounts &counts);
/* A step of (fsm, step) named a rate limit that has no policy (gd_set_rate_limit). */
void gd_count_unknown_policy(const char *name, const char *fsm, const char *step);

/* An executor's slot figures for gd.queue_stats (worker.cpp, executor.cpp, step_runner.cpp). */
struct WorkerSlot;
void gd_note_executor_busy(WorkerSlot *slot, bool busy);
void gd_note_round(WorkerSlot *slot, int pick_limit, int in_flight);
