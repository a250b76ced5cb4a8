/*
 * transition.cpp — the owner of instance state: every change of an
 * instance's status is written here (a claim's, with claims.cpp), in C++
 * with kept plans rather than in PL/pgSQL, because the executors' and
 * workers' hot paths write a batch's transitions in one statement with no
 * function call per step.  A handler's gd.outcome is validated and turned
 * into a Transition (next step, retry after exponential backoff, a wait for
 * signals, a spawn of children, or a terminal status); kept UPDATE plans
 * write them — one row at a time, or a round's plain transitions in one
 * statement — in the same transaction as the steps' own effects.  A parked
 * instance's resume, a postponement under rate limits, admission under a
 * concurrency key, a retry's revival, a cancelled tree and the move of the
 * instances at a step redefined on another queue are written here too, for
 * the reaper and for the API's PL/pgSQL functions, which check arguments
 * and rights and then call in.  The status names are Status's.
 */
#include "executor.hpp"
#include "guard.hpp"
#include "labelled_stats.hpp"

extern "C" {
#include "access/xact.h"
#include "common/pg_prng.h"
#include "utils/lsyscache.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
}

namespace {

/* What a statement that made rows runnable returns, for wake_for_returned. */
#define WOKEN_COLUMNS "i.queue, i.priority, i.eligible_at, i.id"

/* Wake the queue of the r-th row returned (WOKEN_COLUMNS), at that row's key. */
void wake_for_returned(uint64 r)
{
    HeapTuple row = SPI_tuptable->vals[r];
    TupleDesc desc = SPI_tuptable->tupdesc;
    bool isnull;
    PickKey key{DatumGetInt32(SPI_getbinval(row, desc, 2, &isnull)),
                DatumGetTimestampTz(SPI_getbinval(row, desc, 3, &isnull)),
                DatumGetInt64(SPI_getbinval(row, desc, 4, &isnull))};
    gd_wake_queue_at_commit(SPI_getvalue(row, desc, 1), &key);
}

} // namespace

namespace {

/* gd.outcome's columns, in order. */
enum OutcomeColumn {
    OUTCOME_KIND = 1, OUTCOME_STEP, OUTCOME_STATE, OUTCOME_DELAY, OUTCOME_ERROR,
    OUTCOME_BACKOFF, OUTCOME_RESULT, OUTCOME_SIGNAL_NAMES, OUTCOME_TIMEOUT, OUTCOME_CHILDREN
};

SPIPlanPtr update_plan = nullptr;
SPIPlanPtr wake_if_signalled_plan = nullptr;
SPIPlanPtr spawn_plan = nullptr;

SPIPlanPtr batch_update_plan = nullptr;
/* A concurrency key in its owner's key space. */
struct OwnedKey {
    Oid owner;
    const char *key;
};
/* Keys whose holders stopped running in this transaction, in TopTransactionContext. */
OwnedKey *keys_to_release = nullptr;
int keys_to_release_count = 0;
int keys_to_release_capacity = 0;

void forget_keys_at_transaction_end(XactEvent, void *)
{
    /* their memory goes with the transaction */
    keys_to_release = nullptr;
    keys_to_release_count = keys_to_release_capacity = 0;
}

void remember_key_to_release(Oid owner, const char *key)
{
    if (keys_to_release_count == keys_to_release_capacity) {
        keys_to_release_capacity = Max(64, 2 * keys_to_release_capacity);
        Size size = sizeof(OwnedKey) * keys_to_release_capacity;
        keys_to_release = static_cast<OwnedKey *>(keys_to_release == nullptr
                                                      ? MemoryContextAlloc(TopTransactionContext, size)
                                                      : repalloc(keys_to_release, size));
    }
    keys_to_release[keys_to_release_count++] = OwnedKey{owner, MemoryContextStrdup(TopTransactionContext, key)};
}

int compare_ids(const void *a, const void *b)
{
    int64 x = *static_cast<const int64 *>(a), y = *static_cast<const int64 *>(b);
    return x < y ? -1 : x > y;
}

/* By key, then owner: the order every path takes key locks in, so two never deadlock. */
int compare_keys(const void *a, const void *b)
{
    const auto *x = static_cast<const OwnedKey *>(a), *y = static_cast<const OwnedKey *>(b);
    int by_key = strcmp(x->key, y->key);
    return by_key != 0 ? by_key : (x->owner < y->owner ? -1 : x->owner > y->owner);
}

/* Longer delays mean "never" in practice and are clamped, so no timestamp overflows. */
constexpr int64 MAX_DELAY_US = INT64CONST(100) * 366 * USECS_PER_DAY;

/* An interval in microseconds, clamped to +/- MAX_DELAY_US. */
int64 interval_usecs(Datum value)
{
    const Interval *span = DatumGetIntervalP(value);
    double usecs = static_cast<double>(span->time) +
                   (static_cast<double>(span->day) + static_cast<double>(span->month) * DAYS_PER_MONTH) * USECS_PER_DAY;
    return static_cast<int64>(Max(Min(usecs, static_cast<double>(MAX_DELAY_US)), -static_cast<double>(MAX_DELAY_US)));
}

[[noreturn]] void bad_outcome(const PickedInstance &row, const char *problem)
{
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("gen_durable: step \"%s\" of FSM \"%s\" returned a bad outcome: %s", row.step, row.fsm,
                           problem)));
    pg_unreachable();
}

