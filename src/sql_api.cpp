/*
 * sql_api.cpp — SQL-callable internals that read the engine's settings and
 * shared memory: the configured queue names, whether the engine is loaded,
 * the gd.workers view, and gd._execute and gd_drain's rounds, which run steps
 * in the calling session exactly as an executor would (for tests and manual
 * stepping).
 */
#include "executor.hpp"
#include "guard.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

#include <csignal>

namespace {

const char *kind_label(WorkerKind kind)
{
    switch (kind) {
    case WorkerKind::executor: return "executor";
    case WorkerKind::reaper: return "reaper";
    case WorkerKind::gc: return "gc";
    case WorkerKind::free: break;
    }
    return nullptr;
}

/* One gd.workers row, copied out under the lock. */
struct WorkerRow {
    pid_t pid;
    const char *kind;
    char database[NAMEDATALEN];
    char queue[NAMEDATALEN];
    int64 instance_id;
    TimestampTz since;
};

/* Run up to `limit` steps of the queue here, the drain's only when given.  Not
 * from a handler (the runner is not reentrant), nor in a session with
 * temporary objects, which the handlers' names would find. */
int run_here(const char *what, text *queue_name, int32 limit, const DrainScope *drain)
{
    static bool running = false;
    char queue[NAMEDATALEN];
    text_to_cstring_buffer(queue_name, queue, sizeof(queue));
    if (limit < 1 || limit > GD_MAX_BATCH)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: max must be between 1 and %d, got %d", GD_MAX_BATCH, limit)));
    if (running)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("gen_durable: %s cannot run inside a step", what)));
    if (!gd_session_may_run_handlers())
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("gen_durable: %s cannot run handlers in a session with temporary objects", what),
                        errhint("Call it from a new session.")));
    int ran = 0;
    running = true;
    PG_TRY();
    {
        SPI_connect();
        ran = gd_execute_batch(queue, limit, nullptr, drain);
        SPI_finish();
    }
    PG_FINALLY();
    {
        running = false;
    }
    PG_END_TRY();
    return ran;
}

} // namespace

/* gd._execute(queue text, max int): run up to max runnable steps of the queue here. */
GD_SQL_FUNCTION(gd_execute)
{
    PG_RETURN_INT32(run_here("gd._execute", PG_GETARG_TEXT_PP(0), PG_GETARG_INT32(1), nullptr));
}

/* gd._drain_round(queue text, max int, member oid, with_scheduled boolean): one round of gd_drain. */
GD_SQL_FUNCTION(gd_drain_round)
{
    DrainScope scope{PG_GETARG_OID(2), PG_GETARG_BOOL(3)};
    PG_RETURN_INT32(run_here("gd_drain", PG_GETARG_TEXT_PP(0), PG_GETARG_INT32(1), &scope));
}

/*
 * gd._interrupt_step(instance bigint, terminate boolean) → boolean: stop the
 * step of the instance an executor of this database is running now — cancel
 * it (the executor records no attempt: gd_cancel ends the instance when the
 * round lets go of its row), or, for a step that ignored the cancel, end the
 * executor.  False when no executor runs a step of it.
 */
GD_SQL_FUNCTION(gd_interrupt_step)
{
    uint64 instance = static_cast<uint64>(PG_GETARG_INT64(0));
    bool terminate = PG_GETARG_BOOL(1);
    if (gd_shared == nullptr)
        PG_RETURN_BOOL(false);
    pid_t pid = 0;
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    for (WorkerSlot &slot : gd_shared->workers)
        if (slot.kind == WorkerKind::executor && slot.database_oid == MyDatabaseId && slot.pid != 0 &&
            pg_atomic_read_u64(&slot.current_instance) == instance) {
            pg_atomic_write_u64(&slot.cancel_step, instance);
            pid = slot.pid;
        }
    LWLockRelease(gd_shared->lock);
    if (pid != 0)
        (void) kill(pid, terminate ? SIGTERM : SIGINT);
    PG_RETURN_BOOL(pid != 0);
}

/* gd._configured_queues(): the queue names in gen_durable.queues. */
GD_SQL_FUNCTION(gd_configured_queues)
{
    std::vector<gd::QueueSetting> queues = gd::parse_queue_list(gd_queues_setting);
    /* PostgreSQL calls with the vector alive: an ERROR must unwind it, not jump over it. */
    Datum names = gd::pg_call([&] {
        ArrayBuildState *built = initArrayResult(TEXTOID, CurrentMemoryContext, false);
        for (const gd::QueueSetting &queue : queues)
            accumArrayResult(built, CStringGetTextDatum(queue.name.c_str()), false, TEXTOID, CurrentMemoryContext);
        return makeArrayResult(built, CurrentMemoryContext);
    });
    PG_RETURN_DATUM(names);
}

/* gd._engine_loaded(): was the library loaded by shared_preload_libraries. */
GD_SQL_FUNCTION(gd_engine_loaded)
{
    PG_RETURN_BOOL(gd_shared != nullptr);
}

/* gd._workers(): the launcher and every running engine worker. */
GD_SQL_FUNCTION(gd_workers)
{
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    if (gd_shared == nullptr)
        PG_RETURN_VOID();

    WorkerRow rows[GD_MAX_WORKERS + 1];
    int count = 0;
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    if (gd_shared->launcher_pid != 0) {
        rows[count] = WorkerRow{gd_shared->launcher_pid, "launcher", "", "", 0, 0};
        count++;
    }
    for (WorkerSlot &slot : gd_shared->workers) {
        if (slot.kind == WorkerKind::free || slot.pid == 0)
            continue;
        WorkerRow &row = rows[count++];
        row.pid = slot.pid;
        row.kind = kind_label(slot.kind);
        strlcpy(row.database, slot.database, NAMEDATALEN);
        strlcpy(row.queue, slot.queue, NAMEDATALEN);
        row.instance_id = static_cast<int64>(pg_atomic_read_u64(&slot.current_instance));
        row.since = static_cast<TimestampTz>(pg_atomic_read_u64(&slot.since));
    }
    LWLockRelease(gd_shared->lock);

    for (int i = 0; i < count; i++) {
        const WorkerRow &row = rows[i];
        Datum values[6] = {Int32GetDatum(row.pid), CStringGetTextDatum(row.kind), 0, 0, Int64GetDatum(row.instance_id),
                           TimestampTzGetDatum(row.since)};
        bool nulls[6] = {false, false, row.database[0] == '\0', row.queue[0] == '\0', row.instance_id == 0,
                         row.since == 0};
        if (!nulls[2])
            values[2] = CStringGetTextDatum(row.database);
        if (!nulls[3])
            values[3] = CStringGetTextDatum(row.queue);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    PG_RETURN_VOID();
}
