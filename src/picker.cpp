/*
 * picker.cpp — choosing the next rows an executor runs, and the steps
 * gd_claim hands an external worker (the same statement on the claim index).
 * One prepared, kept plan locks up to batch_size runnable in-database steps
 * of the queue, best first (priority, then eligibility, then id), skipping
 * rows other executors hold; the lock lasts until the round commits, so no
 * row runs twice at once and a crash simply releases it.  Each priority is
 * read from its mark in the queue's frontier (frontier.cpp) rather than from
 * the front of the index, where the entries of rows already run wait for
 * vacuum — which a long transaction can hold off for as long as it stays
 * open.  A second plan tells an idle executor when the next scheduled row
 * comes due, so it sleeps exactly that long (or the poll interval, whichever
 * is shorter).  Both use the one pick index: a second index on eligibility
 * lured the planner into sorting the whole backlog for every pick.
 */
#include "picker.hpp"
#include "frontier.hpp"
#include "gen_durable.hpp"
#include "instance_status.hpp"
#include "kept_plans.hpp"

extern "C" {
#include "common/hashfn.h"
#include "utils/builtins.h"
#include "utils/datum.h"
}

namespace {

char *copy_text(HeapTuple tuple, TupleDesc desc, int column)
{
    bool isnull;
    Datum value = SPI_getbinval(tuple, desc, column, &isnull);
    return isnull ? nullptr : TextDatumGetCString(value);
}

} // namespace

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
    row.owner = DatumGetObjectId(SPI_getbinval(tuple, desc, 13, &isnull));
    row.updated_at = DatumGetTimestampTz(SPI_getbinval(tuple, desc, 14, &isnull));
    row.priority = DatumGetInt32(SPI_getbinval(tuple, desc, 15, &isnull));
    row.eligible_at = DatumGetTimestampTz(SPI_getbinval(tuple, desc, 16, &isnull));
    row.trace_context = copy_text(tuple, desc, 17);
    row.visit_key = copy_text(tuple, desc, 18);
    Datum cancelled = SPI_getbinval(tuple, desc, 19, &isnull);
    row.cancelled = isnull ? 0 : datumCopy(cancelled, false, -1);
}

