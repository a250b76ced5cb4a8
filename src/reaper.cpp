/*
 * reaper.cpp — the reaper's round, one reaper per served database: what
 * becomes due without anyone committing anything.  It fires the schedules'
 * due ticks (sql/src/68_schedules.sql), ends timed-out waits,
 * resumes parents whose children have all ended, admits instances a
 * concurrency key has room for again, reclaims expired leases and announces
 * external work come due, looks for runnable rows nothing announced (the
 * queues' frontiers, frontier.cpp), then sleeps until the next deadline (at most
 * gen_durable.reaper_interval) or until a commit that ends a child wakes it.
 * gd_drain does the same for a tenant's instances, by its session's clock.
 * The instances' transitions are written by transition.cpp.
 */
#include "gen_durable.hpp"
#include "guard.hpp"
#include "instance_status.hpp"
#include "kept_plans.hpp"
#include "picker.hpp"
#include "resume.hpp"
#include "rounds.hpp"
#include "stats.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/guc.h"
#include "utils/timestamp.h"
}

namespace {

constexpr int WAITS_PER_ROUND = 500;
constexpr int LEASES_PER_ROUND = 100;
constexpr int SCHEDULES_PER_ROUND = 500;
constexpr int SCHEDULES_PER_CAREFUL_ROUND = 20; /* subtransactions each: stay within a backend's cache of them */

/* Fire up to `batch` schedules' due ticks (gd._fire_schedules); returns how many. */
int fire_due_ticks(TimestampTz serving_since, int batch, bool carefully)
{
    static SPIPlanPtr fire_plan = nullptr;
    Datum args[4] = {TimestampTzGetDatum(GetCurrentTimestamp()), TimestampTzGetDatum(serving_since),
                     Int32GetDatum(batch), BoolGetDatum(carefully)};
    if (gd_run_kept(fire_plan, "SELECT gd._fire_schedules($1, $2, $3, $4)",
                    {TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID, BOOLOID}, args, false, 1) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: firing the schedules failed");
    bool isnull;
    return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * Fire the schedules' due ticks; true when a full batch may leave more.  The
 * fast way first, in a subtransaction: if a tick raised there, the batch is
 * rolled back and fired again carefully, the tick skipped with its error.
 */
bool fire_ticks()
{
    /* Ticks before this reaper began were missed while none served the database: catch_up decides. */
    static TimestampTz serving_since = GetCurrentTimestamp();
    MemoryContext round_context = CurrentMemoryContext;
    ResourceOwner round_owner = CurrentResourceOwner;
    volatile int fired = 0;
    bool raised = false;
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(round_context);
    PG_TRY();
    {
        fired = fire_due_ticks(serving_since, SCHEDULES_PER_ROUND, false);
        ReleaseCurrentSubTransaction();
    }
    PG_CATCH();
    {
        MemoryContextSwitchTo(round_context);
        ErrorData *error = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        ereport(LOG, (errmsg("gen_durable: firing schedules raised, firing them again one tick at a time: %s",
                             error->message)));
        FreeErrorData(error);
        raised = true;
    }
    PG_END_TRY();
    MemoryContextSwitchTo(round_context);
    CurrentResourceOwner = round_owner;
    if (raised)
        return fire_due_ticks(serving_since, SCHEDULES_PER_CAREFUL_ROUND, true) == SCHEDULES_PER_CAREFUL_ROUND;
    return fired == SCHEDULES_PER_ROUND;
}

/* fire_ticks, waiting for a tick's correlation key that an open transaction is
 * inserting only so long: the tick is skipped then, and the round goes on. */
bool fire_schedules()
{
    int nest_level = gd_bound_lock_waits(GD_TENANT_LOCK_WAIT_MS);
    bool more = fire_ticks();
    AtEOXact_GUC(true, nest_level);
    return more;
}

/* The reaper's scans for timed-out waits (rounds.hpp). */
DeadlineScan wait_scan;

/* Waits whose deadline passed resume with ctx.timed_out; returns how many.  The reaper's: from its mark.  A
 * drain's: the scope's waits, due by its now. */
int expire_waits(const DueScope *scope)
{
    static SPIPlanPtr expired_plan = nullptr, scope_plan = nullptr;
    int result;
    TimestampTz now = GetCurrentTimestamp();
    if (scope == nullptr) {
        Datum args[3] = {Int32GetDatum(WAITS_PER_ROUND), TimestampTzGetDatum(now),
                         TimestampTzGetDatum(wait_scan.from(now))};
        result = gd_run_kept(expired_plan,
                             "SELECT i.id, i.wait_deadline FROM gd._instances i"
                             " WHERE i.status = " GD_STATUS(awaiting_signal) " AND i.wait_deadline <= $2"
                             "   AND i.wait_deadline >= $3"
                             " ORDER BY i.wait_deadline LIMIT $1 FOR UPDATE SKIP LOCKED",
                             {INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID}, args, false, 0);
    } else {
        Datum args[4] = {Int32GetDatum(WAITS_PER_ROUND), TimestampTzGetDatum(scope->now),
                         CStringGetTextDatum(scope->queue), ObjectIdGetDatum(scope->member)};
        result = gd_run_kept(scope_plan,
                             "SELECT i.id FROM gd._instances i"
                             " WHERE i.status = " GD_STATUS(awaiting_signal) " AND i.wait_deadline <= $2 AND i.queue = $3"
                             "   AND pg_catalog.pg_has_role($4, i.owner, 'MEMBER')"
                             " ORDER BY i.wait_deadline LIMIT $1 FOR UPDATE SKIP LOCKED",
                             {INT4OID, TIMESTAMPTZOID, TEXTOID, OIDOID}, args, false, 0);
    }
    if (result != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up expired waits failed");
    SPITupleTable *expired = SPI_tuptable; /* kept: each resume runs statements of its own */
    int count = static_cast<int>(SPI_processed);
    if (scope == nullptr) {
        bool isnull;
        wait_scan.took(count, WAITS_PER_ROUND,
                       count == 0 ? 0 : DatumGetTimestampTz(SPI_getbinval(expired->vals[count - 1], expired->tupdesc, 2, &isnull)),
                       now);
    }
    Datum timed_out = DirectFunctionCall1(jsonb_in, CStringGetDatum("{\"timed_out\": true, \"signals\": []}"));
    for (int i = 0; i < count; i++) {
        bool isnull;
        gd_resume_parked(DatumGetInt64(SPI_getbinval(expired->vals[i], expired->tupdesc, 1, &isnull)), timed_out);
    }
    gd_count(StatEvent::await_timeout, static_cast<uint64>(count));
    return count;
}

/* Run one of the reaper's SQL duties. */
void run_duty(SPIPlanPtr &plan, const char *sql)
{
    if (gd_run_kept(plan, sql, {}, nullptr, false, 1) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: the reaper's %s failed", sql);
}

/* The earliest deadline of a timed wait or a schedule's tick; 0 when none.  Only the waits due after the last
 * scan for timed-out ones and before the reaper's next round anyway are looked at (under a held horizon the
 * entries of waits that ended meanwhile are there too, dead). */
TimestampTz next_deadline()
{
    static SPIPlanPtr deadline_plan = nullptr;
    Datum args[2] = {TimestampTzGetDatum(wait_scan.scanned_to), Float8GetDatum(gd_reaper_interval_ms / 1000.0)};
    if (gd_run_kept(deadline_plan,
                    "SELECT least((SELECT min(i.wait_deadline) FROM gd._instances i"
                    "               WHERE i.status = " GD_STATUS(awaiting_signal) " AND i.wait_deadline > $1"
                    "                 AND i.wait_deadline < $1 + make_interval(secs => $2)),"
                    "             gd._next_tick_due())",
                    {TIMESTAMPTZOID, FLOAT8OID}, args, false, 1) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up the reaper's next deadline failed");
    bool isnull;
    Datum deadline = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    return isnull ? 0 : DatumGetTimestampTz(deadline);
}

} // namespace

long gd_reaper_round()
{
    /* A full batch may leave more: go again.  Only a full one: a steady stream of timeouts must not put off
     * the duties after them. */
    if (fire_schedules() || expire_waits(nullptr) == WAITS_PER_ROUND)
        return 0;
    gd_resume_parents(0);
    static SPIPlanPtr repair_plan = nullptr;
    run_duty(repair_plan, "SELECT gd._repair_keys()");
    TimestampTz next = next_deadline();
    TimestampTz leases_next = gd_expire_leases(LEASES_PER_ROUND);
    gd_audit_frontiers();
    if (leases_next != 0 && (next == 0 || leases_next < next))
        next = leases_next;
    long sleep_ms = gd_reaper_interval_ms;
    if (next != 0) {
        long until_next = static_cast<long>((next - GetCurrentTimestamp()) / 1000) + 1;
        sleep_ms = Max(0L, Min(sleep_ms, until_next));
    }
    return sleep_ms;
}

/*
 * gd._drain_due(queue text, member oid) → int: for gd_drain, what the reaper
 * would have done by the session's now (gen_durable.now, or the clock) to
 * the instances of `queue` whose owner `member` is a member of: waits past
 * their deadline time out, parents whose children have all ended resume;
 * and the ticks of member's schedules due by then fire, one after another
 * (none counted as missed: a test moves its clock on purpose).  Returns how
 * many instances it resumed or started.
 */
GD_SQL_FUNCTION(gd_drain_due)
{
    char queue[NAMEDATALEN];
    text_to_cstring_buffer(PG_GETARG_TEXT_PP(0), queue, sizeof(queue));
    DueScope scope{queue, PG_GETARG_OID(1), gd_session_now()};
    static SPIPlanPtr ticks_plan = nullptr;
    SPI_connect();
    int changed = expire_waits(&scope) + gd_resume_parents(0, &scope);
    Datum args[3] = {ObjectIdGetDatum(scope.member), TimestampTzGetDatum(scope.now), Int32GetDatum(SCHEDULES_PER_ROUND)};
    if (gd_run_kept(ticks_plan, "SELECT gd._fire_ticks_of($1, $2, $3)", {OIDOID, TIMESTAMPTZOID, INT4OID}, args, false,
                    1) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: firing the drain's ticks failed");
    bool isnull;
    changed += DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    SPI_finish();
    PG_RETURN_INT32(changed);
}
