/*
 * claims.cpp — an external worker's claim, from its start to its end: the
 * steps gd_claim takes (picked as the executors pick, under the same rate
 * limits, leased to the worker), and how a claim ends — its worker
 * completes it with the step's outcome (gd_complete, gd_complete_all), or
 * its lease expires and the reaper reclaims it.  Completions and reclaims
 * go through the executor's own transition path (gd_outcome_transition,
 * gd_retry_transition, the batched UPDATE), so an external step ends exactly
 * as an in-database step with the same outcome would, and the UPDATE clears
 * the lease.  A heartbeat extends a claim, a release hands it back unrun.
 *
 * A claim is owned by its lease token.  Both ends lock the row with the
 * token still in place (FOR UPDATE re-checks a row changed by a concurrent
 * commit), so a completion and a reclaim of one claim serialise: whichever
 * locks first wins, and the other finds the token gone.  A lease that
 * expired but was not yet reclaimed still owns its row.
 *
 * Only plain data is live here: PostgreSQL errors propagate as usual.
 */
#include "concurrency_keys.hpp"
#include "error_documents.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
#include "handler_call.hpp"
#include "instance_status.hpp"
#include "kept_plans.hpp"
#include "labelled_stats.hpp"
#include "outcomes.hpp"
#include "picker.hpp"
#include "rate_limits.hpp"
#include "rounds.hpp"
#include "step_definitions.hpp"
#include "transition.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"
}

namespace {

/* The claimed rows' columns, as read by both plans below: gd_read_instance's, then queue, lease owner, claim time. */
#define CLAIMED_COLUMNS GD_INSTANCE_COLUMNS ", i.queue, i.lease_owner, i.claimed_at"

/* The claims among ($1 ids, $2 tokens) their tokens still own, locked in id order (then input order). */
SPIPlanPtr owned_plan = nullptr;
SPIPlanPtr expired_plan = nullptr;

/* One claimed row, in the memory of the SPI connection that read it. */
struct ClaimedRow {
    PickedInstance row;
    char *lease_owner;
    TimestampTz claimed_at; /* 0: not known (claimed before an update) */
};

ClaimedRow read_claimed(HeapTuple tuple, TupleDesc desc)
{
    ClaimedRow claimed{};
    gd_read_instance(tuple, desc, claimed.row);
    claimed.row.queue = SPI_getvalue(tuple, desc, GD_INSTANCE_COLUMN_COUNT + 1);
    claimed.lease_owner = SPI_getvalue(tuple, desc, GD_INSTANCE_COLUMN_COUNT + 2);
    bool isnull;
    Datum claimed_at = SPI_getbinval(tuple, desc, GD_INSTANCE_COLUMN_COUNT + 3, &isnull);
    claimed.claimed_at = isnull ? 0 : DatumGetTimestampTz(claimed_at);
    return claimed;
}

/* The failed transition of a claimed step whose definition was dropped. */
Transition undefined_step_transition(const PickedInstance &row)
{
    Transition t = gd_failed_at_once(row, ERRCODE_UNDEFINED_OBJECT, "gen_durable: step is no longer defined");
    t.ran.claimed = true;
    return t;
}

/* Did the claimed step's lease end at its deadline (its timeout), rather than its worker going quiet? */
bool overran(const ClaimedRow &claimed, const StepDefinition &def)
{
    TimestampTz deadline = gd_step_deadline(def, claimed.claimed_at);
    return claimed.claimed_at != 0 && deadline != 0 && GetCurrentTimestamp() >= deadline;
}

/* What ran was the claim: its worker, from its claim until now. */
void ran_as_claimed(Transition &t, const ClaimedRow &claimed)
{
    t.ran.claimed = true;
    t.ran.worker = claimed.lease_owner;
    if (claimed.claimed_at != 0) {
        t.ran.started_at = claimed.claimed_at;
        t.ran.duration_us = GetCurrentTimestamp() - claimed.claimed_at;
    }
}

/* The error of a step whose lease expired, at its deadline (`timed_out`) or not. */
Datum lease_expired_json(const ClaimedRow &claimed, const StepDefinition &def, bool timed_out)
{
    const char *worker = claimed.lease_owner ? claimed.lease_owner : "";
    ErrorFields fields{"lease_expired", psprintf("gen_durable: the lease of worker \"%s\" expired", worker)};
    if (timed_out)
        fields = ErrorFields{"timeout", psprintf("gen_durable: step \"%s\" ran past its timeout of %d ms on worker \"%s\"",
                                                 claimed.row.step, def.timeout_ms, worker)};
    fields.worker = worker;
    return gd_error_document(claimed.row, fields);
}

void reclaim(const ClaimedRow &claimed)
{
    const PickedInstance &row = claimed.row;
    std::optional<StepDefinition> def = gd_find_step(row.fsm, row.version, row.step);
    if (!def && gd_version_not_ready(row.fsm, row.version))
        return; /* a restore in progress: reclaimed once its definitions are there */
    if (!def) {
        gd_apply_transition(row.id, undefined_step_transition(row), StatusWriter::lease_expiry);
        return;
    }
    /* The attempt is counted.  A step that overran its timeout is retried after its backoff, as an
     * in-database one is; one whose worker died runs again at once (the step did not fail). */
    bool timed_out = overran(claimed, *def);
    Transition t = gd_retry_transition(row, *def, lease_expired_json(claimed, *def, timed_out), timed_out ? -1 : 0);
    t.ran.event = StatEvent::count_; /* counted as reaped, not as a step's outcome */
    t.ran.lost = true;               /* but in the step history */
    ran_as_claimed(t, claimed);
    gd_apply_transition(row.id, t, StatusWriter::lease_expiry);
    gd_count_queue(row.queue, QueueEvent::reclaimed);
}

[[noreturn]] void bad_argument(const char *message)
{
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("gen_durable: %s", message)));
    pg_unreachable();
}

