/*
 * transition.cpp — writing where an instance goes after a step: one row at
 * a time, or a round's plain transitions in one statement, in C++ with kept
 * plans rather than in PL/pgSQL, because the executors' and workers' hot
 * paths write a batch's transitions with no function call per step, in the
 * same transaction as the steps' own effects.  What follows a written
 * transition (a wait consuming signals already there, an empty spawn's
 * resumption, a parent's wake-up, the step's telemetry and event, room under
 * its concurrency key, its awaiters) is started here too.  The statuses
 * written, and the statuses they may be written over, are the status
 * table's (instance_status.cpp); outcomes are decoded by outcomes.cpp.
 */
#include "transition.hpp"
#include "concurrency_keys.hpp"
#include "error_documents.hpp"
#include "events.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
#include "kept_plans.hpp"
#include "resume.hpp"
#include "step_records.hpp"

extern "C" {
#include "common/pg_prng.h"
#include "utils/builtins.h"
}

namespace {

SPIPlanPtr update_plan = nullptr;
SPIPlanPtr wake_if_signalled_plan = nullptr;
SPIPlanPtr spawn_plan = nullptr;

SPIPlanPtr batch_update_plan = nullptr;

int compare_ids(const void *a, const void *b)
{
    int64 x = *static_cast<const int64 *>(a), y = *static_cast<const int64 *>(b);
    return x < y ? -1 : x > y;
}

/* Did a schedule's tick start this instance (its correlation key is the tick's, sql/src/68_schedules.sql)? */
bool started_by_schedule(const PickedInstance &row)
{
    return row.correlation_key != nullptr && strncmp(row.correlation_key, "schedule:", strlen("schedule:")) == 0;
}

} // namespace

Transition gd_transition_from(const PickedInstance &row)
{
    Transition t{};
    t.to.step = row.step;
    t.to.eligible_at = GetCurrentTimestamp();
    t.then.parent_id = row.parent_id;
    t.then.owner = row.owner;
    t.then.concurrency_key = row.concurrency_key;
    t.then.scheduled = started_by_schedule(row);
    t.ran.fsm = row.fsm;
    t.ran.version = row.version;
    t.ran.step = row.step;
    t.ran.state = row.state;
    t.ran.attempt = row.attempt;
    t.ran.event = StatEvent::count_;
    t.ran.compensating = row.cancelled != 0;
    t.ran.before = row.arrived_by;
    if (row.arrived_by != nullptr) {
        /* Mid-chain the row holds the state and visit the chain began with: this step's are written. */
        t.to.state = row.state;
        t.to.visit_key = row.visit_key;
    }
    return t;
}

Transition gd_final_transition(const PickedInstance &row, Status status, Datum result, Datum error)
{
    Transition t = gd_transition_from(row);
    t.to.status = status;
    t.to.attempt = row.attempt;
    t.to.result = result;
    t.to.error = error;
    t.ran.event = status == Status::done     ? StatEvent::step_done
              : status == Status::failed ? StatEvent::step_stop
                                         : StatEvent::count_;
    return t;
}

