/*
 * reaper.cpp — the reaper's round, one reaper per served database.  It runs
 * gd._reap(), which ends timed-out waits, reclaims expired leases and resumes
 * parents whose children have all finished, and returns the next deadline;
 * the reaper sleeps until then (at most gen_durable.reaper_interval) or until
 * a commit that finishes a child wakes it.
 */
#include "executor.hpp"

extern "C" {
#include "utils/timestamp.h"
}

namespace {

SPIPlanPtr reap_plan = nullptr;

} // namespace

long gd_reaper_round()
{
    if (reap_plan == nullptr) {
        reap_plan = gd_prepare_kept("SELECT gd._reap()", 0, nullptr);
    }
    if (gd_execute_kept(reap_plan, nullptr, nullptr, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: gd._reap() failed");
    bool isnull;
    Datum next = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    long sleep_ms = gd_reaper_interval_ms;
    if (!isnull) {
        long until_next = static_cast<long>((DatumGetTimestampTz(next) - GetCurrentTimestamp()) / 1000) + 1;
        sleep_ms = Max(0L, Min(sleep_ms, until_next));
    }
    return sleep_ms;
}