[[noreturn]] void missing_outcome(int64 id)
{
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("gen_durable: gd_complete of instance " INT64_FORMAT " needs an outcome, got NULL", id),
                    errhint("Build it with gd_next, gd_retry, gd_wait_signal, gd_spawn, gd_done or gd_stop.")));
    pg_unreachable();
}

/* A claim to complete, as the caller named it. */
struct Completion {
    int64 id;
    int64 token;
    HeapTupleHeader outcome;
    bool completed; /* set by complete_claims */
};

/*
 * Count the completions whose tokens no longer own their rows, and say so in
 * the server log: one line per caller at most every STALE_LOG_INTERVAL_S
 * (with what was dropped meanwhile), without the statement, naming only
 * instances the caller may use.  An id the caller may not use (or that does
 * not exist) is counted in gd.stats alone: its queue's counter would tell the
 * caller it exists.
 */
constexpr int STALE_LOG_INTERVAL_S = 10;
constexpr int STALE_IDS_LOGGED = 5;
TimestampTz stale_logged_at = 0;
uint64 stale_unlogged = 0;

void drop_stale_outcomes(const Completion *claims, int n, Oid caller)
{
    static SPIPlanPtr usable_plan = nullptr;
    Datum *stale = static_cast<Datum *>(palloc(sizeof(Datum) * Max(n, 1)));
    int stale_count = 0;
    for (int k = 0; k < n; k++)
        if (!claims[k].completed)
            stale[stale_count++] = Int64GetDatum(claims[k].id);
    if (stale_count == 0)
        return;
    gd_count(StatEvent::outcome_stale, static_cast<uint64>(stale_count));
    Datum args[2] = {PointerGetDatum(construct_array(stale, stale_count, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE)),
                     ObjectIdGetDatum(caller)};
    if (gd_run_kept(usable_plan,
                    "SELECT i.id, i.queue FROM gd._instances i"
                    " WHERE i.id = ANY ($1) AND gd._may_use_instance($2, i.owner, i.fsm) ORDER BY i.id",
                    {INT8ARRAYOID, OIDOID}, args, true, 0) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up stale outcomes failed");
    StringInfoData usable;
    initStringInfo(&usable);
    for (uint64 r = 0; r < SPI_processed; r++) {
        gd_count_queue(SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2), QueueEvent::stale_outcomes);
        if (r < STALE_IDS_LOGGED)
            appendStringInfo(&usable, "%s%s", r == 0 ? "" : ", ", SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1));
    }
    if (SPI_processed > STALE_IDS_LOGGED)
        appendStringInfo(&usable, " and " UINT64_FORMAT " more", SPI_processed - STALE_IDS_LOGGED);
    stale_unlogged += static_cast<uint64>(stale_count);
    TimestampTz now = GetCurrentTimestamp();
    if (!TimestampDifferenceExceeds(stale_logged_at, now, STALE_LOG_INTERVAL_S * 1000))
        return;
    ereport(LOG, (errmsg("gen_durable: dropped " UINT64_FORMAT " stale outcome%s of role \"%s\": lease tokens that no longer "
                         "own their instances%s%s",
                         stale_unlogged, stale_unlogged == 1 ? "" : "s", GetUserNameFromId(caller, true),
                         usable.len > 0 ? "; among them instances " : "", usable.data),
                  errhidestmt(true)));
    stale_logged_at = now;
    stale_unlogged = 0;
}

