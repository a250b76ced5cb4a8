/*
 * wakeup.cpp — waking the engine and gd_await callers at commit.  Whatever
 * makes an instance runnable records its queue here; when the transaction
 * commits, the transaction callback sets the latch of enough executors of
 * that queue in this database (idle ones first), so new work starts in
 * milliseconds rather than at the next poll; a finished child wakes the
 * reaper, which resumes its parent.  Likewise whatever changes an
 * instance records its id, and at commit the backends blocked in gd_await on
 * it are woken.  Nothing is woken on abort.
 */
#include "gen_durable.hpp"
#include "guard.hpp"

extern "C" {
#include "executor/spi.h"
}

extern "C" {
#include "access/xact.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/builtins.h"
}

#include <boost/container/small_vector.hpp>

namespace {

struct PendingWake {
    char queue[NAMEDATALEN];
    int instances; /* how many rows became runnable: wake at most this many executors */
};

/* Backend-local, cleared at the end of every transaction. */
boost::container::small_vector<PendingWake, 4> pending_wakes;
bool pending_database_wake = false;
boost::container::small_vector<int64, 64> pending_awaited;
bool pending_reaper_wake = false;
bool pending_launcher_wake = false;

bool executor_of_this_database(const WorkerSlot &slot)
{
    return slot.kind == WorkerKind::executor && slot.proc != nullptr && slot.database_oid == MyDatabaseId;
}

/* Set the latches of up to `wanted` executors of the queue, idle ones first. */
void wake_queue_executors(const PendingWake &wake)
{
    int woken = 0;
    for (int pass = 0; pass < 2 && woken < wake.instances; pass++) {
        bool want_idle = (pass == 0);
        for (WorkerSlot &slot : gd_shared->workers) {
            if (woken >= wake.instances)
                break;
            if (executor_of_this_database(slot) && slot.idle == want_idle && strcmp(slot.queue, wake.queue) == 0) {
                gd_wake_process(&slot.woken, slot.proc);
                woken++;
            }
        }
    }
}

void wake_workers()
{
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    if (pending_launcher_wake && gd_shared->launcher_proc != nullptr)
        SetLatch(&gd_shared->launcher_proc->procLatch);
    if (pending_reaper_wake)
        for (WorkerSlot &slot : gd_shared->workers)
            if (slot.kind == WorkerKind::reaper && slot.proc != nullptr && slot.database_oid == MyDatabaseId)
                gd_wake_process(&slot.woken, slot.proc);
    if (pending_database_wake) {
        for (WorkerSlot &slot : gd_shared->workers) /* executors and the reaper */
            if (slot.proc != nullptr && slot.database_oid == MyDatabaseId)
                gd_wake_process(&slot.woken, slot.proc);
        /* Executors that failed to start (the database was just created) start now. */
        pg_atomic_write_u32(&gd_shared->restart_now, 1);
        if (gd_shared->launcher_proc != nullptr)
            SetLatch(&gd_shared->launcher_proc->procLatch);
    } else {
        for (const PendingWake &wake : pending_wakes)
            wake_queue_executors(wake);
    }
    LWLockRelease(gd_shared->lock);
}

void wake_awaiters()
{
    if (pg_atomic_read_u32(&gd_shared->awaiting_backends) == 0)
        return;
    for (int i = 0; i < MaxBackends; i++) {
        BackendWaitSlot &slot = gd_shared->wait_slots[i];
        int64 awaited = static_cast<int64>(pg_atomic_read_u64(&slot.instance_id));
        if (awaited == 0 || slot.database_oid != MyDatabaseId)
            continue;
        for (int64 id : pending_awaited)
            if (id == awaited) {
                gd_wake_process(&slot.woken, slot.proc);
                break;
            }
    }
}

void on_transaction_end(XactEvent event, void *)
{
    switch (event) {
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_PARALLEL_COMMIT:
        gd_frontier_transaction_end(true); /* before the wake-ups: the woken pick from the lowered marks */
        gd_wake_claimers_at_commit();
        if (gd_shared == nullptr)
            break;
        if (!pending_wakes.empty() || pending_database_wake || pending_reaper_wake || pending_launcher_wake)
            wake_workers();
        if (!pending_awaited.empty())
            wake_awaiters();
        break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PARALLEL_ABORT:
    case XACT_EVENT_PREPARE: /* a prepared transaction's rows are found by the poll */
        gd_frontier_transaction_end(false);
        break;
    default:
        return;
    }
    pending_wakes.clear();
    pending_database_wake = false;
    pending_awaited.clear();
    pending_reaper_wake = false;
    pending_launcher_wake = false;
}

} // namespace

