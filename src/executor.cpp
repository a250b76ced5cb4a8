/*
 * executor.cpp — the executor background worker: one per unit of a queue's
 * concurrency, per served database.  Each round is one transaction: pick a
 * batch of runnable steps (locking them), run each in its own subtransaction,
 * commit, then wake the gd_await callers of what changed.  With nothing to do
 * it sleeps on its latch until woken by a commit that made work runnable,
 * until the next scheduled row comes due, or the poll interval passes.
 *
 * SIGTERM is the usual `die`: the round in hand rolls back (its rows stay
 * runnable, no attempt counted) and the worker exits.  An error outside a
 * step is logged, the round rolled back, and the worker goes on after a
 * pause.  A database without the extension is logged once and re-checked
 * every few seconds, or at once when CREATE EXTENSION commits.
 */
#include "executor.hpp"
#include "guard.hpp"

extern "C" {
#include "access/xact.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timeout.h"
#include "utils/wait_event.h"
}

namespace {

constexpr long ERROR_PAUSE_MS = 1000;
constexpr long MISSING_EXTENSION_RECHECK_MS = 10 * 1000;

/* Process-wide executor state: globals, so an ERROR's longjmp skips no destructor. */
WorkerSlot *my_slot = nullptr;
char my_queue[NAMEDATALEN];
char my_database[NAMEDATALEN];
MemoryContext round_context = nullptr;
bool extension_ready = false;
bool reported_missing_extension = false;

bool check_extension()
{
    if (get_extension_oid("gen_durable", true) != InvalidOid) {
        if (reported_missing_extension)
            ereport(my_slot->queue_index == 0 ? LOG : DEBUG1, (errmsg("gen_durable: extension found in database \"%s\"; executor for queue \"%s\" serving",
                                 my_database, my_queue)));
        reported_missing_extension = false;
        return true;
    }
    if (!reported_missing_extension)
        ereport(my_slot->queue_index == 0 ? LOG : DEBUG1,
                (errmsg("gen_durable: database \"%s\" has no gen_durable extension; executor for queue \"%s\" waits",
                        my_database, my_queue),
                 errhint("Run CREATE EXTENSION gen_durable in that database, or remove it from gen_durable.database.")));
    reported_missing_extension = true;
    return false;
}

/* One transaction's worth of work; returns how long to sleep before the next (0: don't). */
long run_round()
{
    MemoryContextReset(round_context);

    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    SPI_connect();
    PushActiveSnapshot(GetTransactionSnapshot());
    MemoryContextSwitchTo(round_context);

    long sleep_ms = 0;
    if (!extension_ready)
        extension_ready = check_extension();
    if (!extension_ready) {
        sleep_ms = MISSING_EXTENSION_RECHECK_MS;
    } else {
        pgstat_report_activity(STATE_RUNNING, "gen_durable: running steps");
        if (gd_execute_batch(my_queue, gd_batch_size, my_slot) == 0) {
            TimestampTz due = gd_next_due(my_queue);
            sleep_ms = gd_poll_interval_ms;
            if (due != 0) {
                long until_due = static_cast<long>((due - GetCurrentTimestamp()) / 1000) + 1;
                sleep_ms = Max(1L, Min(sleep_ms, until_due));
            }
        }
    }

    SPI_finish();
    PopActiveSnapshot();
    CommitTransactionCommand();
    gd_worker_set_activity(my_slot, 0);
    pgstat_report_activity(STATE_IDLE, nullptr);
    return sleep_ms;
}

/* Log the error, roll the round back and carry on, as core's background processes do. */
void recover_from_error()
{
    error_context_stack = nullptr;
    HOLD_INTERRUPTS();
    disable_all_timeouts(false);
    EmitErrorReport();
    AbortCurrentTransaction();
    MemoryContextSwitchTo(TopMemoryContext);
    FlushErrorState();
    RESUME_INTERRUPTS();
    extension_ready = false;
    gd_worker_set_activity(my_slot, 0);
    pgstat_report_activity(STATE_IDLE, nullptr);
}

void sleep_on_latch(long timeout_ms)
{
    my_slot->idle = true;
    (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms, PG_WAIT_EXTENSION);
    my_slot->idle = false;
}

[[noreturn]] void executor_loop()
{
    for (;;) {
        ResetLatch(MyLatch); /* before looking for work: a wake-up from now on is not lost */
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
        volatile long sleep_ms = 0;
        PG_TRY();
        {
            sleep_ms = run_round();
        }
        PG_CATCH();
        {
            recover_from_error();
            sleep_ms = ERROR_PAUSE_MS;
        }
        PG_END_TRY();
        if (sleep_ms > 0)
            sleep_on_latch(sleep_ms);
    }
}

} // namespace

void gd_executor_main(Datum arg)
{
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();

    my_slot = gd_worker_slot_for(arg, my_database);
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    strlcpy(my_queue, my_slot->queue, sizeof(my_queue));
    LWLockRelease(gd_shared->lock);

    BackgroundWorkerInitializeConnection(my_database, nullptr, 0);
    gd_worker_attach(my_slot);
    pgstat_report_appname(psprintf("gen_durable executor %s", my_queue));
    round_context = AllocSetContextCreate(TopMemoryContext, "gen_durable round", ALLOCSET_DEFAULT_SIZES);
    ereport(LOG, (errmsg("gen_durable: executor %d for queue \"%s\" in database \"%s\" started", my_slot->queue_index,
                         my_queue, my_database)));
    executor_loop();
}
