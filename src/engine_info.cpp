/*
 * engine_info.cpp — what SQL reads of the engine itself: the queue names
 * configured in gen_durable.queues, whether the library was preloaded, and
 * the launcher and workers running now (the gd.workers view), from the
 * settings and shared memory.
 */
#include "gen_durable.hpp"
#include "guard.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

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

} // namespace

/* gd.configured_queues(): the queues gen_durable.queues gives this database. */
GD_SQL_FUNCTION(gd_configured_queues)
{
    const char *database = get_database_name(MyDatabaseId);
    std::vector<gd::QueueSetting> queues = gd::queues_of_database(
        gd::parse_queue_list(gd_queues_setting), database ? database : "", gd::parse_database_list(gd_database_setting));
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
