/*
 * gen_durable.hpp — declarations shared by the extension's source files:
 * settings, the shared-memory layout and the entry points of each part.
 */
#pragma once

extern "C" {
#include "postgres.h"
#include "port/atomics.h"
#include "portability/instr_time.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/timestamp.h"
}

#include <string>
#include <vector>

/* ---- settings (settings.cpp) ------------------------------------------ */

extern char *gd_database_setting;  /* gen_durable.database */
extern char *gd_queues_setting;    /* gen_durable.queues */
extern int gd_lease_ms;            /* gen_durable.lease */
extern int gd_retention_s;         /* gen_durable.retention, seconds */
extern int gd_poll_interval_ms;    /* gen_durable.poll_interval */
extern int gd_batch_size;          /* gen_durable.batch_size */
extern int gd_batch_time_ms;       /* gen_durable.batch_time */
extern int gd_chain_limit;         /* gen_durable.chain_limit */
extern int gd_reaper_interval_ms;  /* gen_durable.reaper_interval */
extern int gd_gc_interval_ms;      /* gen_durable.gc_interval */
enum GdEvents { GD_EVENTS_OFF, GD_EVENTS_TRANSITIONS };
extern int gd_events;              /* gen_durable.events */
extern char *gd_now_setting;       /* gen_durable.now: a session's test clock ("": the real one) */

void gd_define_settings();
/* Now, for what becomes due (steps, waits' deadlines, ticks) in this session's claims and drains:
 * gen_durable.now when a test set it, else the clock. */
TimestampTz gd_session_now();

/* Whether `interval_us` has passed between `since` and `now` on the wall clock.  A clock set back since counts
 * as passed: a periodic look must not wait out the step. */
inline bool gd_interval_passed(TimestampTz since, TimestampTz now, int64 interval_us)
{
    return now < since || now - since >= interval_us;
}

/* Microseconds on a clock that is never set (how long something took, whatever the wall clock did meanwhile). */
inline int64 gd_monotonic_us()
{
    instr_time now;
    INSTR_TIME_SET_CURRENT(now);
    return static_cast<int64>(INSTR_TIME_GET_MICROSEC(now));
}

namespace gd {

struct QueueSetting {
    std::string name;
    int concurrency;
};

/* Parse "default:4, mail:2, app.billing:1"; throws std::invalid_argument naming the bad entry. */
std::vector<QueueSetting> parse_queue_list(const char *text);
/*
 * The queues `database` serves, of a parsed list: an entry "db.queue" whose
 * db is one of the served `databases` is that database's alone (and wins
 * there over an unqualified entry of the same queue); any other entry is
 * every served database's.
 */
std::vector<QueueSetting> queues_of_database(const std::vector<QueueSetting> &queues, const std::string &database,
                                             const std::vector<std::string> &databases);
/* Parse "app, other"; throws std::invalid_argument naming the bad entry. */
std::vector<std::string> parse_database_list(const char *text);

} // namespace gd

/* ---- shared memory (shmem.cpp) ------------------------------------------ */

#include "frontier.hpp" /* QueueFrontier lives in GdShared */
#include "stats.hpp"    /* GdStats too */

constexpr int GD_MAX_WORKERS = 128;

enum class WorkerKind : int32 { free = 0, executor, reaper, gc };

/*
 * One engine worker, as the launcher planned it.  The launcher owns
 * allocation (in_use, kind, names); the worker fills in what it learns after
 * starting (pid, proc, database_oid) and its activity.  All fields but the
 * atomics are protected by GdShared::lock.
 */
