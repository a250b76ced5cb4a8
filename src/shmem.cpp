/*
 * shmem.cpp — the extension's shared memory: the worker slot table the
 * launcher plans into and workers report through, the backends' wait slots
 * that let a commit wake backends blocked in gd_await or in gd_claim's wait,
 * and the segment of the
 * labelled counters (labelled_stats.cpp, with its own locks).
 *
 * Locking: GdShared::lock (one named LWLock tranche) protects worker slot
 * allocation and the non-atomic slot fields.  Activity fields and wait slots
 * are atomics, read without the lock; a stale read only costs a spurious
 * latch wake-up, which every waiter tolerates.
 */
#include "gen_durable.hpp"
#include "labelled_stats.hpp"
#include "pg_compat.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/shmem.h"
}

GdShared *gd_shared = nullptr;

namespace {

shmem_request_hook_type previous_shmem_request_hook = nullptr;
shmem_startup_hook_type previous_shmem_startup_hook = nullptr;

Size shared_size()
{
    return add_size(offsetof(GdShared, wait_slots), mul_size(MaxBackends, sizeof(BackendWaitSlot)));
}

void request_shmem()
{
    if (previous_shmem_request_hook)
        previous_shmem_request_hook();
    RequestAddinShmemSpace(shared_size());
    RequestNamedLWLockTranche("gen_durable", 1);
    RequestAddinShmemSpace(gd_labelled_stats_size());
    RequestNamedLWLockTranche("gen_durable labelled stats", GD_LABELLED_STATS_LOCKS);
}

void startup_shmem()
{
    if (previous_shmem_startup_hook)
        previous_shmem_startup_hook();

    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found = false;
    gd_shared = static_cast<GdShared *>(ShmemInitStruct("gen_durable", shared_size(), &found));
    if (!found) {
        memset(static_cast<void *>(gd_shared), 0, shared_size());
        gd_shared->lock = &(GetNamedLWLockTranche("gen_durable"))->lock;
        for (WorkerSlot &slot : gd_shared->workers) {
            pg_atomic_init_u64(&slot.current_instance, 0);
            pg_atomic_init_u64(&slot.since, 0);
            pg_atomic_init_u64(&slot.cancel_step, 0);
            pg_atomic_init_u64(&slot.cancel_requested_at, 0);
            pg_atomic_init_u32(&slot.served, 0);
            pg_atomic_init_u32(&slot.woken, 0);
            pg_atomic_init_u64(&slot.busy_share, 0);
            pg_atomic_init_u64(&slot.busy_noted_at, 0);
            pg_atomic_init_u32(&slot.pick_limit, 0);
            pg_atomic_init_u32(&slot.in_flight, 0);
        }
        pg_atomic_init_u32(&gd_shared->awaiting_backends, 0);
        pg_atomic_init_u32(&gd_shared->claiming_backends, 0);
        pg_atomic_init_u32(&gd_shared->cancelling_backends, 0);
        pg_atomic_init_u32(&gd_shared->work_listeners, 0);
        pg_atomic_init_u32(&gd_shared->worker_deaths, 0);
        pg_atomic_init_u32(&gd_shared->restart_now, 0);
        gd_stats_init(&gd_shared->stats);
        gd_frontiers_init(gd_shared->frontiers);
        for (int i = 0; i < MaxBackends; i++)
        {
            pg_atomic_init_u64(&gd_shared->wait_slots[i].instance_id, 0);
            pg_atomic_init_u32(&gd_shared->wait_slots[i].claim_waiting, 0);
            pg_atomic_init_u32(&gd_shared->wait_slots[i].woken, 0);
            pg_atomic_init_u64(&gd_shared->wait_slots[i].cancelling, 0);
        }
    }
    void *labelled = ShmemInitStruct("gen_durable labelled stats", gd_labelled_stats_size(), &found);
    gd_labelled_stats_attach(labelled, GetNamedLWLockTranche("gen_durable labelled stats"), !found);
    LWLockRelease(AddinShmemInitLock);
}

} // namespace

void gd_install_shmem_hooks()
{
    previous_shmem_request_hook = shmem_request_hook;
    shmem_request_hook = request_shmem;
    previous_shmem_startup_hook = shmem_startup_hook;
    shmem_startup_hook = startup_shmem;
}

/* ---- the worker side of a slot ------------------------------------------ */

namespace {

constexpr int SLOT_BITS = 16;

void detach_worker_slot(int, Datum arg)
{
    WorkerSlot *slot = reinterpret_cast<WorkerSlot *>(DatumGetPointer(arg));
    LWLockAcquire(gd_shared->lock, LW_EXCLUSIVE);
    if (slot->pid == MyProcPid) { /* not reassigned to a newer worker meanwhile */
        slot->pid = 0;
        slot->proc = nullptr;
        slot->idle = false;
        pg_atomic_write_u64(&slot->current_instance, 0);
    }
    LWLockRelease(gd_shared->lock);
}

} // namespace

Datum gd_worker_arg(int slot_index, uint32 generation)
{
    return Int64GetDatum((static_cast<int64>(generation) << SLOT_BITS) | slot_index);
}

WorkerSlot *gd_worker_slot_for(Datum arg, char *database_out)
{
    int64 packed = DatumGetInt64(arg);
    int slot_index = static_cast<int>(packed & ((1 << SLOT_BITS) - 1));
    uint32 generation = static_cast<uint32>(packed >> SLOT_BITS);
    if (gd_shared == nullptr || slot_index >= GD_MAX_WORKERS)
        proc_exit(0);
    WorkerSlot *slot = &gd_shared->workers[slot_index];
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    bool current = slot->kind != WorkerKind::free && slot->generation == generation;
    if (current)
        strlcpy(database_out, slot->database, NAMEDATALEN);
    LWLockRelease(gd_shared->lock);
    if (!current)
        proc_exit(0); /* planned by an earlier launcher: not ours to run */
    return slot;
}

void gd_worker_attach(WorkerSlot *slot)
{
    LWLockAcquire(gd_shared->lock, LW_EXCLUSIVE);
    slot->pid = MyProcPid;
    slot->proc = MyProc;
    slot->database_oid = MyDatabaseId;
    slot->idle = false;
    LWLockRelease(gd_shared->lock);
    before_shmem_exit(detach_worker_slot, PointerGetDatum(slot));
}

BackendWaitSlot *gd_my_wait_slot()
{
    int index = gd_my_backend_index();
    if (gd_shared == nullptr || index < 0 || index >= MaxBackends)
        return nullptr;
    return &gd_shared->wait_slots[index];
}

void gd_wake_process(pg_atomic_uint32 *woken, PGPROC *proc)
{
    pg_atomic_write_u32(woken, 1);
    SetLatch(&proc->procLatch); /* a full barrier: the sleeper that sees the latch sees the flag */
}

void gd_worker_set_activity(WorkerSlot *slot, int64 instance_id)
{
    pg_atomic_write_u64(&slot->current_instance, static_cast<uint64>(instance_id));
    pg_atomic_write_u64(&slot->since, static_cast<uint64>(GetCurrentTimestamp()));
}

void gd_require_engine(const char *what)
{
    if (gd_shared == nullptr)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("gen_durable: %s needs the engine, which this server does not run", what),
                        errdetail("gen_durable is not in shared_preload_libraries."),
                        errhint("Add gen_durable to shared_preload_libraries and restart the server.")));
}
