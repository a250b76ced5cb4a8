/*
 * outcomes.cpp — the outcome constructors a handler returns: gd_next,
 * gd_retry (the constructor), gd_wait_signal and gd_spawn build a
 * gd.outcome after checking their arguments, so a bad one fails in the
 * handler that wrote it (22023).  (gd_done and gd_stop take anything and
 * are SQL.)  They read no table and run as their caller.  What the engine
 * makes of an outcome is transition.cpp's.
 */
#include "outcomes.hpp"
#include "error_documents.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
#include "transition.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
}

#include <initializer_list>

namespace {

/* gd.outcome's columns, in order. */
enum OutcomeField { KIND, STEP, STATE, DELAY, ERROR_JSON, BACKOFF, RESULT, SIGNAL_NAMES, TIMEOUT, CHILDREN, FIELDS };

[[noreturn]] void bad_argument(const char *message)
{
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("gen_durable: %s", message)));
    pg_unreachable();
}

const char *jsonb_text(Datum value)
{
    return DatumGetCString(DirectFunctionCall1(jsonb_out, value));
}

/* array_out keeps a cache in its caller's FmgrInfo: called through its pg_proc entry. */
const char *text_array_text(Datum value)
{
    Oid output;
    bool varlena;
    getTypeOutputInfo(TEXTARRAYOID, &output, &varlena);
    return OidOutputFunctionCall(output, value);
}

/* A new state: NULL, or a JSON object. */
void check_state(FunctionCallInfo fcinfo, int arg)
{
    if (!PG_ARGISNULL(arg) && !JB_ROOT_IS_OBJECT(PG_GETARG_JSONB_P(arg)))
        bad_argument(psprintf("state must be a JSON object, got %s", jsonb_text(PG_GETARG_DATUM(arg))));
}

/* Delays, timeouts and backoffs: NULL, or from 0 to 100 years. */
void check_interval(FunctionCallInfo fcinfo, int arg, const char *what)
{
    if (!PG_ARGISNULL(arg))
        gd_check_interval(PG_GETARG_DATUM(arg), what);
}

bool empty_text_argument(FunctionCallInfo fcinfo, int arg)
{
    return PG_ARGISNULL(arg) || VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(arg)) == 0;
}

/* Which argument of the constructor fills which field. */
struct FromArgument {
    OutcomeField field;
    int arg;
};

/* A gd.outcome being built: a kind, fields from arguments (NULL when the argument is), the others NULL. */
class Outcome {
public:
    Outcome(FunctionCallInfo fcinfo, const char *kind, std::initializer_list<FromArgument> from) : fcinfo_(fcinfo)
    {
        for (bool &null : nulls_)
            null = true;
        set(KIND, CStringGetTextDatum(kind));
        for (const FromArgument &f : from)
            if (!PG_ARGISNULL(f.arg))
                set(f.field, PG_GETARG_DATUM(f.arg));
    }
    void set(OutcomeField field, Datum value)
    {
        values_[field] = value;
        nulls_[field] = false;
    }
    Datum build()
    {
        TupleDesc desc;
        if (get_call_result_type(fcinfo_, nullptr, &desc) != TYPEFUNC_COMPOSITE)
            elog(ERROR, "gen_durable: an outcome constructor must return gd.outcome");
        return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values_, nulls_));
    }

private:
    FunctionCallInfo fcinfo_;
    Datum values_[FIELDS] = {};
    bool nulls_[FIELDS];
};

} // namespace

void gd_check_interval(Datum value, const char *what)
{
    Interval zero{}, hundred_years{};
    hundred_years.month = 100 * MONTHS_PER_YEAR;
    const char *text = nullptr;
    if (DatumGetBool(DirectFunctionCall2(interval_lt, value, IntervalPGetDatum(&zero))))
        text = "%s must not be negative, got %s";
    else if (DatumGetBool(DirectFunctionCall2(interval_gt, value, IntervalPGetDatum(&hundred_years))))
        text = "%s must be at most 100 years, got %s";
    if (text != nullptr)
        bad_argument(psprintf(text, what, DatumGetCString(DirectFunctionCall1(interval_out, value))));
}

