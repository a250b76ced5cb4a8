/*
 * worker.cpp — the life of an engine background worker (executor, reaper
 * or garbage collector), as the launcher planned it in a shared-memory slot.  Each round is
 * one transaction in which the worker's kind does its work (executor.cpp,
 * reaper.cpp) and says how long to sleep before the next round; between
 * rounds the worker sleeps on its latch, so a commit that makes work due wakes
 * it at once.
 *
 * SIGTERM is the usual `die`: the round in hand rolls back (an executor's rows
 * stay runnable, no attempt counted) and the worker exits; so does the
 * postmaster's death, seen between rounds and between steps.  Each round holds
 * the extension's lock, so DROP EXTENSION waits for the round in hand; in a
 * deadlock with a user's statement the worker's round is the victim.  SIGHUP reloads the
 * settings.  An error outside a step is logged, the round rolled back, and the
 * worker goes on after a pause.  A database without the extension, or with
 * the SQL of another version than this library's (installed, not yet
 * updated), is logged once and re-checked every few seconds, or at once when
 * CREATE or ALTER EXTENSION commits.
 */
#include "crashed_steps.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
#include "labelled_stats.hpp"
#include "pg_compat.hpp"
#include "rounds.hpp"

extern "C" {
#include "executor/spi.h"
#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/pmsignal.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/wait_event.h"
}

