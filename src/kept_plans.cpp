/*
 * kept_plans.cpp — the engine's own SQL statements: prepared once per
 * backend, kept, generic, and planned for gen_durable's indexes.
 *
 * Every statement here is written for an index on gd._instances (the pick
 * index, the primary key, a partial index per duty), so its best plan does
 * not depend on its parameters: one generic plan saves planning per call.
 * But a plan is made from the table's statistics when it is first used or
 * invalidated, and statistics taken while a queue was empty (after a
 * TRUNCATE, say) make a sequential scan and a sort look free: kept, such a
 * plan scans the whole table for every pick once the backlog arrives.  So
 * the statements run (and are planned) with sequential scans disabled for
 * their own duration, as a function's SET clause would.  (Not sorts: some
 * statements need one, and would walk a whole index in order instead.)
 * The statements that join an array of a batch's ids to their rows are
 * planned without nested loops and merge joins too: from an empty table's
 * statistics the planner nests the array inside the row scan, reading it
 * again for every row (n² for a batch of n).
 * And none is compiled by the JIT: a generic plan's LIMIT $n is costed as a
 * tenth of its input, so with a large backlog every pick's plan looks
 * expensive enough to compile, each time, for a statement that reads a
 * few rows.  (Planning decides it, and it happens under these settings.)
 * And every one runs, and is prepared, with search_path pinned to
 * pg_catalog, pg_temp: the engine runs as a superuser, so no name in its
 * statements may resolve to an object a user made.
 */
#include "kept_plans.hpp"
#include "gen_durable.hpp"

extern "C" {
#include "utils/lsyscache.h"
#include "utils/guc.h"
}

namespace {

void turn_off(const char *setting)
{
    (void) set_config_option(setting, "off", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
}

} // namespace

SPIPlanPtr gd_prepare_kept(const char *sql, int nargs, Oid *types)
{
    /* Prepared under the path it runs under, or every run would plan it again. */
    int nest_level = gd_pin_search_path();
    SPIPlanPtr plan = SPI_prepare_cursor(sql, nargs, types, CURSOR_OPT_GENERIC_PLAN);
    AtEOXact_GUC(true, nest_level);
    if (plan == nullptr)
        elog(ERROR, "gen_durable: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
    SPI_keepplan(plan);
    return plan;
}

int gd_run_kept(SPIPlanPtr &plan, const char *sql, std::initializer_list<Oid> types, Datum *args, bool read_only,
                long count, const char *nulls)
{
    if (plan == nullptr) {
        Oid argument_types[FUNC_MAX_ARGS];
        int nargs = 0;
        for (Oid type : types)
            argument_types[nargs++] = type;
        plan = gd_prepare_kept(sql, nargs, argument_types);
    }
    return gd_execute_kept(plan, args, nulls, read_only, count);
}

int gd_run_kept_on_arguments(SPIPlanPtr &plan, const char *sql, std::initializer_list<Oid> types,
                             FunctionCallInfo fcinfo, bool read_only, long count)
{
    Datum args[FUNC_MAX_ARGS];
    char nulls[FUNC_MAX_ARGS];
    for (int i = 0; i < fcinfo->nargs; i++) {
        args[i] = fcinfo->args[i].value;
        nulls[i] = fcinfo->args[i].isnull ? 'n' : ' ';
    }
    return gd_run_kept(plan, sql, types, args, read_only, count, nulls);
}

int gd_execute_kept(SPIPlanPtr plan, Datum *args, const char *nulls, bool read_only, long count, KeptJoins joins)
{
    /* Undone by AtEOXact_GUC below, or by the (sub)transaction's abort if the statement raises. */
    int nest_level = gd_pin_search_path();
    turn_off("enable_seqscan");
    turn_off("jit");
    if (joins == KeptJoins::hashed) {
        turn_off("enable_nestloop");
        turn_off("enable_mergejoin");
    }
    int result = SPI_execute_plan(plan, args, nulls, read_only, count);
    AtEOXact_GUC(true, nest_level);
    return result;
}

Datum gd_array_of(Datum *values, bool *nulls, int count, Oid type)
{
    int16 length;
    bool by_value;
    char align;
    get_typlenbyvalalign(type, &length, &by_value, &align);
    int dims[1] = {count};
    int lower_bounds[1] = {1};
    return PointerGetDatum(construct_md_array(values, nulls, 1, dims, lower_bounds, type, length, by_value, align));
}
