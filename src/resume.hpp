/*
 * resume.hpp — parked instances going on (resume.cpp): a wait ended by a
 * signal or its timeout, a parent whose children have all ended.
 */
#pragma once

extern "C" {
#include "postgres.h"
#include "utils/timestamp.h"
}

/*
 * Resume a parked instance, its row locked by the caller, at its then_step
 * with `resume` (jsonb: what the step sees in ctx); its queue's executors and
 * its awaiters are woken at commit.
 */
void gd_resume_parked(int64 id, Datum resume);
/* The instances a drain ends the waits of (those of `queue` whose owner `member` is a member of), as the
 * reaper would by `now`. */
struct DueScope {
    const char *queue;
    Oid member;
    TimestampTz now;
};
/* Resume the parents (all, or `parent` when not 0, or the scope's when given) whose children have all
 * ended; returns how many. */
int gd_resume_parents(int64 parent, const DueScope *scope = nullptr);
