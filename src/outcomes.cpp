/*
 * outcomes.cpp — the outcome constructors a handler returns: gd_next,
 * gd_retry (the constructor), gd_wait_signal and gd_spawn build a
 * gd.outcome after checking their arguments, so a bad one fails in the
 * handler that wrote it (22023).  (gd_done and gd_stop take anything and
 * are SQL.)  They read no table and run as their caller.  What the engine
 * makes of an outcome is transition.cpp's.
 */
#include "gen_durable.hpp"
#include "guard.hpp"

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

/* gd.outcome's columns, in order (as transition.cpp reads them). */
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
    if (PG_ARGISNULL(arg))
        return;
    Datum value = PG_GETARG_DATUM(arg);
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