void gd_check_lease(Datum value, const char *what)
{
    Interval zero{};
    if (DatumGetBool(DirectFunctionCall2(interval_le, value, IntervalPGetDatum(&zero))))
        bad_argument(psprintf("%s must be a positive interval, got %s", what,
                              DatumGetCString(DirectFunctionCall1(interval_out, value))));
    gd_check_interval(value, what);
}

/* gd._check_interval(value interval, what text) → interval: gd_check_interval, for the SQL API. */
GD_SQL_FUNCTION(gd_check_interval_sql)
{
    gd_check_interval(PG_GETARG_DATUM(0), text_to_cstring(PG_GETARG_TEXT_PP(1)));
    PG_RETURN_DATUM(PG_GETARG_DATUM(0));
}

/* gd._check_lease(value interval, what text) → interval: gd_check_lease, for the SQL API. */
GD_SQL_FUNCTION(gd_check_lease_sql)
{
    gd_check_lease(PG_GETARG_DATUM(0), text_to_cstring(PG_GETARG_TEXT_PP(1)));
    PG_RETURN_DATUM(PG_GETARG_DATUM(0));
}

/* Signal names: a one-dimensional array of non-empty, non-NULL names. */
bool gd_signal_names_ok(ArrayType *names)
{
    if (ARR_NDIM(names) != 1)
        return false;
    Datum *elements;
    bool *element_nulls;
    int count;
    deconstruct_array(names, TEXTOID, -1, false, TYPALIGN_INT, &elements, &element_nulls, &count);
    for (int i = 0; i < count; i++)
        if (element_nulls[i] || VARSIZE_ANY_EXHDR(DatumGetTextPP(elements[i])) == 0)
            return false;
    return count > 0;
}

/* gd_next(step text, state jsonb, delay interval) */
GD_SQL_FUNCTION(gd_next)
{
    if (empty_text_argument(fcinfo, 0))
        bad_argument("gd_next needs a step");
    check_state(fcinfo, 1);
    check_interval(fcinfo, 2, "delay");
    return Outcome(fcinfo, "next", {{STEP, 0}, {STATE, 1}, {DELAY, 2}}).build();
}

/* gd_retry(error jsonb, backoff interval): a NULL error is {}. */
GD_SQL_FUNCTION(gd_retry_outcome)
{
    check_interval(fcinfo, 1, "backoff");
    Outcome outcome(fcinfo, "retry", {{ERROR_JSON, 0}, {BACKOFF, 1}});
    if (PG_ARGISNULL(0))
        outcome.set(ERROR_JSON, DirectFunctionCall1(jsonb_in, CStringGetDatum("{}")));
    return outcome.build();
}

/* gd_wait_signal(names text[], timeout interval, then_step text, state jsonb) */
GD_SQL_FUNCTION(gd_wait_signal)
{
    if (PG_ARGISNULL(0) || !gd_signal_names_ok(PG_GETARG_ARRAYTYPE_P(0)))
        bad_argument(psprintf("gd_wait_signal needs signal names, got %s",
                              PG_ARGISNULL(0) ? "NULL" : text_array_text(PG_GETARG_DATUM(0))));
    check_state(fcinfo, 3);
    check_interval(fcinfo, 1, "timeout");
    return Outcome(fcinfo, "await", {{STEP, 2}, {STATE, 3}, {SIGNAL_NAMES, 0}, {TIMEOUT, 1}}).build();
}

/* gd_spawn(children jsonb, then_step text, state jsonb) */
GD_SQL_FUNCTION(gd_spawn)
{
    if (PG_ARGISNULL(0) || !JB_ROOT_IS_ARRAY(PG_GETARG_JSONB_P(0)) || JB_ROOT_IS_SCALAR(PG_GETARG_JSONB_P(0)))
        bad_argument(psprintf("gd_spawn needs a JSON array of insert options, got %s",
                              PG_ARGISNULL(0) ? "NULL" : jsonb_text(PG_GETARG_DATUM(0))));
    if (empty_text_argument(fcinfo, 1))
        bad_argument("gd_spawn needs a then_step");
    check_state(fcinfo, 2);
    return Outcome(fcinfo, "schedule_childs", {{STEP, 1}, {STATE, 2}, {CHILDREN, 0}}).build();
}