void gd_register_xact_callback()
{
    RegisterXactCallback(on_transaction_end, nullptr);
}

void gd_wake_queue_at_commit(const char *queue, const PickKey *key)
{
    gd_frontier_announce_at_end(queue, false, key, false);
    for (PendingWake &wake : pending_wakes)
        if (strcmp(wake.queue, queue) == 0) {
            wake.instances++;
            return;
        }
    PendingWake wake{};
    strlcpy(wake.queue, queue, sizeof(wake.queue));
    wake.instances = 1;
    gd::cpp_entry([&] { pending_wakes.push_back(wake); });
}

void gd_wake_database_at_commit()
{
    pending_database_wake = true;
}

void gd_wake_reaper_at_commit()
{
    pending_reaper_wake = true;
}

void gd_wake_launcher_at_commit()
{
    pending_launcher_wake = true;
}

void gd_wake_awaiters_at_commit(int64 instance_id)
{
    if (pending_awaited.empty() || pending_awaited.back() != instance_id)
        gd::cpp_entry([&] { pending_awaited.push_back(instance_id); });
}

/*
 * gd._wake_on_commit(queue text [, priority int, owner oid, fairness_lane
 * int, eligible_at timestamptz, id bigint]): the caller made a row of this
 * queue runnable, at that key in the pick index (the lowest of its lane, for
 * several rows) when it says.
 */
GD_SQL_FUNCTION(gd_wake_on_commit)
{
    char queue[NAMEDATALEN];
    text_to_cstring_buffer(PG_GETARG_TEXT_PP(0), queue, sizeof(queue));
    PickKey key{};
    bool keyed = PG_NARGS() == 6;
    for (int i = 1; i < PG_NARGS(); i++)
        keyed = keyed && !PG_ARGISNULL(i);
    if (keyed)
        key = PickKey{PG_GETARG_INT32(1), PG_GETARG_OID(2), PG_GETARG_INT32(3), PG_GETARG_TIMESTAMPTZ(4),
                      PG_GETARG_INT64(5)};
    gd_wake_queue_at_commit(queue, keyed ? &key : nullptr);
    PG_RETURN_VOID();
}

/* gd._wake_database_on_commit(): wake every executor here (the extension was just created). */
GD_SQL_FUNCTION(gd_wake_database_on_commit)
{
    gd_wake_database_at_commit();
    PG_RETURN_VOID();
}

/* gd._wake_awaiters_on_commit(id bigint): the caller changed this instance. */
GD_SQL_FUNCTION(gd_wake_awaiters_on_commit)
{
    gd_wake_awaiters_at_commit(PG_GETARG_INT64(0));
    PG_RETURN_VOID();
}

/* gd._wake_reaper_on_commit(): the caller ended a child instance. */
GD_SQL_FUNCTION(gd_wake_reaper_on_commit)
{
    gd_wake_reaper_at_commit();
    PG_RETURN_VOID();
}

void gd_wake_queue_of_returned(uint64 r, int first_column)
{
    HeapTuple row = SPI_tuptable->vals[r];
    TupleDesc desc = SPI_tuptable->tupdesc;
    bool isnull;
    PickKey key{DatumGetInt32(SPI_getbinval(row, desc, first_column + 1, &isnull)),
                DatumGetObjectId(SPI_getbinval(row, desc, first_column + 2, &isnull)),
                DatumGetInt32(SPI_getbinval(row, desc, first_column + 3, &isnull)),
                DatumGetTimestampTz(SPI_getbinval(row, desc, first_column + 4, &isnull)),
                DatumGetInt64(SPI_getbinval(row, desc, first_column + 5, &isnull))};
    gd_wake_queue_at_commit(SPI_getvalue(row, desc, first_column), &key);
}
