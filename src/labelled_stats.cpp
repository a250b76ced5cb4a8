/*
 * labelled_stats.cpp — counters by label set in shared memory: per
 * (database, FSM, step, outcome kind) the steps' count, time and latency
 * histogram (gd.step_stats); per (database, queue) picks, drains, reclaims
 * and stale outcomes (gd.queue_stats); per (database, limit kind, name) the
 * tokens or room wanted and granted, with the partitions throttled most
 * (gd.limit_stats).  Each table is a fixed array with open addressing under
 * one LWLock: a known label set is counted under the shared lock with
 * atomics, a new one is added under the exclusive lock, and once a table is
 * 7/8 full new label sets are counted under its "(other)" row (and in
 * gd.stats as labels_overflowed).  Names are kept to their first 63 bytes.
 * Like gd.stats, they count since the last reset or server start.  The
 * tables' layout is labelled_stats_tables.hpp's; their readers are
 * labelled_stats_views.cpp's.
 */
#include "guard.hpp"
#include "labelled_stats_tables.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/spin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"
}

#include <cmath>
#include <type_traits>

using namespace gd;

LabelledStats *gd::labelled_tables = nullptr;

namespace {

LWLockPadded *table_locks = nullptr;

} // namespace

LWLock *gd::labelled_lock(int table)
{
    return &table_locks[table].lock;
}

Size gd_labelled_stats_size()
{
    return sizeof(LabelledStats);
}

void gd_labelled_stats_attach(void *memory, LWLockPadded *locks, bool fresh)
{
    labelled_tables = static_cast<LabelledStats *>(memory);
    table_locks = locks;
    if (fresh) {
        labelled_tables->steps.reset();
        labelled_tables->queues.reset();
        labelled_tables->limits.reset();
    }
}

void gd_labelled_stats_reset()
{
    if (labelled_tables == nullptr)
        return;
    LWLockAcquire(labelled_lock(0), LW_EXCLUSIVE);
    labelled_tables->steps.reset();
    LWLockRelease(labelled_lock(0));
    LWLockAcquire(labelled_lock(1), LW_EXCLUSIVE);
    labelled_tables->queues.reset();
    LWLockRelease(labelled_lock(1));
    LWLockAcquire(labelled_lock(2), LW_EXCLUSIVE);
    labelled_tables->limits.reset();
    LWLockRelease(labelled_lock(2));
}

void gd_count_labelled_step(const char *fsm, int version, const char *step, StatEvent event, int64 duration_us)
{
    if (labelled_tables == nullptr)
        return;
    StepKey key;
    memset(&key, 0, sizeof(key));
    key.database = MyDatabaseId;
    key.event = static_cast<int32>(event);
    key.version = version;
    set_label(key.fsm, fsm);
    set_label(key.step, step);
    uint64 duration = static_cast<uint64>(Max(duration_us, 0));
    int bucket = latency_bucket(duration);
    labelled_tables->steps.with_counters(labelled_lock(0), key, [&](StepCounters &c) {
        pg_atomic_fetch_add_u64(&c.count, 1);
        pg_atomic_fetch_add_u64(&c.total_us, duration);
        pg_atomic_fetch_add_u64(&c.buckets[bucket], 1);
        raise_to(c.max_us, duration);
    });
}

namespace {

/* Count into the counters of this database's queue. */
template <class F>
void with_queue_counters(const char *queue, F &&count)
{
    QueueKey key;
    memset(&key, 0, sizeof(key));
    key.database = MyDatabaseId;
    set_label(key.queue, queue);
    labelled_tables->queues.with_counters(labelled_lock(1), key, count);
}

} // namespace

void gd_count_queue(const char *queue, QueueEvent event, uint64 amount)
{
    if (labelled_tables == nullptr || amount == 0)
        return;
    with_queue_counters(queue, [&](QueueCounters &c) {
        pg_atomic_fetch_add_u64(&c.events[static_cast<int>(event)], amount);
    });
}

void gd_count_queue_pick(const char *queue, int asked, int picked)
{
    if (labelled_tables == nullptr)
        return;
    with_queue_counters(queue, [&](QueueCounters &c) {
        pg_atomic_fetch_add_u64(&c.events[static_cast<int>(QueueEvent::picks)], 1);
        pg_atomic_fetch_add_u64(&c.events[static_cast<int>(QueueEvent::rows_asked)], static_cast<uint64>(asked));
        pg_atomic_fetch_add_u64(&c.events[static_cast<int>(QueueEvent::rows_picked)], static_cast<uint64>(picked));
    });
}