namespace {

/* Is the instance's row there (when an UPDATE found it in no status to write over)? */
bool instance_exists(int64 id)
{
    static SPIPlanPtr exists_plan = nullptr;
    Datum args[1] = {Int64GetDatum(id)};
    if (gd_run_kept(exists_plan, "SELECT FROM gd._instances WHERE id = $1", {INT8OID}, args, true, 1) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up instance " INT64_FORMAT " failed", id);
    return SPI_processed == 1;
}

/* Run a kept follow-up call taking the instance id (and perhaps one jsonb). */
void call_follow_up(SPIPlanPtr plan, int64 id, Datum extra)
{
    Datum args[2] = {Int64GetDatum(id), extra};
    if (gd_execute_kept(plan, args, nullptr, false, 0) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: follow-up of the transition of instance " INT64_FORMAT " failed", id);
}

void prepare_plans()
{
    if (spawn_plan != nullptr)
        return; /* the last one prepared: all are (a failed preparation leaves the rest to the next call) */
    if (update_plan == nullptr) {
        Oid types[18] = {INT8OID,  TEXTOID, TEXTOID,      JSONBOID,       INT4OID, TIMESTAMPTZOID, JSONBOID, JSONBOID,
                         BOOLOID,  TEXTARRAYOID, TIMESTAMPTZOID, TEXTOID, BOOLOID, BOOLOID,        TEXTOID,  TEXTARRAYOID,
                         BOOLOID,  TEXTOID};
        update_plan = gd_prepare_kept("UPDATE gd._instances SET status = $2, step = $3, state = coalesce($4, state),"
                                      "       attempt = $5, eligible_at = $6, result = $7, error = $8, external = $9,"
                                      "       wait_names = $10, wait_deadline = $11, wait_then_step = $12,"
                                      /* $18: the key of a visit begun in the round (a chain's step) */
                                      "       resume = CASE WHEN $13 AND $18 IS NULL THEN resume END,"
                                      "       visit_key = CASE WHEN $13 OR $2 = ANY (gd._terminal_statuses())"
                                      "                        THEN coalesce($18::uuid, visit_key) ELSE gen_random_uuid() END,"
                                      /* moved ($14): gd._route($15, the home queue) */
                                      "       queue = CASE WHEN $14 THEN coalesce($15, home_queue, queue) ELSE queue END,"
                                      "       home_queue = CASE WHEN NOT $14 THEN home_queue"
                                      "                         WHEN $15 <> coalesce(home_queue, queue)"
                                      "                         THEN coalesce(home_queue, queue) END,"
                                      "       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,"
                                      "       updated_at = clock_timestamp(),"
                                      "       finished_at = CASE WHEN $2 = ANY (gd._terminal_statuses())"
                                      "                          THEN clock_timestamp() END"
                                      /* $16: the writer's from-statuses; $17: compensating when picked */
                                      " WHERE id = $1 AND status = ANY ($16) AND (cancelled IS NOT NULL) = $17"
                                      " RETURNING queue, priority, owner, fairness_lane, eligible_at, id",
                                      18, types);
    }
    Oid follow_up_types[2] = {INT8OID, JSONBOID};
    if (wake_if_signalled_plan == nullptr)
        wake_if_signalled_plan = gd_prepare_kept("SELECT gd._wake_if_signalled($1)", 1, follow_up_types);
    if (spawn_plan == nullptr) {
        Oid spawn_types[3] = {OIDOID, INT8OID, JSONBOID};
        spawn_plan = gd_prepare_kept("SELECT gd._spawn_children($1, $2, $3)", 3, spawn_types);
    }
}

} // namespace

void gd_prepare_transition(int64 id, Transition &t)
{
    if (t.to.status != Status::awaiting_children)
        return;
    prepare_plans();
    Datum args[3] = {ObjectIdGetDatum(t.to.spawn_role), Int64GetDatum(id), t.to.children};
    if (gd_execute_kept(spawn_plan, args, nullptr, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: spawning the children of instance " INT64_FORMAT " failed", id);
    bool isnull;
    t.to.spawned = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

namespace {

/* What follows a written transition, whichever way it was written (history rows into `history`, if given). */
void after_transition(int64 id, const Transition &t, HistoryBatch *history = nullptr)
{
    if (t.ran.before != nullptr)
        after_transition(id, *t.ran.before, history); /* a chain: its steps in the order they ran */
    if (t.ran.event != StatEvent::count_ || t.ran.lost)
        gd_record_finished_step(id, t, history);
    if (t.to.status == Status::awaiting_signal) {
        call_follow_up(wake_if_signalled_plan, id, 0); /* signals that arrived before the wait */
        if (t.to.wait_deadline != 0)
            gd_wake_reaper_at_commit(); /* it sleeps until the earliest deadline: this one may be earlier */
    } else if (t.to.status == Status::awaiting_children && t.to.spawned == 0) {
        gd_resume_parents(id); /* nothing to wait for */
    } else if (t.then.parent_id != 0 && !gd_status_is_live(t.to.status)) {
        gd_wake_reaper_at_commit(); /* perhaps the last child: the reaper resumes the parent */
    }
    if (t.then.scheduled && !gd_status_is_live(t.to.status))
        gd_wake_reaper_at_commit(); /* a buffer_one schedule may hold a tick back until this one ends */
    if (gd_events == GD_EVENTS_TRANSITIONS)
        gd_emit_transition_event(id, t);
    bool still_running = t.to.status == Status::runnable || t.to.status == Status::executing;
    if (t.then.concurrency_key != nullptr && !still_running)
        gd_remember_key_to_release(t.then.owner, t.then.concurrency_key);
    gd_wake_awaiters_at_commit(id);
}


Datum *datums(int count)
{
    return static_cast<Datum *>(palloc(sizeof(Datum) * count));
}

bool *flags(int count)
{
    return static_cast<bool *>(palloc(sizeof(bool) * count));
}

} // namespace

void gd_write_transition(int64 id, const Transition &t, StatusWriter writer)
{
    gd_status_change_check(writer, t.to.status);
    prepare_plans();
    Datum args[18] = {Int64GetDatum(id),   CStringGetTextDatum(gd_status_name(t.to.status)),
                      CStringGetTextDatum(t.to.step), t.to.state,
                      Int32GetDatum(t.to.attempt),    TimestampTzGetDatum(t.to.eligible_at),
                      t.to.result,            t.to.error,
                      BoolGetDatum(t.to.external),    t.to.wait_names,
                      TimestampTzGetDatum(t.to.wait_deadline), t.to.then_step ? CStringGetTextDatum(t.to.then_step) : 0,
                      BoolGetDatum(t.to.same_visit), BoolGetDatum(t.to.moved),
                      t.to.route ? CStringGetTextDatum(t.to.route) : 0, gd_statuses_before(writer),
                      BoolGetDatum(t.ran.compensating), t.to.visit_key ? CStringGetTextDatum(t.to.visit_key) : 0};
    char nulls[18] = {' ', ' ', ' ', t.to.state ? ' ' : 'n', ' ', ' ', t.to.result ? ' ' : 'n', t.to.error ? ' ' : 'n', ' ',
                      t.to.wait_names ? ' ' : 'n', t.to.wait_deadline ? ' ' : 'n', t.to.then_step ? ' ' : 'n', ' ', ' ',
                      t.to.route ? ' ' : 'n', ' ', ' ', t.to.visit_key ? ' ' : 'n'};
    if (gd_execute_kept(update_plan, args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: could not record the transition of instance " INT64_FORMAT, id);
    if (SPI_processed == 0) {
        /* Its own step deleted the row, or ended it or sent it into compensation (gd_cancel): what it did stands. */
        if (!instance_exists(id))
            ereport(WARNING, (errmsg("gen_durable: instance " INT64_FORMAT " was deleted during its step \"%s\"", id,
                                     t.ran.step)));
        return;
    }
    if (t.to.moved && !t.to.external && t.to.status == Status::runnable)
        gd_wake_queue_of_returned(0); /* not its executors' */
    after_transition(id, t);
}

void gd_begin_transitions(TransitionBatch &batch, StatusWriter writer, int capacity)
{
    batch.writer = writer;
    batch.count = 0;
    batch.capacity = Max(capacity, 1);
    batch.ids = static_cast<int64 *>(palloc(sizeof(int64) * batch.capacity));
    batch.items = static_cast<Transition *>(palloc(sizeof(Transition) * batch.capacity));
}

void gd_write_transition_batched(TransitionBatch &batch, int64 id, const Transition &t)
{
    /* Plain: what the batch's statement writes (it leaves the queues as they are). */
    bool plain = !t.to.moved && (t.to.status == Status::runnable || !gd_status_is_live(t.to.status));
    if (!plain || batch.count >= batch.capacity) {
        gd_write_transition(id, t, batch.writer);
        return;
    }
    gd_status_change_check(batch.writer, t.to.status);
    batch.ids[batch.count] = id;
    batch.items[batch.count] = t;
    batch.count++;
}

void gd_flush_transitions(TransitionBatch &batch)
{
    if (batch.count == 0)
        return;
    prepare_plans();
    if (batch_update_plan == nullptr) {
        Oid types[13] = {INT8ARRAYOID, TEXTARRAYOID,        TEXTARRAYOID, JSONBARRAYOID, INT4ARRAYOID,
                         TIMESTAMPTZARRAYOID, JSONBARRAYOID, JSONBARRAYOID, BOOLARRAYOID, BOOLARRAYOID, TEXTARRAYOID,
                         BOOLARRAYOID, TEXTARRAYOID};
        batch_update_plan = gd_prepare_kept(
            "UPDATE gd._instances i SET status = t.status, step = t.step, state = coalesce(t.state, i.state),"
            "       attempt = t.attempt, eligible_at = t.eligible_at, result = t.result, error = t.error,"
            "       external = t.external, wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,"
            "       resume = CASE WHEN t.same_visit AND t.visit_key IS NULL THEN i.resume END,"
            /* an instance that ends keeps its step's key: gd_retry(id) retries that visit */
            "       visit_key = CASE WHEN t.same_visit OR t.status = ANY (gd._terminal_statuses())"
            "                        THEN coalesce(t.visit_key, i.visit_key) ELSE gen_random_uuid() END,"
            "       lease_owner = NULL, lease_token = NULL,"
            "       lease_expires_at = NULL, updated_at = clock_timestamp(),"
            "       finished_at = CASE WHEN t.status = ANY (gd._terminal_statuses()) THEN clock_timestamp() END"
            /* unnest in the select list (ProjectSet): element by element, not ten tuplestores */
            "  FROM (SELECT unnest($1) AS id, unnest($2) AS status, unnest($3) AS step, unnest($4) AS state,"
            "               unnest($5) AS attempt, unnest($6) AS eligible_at, unnest($7) AS result,"
            "               unnest($8) AS error, unnest($9) AS external, unnest($10) AS same_visit,"
            "               unnest($12) AS compensating, unnest($13)::uuid AS visit_key) t"
            /* = ANY: an index scan of just these rows, whatever the join order */
            " WHERE i.id = t.id AND i.id = ANY ($1) AND i.status = ANY ($11) AND (i.cancelled IS NOT NULL) = t.compensating"
            " RETURNING i.id",
            13, types);
    }
    int n = batch.count;
    Datum *ids = datums(n), *statuses = datums(n), *steps = datums(n), *states = datums(n), *attempts = datums(n),
          *eligible = datums(n), *results = datums(n), *errors = datums(n), *externals = datums(n),
          *keeps = datums(n), *compensating = datums(n), *visit_keys = datums(n);
    bool *state_nulls = flags(n), *result_nulls = flags(n), *error_nulls = flags(n), *visit_key_nulls = flags(n);
    for (int i = 0; i < n; i++) {
        const Transition &t = batch.items[i];
        ids[i] = Int64GetDatum(batch.ids[i]);
        statuses[i] = CStringGetTextDatum(gd_status_name(t.to.status));
        steps[i] = CStringGetTextDatum(t.to.step);
        states[i] = t.to.state;
        state_nulls[i] = t.to.state == 0;
        attempts[i] = Int32GetDatum(t.to.attempt);
        eligible[i] = TimestampTzGetDatum(t.to.eligible_at);
        results[i] = t.to.result;
        result_nulls[i] = t.to.result == 0;
        errors[i] = t.to.error;
        error_nulls[i] = t.to.error == 0;
        externals[i] = BoolGetDatum(t.to.external);
        keeps[i] = BoolGetDatum(t.to.same_visit);
        compensating[i] = BoolGetDatum(t.ran.compensating);
        visit_keys[i] = t.to.visit_key ? CStringGetTextDatum(t.to.visit_key) : 0;
        visit_key_nulls[i] = t.to.visit_key == nullptr;
    }
    Datum args[13] = {gd_array_of(ids, nullptr, n, INT8OID),          gd_array_of(statuses, nullptr, n, TEXTOID),
                      gd_array_of(steps, nullptr, n, TEXTOID),        gd_array_of(states, state_nulls, n, JSONBOID),
                      gd_array_of(attempts, nullptr, n, INT4OID),     gd_array_of(eligible, nullptr, n, TIMESTAMPTZOID),
                      gd_array_of(results, result_nulls, n, JSONBOID), gd_array_of(errors, error_nulls, n, JSONBOID),
                      gd_array_of(externals, nullptr, n, BOOLOID),    gd_array_of(keeps, nullptr, n, BOOLOID),
                      gd_statuses_before(batch.writer),               gd_array_of(compensating, nullptr, n, BOOLOID),
                      gd_array_of(visit_keys, visit_key_nulls, n, TEXTOID)};
    batch.count = 0; /* before anything can fail: the caller's transaction is rolled back then */
    if (gd_execute_kept(batch_update_plan, args, nullptr, false, 0, KeptJoins::hashed) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: could not record the transitions of %d instances", n);
    /* The ids written, sorted: each transition's follow-up runs only if its row was written. */
    int written_count = static_cast<int>(SPI_processed);
    int64 *written = static_cast<int64 *>(palloc(sizeof(int64) * Max(written_count, 1)));
    for (int w = 0; w < written_count; w++) {
        bool isnull;
        written[w] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[w], SPI_tuptable->tupdesc, 1, &isnull));
    }
    qsort(written, written_count, sizeof(int64), compare_ids);
    int history_rows = 0; /* with the steps before each in a chain */
    for (int i = 0; i < n; i++)
        for (const Transition *t = &batch.items[i]; t != nullptr; t = t->ran.before)
            history_rows++;
    HistoryBatch *history = gd_begin_history(history_rows);
    for (int i = 0; i < n; i++)
        if (bsearch(&batch.ids[i], written, written_count, sizeof(int64), compare_ids) != nullptr)
            after_transition(batch.ids[i], batch.items[i], history);
    gd_write_history(history);
    pfree(written);
}

void gd_postpone_all(const int64 *ids, const TimestampTz *until, int count)
{
    if (count == 0)
        return;
    static SPIPlanPtr postpone_plan = nullptr;
    Datum *id_values = datums(count), *times = datums(count);
    for (int i = 0; i < count; i++) {
        id_values[i] = Int64GetDatum(ids[i]);
        times[i] = TimestampTzGetDatum(until[i]);
    }
    Datum args[2] = {gd_array_of(id_values, nullptr, count, INT8OID), gd_array_of(times, nullptr, count, TIMESTAMPTZOID)};
    if (gd_run_kept(postpone_plan,
                    "UPDATE gd._instances i SET eligible_at = t.until"
                    "  FROM unnest($1::int8[], $2::timestamptz[]) AS t(id, until)"
                    " WHERE i.id = t.id AND i.id = ANY ($1)",
                    {INT8ARRAYOID, TIMESTAMPTZARRAYOID}, args, false, 0) != SPI_OK_UPDATE)
        elog(ERROR, "gen_durable: could not postpone %d instances", count);
}

void gd_postpone(int64 id, TimestampTz until)
{
    gd_postpone_all(&id, &until, 1);
}

void gd_apply_transition(int64 id, Transition t, StatusWriter writer)
{
    gd_prepare_transition(id, t);
    gd_write_transition(id, t, writer);
    gd_release_concurrency_keys();
}

Transition gd_retry_transition(const PickedInstance &row, const StepDefinition &def, Datum error,
                               int64 explicit_backoff_us)
{
    Transition t = gd_final_transition(row, row.attempt >= def.max_attempts ? Status::failed : Status::runnable, 0, error);
    t.ran.event = StatEvent::step_retry;
    t.to.external = def.external; /* the same step: the same kind of runner */
    t.ran.claimed = t.to.external;
    t.ran.history = def.history;
    t.to.same_visit = true;                    /* the retried step sees what its first attempt saw */
    if (row.attempt >= def.max_attempts)
        return t;
    int64 delay_us = explicit_backoff_us;
    if (delay_us < 0) {
        /* backoff * 2^(attempt-1), capped; the shift is bounded so it cannot overflow */
        int doublings = Min(row.attempt - 1, 40);
        delay_us = def.backoff_us;
        for (int i = 0; i < doublings && delay_us < def.max_backoff_us; i++)
            delay_us *= 2;
        delay_us = Min(delay_us, def.max_backoff_us);
        /* Equal jitter: retries of steps that failed together (an outage) do not all come back at once. */
        if (def.backoff_jitter)
            delay_us = delay_us / 2 + static_cast<int64>(pg_prng_double(&pg_global_prng_state) * (delay_us - delay_us / 2));
    }
    delay_us = Min(delay_us, GD_MAX_DELAY_US);
    t.to.status = Status::runnable;
    t.to.attempt = row.attempt + 1;
    t.to.eligible_at += delay_us;
    return t;
}

Transition gd_failed_at_once(const PickedInstance &row, int sqlerrcode, const char *message)
{
    ErrorFields fields{"undefined", message};
    fields.sqlstate = unpack_sql_state(sqlerrcode);
    return gd_final_transition(row, Status::failed, 0, gd_error_document(row, fields));
}
