/*
 * run_here.cpp — steps run in the calling backend, in its transaction,
 * exactly as an executor runs them: gd._execute (tests, manual stepping) and
 * the rounds of gd_drain (a tenant's own test suite).
 */
#include "gen_durable.hpp"
#include "guard.hpp"
#include "handler_call.hpp"
#include "picker.hpp"
#include "step_runner.hpp"

extern "C" {
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"
}

namespace {

/* Run up to `limit` steps of the queue here, the drain's only when given.
 * Never inside a step: not in an engine worker (whose only SQL besides its
 * own is its handlers'), nor in a step this runs (the runner is not
 * reentrant: a nested run would take rows its caller holds, and its step's
 * timeout); nor in a session whose state a handler would see or lose. */
int run_here(const char *what, text *queue_name, int32 limit, const DrainScope *drain)
{
    static bool running = false;
    char queue[NAMEDATALEN];
    text_to_cstring_buffer(queue_name, queue, sizeof(queue));
    if (limit < 1 || limit > GD_MAX_BATCH)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: max must be between 1 and %d, got %d", GD_MAX_BATCH, limit)));
    if (running || gd_my_worker_kind() != WorkerKind::free)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("gen_durable: %s cannot run inside a step", what)));
    if (const char *held_back = gd_session_holds_back_handlers())
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("gen_durable: %s cannot run handlers in a session with %s", what, held_back),
                        errhint("Call it from a new session, or outside any cursor.")));
    int ran = 0;
    running = true;
    PG_TRY();
    {
        SPI_connect();
        ran = gd_execute_batch(queue, limit, nullptr, drain).ran;
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