namespace {

constexpr long ERROR_PAUSE_MS = 1000;
constexpr long MISSING_EXTENSION_RECHECK_MS = 10 * 1000;

/* Process-wide worker state: globals, so an ERROR's longjmp skips no destructor. */
WorkerSlot *my_slot = nullptr;
WorkerKind my_kind = WorkerKind::free;
char my_queue[NAMEDATALEN];
char my_database[NAMEDATALEN];
char my_description[2 * NAMEDATALEN + 32];
MemoryContext round_context = nullptr;
Oid served_extension = InvalidOid; /* the extension whose rounds this worker runs; InvalidOid: none */
bool reported_missing_extension = false;
char reported_version[NAMEDATALEN]; /* the other version last reported, "" when none */

/* One worker per database (its reaper) reports at LOG; the others would repeat it. */
int report_level()
{
    return my_kind == WorkerKind::reaper ? LOG : DEBUG1;
}

/* Set by a change to any schema: DROP EXTENSION drops schema gd with it. */
bool schemas_changed = true;

void note_schema_change(Datum, int, uint32)
{
    schemas_changed = true;
}

/*
 * Take the extension's lock for the round; returns its oid, InvalidOid when
 * the database has none.  DROP EXTENSION locks the extension before any of
 * its tables, so a round that holds it first finishes before the DROP touches
 * them, and a round that waits for it finds the extension gone: the two never
 * deadlock.  The extension served so far is looked up again only when a
 * schema changed: a DROP tells the caches so before it lets go of the lock.
 * An extension this worker does not serve yet (created, or dropped and
 * created again) may be visible before the statement that made it has told
 * the caches about its schema: the round first waits for the statements
 * writing pg_extension to finish.
 */
Oid lock_extension()
{
    if (served_extension != InvalidOid) {
        LockDatabaseObject(ExtensionRelationId, served_extension, 0, AccessShareLock);
        if (!schemas_changed)
            return served_extension;
    }
    schemas_changed = false;
    Oid extension = get_extension_oid("gen_durable", true);
    if (extension != served_extension) {
        LockRelationOid(ExtensionRelationId, ShareLock);
        UnlockRelationOid(ExtensionRelationId, ShareLock);
        extension = get_extension_oid("gen_durable", true);
    }
    if (extension == InvalidOid)
        return InvalidOid;
    LockDatabaseObject(ExtensionRelationId, extension, 0, AccessShareLock);
    /* Dropped while the round waited? */
    return get_extension_oid("gen_durable", true) == extension ? extension : InvalidOid;
}

/* The version of the extension's SQL in this database (in the round's memory), or nullptr without it. */
const char *installed_version()
{
    if (SPI_execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'gen_durable'", true, 1) !=
            SPI_OK_SELECT ||
        SPI_processed != 1)
        return nullptr;
    return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
}

/* The SQL of another version than the library's: its functions are not this library's to run. */
bool version_mismatch(const char *version)
{
    if (strcmp(version, GD_EXTENSION_VERSION) == 0) {
        reported_version[0] = '\0';
        return false;
    }
    if (strcmp(reported_version, version) != 0)
        ereport(report_level(),
                (errmsg("gen_durable: database \"%s\" has gen_durable %s, the loaded library is %s; %s waits",
                        my_database, version, GD_EXTENSION_VERSION, my_description),
                 errhint("After installing a new version, restart the server (to load its library), then run ALTER "
                         "EXTENSION gen_durable UPDATE in each database.")));
    strlcpy(reported_version, version, sizeof(reported_version));
    return true;
}

/* Whether this library serves the extension (InvalidOid: none); reports what changed. */
bool check_extension(Oid extension)
{
    const char *version = extension != InvalidOid ? installed_version() : nullptr;
    if (version != nullptr) {
        if (version_mismatch(version))
            return false;
        if (reported_missing_extension)
            ereport(report_level(), (errmsg("gen_durable: extension found in database \"%s\"; %s serving", my_database,
                                            my_description)));
        reported_missing_extension = false;
        return true;
    }
    if (!reported_missing_extension)
        ereport(report_level(),
                (errmsg("gen_durable: database \"%s\" has no gen_durable extension; %s waits", my_database,
                        my_description),
                 errhint("Run CREATE EXTENSION gen_durable in that database, or remove it from gen_durable.database.")));
    reported_missing_extension = true;
    return false;
}

/* Worker deaths the launcher had told of when this worker last counted crashed steps; -1: never. */
int64 deaths_counted = -1;
/* The reaper's last count left a note for later. */
bool notes_left = false;

/*
 * Count the steps dead executors left unfinished: every worker once when its
 * database is first served (a crash-restart, or a worker taking a dead one's
 * place), the reaper again whenever the launcher saw a worker die, and while
 * a note is left.  Then an executor takes up its own note.
 */
void count_crashed_steps_if_due()
{
    uint32 deaths = pg_atomic_read_u32(&gd_shared->worker_deaths);
    bool due = deaths_counted < 0 || (my_kind == WorkerKind::reaper && (deaths != deaths_counted || notes_left));
    if (!due)
        return;
    notes_left = gd_count_crashed_steps();
    deaths_counted = deaths;
    if (my_kind == WorkerKind::executor)
        gd_open_step_note(static_cast<int>(my_slot - gd_shared->workers));
}

/* Whatever the round logs (a lock wait it could not avoid, say) names the worker. */
void round_error_context(void *)
{
    errcontext("gen_durable %s in database \"%s\"", my_description, my_database);
}

/* One transaction's worth of work; returns how long to sleep before the next (0: don't). */
long run_round()
{
    ErrorContextCallback round_context_callback{error_context_stack, round_error_context, nullptr};
    error_context_stack = &round_context_callback;
    MemoryContextReset(round_context);
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    SPI_connect();
    MemoryContextSwitchTo(round_context);

    long sleep_ms = MISSING_EXTENSION_RECHECK_MS;
    Oid extension = lock_extension();
    /* Taken after the lock: the round sees the extension its statement just committed (installed_version). */
    PushActiveSnapshot(GetTransactionSnapshot());
    if (extension == InvalidOid || extension != served_extension)
        served_extension = check_extension(extension) ? extension : InvalidOid;
    bool extension_ready = served_extension != InvalidOid;
    if (extension_ready)
        count_crashed_steps_if_due();
    if (extension_ready) {
        pgstat_report_activity(STATE_RUNNING, my_description);
        switch (my_kind) {
        case WorkerKind::executor: sleep_ms = gd_executor_round(my_slot, my_queue); break;
        case WorkerKind::reaper: sleep_ms = gd_reaper_round(); break;
        case WorkerKind::gc: sleep_ms = gd_gc_round(my_database); break;
        case WorkerKind::free: break;
        }
    }

    SPI_finish();
    PopActiveSnapshot();
    CommitTransactionCommand();
    pgstat_report_stat(false); /* table statistics: autovacuum sees the rows this round updated */
    if (extension_ready)
        pg_atomic_write_u32(&my_slot->served, 1); /* it works: if it is stopped now, start it again at once */
    gd_worker_set_activity(my_slot, 0);
    pgstat_report_activity(STATE_IDLE, nullptr);
    error_context_stack = round_context_callback.previous;
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
    served_extension = InvalidOid; /* checked again next round */
    gd_worker_set_activity(my_slot, 0);
    pgstat_report_activity(STATE_IDLE, nullptr);
}

void sleep_on_latch(long timeout_ms)
{
    my_slot->idle = true;
    gd_note_executor_busy(my_slot, false);
    static uint32 idle = 0;
    const char *name = my_kind == WorkerKind::executor ? "GenDurableExecutorIdle"
                       : my_kind == WorkerKind::reaper ? "GenDurableReaperIdle"
                                                       : "GenDurableCollectorIdle";
    (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms, gd_wait_event(idle, name));
    my_slot->idle = false;
    gd_note_executor_busy(my_slot, true);
}

void log_stop(int, Datum)
{
    ereport(LOG, (errmsg("gen_durable: %s in database \"%s\" stopped", my_description, my_database)));
}

[[noreturn]] void worker_loop()
{
    for (;;) {
        ResetLatch(MyLatch); /* before looking for work: a wake-up from now on is not lost */
        pg_atomic_write_u32(&my_slot->woken, 0); /* nor one whose latch a wait in the round consumes */
        CHECK_FOR_INTERRUPTS();
        gd_exit_if_postmaster_died(); /* a busy worker never sleeps on its latch, which would tell it */
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
        volatile long sleep_ms = 0;
        PG_TRY();
        {
            sleep_ms = gd::cpp_entry(run_round); /* nothing thrown may cross this PG_TRY */
        }
        PG_CATCH();
        {
            recover_from_error();
            sleep_ms = ERROR_PAUSE_MS;
        }
        PG_END_TRY();
        if (sleep_ms > 0 && pg_atomic_read_u32(&my_slot->woken) == 0)
            sleep_on_latch(sleep_ms);
    }
}

} // namespace