/* ---- decoding an outcome returned --------------------------------------- */

namespace {

Datum outcome_field(HeapTupleHeader outcome, OutcomeField field, bool *isnull)
{
    return GetAttributeByNum(outcome, field + 1, isnull);
}

/* An interval in microseconds, clamped to +/- GD_MAX_DELAY_US. */
int64 interval_usecs(Datum value)
{
    const Interval *span = DatumGetIntervalP(value);
    double usecs = static_cast<double>(span->time) +
                   (static_cast<double>(span->day) + static_cast<double>(span->month) * DAYS_PER_MONTH) * USECS_PER_DAY;
    return static_cast<int64>(Max(Min(usecs, static_cast<double>(GD_MAX_DELAY_US)), -static_cast<double>(GD_MAX_DELAY_US)));
}

[[noreturn]] void bad_outcome(const PickedInstance &row, const char *problem)
{
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("gen_durable: step \"%s\" of FSM \"%s\" returned a bad outcome: %s", row.step, row.fsm,
                           problem)));
    pg_unreachable();
}

Datum empty_object()
{
    return DirectFunctionCall1(jsonb_in, CStringGetDatum("{}"));
}

/* A new state from an outcome: NULL keeps the state; anything but an object is a bad outcome. */
Datum outcome_state(const PickedInstance &row, HeapTupleHeader outcome)
{
    bool isnull;
    Datum state = outcome_field(outcome, STATE, &isnull);
    if (isnull) /* the state stays: the row's (0), or mid-chain the chain's, which the row does not hold yet */
        return row.arrived_by != nullptr ? row.state : 0;
    if (!JB_ROOT_IS_OBJECT(DatumGetJsonbP(state)))
        bad_outcome(row, "the new state is not a JSON object");
    return state;
}

/* The step to resume at after a wait: the named one (which must exist) or the same step. */
const char *resume_step(const PickedInstance &row, HeapTupleHeader outcome, bool required)
{
    bool isnull;
    Datum step = outcome_field(outcome, STEP, &isnull);
    if (isnull) {
        if (required)
            bad_outcome(row, "gd_spawn without a then_step");
        return row.step;
    }
    const char *name = TextDatumGetCString(step);
    if (!gd_find_step(row.fsm, row.version, name))
        bad_outcome(row, psprintf("resume at unknown step \"%s\"", name));
    return name;
}

/* A wait or a spawn: parked until resumed at its then_step (a spawn must name one). */
void park(Transition &t, const PickedInstance &row, HeapTupleHeader outcome, Status status, StatEvent event)
{
    t.to.status = status;
    t.ran.event = event;
    t.to.then_step = resume_step(row, outcome, status == Status::awaiting_children);
}

/* The error document of a gd_retry or gd_stop outcome: `kind`, "step ... <did>", the user's error. */
Datum outcome_error(const PickedInstance &row, HeapTupleHeader outcome, const char *kind, const char *did)
{
    bool isnull;
    Datum error = outcome_field(outcome, ERROR_JSON, &isnull);
    return gd_error_document(row, ErrorFields{kind, psprintf("gen_durable: step \"%s\" %s", row.step, did)},
                             isnull ? 0 : error);
}

} // namespace