/* Did a schedule's tick start this instance (its correlation key is the tick's, sql/src/68_schedules.sql)? */
bool started_by_schedule(const PickedInstance &row)
{
    return row.correlation_key != nullptr && strncmp(row.correlation_key, "schedule:", strlen("schedule:")) == 0;
}

/* A transition of `row` from the step it ran: what every kind of transition carries. */
Transition from_step_of(const PickedInstance &row)
{
    Transition t{};
    t.step = row.step;
    t.eligible_at = GetCurrentTimestamp();
    t.parent_id = row.parent_id;
    t.owner = row.owner;
    t.concurrency_key = row.concurrency_key;
    t.scheduled = started_by_schedule(row);
    t.fsm = row.fsm;
    t.version = row.version;
    t.ran_step = row.step;
    t.ran_attempt = row.attempt;
    t.event = StatEvent::count_;
    return t;
}

Datum empty_object()
{
    return DirectFunctionCall1(jsonb_in, CStringGetDatum("{}"));
}

/* Run a kept follow-up call taking the instance id (and perhaps one jsonb). */
void call_follow_up(SPIPlanPtr plan, int64 id, Datum extra)
{
    Datum args[2] = {Int64GetDatum(id), extra};
    if (gd_execute_kept(plan, args, nullptr, false, 0) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: follow-up of the transition of instance " INT64_FORMAT " failed", id);
}

/* A new state from an outcome: NULL keeps the state; anything but an object is a bad outcome. */
Datum outcome_state(const PickedInstance &row, HeapTupleHeader outcome)
{
    bool isnull;
    Datum state = GetAttributeByNum(outcome, OUTCOME_STATE, &isnull);
    if (isnull)
        return 0;
    if (!JB_ROOT_IS_OBJECT(DatumGetJsonbP(state)))
        bad_outcome(row, "the new state is not a JSON object");
    return state;
}

/* The step to resume at after a wait: the named one (which must exist) or the same step. */
const char *resume_step(const PickedInstance &row, HeapTupleHeader outcome, bool required)
{
    bool isnull;
    Datum step = GetAttributeByNum(outcome, OUTCOME_STEP, &isnull);
    if (isnull) {
        if (required)
            bad_outcome(row, "gd_spawn without a then_step");
        return row.step;
    }
    const char *name = TextDatumGetCString(step);
    if (gd_find_step(row.fsm, row.version, name) == nullptr)
        bad_outcome(row, psprintf("resume at unknown step \"%s\"", name));
    return name;
}

/* A wait or a spawn: parked until resumed at its then_step (a spawn must name one). */
void park(Transition &t, const PickedInstance &row, HeapTupleHeader outcome, Status status, StatEvent event)
{
    t.status = status;
    t.event = event;
    t.then_step = resume_step(row, outcome, status == Status::awaiting_children);
}

/* The error document of a gd_retry or gd_stop outcome: `kind`, "step ... <did>", the user's error. */
Datum outcome_error(const PickedInstance &row, HeapTupleHeader outcome, const char *kind, const char *did)
{
    bool isnull;
    Datum error = GetAttributeByNum(outcome, OUTCOME_ERROR, &isnull);
    return gd_error_document(row, ErrorFields{kind, psprintf("gen_durable: step \"%s\" %s", row.step, did)},
                             isnull ? 0 : error);
}

} // namespace

