/*
 * rate_limits.cpp — admitting a picked step under its rate limits.  The
 * token buckets live in gd._rate_buckets and gd._admit_rate does the
 * arithmetic under the buckets' row locks; here the executor asks before
 * running a step, and reports a rate limit that was dropped under waiting
 * instances, once per worker and name, rather than stalling them silently.
 */
#include "executor.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
}

namespace {

SPIPlanPtr admit_plan = nullptr;

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
    if (admit_plan == nullptr) {
        Oid types[4] = {INT8OID, OIDOID, TEXTARRAYOID, INT4OID};
        admit_plan = gd_prepare_kept("SELECT gd._admit_rate($1, $2, $3, $4)", 4, types);
    }
    Datum keys[2];
    int count = 0;
    if (row.rate_limit != nullptr)
        keys[count++] = CStringGetTextDatum(row.rate_limit);
    if (def.rate_limit[0] != '\0')
        keys[count++] = CStringGetTextDatum(def.rate_limit);
    Datum args[4] = {Int64GetDatum(row.id), ObjectIdGetDatum(row.owner),
                     PointerGetDatum(construct_array(keys, count, TEXTOID, -1, false, TYPALIGN_INT)),
                     Int32GetDatum(row.weight)};
    if (gd_execute_kept(admit_plan, args, nullptr, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: rate limit admission of instance " INT64_FORMAT " failed", row.id);
    bool isnull;
    Datum verdict = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    if (isnull)
        return true;
    char *refusal = TextDatumGetCString(verdict);
    if (strncmp(refusal, "undefined:", strlen("undefined:")) == 0)
        report_dropped_limit_once(refusal + strlen("undefined:"));
    return false;
}
