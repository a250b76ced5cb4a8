/*
 * kept_plans.cpp — the engine's own SQL statements: prepared once per
 * backend, kept, generic, and planned for gen_durable's indexes.
 *
 * Every statement here is written for an index on gd.instances (the pick
 * index, the primary key, a partial index per duty), so its best plan does
 * not depend on its parameters: one generic plan saves planning per call.
 * But a plan is made from the table's statistics when it is first used or
 * invalidated, and statistics taken while a queue was empty (after a
 * TRUNCATE, say) make a sequential scan and a sort look free: kept, such a
 * plan scans the whole table for every pick once the backlog arrives.  So
 * the statements run (and are planned) with sequential scans disabled for
 * their own duration, as a function's SET clause would.  (Not sorts: some
 * statements need one, and would walk a whole index in order instead.)
 */
#include "executor.hpp"

extern "C" {
#include "utils/guc.h"
}

SPIPlanPtr gd_prepare_kept(const char *sql, int nargs, Oid *types)
{
    SPIPlanPtr plan = SPI_prepare_cursor(sql, nargs, types, CURSOR_OPT_GENERIC_PLAN);
    if (plan == nullptr)
        elog(ERROR, "gen_durable: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
    SPI_keepplan(plan);
    return plan;
}

int gd_execute_kept(SPIPlanPtr plan, Datum *args, const char *nulls, bool read_only, long count)
{
    /* Undone by the next line, or by the (sub)transaction's abort if the statement raises. */
    int nest_level = NewGUCNestLevel();
    (void) set_config_option("enable_seqscan", "off", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
    int result = SPI_execute_plan(plan, args, nulls, read_only, count);
    AtEOXact_GUC(true, nest_level);
    return result;
}
