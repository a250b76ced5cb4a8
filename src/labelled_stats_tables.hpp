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

#include <boost/container/static_vector.hpp>

#include <cmath>
#include <new>

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
    int32 version; /* of the FSM */
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

/* A partition throttled much, and by how much. */
struct ThrottledPartition {
    Label partition;
    uint64 throttled;
};
using TopPartitions = boost::container::static_vector<ThrottledPartition, TOP_PARTITIONS>;

struct LimitCounters {
    pg_atomic_uint64 wanted, granted, throttled, contended;
    slock_t top_mutex;
    TopPartitions top; /* in place: no allocation, fit for shared memory */
    void init()
    {
        init_atomics(&wanted, 1);
        init_atomics(&granted, 1);
        init_atomics(&throttled, 1);
        init_atomics(&contended, 1);
        SpinLockInit(&top_mutex);
        new (&top) TopPartitions();
    }
    void note_throttled_partition(const Label &partition, uint64 amount)
    {
        SpinLockAcquire(&top_mutex);
        ThrottledPartition *found = nullptr, *smallest = nullptr;
        for (ThrottledPartition &entry : top) {
            if (memcmp(&entry.partition, &partition, sizeof(Label)) == 0)
                found = &entry;
            if (smallest == nullptr || entry.throttled < smallest->throttled)
                smallest = &entry;
        }
        if (found == nullptr && top.size() < top.capacity())
            found = &top.emplace_back(ThrottledPartition{partition, 0});
        else if (found == nullptr) {
            found = smallest; /* space saving: the newcomer inherits the smallest count */
            found->partition = partition;
        }
        found->throttled += amount;
        SpinLockRelease(&top_mutex);
    }
    /* A copy, taken under the mutex. */
    TopPartitions top_partitions()
    {
        SpinLockAcquire(&top_mutex);
        TopPartitions copy = top;
        SpinLockRelease(&top_mutex);
        return copy;
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