Transition gd_outcome_transition(const PickedInstance &row, const StepDefinition &def, HeapTupleHeader outcome,
                                 Oid outcome_role)
{
    bool isnull;
    Datum kind_datum = GetAttributeByNum(outcome, OUTCOME_KIND, &isnull);
    if (isnull)
        bad_outcome(row, "the outcome has no kind; build it with gd_next, gd_retry, gd_done or gd_stop");
    char *kind = TextDatumGetCString(kind_datum);

    Transition t = from_step_of(row);
    t.parent_id = 0; /* only an ending instance wakes its parent */
    t.attempt = 1;
    t.external = def.external; /* who runs the current step; gd_next says who runs the next */
    t.claimed = def.external;
    t.history = def.history;
    if (strcmp(kind, "next") == 0) {
        t.event = StatEvent::step_next;
        Datum step = GetAttributeByNum(outcome, OUTCOME_STEP, &isnull);
        if (isnull)
            bad_outcome(row, "gd_next without a step");
        t.step = TextDatumGetCString(step);
        const StepDefinition *next = gd_find_step(row.fsm, row.version, t.step);
        if (next == nullptr)
            bad_outcome(row, psprintf("gd_next to unknown step \"%s\"", t.step));
        t.state = outcome_state(row, outcome);
        Datum delay = GetAttributeByNum(outcome, OUTCOME_DELAY, &isnull);
        int64 delay_us = isnull ? 0 : interval_usecs(delay);
        if (delay_us < 0)
            bad_outcome(row, "gd_next with a negative delay");
        t.status = Status::runnable;
        t.eligible_at += delay_us;
        t.external = next->external;
        /* To the next step's own queue, or home from a step with a queue of its
         * own (an instance is away from home only at such a step). */
        if (next->queue[0] != '\0') {
            t.route = pstrdup(next->queue);
            t.moved = strcmp(t.route, row.queue) != 0;
        } else {
            t.moved = def.queue[0] != '\0';
        }
        /* From one in-database step straight to the next in the same queue, the
         * row keeps its place: every indexed column stays as it was, so the
         * update can be HOT (no new index entries, none left for vacuum). */
        if (delay_us == 0 && !t.external && !t.moved && !def.external)
            t.eligible_at = row.eligible_at;
        return t;
    }
    if (strcmp(kind, "retry") == 0) {
        Datum error_json = outcome_error(row, outcome, "retry", "asked to run again");
        Datum backoff = GetAttributeByNum(outcome, OUTCOME_BACKOFF, &isnull);
        int64 backoff_us = isnull ? -1 : interval_usecs(backoff);
        if (!isnull && backoff_us < 0)
            bad_outcome(row, "gd_retry with a negative backoff");
        return gd_retry_transition(row, def, error_json, backoff_us);
    }
    if (strcmp(kind, "done") == 0) {
        Datum result = GetAttributeByNum(outcome, OUTCOME_RESULT, &isnull);
        Transition done = gd_final_transition(row, Status::done, isnull ? empty_object() : result, 0);
        done.external = t.external;
        done.history = def.history;
        return done;
    }
    if (strcmp(kind, "stop") == 0) {
        Datum error_json = outcome_error(row, outcome, "stop", "stopped its instance");
        Transition stopped = gd_final_transition(row, Status::failed, 0, error_json);
        stopped.external = t.external;
        stopped.history = def.history;
        return stopped;
    }
    if (strcmp(kind, "await") == 0) {
        park(t, row, outcome, Status::awaiting_signal, StatEvent::step_await);
        t.wait_names = GetAttributeByNum(outcome, OUTCOME_SIGNAL_NAMES, &isnull);
        if (isnull || !gd_signal_names_ok(DatumGetArrayTypeP(t.wait_names)))
            bad_outcome(row, "gd_wait_signal needs signal names: a one-dimensional array of non-empty names");
        Datum timeout = GetAttributeByNum(outcome, OUTCOME_TIMEOUT, &isnull);
        if (!isnull) {
            int64 timeout_us = interval_usecs(timeout);
            if (timeout_us < 0)
                bad_outcome(row, "gd_wait_signal with a negative timeout");
            t.wait_deadline = t.eligible_at + timeout_us;
        }
        t.state = outcome_state(row, outcome);
        return t;
    }
    if (strcmp(kind, "schedule_childs") == 0) {
        park(t, row, outcome, Status::awaiting_children, StatEvent::step_spawn);
        t.children = GetAttributeByNum(outcome, OUTCOME_CHILDREN, &isnull);
        if (isnull)
            bad_outcome(row, "gd_spawn without children");
        t.spawn_role = outcome_role;
        t.state = outcome_state(row, outcome);
        return t;
    }
    bad_outcome(row, psprintf("unknown outcome kind \"%s\"", kind));
}

