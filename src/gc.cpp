/*
 * gc.cpp — the garbage collector's round, one collector per served database.
 * Each round deletes one small batch of terminal instances older than
 * gen_durable.retention (gd._gc), in its own transaction, so it never holds
 * locks for long; full batches follow each other at once, each from where
 * the one before stopped (sweep_frontier: see gd._gc), and a sweep that
 * removed anything is logged once, with its total, when it ends.  Each sweep
 * starts from the front, for rows that committed late with an older
 * finished_at.
 */
#include "gen_durable.hpp"
#include "kept_plans.hpp"
#include "rounds.hpp"

namespace {

constexpr int GC_BATCH = 1000;

SPIPlanPtr gc_plan = nullptr;
int64 swept_this_sweep = 0;
TimestampTz sweep_frontier = DT_NOBEGIN;

} // namespace

long gd_gc_round(const char *database)
{
    if (gc_plan == nullptr) {
        Oid types[3] = {INT4OID, INT4OID, TIMESTAMPTZOID};
        gc_plan = gd_prepare_kept("SELECT swept, last_finished FROM gd._gc(make_interval(secs => $1), $2, $3)", 3,
                                  types);
    }
    Datum args[3] = {Int32GetDatum(gd_retention_s), Int32GetDatum(GC_BATCH), TimestampTzGetDatum(sweep_frontier)};
    if (gd_execute_kept(gc_plan, args, nullptr, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: gd._gc() failed");
    bool isnull;
    int swept = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    Datum last_finished = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
    swept_this_sweep += swept;
    if (swept >= GC_BATCH) {
        if (!isnull)
            sweep_frontier = DatumGetTimestampTz(last_finished);
        return 0; /* more to sweep: go on at once, in a new transaction */
    }
    sweep_frontier = DT_NOBEGIN;
    if (swept_this_sweep > 0)
        ereport(LOG, (errmsg("gen_durable: GC swept " INT64_FORMAT " finished instances in database \"%s\"",
                             swept_this_sweep, database)));
    swept_this_sweep = 0;
    return gd_gc_interval_ms;
}
