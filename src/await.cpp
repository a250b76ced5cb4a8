/*
 * await.cpp — the blocking half of gd_await.  The SQL function (in the
 * install script) re-reads the committed row in a loop; between reads it
 * sleeps here on its own latch, having first published the awaited instance
 * in its await slot, so an executor that commits a change to that instance
 * sets the latch.  Publishing before reading closes the lost-wake-up window.
 * A registration left behind by an error is cleared at transaction end.
 * An instance the awaiting transaction itself wrote cannot change before it
 * commits: gd_await refuses to wait for it (gd_written_here).
 */
#include "gen_durable.hpp"
#include "guard.hpp"
#include "pg_compat.hpp"

extern "C" {
#include "access/xact.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/wait_event.h"
}

namespace {

void publish_awaited(int64 instance_id)
{
    BackendWaitSlot *slot = gd_my_wait_slot();
    if (slot == nullptr)
        return;
    slot->database_oid = MyDatabaseId;
    slot->proc = MyProc;
    pg_atomic_write_u32(&slot->woken, 0);
    uint64 previous = pg_atomic_exchange_u64(&slot->instance_id, static_cast<uint64>(instance_id));
    if (previous == 0 && instance_id != 0)
        pg_atomic_fetch_add_u32(&gd_shared->awaiting_backends, 1);
    else if (previous != 0 && instance_id == 0)
        pg_atomic_fetch_sub_u32(&gd_shared->awaiting_backends, 1);
}

void clear_at_transaction_end(XactEvent event, void *)
{
    if (event == XACT_EVENT_ABORT || event == XACT_EVENT_COMMIT) {
        BackendWaitSlot *slot = gd_my_wait_slot();
        if (slot != nullptr && pg_atomic_read_u64(&slot->instance_id) != 0)
            publish_awaited(0);
    }
}

} // namespace

void gd_register_await_cleanup()
{
    RegisterXactCallback(clear_at_transaction_end, nullptr);
}

/* gd._written_here(row_xmin xid) → boolean: did this transaction write the row (not yet committed)? */
GD_SQL_FUNCTION(gd_written_here)
{
    PG_RETURN_BOOL(TransactionIdIsCurrentTransactionId(DatumGetTransactionId(PG_GETARG_DATUM(0))));
}

/* gd._await_publish(id bigint): wake me when this instance changes (0: stop). */
GD_SQL_FUNCTION(gd_await_publish)
{
    if (PG_GETARG_INT64(0) != 0)
        gd_require_engine("gd_await"); /* nothing would wake it */
    publish_awaited(PG_GETARG_INT64(0));
    PG_RETURN_VOID();
}

void gd_sleep_until_woken(int32 timeout_ms, uint32 wait_event)
{
    BackendWaitSlot *slot = gd_my_wait_slot();
    TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
    /* Only the flag says it happened: the latch may be set for another reason, or its wake-up consumed. */
    while (timeout_ms > 0 && !(slot != nullptr && pg_atomic_exchange_u32(&slot->woken, 0) == 1)) {
        (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms, wait_event);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        timeout_ms = static_cast<int32>(TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until));
    }
    CHECK_FOR_INTERRUPTS();
}

/* gd._await_sleep(milliseconds int): sleep until woken, the time passes, or a cancel. */
GD_SQL_FUNCTION(gd_await_sleep)
{
    static uint32 awaiting = 0;
    gd_sleep_until_woken(PG_GETARG_INT32(0), gd_wait_event(awaiting, "GenDurableAwait"));
    PG_RETURN_VOID();
}
