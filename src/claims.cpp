/*
 * claims.cpp — the C++ half of external workers: applying a claimed step's
 * outcome (gd_complete) and reclaiming expired leases (the reaper's
 * gd._reclaim_leases).  Both go through the executor's own transition path
 * (gd_outcome_transition, gd_retry_transition, gd_apply_transition), so an
 * external step ends exactly as an in-database step with the same outcome
 * would, and the UPDATE clears the lease.
 *
 * A claim is owned by its lease token.  Both functions lock the row with
 * the token still in place (FOR UPDATE re-checks a row changed by a
 * concurrent commit), so a completion and a reclaim of one claim serialise:
 * whichever locks first wins, and the other finds the token gone.  A lease
 * that expired but was not yet reclaimed still owns its row.
 *
 * Only plain data is live here: PostgreSQL errors propagate as usual.
 */
#include "executor.hpp"
#include "stats.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"
}

namespace {

/* The claimed rows' columns, as read by both plans below: gd_read_instance's, then queue and lease owner. */
constexpr const char *CLAIMED_COLUMNS =
    "SELECT " GD_INSTANCE_COLUMNS ", i.queue, i.lease_owner"
    "  FROM gd.instances i";

SPIPlanPtr owned_plan = nullptr;
SPIPlanPtr expired_plan = nullptr;

SPIPlanPtr prepare_claimed(const char *where, int nargs, Oid *types)
{
    return gd_prepare_kept(psprintf("%s %s", CLAIMED_COLUMNS, where), nargs, types);
}

/* One claimed row, in the memory of the SPI connection that read it. */
struct ClaimedRow {
    PickedInstance row;
    char *queue;
    char *lease_owner;
};

ClaimedRow read_claimed(HeapTuple tuple, TupleDesc desc)
{
    ClaimedRow claimed{};
    gd_read_instance(tuple, desc, claimed.row);
    claimed.queue = SPI_getvalue(tuple, desc, GD_INSTANCE_COLUMN_COUNT + 1);
    claimed.lease_owner = SPI_getvalue(tuple, desc, GD_INSTANCE_COLUMN_COUNT + 2);
    return claimed;
}

/* The failed transition of a claimed step whose definition was dropped. */
Transition undefined_step_transition(const PickedInstance &row)
{
    Datum error = DirectFunctionCall1(
        jsonb_in, CStringGetDatum(psprintf("{\"sqlstate\": \"42704\", \"message\": \"gen_durable: step is no "
                                           "longer defined\", \"attempt\": %d}", row.attempt)));
    return gd_final_transition(row, "failed", 0, error);
}

/* {"message", "worker", "step", "attempt"} for a lease that expired. */
Datum lease_expired_json(const ClaimedRow &claimed)
{
    StringInfoData json;
    initStringInfo(&json);
    appendStringInfoString(&json, "{\"message\": ");
    escape_json(&json, psprintf("gen_durable: the lease of worker \"%s\" expired",
                                claimed.lease_owner ? claimed.lease_owner : ""));
    appendStringInfoString(&json, ", \"worker\": ");
    escape_json(&json, claimed.lease_owner ? claimed.lease_owner : "");
    appendStringInfoString(&json, ", \"step\": ");
    escape_json(&json, claimed.row.step);
    appendStringInfo(&json, ", \"attempt\": %d}", claimed.row.attempt);
    return DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));
}

void reclaim(const ClaimedRow &claimed)
{
    const PickedInstance &row = claimed.row;
    const StepDefinition *def = gd_find_step(row.fsm, row.version, row.step);
    if (def == nullptr) {
        gd_apply_transition(row.id, undefined_step_transition(row));
        return;
    }
    /* The attempt is counted; the step runs again at once (the worker died, the step did not fail). */
    Transition t = gd_retry_transition(row, *def, lease_expired_json(claimed), 0);
    t.event = StatEvent::count_; /* counted as reaped, not as a step's outcome */
    gd_apply_transition(row.id, t);
}

[[noreturn]] void bad_argument(const char *message)
{
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("gen_durable: %s", message)));
    pg_unreachable();
}

} // namespace