struct WorkerSlot {
    WorkerKind kind;
    uint32 generation;              /* bumped at each assignment; stale workers exit */
    char database[NAMEDATALEN];
    char queue[NAMEDATALEN];
    int queue_index;                /* executor number within its queue */
    Oid database_oid;               /* InvalidOid until the worker connected */
    pid_t pid;
    PGPROC *proc;                   /* for SetLatch; NULL when not running */
    bool idle;                      /* sleeping, waiting for work */
    pg_atomic_uint64 current_instance; /* 0 when none */
    pg_atomic_uint64 since;         /* TimestampTz of the current activity */
    pg_atomic_uint64 cancel_step;   /* gd_cancel of the instance whose step this executor runs: stop it */
    pg_atomic_uint64 cancel_requested_at; /* TimestampTz of that gd_cancel */
    pg_atomic_uint32 served;        /* the worker committed a round since the launcher started it */
    pg_atomic_uint32 woken;         /* set with the latch by gd_wake_process: work may wait */
    /* An executor's figures for gd.queue_stats (labelled_stats.cpp). */
    pg_atomic_uint64 busy_share;    /* a double: share of recent time spent in rounds, as last noted */
    pg_atomic_uint64 busy_noted_at; /* TimestampTz of that note; 0: none yet */
    pg_atomic_uint32 pick_limit;    /* steps the executor's next pick asks for */
    pg_atomic_uint32 in_flight;     /* steps of the round it runs now */
};

/* A backend blocked in gd_await or in gd_claim's wait, indexed by gd_my_backend_index(). */
struct BackendWaitSlot {
    pg_atomic_uint64 instance_id;   /* gd_await: the instance awaited; 0 when not waiting */
    pg_atomic_uint32 claim_waiting; /* gd_claim: 1 while it waits for work of claim_queue */
    pg_atomic_uint32 woken;         /* set with the latch by gd_wake_process: what it waits for happened */
    pg_atomic_uint64 cancelling;    /* gd_cancel: the instance whose running step it stops, until its transaction ends */
    char claim_queue[NAMEDATALEN];
    Oid database_oid;
    PGPROC *proc;
};

struct GdShared {
    LWLock *lock;
    pid_t launcher_pid;
    PGPROC *launcher_proc;
    pg_atomic_uint32 restart_now;   /* set by CREATE EXTENSION: skip restart back-offs */
    WorkerSlot workers[GD_MAX_WORKERS];
    pg_atomic_uint32 awaiting_backends;
    pg_atomic_uint32 claiming_backends; /* waiting in gd_claim */
    pg_atomic_uint32 cancelling_backends; /* in a gd_cancel that stopped a running step */
    pg_atomic_uint32 work_listeners;    /* sessions that ran LISTEN gd_work (and not UNLISTEN) */
    pg_atomic_uint32 worker_deaths; /* bumped by the launcher when a worker it planned stopped */
    GdStats stats;
    QueueFrontier frontiers[GD_MAX_FRONTIERS]; /* entries claimed under lock, each guarded by its own mutex */
    BackendWaitSlot wait_slots[FLEXIBLE_ARRAY_MEMBER]; /* MaxBackends entries */
};

extern GdShared *gd_shared;

void gd_install_shmem_hooks();

/*
 * Wake a process sleeping for something: set its flag, then its latch.  A
 * latch alone can be lost: any wait inside a statement (a lock, a buffer
 * being read, a handler's pg_sleep) resets the process's latch, so a wake-up
 * that lands while it looks for work would be consumed before it sleeps.
 * The sleeper clears the flag before it looks and sleeps only while it is
 * clear.
 */
void gd_wake_process(pg_atomic_uint32 *woken, PGPROC *proc);
/* This backend's wait slot; nullptr without the engine. */
BackendWaitSlot *gd_my_wait_slot();

/*
 * Raise 55000 naming shared_preload_libraries when the library was not
 * preloaded (no engine, no shared memory): for what only the engine can
 * keep its promises for (a claim's lease, gd_await's wake-up).
 */
void gd_require_engine(const char *what);

/* bgw_main_arg of an engine worker: its slot and the slot's generation. */
Datum gd_worker_arg(int slot_index, uint32 generation);
/*
 * Called first thing by an engine worker: finds its slot, exits quietly if the
 * launcher has reassigned it, and copies the database name out.  After
 * connecting, gd_worker_attach() publishes pid and latch; they are cleared at
 * exit.
 */
WorkerSlot *gd_worker_slot_for(Datum arg, char *database_out);
void gd_worker_attach(WorkerSlot *slot);
void gd_worker_set_activity(WorkerSlot *slot, int64 instance_id);

/* ---- wake-ups (wakeup.cpp) ---------------------------------------------- */