namespace {

void count_limit(const LimitKey &key, const Label *partition, const LimitCounts &counts)
{
    labelled_tables->limits.with_counters(labelled_lock(2), key, [&](LimitCounters &c) {
        pg_atomic_fetch_add_u64(&c.wanted, counts.wanted);
        pg_atomic_fetch_add_u64(&c.granted, counts.granted);
        pg_atomic_fetch_add_u64(&c.throttled, counts.throttled);
        pg_atomic_fetch_add_u64(&c.contended, counts.contended);
        if (partition != nullptr && counts.throttled > 0)
            c.note_throttled_partition(*partition, counts.throttled);
    });
}

} // namespace

void gd_count_limit(LimitKind kind, const char *limit_key, const LimitCounts &counts)
{
    if (labelled_tables == nullptr || limit_key == nullptr)
        return;
    LimitKey key;
    memset(&key, 0, sizeof(key));
    key.database = MyDatabaseId;
    key.kind = static_cast<int32>(kind);
    const char *colon = strchr(limit_key, ':');
    set_label(key.name, limit_key, colon == nullptr ? -1 : static_cast<int>(colon - limit_key));
    Label partition;
    if (colon != nullptr)
        set_label(partition, colon + 1);
    count_limit(key, colon != nullptr ? &partition : nullptr, counts);
}

void gd_count_unknown_policy(const char *name, const char *fsm, const char *step)
{
    if (labelled_tables == nullptr)
        return;
    LimitKey key;
    memset(&key, 0, sizeof(key));
    key.database = MyDatabaseId;
    key.kind = static_cast<int32>(LimitKind::unknown_policy);
    set_label(key.name, name);
    set_label(key.fsm, fsm);
    set_label(key.step, step);
    count_limit(key, nullptr, LimitCounts{1, 0, 1, 0});
}

/* ---- executors' figures --------------------------------------------------- */

namespace {

/* An executor's busy share decays towards its current state with this time constant. */
constexpr double BUSY_SHARE_SECONDS = 10.0;

double read_double(pg_atomic_uint64 &bits)
{
    uint64 raw = pg_atomic_read_u64(&bits);
    double value;
    memcpy(&value, &raw, sizeof(value));
    return value;
}

void write_double(pg_atomic_uint64 &bits, double value)
{
    uint64 raw;
    memcpy(&raw, &value, sizeof(raw));
    pg_atomic_write_u64(&bits, raw);
}

/* The slot's busy share at `now`: its share when last noted, moved towards `busy` since. */
} // namespace

double gd::busy_share_at(WorkerSlot &slot, bool busy, TimestampTz now)
{
    double share = read_double(slot.busy_share);
    TimestampTz noted = static_cast<TimestampTz>(pg_atomic_read_u64(&slot.busy_noted_at));
    if (noted == 0)
        return busy ? 1.0 : 0.0;
    double elapsed = Max(static_cast<double>(now - noted) / USECS_PER_SEC, 0.0);
    double target = busy ? 1.0 : 0.0;
    return target + (share - target) * std::exp(-elapsed / BUSY_SHARE_SECONDS);
}


void gd_note_executor_busy(WorkerSlot *slot, bool busy)
{
    TimestampTz now = GetCurrentTimestamp();
    write_double(slot->busy_share, busy_share_at(*slot, !busy, now)); /* the state that is ending */
    pg_atomic_write_u64(&slot->busy_noted_at, static_cast<uint64>(now));
}

void gd_note_round(WorkerSlot *slot, int pick_limit, int in_flight)
{
    if (pick_limit > 0)
        pg_atomic_write_u32(&slot->pick_limit, static_cast<uint32>(pick_limit));
    pg_atomic_write_u32(&slot->in_flight, static_cast<uint32>(in_flight));
}

/* gd._count_limit(kind text, key text, wanted int, granted int, throttled int, contended int): from SQL. */
GD_SQL_FUNCTION(gd_count_limit_event)
{
    const char *kind = text_to_cstring(PG_GETARG_TEXT_PP(0));
    LimitKind limit_kind;
    if (strcmp(kind, "rate_limit") == 0)
        limit_kind = LimitKind::rate_limit;
    else if (strcmp(kind, "concurrency") == 0)
        limit_kind = LimitKind::concurrency;
    else
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: unknown limit kind \"%s\"", kind)));
    LimitCounts counts{};
    uint64 *fields[4] = {&counts.wanted, &counts.granted, &counts.throttled, &counts.contended};
    for (int i = 0; i < 4; i++)
        *fields[i] = static_cast<uint64>(Max(PG_GETARG_INT32(2 + i), 0));
    gd_count_limit(limit_kind, text_to_cstring(PG_GETARG_TEXT_PP(1)), counts);
    PG_RETURN_VOID();
}