/* Apply one owned claim's outcome, produced by `caller`; its transition joins `completions`. */
void complete_claim(TransitionBatch &completions, const ClaimedRow &claimed, HeapTupleHeader outcome, Oid caller)
{
    const PickedInstance &row = claimed.row;
    std::optional<StepDefinition> def = gd_find_step(row.fsm, row.version, row.step);
    Transition t = def ? gd_outcome_transition(row, *def, outcome, caller) : undefined_step_transition(row);
    ran_as_claimed(t, claimed);
    gd_prepare_transition(row.id, t);
    gd_write_transition_batched(completions, row.id, t);
    if (t.to.status == Status::runnable && !t.to.external && !t.to.moved) { /* an in-database step is next (a moved one is woken as written) */
        PickKey key = gd_pick_key(row);
        key.eligible_at = t.to.eligible_at;
        gd_wake_queue_at_commit(row.queue, &key);
    }
}

/*
 * Complete the claims still owned by their tokens, of instances the API's
 * caller may use, in one lock and one UPDATE (plain transitions); the
 * others' outcomes are dropped as stale.  A claim named twice completes
 * once.  A bad outcome raises and changes nothing.
 */
void complete_claims(Completion *claims, int n)
{
    Oid caller = gd_api_caller();
    Datum *ids = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    Datum *tokens = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    for (int k = 0; k < n; k++) {
        ids[k] = Int64GetDatum(claims[k].id);
        tokens[k] = Int64GetDatum(claims[k].token);
        claims[k].completed = false;
    }
    SPI_connect();
    if (owned_plan == nullptr) {
        Oid types[3] = {INT8ARRAYOID, INT8ARRAYOID, OIDOID};
        /* By the primary key alone (= ANY: whatever the join order): a
         * status test here could make the planner walk every lease. */
        owned_plan = gd_prepare_kept("SELECT " CLAIMED_COLUMNS ", c.ord::int,"
                                     "       i.status = ANY (gd._statuses_before('completion'))"
                                     "  FROM unnest($1, $2) WITH ORDINALITY AS c(id, token, ord)"
                                     "  JOIN gd._instances i ON i.id = c.id AND i.lease_token = c.token"
                                     " WHERE i.id = ANY ($1) AND gd._may_use_instance($3, i.owner, i.fsm)"
                                     " ORDER BY i.id, c.ord FOR UPDATE OF i",
                                     3, types);
    }
    Datum args[3] = {PointerGetDatum(construct_array(ids, n, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE)),
                     PointerGetDatum(construct_array(tokens, n, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE)),
                     ObjectIdGetDatum(caller)};
    if (gd_execute_kept(owned_plan, args, nullptr, false, 0, KeptJoins::hashed) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up %d claim%s failed", n, n == 1 ? "" : "s");
    SPITupleTable *owned = SPI_tuptable; /* kept: the transitions run statements of their own */
    uint64 owned_count = SPI_processed;
    TransitionBatch completions;
    gd_begin_transitions(completions, StatusWriter::completion, static_cast<int>(owned_count));
    int64 previous_id = 0;
    for (uint64 r = 0; r < owned_count; r++) {
        bool isnull;
        if (!DatumGetBool(SPI_getbinval(owned->vals[r], owned->tupdesc, GD_INSTANCE_COLUMN_COUNT + 5, &isnull)))
            continue; /* no longer executing: stale */
        ClaimedRow claimed = read_claimed(owned->vals[r], owned->tupdesc);
        if (claimed.row.id == previous_id)
            continue; /* named again: the first naming completed it */
        previous_id = claimed.row.id;
        int k = DatumGetInt32(SPI_getbinval(owned->vals[r], owned->tupdesc, GD_INSTANCE_COLUMN_COUNT + 4, &isnull)) - 1;
        complete_claim(completions, claimed, claims[k].outcome, caller);
        claims[k].completed = true;
    }
    gd_flush_transitions(completions);
    gd_release_concurrency_keys();
    drop_stale_outcomes(claims, n, caller);
    SPI_finish();
}

/* The elements of a one-dimensional bigint or gd.outcome array argument (NULL elements flagged). */
int array_argument(ArrayType *array, Oid element_type, Datum **elements, bool **nulls, const char *what)
{
    if (ARR_NDIM(array) > 1)
        bad_argument(psprintf("%s must be a one-dimensional array", what));
    int16 length;
    bool by_value;
    char align;
    get_typlenbyvalalign(element_type, &length, &by_value, &align);
    int count;
    deconstruct_array(array, element_type, length, by_value, align, elements, nulls, &count);
    return count;
}

} // namespace