namespace {

/* The rows the pick index holds (in-database steps), and the claim index
 * (external steps), of queue $1: each predicate as its index spells it. */
#define PICKABLE "i.queue = $1 AND i.status = " GD_STATUS(runnable) " AND NOT i.external AND NOT i.gated"
#define CLAIMABLE "i.queue = $1 AND i.status = " GD_STATUS(runnable) " AND i.external AND NOT i.gated"

/* The first row of each priority in the index, ascending, one index descent
 * each (a loose index scan): the queue's frontier, found from the front. */
#define FIRST_ROWS(rows)                                                                                        \
    "WITH RECURSIVE firsts(priority, eligible_at, id) AS ("                                                    \
    "  (SELECT i.priority, i.eligible_at, i.id FROM gd._instances i WHERE " rows                                \
    "    ORDER BY i.priority, i.eligible_at, i.id LIMIT 1)"                                                    \
    "  UNION ALL"                                                                                              \
    "  SELECT n.* FROM firsts p CROSS JOIN LATERAL ("                                                          \
    "    SELECT i.priority, i.eligible_at, i.id FROM gd._instances i WHERE " rows " AND i.priority > p.priority" \
    "     ORDER BY i.priority, i.eligible_at, i.id LIMIT 1) n) "                                               \
    "SELECT priority, eligible_at, id FROM firsts"

/* The frontier's marks, one row per priority: ($3[k], $4[k], $5[k]). */
#define MARKS "unnest($3::int4[], $4::timestamptz[], $5::int8[]) AS p(priority, eligible_at, id)"

/* Lock up to $2 rows of `rows` (and `also`) due by `due`, best first, from each
 * priority's mark on.  Taking each priority's due rows on their own lets a
 * scan stop at the priority's first future row: across priorities, the
 * future rows of one lie before the due rows of the next.  The nested loop
 * over ascending priorities yields rows in order, and the outer LIMIT stops
 * it (and the locking) as soon as it has enough.  A paused queue yields
 * nothing. */
#define DUE_ROWS(rows, also, due)                                                                              \
    "SELECT r.* FROM " MARKS " CROSS JOIN LATERAL ("                                                           \
    "  SELECT " GD_INSTANCE_COLUMNS " FROM gd._instances i"                          \
    "   WHERE " rows " AND i.priority = p.priority AND i.eligible_at <= " due                                   \
    "     AND (i.eligible_at, i.id) >= (p.eligible_at, p.id)" also                                              \
    "   ORDER BY i.eligible_at, i.id"                                                                          \
    "   LIMIT $2"                                                                                              \
    "   FOR UPDATE OF i SKIP LOCKED) r"                                                                        \
    " WHERE NOT EXISTS (SELECT FROM gd._queues q WHERE q.name = $1 AND q.paused)"                              \
    " LIMIT $2"

/* The view's marks as the arguments $3, $4, $5 of MARKS. */
void marks_arguments(const FrontierView &view, Datum *args)
{
    Datum *priorities = static_cast<Datum *>(palloc(sizeof(Datum) * Max(view.count, 1)));
    Datum *times = static_cast<Datum *>(palloc(sizeof(Datum) * Max(view.count, 1)));
    Datum *ids = static_cast<Datum *>(palloc(sizeof(Datum) * Max(view.count, 1)));
    for (int i = 0; i < view.count; i++) {
        priorities[i] = Int32GetDatum(view.marks[i].priority);
        times[i] = TimestampTzGetDatum(view.marks[i].eligible_at);
        ids[i] = Int64GetDatum(view.marks[i].id);
    }
    args[0] = PointerGetDatum(construct_array(priorities, view.count, INT4OID, 4, true, TYPALIGN_INT));
    args[1] = PointerGetDatum(construct_array(times, view.count, TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
    args[2] = PointerGetDatum(construct_array(ids, view.count, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/* The scope of a claim frontier of the FSMs named in `usable` (a text[]): never 0, the scope of all. */
uint32 fsms_scope(Datum usable)
{
    ArrayType *names = DatumGetArrayTypeP(usable);
    uint32 hash = DatumGetUInt32(hash_any(reinterpret_cast<const unsigned char *>(names), VARSIZE(names)));
    return hash == 0 ? 1 : hash;
}

/* The queue's frontier to pick from: when it must be found from the front, found now. */
FrontierView frontier_to_pick(const char *queue, bool external, uint32 scope = 0)
{
    static SPIPlanPtr pick_firsts_plan = nullptr, claim_firsts_plan = nullptr;
    FrontierView view = gd_frontier_view(queue, external, scope);
    if (!view.from_front)
        return view;
    SPIPlanPtr &plan = external ? claim_firsts_plan : pick_firsts_plan;
    if (plan == nullptr) {
        Oid types[1] = {TEXTOID};
        plan = gd_prepare_kept(external ? FIRST_ROWS(CLAIMABLE) : FIRST_ROWS(PICKABLE), 1, types);
    }
    Datum args[1] = {CStringGetTextDatum(queue)};
    TimestampTz started = GetCurrentTimestamp();
    if (gd_execute_kept(plan, args, nullptr, true, 0) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: finding the first rows of queue \"%s\" failed", queue);
    int found = static_cast<int>(SPI_processed);
    /* Every priority's first row: more priorities than a frontier tracks are all picked from the front. */
    PickKey *firsts = static_cast<PickKey *>(palloc(sizeof(PickKey) * Max(found, 1)));
    for (int i = 0; i < found; i++) {
        HeapTuple row = SPI_tuptable->vals[i];
        bool isnull;
        firsts[i] = PickKey{DatumGetInt32(SPI_getbinval(row, SPI_tuptable->tupdesc, 1, &isnull)),
                            DatumGetTimestampTz(SPI_getbinval(row, SPI_tuptable->tupdesc, 2, &isnull)),
                            DatumGetInt64(SPI_getbinval(row, SPI_tuptable->tupdesc, 3, &isnull))};
    }
    SPI_freetuptable(SPI_tuptable);
    gd_frontier_found(view, firsts, found, started);
    view.count = found;
    view.marks = firsts;
    return view;
}

/*
 * After a pick from `view` locked `rows` (ascending): raise each priority's
 * mark past its last row, and announce each priority's first row at the end
 * of the transaction — on abort they are given back, and at commit some may
 * still be runnable.
 */
void account_for_pick(const FrontierView &view, const char *queue, bool external, const PickedInstance *rows,
                      int count)
{
    PickKey *last = static_cast<PickKey *>(palloc(sizeof(PickKey) * Max(count, 1)));
    int priorities = 0;
    for (int i = 0; i < count; i++) {
        PickKey key{rows[i].priority, rows[i].eligible_at, rows[i].id};
        if (priorities > 0 && last[priorities - 1].priority == key.priority) {
            last[priorities - 1] = key;
        } else {
            gd_frontier_announce_at_end(queue, external, &key, true);
            last[priorities++] = key;
        }
    }
    gd_frontier_passed(view, last, priorities);
}

/* Copy a pick's rows out of SPI memory, which does not outlive this round's SPI connection. */
void copy_picked(uint64 count, PickedInstance *out, MemoryContext into, const char *queue)
{
    MemoryContext spi_context = MemoryContextSwitchTo(into);
    for (uint64 i = 0; i < count; i++) {
        gd_read_instance(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, out[i]);
        out[i].queue = queue;
    }
    MemoryContextSwitchTo(spi_context);
}

/* The rows a pick statement locked (it returned `result`), copied out, its tuple table freed; how many. */
int take_locked_rows(int result, PickedInstance *out, MemoryContext into, const char *queue)
{
    if (result != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: pick failed");
    uint64 count = SPI_processed;
    copy_picked(count, out, into, queue);
    SPI_freetuptable(SPI_tuptable);
    return static_cast<int>(count);
}

} // namespace

int gd_pick(const char *queue, int limit, PickedInstance *out, MemoryContext into)
{
    static SPIPlanPtr pick_plan = nullptr;
    if (pick_plan == nullptr) {
        Oid types[5] = {TEXTOID, INT4OID, INT4ARRAYOID, TIMESTAMPTZARRAYOID, INT8ARRAYOID};
        pick_plan = gd_prepare_kept(DUE_ROWS(PICKABLE, "", "now()"), 5, types);
    }
    FrontierView view = frontier_to_pick(queue, false);
    Datum args[5] = {CStringGetTextDatum(queue), Int32GetDatum(limit), 0, 0, 0};
    marks_arguments(view, args + 2);
    int count = take_locked_rows(gd_execute_kept(pick_plan, args, nullptr, false, 0), out, into, queue);
    account_for_pick(view, queue, false, out, count);
    return count;
}

int gd_pick_to_drain(const char *queue, int limit, PickedInstance *out, MemoryContext into, const DrainScope &scope)
{
    static SPIPlanPtr drain_plan = nullptr;
    if (drain_plan == nullptr) {
        Oid types[5] = {TEXTOID, INT4OID, OIDOID, BOOLOID, TIMESTAMPTZOID};
        drain_plan = gd_prepare_kept("SELECT " GD_INSTANCE_COLUMNS " FROM gd._instances i"
                                     " WHERE " PICKABLE " AND ($4 OR i.eligible_at <= $5)"
                                     "   AND pg_catalog.pg_has_role($3, i.owner, 'MEMBER')"
                                     "   AND NOT EXISTS (SELECT FROM gd._queues q WHERE q.name = $1 AND q.paused)"
                                     " ORDER BY i.priority, i.eligible_at, i.id LIMIT $2"
                                     " FOR UPDATE OF i SKIP LOCKED",
                                     5, types);
    }
    Datum args[5] = {CStringGetTextDatum(queue), Int32GetDatum(limit), ObjectIdGetDatum(scope.member),
                     BoolGetDatum(scope.with_scheduled), TimestampTzGetDatum(gd_session_now())};
    return take_locked_rows(gd_execute_kept(drain_plan, args, nullptr, false, 0), out, into, queue);
}

int gd_pick_external(const char *queue, int limit, Datum usable, PickedInstance *out, MemoryContext into)
{
    static SPIPlanPtr claim_plan = nullptr;
    if (claim_plan == nullptr) {
        Oid types[7] = {TEXTOID, INT4OID, INT4ARRAYOID, TIMESTAMPTZARRAYOID, INT8ARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID};
        /* Due by the clock ($7), not by the transaction's start: a claim that waits picks again later in it. */
        claim_plan = gd_prepare_kept(DUE_ROWS(CLAIMABLE, " AND ($6::text[] IS NULL OR i.fsm = ANY ($6))", "$7"), 7, types);
    }
    /* A worker that may claim only some FSMs' steps passes the others' rows by: the frontier of
     * those FSMs is its own (a grant changes the set, and so the frontier). */
    FrontierView view = frontier_to_pick(queue, true, usable == 0 ? 0 : fsms_scope(usable));
    Datum args[7] = {CStringGetTextDatum(queue), Int32GetDatum(limit), 0, 0, 0, usable,
                     TimestampTzGetDatum(gd_session_now())};
    marks_arguments(view, args + 2);
    const char nulls[7] = {' ', ' ', ' ', ' ', ' ', usable == 0 ? 'n' : ' ', ' '};
    int count = take_locked_rows(gd_execute_kept(claim_plan, args, nulls, false, 0), out, into, queue);
    account_for_pick(view, queue, true, out, count);
    return count;
}

TimestampTz gd_next_due(const char *queue)
{
    static SPIPlanPtr due_plan = nullptr;
    if (due_plan == nullptr) {
        Oid types[5] = {TEXTOID, INT4OID, INT4ARRAYOID, TIMESTAMPTZARRAYOID, INT8ARRAYOID};
        /* Each priority's first future row ($2 unused: the arguments are the pick's). */
        due_plan = gd_prepare_kept(
            "SELECT min((SELECT i.eligible_at FROM gd._instances i"
            "             WHERE " PICKABLE " AND i.priority = p.priority AND (i.eligible_at, i.id) >= (p.eligible_at, p.id)"
            "               AND i.eligible_at > now()"
            "             ORDER BY i.eligible_at, i.id LIMIT 1))"
            "  FROM " MARKS,
            5, types);
    }
    FrontierView view = frontier_to_pick(queue, false);
    Datum args[5] = {CStringGetTextDatum(queue), Int32GetDatum(0), 0, 0, 0};
    marks_arguments(view, args + 2);
    if (gd_execute_kept(due_plan, args, nullptr, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: next-due query failed");
    bool isnull;
    Datum due = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    return isnull ? 0 : DatumGetTimestampTz(due);
}
