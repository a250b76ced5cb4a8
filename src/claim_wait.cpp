/*
 * claim_wait.cpp — gd_claim(..., wait => ...): a claim that finds no work
 * sleeps in the server until work for its queue commits, so a worker needs
 * neither LISTEN (which a transaction pooler cannot carry) nor a poll.
 *
 * The claim (sql/src/70_external.sql) publishes the queue it waits on in its
 * backend's wait slot before it picks, then sleeps on its latch: a commit
 * that lands between its pick and its sleep still sets the latch.  At the
 * commit of whatever makes external work of a queue runnable (notify.cpp
 * records it, as it records NOTIFY gd_work), the backends waiting on that
 * queue in this database are woken, after the rows are visible.  Every
 * waiter of the queue is woken, whichever FSMs it claims: one that finds
 * nothing it may take sleeps again.  A registration is cleared at
 * transaction end, an error's included.
 */
#include "gen_durable.hpp"
#include "guard.hpp"
#include "pg_compat.hpp"

extern "C" {
#include "access/xact.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
}

namespace {

bool cleanup_registered = false;

/* Stop waiting: the slot no longer names a queue. */
void withdraw(BackendWaitSlot *slot)
{
    if (pg_atomic_exchange_u32(&slot->claim_waiting, 0) == 1)
        pg_atomic_fetch_sub_u32(&gd_shared->claiming_backends, 1);
}

void clear_at_transaction_end(XactEvent event, void *)
{
    if (event != XACT_EVENT_ABORT && event != XACT_EVENT_COMMIT)
        return;
    BackendWaitSlot *slot = gd_my_wait_slot();
    if (slot != nullptr)
        withdraw(slot);
}

/* Wait for work of `queue` (nullptr: stop waiting). */
void publish(const char *queue)
{
    BackendWaitSlot *slot = gd_my_wait_slot();
    if (slot == nullptr)
        return;
    withdraw(slot); /* the name changes only while no waker reads it as ours */
    if (queue == nullptr)
        return;
    if (!cleanup_registered) {
        RegisterXactCallback(clear_at_transaction_end, nullptr);
        cleanup_registered = true;
    }
    slot->database_oid = MyDatabaseId;
    slot->proc = MyProc;
    strlcpy(slot->claim_queue, queue, sizeof(slot->claim_queue));
    pg_atomic_write_u32(&slot->woken, 0); /* woken from now on: the pick that follows may miss the work */
    pg_write_barrier();
    pg_atomic_write_u32(&slot->claim_waiting, 1);
    pg_atomic_fetch_add_u32(&gd_shared->claiming_backends, 1);
}

} // namespace

void gd_wake_claimers(const char *queue)
{
    if (gd_shared == nullptr || pg_atomic_read_u32(&gd_shared->claiming_backends) == 0)
        return;
    for (int i = 0; i < MaxBackends; i++) {
        BackendWaitSlot &slot = gd_shared->wait_slots[i];
        if (pg_atomic_read_u32(&slot.claim_waiting) == 0)
            continue;
        pg_read_barrier();
        /* A name read while its owner republishes may be torn: a spurious wake-up,
         * or none for a claim that has not picked yet (and will see the rows). */
        if (slot.database_oid == MyDatabaseId && strncmp(slot.claim_queue, queue, NAMEDATALEN) == 0)
            gd_wake_process(&slot.woken, slot.proc);
    }
}

/* gd._claim_wait_publish(queue text): wake me when external work of this queue commits (NULL: stop). */
GD_SQL_FUNCTION(gd_claim_wait_publish)
{
    if (PG_ARGISNULL(0)) {
        publish(nullptr);
        PG_RETURN_VOID();
    }
    char queue[NAMEDATALEN];
    text_to_cstring_buffer(PG_GETARG_TEXT_PP(0), queue, sizeof(queue));
    publish(queue);
    PG_RETURN_VOID();
}

/* gd._claim_wait_sleep(milliseconds int): sleep until woken, the time passes, or a cancel. */
GD_SQL_FUNCTION(gd_claim_wait_sleep)
{
    static uint32 claiming = 0;
    gd_sleep_until_woken(PG_GETARG_INT32(0), gd_wait_event(claiming, "GenDurableClaim"));
    PG_RETURN_VOID();
}
