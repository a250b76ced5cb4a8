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
 * Like gd.stats, they count since the last reset or server start.
 */
#include "labelled_stats.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"

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

namespace {

/* A label: a name cut to NAMEDATALEN - 1 bytes on a character boundary, zero-padded (keys compare bytewise). */
struct Label {
    char text[NAMEDATALEN];
};

void set_label(Label &label, const char *name, int length = -1)
{
    memset(label.text, 0, sizeof(label.text));
    if (name == nullptr)
        return;
    if (length < 0)
        length = static_cast<int>(strlen(name));
    memcpy(label.text, name, pg_mbcliplen(name, length, NAMEDATALEN - 1));
}

void init_atomics(pg_atomic_uint64 *values, int count)
{
    for (int i = 0; i < count; i++)
        pg_atomic_init_u64(&values[i], 0);
}

void raise_to(pg_atomic_uint64 &maximum, uint64 value)
{
    uint64 seen = pg_atomic_read_u64(&maximum);
    while (value > seen && !pg_atomic_compare_exchange_u64(&maximum, &seen, value)) {
    }
}

/*
 * A fixed table of label sets.  Entries are only added (a reset empties the
 * table), so a probe from the key's hash stops at the first free entry.
 */
template <class Key, class Counters, int Capacity>
struct LabelTable {
    static_assert(std::is_trivially_copyable_v<Key>, "keys compare bytewise");
    struct Entry {
        bool used;
        Key key;
        Counters counters;
    };
    int used_count;
    Counters other;
    Entry entries[Capacity];

    void reset()
    {
        used_count = 0;
        other.init();
        for (Entry &entry : entries) {
            entry.used = false;
            entry.counters.init();
        }
    }

    /* The entry of `key`, or the free entry where it would go; nullptr when neither (full). */
    Entry *probe(const Key &key, uint32 hash)
    {
        for (int n = 0; n < Capacity; n++) {
            Entry &entry = entries[(hash + n) % Capacity];
            if (!entry.used || memcmp(&entry.key, &key, sizeof(Key)) == 0)
                return &entry;
        }
        return nullptr;
    }

