/*
 * definitions.cpp — a backend-local cache of step definitions, so the
 * executor does no catalog look-up per step.  Any change to gd._fsms or
 * gd._steps fires a statement trigger that invalidates the relation's relcache
 * entry; the invalidation reaches every backend at commit and empties its
 * cache.
 */
#include "gen_durable.hpp"
#include "guard.hpp"
#include "kept_plans.hpp"
#include "step_definitions.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "commands/trigger.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
}

#include <string>
#include <unordered_map>

namespace {

std::unordered_map<std::string, StepDefinition> cache;
bool invalidation_callback_registered = false;

std::string cache_key(const char *fsm, int version, const char *step)
{
    std::string key(fsm);
    key += '\0';
    key += std::to_string(version);
    key += '\0';
    key += step;
    return key;
}

/* The relations whose changes empty the cache, learnt when the cache is first filled. */
Oid fsms_relid = InvalidOid;
Oid steps_relid = InvalidOid;

void forget_on_change(Datum, Oid relid)
{
    if (relid == InvalidOid || relid == fsms_relid || relid == steps_relid || fsms_relid == InvalidOid) {
        cache.clear();
        fsms_relid = steps_relid = InvalidOid; /* the extension may have been re-created */
    }
}

SPIPlanPtr load_plan = nullptr;

bool load_step(const char *fsm, int version, const char *step, StepDefinition *def)
{
    if (load_plan == nullptr) {
        Oid types[3] = {TEXTOID, INT4OID, TEXTOID};
        load_plan = gd_prepare_kept("SELECT to_regprocedure(s.handler)::oid, f.owner::oid, s.max_attempts,"
                                /* clamped to 100 years: longer means never, and must not overflow */
                                "       (least(extract(epoch FROM s.backoff), 3162240000) * 1000000)::int8,"
                                "       (least(extract(epoch FROM s.max_backoff), 3162240000) * 1000000)::int8,"
                                "       least(coalesce(ceil(extract(epoch FROM s.timeout) * 1000), 0), 2147483647 - 60000)::int4,"
                                "       s.rate_limit, s.queue, f.history, s.handler IS NULL, s.backoff_jitter, s.batch,"
                                "       (extract(epoch FROM s.batch_wait) * 1000000)::int8, s.chain"
                                "  FROM gd._steps s JOIN gd._fsms f ON f.name = s.fsm AND f.version = s.version"
                                " WHERE s.fsm = $1 AND s.version = $2 AND s.step = $3",
                                3, types);
    }
    if (fsms_relid == InvalidOid) {
        Oid gd_namespace = get_namespace_oid("gd", false);
        fsms_relid = get_relname_relid("_fsms", gd_namespace);
        steps_relid = get_relname_relid("_steps", gd_namespace);
    }
    Datum args[3] = {CStringGetTextDatum(fsm), Int32GetDatum(version), CStringGetTextDatum(step)};
    if (gd_execute_kept(load_plan, args, nullptr, true, 1) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: loading step definition failed");
    if (SPI_processed == 0)
        return false;
    HeapTuple tuple = SPI_tuptable->vals[0];
    TupleDesc desc = SPI_tuptable->tupdesc;
    bool isnull;
    Datum handler = SPI_getbinval(tuple, desc, 1, &isnull);
    def->handler = isnull ? InvalidOid : DatumGetObjectId(handler);
    def->owner = DatumGetObjectId(SPI_getbinval(tuple, desc, 2, &isnull));
    def->max_attempts = DatumGetInt32(SPI_getbinval(tuple, desc, 3, &isnull));
    def->backoff_us = DatumGetInt64(SPI_getbinval(tuple, desc, 4, &isnull));
    def->max_backoff_us = DatumGetInt64(SPI_getbinval(tuple, desc, 5, &isnull));
    def->timeout_ms = DatumGetInt32(SPI_getbinval(tuple, desc, 6, &isnull));
    Datum rate_limit = SPI_getbinval(tuple, desc, 7, &isnull);
    def->rate_limit[0] = '\0';
    if (!isnull)
        text_to_cstring_buffer(DatumGetTextPP(rate_limit), def->rate_limit, sizeof(def->rate_limit));
    Datum queue = SPI_getbinval(tuple, desc, 8, &isnull);
    def->queue[0] = '\0';
    if (!isnull)
        text_to_cstring_buffer(DatumGetTextPP(queue), def->queue, sizeof(def->queue));
    def->history = DatumGetBool(SPI_getbinval(tuple, desc, 9, &isnull));
    def->external = DatumGetBool(SPI_getbinval(tuple, desc, 10, &isnull));
    def->backoff_jitter = DatumGetBool(SPI_getbinval(tuple, desc, 11, &isnull));
    def->batch = DatumGetInt32(SPI_getbinval(tuple, desc, 12, &isnull));
    def->batch_wait_us = DatumGetInt64(SPI_getbinval(tuple, desc, 13, &isnull));
    def->chain = DatumGetBool(SPI_getbinval(tuple, desc, 14, &isnull));
    return true;
}

} // namespace

std::optional<StepDefinition> gd_find_step(const char *fsm, int version, const char *step)
{
    if (!invalidation_callback_registered) {
        CacheRegisterRelcacheCallback(forget_on_change, 0);
        invalidation_callback_registered = true;
    }
    std::optional<StepDefinition> found = gd::cpp_entry([&]() -> std::optional<StepDefinition> {
        auto it = cache.find(cache_key(fsm, version, step));
        return it == cache.end() ? std::nullopt : std::optional<StepDefinition>(it->second);
    });
    if (found)
        return found;
    StepDefinition def{};
    if (!load_step(fsm, version, step, &def))
        return std::nullopt;
    gd::cpp_entry([&] { cache[cache_key(fsm, version, step)] = def; });
    return def;
}

bool gd_version_not_ready(const char *fsm, int version)
{
    static SPIPlanPtr steps_plan = nullptr;
    Datum args[2] = {CStringGetTextDatum(fsm), Int32GetDatum(version)};
    if (gd_run_kept(steps_plan, "SELECT FROM gd._steps s WHERE s.fsm = $1 AND s.version = $2 LIMIT 1",
                    {TEXTOID, INT4OID}, args, true, 1) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up the steps of FSM \"%s\" version %d failed", fsm, version);
    return SPI_processed == 0;
}

/* Statement trigger on gd._fsms and gd._steps: executors drop their caches at commit. */
GD_SQL_FUNCTION(gd_definitions_changed)
{
    if (!CALLED_AS_TRIGGER(fcinfo))
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("gen_durable: gd._definitions_changed() must be called as a trigger")));
    CacheInvalidateRelcacheByRelid(RelationGetRelid(reinterpret_cast<TriggerData *>(fcinfo->context)->tg_relation));
    return PointerGetDatum(nullptr);
}
