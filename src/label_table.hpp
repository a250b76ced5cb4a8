/*
 * label_table.hpp — a fixed table of label sets in shared memory, for the
 * labelled stats: entries are only added (a reset empties the table), a
 * known label set is counted under the table's shared lock with atomics, a
 * new one is added under the exclusive lock, and once the table is 7/8 full
 * new label sets are counted under its "(other)" row.
 */
#pragma once

#include "stats.hpp"

extern "C" {
#include "common/hashfn.h"
#include "mb/pg_wchar.h"
#include "storage/lwlock.h"
}

#include <type_traits>

namespace gd {

/* A label: a name cut to NAMEDATALEN - 1 bytes on a character boundary, zero-padded (keys compare bytewise). */
struct Label {
    char text[NAMEDATALEN];
};

inline void set_label(Label &label, const char *name, int length = -1)
{
    memset(label.text, 0, sizeof(label.text));
    if (name == nullptr)
        return;
    if (length < 0)
        length = static_cast<int>(strlen(name));
    memcpy(label.text, name, pg_mbcliplen(name, length, NAMEDATALEN - 1));
}

inline void init_atomics(pg_atomic_uint64 *values, int count)
{
    for (int i = 0; i < count; i++)
        pg_atomic_init_u64(&values[i], 0);
}

inline void raise_to(pg_atomic_uint64 &maximum, uint64 value)
{
    uint64 seen = pg_atomic_read_u64(&maximum);
    while (value > seen && !pg_atomic_compare_exchange_u64(&maximum, &seen, value)) {
    }
}

/* A probe from the key's hash stops at the first free entry. */
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


} // namespace gd
