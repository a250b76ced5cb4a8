/*
 * labelled_stats_tables.hpp — the three tables of the labelled stats, as
 * laid out in shared memory: what labels their rows and what each row
 * counts.  Shared by the counting (labelled_stats.cpp) and the reading
 * (labelled_stats_views.cpp).
 */
#pragma once

#include "gen_durable.hpp"
#include "label_table.hpp"
#include "labelled_stats.hpp"

extern "C" {
#include "storage/spin.h"
}

#include <cmath>

namespace gd {

/* ---- steps ---------------------------------------------------------------- */

/* Latency buckets: bucket i holds durations in [2^(i/4), 2^((i+1)/4)) µs (the first from 0, the last to
 * infinity), so a quantile read at a bucket's geometric middle is within 9% (2^(1/8)). */
constexpr int LATENCY_BUCKETS = 128;
constexpr int BUCKETS_PER_DOUBLING = 4;

inline int latency_bucket(uint64 duration_us)
{
    if (duration_us < 2)
        return 0;
    int bucket = static_cast<int>(std::floor(BUCKETS_PER_DOUBLING * std::log2(static_cast<double>(duration_us))));
    return Min(bucket, LATENCY_BUCKETS - 1);
}

inline double bucket_lower_us(int bucket)
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

/* The tables and their locks (0: steps, 1: queues, 2: limits); nullptr without the engine. */
extern LabelledStats *labelled_tables;
LWLock *labelled_lock(int table);

/* An executor's busy share at `now`: its share when last noted, moved towards `busy` since. */
double busy_share_at(WorkerSlot &slot, bool busy, TimestampTz now);


} // namespace gd