Transition gd_outcome_transition(const PickedInstance &row, const StepDefinition &def, HeapTupleHeader outcome,
                                 Oid outcome_role)
{
    bool isnull;
    Datum kind_datum = outcome_field(outcome, KIND, &isnull);
    if (isnull)
        bad_outcome(row, "the outcome has no kind; build it with gd_next, gd_retry, gd_done or gd_stop");
    char *kind = TextDatumGetCString(kind_datum);

    Transition t = gd_transition_from(row);
    t.then.parent_id = 0; /* only an ending instance wakes its parent */
    t.to.attempt = 1;
    t.to.external = def.external; /* who runs the current step; gd_next says who runs the next */
    t.ran.claimed = def.external;
    t.ran.history = def.history;
    if (strcmp(kind, "next") == 0) {
        t.ran.event = StatEvent::step_next;
        Datum step = outcome_field(outcome, STEP, &isnull);
        if (isnull)
            bad_outcome(row, "gd_next without a step");
        t.to.step = TextDatumGetCString(step);
        std::optional<StepDefinition> next = gd_find_step(row.fsm, row.version, t.to.step);
        if (!next)
            bad_outcome(row, psprintf("gd_next to unknown step \"%s\"", t.to.step));
        t.to.state = outcome_state(row, outcome);
        Datum delay = outcome_field(outcome, DELAY, &isnull);
        int64 delay_us = isnull ? 0 : interval_usecs(delay);
        if (delay_us < 0)
            bad_outcome(row, "gd_next with a negative delay");
        t.to.status = Status::runnable;
        t.to.eligible_at += delay_us;
        t.to.external = next->external;
        /* To the next step's own queue, or home from a step with a queue of its
         * own (an instance is away from home only at such a step). */
        if (next->queue[0] != '\0') {
            t.to.route = pstrdup(next->queue);
            t.to.moved = strcmp(t.to.route, row.queue) != 0;
        } else {
            t.to.moved = def.queue[0] != '\0';
        }
        /* From one in-database step straight to the next in the same queue, the
         * row keeps its place: every indexed column stays as it was, so the
         * update can be HOT (no new index entries, none left for vacuum). */
        if (delay_us == 0 && !t.to.external && !t.to.moved && !def.external)
            t.to.eligible_at = row.eligible_at;
        return t;
    }
    if (strcmp(kind, "retry") == 0) {
        Datum error_json = outcome_error(row, outcome, "retry", "asked to run again");
        Datum backoff = outcome_field(outcome, BACKOFF, &isnull);
        int64 backoff_us = isnull ? -1 : interval_usecs(backoff);
        if (!isnull && backoff_us < 0)
            bad_outcome(row, "gd_retry with a negative backoff");
        return gd_retry_transition(row, def, error_json, backoff_us);
    }
    if (strcmp(kind, "done") == 0) {
        /* The end of a compensation: cancelled, with its result, and why and where the cancel found it. */
        Datum result = outcome_field(outcome, RESULT, &isnull);
        Transition done = gd_final_transition(row, row.cancelled != 0 ? Status::cancelled : Status::done,
                                              isnull ? empty_object() : result, row.cancelled);
        done.ran.event = StatEvent::step_done;
        done.to.external = t.to.external;
        done.ran.history = def.history;
        return done;
    }
    if (strcmp(kind, "stop") == 0) {
        Datum error_json = outcome_error(row, outcome, "stop", "stopped its instance");
        Transition stopped = gd_final_transition(row, Status::failed, 0, error_json);
        stopped.to.external = t.to.external;
        stopped.ran.history = def.history;
        return stopped;
    }
    if (strcmp(kind, "await") == 0) {
        park(t, row, outcome, Status::awaiting_signal, StatEvent::step_await);
        t.to.wait_names = outcome_field(outcome, SIGNAL_NAMES, &isnull);
        if (isnull || !gd_signal_names_ok(DatumGetArrayTypeP(t.to.wait_names)))
            bad_outcome(row, "gd_wait_signal needs signal names: a one-dimensional array of non-empty names");
        Datum timeout = outcome_field(outcome, TIMEOUT, &isnull);
        if (!isnull) {
            int64 timeout_us = interval_usecs(timeout);
            if (timeout_us < 0)
                bad_outcome(row, "gd_wait_signal with a negative timeout");
            t.to.wait_deadline = t.to.eligible_at + timeout_us;
        }
        t.to.state = outcome_state(row, outcome);
        return t;
    }
    if (strcmp(kind, "schedule_childs") == 0) {
        park(t, row, outcome, Status::awaiting_children, StatEvent::step_spawn);
        t.to.children = outcome_field(outcome, CHILDREN, &isnull);
        if (isnull)
            bad_outcome(row, "gd_spawn without children");
        t.to.spawn_role = outcome_role;
        t.to.state = outcome_state(row, outcome);
        return t;
    }
    bad_outcome(row, psprintf("unknown outcome kind \"%s\"", kind));
}