extern "C" {

PG_FUNCTION_INFO_V1(gd_complete);
PG_FUNCTION_INFO_V1(gd_reclaim_leases);

/*
 * gd_complete(id bigint, lease_token bigint, outcome gd.outcome) → boolean.
 * False when the token no longer owns the row (reclaimed, cancelled, or
 * already completed): the outcome is dropped.  A bad outcome raises 22023
 * and changes nothing: the claim is still the worker's.
 */
Datum gd_complete(PG_FUNCTION_ARGS)
{
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
        bad_argument("a claim is named by an instance id and its lease token, got NULL");
    int64 id = PG_GETARG_INT64(0);
    int64 token = PG_GETARG_INT64(1);
    if (PG_ARGISNULL(2))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: gd_complete of instance " INT64_FORMAT " needs an outcome, got NULL", id),
                        errhint("Build it with gd_next, gd_retry, gd_wait_signal, gd_spawn, gd_done or gd_stop.")));
    HeapTupleHeader outcome = PG_GETARG_HEAPTUPLEHEADER(2);

    SPI_connect();
    if (owned_plan == nullptr) {
        Oid types[2] = {INT8OID, INT8OID};
        owned_plan = prepare_claimed("WHERE i.id = $1 AND i.lease_token = $2 AND i.status = 'executing' FOR UPDATE",
                                  2, types);
    }
    Datum args[2] = {Int64GetDatum(id), Int64GetDatum(token)};
    if (SPI_execute_plan(owned_plan, args, nullptr, false, 1) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up the claim of instance " INT64_FORMAT " failed", id);
    if (SPI_processed == 0) {
        /* A stale outcome: dropped. */
        gd_count(StatEvent::outcome_stale);
        ereport(LOG, (errmsg("gen_durable: dropped a stale outcome for instance " INT64_FORMAT
                             ": lease token " INT64_FORMAT " no longer owns it", id, token)));
        SPI_finish();
        PG_RETURN_BOOL(false);
    }
    ClaimedRow claimed = read_claimed(SPI_tuptable->vals[0], SPI_tuptable->tupdesc);
    const PickedInstance &row = claimed.row;
    const StepDefinition *found = gd_find_step(row.fsm, row.version, row.step);
    Transition t{};
    if (found == nullptr) {
        t = undefined_step_transition(row);
    } else {
        const StepDefinition def = *found; /* the cache may be emptied by what follows */
        t = gd_outcome_transition(row, def, outcome);
    }
    gd_apply_transition(id, t);
    if (strcmp(t.status, "runnable") == 0 && !t.external)
        gd_wake_queue_at_commit(claimed.queue); /* an in-database step is next */
    SPI_finish();
    PG_RETURN_BOOL(true);
}

/* gd._reclaim_leases(batch int) → int: reclaim up to batch expired leases. */
Datum gd_reclaim_leases(PG_FUNCTION_ARGS)
{
    int32 batch = PG_GETARG_INT32(0);
    if (batch < 1)
        bad_argument(psprintf("batch must be positive, got %d", batch));
    SPI_connect();
    if (expired_plan == nullptr) {
        Oid types[1] = {INT4OID};
        expired_plan = prepare_claimed("WHERE i.status = 'executing' AND i.lease_expires_at < now()"
                                    " ORDER BY i.lease_expires_at LIMIT $1 FOR UPDATE OF i SKIP LOCKED",
                                    1, types);
    }
    Datum args[1] = {Int32GetDatum(batch)};
    if (SPI_execute_plan(expired_plan, args, nullptr, false, 0) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up expired leases failed");
    /* Keep the rows: each transition runs statements of its own. */
    SPITupleTable *expired = SPI_tuptable;
    int count = static_cast<int>(SPI_processed);
    for (int i = 0; i < count; i++)
        reclaim(read_claimed(expired->vals[i], expired->tupdesc));
    if (count > 0) {
        gd_count(StatEvent::reaped, static_cast<uint64>(count));
        ereport(LOG, (errmsg("gen_durable: reclaimed %d expired lease%s", count, count == 1 ? "" : "s")));
    }
    SPI_finish();
    PG_RETURN_INT32(count);
}
}
