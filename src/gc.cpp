/*
 * gc.cpp — the garbage collector's round, one collector per served database.
 * Each round deletes one small batch of terminal instances older than
 * gen_durable.retention (gd._gc), in its own transaction, so it never holds
 * locks for long; full batches follow each other at once, and a sweep that
 * removed anything is logged once, with its total, when it ends.
 */
#include "executor.hpp"

namespace {

constexpr int GC_BATCH = 1000;

SPIPlanPtr gc_plan = nullptr;
int64 swept_this_sweep = 0;

} // namespace

long gd_gc_round(const char *database)
{
    if (gc_plan == nullptr) {
        Oid types[2] = {INT4OID, INT4OID};
        gc_plan = gd_prepare_kept("SELECT gd._gc(make_interval(secs => $1), $2)", 2, types);
    }
    Datum args[2] = {Int32GetDatum(gd_retention_s), Int32GetDatum(GC_BATCH)};
    if (gd_execute_kept(gc_plan, args, nullptr, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: gd._gc() failed");
    bool isnull;
    int swept = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    swept_this_sweep += swept;
    if (swept >= GC_BATCH)
        return 0; /* more to sweep: go on at once, in a new transaction */
    if (swept_this_sweep > 0)
        ereport(LOG, (errmsg("gen_durable: GC swept " INT64_FORMAT " finished instances in database \"%s\"",
                             swept_this_sweep, database)));
    swept_this_sweep = 0;
    return gd_gc_interval_ms;
}
