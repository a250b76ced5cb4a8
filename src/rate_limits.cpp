/*
 * rate_limits.cpp — admitting a picked step under its rate limits.  The
 * token buckets live in gd._rate_buckets and gd._take_rate_tokens does the
 * arithmetic under the buckets' row locks; here the executor asks before
 * running a step, postpones the instance of a step refused until its tokens
 * will be there, and reports a rate limit that was dropped under waiting
 * instances, once per worker and name, rather than stalling them silently.
 */
#include "gen_durable.hpp"
#include "kept_plans.hpp"
#include "picker.hpp"
#include "rate_limits.hpp"
#include "step_definitions.hpp"
#include "transition.hpp"
#include "labelled_stats.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
}

namespace {

SPIPlanPtr take_plan = nullptr;

/* Names of dropped rate limits this process has reported (a few at most). */
constexpr int MAX_REPORTED = 32;
char reported[MAX_REPORTED][NAMEDATALEN];
int reported_count = 0;

void report_dropped_limit_once(const char *name)
{
    for (int i = 0; i < reported_count; i++)
        if (strcmp(reported[i], name) == 0)
            return;
    if (reported_count < MAX_REPORTED)
        strlcpy(reported[reported_count++], name, NAMEDATALEN);
    ereport(WARNING, (errmsg("gen_durable: rate limit \"%s\" is not defined; its instances wait", name),
                      errhint("Define it again with gd_set_rate_limit(), or cancel the instances that use it.")));
}

} // namespace

bool gd_admit_rate(const PickedInstance &row, const StepDefinition &def)
{
    if (take_plan == nullptr) {
        Oid types[3] = {OIDOID, TEXTARRAYOID, INT4OID};
        take_plan = gd_prepare_kept("SELECT t.admitted, t.not_before, t.undefined_limit"
                                    "  FROM gd._take_rate_tokens($1, $2, $3) t",
                                    3, types);
    }
    Datum keys[2];
    int count = 0;
    if (row.rate_limit != nullptr)
        keys[count++] = CStringGetTextDatum(row.rate_limit);
    if (def.rate_limit[0] != '\0')
        keys[count++] = CStringGetTextDatum(def.rate_limit);
    Datum args[3] = {ObjectIdGetDatum(row.owner),
                     PointerGetDatum(construct_array(keys, count, TEXTOID, -1, false, TYPALIGN_INT)),
                     Int32GetDatum(row.weight)};
    if (gd_execute_kept(take_plan, args, nullptr, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: rate limit admission of instance " INT64_FORMAT " failed", row.id);
    HeapTuple verdict = SPI_tuptable->vals[0];
    TupleDesc desc = SPI_tuptable->tupdesc;
    bool isnull;
    if (DatumGetBool(SPI_getbinval(verdict, desc, 1, &isnull)))
        return true;
    Datum not_before = SPI_getbinval(verdict, desc, 2, &isnull);
    bool try_next_round = isnull;
    Datum undefined_limit = SPI_getbinval(verdict, desc, 3, &isnull);
    if (!isnull) {
        const char *name = TextDatumGetCString(undefined_limit);
        gd_count_unknown_policy(name, row.fsm, row.step);
        report_dropped_limit_once(name);
    }
    if (!try_next_round)
        gd_postpone(row.id, DatumGetTimestampTz(not_before));
    return false;
}
