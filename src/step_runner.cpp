/*
 * step_runner.cpp — running a batch of picked steps.  Each handler runs in
 * its own subtransaction, as the FSM's owner, under the step's timeout, after
 * its rate limits admitted it.  Its outcome is validated (and a spawn's
 * children inserted) inside that subtransaction; if the handler raises,
 * overruns its timeout, returns NULL or a bad outcome, the subtransaction is
 * rolled back (its effects vanish) and the attempt is recorded as a retry
 * with the error.  The transitions are written in the round's own
 * transaction, the plain ones together at the end of the batch, so a step's
 * effects and its instance's new state commit together.
 */
#include "executor.hpp"
#include "stats.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/typcache.h"
}

#include <boost/container/static_vector.hpp>

namespace {

constexpr int CONTEXT_COLUMNS = 10;

/* The rows of the batch in hand: a global, so an ERROR's longjmp skips no destructor. */
boost::container::static_vector<PickedInstance, GD_MAX_BATCH> batch;
/* Their plain transitions, written together at the end of the round. */
TransitionBatch round_transitions;

Oid context_type = InvalidOid;
TupleDesc context_desc = nullptr;
Datum empty_json_array = 0;

/* A field of the instance's resume document, or nullptr. */
JsonbValue *resume_field(const PickedInstance &row, const char *key)
{
    if (row.resume == 0)
        return nullptr;
    JsonbValue wanted{};
    wanted.type = jbvString;
    wanted.val.string.val = const_cast<char *>(key);
    wanted.val.string.len = static_cast<int>(strlen(key));
    return findJsonbValueFromContainer(&DatumGetJsonbP(row.resume)->root, JB_FOBJECT, &wanted);
}

Datum resume_array(const PickedInstance &row, const char *key)
{
    JsonbValue *value = resume_field(row, key);
    return value == nullptr ? empty_json_array : JsonbPGetDatum(JsonbValueToJsonb(value));
}

Datum build_context(const PickedInstance &row, const char *queue)
{
    JsonbValue *timed_out = resume_field(row, "timed_out");
    Datum values[CONTEXT_COLUMNS] = {
        Int64GetDatum(row.id),      CStringGetTextDatum(row.fsm),
        Int32GetDatum(row.version), CStringGetTextDatum(row.step),
        Int32GetDatum(row.attempt), row.correlation_key ? CStringGetTextDatum(row.correlation_key) : 0,
        resume_array(row, "signals"), resume_array(row, "children"),
        BoolGetDatum(timed_out != nullptr && timed_out->type == jbvBool && timed_out->val.boolean),
        CStringGetTextDatum(queue)};
    bool nulls[CONTEXT_COLUMNS] = {};
    nulls[5] = row.correlation_key == nullptr;
    return HeapTupleGetDatum(heap_form_tuple(context_desc, values, nulls));
}

/* Call the handler as the FSM's owner under the step timeout; returns the outcome tuple. */
HeapTupleHeader call_handler(const PickedInstance &row, const StepDefinition &def, const char *queue)
{
    LOCAL_FCINFO(fcinfo, 2);
    FmgrInfo flinfo;
    fmgr_info(def.handler, &flinfo);
    InitFunctionCallInfoData(*fcinfo, &flinfo, 2, InvalidOid, nullptr, nullptr);
    fcinfo->args[0].value = row.state;
    fcinfo->args[0].isnull = false;
    fcinfo->args[1].value = build_context(row, queue);
    fcinfo->args[1].isnull = false;

    Oid saved_user;
    int saved_security;
    GetUserIdAndSecContext(&saved_user, &saved_security);
    SetUserIdAndSecContext(def.owner, saved_security | SECURITY_LOCAL_USERID_CHANGE);
    if (def.timeout_ms > 0)
        enable_timeout_after(STATEMENT_TIMEOUT, def.timeout_ms);
    Datum outcome = FunctionCallInvoke(fcinfo);
    if (def.timeout_ms > 0)
        disable_timeout(STATEMENT_TIMEOUT, false);
    SetUserIdAndSecContext(saved_user, saved_security);

    if (fcinfo->isnull)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: step \"%s\" of FSM \"%s\" returned a bad outcome: the handler returned NULL",
                               row.step, row.fsm)));
    return DatumGetHeapTupleHeader(outcome);
}

} // namespace