WorkerKind gd_my_worker_kind()
{
    return my_kind;
}

void gd_exit_if_postmaster_died()
{
    if (!PostmasterIsAlive())
        proc_exit(1); /* as WL_EXIT_ON_PM_DEATH does: the round in hand is lost, its rows stay runnable */
}

GD_WORKER_ENTRY(gd_worker_main)
{
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, die);
    my_slot = gd_worker_slot_for(arg, my_database);
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    strlcpy(my_queue, my_slot->queue, sizeof(my_queue));
    my_kind = my_slot->kind;
    LWLockRelease(gd_shared->lock);
    if (my_kind == WorkerKind::executor)
        gd_install_step_note_handlers(); /* SIGTERM and SIGQUIT: was the step to blame? */
    BackgroundWorkerUnblockSignals();
    if (my_kind == WorkerKind::executor)
        snprintf(my_description, sizeof(my_description), "executor %d for queue \"%s\"", my_slot->queue_index,
                 my_queue);
    else
        snprintf(my_description, sizeof(my_description), "%s",
                 my_kind == WorkerKind::reaper ? "reaper" : "garbage collector");

    BackgroundWorkerInitializeConnection(my_database, nullptr, 0);
    /* In a deadlock with a user's statement the engine gives way: it looks
     * for the deadlock first, and its round is rolled back and retried instead
     * of the user's statement. */
    SetConfigOption("deadlock_timeout", "100ms", PGC_SUSET, PGC_S_OVERRIDE);
    /* No wait of the engine's is silent: one that outlasts deadlock_timeout is
     * logged with what it waits for and which processes hold it. */
    SetConfigOption("log_lock_waits", "on", PGC_SUSET, PGC_S_OVERRIDE);
    CacheRegisterSyscacheCallback(NAMESPACEOID, note_schema_change, 0);
    gd_worker_attach(my_slot);
    pgstat_report_appname(psprintf("gen_durable %s", my_description));
    round_context = AllocSetContextCreate(TopMemoryContext, "gen_durable round", ALLOCSET_DEFAULT_SIZES);
    ereport(LOG, (errmsg("gen_durable: %s in database \"%s\" started", my_description, my_database)));
    before_shmem_exit(log_stop, 0);
    worker_loop();
}
