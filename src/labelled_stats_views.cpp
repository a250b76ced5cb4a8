/*
 * labelled_stats_views.cpp — reading the labelled stats for their views:
 * gd.read_step_stats() (gd.step_stats, with latency quantiles and the
 * Prometheus histogram), gd.read_queue_counters() (gd.queue_stats, with the
 * executors' figures) and gd.read_limit_stats() (gd.limit_stats); and
 * gd_stats_reset(), which empties them and gd.stats.  Rows are copied out
 * under a table's lock; database names are looked up after it is released.
 */
#include "guard.hpp"
#include "labelled_stats_tables.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"
}

using namespace gd;

/* ---- reading them --------------------------------------------------------- */

namespace {

/*
 * Database names by oid, looked up once per read; 0 for a dropped database,
 * whose rows are left out: a database dropped and made again, or two dropped
 * ones, would otherwise give rows the same labels (an exporter refuses that).
 * A reader notes the oids under a table's lock and looks them up after it
 * released it (a catalog look-up may wait on locks and I/O); a row of a
 * database noted in between is left out of that read.
 */
struct DatabaseNames {
    Oid *oids = nullptr;
    Datum *names = nullptr;
    int count = 0, capacity = 0;
    void note(Oid oid)
    {
        for (int i = 0; i < count; i++)
            if (oids[i] == oid)
                return;
        if (count == capacity) {
            capacity = Max(16, 2 * capacity);
            oids = static_cast<Oid *>(oids == nullptr ? palloc(sizeof(Oid) * capacity)
                                                      : repalloc(oids, sizeof(Oid) * capacity));
        }
        oids[count++] = oid;
    }
    void look_up()
    {
        names = static_cast<Datum *>(palloc(sizeof(Datum) * Max(count, 1)));
        for (int i = 0; i < count; i++) {
            char *found = get_database_name(oids[i]);
            names[i] = found != nullptr ? CStringGetTextDatum(found) : 0;
        }
    }
    Datum name(Oid oid) const
    {
        for (int i = 0; names != nullptr && i < count; i++)
            if (oids[i] == oid)
                return names[i];
        return 0;
    }
    /* Note every database of a table's rows, under its lock; then look them up. */
    template <class Table>
    void read(Table &table, int lock)
    {
        LWLockAcquire(labelled_lock(lock), LW_SHARED);
        for (auto &entry : table.entries)
            if (entry.used)
                note(entry.key.database);
        LWLockRelease(labelled_lock(lock));
        look_up();
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
 * gd.read_step_stats(): per (database, fsm, step, kind, version): count,
 * total_ms, max_ms, p50_ms, p95_ms, p99_ms, latency_le (seconds),
 * latency_bucket (cumulative counts at those bounds), since,
 * latency_histogram (the count of each of the 128 buckets), version (last:
 * added later); the "(other)" row last when used.
 */
GD_SQL_FUNCTION(gd_read_step_stats)
{
    ReturnSetInfo *rsinfo = materialize(fcinfo);
    if (labelled_tables == nullptr)
        PG_RETURN_VOID();
    double bounds_seconds[PROMETHEUS_BUCKETS];
    for (int b = 0; b < PROMETHEUS_BUCKETS; b++)
        bounds_seconds[b] = std::exp2(PROMETHEUS_MIN_DOUBLING + b * PROMETHEUS_STRIDE) / USECS_PER_SEC;
    Datum bounds = float_array(bounds_seconds, PROMETHEUS_BUCKETS);
    DatabaseNames databases;
    databases.read(labelled_tables->steps, 0);
    auto emit = [&](Datum database, Datum fsm, Datum step, Datum kind, int32 version, StepCounters &c) {
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
        Datum values[15] = {database, fsm, step, kind, Int64GetDatum(static_cast<int64>(count)),
                            Float8GetDatum(pg_atomic_read_u64(&c.total_us) / 1000.0),
                            Float8GetDatum(max_us / 1000.0),
                            Float8GetDatum(quantile_ms(buckets, count, max_us, 0.50)),
                            Float8GetDatum(quantile_ms(buckets, count, max_us, 0.95)),
                            Float8GetDatum(quantile_ms(buckets, count, max_us, 0.99)), bounds,
                            bigint_array(cumulative, PROMETHEUS_BUCKETS),
                            TimestampTzGetDatum(static_cast<TimestampTz>(pg_atomic_read_u64(&gd_shared->stats.reset_at))),
                            bigint_array(buckets, LATENCY_BUCKETS), Int32GetDatum(version)};
        bool nulls[15] = {};
        nulls[0] = database == 0;
        nulls[14] = version == 0;
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    };
    LWLockAcquire(labelled_lock(0), LW_SHARED);
    for (auto &entry : labelled_tables->steps.entries)
        if (entry.used && databases.name(entry.key.database) != 0)
            emit(databases.name(entry.key.database), label_datum(entry.key.fsm, ""), label_datum(entry.key.step, ""),
                 CStringGetTextDatum(gd_step_kind(static_cast<StatEvent>(entry.key.event))), entry.key.version,
                 entry.counters);
    if (pg_atomic_read_u64(&labelled_tables->steps.other.count) > 0) {
        Datum other = CStringGetTextDatum("(other)");
        emit(0, other, other, other, 0, labelled_tables->steps.other);
    }
    LWLockRelease(labelled_lock(0));
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
    if (labelled_tables == nullptr)
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
    LWLockAcquire(labelled_lock(1), LW_SHARED);
    for (auto &entry : labelled_tables->queues.entries)
        if (entry.used) {
            Row &row = row_of(entry.key.database, entry.key.queue);
            row.counted = true;
            for (int e = 0; e < COUNTERS; e++)
                row.counters[e] = pg_atomic_read_u64(&entry.counters.events[e]);
        }
    bool other_used = false;
    Row other{};
    for (int e = 0; e < COUNTERS; e++) {
        other.counters[e] = pg_atomic_read_u64(&labelled_tables->queues.other.events[e]);
        other_used |= other.counters[e] > 0;
    }
    LWLockRelease(labelled_lock(1));
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
    for (int i = 0; i < row_count; i++)
        if (rows[i].database != InvalidOid)
            databases.note(rows[i].database);
    databases.look_up();
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
    if (labelled_tables == nullptr)
        PG_RETURN_VOID();
    static const char *const kinds[] = {"rate_limit", "concurrency", "unknown_policy"};
    DatabaseNames databases;
    databases.read(labelled_tables->limits, 2);
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
        for (const ThrottledPartition &top : c.top_partitions()) {
            Datum row[10] = {database, kind, name, label_datum(top.partition, ""), 0, 0, 0, 0,
                             Int64GetDatum(static_cast<int64>(top.throttled)), 0};
            bool row_nulls[10] = {database == 0, false, false, false, true, true, true, true, false, true};
            tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, row_nulls);
        }
    };
    LWLockAcquire(labelled_lock(2), LW_SHARED);
    for (auto &entry : labelled_tables->limits.entries)
        if (entry.used && databases.name(entry.key.database) != 0) {
            bool unknown = entry.key.kind == static_cast<int32>(LimitKind::unknown_policy);
            emit(databases.name(entry.key.database), CStringGetTextDatum(kinds[entry.key.kind]),
                 label_datum(entry.key.name, ""), unknown ? &entry.key.fsm : nullptr,
                 unknown ? &entry.key.step : nullptr, entry.counters);
        }
    if (pg_atomic_read_u64(&labelled_tables->limits.other.wanted) + pg_atomic_read_u64(&labelled_tables->limits.other.throttled) > 0) {
        Datum other = CStringGetTextDatum("(other)");
        emit(0, other, other, nullptr, nullptr, labelled_tables->limits.other);
    }
    LWLockRelease(labelled_lock(2));
    PG_RETURN_VOID();
}

/* gd_stats_reset(): zero every counter, and empty the labelled tables. */
GD_SQL_FUNCTION(gd_stats_reset)
{
    if (gd_shared != nullptr)
        gd_stats_init(&gd_shared->stats);
    gd_labelled_stats_reset();
    PG_RETURN_VOID();
}