const char *gd_status_name(Status status)
{
    static const char *const names[] = {"runnable", "executing", "awaiting_signal", "awaiting_children",
                                        "done",     "failed",    "cancelled"};
    return names[static_cast<int>(status)];
}

namespace {

/* The names of the statuses that are live (or not), in their order. */
Datum status_names(bool live)
{
    Datum names[static_cast<int>(Status::cancelled) + 1];
    int count = 0;
    for (int s = 0; s <= static_cast<int>(Status::cancelled); s++)
        if (gd_status_is_live(static_cast<Status>(s)) == live)
            names[count++] = CStringGetTextDatum(gd_status_name(static_cast<Status>(s)));
    return PointerGetDatum(construct_array(names, count, TEXTOID, -1, false, TYPALIGN_INT));
}

} // namespace

/* gd._live_statuses() → text[]: the statuses of an instance still going. */
GD_SQL_FUNCTION(gd_live_statuses)
{
    PG_RETURN_DATUM(status_names(true));
}

/* gd._terminal_statuses() → text[]: the statuses an instance ends in. */
GD_SQL_FUNCTION(gd_terminal_statuses)
{
    PG_RETURN_DATUM(status_names(false));
}

Transition gd_final_transition(const PickedInstance &row, Status status, Datum result, Datum error)
{
    Transition t = from_step_of(row);
    t.status = status;
    t.attempt = row.attempt;
    t.result = result;
    t.error = error;
    t.event = status == Status::done     ? StatEvent::step_done
              : status == Status::failed ? StatEvent::step_stop
                                         : StatEvent::count_;
    return t;
}

