/*
 * repairs.cpp — the status write of gd_rewind (gd._rewind_instance): a
 * failed or stuck instance, locked and checked by sql/src/63_repairs.sql,
 * goes back to a step, runnable at once.  The rest of the repairs (gd_fork
 * inserts, gd_migrate changes no status) are SQL's.
 */
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
 * gd._rewind_instance(id bigint, step text, state jsonb) → boolean: the
 * instance goes to `step` of its version with `state` (NULL: its own),
 * runnable now, attempt 1, a new visit of the step; its wait, lease and
 * error are cleared (a worker still holding its claim completes in vain).
 * Under its concurrency key it keeps its turn if it was running, and holds
 * a key of the run scope it held while waiting; a failed one takes its key
 * again, or waits for it.  Its inbox stays as it is.  False when it is not
 * in a status gd_rewind moves instances out of.
 */
GD_SQL_FUNCTION(gd_rewind_instance)
{
    static SPIPlanPtr rewind_plan = nullptr;
    int64 id = PG_GETARG_INT64(0);
    SPI_connect();
    InstanceEvent event = gd_event_before(id, "rewound");
    if (gd_run_kept_on_arguments(rewind_plan,
                    "UPDATE gd._instances i"
                    "   SET status = gd._status_after('rewind', 'runnable'), step = $2, state = coalesce($3, i.state),"
                    "       attempt = 1, error = NULL, result = NULL, finished_at = NULL, resume = NULL,"
                    "       gated = gd._gated_when_moved(before.status, i.gated, i.owner, i.concurrency_key),"
                    "       external = s.handler IS NULL,"
                    "       (queue, home_queue) = (SELECT r.queue, r.home_queue"
                    "                                FROM gd._route(s.queue, coalesce(i.home_queue, i.queue)) r),"
                    "       wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,"
                    "       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, claimed_at = NULL,"
                    "       visit_key = gen_random_uuid(), eligible_at = clock_timestamp(), updated_at = clock_timestamp()"
                    "  FROM gd._instances before, gd._steps s"
                    " WHERE i.id = $1 AND before.id = $1 AND s.fsm = i.fsm AND s.version = i.version AND s.step = $2"
                    "   AND i.status = ANY (gd._statuses_before('rewind'))"
                    " RETURNING " GD_WOKEN_COLUMNS,
                    {INT8OID, TEXTOID, JSONBOID}, fcinfo, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: rewinding instance " INT64_FORMAT " failed", id);
    bool rewound = SPI_processed == 1;
    if (rewound) {
        gd_wake_queue_of_returned(0);
        gd_wake_awaiters_at_commit(id);
        gd_emit_event_after(event);
    }
    SPI_finish();
    PG_RETURN_BOOL(rewound);
}
