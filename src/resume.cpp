/*
 * resume.cpp — parked instances going on: a wait ended by a signal or its
 * timeout (gd_resume_parked, for the reaper and gd._resume_parked), a parent
 * whose children have all ended (gd_resume_parents), resumed at their
 * then_step with what the step sees in ctx.
 */
#include "resume.hpp"
#include "events.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
#include "kept_plans.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/builtins.h"
}

void gd_resume_parked(int64 id, Datum resume)
{
    static SPIPlanPtr resume_plan = nullptr;
    InstanceEvent event = gd_event_before(id, "resumed");
    Datum args[2] = {Int64GetDatum(id), resume};
    int result = gd_run_kept(
        resume_plan,
        "WITH next AS (SELECT n.queue, n.handler IS NULL AS external FROM gd._instances p"
            "                JOIN gd._steps n ON n.fsm = p.fsm AND n.version = p.version AND n.step = p.wait_then_step"
            "               WHERE p.id = $1)"
            "UPDATE gd._instances i"
            "   SET status = gd._status_after('resume', 'runnable'), step = i.wait_then_step, attempt = 1, resume = $2,"
            "       gated = gd._must_gate(i.owner, i.concurrency_key, true),"
            "       external = coalesce((SELECT external FROM next), false),"
            "       queue = (gd._route((SELECT queue FROM next), coalesce(i.home_queue, i.queue))).queue,"
            "       home_queue = (gd._route((SELECT queue FROM next), coalesce(i.home_queue, i.queue))).home_queue,"
            "       wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,"
            "       eligible_at = clock_timestamp(), updated_at = clock_timestamp()"
            " WHERE i.id = $1 AND i.status = ANY (gd._statuses_before('resume')) RETURNING " GD_WOKEN_COLUMNS,
        {INT8OID, JSONBOID}, args, false, 0);
    if (result != SPI_OK_UPDATE_RETURNING || SPI_processed != 1)
        elog(ERROR, "gen_durable: could not resume instance " INT64_FORMAT, id);
    gd_wake_queue_of_returned(0);
    gd_wake_awaiters_at_commit(id);
    gd_emit_event_after(event);
}

int gd_resume_parents(int64 parent, const DueScope *scope)
{
    /* The parents whose children have all ended, locked; all of them, or the one given. */
#define ENDED_FAMILIES                                                                                         \
    "SELECT p.id FROM gd._instances p"                                                                        \
    " WHERE p.status = " GD_STATUS(awaiting_children) " AND NOT EXISTS ("                                                  \
    "       SELECT FROM gd._instances c WHERE c.parent_id = p.id"                                              \
    "          AND c.status = ANY (gd._live_statuses()))"
    static SPIPlanPtr all_plan = nullptr, one_plan = nullptr, scope_plan = nullptr, children_plan = nullptr;
    int result;
    if (scope != nullptr) {
        Datum args[2] = {CStringGetTextDatum(scope->queue), ObjectIdGetDatum(scope->member)};
        result = gd_run_kept(scope_plan,
                             ENDED_FAMILIES " AND p.queue = $1 AND pg_catalog.pg_has_role($2, p.owner, 'MEMBER')"
                                            " FOR UPDATE OF p SKIP LOCKED",
                             {TEXTOID, OIDOID}, args, false, 0);
    } else {
        Datum args[1] = {Int64GetDatum(parent)};
        result = parent != 0 ? gd_run_kept(one_plan, ENDED_FAMILIES " AND p.id = $1 FOR UPDATE OF p SKIP LOCKED",
                                           {INT8OID}, args, false, 0)
                             : gd_run_kept(all_plan, ENDED_FAMILIES " FOR UPDATE OF p SKIP LOCKED", {}, args, false, 0);
    }
#undef ENDED_FAMILIES
    if (result != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up parents to resume failed");
    SPITupleTable *parents = SPI_tuptable; /* kept: each resume runs statements of its own */
    int count = static_cast<int>(SPI_processed);
    for (int i = 0; i < count; i++) {
        bool isnull;
        Datum id = SPI_getbinval(parents->vals[i], parents->tupdesc, 1, &isnull);
        result = gd_run_kept(children_plan,
                             "SELECT jsonb_build_object('children', coalesce(jsonb_agg(jsonb_build_object("
                             "           'id', c.id, 'fsm', c.fsm, 'status', c.status, 'result', c.result,"
                             "           'error', c.error) ORDER BY c.id), '[]'))"
                             "  FROM gd._instances c WHERE c.parent_id = $1",
                             {INT8OID}, &id, false, 1); /* not read-only: a new snapshot sees the last child's commit */
        if (result != SPI_OK_SELECT || SPI_processed != 1)
            elog(ERROR, "gen_durable: reading the children of instance " INT64_FORMAT " failed", DatumGetInt64(id));
        Datum children = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
        gd_resume_parked(DatumGetInt64(id), children);
    }
    return count;
}

/* gd._resume_parked(instance_id bigint, resume_with jsonb): gd_resume_parked, for the SQL paths (a signal). */
GD_SQL_FUNCTION(gd_resume_parked_sql)
{
    SPI_connect();
    gd_resume_parked(PG_GETARG_INT64(0), PG_GETARG_DATUM(1));
    SPI_finish();
    PG_RETURN_VOID();
}
