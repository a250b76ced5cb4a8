/*
 * operations.cpp — the transitions an operator or the API asks for rather
 * than a step: gd_retry of a failed instance (gd._revive), gd_cancel of an
 * instance and its live descendants (gd._cancel_tree), and the move of the
 * instances at a step redefined on another queue (gd._move_step).  The
 * PL/pgSQL API checks arguments and rights, then calls in.
 */
#include "concurrency_keys.hpp"
#include "events.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
#include "kept_plans.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/builtins.h"
}

/*
 * gd._move_step(fsm text, version int, step text, queue text): the runnable
 * and claimed instances at the step follow it to `queue` (NULL: each one's
 * home queue), whose executors are woken at commit.
 */
GD_SQL_FUNCTION(gd_move_step)
{
    static SPIPlanPtr move_plan = nullptr;
    SPI_connect();
    if (gd_run_kept_on_arguments(move_plan,
                    "UPDATE gd._instances i"
                    "   SET (queue, home_queue) = (SELECT r.queue, r.home_queue"
                    "                                FROM gd._route($4, coalesce(i.home_queue, i.queue)) r)"
                    " WHERE i.fsm = $1 AND i.version = $2 AND i.step = $3 AND i.status IN (" GD_STATUS(runnable) ", " GD_STATUS(executing) ")"
                    " RETURNING " GD_WOKEN_COLUMNS,
                    {TEXTOID, INT4OID, TEXTOID, TEXTOID}, fcinfo, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: moving the instances at a step failed");
    for (uint64 r = 0; r < SPI_processed; r++)
        gd_wake_queue_of_returned(r);
    SPI_finish();
    PG_RETURN_VOID();
}

/*
 * gd._revive(caller oid, id bigint) → boolean: gd_retry once checked.  A
 * failed instance `caller` may use runs again at the step that failed,
 * attempts reset (waiting for room under its concurrency key if need be).
 * False for a NULL id, as for an instance that is not there.
 */
GD_SQL_FUNCTION(gd_revive)
{
    if (PG_ARGISNULL(1))
        PG_RETURN_BOOL(false);
    static SPIPlanPtr revive_plan = nullptr;
    SPI_connect();
    InstanceEvent event = gd_event_before(PG_GETARG_INT64(1), "retried");
    if (gd_run_kept_on_arguments(revive_plan,
                    "UPDATE gd._instances i"
                    "   SET status = gd._status_after('revive', 'runnable'), attempt = 1, error = NULL, result = NULL, finished_at = NULL,"
                    "       gated = gd._must_gate(i.owner, i.concurrency_key),"
                    "       eligible_at = clock_timestamp(), updated_at = clock_timestamp()"
                    " WHERE i.id = $2 AND i.status = ANY (gd._statuses_before('revive')) AND gd._may_use_instance($1, i.owner, i.fsm)"
                    " RETURNING " GD_WOKEN_COLUMNS,
                    {OIDOID, INT8OID}, fcinfo, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: retrying instance " INT64_FORMAT " failed", PG_GETARG_INT64(1));
    bool revived = SPI_processed == 1;
    if (revived) {
        gd_wake_queue_of_returned(0);
        gd_wake_awaiters_at_commit(PG_GETARG_INT64(1));
        gd_emit_event_after(event);
    }
    SPI_finish();
    PG_RETURN_BOOL(revived);
}

/*
 * gd._cancel_tree(id bigint, reason text): gd_cancel once the caller's right
 * is checked and the instance is locked and live.  It and its live
 * descendants end `cancelled`; room is made under their concurrency keys,
 * their awaiters are woken, and the reaper, when the instance has a parent
 * (a cancelled child counts as ended).
 */
GD_SQL_FUNCTION(gd_cancel_tree)
{
    static SPIPlanPtr cancel_plan = nullptr;
    int64 target = PG_GETARG_INT64(0);
    Datum args[2] = {PG_GETARG_DATUM(0), PG_ARGISNULL(1) ? CStringGetTextDatum("") : PG_GETARG_DATUM(1)};
    const char nulls[2] = {' ', PG_ARGISNULL(1) ? 'n' : ' '};
    SPI_connect();
    if (cancel_plan == nullptr) {
        Oid types[2] = {INT8OID, TEXTOID};
        cancel_plan = gd_prepare_kept(
            "WITH RECURSIVE tree AS ("
            "    SELECT $1::bigint AS id"
            "    UNION ALL"
            "    SELECT c.id FROM gd._instances c JOIN tree t ON c.parent_id = t.id"
            "     WHERE c.status = ANY (gd._live_statuses()))"
            "UPDATE gd._instances i"
            "   SET status = gd._status_after('cancel', 'cancelled'), gated = false,"
            "       error = jsonb_build_object('kind', 'cancelled',"
            "                                  'message', 'gen_durable: cancelled' || coalesce(': ' || $2, ''),"
            "                                  'reason', coalesce($2, ''), 'step', i.step, 'attempt', i.attempt),"
            "       wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,"
            "       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,"
            "       finished_at = clock_timestamp(), updated_at = clock_timestamp()"
            "  FROM tree, gd._instances before"
            " WHERE i.id = tree.id AND before.id = tree.id AND i.status = ANY (gd._statuses_before('cancel'))"
            " RETURNING i.id, i.owner, i.concurrency_key, i.parent_id, i.fsm, i.version, i.step, before.status,"
            "           i.attempt",
            2, types);
    }
    if (gd_execute_kept(cancel_plan, args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: cancelling instance " INT64_FORMAT " failed", target);
    SPITupleTable *cancelled = SPI_tuptable; /* kept: making room runs statements of its own */
    int count = static_cast<int>(SPI_processed);
    bool has_parent = false;
    for (int r = 0; r < count; r++) {
        HeapTuple ended = cancelled->vals[r];
        TupleDesc desc = cancelled->tupdesc;
        bool isnull;
        int64 id = DatumGetInt64(SPI_getbinval(ended, desc, 1, &isnull));
        gd_wake_awaiters_at_commit(id);
        Oid owner = DatumGetObjectId(SPI_getbinval(ended, desc, 2, &isnull));
        Datum key = SPI_getbinval(ended, desc, 3, &isnull);
        if (!isnull)
            gd_remember_key_to_release(owner, TextDatumGetCString(key));
        (void) SPI_getbinval(ended, desc, 4, &isnull);
        if (id == target)
            has_parent = !isnull;
        if (gd_events == GD_EVENTS_TRANSITIONS) {
            const char *step = SPI_getvalue(ended, desc, 7);
            gd_emit_event(InstanceEvent{id, SPI_getvalue(ended, desc, 5),
                                        DatumGetInt32(SPI_getbinval(ended, desc, 6, &isnull)), step,
                                        SPI_getvalue(ended, desc, 8), "cancelled", step, "cancelled",
                                        DatumGetInt32(SPI_getbinval(ended, desc, 9, &isnull))});
        }
    }
    gd_release_concurrency_keys();
    if (has_parent)
        gd_wake_reaper_at_commit();
    SPI_finish();
    PG_RETURN_VOID();
}