namespace {

void prepare_context_type()
{
    Oid gd_namespace = get_namespace_oid("gd", false);
    Oid type = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid, CStringGetDatum("context"),
                               ObjectIdGetDatum(gd_namespace));
    if (type == InvalidOid)
        elog(ERROR, "gen_durable: type gd.context is missing");
    if (type != context_type) {
        MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
        if (context_desc != nullptr)
            FreeTupleDesc(context_desc);
        context_desc = lookup_rowtype_tupdesc_copy(type, -1);
        BlessTupleDesc(context_desc);
        context_type = type;
        MemoryContextSwitchTo(old);
    }
    empty_json_array = DirectFunctionCall1(jsonb_in, CStringGetDatum("[]"));
}

} // namespace

namespace {

/* Run one picked step to its transition; false when its rate limit holds it back. */
bool run_step(const PickedInstance &row, const char *queue)
{
    const StepDefinition *found = gd_find_step(row.fsm, row.version, row.step);
    if (found == nullptr) {
        /* The definition was dropped under a live instance: fail it rather than spin. */
        Datum error = DirectFunctionCall1(
            jsonb_in, CStringGetDatum(psprintf("{\"sqlstate\": \"42704\", \"message\": \"gen_durable: step is no "
                                               "longer defined\", \"attempt\": %d}", row.attempt)));
        gd_apply_transition(row.id, gd_final_transition(row, "failed", 0, error));
        return true;
    }
    const StepDefinition def = *found; /* the cache may be emptied while the handler runs */
    if ((row.rate_limit != nullptr || def.rate_limit[0] != '\0') && !gd_admit_rate(row, def))
        return false; /* throttled: it runs when its tokens are there */
    if (def.handler == InvalidOid) {
        /* Now an external step (redefined): hand it to external workers. */
        Transition t = gd_final_transition(row, "runnable", 0, 0);
        t.external = true;
        gd_apply_transition(row.id, t);
        return true;
    }

    MemoryContext round_context = CurrentMemoryContext;
    ResourceOwner round_owner = CurrentResourceOwner;
    TimestampTz started = GetCurrentTimestamp();
    Transition t{};
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(round_context);
    PG_TRY();
    {
        HeapTupleHeader outcome = call_handler(row, def, queue);
        t = gd_outcome_transition(row, def, outcome);
        gd_prepare_transition(row.id, t);
        ReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(round_context);
        CurrentResourceOwner = round_owner;
    }
    PG_CATCH();
    {
        disable_timeout(STATEMENT_TIMEOUT, false);
        MemoryContextSwitchTo(round_context);
        ErrorData *edata = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(round_context);
        CurrentResourceOwner = round_owner;
        t = gd_retry_transition(row, def, gd_error_json(edata, row), -1);
        FreeErrorData(edata);
    }
    PG_END_TRY();
    t.duration_us = GetCurrentTimestamp() - started;
    gd_write_transition_batched(round_transitions, row.id, t); /* in the round's transaction: see executor.hpp */
    return true;
}

} // namespace

int gd_execute_batch(const char *queue, int limit, WorkerSlot *slot)
{
    MemoryContext batch_context = CurrentMemoryContext;
    prepare_context_type();
    gd_begin_transitions(round_transitions, "runnable");
    batch.resize(Min(limit, GD_MAX_BATCH));
    int count = gd_pick(queue, static_cast<int>(batch.size()), batch.data(), batch_context);
    gd_count(StatEvent::pick);
    gd_count(StatEvent::pick_demand, batch.size());
    gd_count(StatEvent::pick_rows, static_cast<uint64>(count));
    batch.resize(count);
    int ran = 0;
    for (const PickedInstance &row : batch) {
        if (slot != nullptr)
            gd_worker_set_activity(slot, row.id);
        if (run_step(row, queue))
            ran++;
        CHECK_FOR_INTERRUPTS();
    }
    gd_flush_transitions(round_transitions);
    gd_release_concurrency_keys();
    batch.clear();
    return ran;
}
