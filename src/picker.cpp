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

#include <algorithm>

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
    row.fairness_lane = DatumGetInt32(SPI_getbinval(tuple, desc, 20, &isnull));
    row.arrived_by = nullptr;
}

namespace {

/* The rows the pick index holds (in-database steps), and the claim index
 * (external steps), of queue $1: each predicate as its index spells it. */
#define PICKABLE "i.queue = $1 AND i.status = " GD_STATUS(runnable) " AND NOT i.external AND NOT i.gated"
#define CLAIMABLE "i.queue = $1 AND i.status = " GD_STATUS(runnable) " AND i.external AND NOT i.gated"

/* The index's order of a queue's rows: by lane, then by eligibility. */
#define LANE_COLUMNS "i.priority, i.owner::oid, i.fairness_lane"
#define INDEX_ORDER "i.priority, i.owner, i.fairness_lane, i.eligible_at, i.id"

/* The first row of each lane in the index, ascending, one index descent
 * each (a loose index scan): the queue's frontier, found from the front. */
#define FIRST_ROWS(rows)                                                                                        \
    "WITH RECURSIVE firsts(priority, owner, lane, eligible_at, id) AS ("                                       \
    "  (SELECT " LANE_COLUMNS ", i.eligible_at, i.id FROM gd._instances i WHERE " rows                         \
    "    ORDER BY " INDEX_ORDER " LIMIT 1)"                                                                    \
    "  UNION ALL"                                                                                              \
    "  SELECT n.* FROM firsts p CROSS JOIN LATERAL ("                                                          \
    "    SELECT " LANE_COLUMNS ", i.eligible_at, i.id FROM gd._instances i WHERE " rows                        \
    "       AND (i.priority, i.owner, i.fairness_lane) > (p.priority, p.owner, p.lane)"                        \
    "     ORDER BY " INDEX_ORDER " LIMIT 1) n) "                                                               \
    "SELECT priority, owner, lane, eligible_at, id FROM firsts"

/* The frontier's marks, one row per lane, and each lane's share of the batch: ($3[k], ..., $8[k]). */
#define MARKS                                                                                                  \
    "unnest($3::int4[], $4::oid[], $5::int4[], $6::timestamptz[], $7::int8[], $8::int4[])"                    \
    " WITH ORDINALITY AS p(priority, owner, lane, eligible_at, id, quota, k)"

/* The rows of `rows` (and `also`) in mark p's lane due by `due`, from the mark on. */
#define DUE_IN_LANE(rows, also, due)                                                                           \
    " WHERE " rows " AND i.priority = p.priority AND i.owner = p.owner AND i.fairness_lane = p.lane"           \
    "   AND i.eligible_at <= " due " AND (i.eligible_at, i.id) >= (p.eligible_at, p.id)" also

/* Lock up to $2 rows of `rows` (and `also`) due by `due`, best first: each
 * lane's share of them ($8) from the lane's mark on.  Taking each lane's due
 * rows on their own lets a scan stop at the lane's first future row: across
 * lanes, the future rows of one lie before the due rows of the next.  The
 * nested loop over ascending lanes yields rows by lane, and the outer LIMIT
 * stops it (and the locking) as soon as it has enough.  A paused queue
 * yields nothing. */
#define DUE_ROWS(rows, also, due)                                                                              \
    "SELECT r.* FROM " MARKS " CROSS JOIN LATERAL ("                                                           \
    "  SELECT " GD_INSTANCE_COLUMNS " FROM gd._instances i" DUE_IN_LANE(rows, also, due)                      \
    "   ORDER BY i.eligible_at, i.id"                                                                          \
    "   LIMIT p.quota"                                                                                         \
    "   FOR UPDATE OF i SKIP LOCKED) r"                                                                        \
    " WHERE NOT EXISTS (SELECT FROM gd._queues q WHERE q.name = $1 AND q.paused)"                              \
    " LIMIT $2"

/* How many rows each lane has due (up to $2, locked or not), and its owner's weight, in the marks' order. */
#define DUE_COUNTS(rows, also, due)                                                                            \
    "SELECT (SELECT count(*)::int4 FROM (SELECT FROM gd._instances i" DUE_IN_LANE(rows, also, due)            \
    "          LIMIT $2) d),"                                                                                  \
    "       coalesce((SELECT w.weight FROM gd._owner_weights w WHERE w.owner = p.owner), 1)"                   \
    "  FROM " MARKS " ORDER BY p.k"

constexpr int MARK_ARGUMENTS = 6; /* $3 to $8 */
/* The types of a pick's arguments: the queue, the batch, the marks and the shares. */
#define PICK_ARGUMENT_TYPES \
    TEXTOID, INT4OID, INT4ARRAYOID, OIDARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID, INT8ARRAYOID, INT4ARRAYOID

/* The view's marks as the arguments $3 to $7 of MARKS, and every lane's share ($8) the whole batch. */
void marks_arguments(const FrontierView &view, int limit, Datum *args)
{
    int slots = Max(view.count, 1);
    Datum *priorities = static_cast<Datum *>(palloc(sizeof(Datum) * slots));
    Datum *owners = static_cast<Datum *>(palloc(sizeof(Datum) * slots));
    Datum *lanes = static_cast<Datum *>(palloc(sizeof(Datum) * slots));
    Datum *times = static_cast<Datum *>(palloc(sizeof(Datum) * slots));
    Datum *ids = static_cast<Datum *>(palloc(sizeof(Datum) * slots));
    Datum *quotas = static_cast<Datum *>(palloc(sizeof(Datum) * slots));
    for (int i = 0; i < view.count; i++) {
        priorities[i] = Int32GetDatum(view.marks[i].priority);
        owners[i] = ObjectIdGetDatum(view.marks[i].owner);
        lanes[i] = Int32GetDatum(view.marks[i].fairness_lane);
        times[i] = TimestampTzGetDatum(view.marks[i].eligible_at);
        ids[i] = Int64GetDatum(view.marks[i].id);
        quotas[i] = Int32GetDatum(limit);
    }
    args[0] = PointerGetDatum(construct_array(priorities, view.count, INT4OID, 4, true, TYPALIGN_INT));
    args[1] = PointerGetDatum(construct_array(owners, view.count, OIDOID, 4, true, TYPALIGN_INT));
    args[2] = PointerGetDatum(construct_array(lanes, view.count, INT4OID, 4, true, TYPALIGN_INT));
    args[3] = PointerGetDatum(construct_array(times, view.count, TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
    args[4] = PointerGetDatum(construct_array(ids, view.count, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
    args[5] = PointerGetDatum(construct_array(quotas, view.count, INT4OID, 4, true, TYPALIGN_INT));
}

/* Whether a priority of the view has more than one lane: only then is the batch shared. */
bool lanes_share_a_priority(const FrontierView &view)
{
    for (int i = 1; i < view.count; i++)
        if (view.marks[i].priority == view.marks[i - 1].priority)
            return true;
    return false;
}

/*
 * Share `amount` between n claimants by weight, none given more than it
 * wants.  With no more to give than claimants that want, one each, going
 * round from the `first`-th of them (mod their number: the ones left out
 * change from round to round).
 * Else max-min fairly: in order of want per weight, each is given its
 * weighted part of what is left, or its want if less, so what the modest
 * leave over goes to the others; the parts' rounding down is given out one
 * each; and a claimant whose weight earned it nothing takes one from the
 * one given most, so none starves behind heavier weights.
 */
void share_by_weight(int n, const int *want, const int *weight, int amount, uint32 first, int *given)
{
    int wanting = 0;
    for (int i = 0; i < n; i++) {
        given[i] = 0;
        wanting += want[i] > 0 ? 1 : 0;
    }
    if (wanting >= amount) {
        /* From the (first mod wanting)-th claimant that wants on, round. */
        int skip = static_cast<int>(first % Max(wanting, 1));
        for (int pass = 0; pass < 2 && amount > 0; pass++)
            for (int i = 0, seen = 0; i < n && amount > 0; i++) {
                if (want[i] == 0)
                    continue;
                bool in_pass = pass == 0 ? seen >= skip : seen < skip;
                seen++;
                if (in_pass) {
                    given[i] = 1;
                    amount--;
                }
            }
        return;
    }
    int *order = static_cast<int *>(palloc(sizeof(int) * n));
    int64 weights_left = 0;
    for (int i = 0; i < n; i++) {
        order[i] = i;
        weights_left += weight[i];
    }
    std::sort(order, order + n, [&](int a, int b) {
        int64 lhs = static_cast<int64>(want[a]) * weight[b], rhs = static_cast<int64>(want[b]) * weight[a];
        return lhs != rhs ? lhs < rhs : a < b;
    });
    for (int k = 0; k < n && amount > 0; k++) {
        int i = order[k];
        given[i] = Min(want[i], static_cast<int>(static_cast<int64>(amount) * weight[i] / weights_left));
        amount -= given[i];
        weights_left -= weight[i];
    }
    for (int k = n - 1; k >= 0 && amount > 0; k--) {
        int i = order[k];
        if (given[i] < want[i]) {
            given[i]++;
            amount--;
        }
    }
    pfree(order);
    /* More was given than claimants want: one given none has a donor given two or more. */
    for (int i = 0; i < n; i++) {
        if (want[i] == 0 || given[i] > 0)
            continue;
        int most = 0;
        for (int j = 1; j < n; j++)
            if (given[j] > given[most])
                most = j;
        given[most]--;
        given[i] = 1;
    }
}

/*
 * Each lane's share of a batch of `limit` rows, from how many each has due:
 * priority by priority (ascending) while rows remain; within a priority
 * between its owners by their weights, and an owner's part evenly between
 * its lanes (its fairness keys).  A lane with one row due gets it in this
 * batch (when the batch has a row for each); a lone lane gets the whole
 * batch.  `round` turns who goes first when there are more lanes than rows.
 */
void share_batch(const FrontierView &view, const int *due, const int *weights, int limit, uint32 round, int *quotas)
{
    int *owner_want = static_cast<int *>(palloc(sizeof(int) * Max(view.count, 1)));
    int *owner_weight = static_cast<int *>(palloc(sizeof(int) * Max(view.count, 1)));
    int *owner_given = static_cast<int *>(palloc(sizeof(int) * Max(view.count, 1)));
    int *owner_first = static_cast<int *>(palloc(sizeof(int) * (view.count + 1)));
    int *even = static_cast<int *>(palloc(sizeof(int) * Max(view.count, 1)));
    for (int i = 0; i < view.count; i++) {
        quotas[i] = 0;
        even[i] = 1;
    }
    int left = limit;
    for (int start = 0, end; start < view.count && left > 0; start = end) {
        /* The priority's lanes are [start, end), its owners' runs of lanes [owner_first[o], owner_first[o + 1]). */
        int owners = 0;
        for (end = start; end < view.count && view.marks[end].priority == view.marks[start].priority; end++) {
            if (end == start || view.marks[end].owner != view.marks[end - 1].owner) {
                owner_first[owners] = end;
                owner_want[owners] = 0;
                owner_weight[owners] = weights[end];
                owners++;
            }
            owner_want[owners - 1] += due[end];
        }
        owner_first[owners] = end;
        share_by_weight(owners, owner_want, owner_weight, left, round, owner_given);
        for (int o = 0; o < owners; o++) {
            int first = owner_first[o], lanes = owner_first[o + 1] - first;
            share_by_weight(lanes, due + first, even, owner_given[o], round, quotas + first);
            left -= owner_given[o];
        }
    }
}

/* The statement counting each lane's due rows, for lane_shares. */
struct DueCounts {
    SPIPlanPtr *plan;
    const char *sql;
    int nargs;
    Oid *types;
};

/* Set each lane's share of the batch ($8 in args): the whole batch for each
 * when no priority has lanes to share between, else from their due rows. */
void lane_shares(const FrontierView &view, int limit, const DueCounts &counts, Datum *args, const char *nulls)
{
    if (!lanes_share_a_priority(view))
        return;
    if (*counts.plan == nullptr)
        *counts.plan = gd_prepare_kept(counts.sql, counts.nargs, counts.types);
    if (gd_execute_kept(*counts.plan, args, nulls, true, 0) != SPI_OK_SELECT ||
        SPI_processed != static_cast<uint64>(view.count))
        elog(ERROR, "gen_durable: counting the lanes' due rows failed");
    int *due = static_cast<int *>(palloc(sizeof(int) * view.count));
    int *weights = static_cast<int *>(palloc(sizeof(int) * view.count));
    for (int i = 0; i < view.count; i++) {
        bool isnull;
        due[i] = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
        weights[i] = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull));
    }
    SPI_freetuptable(SPI_tuptable);
    int *quotas = static_cast<int *>(palloc(sizeof(int) * view.count));
    static uint32 rounds_shared = 0;
    share_batch(view, due, weights, limit, rounds_shared++, quotas);
    Datum *shares = static_cast<Datum *>(palloc(sizeof(Datum) * view.count));
    for (int i = 0; i < view.count; i++)
        shares[i] = Int32GetDatum(quotas[i]);
    args[7] = PointerGetDatum(construct_array(shares, view.count, INT4OID, 4, true, TYPALIGN_INT));
}

/* The scope of a claim frontier of the FSMs named in `usable` (a text[]): never 0, the scope of all. */
uint32 fsms_scope(Datum usable)
{
    ArrayType *names = DatumGetArrayTypeP(usable);
    uint32 hash = DatumGetUInt32(hash_any(reinterpret_cast<const unsigned char *>(names), VARSIZE(names)));
    return hash == 0 ? 1 : hash;
}

/* The first row of each lane of the queue's in-database (or external) steps, ascending, in `firsts`
 * (palloc'd); how many. */
int first_rows(const char *queue, bool external, PickKey **firsts)
{
    static SPIPlanPtr pick_firsts_plan = nullptr, claim_firsts_plan = nullptr;
    SPIPlanPtr &plan = external ? claim_firsts_plan : pick_firsts_plan;
    if (plan == nullptr) {
        Oid types[1] = {TEXTOID};
        plan = gd_prepare_kept(external ? FIRST_ROWS(CLAIMABLE) : FIRST_ROWS(PICKABLE), 1, types);
    }
    Datum args[1] = {CStringGetTextDatum(queue)};
    if (gd_execute_kept(plan, args, nullptr, true, 0) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: finding the first rows of queue \"%s\" failed", queue);
    int found = static_cast<int>(SPI_processed);
    *firsts = static_cast<PickKey *>(palloc(sizeof(PickKey) * Max(found, 1)));
    for (int i = 0; i < found; i++) {
        HeapTuple row = SPI_tuptable->vals[i];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        (*firsts)[i] = PickKey{DatumGetInt32(SPI_getbinval(row, desc, 1, &isnull)),
                               DatumGetObjectId(SPI_getbinval(row, desc, 2, &isnull)),
                               DatumGetInt32(SPI_getbinval(row, desc, 3, &isnull)),
                               DatumGetTimestampTz(SPI_getbinval(row, desc, 4, &isnull)),
                               DatumGetInt64(SPI_getbinval(row, desc, 5, &isnull))};
    }
    SPI_freetuptable(SPI_tuptable);
    return found;
}

/* The queue's frontier to pick from: when it must be found from the front, found now. */
FrontierView frontier_to_pick(const char *queue, bool external, uint32 scope = 0)
{
    FrontierView view = gd_frontier_view(queue, external, scope);
    if (!view.from_front)
        return view;
    /* Every lane's first row: more lanes than a frontier tracks are all picked from the front. */
    PickKey *firsts;
    int found = first_rows(queue, external, &firsts);
    gd_frontier_found(view, firsts, found);
    view.count = found;
    view.marks = firsts;
    return view;
}

/*
 * After a pick from `view` locked `rows` (by lane, each lane's ascending):
 * raise each lane's mark past its last row, and announce each lane's first
 * row at the end of the transaction — on abort they are given back, and at
 * commit some may still be runnable.
 */
void account_for_pick(const FrontierView &view, const char *queue, bool external, const PickedInstance *rows,
                      int count)
{
    PickKey *last = static_cast<PickKey *>(palloc(sizeof(PickKey) * Max(count, 1)));
    int lanes = 0;
    for (int i = 0; i < count; i++) {
        PickKey key = gd_pick_key(rows[i]);
        if (lanes > 0 && gd_same_lane(last[lanes - 1], key)) {
            last[lanes - 1] = key;
        } else {
            gd_frontier_announce_at_end(queue, external, &key, true);
            last[lanes++] = key;
        }
    }
    gd_frontier_passed(view, last, lanes);
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

PickKey gd_pick_key(const PickedInstance &row)
{
    return PickKey{row.priority, row.owner, row.fairness_lane, row.eligible_at, row.id};
}

void gd_audit_frontiers()
{
    FrontierAudit due[GD_MAX_FRONTIERS];
    int count = gd_frontiers_to_audit(due, GD_MAX_FRONTIERS);
    for (int i = 0; i < count; i++) {
        int64 started_us = gd_monotonic_us();
        PickKey *firsts;
        int found = first_rows(due[i].queue, due[i].external, &firsts);
        gd_frontier_audited(due[i], firsts, found, gd_monotonic_us() - started_us);
        pfree(firsts);
    }
}

int gd_pick(const char *queue, int limit, PickedInstance *out, MemoryContext into)
{
    static SPIPlanPtr pick_plan = nullptr, counts_plan = nullptr;
    static Oid types[2 + MARK_ARGUMENTS] = {PICK_ARGUMENT_TYPES};
    if (pick_plan == nullptr)
        pick_plan = gd_prepare_kept(DUE_ROWS(PICKABLE, "", "now()"), 2 + MARK_ARGUMENTS, types);
    FrontierView view = frontier_to_pick(queue, false);
    Datum args[2 + MARK_ARGUMENTS] = {CStringGetTextDatum(queue), Int32GetDatum(limit)};
    marks_arguments(view, limit, args + 2);
    lane_shares(view, limit, DueCounts{&counts_plan, DUE_COUNTS(PICKABLE, "", "now()"), 2 + MARK_ARGUMENTS, types},
                args, nullptr);
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
    static SPIPlanPtr claim_plan = nullptr, counts_plan = nullptr;
    static Oid types[4 + MARK_ARGUMENTS] = {PICK_ARGUMENT_TYPES, TEXTARRAYOID, TIMESTAMPTZOID};
    /* Due by the clock ($10), not by the transaction's start: a claim that waits picks again later in it. */
#define CLAIM_FILTER " AND ($9::text[] IS NULL OR i.fsm = ANY ($9))"
    if (claim_plan == nullptr)
        claim_plan = gd_prepare_kept(DUE_ROWS(CLAIMABLE, CLAIM_FILTER, "$10"), 4 + MARK_ARGUMENTS, types);
    /* A worker that may claim only some FSMs' steps passes the others' rows by: the frontier of
     * those FSMs is its own (a grant changes the set, and so the frontier). */
    FrontierView view = frontier_to_pick(queue, true, usable == 0 ? 0 : fsms_scope(usable));
    Datum args[4 + MARK_ARGUMENTS] = {CStringGetTextDatum(queue), Int32GetDatum(limit)};
    marks_arguments(view, limit, args + 2);
    args[8] = usable;
    args[9] = TimestampTzGetDatum(gd_session_now());
    const char nulls[4 + MARK_ARGUMENTS] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', usable == 0 ? 'n' : ' ', ' '};
    lane_shares(view, limit,
                DueCounts{&counts_plan, DUE_COUNTS(CLAIMABLE, CLAIM_FILTER, "$10"), 4 + MARK_ARGUMENTS, types}, args,
                nulls);
#undef CLAIM_FILTER
    int count = take_locked_rows(gd_execute_kept(claim_plan, args, nulls, false, 0), out, into, queue);
    account_for_pick(view, queue, true, out, count);
    return count;
}

TimestampTz gd_next_due(const char *queue)
{
    static SPIPlanPtr due_plan = nullptr;
    if (due_plan == nullptr) {
        Oid types[2 + MARK_ARGUMENTS] = {PICK_ARGUMENT_TYPES};
        /* Each lane's first future row ($2 and the shares unused: the arguments are the pick's). */
        due_plan = gd_prepare_kept(
            "SELECT min((SELECT i.eligible_at FROM gd._instances i"
            "             WHERE " PICKABLE " AND i.priority = p.priority AND i.owner = p.owner"
            "               AND i.fairness_lane = p.lane AND (i.eligible_at, i.id) >= (p.eligible_at, p.id)"
            "               AND i.eligible_at > now()"
            "             ORDER BY i.eligible_at, i.id LIMIT 1))"
            "  FROM " MARKS,
            2 + MARK_ARGUMENTS, types);
    }
    FrontierView view = frontier_to_pick(queue, false);
    Datum args[2 + MARK_ARGUMENTS] = {CStringGetTextDatum(queue), Int32GetDatum(0)};
    marks_arguments(view, 0, args + 2);
    if (gd_execute_kept(due_plan, args, nullptr, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: next-due query failed");
    bool isnull;
    Datum due = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    return isnull ? 0 : DatumGetTimestampTz(due);
}
