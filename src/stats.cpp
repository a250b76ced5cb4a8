/*
 * stats.cpp — the engine's event counters: atomics in shared memory, bumped
 * without locks by executors, the reaper, GC and the SQL API, read by the
 * gd.stats view and zeroed by gd_stats_reset().  They count since the last
 * reset or server start (they do not survive a restart); an event counted in
 * a transaction that later rolls back stays counted.
 */
#include "gen_durable.hpp"
#include "guard.hpp"

extern "C" {
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

namespace {

const char *const event_names[GD_STAT_EVENTS] = {
    "step_next", "step_retry", "step_await", "step_spawn", "step_done", "step_stop",
    "pick", "pick_rows", "pick_demand", "reaped", "await_timeout", "gc_swept", "outcome_stale",
    "rate_limit_throttled", "rate_limit_contended", "concurrency_throttled", "concurrency_contended",
    "reclaimed", "drained", "concurrency_repaired", "labels_overflowed",
    "work_notified"};

GdStats *stats()
{
    return gd_shared == nullptr ? nullptr : &gd_shared->stats;
}

bool is_step_event(int event)
{
    return event <= static_cast<int>(StatEvent::step_stop);
}

} // namespace

void gd_stats_init(GdStats *s)
{
    for (StatCounter &c : s->counters) {
        pg_atomic_init_u64(&c.count, 0);
        pg_atomic_init_u64(&c.total_us, 0);
        pg_atomic_init_u64(&c.max_us, 0);
    }
    pg_atomic_init_u64(&s->reset_at, static_cast<uint64>(GetCurrentTimestamp()));
}

void gd_count(StatEvent event, uint64 amount)
{
    if (GdStats *s = stats())
        pg_atomic_fetch_add_u64(&s->counters[static_cast<int>(event)].count, amount);
}

void gd_count_step(StatEvent event, int64 duration_us)
{
    GdStats *s = stats();
    if (s == nullptr)
        return;
    StatCounter &c = s->counters[static_cast<int>(event)];
    uint64 duration = static_cast<uint64>(Max(duration_us, 0));
    pg_atomic_fetch_add_u64(&c.count, 1);
    pg_atomic_fetch_add_u64(&c.total_us, duration);
    uint64 seen = pg_atomic_read_u64(&c.max_us);
    while (duration > seen && !pg_atomic_compare_exchange_u64(&c.max_us, &seen, duration)) {
    }
}

const char *gd_step_kind(StatEvent event)
{
    int i = static_cast<int>(event);
    return i >= 0 && i < GD_STAT_EVENTS && is_step_event(i) ? event_names[i] + strlen("step_") : nullptr;
}

/* gd.read_stats(): one row per event: event, count, total_ms, max_ms, since. */
GD_SQL_FUNCTION(gd_stats)
{
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    GdStats *s = stats();
    if (s == nullptr)
        PG_RETURN_VOID();
    TimestampTz since = static_cast<TimestampTz>(pg_atomic_read_u64(&s->reset_at));
    for (int i = 0; i < GD_STAT_EVENTS; i++) {
        StatCounter &c = s->counters[i];
        bool step = is_step_event(i);
        Datum values[5] = {CStringGetTextDatum(event_names[i]),
                           Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&c.count))),
                           Float8GetDatum(pg_atomic_read_u64(&c.total_us) / 1000.0),
                           Float8GetDatum(pg_atomic_read_u64(&c.max_us) / 1000.0), TimestampTzGetDatum(since)};
        bool nulls[5] = {false, false, !step, !step, false};
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    PG_RETURN_VOID();
}

/* gd._count(event text, amount bigint): count an event raised by SQL code. */
GD_SQL_FUNCTION(gd_count_event)
{
    char *event = text_to_cstring(PG_GETARG_TEXT_PP(0));
    int64 amount = PG_GETARG_INT64(1);
    for (int i = 0; i < GD_STAT_EVENTS; i++)
        if (strcmp(event_names[i], event) == 0) {
            if (amount > 0)
                gd_count(static_cast<StatEvent>(i), static_cast<uint64>(amount));
            PG_RETURN_VOID();
        }
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("gen_durable: unknown event \"%s\"", event)));
    PG_RETURN_VOID();
}