    /* Count into the key's counters (`count` is called under the table's lock). */
    template <class F>
    void with_counters(LWLock *lock, const Key &key, F &&count)
    {
        uint32 hash = hash_bytes(reinterpret_cast<const unsigned char *>(&key), sizeof(Key));
        LWLockAcquire(lock, LW_SHARED);
        Entry *entry = probe(key, hash);
        if (entry != nullptr && entry->used) {
            count(entry->counters);
            LWLockRelease(lock);
            return;
        }
        LWLockRelease(lock);
        LWLockAcquire(lock, LW_EXCLUSIVE);
        entry = probe(key, hash);
        if (entry != nullptr && !entry->used && used_count < Capacity / 8 * 7) {
            entry->key = key;
            entry->used = true;
            used_count++;
        }
        if (entry != nullptr && entry->used) {
            count(entry->counters);
        } else {
            count(other);
            gd_count(StatEvent::labels_overflowed);
        }
        LWLockRelease(lock);
    }
};

/* ---- steps ---------------------------------------------------------------- */

/* Latency buckets: bucket i holds durations in [2^(i/4), 2^((i+1)/4)) µs (the first from 0, the last to
 * infinity), so a quantile read at a bucket's geometric middle is within 9% (2^(1/8)). */
constexpr int LATENCY_BUCKETS = 128;
constexpr int BUCKETS_PER_DOUBLING = 4;

int latency_bucket(uint64 duration_us)
{
    if (duration_us < 2)
        return 0;
    int bucket = static_cast<int>(std::floor(BUCKETS_PER_DOUBLING * std::log2(static_cast<double>(duration_us))));
    return Min(bucket, LATENCY_BUCKETS - 1);
}

double bucket_lower_us(int bucket)
{
    return bucket == 0 ? 0.0 : std::exp2(static_cast<double>(bucket) / BUCKETS_PER_DOUBLING);
}

struct StepKey {
    Oid database;
    int32 event; /* a step StatEvent */
    Label fsm, step;
};

struct StepCounters {
    pg_atomic_uint64 count, total_us, max_us;
    pg_atomic_uint64 buckets[LATENCY_BUCKETS];
    void init()
    {
        init_atomics(&count, 1);
        init_atomics(&total_us, 1);
        init_atomics(&max_us, 1);
        init_atomics(buckets, LATENCY_BUCKETS);
    }
};

/* ---- queues --------------------------------------------------------------- */

struct QueueKey {
    Oid database;
    Label queue;
};

struct QueueCounters {
    pg_atomic_uint64 events[static_cast<int>(QueueEvent::count_)];
    void init() { init_atomics(events, static_cast<int>(QueueEvent::count_)); }
};

/* ---- limits --------------------------------------------------------------- */

struct LimitKey {
    Oid database;
    int32 kind; /* LimitKind */
    Label name;
    Label fsm, step; /* unknown_policy: the step that named it */
};

/* The partitions throttled most, by the space-saving count (an estimate from above once it evicts). */
constexpr int TOP_PARTITIONS = 5;

struct LimitCounters {
    pg_atomic_uint64 wanted, granted, throttled, contended;
    slock_t top_mutex;
    int top_count;
    Label top_partition[TOP_PARTITIONS];
    uint64 top_throttled[TOP_PARTITIONS];
    void init()
    {
        init_atomics(&wanted, 1);
        init_atomics(&granted, 1);
        init_atomics(&throttled, 1);
        init_atomics(&contended, 1);
        SpinLockInit(&top_mutex);
        top_count = 0;
    }
    void note_throttled_partition(const Label &partition, uint64 amount)
    {
        SpinLockAcquire(&top_mutex);
        int found = -1, smallest = 0;
        for (int i = 0; i < top_count; i++) {
            if (memcmp(&top_partition[i], &partition, sizeof(Label)) == 0)
                found = i;
            if (top_throttled[i] < top_throttled[smallest])
                smallest = i;
        }
        if (found < 0 && top_count < TOP_PARTITIONS) {
            found = top_count++;
            top_partition[found] = partition;
            top_throttled[found] = 0;
        } else if (found < 0) {
            found = smallest; /* space saving: the newcomer inherits the smallest count */
            top_partition[found] = partition;
        }
        top_throttled[found] += amount;
        SpinLockRelease(&top_mutex);
    }
};

constexpr int STEP_LABELS = 1024, QUEUE_LABELS = 256, LIMIT_LABELS = 512;

struct LabelledStats {
    LabelTable<StepKey, StepCounters, STEP_LABELS> steps;
    LabelTable<QueueKey, QueueCounters, QUEUE_LABELS> queues;
    LabelTable<LimitKey, LimitCounters, LIMIT_LABELS> limits;
};

LabelledStats *tables = nullptr;
LWLockPadded *table_locks = nullptr;

LWLock *lock_of(int table)
{
    return &table_locks[table].lock;
}

const char *const queue_event_names[] = {"picks", "rows_asked", "rows_picked", "drained", "reclaimed",
                                         "stale_outcomes"};
static_assert(lengthof(queue_event_names) == static_cast<int>(QueueEvent::count_), "a name per queue event");

} // namespace

Size gd_labelled_stats_size()
{
    return sizeof(LabelledStats);
}

void gd_labelled_stats_attach(void *memory, LWLockPadded *locks, bool fresh)
{
    tables = static_cast<LabelledStats *>(memory);
    table_locks = locks;
    if (fresh) {
        tables->steps.reset();
        tables->queues.reset();
        tables->limits.reset();
    }
}

void gd_labelled_stats_reset()
{
    if (tables == nullptr)
        return;
    LWLockAcquire(lock_of(0), LW_EXCLUSIVE);
    tables->steps.reset();
    LWLockRelease(lock_of(0));
    LWLockAcquire(lock_of(1), LW_EXCLUSIVE);
    tables->queues.reset();
    LWLockRelease(lock_of(1));
    LWLockAcquire(lock_of(2), LW_EXCLUSIVE);
    tables->limits.reset();
    LWLockRelease(lock_of(2));
}

