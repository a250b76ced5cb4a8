/*
 * gc.cpp — the garbage collector's round, one collector per served database.
 * Each round deletes one small batch of terminal instances older than
 * gen_durable.retention (gd._gc), in its own transaction, so it never holds
 * locks for long; full batches follow each other at once, and a sweep that
 * removed anything is logged once, with its total, when it ends.
 *
 * Each batch goes on from the latest finished_at the batch before deleted
 * (sweep_mark): the index entries before it are of rows deleted, which a
 * held MVCC horizon keeps, and a batch that started from the front would
 * walk them all again.  A sweep starts from the front, for the rows the one
 * before passed by (a child kept while its parent was live, a row locked at
 * the time, a row that committed after the mark passed its finished_at) —
 * unless a batch from the front has become slow, which is when a horizon
 * held has left many entries there: then sweeps go on from the mark, and
 * one from the front comes when it takes at most 1% of the time.
 */
#include "gen_durable.hpp"
#include "kept_plans.hpp"
#include "rounds.hpp"

namespace {

constexpr int GC_BATCH = 1000;
constexpr int64 FRONT_SWEEP_SHARE = 100;

SPIPlanPtr gc_plan = nullptr;
int64 swept_this_sweep = 0;
TimestampTz sweep_mark = DT_NOBEGIN;
TimestampTz swept_from_front_at = 0;
int64 front_batch_us = 0; /* how long the last batch from the front took */

} // namespace

long gd_gc_round(const char *database)
{
    if (gc_plan == nullptr) {
        Oid types[3] = {INT4OID, INT4OID, TIMESTAMPTZOID};
        gc_plan = gd_prepare_kept("SELECT swept, last_finished FROM gd._gc(make_interval(secs => $1), $2, $3)", 3,
                                  types);
    }
    TimestampTz now = GetCurrentTimestamp();
    int64 started_us = gd_monotonic_us();
    bool from_front =
        swept_this_sweep == 0 && gd_interval_passed(swept_from_front_at, now, FRONT_SWEEP_SHARE * front_batch_us);
    if (from_front) {
        sweep_mark = DT_NOBEGIN;
        swept_from_front_at = now;
    }
    Datum args[3] = {Int32GetDatum(gd_retention_s), Int32GetDatum(GC_BATCH), TimestampTzGetDatum(sweep_mark)};
    if (gd_execute_kept(gc_plan, args, nullptr, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: gd._gc() failed");
    bool isnull;
    int swept = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    Datum last_finished = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
    if (from_front)
        front_batch_us = gd_monotonic_us() - started_us;
    swept_this_sweep += swept;
    if (!isnull)
        sweep_mark = DatumGetTimestampTz(last_finished);
    if (swept >= GC_BATCH)
        return 0; /* more to sweep: go on at once, in a new transaction */
    if (swept_this_sweep > 0)
        ereport(LOG, (errmsg("gen_durable: GC swept " INT64_FORMAT " finished instances in database \"%s\"",
                             swept_this_sweep, database)));
    swept_this_sweep = 0;
    return gd_gc_interval_ms;
}
