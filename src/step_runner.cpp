/*
 * step_runner.cpp — running one picked step.  The handler runs in its own
 * subtransaction, as the FSM's owner, under the step's timeout.  Its outcome
 * is validated and written as a transition inside that subtransaction, so
 * the step's effects and the instance's new state commit together.  If the
 * handler raises, overruns its timeout, returns NULL or a bad outcome, the
 * subtransaction is rolled back (its effects vanish) and the attempt is
 * recorded as a retry with the error.
 */
#include "executor.hpp"

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

/* gd.outcome's columns, in order. */
enum OutcomeColumn {
    OUTCOME_KIND = 1, OUTCOME_STEP, OUTCOME_STATE, OUTCOME_DELAY, OUTCOME_ERROR,
    OUTCOME_BACKOFF, OUTCOME_RESULT, OUTCOME_SIGNAL_NAMES, OUTCOME_TIMEOUT, OUTCOME_CHILDREN
};
constexpr int CONTEXT_COLUMNS = 10;

/* The rows of the batch in hand: a global, so an ERROR's longjmp skips no destructor. */
boost::container::static_vector<PickedInstance, GD_MAX_BATCH> batch;

Oid context_type = InvalidOid;
TupleDesc context_desc = nullptr;
Datum empty_json_array = 0;

int64 interval_usecs(Datum value)
{
    const Interval *span = DatumGetIntervalP(value);
    return span->time + (span->day + static_cast<int64>(span->month) * DAYS_PER_MONTH) * USECS_PER_DAY;
}

[[noreturn]] void bad_outcome(const PickedInstance &row, const char *problem)
{
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("gen_durable: step \"%s\" of FSM \"%s\" returned a bad outcome: %s", row.step, row.fsm,
                           problem)));
    pg_unreachable();
}

Datum build_context(const PickedInstance &row, const char *queue)
{
    Datum values[CONTEXT_COLUMNS] = {
        Int64GetDatum(row.id),      CStringGetTextDatum(row.fsm),
        Int32GetDatum(row.version), CStringGetTextDatum(row.step),
        Int32GetDatum(row.attempt), row.correlation_key ? CStringGetTextDatum(row.correlation_key) : 0,
        empty_json_array,           empty_json_array,
        BoolGetDatum(false),        CStringGetTextDatum(queue)};
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
        bad_outcome(row, "the handler returned NULL");
    return DatumGetHeapTupleHeader(outcome);
}

Datum outcome_field(HeapTupleHeader outcome, OutcomeColumn column, bool *isnull)
{
    return GetAttributeByNum(outcome, column, isnull);
}

