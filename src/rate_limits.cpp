/*
 * rate_limits.cpp — admitting picked steps under their rate limits, a batch
 * at a time.  The token buckets live in gd._rate_buckets and
 * gd._take_rate_tokens does the arithmetic for the whole batch under the
 * buckets' row locks, each bucket read and written once; here an executor
 * (or a claim) asks once per batch before running its steps, postpones the
 * instances of the steps refused until their tokens will be there, and
 * reports a rate limit that was dropped under waiting instances, once per
 * worker and name, rather than stalling them silently.
 */
#include "rate_limits.hpp"
#include "gen_durable.hpp"
#include "kept_plans.hpp"
#include "labelled_stats.hpp"
#include "picker.hpp"
#include "step_definitions.hpp"
#include "transition.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
}

namespace {

SPIPlanPtr take_plan = nullptr; /* gd._take_rate_tokens */

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

/* Does the step take tokens (its instance or its step names a rate limit)? */
bool needs_rate(const PickedInstance &row, const StepDefinition &def)
{
    return row.rate_limit != nullptr || def.rate_limit[0] != '\0';
}

} // namespace

void gd_admit_rates(const PickedInstance *const *all_rows, const StepDefinition *const *all_defs, int all_count,
                    bool *admitted)
{
    /* Those that take no tokens are admitted without asking; the others are asked together. */
    const PickedInstance **rows = static_cast<const PickedInstance **>(palloc(sizeof(void *) * Max(all_count, 1)));
    const StepDefinition **defs = static_cast<const StepDefinition **>(palloc(sizeof(void *) * Max(all_count, 1)));
    int *position = static_cast<int *>(palloc(sizeof(int) * Max(all_count, 1)));
    int count = 0;
    for (int i = 0; i < all_count; i++) {
        admitted[i] = true;
        if (needs_rate(*all_rows[i], *all_defs[i])) {
            rows[count] = all_rows[i];
            defs[count] = all_defs[i];
            position[count++] = i;
        }
    }
    if (count == 0)
        return;
    Datum *owners = static_cast<Datum *>(palloc(sizeof(Datum) * count));
    Datum *instance_keys = static_cast<Datum *>(palloc(sizeof(Datum) * count));
    Datum *step_keys = static_cast<Datum *>(palloc(sizeof(Datum) * count));
    bool *no_instance_key = static_cast<bool *>(palloc(sizeof(bool) * count));
    bool *no_step_key = static_cast<bool *>(palloc(sizeof(bool) * count));
    Datum *weights = static_cast<Datum *>(palloc(sizeof(Datum) * count));
    for (int i = 0; i < count; i++) {
        owners[i] = ObjectIdGetDatum(rows[i]->owner);
        no_instance_key[i] = rows[i]->rate_limit == nullptr;
        instance_keys[i] = no_instance_key[i] ? 0 : CStringGetTextDatum(rows[i]->rate_limit);
        no_step_key[i] = defs[i]->rate_limit[0] == '\0';
        step_keys[i] = no_step_key[i] ? 0 : CStringGetTextDatum(defs[i]->rate_limit);
        weights[i] = Int32GetDatum(rows[i]->weight);
    }
    Datum args[4] = {gd_array_of(owners, nullptr, count, OIDOID), gd_array_of(instance_keys, no_instance_key, count, TEXTOID),
                     gd_array_of(step_keys, no_step_key, count, TEXTOID), gd_array_of(weights, nullptr, count, INT4OID)};
    if (gd_run_kept(take_plan, "SELECT t.admitted, t.not_before, t.undefined_limit FROM gd._take_rate_tokens($1, $2, $3, $4) t",
                    {OIDARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID}, args, false, 0) != SPI_OK_SELECT ||
        SPI_processed != static_cast<uint64>(count))
        elog(ERROR, "gen_durable: rate limit admission of %d steps failed", count);
    SPITupleTable *verdicts = SPI_tuptable; /* kept: the postponement is a statement of its own */
    int64 *waiting = static_cast<int64 *>(palloc(sizeof(int64) * count));
    TimestampTz *until = static_cast<TimestampTz *>(palloc(sizeof(TimestampTz) * count));
    int waiting_count = 0;
    for (int i = 0; i < count; i++) {
        HeapTuple verdict = verdicts->vals[i];
        TupleDesc desc = verdicts->tupdesc;
        bool isnull;
        admitted[position[i]] = DatumGetBool(SPI_getbinval(verdict, desc, 1, &isnull));
        if (admitted[position[i]])
            continue;
        Datum undefined_limit = SPI_getbinval(verdict, desc, 3, &isnull);
        if (!isnull) {
            const char *name = TextDatumGetCString(undefined_limit);
            gd_count_unknown_policy(name, rows[i]->fsm, rows[i]->step);
            report_dropped_limit_once(name);
        }
        Datum not_before = SPI_getbinval(verdict, desc, 2, &isnull);
        if (isnull)
            continue; /* another picker holds a bucket: the next round tries again */
        waiting[waiting_count] = rows[i]->id;
        until[waiting_count] = DatumGetTimestampTz(not_before);
        waiting_count++;
    }
    gd_postpone_all(waiting, until, waiting_count);
}
