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

/*
 * Where the reaper's scan for deadlines that passed (expired leases, timed-out
 * waits) goes on from.  Every claim and every timed wait leaves an entry in
 * its index, and while a long transaction holds the horizon the entries of
 * those long ended stay, dead but not removable, ahead of the live ones: a
 * scan from the front would visit them all every round.  A scan that found
 * fewer than its batch moves the mark to the time it scanned up to, one that
 * stopped at its batch to the last deadline it took.  Each scan starts a
 * second before the mark (for a row committed just after the scan before
 * passed its deadline), and from the front every 10 s (for a row a scan
 * skipped locked, or one committed later still).  Plain data: a static of
 * the reaper's.
 */
struct DeadlineScan {
    static constexpr int64 OVERLAP_US = USECS_PER_SEC;
    static constexpr int64 RESCAN_US = 10 * USECS_PER_SEC;
    TimestampTz mark = DT_NOBEGIN;
    TimestampTz from_front_at = 0;
    TimestampTz scanned_to = 0; /* the last scan's upper bound: deadlines after it are still to come */

    /* The earliest deadline a scan up to `now` looks at. */
    TimestampTz from(TimestampTz now)
    {
        if (gd_interval_passed(from_front_at, now, RESCAN_US)) {
            mark = DT_NOBEGIN;
            from_front_at = now;
        }
        return mark == DT_NOBEGIN ? DT_NOBEGIN : mark - OVERLAP_US;
    }
    /* The scan up to `now` took `count` rows of at most `batch`, the last one's deadline `last`. */
    void took(int count, int batch, TimestampTz last, TimestampTz now)
    {
        mark = count < batch ? now : last;
        scanned_to = now;
    }
};

