/*
 * operations.cpp — the transitions an operator or the API asks for rather
 * than a step: gd_retry of a failed instance (gd._revive), gd_cancel of an
 * instance and its live descendants, each ended or sent into its FSM's
 * compensation (gd._cancel_tree), and the move of the
 * instances at a step redefined on another queue (gd._move_step).  The
 * PL/pgSQL API checks arguments and rights, then calls in.
 */
#include "concurrency_keys.hpp"
#include "events.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
#include "instance_status.hpp"
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

namespace {

/* The instance and its live descendants, but for those compensating and theirs: an int8[]. */
Datum cancel_tree_ids(Datum target)
{
    static SPIPlanPtr tree_plan = nullptr;
    if (gd_run_kept(tree_plan,
                    "WITH RECURSIVE tree AS ("
                    "    SELECT $1::bigint AS id"
                    "    UNION ALL"
                    "    SELECT c.id FROM gd._instances c JOIN tree t ON c.parent_id = t.id"
                    "     WHERE c.status = ANY (gd._live_statuses()) AND c.cancelled IS NULL)"
                    "SELECT array_agg(id) FROM tree",
                    {INT8OID}, &target, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: finding the descendants of instance " INT64_FORMAT " failed", DatumGetInt64(target));
    bool isnull;
    return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
}

/* The event of an instance a cancel moved: columns fsm, version, step, status before, step after, attempt from `first`. */
void emit_cancel_event(HeapTuple row, TupleDesc desc, int64 id, int first, const char *to, const char *kind)
{
    if (gd_events != GD_EVENTS_TRANSITIONS)
        return;
    bool isnull;
    gd_emit_event(InstanceEvent{id, SPI_getvalue(row, desc, first), DatumGetInt32(SPI_getbinval(row, desc, first + 1, &isnull)),
                                SPI_getvalue(row, desc, first + 2), SPI_getvalue(row, desc, first + 3), to,
                                SPI_getvalue(row, desc, first + 4), kind,
                                DatumGetInt32(SPI_getbinval(row, desc, first + 5, &isnull))});
}

/*
 * The instances of `ids` whose FSM version names an on_cancel step go to it,
 * runnable at attempt 1, marked compensating with why and where they were;
 * still running, they keep their room under their concurrency key (parked,
 * they wait for it as a resumed instance does).  Their queues are woken.
 */
void send_into_compensation(Datum ids, Datum reason, char reason_null)
{
    static SPIPlanPtr compensate_plan = nullptr;
    if (compensate_plan == nullptr) {
        Oid types[2] = {INT8ARRAYOID, TEXTOID};
        compensate_plan = gd_prepare_kept(
            "UPDATE gd._instances i"
            "   SET status = gd._status_after('compensate', 'runnable'), step = f.on_cancel, attempt = 1,"
            "       external = s.handler IS NULL, resume = NULL, visit_key = gen_random_uuid(),"
            "       (queue, home_queue) = (SELECT r.queue, r.home_queue"
            "                                FROM gd._route(s.queue, coalesce(i.home_queue, i.queue)) r),"
            "       gated = gd._gated_when_moved(before.status, i.gated, i.owner, i.concurrency_key),"
            "       cancelled = gd._cancelled_error($2, i.step, i.attempt)"
            "                   || jsonb_build_object('status', before.status, 'at', clock_timestamp()),"
            "       wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,"
            "       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, claimed_at = NULL,"
            "       eligible_at = clock_timestamp(), updated_at = clock_timestamp()"
            "  FROM gd._instances before, gd._fsms f, gd._steps s"
            " WHERE i.id = ANY ($1) AND before.id = i.id AND i.status = ANY (gd._statuses_before('compensate'))"
            "   AND i.cancelled IS NULL AND f.name = i.fsm AND f.version = i.version"
            "   AND s.fsm = i.fsm AND s.version = i.version AND s.step = f.on_cancel"
            " RETURNING " GD_WOKEN_COLUMNS ", i.fsm, i.version, before.step, before.status, i.step, i.attempt",
            2, types);
    }
    Datum args[2] = {ids, reason};
    const char nulls[2] = {' ', reason_null};
    if (gd_execute_kept(compensate_plan, args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: sending instances into compensation failed");
    for (uint64 r = 0; r < SPI_processed; r++) {
        bool isnull;
        int64 id = DatumGetInt64(
            SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, GD_WOKEN_COLUMN_COUNT, &isnull));
        gd_wake_queue_of_returned(r);
        gd_wake_awaiters_at_commit(id);
        emit_cancel_event(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, id, GD_WOKEN_COLUMN_COUNT + 1,
                          gd_status_name(Status::runnable),
                          "compensate");
    }
}

} // namespace

/*
 * gd._cancel_tree(id bigint, reason text): gd_cancel once the caller's right
 * is checked and the instance is locked, live and not compensating.  It and
 * its live descendants are each cancelled: sent into compensation when
 * their FSM version names an on_cancel step (still running, under the same
 * concurrency key), else ended `cancelled`, room made under their
 * concurrency keys.  A descendant already compensating is left to it, with
 * its own descendants.  Their awaiters are woken, and the reaper, when the
 * instance has a parent (a cancelled child counts as ended).
 */
GD_SQL_FUNCTION(gd_cancel_tree)
{
    static SPIPlanPtr cancel_plan = nullptr;
    int64 target = PG_GETARG_INT64(0);
    SPI_connect();
    Datum tree = cancel_tree_ids(PG_GETARG_DATUM(0));
    send_into_compensation(tree, PG_GETARG_DATUM(1), PG_ARGISNULL(1) ? 'n' : ' ');
    if (cancel_plan == nullptr) {
        Oid types[2] = {INT8ARRAYOID, TEXTOID};
        cancel_plan = gd_prepare_kept(
            "UPDATE gd._instances i"
            "   SET status = gd._status_after('cancel', 'cancelled'), gated = false,"
            "       error = gd._cancelled_error($2, i.step, i.attempt),"
            "       wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,"
            "       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,"
            "       finished_at = clock_timestamp(), updated_at = clock_timestamp()"
            "  FROM gd._instances before"
            " WHERE i.id = ANY ($1) AND before.id = i.id AND i.status = ANY (gd._statuses_before('cancel'))"
            "   AND i.cancelled IS NULL"
            " RETURNING i.id, i.owner, i.concurrency_key, i.parent_id, i.fsm, i.version, i.step, before.status,"
            "           i.step, i.attempt",
            2, types);
    }
    Datum args[2] = {tree, PG_GETARG_DATUM(1)};
    const char nulls[2] = {' ', PG_ARGISNULL(1) ? 'n' : ' '};
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
        emit_cancel_event(ended, desc, id, 5, gd_status_name(Status::cancelled), "cancelled");
    }
    gd_release_concurrency_keys();
    if (has_parent)
        gd_wake_reaper_at_commit();
    SPI_finish();
    PG_RETURN_VOID();
}