namespace {

int compare_ids(const void *a, const void *b)
{
    int64 x = *static_cast<const int64 *>(a), y = *static_cast<const int64 *>(b);
    return x < y ? -1 : x > y;
}

} // namespace

/*
 * gd._claim_steps(queue text, worker text, max int, lease interval, usable
 * text[]) → TABLE(id, fsm, version, step, state, ctx, lease_token): gd_claim
 * once its arguments are checked (sql/src/70_external.sql).  The best due
 * external steps of the queue, of the FSMs in `usable` (NULL: all), those
 * their rate limits admit, leased to `worker` until now + `lease`; a step its
 * rate limits hold back stays runnable, postponed until its tokens are there.
 */
GD_SQL_FUNCTION(gd_claim_steps)
{
    gd_require_engine("gd_claim"); /* no reaper would reclaim an expired lease */
    for (int arg = 0; arg < 4; arg++)
        if (PG_ARGISNULL(arg))
            bad_argument("gd._claim_steps takes a queue, a worker, a count and a lease, got NULL");
    const char *queue = text_to_cstring(PG_GETARG_TEXT_PP(0));
    Datum worker = PG_GETARG_DATUM(1);
    int limit = PG_GETARG_INT32(2);
    Datum lease = PG_GETARG_DATUM(3);
    Datum usable = PG_ARGISNULL(4) ? 0 : PG_GETARG_DATUM(4);
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo *result_info = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    MemoryContext call_context = CurrentMemoryContext;
    SPI_connect();
    gd_prepare_handler_calls();
    PickedInstance *rows = static_cast<PickedInstance *>(MemoryContextAlloc(call_context, sizeof(PickedInstance) * limit));
    int picked = gd_pick_external(queue, limit, usable, rows, call_context);
    /* A step with a timeout must end by its deadline: its lease never runs past it. */
    TimestampTz claimed_at = GetCurrentTimestamp();
    TimestampTz *deadlines = static_cast<TimestampTz *>(palloc0(sizeof(TimestampTz) * Max(picked, 1)));
    Datum *admitted = static_cast<Datum *>(palloc(sizeof(Datum) * Max(picked, 1)));
    Datum *admitted_deadlines = static_cast<Datum *>(palloc(sizeof(Datum) * Max(picked, 1)));
    bool *no_deadline = static_cast<bool *>(palloc(sizeof(bool) * Max(picked, 1)));
    /* The picked steps' definitions, and their rate limits' verdicts, all in one statement. */
    StepDefinition *defs = static_cast<StepDefinition *>(palloc(sizeof(StepDefinition) * Max(picked, 1)));
    const PickedInstance **row_of = static_cast<const PickedInstance **>(palloc(sizeof(void *) * Max(picked, 1)));
    const StepDefinition **def_of = static_cast<const StepDefinition **>(palloc(sizeof(void *) * Max(picked, 1)));
    bool *rate_admitted = static_cast<bool *>(palloc(sizeof(bool) * Max(picked, 1)));
    for (int i = 0; i < picked; i++) {
        defs[i] = gd_find_step(rows[i].fsm, rows[i].version, rows[i].step).value_or(StepDefinition{});
        row_of[i] = &rows[i];
        def_of[i] = &defs[i];
    }
    gd_admit_rates(row_of, def_of, picked, rate_admitted);
    int admitted_count = 0;
    for (int i = 0; i < picked; i++) {
        if (rate_admitted[i]) {
            deadlines[i] = gd_step_deadline(defs[i], claimed_at);
            admitted[admitted_count] = Int64GetDatum(rows[i].id);
            admitted_deadlines[admitted_count] = TimestampTzGetDatum(deadlines[i]);
            no_deadline[admitted_count] = deadlines[i] == 0;
            admitted_count++;
        }
    }
    static SPIPlanPtr lease_plan = nullptr;
    if (lease_plan == nullptr) {
        Oid types[5] = {INT8ARRAYOID, TEXTOID, INTERVALOID, TIMESTAMPTZOID, TIMESTAMPTZARRAYOID};
        lease_plan = gd_prepare_kept("UPDATE gd._instances i"
                                     "   SET status = gd._status_after('claim', 'executing'), lease_owner = $2,"
                                     "       lease_token = nextval('gd._lease_tokens'::regclass),"
                                     "       lease_expires_at = least($4 + $3, c.deadline), updated_at = $4, claimed_at = $4"
                                     "  FROM unnest($1, $5) AS c(id, deadline)"
                                     " WHERE i.id = c.id AND i.id = ANY ($1) AND i.status = ANY (gd._statuses_before('claim'))"
                                     " RETURNING i.id, i.lease_token",
                                     5, types);
    }
    Datum args[5] = {gd_array_of(admitted, nullptr, admitted_count, INT8OID), worker, lease,
                     TimestampTzGetDatum(claimed_at),
                     gd_array_of(admitted_deadlines, no_deadline, admitted_count, TIMESTAMPTZOID)};
    if (gd_execute_kept(lease_plan, args, nullptr, false, 0, KeptJoins::hashed) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: leasing %d claimed steps failed", admitted_count);
    /* (id, token) pairs, sorted by id, to answer in the pick's order. */
    int leased = static_cast<int>(SPI_processed);
    gd_count_queue_pick(queue, limit, leased);
    int64 *tokens = static_cast<int64 *>(palloc(sizeof(int64) * 2 * Max(leased, 1)));
    for (int k = 0; k < leased; k++) {
        bool isnull;
        tokens[2 * k] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[k], SPI_tuptable->tupdesc, 1, &isnull));
        tokens[2 * k + 1] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[k], SPI_tuptable->tupdesc, 2, &isnull));
    }
    qsort(tokens, leased, 2 * sizeof(int64), compare_ids);
    for (int i = 0; i < picked; i++) {
        const auto *pair = static_cast<const int64 *>(bsearch(&rows[i].id, tokens, leased, 2 * sizeof(int64), compare_ids));
        if (pair == nullptr)
            continue; /* held back by its rate limits */
        MemoryContext spi_context = MemoryContextSwitchTo(call_context);
        Datum values[7] = {Int64GetDatum(rows[i].id), CStringGetTextDatum(rows[i].fsm), Int32GetDatum(rows[i].version),
                           CStringGetTextDatum(rows[i].step), rows[i].state, gd_context(rows[i], queue, deadlines[i]),
                           Int64GetDatum(pair[1])};
        bool nulls[7] = {};
        tuplestore_putvalues(result_info->setResult, result_info->setDesc, values, nulls);
        MemoryContextSwitchTo(spi_context);
    }
    SPI_finish();
    return static_cast<Datum>(0);
}