void gd_count_labelled_step(const char *fsm, const char *step, StatEvent event, int64 duration_us)
{
    if (tables == nullptr)
        return;
    StepKey key;
    memset(&key, 0, sizeof(key));
    key.database = MyDatabaseId;
    key.event = static_cast<int32>(event);
    set_label(key.fsm, fsm);
    set_label(key.step, step);
    uint64 duration = static_cast<uint64>(Max(duration_us, 0));
    int bucket = latency_bucket(duration);
    tables->steps.with_counters(lock_of(0), key, [&](StepCounters &c) {
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
    tables->queues.with_counters(lock_of(1), key, count);
}

} // namespace

void gd_count_queue(const char *queue, QueueEvent event, uint64 amount)
{
    if (tables == nullptr || amount == 0)
        return;
    with_queue_counters(queue, [&](QueueCounters &c) {
        pg_atomic_fetch_add_u64(&c.events[static_cast<int>(event)], amount);
    });
}

void gd_count_queue_pick(const char *queue, int asked, int picked)
{
    if (tables == nullptr)
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
    tables->limits.with_counters(lock_of(2), key, [&](LimitCounters &c) {
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
    if (tables == nullptr || limit_key == nullptr)
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
    if (tables == nullptr)
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
double busy_share_at(WorkerSlot &slot, bool busy, TimestampTz now)
{
    double share = read_double(slot.busy_share);
    TimestampTz noted = static_cast<TimestampTz>(pg_atomic_read_u64(&slot.busy_noted_at));
    if (noted == 0)
        return busy ? 1.0 : 0.0;
    double elapsed = Max(static_cast<double>(now - noted) / USECS_PER_SEC, 0.0);
    double target = busy ? 1.0 : 0.0;
    return target + (share - target) * std::exp(-elapsed / BUSY_SHARE_SECONDS);
}

} // namespace

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

/* ---- reading them --------------------------------------------------------- */

namespace {

/* Database names by oid, looked up once per read; 0 for a dropped database,
 * whose rows are left out: a database dropped and made again, or two dropped
 * ones, would otherwise give rows the same labels (an exporter refuses that). */
struct DatabaseNames {
    Oid oids[16];
    Datum names[16];
    int count = 0;
    Datum name(Oid oid)
    {
        for (int i = 0; i < count; i++)
            if (oids[i] == oid)
                return names[i];
        char *found = get_database_name(oid);
        Datum name = found != nullptr ? CStringGetTextDatum(found) : 0;
        if (count < static_cast<int>(lengthof(oids))) {
            oids[count] = oid;
            names[count++] = name;
        }
        return name;
    }
};

Datum float_array(const double *values, int count)
{
    Datum *elements = static_cast<Datum *>(palloc(sizeof(Datum) * count));
    for (int i = 0; i < count; i++)
        elements[i] = Float8GetDatum(values[i]);
    return PointerGetDatum(construct_array(elements, count, FLOAT8OID, sizeof(float8), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

Datum bigint_array(const uint64 *values, int count)
{
    Datum *elements = static_cast<Datum *>(palloc(sizeof(Datum) * count));
    for (int i = 0; i < count; i++)
        elements[i] = Int64GetDatum(static_cast<int64>(values[i]));
    return PointerGetDatum(construct_array(elements, count, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE));
}

/* The q-quantile of a histogram, in ms: at the rank's place within its bucket, on the log scale. */
double quantile_ms(const uint64 *buckets, uint64 total, uint64 max_us, double q)
{
    if (total == 0)
        return 0.0;
    double rank = Max(q * static_cast<double>(total), 1.0);
    double below = 0;
    for (int i = 0; i < LATENCY_BUCKETS; i++) {
        if (buckets[i] == 0 || below + static_cast<double>(buckets[i]) < rank) {
            below += static_cast<double>(buckets[i]);
            continue;
        }
        double fraction = (rank - below) / static_cast<double>(buckets[i]);
        double lower = bucket_lower_us(i), upper = bucket_lower_us(i + 1);
        double estimate = i == 0 ? upper * fraction : lower * std::pow(upper / lower, fraction);
        return Min(estimate, static_cast<double>(max_us)) / 1000.0;
    }
    return static_cast<double>(max_us) / 1000.0;
}

/* The histogram as Prometheus reads it: cumulative counts at every doubling from 2^MIN to 2^MAX µs. */
constexpr int PROMETHEUS_MIN_DOUBLING = 6, PROMETHEUS_MAX_DOUBLING = 32, PROMETHEUS_STRIDE = 2;
constexpr int PROMETHEUS_BUCKETS = (PROMETHEUS_MAX_DOUBLING - PROMETHEUS_MIN_DOUBLING) / PROMETHEUS_STRIDE + 1;

ReturnSetInfo *materialize(FunctionCallInfo fcinfo)
{
    InitMaterializedSRF(fcinfo, 0);
    return reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
}

Datum label_datum(const Label &label, const char *when_empty)
{
    return CStringGetTextDatum(label.text[0] != '\0' ? label.text : when_empty);
}

} // namespace

/*
 * gd.read_step_stats(): per (database, fsm, step, kind): count, total_ms,
 * max_ms, p50_ms, p95_ms, p99_ms, latency_le (seconds), latency_bucket
 * (cumulative counts at those bounds), since, latency_histogram (the count
 * of each of the 128 buckets); the "(other)" row last when used.
 */
GD_SQL_FUNCTION(gd_read_step_stats)
{
    ReturnSetInfo *rsinfo = materialize(fcinfo);
    if (tables == nullptr)
        PG_RETURN_VOID();
    double bounds_seconds[PROMETHEUS_BUCKETS];
    for (int b = 0; b < PROMETHEUS_BUCKETS; b++)
        bounds_seconds[b] = std::exp2(PROMETHEUS_MIN_DOUBLING + b * PROMETHEUS_STRIDE) / USECS_PER_SEC;
    Datum bounds = float_array(bounds_seconds, PROMETHEUS_BUCKETS);
    DatabaseNames databases;
    auto emit = [&](Datum database, Datum fsm, Datum step, Datum kind, StepCounters &c) {
        uint64 buckets[LATENCY_BUCKETS];
        for (int i = 0; i < LATENCY_BUCKETS; i++)
            buckets[i] = pg_atomic_read_u64(&c.buckets[i]);
        uint64 count = pg_atomic_read_u64(&c.count), max_us = pg_atomic_read_u64(&c.max_us);
        uint64 cumulative[PROMETHEUS_BUCKETS], running = 0;
        int next = 0;
        for (int b = 0; b < PROMETHEUS_BUCKETS; b++) {
            int last_bucket = BUCKETS_PER_DOUBLING * (PROMETHEUS_MIN_DOUBLING + b * PROMETHEUS_STRIDE) - 1;
            for (; next <= last_bucket; next++)
                running += buckets[next];
            cumulative[b] = running;
        }
        Datum values[14] = {database, fsm, step, kind, Int64GetDatum(static_cast<int64>(count)),
                            Float8GetDatum(pg_atomic_read_u64(&c.total_us) / 1000.0),
                            Float8GetDatum(max_us / 1000.0),
                            Float8GetDatum(quantile_ms(buckets, count, max_us, 0.50)),
                            Float8GetDatum(quantile_ms(buckets, count, max_us, 0.95)),
                            Float8GetDatum(quantile_ms(buckets, count, max_us, 0.99)), bounds,
                            bigint_array(cumulative, PROMETHEUS_BUCKETS),
                            TimestampTzGetDatum(static_cast<TimestampTz>(pg_atomic_read_u64(&gd_shared->stats.reset_at))),
                            bigint_array(buckets, LATENCY_BUCKETS)};
        bool nulls[14] = {};
        nulls[0] = database == 0;
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    };
    LWLockAcquire(lock_of(0), LW_SHARED);
    for (auto &entry : tables->steps.entries)
        if (entry.used && databases.name(entry.key.database) != 0)
            emit(databases.name(entry.key.database), label_datum(entry.key.fsm, ""), label_datum(entry.key.step, ""),
                 CStringGetTextDatum(gd_step_kind(static_cast<StatEvent>(entry.key.event))), entry.counters);
    if (pg_atomic_read_u64(&tables->steps.other.count) > 0) {
        Datum other = CStringGetTextDatum("(other)");
        emit(0, other, other, other, tables->steps.other);
    }
    LWLockRelease(lock_of(0));
    PG_RETURN_VOID();
}

/*
 * gd.read_queue_counters(): per (database, queue) with executors or
 * counts: executors, in_flight, batch_size (their mean pick limit now),
 * saturation (their mean busy share, 0..1), and the counters.
 */
GD_SQL_FUNCTION(gd_read_queue_counters)
{
    ReturnSetInfo *rsinfo = materialize(fcinfo);
    if (tables == nullptr)
        PG_RETURN_VOID();
    constexpr int COUNTERS = static_cast<int>(QueueEvent::count_);
    struct Row {
        Oid database;
        Label queue;
        int executors;
        int64 in_flight, pick_limits;
        double busy;
        uint64 counters[COUNTERS];
        bool counted;
    };
    Row *rows = static_cast<Row *>(palloc0(sizeof(Row) * (QUEUE_LABELS + GD_MAX_WORKERS + 1)));
    int row_count = 0;
    auto row_of = [&](Oid database, const Label &queue) -> Row & {
        for (int i = 0; i < row_count; i++)
            if (rows[i].database == database && memcmp(&rows[i].queue, &queue, sizeof(Label)) == 0)
                return rows[i];
        rows[row_count].database = database;
        rows[row_count].queue = queue;
        return rows[row_count++];
    };
    LWLockAcquire(lock_of(1), LW_SHARED);
    for (auto &entry : tables->queues.entries)
        if (entry.used) {
            Row &row = row_of(entry.key.database, entry.key.queue);
            row.counted = true;
            for (int e = 0; e < COUNTERS; e++)
                row.counters[e] = pg_atomic_read_u64(&entry.counters.events[e]);
        }
    bool other_used = false;
    Row other{};
    for (int e = 0; e < COUNTERS; e++) {
        other.counters[e] = pg_atomic_read_u64(&tables->queues.other.events[e]);
        other_used |= other.counters[e] > 0;
    }
    LWLockRelease(lock_of(1));
    TimestampTz now = GetCurrentTimestamp();
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    for (WorkerSlot &slot : gd_shared->workers) {
        if (slot.kind != WorkerKind::executor || slot.pid == 0 || slot.database_oid == InvalidOid)
            continue;
        Label queue;
        set_label(queue, slot.queue);
        Row &row = row_of(slot.database_oid, queue);
        row.executors++;
        row.in_flight += pg_atomic_read_u32(&slot.in_flight);
        row.pick_limits += pg_atomic_read_u32(&slot.pick_limit);
        row.busy += busy_share_at(slot, !slot.idle, now);
    }
    LWLockRelease(gd_shared->lock);
    if (other_used) {
        set_label(other.queue, "(other)");
        rows[row_count++] = other;
    }
    DatabaseNames databases;
    for (int i = 0; i < row_count; i++) {
        Row &row = rows[i];
        Datum values[12];
        bool nulls[12] = {};
        values[0] = row.database == InvalidOid ? 0 : databases.name(row.database);
        nulls[0] = row.database == InvalidOid;
        if (!nulls[0] && values[0] == 0)
            continue;
        values[1] = label_datum(row.queue, "");
        values[2] = Int32GetDatum(row.executors);
        values[3] = Int64GetDatum(row.in_flight);
        values[4] = Int32GetDatum(row.executors > 0 ? static_cast<int32>(row.pick_limits / row.executors) : 0);
        values[5] = Float8GetDatum(row.executors > 0 ? Min(Max(row.busy / row.executors, 0.0), 1.0) : 0.0);
        for (int e = 0; e < COUNTERS; e++)
            values[6 + e] = Int64GetDatum(static_cast<int64>(row.counters[e]));
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    PG_RETURN_VOID();
}

/*
 * gd.read_limit_stats(): per (database, kind, name): wanted, granted,
 * throttled, contended; the partitions throttled most follow their name's
 * row (their throttled count only); unknown_policy rows name the FSM and
 * step.
 */
GD_SQL_FUNCTION(gd_read_limit_stats)
{
    ReturnSetInfo *rsinfo = materialize(fcinfo);
    if (tables == nullptr)
        PG_RETURN_VOID();
    static const char *const kinds[] = {"rate_limit", "concurrency", "unknown_policy"};
    DatabaseNames databases;
    auto emit = [&](Datum database, Datum kind, Datum name, const Label *fsm, const Label *step,
                    LimitCounters &c) {
        Datum values[10] = {database, kind, name, 0, 0, 0,
                            Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&c.wanted))),
                            Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&c.granted))),
                            Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&c.throttled))),
                            Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&c.contended)))};
        bool nulls[10] = {database == 0, false, false, true, fsm == nullptr, step == nullptr};
        if (fsm != nullptr)
            values[4] = label_datum(*fsm, "");
        if (step != nullptr)
            values[5] = label_datum(*step, "");
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
        SpinLockAcquire(&c.top_mutex);
        int top_count = c.top_count;
        Label partitions[TOP_PARTITIONS];
        uint64 throttled[TOP_PARTITIONS];
        for (int i = 0; i < top_count; i++) {
            partitions[i] = c.top_partition[i];
            throttled[i] = c.top_throttled[i];
        }
        SpinLockRelease(&c.top_mutex);
        for (int i = 0; i < top_count; i++) {
            Datum row[10] = {database, kind, name, label_datum(partitions[i], ""), 0, 0, 0, 0,
                             Int64GetDatum(static_cast<int64>(throttled[i])), 0};
            bool row_nulls[10] = {database == 0, false, false, false, true, true, true, true, false, true};
            tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, row_nulls);
        }
    };
    LWLockAcquire(lock_of(2), LW_SHARED);
    for (auto &entry : tables->limits.entries)
        if (entry.used && databases.name(entry.key.database) != 0) {
            bool unknown = entry.key.kind == static_cast<int32>(LimitKind::unknown_policy);
            emit(databases.name(entry.key.database), CStringGetTextDatum(kinds[entry.key.kind]),
                 label_datum(entry.key.name, ""), unknown ? &entry.key.fsm : nullptr,
                 unknown ? &entry.key.step : nullptr, entry.counters);
        }
    if (pg_atomic_read_u64(&tables->limits.other.wanted) + pg_atomic_read_u64(&tables->limits.other.throttled) > 0) {
        Datum other = CStringGetTextDatum("(other)");
        emit(0, other, other, nullptr, nullptr, tables->limits.other);
    }
    LWLockRelease(lock_of(2));
    PG_RETURN_VOID();
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
