/*
 * picker.cpp — choosing the next rows an executor runs, and the steps
 * gd_claim hands an external worker (the same statement on the claim index).  One prepared,
 * kept plan locks up to batch_size runnable in-database steps of the queue,
 * best first (priority, then eligibility, then id), skipping rows other
 * executors hold; the lock lasts until the round commits, so no row runs
 * twice at once and a crash simply releases it.  An executor goes on after
 * the last row of its previous full pick instead of scanning from the front
 * each time: the front of the index holds the entries of rows just run,
 * which cost a heap visit each until vacuum removes them — and while a long
 * transaction holds the MVCC horizon back, that is never.  It starts from
 * the front again after a short pick, when a commit woke it with new work
 * (which may sort before the resume point: a higher priority), and every
 * second (rows a rolled-back round gave back, or changed by hand).  A
 * second plan tells an idle executor when the next scheduled row comes due,
 * so it sleeps exactly that long (or the poll interval, whichever is
 * shorter).  Both use the one pick index: a second index on eligibility
 * lured the planner into sorting the whole backlog for every pick.
 */
#include "executor.hpp"

extern "C" {
#include "utils/builtins.h"
#include "utils/datum.h"
}

namespace {

SPIPlanPtr due_plan = nullptr;

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
}

namespace {

/* Where an executor's last full pick ended (the last row's key), to go on from there. */
struct ResumePoint {
    bool valid;
    int32 priority;
    TimestampTz eligible_at;
    int64 id;
    TimestampTz since; /* when the scan last started from the front */
};
ResumePoint resume_point{};

/* Back to the front at least this often: rows behind the resume point (a rolled-back round's) wait no longer. */
constexpr int64 RESTART_US = 1000 * 1000;

/* The rows the pick index holds (in-database steps), and the claim index
 * (external steps), of queue $1: each predicate as its index spells it. */
#define PICKABLE "i.queue = $1 AND i.status = 'runnable' AND NOT i.external AND NOT i.gated"
#define CLAIMABLE "i.queue = $1 AND i.status = 'runnable' AND i.external AND NOT i.gated"

/* The first row of each priority in the pick index from the row after `key`
 * (a (priority, eligible_at, id) row) on, ascending, one index descent each
 * (a loose index scan).  Taking each priority's due rows on their own lets a
 * scan stop at the priority's first future row: across priorities, the
 * future rows of one lie before the due rows of the next, and a single scan
 * of the index would walk through every scheduled row for each pick that
 * finds fewer than it asks for.  Each priority's scan starts at the row its
 * descent found: the entries before it (rows just run, kept by a held MVCC
 * horizon) are walked once, not twice.  The first descent goes straight to
 * `key`, past the entries of the rows just run. */
#define FIRST_ROWS_AFTER(rows, key)                                                                            \
    "WITH RECURSIVE firsts(priority, eligible_at, id) AS ("                                                    \
    "  (SELECT i.priority, i.eligible_at, i.id FROM gd._instances i"                                            \
    "    WHERE " rows " AND (i.priority, i.eligible_at, i.id) > " key                                          \
    "    ORDER BY i.priority, i.eligible_at, i.id LIMIT 1)"                                                    \
    "  UNION ALL"                                                                                              \
    "  SELECT n.* FROM firsts p CROSS JOIN LATERAL ("                                                          \
    "    SELECT i.priority, i.eligible_at, i.id FROM gd._instances i WHERE " rows " AND i.priority > p.priority" \
    "     ORDER BY i.priority, i.eligible_at, i.id LIMIT 1) n) "

/* Lock up to $2 due rows of `rows` (and `also`), best first, from each first row
 * of `firsts` on.  The nested loop over ascending priorities yields rows in
 * order, and the outer LIMIT stops it (and the locking) as soon as it has
 * enough.  A paused queue yields nothing. */
#define DUE_ROWS(rows, also)                                                                                   \
    "SELECT r.* FROM firsts p CROSS JOIN LATERAL ("                                                            \
    "  SELECT " GD_INSTANCE_COLUMNS ", i.priority, i.eligible_at FROM gd._instances i"                          \
    "   WHERE " rows " AND i.priority = p.priority AND i.eligible_at <= now()"                                  \
    "     AND (i.eligible_at, i.id) >= (p.eligible_at, p.id)" also                                              \
    "   ORDER BY i.eligible_at, i.id"                                                                          \
    "   LIMIT $2"                                                                                              \
    "   FOR UPDATE OF i SKIP LOCKED) r"                                                                        \
    " WHERE NOT EXISTS (SELECT FROM gd._queues q WHERE q.name = $1 AND q.paused)"                              \
    " LIMIT $2"

/* A key below every row's (its id is the lowest bigint, which no sequence hands out). */
#define LOWEST_KEY "(-2147483648, '-infinity'::timestamptz, '-9223372036854775808'::bigint)"
constexpr int32 LOWEST_PRIORITY = PG_INT32_MIN;
constexpr int64 LOWEST_ID = PG_INT64_MIN;

SPIPlanPtr pick_plan = nullptr;

/* Lock up to $2 due rows, best first, after ($3, $4, $5) = (priority,
 * eligible_at, id): the resume point, or the lowest key to start from the
 * front. */
uint64 run_pick(const char *queue, int limit, int32 after_priority, TimestampTz after_eligible_at, int64 after_id)
{
    if (pick_plan == nullptr) {
        Oid types[5] = {TEXTOID, INT4OID, INT4OID, TIMESTAMPTZOID, INT8OID};
        pick_plan = gd_prepare_kept(
            FIRST_ROWS_AFTER(PICKABLE, "($3, $4, $5)") DUE_ROWS(PICKABLE, ""),
            5, types);
    }
    Datum args[5] = {CStringGetTextDatum(queue), Int32GetDatum(limit), Int32GetDatum(after_priority),
                     TimestampTzGetDatum(after_eligible_at), Int64GetDatum(after_id)};
    if (gd_execute_kept(pick_plan, args, nullptr, false, 0) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: pick failed");
    return SPI_processed;
}

/* A pick from the front of the index. */
uint64 run_pick_from_front(const char *queue, int limit)
{
    return run_pick(queue, limit, LOWEST_PRIORITY, DT_NOBEGIN, LOWEST_ID);
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

int gd_pick(const char *queue, int limit, PickedInstance *out, MemoryContext into, WorkerSlot *executor)
{
    TimestampTz now = GetCurrentTimestamp();
    bool go_on = executor != nullptr;
    bool woken_by_new_work = go_on && pg_atomic_exchange_u32(&executor->new_work, 0) != 0;
    bool from_front = !(go_on && !woken_by_new_work && resume_point.valid && now - resume_point.since < RESTART_US);
    uint64 count = from_front ? run_pick_from_front(queue, limit)
                              : run_pick(queue, limit, resume_point.priority, resume_point.eligible_at, resume_point.id);
    if (count == 0 && !from_front) {
        from_front = true; /* nothing after the resume point: look from the front */
        count = run_pick_from_front(queue, limit);
    }
    if (from_front)
        resume_point.since = now;

    copy_picked(count, out, into, queue);
    /* A full pick goes on after its last row next time; a short one reached the end. */
    resume_point.valid = go_on && count == static_cast<uint64>(limit);
    if (resume_point.valid) {
        HeapTuple last = SPI_tuptable->vals[count - 1];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        resume_point.priority = DatumGetInt32(SPI_getbinval(last, desc, GD_INSTANCE_COLUMN_COUNT + 1, &isnull));
        resume_point.eligible_at = DatumGetTimestampTz(SPI_getbinval(last, desc, GD_INSTANCE_COLUMN_COUNT + 2, &isnull));
        resume_point.id = out[count - 1].id;
    }
    SPI_freetuptable(SPI_tuptable);
    return static_cast<int>(count);
}

int gd_pick_to_drain(const char *queue, int limit, PickedInstance *out, MemoryContext into, const DrainScope &scope)
{
    static SPIPlanPtr drain_plan = nullptr;
    if (drain_plan == nullptr) {
        Oid types[4] = {TEXTOID, INT4OID, OIDOID, BOOLOID};
        drain_plan = gd_prepare_kept("SELECT " GD_INSTANCE_COLUMNS " FROM gd._instances i"
                                     " WHERE " PICKABLE " AND ($4 OR i.eligible_at <= clock_timestamp())"
                                     "   AND pg_catalog.pg_has_role($3, i.owner, 'MEMBER')"
                                     "   AND NOT EXISTS (SELECT FROM gd._queues q WHERE q.name = $1 AND q.paused)"
                                     " ORDER BY i.priority, i.eligible_at, i.id LIMIT $2"
                                     " FOR UPDATE OF i SKIP LOCKED",
                                     4, types);
    }
    Datum args[4] = {CStringGetTextDatum(queue), Int32GetDatum(limit), ObjectIdGetDatum(scope.member),
                     BoolGetDatum(scope.with_scheduled)};
    return take_locked_rows(gd_execute_kept(drain_plan, args, nullptr, false, 0), out, into, queue);
}

int gd_pick_external(const char *queue, int limit, Datum usable, PickedInstance *out, MemoryContext into)
{
    static SPIPlanPtr claim_plan = nullptr;
    Datum args[3] = {CStringGetTextDatum(queue), Int32GetDatum(limit), usable};
    const char nulls[3] = {' ', ' ', usable == 0 ? 'n' : ' '};
    if (claim_plan == nullptr) {
        Oid types[3] = {TEXTOID, INT4OID, TEXTARRAYOID};
        claim_plan = gd_prepare_kept(FIRST_ROWS_AFTER(CLAIMABLE, LOWEST_KEY)
                                         DUE_ROWS(CLAIMABLE, " AND ($3::text[] IS NULL OR i.fsm = ANY ($3))"),
                                     3, types);
    }
    return take_locked_rows(gd_execute_kept(claim_plan, args, nulls, false, 0), out, into, queue);
}

TimestampTz gd_next_due(const char *queue)
{
    if (due_plan == nullptr) {
        Oid types[1] = {TEXTOID};
        /* Each priority's first future row. */
        due_plan = gd_prepare_kept(
            FIRST_ROWS_AFTER(PICKABLE, LOWEST_KEY)
            "SELECT min((SELECT i.eligible_at FROM gd._instances i"
            "             WHERE " PICKABLE " AND i.priority = p.priority AND i.eligible_at > now()"
            "             ORDER BY i.eligible_at LIMIT 1))"
            "  FROM firsts p",
            1, types);
    }
    Datum args[1] = {CStringGetTextDatum(queue)};
    if (gd_execute_kept(due_plan, args, nullptr, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: next-due query failed");
    bool isnull;
    Datum due = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    return isnull ? 0 : DatumGetTimestampTz(due);
}