namespace {

void prepare_plans()
{
    if (spawn_plan != nullptr)
        return; /* the last one prepared: all are (a failed preparation leaves the rest to the next call) */
    static bool callback_registered = false;
    if (!callback_registered) {
        RegisterXactCallback(forget_keys_at_transaction_end, nullptr);
        callback_registered = true;
    }
    if (update_plan == nullptr) {
        Oid types[15] = {INT8OID,  TEXTOID,  TEXTOID, JSONBOID,     INT4OID,        TIMESTAMPTZOID, JSONBOID,
                         JSONBOID, BOOLOID, TEXTARRAYOID, TIMESTAMPTZOID, TEXTOID, BOOLOID,     BOOLOID, TEXTOID};
        update_plan = gd_prepare_kept("UPDATE gd._instances SET status = $2, step = $3, state = coalesce($4, state),"
                                      "       attempt = $5, eligible_at = $6, result = $7, error = $8, external = $9,"
                                      "       wait_names = $10, wait_deadline = $11, wait_then_step = $12,"
                                      "       resume = CASE WHEN $13 THEN resume END,"
                                      "       visit_key = CASE WHEN $13 OR $2 IN ('done', 'failed', 'cancelled') THEN visit_key"
                                      "                        ELSE gen_random_uuid() END,"
                                      /* moved ($14): gd._route($15, the home queue) */
                                      "       queue = CASE WHEN $14 THEN coalesce($15, home_queue, queue) ELSE queue END,"
                                      "       home_queue = CASE WHEN NOT $14 THEN home_queue"
                                      "                         WHEN $15 <> coalesce(home_queue, queue)"
                                      "                         THEN coalesce(home_queue, queue) END,"
                                      "       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,"
                                      "       updated_at = clock_timestamp(),"
                                      "       finished_at = CASE WHEN $2 IN ('done', 'failed', 'cancelled')"
                                      "                          THEN clock_timestamp() END"
                                      " WHERE id = $1 RETURNING queue, priority, eligible_at, id",
                                      15, types);
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
    if (t.status != Status::awaiting_children)
        return;
    prepare_plans();
    Datum args[3] = {ObjectIdGetDatum(t.spawn_role), Int64GetDatum(id), t.children};
    if (gd_execute_kept(spawn_plan, args, nullptr, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "gen_durable: spawning the children of instance " INT64_FORMAT " failed", id);
    bool isnull;
    t.spawned = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

namespace {

/* What follows a written transition, whichever way it was written (history rows into `history`, if given). */
void after_transition(int64 id, const Transition &t, HistoryBatch *history = nullptr)
{
    if (t.event != StatEvent::count_)
        gd_record_finished_step(id, t, history);
    if (t.status == Status::awaiting_signal) {
        call_follow_up(wake_if_signalled_plan, id, 0); /* signals that arrived before the wait */
        if (t.wait_deadline != 0)
            gd_wake_reaper_at_commit(); /* it sleeps until the earliest deadline: this one may be earlier */
    } else if (t.status == Status::awaiting_children && t.spawned == 0) {
        gd_resume_parents(id); /* nothing to wait for */
    } else if (t.parent_id != 0 && (t.status == Status::done || t.status == Status::failed)) {
        gd_wake_reaper_at_commit(); /* perhaps the last child: the reaper resumes the parent */
    }
    if (t.scheduled && !gd_status_is_live(t.status))
        gd_wake_reaper_at_commit(); /* a buffer_one schedule may hold a tick back until this one ends */
    if (gd_events == GD_EVENTS_TRANSITIONS)
        gd_emit_transition_event(id, t);
    bool still_running = t.status == Status::runnable || t.status == Status::executing;
    if (t.concurrency_key != nullptr && !still_running)
        remember_key_to_release(t.owner, t.concurrency_key);
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

Datum gd_array_of(Datum *values, bool *nulls, int count, Oid type)
{
    int16 length;
    bool by_value;
    char align;
    get_typlenbyvalalign(type, &length, &by_value, &align);
    int dims[1] = {count};
    int lower_bounds[1] = {1};
    return PointerGetDatum(construct_md_array(values, nulls, 1, dims, lower_bounds, type, length, by_value, align));
}

void gd_write_transition(int64 id, const Transition &t)
{
    prepare_plans();
    Datum args[15] = {Int64GetDatum(id),   CStringGetTextDatum(gd_status_name(t.status)),
                      CStringGetTextDatum(t.step), t.state,
                      Int32GetDatum(t.attempt),    TimestampTzGetDatum(t.eligible_at),
                      t.result,            t.error,
                      BoolGetDatum(t.external),    t.wait_names,
                      TimestampTzGetDatum(t.wait_deadline), t.then_step ? CStringGetTextDatum(t.then_step) : 0,
                      BoolGetDatum(t.same_visit), BoolGetDatum(t.moved),
                      t.route ? CStringGetTextDatum(t.route) : 0};
    char nulls[15] = {' ', ' ', ' ', t.state ? ' ' : 'n', ' ', ' ', t.result ? ' ' : 'n', t.error ? ' ' : 'n', ' ',
                      t.wait_names ? ' ' : 'n', t.wait_deadline ? ' ' : 'n', t.then_step ? ' ' : 'n', ' ', ' ',
                      t.route ? ' ' : 'n'};
    if (gd_execute_kept(update_plan, args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: could not record the transition of instance " INT64_FORMAT, id);
    if (SPI_processed == 0) {
        /* Its own step deleted the row: nothing is left to move on. */
        ereport(WARNING, (errmsg("gen_durable: instance " INT64_FORMAT " was deleted during its step \"%s\"", id,
                                 t.step)));
        return;
    }
    if (t.moved && !t.external && t.status == Status::runnable)
        wake_for_returned(0); /* not its executors' */
    after_transition(id, t);
}

void gd_begin_transitions(TransitionBatch &batch, Status locked_status, int capacity)
{
    batch.locked_status = locked_status;
    batch.count = 0;
    batch.capacity = Max(capacity, 1);
    batch.ids = static_cast<int64 *>(palloc(sizeof(int64) * batch.capacity));
    batch.items = static_cast<Transition *>(palloc(sizeof(Transition) * batch.capacity));
}

void gd_write_transition_batched(TransitionBatch &batch, int64 id, const Transition &t)
{
    /* Plain: what the batch's statement writes (it leaves the queues as they are). */
    bool plain = !t.moved && (t.status == Status::runnable || t.status == Status::done || t.status == Status::failed);
    if (!plain || batch.count >= batch.capacity) {
        gd_write_transition(id, t);
        return;
    }
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
        Oid types[11] = {INT8ARRAYOID, TEXTARRAYOID,        TEXTARRAYOID, JSONBARRAYOID, INT4ARRAYOID,
                         TIMESTAMPTZARRAYOID, JSONBARRAYOID, JSONBARRAYOID, BOOLARRAYOID, BOOLARRAYOID, TEXTOID};
        batch_update_plan = gd_prepare_kept(
            "UPDATE gd._instances i SET status = t.status, step = t.step, state = coalesce(t.state, i.state),"
            "       attempt = t.attempt, eligible_at = t.eligible_at, result = t.result, error = t.error,"
            "       external = t.external, wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,"
            "       resume = CASE WHEN t.same_visit THEN i.resume END,"
            /* an instance that ends keeps its step's key: gd_retry(id) retries that visit */
            "       visit_key = CASE WHEN t.same_visit OR t.status IN ('done', 'failed', 'cancelled') THEN i.visit_key"
            "                        ELSE gen_random_uuid() END,"
            "       lease_owner = NULL, lease_token = NULL,"
            "       lease_expires_at = NULL, updated_at = clock_timestamp(),"
            "       finished_at = CASE WHEN t.status IN ('done', 'failed', 'cancelled') THEN clock_timestamp() END"
            /* unnest in the select list (ProjectSet): element by element, not ten tuplestores */
            "  FROM (SELECT unnest($1) AS id, unnest($2) AS status, unnest($3) AS step, unnest($4) AS state,"
            "               unnest($5) AS attempt, unnest($6) AS eligible_at, unnest($7) AS result,"
            "               unnest($8) AS error, unnest($9) AS external, unnest($10) AS same_visit) t"
            /* = ANY: an index scan of just these rows, whatever the join order */
            " WHERE i.id = t.id AND i.id = ANY ($1) AND i.status = $11"
            " RETURNING i.id",
            11, types);
    }
    int n = batch.count;
    Datum *ids = datums(n), *statuses = datums(n), *steps = datums(n), *states = datums(n), *attempts = datums(n),
          *eligible = datums(n), *results = datums(n), *errors = datums(n), *externals = datums(n),
          *keeps = datums(n);
    bool *state_nulls = flags(n), *result_nulls = flags(n), *error_nulls = flags(n);
    for (int i = 0; i < n; i++) {
        const Transition &t = batch.items[i];
        ids[i] = Int64GetDatum(batch.ids[i]);
        statuses[i] = CStringGetTextDatum(gd_status_name(t.status));
        steps[i] = CStringGetTextDatum(t.step);
        states[i] = t.state;
        state_nulls[i] = t.state == 0;
        attempts[i] = Int32GetDatum(t.attempt);
        eligible[i] = TimestampTzGetDatum(t.eligible_at);
        results[i] = t.result;
        result_nulls[i] = t.result == 0;
        errors[i] = t.error;
        error_nulls[i] = t.error == 0;
        externals[i] = BoolGetDatum(t.external);
        keeps[i] = BoolGetDatum(t.same_visit);
    }
    Datum args[11] = {gd_array_of(ids, nullptr, n, INT8OID),          gd_array_of(statuses, nullptr, n, TEXTOID),
                      gd_array_of(steps, nullptr, n, TEXTOID),        gd_array_of(states, state_nulls, n, JSONBOID),
                      gd_array_of(attempts, nullptr, n, INT4OID),     gd_array_of(eligible, nullptr, n, TIMESTAMPTZOID),
                      gd_array_of(results, result_nulls, n, JSONBOID), gd_array_of(errors, error_nulls, n, JSONBOID),
                      gd_array_of(externals, nullptr, n, BOOLOID),    gd_array_of(keeps, nullptr, n, BOOLOID),
                      CStringGetTextDatum(gd_status_name(batch.locked_status))};
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
    HistoryBatch *history = gd_begin_history(n);
    for (int i = 0; i < n; i++)
        if (bsearch(&batch.ids[i], written, written_count, sizeof(int64), compare_ids) != nullptr)
            after_transition(batch.ids[i], batch.items[i], history);
    gd_write_history(history);
    pfree(written);
}

namespace {

/* Let the best waiting instances under the owner's key run, as far as there is room; returns how many. */
int admit_gated(Oid owner, const char *key)
{
    static SPIPlanPtr room_plan = nullptr, admit_plan = nullptr;
    Datum args[3] = {ObjectIdGetDatum(owner), CStringGetTextDatum(key), 0};
    /* gd._key_room locks the key: admissions and releases under it take turns */
    if (gd_run_kept(room_plan, "SELECT gd._key_room($1, $2)", {OIDOID, TEXTOID}, args, false, 1) != SPI_OK_SELECT ||
        SPI_processed != 1)
        elog(ERROR, "gen_durable: counting the room under concurrency key \"%s\" failed", key);
    bool isnull;
    int room = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    if (room <= 0)
        return 0;
    args[2] = Int32GetDatum(room);
    if (gd_run_kept(admit_plan,
                    "UPDATE gd._instances i SET gated = false"
                    " WHERE i.id IN (SELECT gd._gated_best($1, $2, (gd._key_limit($2)).shared, $3))"
                    " RETURNING " WOKEN_COLUMNS,
                    {OIDOID, TEXTOID, INT4OID}, args, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: admitting instances under concurrency key \"%s\" failed", key);
    int admitted = static_cast<int>(SPI_processed);
    for (int i = 0; i < admitted; i++)
        wake_for_returned(i);
    gd_count_limit(LimitKind::concurrency, key, LimitCounts{0, static_cast<uint64>(admitted), 0, 0});
    return admitted;
}

/* Make room under each key of `keys` (sorted here: the order every path takes key locks in); how many ran. */
int ungate(OwnedKey *keys, int count)
{
    if (count == 0)
        return 0;
    qsort(keys, count, sizeof(keys[0]), compare_keys);
    int admitted = 0;
    for (int i = 0; i < count; i++)
        if (i == 0 || compare_keys(&keys[i], &keys[i - 1]) != 0)
            admitted += admit_gated(keys[i].owner, keys[i].key);
    return admitted;
}

} // namespace

void gd_release_concurrency_keys()
{
    int count = keys_to_release_count;
    keys_to_release_count = 0; /* the array stays, for the transaction's next keys */
    (void) ungate(keys_to_release, count);
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
                    " WHERE i.fsm = $1 AND i.version = $2 AND i.step = $3 AND i.status IN ('runnable', 'executing')"
                    " RETURNING " WOKEN_COLUMNS,
                    {TEXTOID, INT4OID, TEXTOID, TEXTOID}, fcinfo, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: moving the instances at a step failed");
    for (uint64 r = 0; r < SPI_processed; r++)
        wake_for_returned(r);
    SPI_finish();
    PG_RETURN_VOID();
}

/*
 * gd._ungate(owners oid[], keys text[]) → int: make room under each (owner,
 * key) pair, in the runners' key order, for the SQL paths (a limit raised,
 * the reaper's repair); how many instances may run now.
 */
GD_SQL_FUNCTION(gd_ungate)
{
    Datum *owners, *keys;
    bool *owner_nulls, *key_nulls;
    int owner_count, key_count;
    deconstruct_array(PG_GETARG_ARRAYTYPE_P(0), OIDOID, sizeof(Oid), true, TYPALIGN_INT, &owners, &owner_nulls,
                      &owner_count);
    deconstruct_array(PG_GETARG_ARRAYTYPE_P(1), TEXTOID, -1, false, TYPALIGN_INT, &keys, &key_nulls, &key_count);
    if (owner_count != key_count)
        elog(ERROR, "gen_durable: gd._ungate takes as many owners as keys, got %d and %d", owner_count, key_count);
    OwnedKey *pairs = static_cast<OwnedKey *>(palloc(sizeof(OwnedKey) * Max(key_count, 1)));
    for (int i = 0; i < key_count; i++)
        pairs[i] = OwnedKey{DatumGetObjectId(owners[i]), TextDatumGetCString(keys[i])};
    SPI_connect();
    int admitted = ungate(pairs, key_count);
    SPI_finish();
    PG_RETURN_INT32(admitted);
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
            "   SET status = 'runnable', step = i.wait_then_step, attempt = 1, resume = $2,"
            "       gated = gd._must_gate(i.owner, i.concurrency_key),"
            "       external = coalesce((SELECT external FROM next), false),"
            "       queue = (gd._route((SELECT queue FROM next), coalesce(i.home_queue, i.queue))).queue,"
            "       home_queue = (gd._route((SELECT queue FROM next), coalesce(i.home_queue, i.queue))).home_queue,"
            "       wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,"
            "       eligible_at = clock_timestamp(), updated_at = clock_timestamp()"
            " WHERE i.id = $1 RETURNING " WOKEN_COLUMNS,
        {INT8OID, JSONBOID}, args, false, 0);
    if (result != SPI_OK_UPDATE_RETURNING || SPI_processed != 1)
        elog(ERROR, "gen_durable: could not resume instance " INT64_FORMAT, id);
    wake_for_returned(0);
    gd_wake_awaiters_at_commit(id);
    gd_emit_event_after(event);
}

int gd_resume_parents(int64 parent, const DueScope *scope)
{
    /* The parents whose children have all ended, locked; all of them, or the one given. */
#define ENDED_FAMILIES                                                                                         \
    "SELECT p.id FROM gd._instances p"                                                                        \
    " WHERE p.status = 'awaiting_children' AND NOT EXISTS ("                                                  \
    "       SELECT FROM gd._instances c WHERE c.parent_id = p.id"                                              \
    "          AND c.status IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children'))"
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
                    "   SET status = 'runnable', attempt = 1, error = NULL, result = NULL, finished_at = NULL,"
                    "       gated = gd._must_gate(i.owner, i.concurrency_key),"
                    "       eligible_at = clock_timestamp(), updated_at = clock_timestamp()"
                    " WHERE i.id = $2 AND i.status = 'failed' AND gd._may_use_instance($1, i.owner, i.fsm)"
                    " RETURNING " WOKEN_COLUMNS,
                    {OIDOID, INT8OID}, fcinfo, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: retrying instance " INT64_FORMAT " failed", PG_GETARG_INT64(1));
    bool revived = SPI_processed == 1;
    if (revived) {
        wake_for_returned(0);
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
            "   SET status = 'cancelled', gated = false,"
            "       error = jsonb_build_object('kind', 'cancelled',"
            "                                  'message', 'gen_durable: cancelled' || coalesce(': ' || $2, ''),"
            "                                  'reason', coalesce($2, ''), 'step', i.step, 'attempt', i.attempt),"
            "       wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,"
            "       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,"
            "       finished_at = clock_timestamp(), updated_at = clock_timestamp()"
            "  FROM tree, gd._instances before"
            " WHERE i.id = tree.id AND before.id = tree.id AND i.status = ANY (gd._live_statuses())"
            " RETURNING i.id, i.owner, i.concurrency_key, i.parent_id, i.fsm, i.version, i.step, before.status,"
            "           i.attempt",
            2, types);
    }
    if (gd_execute_kept(cancel_plan, args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: cancelling instance " INT64_FORMAT " failed", target);
    SPITupleTable *cancelled = SPI_tuptable; /* kept: making room runs statements of its own */
    int count = static_cast<int>(SPI_processed);
    OwnedKey *freed = static_cast<OwnedKey *>(palloc(sizeof(OwnedKey) * Max(count, 1)));
    int freed_count = 0;
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
            freed[freed_count++] = OwnedKey{owner, TextDatumGetCString(key)};
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
    (void) ungate(freed, freed_count);
    if (has_parent)
        gd_wake_reaper_at_commit();
    SPI_finish();
    PG_RETURN_VOID();
}

void gd_postpone(int64 id, TimestampTz until)
{
    static SPIPlanPtr postpone_plan = nullptr;
    Datum args[2] = {Int64GetDatum(id), TimestampTzGetDatum(until)};
    if (gd_run_kept(postpone_plan, "UPDATE gd._instances SET eligible_at = $2 WHERE id = $1", {INT8OID, TIMESTAMPTZOID},
                    args, false, 0) != SPI_OK_UPDATE)
        elog(ERROR, "gen_durable: could not postpone instance " INT64_FORMAT, id);
}

void gd_apply_transition(int64 id, Transition t)
{
    gd_prepare_transition(id, t);
    gd_write_transition(id, t);
    gd_release_concurrency_keys();
}

Transition gd_retry_transition(const PickedInstance &row, const StepDefinition &def, Datum error,
                               int64 explicit_backoff_us)
{
    Transition t = gd_final_transition(row, row.attempt >= def.max_attempts ? Status::failed : Status::runnable, 0, error);
    t.event = StatEvent::step_retry;
    t.external = def.external; /* the same step: the same kind of runner */
    t.claimed = t.external;
    t.history = def.history;
    t.same_visit = true;                    /* the retried step sees what its first attempt saw */
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
    delay_us = Min(delay_us, MAX_DELAY_US);
    t.status = Status::runnable;
    t.attempt = row.attempt + 1;
    t.eligible_at += delay_us;
    return t;
}

Transition gd_failed_at_once(const PickedInstance &row, int sqlerrcode, const char *message)
{
    ErrorFields fields{"undefined", message};
    fields.sqlstate = unpack_sql_state(sqlerrcode);
    return gd_final_transition(row, Status::failed, 0, gd_error_document(row, fields));
}