/* Turn a handler's outcome into the instance's transition; a bad outcome raises 22023. */
Transition interpret_outcome(const PickedInstance &row, const StepDefinition &def, HeapTupleHeader outcome)
{
    bool isnull;
    Datum kind_datum = outcome_field(outcome, OUTCOME_KIND, &isnull);
    if (isnull)
        bad_outcome(row, "the outcome has no kind; build it with gd_next, gd_retry, gd_done or gd_stop");
    char *kind = TextDatumGetCString(kind_datum);

    Transition t{};
    t.step = row.step;
    t.attempt = 1;
    t.eligible_at = GetCurrentTimestamp();
    if (strcmp(kind, "next") == 0) {
        Datum step = outcome_field(outcome, OUTCOME_STEP, &isnull);
        if (isnull)
            bad_outcome(row, "gd_next without a step");
        t.step = TextDatumGetCString(step);
        const StepDefinition *next = gd_find_step(row.fsm, row.version, t.step);
        if (next == nullptr)
            bad_outcome(row, psprintf("gd_next to unknown step \"%s\"", t.step));
        t.state = outcome_field(outcome, OUTCOME_STATE, &isnull);
        if (isnull)
            t.state = 0;
        Datum delay = outcome_field(outcome, OUTCOME_DELAY, &isnull);
        int64 delay_us = isnull ? 0 : interval_usecs(delay);
        if (delay_us < 0)
            bad_outcome(row, "gd_next with a negative delay");
        t.status = "runnable";
        t.eligible_at += delay_us;
        t.external = next->handler == InvalidOid;
        return t;
    }
    if (strcmp(kind, "retry") == 0) {
        Datum error = outcome_field(outcome, OUTCOME_ERROR, &isnull);
        Datum error_json = isnull ? DirectFunctionCall1(jsonb_in, CStringGetDatum("{}")) : error;
        Datum backoff = outcome_field(outcome, OUTCOME_BACKOFF, &isnull);
        int64 backoff_us = isnull ? -1 : interval_usecs(backoff);
        if (!isnull && backoff_us < 0)
            bad_outcome(row, "gd_retry with a negative backoff");
        return gd_retry_transition(row, def, error_json, backoff_us);
    }
    if (strcmp(kind, "done") == 0) {
        t.status = "done";
        t.attempt = row.attempt;
        t.result = outcome_field(outcome, OUTCOME_RESULT, &isnull);
        if (isnull)
            t.result = DirectFunctionCall1(jsonb_in, CStringGetDatum("{}"));
        return t;
    }
    if (strcmp(kind, "stop") == 0) {
        t.status = "failed";
        t.attempt = row.attempt;
        t.error = outcome_field(outcome, OUTCOME_ERROR, &isnull);
        if (isnull)
            t.error = DirectFunctionCall1(jsonb_in, CStringGetDatum("{}"));
        return t;
    }
    if (strcmp(kind, "await") == 0 || strcmp(kind, "schedule_childs") == 0)
        ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                        errmsg("gen_durable: outcome kind \"%s\" is not supported by this version", kind)));
    bad_outcome(row, psprintf("unknown outcome kind \"%s\"", kind));
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

void run_step(const PickedInstance &row, const char *queue)
{
    const StepDefinition *found = gd_find_step(row.fsm, row.version, row.step);
    if (found == nullptr) {
        /* The definition was dropped under a live instance: fail it rather than spin. */
        Transition t{};
        t.status = "failed";
        t.step = row.step;
        t.attempt = row.attempt;
        t.eligible_at = GetCurrentTimestamp();
        t.error = DirectFunctionCall1(
            jsonb_in, CStringGetDatum(psprintf("{\"sqlstate\": \"42704\", \"message\": \"gen_durable: step is no "
                                               "longer defined\", \"attempt\": %d}", row.attempt)));
        gd_apply_transition(row.id, t);
        return;
    }
    const StepDefinition def = *found; /* the cache may be emptied while the handler runs */
    if (def.handler == InvalidOid) {
        /* Now an external step (redefined): hand it to external workers. */
        Transition t{};
        t.status = "runnable";
        t.step = row.step;
        t.attempt = row.attempt;
        t.eligible_at = GetCurrentTimestamp();
        t.external = true;
        gd_apply_transition(row.id, t);
        return;
    }

    MemoryContext round_context = CurrentMemoryContext;
    ResourceOwner round_owner = CurrentResourceOwner;
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(round_context);
    PG_TRY();
    {
        HeapTupleHeader outcome = call_handler(row, def, queue);
        gd_apply_transition(row.id, interpret_outcome(row, def, outcome));
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
        gd_apply_transition(row.id, gd_retry_transition(row, def, gd_error_json(edata, row), -1));
        FreeErrorData(edata);
    }
    PG_END_TRY();
}

} // namespace

int gd_execute_batch(const char *queue, int limit, WorkerSlot *slot)
{
    MemoryContext batch_context = CurrentMemoryContext;
    prepare_context_type();
    batch.resize(Min(limit, GD_MAX_BATCH));
    int count = gd_pick(queue, static_cast<int>(batch.size()), batch.data(), batch_context);
    batch.resize(count);
    for (const PickedInstance &row : batch) {
        if (slot != nullptr)
            gd_worker_set_activity(slot, row.id);
        run_step(row, queue);
        gd_wake_awaiters_at_commit(row.id);
        CHECK_FOR_INTERRUPTS();
    }
    batch.clear();
    return count;
}
