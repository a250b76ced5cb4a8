/*
 * picker.cpp — choosing the next rows an executor runs.  One prepared,
 * kept plan locks up to batch_size runnable in-database steps of the queue,
 * best first (priority, then eligibility, then id), skipping rows other
 * executors hold; the lock lasts until the round commits, so no row runs
 * twice at once and a crash simply releases it.  A second plan tells an idle
 * executor when the next scheduled row comes due, so it sleeps exactly that
 * long (or the poll interval, whichever is shorter).  Both use the one pick
 * index: a second index on eligibility lured the planner into sorting the
 * whole backlog for every pick.
 */
#include "executor.hpp"

extern "C" {
#include "utils/builtins.h"
#include "utils/datum.h"
}

namespace {

SPIPlanPtr pick_plan = nullptr;
SPIPlanPtr due_plan = nullptr;

char *copy_text(HeapTuple tuple, TupleDesc desc, int column)
{
    bool isnull;
    Datum value = SPI_getbinval(tuple, desc, column, &isnull);
    return isnull ? nullptr : TextDatumGetCString(value);
}

} // namespace

SPIPlanPtr gd_prepare_kept(const char *sql, int nargs, Oid *types)
{
    /* Generic: our statements' best plans do not depend on their parameters, and planning per call costs. */
    SPIPlanPtr plan = SPI_prepare_cursor(sql, nargs, types, CURSOR_OPT_GENERIC_PLAN);
    if (plan == nullptr)
        elog(ERROR, "gen_durable: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
    SPI_keepplan(plan);
    return plan;
}

void gd_read_instance(HeapTuple tuple, TupleDesc desc, PickedInstance &row)
{
    bool isnull;
    row.id = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
    row.fsm = copy_text(tuple, desc, 2);
    row.version = DatumGetInt32(SPI_getbinval(tuple, desc, 3, &isnull));
    row.step = copy_text(tuple, desc, 4);
    row.state = datumCopy(SPI_getbinval(tuple, desc, 5, &isnull), false, -1);
    row.attempt = DatumGetInt32(SPI_getbinval(tuple, desc, 6, &isnull));
    row.correlation_key = copy_text(tuple, desc, 7);
    Datum parent_id = SPI_getbinval(tuple, desc, 8, &isnull);
    row.parent_id = isnull ? 0 : DatumGetInt64(parent_id);
    Datum resume = SPI_getbinval(tuple, desc, 9, &isnull);
    row.resume = isnull ? 0 : datumCopy(resume, false, -1);
    row.concurrency_key = copy_text(tuple, desc, 10);
    row.rate_limit = copy_text(tuple, desc, 11);
    row.weight = DatumGetInt32(SPI_getbinval(tuple, desc, 12, &isnull));
}

int gd_pick(const char *queue, int limit, PickedInstance *out, MemoryContext into)
{
    if (pick_plan == nullptr) {
        Oid types[2] = {TEXTOID, INT4OID};
        pick_plan = gd_prepare_kept(
            "SELECT " GD_INSTANCE_COLUMNS
            "  FROM gd.instances i"
            " WHERE i.queue = $1 AND i.status = 'runnable' AND NOT i.external AND NOT i.gated AND i.eligible_at <= now()"
            "   AND NOT EXISTS (SELECT FROM gd.queues q WHERE q.name = $1 AND q.paused)"
            " ORDER BY i.priority, i.eligible_at, i.id"
            " LIMIT $2"
            " FOR UPDATE OF i SKIP LOCKED",
            2, types);
    }
    Datum args[2] = {CStringGetTextDatum(queue), Int32GetDatum(limit)};
    if (SPI_execute_plan(pick_plan, args, nullptr, false, 0) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: pick failed");

    /* Copy out of SPI memory, which does not outlive this round's SPI connection. */
    MemoryContext spi_context = MemoryContextSwitchTo(into);
    int count = static_cast<int>(SPI_processed);
    TupleDesc desc = SPI_tuptable->tupdesc;
    for (int i = 0; i < count; i++)
        gd_read_instance(SPI_tuptable->vals[i], desc, out[i]);
    MemoryContextSwitchTo(spi_context);
    SPI_freetuptable(SPI_tuptable);
    return count;
}

TimestampTz gd_next_due(const char *queue)
{
    if (due_plan == nullptr) {
        Oid types[1] = {TEXTOID};
        /* The pick index is ordered by priority first: visit each priority
         * present (a loose index scan) and take its first future row. */
        due_plan = gd_prepare_kept(
            "WITH RECURSIVE priorities(priority) AS ("
            "  (SELECT i.priority FROM gd.instances i"
            "    WHERE i.queue = $1 AND i.status = 'runnable' AND NOT i.external AND NOT i.gated"
            "    ORDER BY i.priority LIMIT 1)"
            "  UNION ALL"
            "  SELECT (SELECT i.priority FROM gd.instances i"
            "           WHERE i.queue = $1 AND i.status = 'runnable' AND NOT i.external AND NOT i.gated"
            "             AND i.priority > p.priority"
            "           ORDER BY i.priority LIMIT 1)"
            "    FROM priorities p WHERE p.priority IS NOT NULL)"
            "SELECT min((SELECT i.eligible_at FROM gd.instances i"
            "             WHERE i.queue = $1 AND i.status = 'runnable' AND NOT i.external AND NOT i.gated"
            "               AND i.priority = p.priority AND i.eligible_at > now()"
            "             ORDER BY i.eligible_at LIMIT 1))"
            "  FROM priorities p WHERE p.priority IS NOT NULL",
            1, types);
    }
    Datum args[1] = {CStringGetTextDatum(queue)};
    if (SPI_execute_plan(due_plan, args, nullptr, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: next-due query failed");
    bool isnull;
    Datum due = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    return isnull ? 0 : DatumGetTimestampTz(due);
}
