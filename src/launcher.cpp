/*
 * launcher.cpp — the one static background worker.  It turns the settings
 * gen_durable.database and gen_durable.queues into a plan (per database, a
 * reaper, a garbage collector and one executor per unit of queue
 * concurrency), starts the planned workers as
 * dynamic background workers, stops the ones no longer planned after a
 * reload, and restarts workers that died: at once when they had served,
 * backing off when one keeps dying soon after starting without.  A listed
 * database that does not exist (not yet, or no more) gets no workers: the
 * launcher says so once, and starts them when it appears (CREATE DATABASE
 * wakes it at commit; it also looks every few seconds).
 *
 * It starts only once recovery has finished, so a hot standby runs nothing
 * and the engine starts on promotion.  If the launcher itself dies, the
 * postmaster restarts it; the new launcher bumps the generation of every slot
 * and signals the old workers, which exit, and starts fresh ones.
 */
#include "gen_durable.hpp"
#include "guard.hpp"
#include "pg_compat.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "tcop/tcopprot.h"
#include "utils/snapmgr.h"
#include "utils/guc.h"
#include "utils/wait_event.h"
}

#include <algorithm>
#include <csignal>
#include <string>
#include <vector>

namespace {

struct PlannedWorker {
    WorkerKind kind;
    char database[NAMEDATALEN];
    char queue[NAMEDATALEN];
    int queue_index;
};

/* What the launcher knows of a slot it assigned (process-local). */
struct SlotControl {
    BackgroundWorkerHandle *handle;
    TimestampTz started_at;
    TimestampTz restart_at; /* 0: start as soon as possible */
    int quick_failures;
    bool stopping;
};

constexpr long MAX_RESTART_DELAY_MS = 60 * 1000;
constexpr long QUICK_FAILURE_MS = 10 * 1000;
constexpr long RETRY_REGISTER_MS = 10 * 1000;
constexpr long MISSING_DATABASE_POLL_MS = 5 * 1000;

/* Globals rather than locals, so no C++ destructor is skipped by a longjmp. */
std::vector<PlannedWorker> plan;
std::vector<bool> covered; /* per planned worker: has a slot (scratch of reconcile) */
SlotControl control[GD_MAX_WORKERS];
bool warned_no_bgworker_slots = false;
bool warned_plan_too_large = false;
/* The listed databases that did not exist when last looked at (reported once each). */
std::vector<std::string> missing_databases;
std::vector<std::string> missing_now;  /* scratch of find_missing_databases */
std::vector<bool> database_missing; /* per planned worker: its database is among them (scratch of reconcile) */

/*
 * The oid of the database of that name, InvalidOid if there is none — or if
 * another transaction holds it exclusively (DROP DATABASE does, from before
 * it ends the database's sessions until it commits: workers started then
 * would fail to connect).  pg_database is a shared catalog: read as the
 * autovacuum launcher does, by a heap scan, with no database selected.
 */
Oid database_to_serve(const char *name)
{
    Oid found = InvalidOid;
    StartTransactionCommand();
    (void) GetTransactionSnapshot();
    Relation databases = table_open(DatabaseRelationId, AccessShareLock);
    TableScanDesc scan = table_beginscan_catalog(databases, 0, nullptr);
    for (HeapTuple tuple; (tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr;) {
        auto *database = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
        if (strcmp(NameStr(database->datname), name) == 0) {
            found = database->oid;
            break;
        }
    }
    table_endscan(scan);
    table_close(databases, AccessShareLock);
    if (OidIsValid(found)) {
        LOCKTAG tag;
        SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, found, 0);
        if (LockAcquire(&tag, AccessShareLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
            found = InvalidOid;
        else
            LockRelease(&tag, AccessShareLock, false);
    }
    CommitTransactionCommand();
    return found;
}

/*
 * Look at each planned database: mark the planned workers of the ones that
 * do not exist, and say when one goes missing or appears.  True if any is
 * missing (the launcher looks again later).
 */
bool find_missing_databases()
{
    missing_now.clear();
    database_missing.assign(plan.size(), false);
    for (size_t p = 0; p < plan.size(); p++) {
        bool seen = false;
        for (size_t q = 0; q < p && !seen; q++)
            if (strcmp(plan[q].database, plan[p].database) == 0) {
                database_missing[p] = database_missing[q];
                seen = true;
            }
        if (seen)
            continue;
        database_missing[p] = !OidIsValid(database_to_serve(plan[p].database));
        if (database_missing[p])
            missing_now.emplace_back(plan[p].database);
    }
    for (const std::string &name : missing_now)
        if (std::find(missing_databases.begin(), missing_databases.end(), name) == missing_databases.end())
            ereport(LOG, (errmsg("gen_durable: database \"%s\" in gen_durable.database does not exist; its workers "
                                 "start when it is created",
                                 name.c_str())));
    for (const std::string &name : missing_databases)
        if (std::find(missing_now.begin(), missing_now.end(), name) == missing_now.end())
            ereport(LOG, (errmsg("gen_durable: database \"%s\" exists now; starting its workers", name.c_str())));
    missing_databases.swap(missing_now);
    return !missing_databases.empty();
}

void build_plan()
{
    char problem[256] = "";
    try {
        std::vector<PlannedWorker> next;
        std::vector<std::string> databases = gd::parse_database_list(gd_database_setting);
        std::vector<gd::QueueSetting> queues = gd::parse_queue_list(gd_queues_setting);
        for (const std::string &database : databases) {
            for (WorkerKind kind : {WorkerKind::reaper, WorkerKind::gc}) {
                PlannedWorker housekeeper{};
                housekeeper.kind = kind;
                strlcpy(housekeeper.database, database.c_str(), NAMEDATALEN);
                next.push_back(housekeeper);
            }
            for (const gd::QueueSetting &queue : gd::queues_of_database(queues, database, databases))
                for (int i = 0; i < queue.concurrency; i++) {
                    PlannedWorker worker{};
                    worker.kind = WorkerKind::executor;
                    strlcpy(worker.database, database.c_str(), NAMEDATALEN);
                    strlcpy(worker.queue, queue.name.c_str(), NAMEDATALEN);
                    worker.queue_index = i;
                    next.push_back(worker);
                }
        }
        plan.swap(next);
        return;
    } catch (const std::exception &e) {
        strlcpy(problem, e.what(), sizeof(problem));
    }
    ereport(WARNING, (errmsg("gen_durable: keeping the previous worker plan: %s", problem)));
}

bool slot_matches(const WorkerSlot &slot, const PlannedWorker &worker)
{
    return slot.kind == worker.kind && slot.queue_index == worker.queue_index &&
           strcmp(slot.database, worker.database) == 0 && strcmp(slot.queue, worker.queue) == 0;
}

const char *kind_name(WorkerKind kind)
{
    switch (kind) {
    case WorkerKind::executor: return "executor";
    case WorkerKind::reaper: return "reaper";
    case WorkerKind::gc: return "gc";
    case WorkerKind::free: break;
    }
    return "free";
}

void free_slot(int index)
{
    WorkerSlot &slot = gd_shared->workers[index];
    LWLockAcquire(gd_shared->lock, LW_EXCLUSIVE);
    slot.kind = WorkerKind::free;
    slot.generation++;
    LWLockRelease(gd_shared->lock);
    if (control[index].handle)
        pfree(control[index].handle);
    control[index] = SlotControl{};
}

/* Register the dynamic worker for an assigned slot; false if no bgworker slot was free. */
bool start_worker(int index)
{
    WorkerSlot &slot = gd_shared->workers[index];
    pg_atomic_write_u32(&slot.served, 0); /* before it can start and say otherwise */
    BackgroundWorker worker{};
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
    worker.bgw_restart_time = BGW_NEVER_RESTART;
    strlcpy(worker.bgw_library_name, "gen_durable", BGW_MAXLEN);
    strlcpy(worker.bgw_function_name, "gd_worker_main", BGW_MAXLEN);
    if (slot.kind == WorkerKind::executor)
        snprintf(worker.bgw_name, BGW_MAXLEN, "gen_durable executor %s[%d] %s", slot.queue, slot.queue_index,
                 slot.database);
    else
        snprintf(worker.bgw_name, BGW_MAXLEN, "gen_durable %s %s", kind_name(slot.kind), slot.database);
    snprintf(worker.bgw_type, BGW_MAXLEN, "gen_durable %s", kind_name(slot.kind));
    worker.bgw_main_arg = gd_worker_arg(index, slot.generation);
    worker.bgw_notify_pid = MyProcPid;

    BackgroundWorkerHandle *handle = nullptr;
    if (!RegisterDynamicBackgroundWorker(&worker, &handle)) {
        if (!warned_no_bgworker_slots)
            ereport(WARNING, (errmsg("gen_durable: could not start %s", worker.bgw_name),
                              errhint("Raise max_worker_processes: it must cover the launcher and, for every "
                                      "database in gen_durable.database, a reaper, a garbage collector and "
                                      "every executor in gen_durable.queues.")));
        warned_no_bgworker_slots = true;
        control[index].restart_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), RETRY_REGISTER_MS);
        return false;
    }
    control[index].handle = handle;
    control[index].started_at = GetCurrentTimestamp();
    control[index].restart_at = 0;
    return true;
}

int assign_slot(const PlannedWorker &worker)
{
    LWLockAcquire(gd_shared->lock, LW_EXCLUSIVE);
    int found = -1;
    for (int i = 0; i < GD_MAX_WORKERS && found < 0; i++) {
        WorkerSlot &slot = gd_shared->workers[i];
        if (slot.kind != WorkerKind::free)
            continue;
        slot.kind = worker.kind;
        slot.generation++;
        strlcpy(slot.database, worker.database, NAMEDATALEN);
        strlcpy(slot.queue, worker.queue, NAMEDATALEN);
        slot.queue_index = worker.queue_index;
        slot.database_oid = InvalidOid;
        found = i;
    }
    LWLockRelease(gd_shared->lock);
    return found;
}

/* A worker stopped: the reapers look for a step it left unfinished (crashed_steps.cpp). */
void tell_reapers_a_worker_died()
{
    pg_atomic_fetch_add_u32(&gd_shared->worker_deaths, 1);
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    for (WorkerSlot &slot : gd_shared->workers)
        if (slot.kind == WorkerKind::reaper && slot.proc != nullptr)
            gd_wake_process(&slot.woken, slot.proc);
    LWLockRelease(gd_shared->lock);
}

/*
 * A planned worker stopped: restart it, later if it keeps dying young
 * without having served (committed a round).  One that served was stopped
 * from outside (pg_terminate_backend, an administrator's kill): it starts
 * again at once, however often that happens, so work goes on; what backs off
 * is a worker that cannot get going.
 */
void schedule_restart(int index, TimestampTz now)
{
    tell_reapers_a_worker_died();
    SlotControl &c = control[index];
    bool served = pg_atomic_read_u32(&gd_shared->workers[index].served) != 0;
    bool died_young = !served && !TimestampDifferenceExceeds(c.started_at, now, QUICK_FAILURE_MS);
    c.quick_failures = died_young ? c.quick_failures + 1 : 0;
    long delay = 0;
    if (c.quick_failures > 0)
        delay = Min(MAX_RESTART_DELAY_MS, 1000L << Min(c.quick_failures - 1, 6));
    pfree(c.handle);
    c.handle = nullptr;
    c.restart_at = TimestampTzPlusMilliseconds(now, delay);
}

/* Bring the running workers in line with the plan; returns ms until the next timed action. */
long reconcile()
{
    TimestampTz now = GetCurrentTimestamp();
    long next_action_ms = find_missing_databases() ? MISSING_DATABASE_POLL_MS : -1;
    covered.assign(plan.size(), false);
    bool skip_backoff = pg_atomic_exchange_u32(&gd_shared->restart_now, 0) != 0;

    for (int i = 0; i < GD_MAX_WORKERS; i++) {
        WorkerSlot &slot = gd_shared->workers[i];
        if (slot.kind == WorkerKind::free)
            continue;
        SlotControl &c = control[i];
        int planned = -1;
        for (size_t p = 0; p < plan.size() && planned < 0; p++)
            if (!covered[p] && !database_missing[p] && slot_matches(slot, plan[p]))
                planned = static_cast<int>(p);

        pid_t pid = 0;
        bool stopped = c.handle == nullptr || GetBackgroundWorkerPid(c.handle, &pid) == BGWH_STOPPED;
        if (planned < 0) {
            if (stopped)
                free_slot(i);
            else if (!c.stopping) {
                TerminateBackgroundWorker(c.handle);
                c.stopping = true;
            }
            continue;
        }
        covered[planned] = true;
        if (stopped && c.handle != nullptr)
            schedule_restart(i, now);
        if (c.handle == nullptr) {
            if (skip_backoff)
                c.restart_at = 0;
            if (c.restart_at <= now)
                start_worker(i);
            if (c.handle == nullptr) {
                long wait = Max(1L, (long) ((c.restart_at - now) / 1000));
                next_action_ms = next_action_ms < 0 ? wait : Min(next_action_ms, wait);
            }
        }
    }

    for (size_t p = 0; p < plan.size(); p++) {
        if (covered[p] || database_missing[p])
            continue;
        int index = assign_slot(plan[p]);
        if (index < 0) {
            if (!warned_plan_too_large)
                ereport(WARNING, (errmsg("gen_durable: more than %d workers planned; %s[%d] in database \"%s\" is not started",
                                         GD_MAX_WORKERS, plan[p].queue, plan[p].queue_index, plan[p].database)));
            warned_plan_too_large = true;
            continue;
        }
        control[index] = SlotControl{};
        if (!start_worker(index))
            next_action_ms = next_action_ms < 0 ? RETRY_REGISTER_MS : Min(next_action_ms, RETRY_REGISTER_MS);
    }
    return next_action_ms;
}

/* A previous launcher's workers are not ours to track: retire them. */
void retire_previous_workers()
{
    LWLockAcquire(gd_shared->lock, LW_EXCLUSIVE);
    for (WorkerSlot &slot : gd_shared->workers) {
        if (slot.kind == WorkerKind::free)
            continue;
        if (slot.pid != 0)
            kill(slot.pid, SIGTERM);
        slot.kind = WorkerKind::free;
        slot.generation++;
    }
    LWLockRelease(gd_shared->lock);
}

void launcher_loop()
{
    retire_previous_workers();
    build_plan();
    for (;;) {
        long wait_ms = reconcile();
        int events = WL_LATCH_SET | WL_EXIT_ON_PM_DEATH | (wait_ms >= 0 ? WL_TIMEOUT : 0);
        static uint32 planning = 0;
        (void) WaitLatch(MyLatch, events, wait_ms, gd_wait_event(planning, "GenDurableLauncher"));
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
            warned_no_bgworker_slots = false;
            warned_plan_too_large = false;
            build_plan();
        }
    }
}

} // namespace

void gd_register_launcher()
{
    BackgroundWorker worker{};
    /* Connected (to no database) like core's logical replication launcher: the
     * procsignal SIGUSR1 handler then sets our latch on worker state changes. */
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
    worker.bgw_restart_time = 5;
    strlcpy(worker.bgw_library_name, "gen_durable", BGW_MAXLEN);
    strlcpy(worker.bgw_function_name, "gd_launcher_main", BGW_MAXLEN);
    strlcpy(worker.bgw_name, "gen_durable launcher", BGW_MAXLEN);
    strlcpy(worker.bgw_type, "gen_durable launcher", BGW_MAXLEN);
    RegisterBackgroundWorker(&worker);
}

GD_WORKER_ENTRY(gd_launcher_main)
{
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
    LWLockAcquire(gd_shared->lock, LW_EXCLUSIVE);
    gd_shared->launcher_pid = MyProcPid;
    gd_shared->launcher_proc = MyProc;
    LWLockRelease(gd_shared->lock);
    ereport(LOG, (errmsg("gen_durable: launcher started")));
    launcher_loop();
}