/* A claim is named by its instance's id and its lease token (arguments 0 and 1), neither NULL. */
void check_claim_arguments(FunctionCallInfo fcinfo)
{
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
        bad_argument("a claim is named by an instance id and its lease token, got NULL");
}

/*
 * gd_heartbeat(id bigint, lease_token bigint, extend interval) → boolean
 * (gd._heartbeat).  The lease runs until now + `extend` (NULL: the length it
 * was given), never past the step's deadline (its claim + its timeout);
 * false when the token no longer owns the row, the caller may not use it,
 * or the deadline has passed.
 */
GD_SQL_FUNCTION(gd_heartbeat)
{
    check_claim_arguments(fcinfo);
    if (!PG_ARGISNULL(2))
        gd_check_lease(PG_GETARG_DATUM(2), "extend");
    static SPIPlanPtr extend_plan = nullptr;
    Datum args[4] = {ObjectIdGetDatum(gd_api_caller()), PG_GETARG_DATUM(0), PG_GETARG_DATUM(1),
                     PG_ARGISNULL(2) ? 0 : PG_GETARG_DATUM(2)};
    SPI_connect();
    if (gd_run_kept(extend_plan,
                    "UPDATE gd._instances i"
                    "   SET lease_expires_at = least(t.at + coalesce($4, i.lease_expires_at - i.updated_at),"
                    "                                i.claimed_at + (SELECT s.timeout FROM gd._steps s"
                    "                                                 WHERE s.fsm = i.fsm AND s.version = i.version"
                    "                                                   AND s.step = i.step)),"
                    "       updated_at = t.at"
                    "  FROM (SELECT clock_timestamp() AS at) t"
                    " WHERE i.id = $2 AND i.lease_token = $3 AND i.status = " GD_STATUS(executing)
                    "   AND gd._may_use_instance($1, i.owner, i.fsm)"
                    " RETURNING i.lease_expires_at > t.at",
                    {OIDOID, INT8OID, INT8OID, INTERVALOID}, args, false, 0, PG_ARGISNULL(2) ? "   n" : nullptr) !=
        SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: extending the lease of instance " INT64_FORMAT " failed", PG_GETARG_INT64(0));
    bool isnull;
    bool extended = SPI_processed > 0 &&
                    DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    SPI_finish();
    PG_RETURN_BOOL(extended);
}

/*
 * gd_release(id bigint, lease_token bigint) → boolean (gd._release).  The
 * step is runnable again at once, in its old place, no attempt counted;
 * false when the token no longer owns the row or the caller may not use it.
 */
GD_SQL_FUNCTION(gd_release)
{
    check_claim_arguments(fcinfo);
    static SPIPlanPtr release_plan = nullptr;
    Datum args[3] = {ObjectIdGetDatum(gd_api_caller()), PG_GETARG_DATUM(0), PG_GETARG_DATUM(1)};
    SPI_connect();
    if (gd_run_kept(release_plan,
                    "UPDATE gd._instances i"
                    "   SET status = gd._status_after('release', 'runnable'), lease_owner = NULL, lease_token = NULL,"
                    "       lease_expires_at = NULL,"
                    "       updated_at = clock_timestamp()"
                    " WHERE i.id = $2 AND i.lease_token = $3 AND i.status = ANY (gd._statuses_before('release'))"
                    "   AND gd._may_use_instance($1, i.owner, i.fsm)"
                    " RETURNING i.queue",
                    {OIDOID, INT8OID, INT8OID}, args, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: releasing the claim of instance " INT64_FORMAT " failed", PG_GETARG_INT64(0));
    bool released = SPI_processed > 0;
    if (released) {
        gd_count(StatEvent::drained);
        gd_count_queue(SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1), QueueEvent::drained);
    }
    SPI_finish();
    PG_RETURN_BOOL(released);
}

/*
 * gd_complete(id bigint, lease_token bigint, outcome gd.outcome) → boolean.
 * False when the token no longer owns the row (reclaimed, cancelled, or
 * already completed): the outcome is dropped.  A bad outcome raises 22023
 * and changes nothing: the claim is still the worker's.
 */
GD_SQL_FUNCTION(gd_complete)
{
    check_claim_arguments(fcinfo);
    Completion claim{PG_GETARG_INT64(0), PG_GETARG_INT64(1), nullptr, false};
    if (PG_ARGISNULL(2))
        missing_outcome(claim.id);
    claim.outcome = PG_GETARG_HEAPTUPLEHEADER(2);
    complete_claims(&claim, 1);
    PG_RETURN_BOOL(claim.completed);
}

/*
 * gd_complete_all(ids bigint[], lease_tokens bigint[], outcomes gd.outcome[])
 * → TABLE(id bigint, completed boolean): gd_complete for each position of
 * the three arrays, in one statement; one row per position, in order.
 */
GD_SQL_FUNCTION(gd_complete_all)
{
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
        bad_argument("gd_complete_all takes arrays of ids, lease tokens and outcomes, got NULL");
    Datum *ids, *tokens, *outcomes;
    bool *id_nulls, *token_nulls, *outcome_nulls;
    int n = array_argument(PG_GETARG_ARRAYTYPE_P(0), INT8OID, &ids, &id_nulls, "ids");
    int token_count = array_argument(PG_GETARG_ARRAYTYPE_P(1), INT8OID, &tokens, &token_nulls, "lease_tokens");
    ArrayType *outcome_array = PG_GETARG_ARRAYTYPE_P(2);
    int outcome_count = array_argument(outcome_array, ARR_ELEMTYPE(outcome_array), &outcomes, &outcome_nulls,
                                       "outcomes");
    if (token_count != n || outcome_count != n)
        bad_argument(psprintf("ids, lease_tokens and outcomes must be as long as each other, got %d, %d and %d",
                              n, token_count, outcome_count));
    Completion *claims = static_cast<Completion *>(palloc(sizeof(Completion) * Max(n, 1)));
    for (int k = 0; k < n; k++) {
        if (id_nulls[k] || token_nulls[k])
            bad_argument("a claim is named by an instance id and its lease token, got NULL");
        claims[k] = Completion{DatumGetInt64(ids[k]), DatumGetInt64(tokens[k]), nullptr, false};
        if (outcome_nulls[k])
            missing_outcome(claims[k].id);
        claims[k].outcome = DatumGetHeapTupleHeader(outcomes[k]);
    }
    if (n > 0)
        complete_claims(claims, n);

    ReturnSetInfo *result_info = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    InitMaterializedSRF(fcinfo, 0);
    for (int k = 0; k < n; k++) {
        Datum values[2] = {Int64GetDatum(claims[k].id), BoolGetDatum(claims[k].completed)};
        bool nulls[2] = {false, false};
        tuplestore_putvalues(result_info->setResult, result_info->setDesc, values, nulls);
    }
    return static_cast<Datum>(0);
}

namespace {

/* The reaper's scans for expired leases (rounds.hpp). */
DeadlineScan lease_scan;

/* Reclaim up to `batch` expired leases, the reaper's from its mark (`marked`), else from the front; returns how
 * many. */
int reclaim_expired_leases(int batch, bool marked)
{
    TimestampTz now = GetCurrentTimestamp();
    Datum args[3] = {Int32GetDatum(batch), TimestampTzGetDatum(now),
                     TimestampTzGetDatum(marked ? lease_scan.from(now) : DT_NOBEGIN)};
    if (gd_run_kept(expired_plan,
                    "SELECT " CLAIMED_COLUMNS ", i.lease_expires_at FROM gd._instances i"
                    " WHERE i.status = " GD_STATUS(executing) " AND i.lease_expires_at < $2"
                    "   AND i.lease_expires_at >= $3"
                    " ORDER BY i.lease_expires_at LIMIT $1 FOR UPDATE OF i SKIP LOCKED",
                    {INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID}, args, false, 0) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up expired leases failed");
    /* Keep the rows: each transition runs statements of its own. */
    SPITupleTable *expired = SPI_tuptable;
    int count = static_cast<int>(SPI_processed);
    if (marked) {
        bool isnull;
        lease_scan.took(count, batch,
                        count == 0 ? 0
                                   : DatumGetTimestampTz(SPI_getbinval(expired->vals[count - 1], expired->tupdesc,
                                                                       expired->tupdesc->natts, &isnull)),
                        now);
    }
    for (int i = 0; i < count; i++)
        reclaim(read_claimed(expired->vals[i], expired->tupdesc));
    if (count > 0) {
        gd_count(StatEvent::reaped, static_cast<uint64>(count));
        ereport(LOG, (errmsg("gen_durable: reclaimed %d expired lease%s", count, count == 1 ? "" : "s")));
    }
    return count;
}

int checked_batch(FunctionCallInfo fcinfo)
{
    int32 batch = PG_GETARG_INT32(0);
    if (batch < 1)
        bad_argument(psprintf("batch must be positive, got %d", batch));
    return batch;
}

} // namespace

TimestampTz gd_expire_leases(int batch)
{
    if (reclaim_expired_leases(batch, true) >= batch)
        return GetCurrentTimestamp(); /* a full batch may leave more: go again */
    static SPIPlanPtr announce_plan = nullptr, next_plan = nullptr;
    /* Where this process's last look that announced nothing ended (0: go by the table's mark). */
    static TimestampTz looked_until = 0;
    Datum since[1] = {TimestampTzGetDatum(looked_until)};
    if (gd_run_kept(announce_plan, "SELECT gd._announce_due_external($1)", {TIMESTAMPTZOID}, since, false, 1,
                    looked_until == 0 ? "n" : nullptr) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: announcing external work come due failed");
    bool by_table;
    Datum until = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &by_table);
    looked_until = by_table ? 0 : DatumGetTimestampTz(until);
    /* Leases already expired but locked by their worker's gd_complete are
     * not waited for here: they are either completed or found next round.
     * Only the leases expiring before the reaper's next round anyway are
     * looked at (under a held horizon the entries of the claims completed
     * meanwhile are there too, dead). */
    Datum horizon[1] = {Float8GetDatum(gd_reaper_interval_ms / 1000.0)};
    int result = gd_run_kept(next_plan,
                             "SELECT least((SELECT min(i.lease_expires_at) FROM gd._instances i"
                             "               WHERE i.status = " GD_STATUS(executing) " AND i.lease_expires_at >= now()"
                             "                 AND i.lease_expires_at < now() + make_interval(secs => $1)),"
                             "             (SELECT min(i.eligible_at) FROM gd._instances i"
                             "               WHERE i.status = " GD_STATUS(runnable) " AND i.external AND i.lease_owner IS NULL"
                             "                 AND i.eligible_at > i.updated_at AND i.eligible_at > now()))",
                             {FLOAT8OID}, horizon, false, 1); /* a new snapshot: leases claimed since the round began */
    if (result != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: looking up the next lease to expire failed");
    bool isnull;
    Datum next = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    return isnull ? 0 : DatumGetTimestampTz(next);
}

/* gd._reclaim_leases(batch int) → int: reclaim up to batch expired leases. */
GD_SQL_FUNCTION(gd_reclaim_leases)
{
    int batch = checked_batch(fcinfo);
    SPI_connect();
    int count = reclaim_expired_leases(batch, false);
    SPI_finish();
    PG_RETURN_INT32(count);
}

/* gd._expire_leases(batch int) → timestamptz: the reaper's duty to external work (gd_expire_leases). */
GD_SQL_FUNCTION(gd_expire_leases_sql)
{
    int batch = checked_batch(fcinfo);
    SPI_connect();
    TimestampTz next = gd_expire_leases(batch);
    SPI_finish();
    if (next == 0)
        PG_RETURN_NULL();
    PG_RETURN_TIMESTAMPTZ(next);
}
