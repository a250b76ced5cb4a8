/*
 * rounds.hpp — what an engine worker does inside one round's transaction
 * (worker.cpp runs the rounds); each returns the ms to sleep after it.
 */
#pragma once

#include "gen_durable.hpp"

long gd_executor_round(WorkerSlot *slot, const char *queue); /* executor.cpp */
long gd_reaper_round();                                      /* reaper.cpp */
long gd_gc_round(const char *database);                      /* gc.cpp */
/* The reaper's duty to external work (claims.cpp): reclaim up to `batch`
 * expired leases, announce scheduled work come due; returns when it next has
 * something to do (now: a full batch may leave more), or 0 for nothing. */
TimestampTz gd_expire_leases(int batch);