/* At commit of the current transaction, wake executors of this queue: a row
 * at `key` (nullptr: somewhere) became runnable. */
void gd_wake_queue_at_commit(const char *queue, const PickKey *key = nullptr);
/* What a statement that made rows runnable returns (RETURNING), for gd_wake_queue_of_returned. */
#define GD_WOKEN_COLUMNS "i.queue, i.priority, i.owner, i.fairness_lane, i.eligible_at, i.id"
constexpr int GD_WOKEN_COLUMN_COUNT = 6; /* the id last */
/* At commit, wake the queue of the r-th row SPI returned (GD_WOKEN_COLUMNS, from `first_column` on), at that
 * row's key. */
void gd_wake_queue_of_returned(uint64 r, int first_column = 1);
/* At commit, NOTIFY gd_work, '<queue>' for external workers: once per transaction and queue (notify.cpp). */
void gd_notify_external_at_commit(const char *queue);
/* At commit, wake every executor of this database (e.g. CREATE EXTENSION). */
void gd_wake_database_at_commit();
/* At commit, wake backends blocked in gd_await on this instance. */
void gd_wake_awaiters_at_commit(int64 instance_id);
/* At commit, wake this database's reaper (a child finished: its parent may resume). */
void gd_wake_reaper_at_commit();
/* At commit, wake the launcher: a database was created, perhaps one it waits for. */
void gd_wake_launcher_at_commit();
void gd_register_xact_callback();
void gd_register_await_cleanup(); /* await.cpp */
/* Sleep until this backend's wait slot is woken, `timeout_ms` pass, or a cancel (await.cpp). */
void gd_sleep_until_woken(int32 timeout_ms, uint32 wait_event);
/* Wake the backends waiting in gd_claim for work of this queue (claim_wait.cpp; at commit, from notify.cpp). */
void gd_wake_claimers(const char *queue);
/* At commit, after the frontiers: wake the claims waiting for the queues this transaction gave work (notify.cpp). */
void gd_wake_claimers_at_commit();
/* The session ran LISTEN, UNLISTEN or DISCARD (notify.cpp: NOTIFY gd_work only while someone listens). */
void gd_note_listening(const Node *statement);

/* ---- the API's door (door.cpp) ------------------------------------------ */

/* The role that called the API door being run (raises outside any door). */
Oid gd_api_caller();
/*
 * A new GUC nest level with search_path pinned to pg_catalog, pg_temp, for
 * code running with the engine's rights; the caller ends it with
 * AtEOXact_GUC(true, level).
 */
int gd_pin_search_path();

/* ---- the engine's locks (engine_locks.cpp) ------------------------------ */

/*
 * A new GUC nest level whose lock waits give up (55P03) after timeout_ms:
 * for the engine's statements that a tenant's open transaction could hold
 * back.  The caller ends it with AtEOXact_GUC(true, level) (an error's
 * (sub)transaction abort ends it too).
 */
int gd_bound_lock_waits(int timeout_ms);
/*
 * Lock the concurrency key in key_owner's key space (every owner's, for a
 * shared limit) until the transaction ends.  A session waits for it; an
 * engine worker does not, and gets false when another transaction holds it
 * (the reaper's repair makes the room later).
 */
bool gd_lock_concurrency_key(Oid key_owner, const text *key, bool shared);
/* How long an engine worker waits for a lock a tenant's transaction holds, where it must wait at all. */
constexpr int GD_TENANT_LOCK_WAIT_MS = 1000;

/* ---- utility statements (utility_hook.cpp) ------------------------------- */

void gd_install_utility_hook();

/* ---- background workers ------------------------------------------------- */

void gd_register_launcher();   /* launcher.cpp */

/* The kind of engine worker this process is (worker.cpp); WorkerKind::free in any other process. */
WorkerKind gd_my_worker_kind();

/* Exit at once if the postmaster died (worker.cpp): called between rounds and between steps. */
void gd_exit_if_postmaster_died();

extern "C" {
PGDLLEXPORT void gd_launcher_main(Datum arg);
PGDLLEXPORT void gd_worker_main(Datum arg);  /* worker.cpp: executors and reapers */
}
