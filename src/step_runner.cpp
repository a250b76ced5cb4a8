/*
 * step_runner.cpp — running a batch of picked steps.  Each handler runs as
 * the FSM's owner, isolated (handler_call.cpp), under the step's timeout,
 * after its rate limits admitted it, inside a subtransaction: its outcome is validated (and a spawn's
 * children inserted) there; if the handler raises, overruns its timeout,
 * returns NULL or a bad outcome, the subtransaction is rolled back (its
 * effects vanish) and the attempt is recorded as a retry with the error.
 * The batch's handlers share one subtransaction while none raises; when one
 * does, the others run again each in its own (see run_together).  The
 * transitions are written in the round's own transaction, the plain ones
 * together at the end of the batch, so a step's effects and its instance's
 * new state commit together.  gd_cancel stops a step running here through
 * gd._interrupt_step.
 *
 * A batch step's rows of the round (same FSM, version and step) run as one
 * unit: its handler is called once for up to `batch` of them (units of one
 * row otherwise), and the unit's outcomes, one per row, become their
 * transitions; a unit fails or succeeds whole.  A batch that cannot fill
 * waits, up to the step's batch_wait since its oldest row's last change
 * (hold_for_batches).
 *
 * Chains: an executor's step that goes on with gd_next to a step it can run
 * now (same queue, no delay, in the database, not a batch step, no rate
 * limit, a first attempt, both steps chain => true) runs that step too, in a
 * further wave of the same round, up to gen_durable.chain_limit steps of the
 * instance and while the round is within batch_time; its row is written once,
 * where the chain stops (parks, ends, raises, or goes on in a later round),
 * and the transitions before carry their telemetry along (RanStep.before).
 * A chained step runs in the wave's subtransaction like any other: one that
 * raises loses only its own effects, the steps before it commit with the row
 * at the raising step.  A gd_cancel is honoured between waves.  gd._execute
 * and gd_drain run one step per instance per call.
 */
#include "step_runner.hpp"
#include "concurrency_keys.hpp"
#include "crashed_steps.hpp"
#include "error_documents.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
#include "handler_call.hpp"
#include "instance_status.hpp"
#include "labelled_stats.hpp"
#include "outcomes.hpp"
#include "picker.hpp"
#include "rate_limits.hpp"
#include "step_definitions.hpp"
#include "transition.hpp"

extern "C" {
#include "utils/resowner.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/typcache.h"
}

#include <csignal>
#include <type_traits>
#include <utility>

namespace {

/*
 * The batch in hand, palloc'd in the round's memory context: nothing in it
 * has a destructor for an ERROR's longjmp to skip, and each call of the
 * runner has its own.
 */
struct Round {
    const char *queue;
    WorkerSlot *slot;          /* the executor's, or nullptr in a backend */
    PickedInstance *rows;      /* the picked rows */
    int count;
    int *to_run;               /* per step to run: its row */
    StepDefinition *definitions;
    Transition *transitions;
    int to_run_count;
    int *unit_end;             /* per unit of steps run together (a batch, or one row): past its last to_run */
    int unit_count;
    TransitionBatch written;   /* the plain transitions, written together at the end */
    int64 *cancelling;         /* instances a gd_cancel is stopping now: left be */
    int cancelling_count;
    TimestampTz started;       /* chains go on while the round is within batch_time of this */
    int *going_on;             /* rows whose instance goes on to its next step in the next wave (a chain) */
    int going_on_count;
};
static_assert(std::is_trivially_destructible_v<Round>, "a Round lives in palloc'd memory");

/* A batch run together raised: this process's next batch runs isolated. */
bool last_batch_raised = false;

template <class T>
T *round_array(int count)
{
    return static_cast<T *>(palloc(sizeof(T) * Max(count, 1)));
}

/* How long after a gd_cancel asked an executor to stop a step a cancel it meets is taken for that one's. */
constexpr int64 CANCEL_REQUEST_US = 10 * USECS_PER_SEC;

/*
 * Was a step of this round stopped by a gd_cancel (gd._interrupt_step)?  Its
 * own instance's, which gd_cancel ends; or, the cancel arriving late, after
 * that step ended, another's, which runs again in a later round, no attempt
 * counted (not the whole round rolled back).
 */
bool stopped_by_gd_cancel(WorkerSlot *slot)
{
    if (slot == nullptr || pg_atomic_read_u64(&slot->cancel_step) == 0)
        return false;
    TimestampTz asked = static_cast<TimestampTz>(pg_atomic_read_u64(&slot->cancel_requested_at));
    return GetCurrentTimestamp() - asked < CANCEL_REQUEST_US;
}

/*
 * The instances of this database whose running step a gd_cancel stopped, in
 * a transaction still open, into `out` (room for MaxBackends); how many.  A
 * round leaves them be (postponed a moment): an executor picking one again
 * the instant its step was stopped, or its executor ended, would win its row
 * from the canceller every time.
 */
int cancels_under_way(int64 *out)
{
    int count = 0;
    for (int i = 0; i < MaxBackends; i++) {
        BackendWaitSlot &backend = gd_shared->wait_slots[i];
        uint64 instance = pg_atomic_read_u64(&backend.cancelling);
        pg_read_barrier();
        if (instance != 0 && backend.database_oid == MyDatabaseId)
            out[count++] = static_cast<int64>(instance);
    }
    return count;
}

/* The gd_cancel of this backend is done with, at its transaction's end. */
void forget_cancel_at_transaction_end(XactEvent event, void *)
{
    if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_COMMIT &&
        event != XACT_EVENT_PARALLEL_ABORT && event != XACT_EVENT_PREPARE)
        return;
    BackendWaitSlot *me = gd_my_wait_slot();
    if (me != nullptr && pg_atomic_exchange_u64(&me->cancelling, 0) != 0)
        pg_atomic_fetch_sub_u32(&gd_shared->cancelling_backends, 1);
}

/* In the canceller's backend: executors leave `instance` be until this transaction ends. */
void publish_cancel(int64 instance)
{
    static bool callback_registered = false;
    BackendWaitSlot *me = gd_my_wait_slot();
    if (me == nullptr)
        return;
    if (!callback_registered) {
        RegisterXactCallback(forget_cancel_at_transaction_end, nullptr);
        callback_registered = true;
    }
    me->database_oid = MyDatabaseId;
    pg_write_barrier();
    if (pg_atomic_exchange_u64(&me->cancelling, static_cast<uint64>(instance)) == 0)
        pg_atomic_fetch_add_u32(&gd_shared->cancelling_backends, 1);
}

/* The cancels under way now, for the wave about to start (see cancels_under_way). */
void note_cancels_under_way(Round &round)
{
    if (round.slot == nullptr || pg_atomic_read_u32(&gd_shared->cancelling_backends) == 0) {
        round.cancelling_count = 0;
        return;
    }
    if (round.cancelling == nullptr)
        round.cancelling = round_array<int64>(MaxBackends);
    round.cancelling_count = cancels_under_way(round.cancelling);
}

/*
 * Leave a row its canceller is about to take for a second: as picked, or,
 * mid-chain, written where the chain got to (the steps that ran stay done).
 */
void leave_for_canceller(Round &round, const PickedInstance &row)
{
    TimestampTz until = GetCurrentTimestamp() + USECS_PER_SEC;
    if (row.arrived_by == nullptr) {
        gd_postpone(row.id, until);
        return;
    }
    Transition arrived = *row.arrived_by;
    arrived.to.eligible_at = until;
    gd_write_transition_batched(round.written, row.id, arrived);
}

/* What the first pass decided for a picked row. */
enum class Disposition { handled, throttled, to_run };

/*
 * The first pass over a picked row, in the round's own transaction: a row
 * whose definition, handler or owner was dropped fails at once (one whose
 * version has no steps yet waits: a restore); the rest are to run (once
 * their rate limits admit them: admit_and_hand_over), with their definition
 * copied into `def` (the cache may be emptied while handlers run).
 */
Disposition prepare_step(Round &round, const PickedInstance &row, StepDefinition &def)
{
    for (int c = 0; c < round.cancelling_count; c++)
        if (round.cancelling[c] == row.id) {
            leave_for_canceller(round, row);
            return Disposition::throttled;
        }
    std::optional<StepDefinition> found = gd_find_step(row.fsm, row.version, row.step);
    if (!found && gd_version_not_ready(row.fsm, row.version)) {
        gd_postpone(row.id, GetCurrentTimestamp() + USECS_PER_SEC); /* a restore: look again in a second */
        return Disposition::throttled;
    }
    if (!found) {
        /* The definition was dropped under a live instance: fail it rather than spin. */
        gd_apply_transition(row.id, gd_failed_at_once(row, ERRCODE_UNDEFINED_OBJECT, "gen_durable: step is no longer defined"), StatusWriter::step);
        return Disposition::handled;
    }
    def = *found;
    HandlerGone gone;
    if (!def.external && gd_handler_gone(row, def, &gone)) {
        gd_apply_transition(row.id, gd_failed_at_once(row, gone.sqlerrcode, gone.message), StatusWriter::step);
        return Disposition::handled;
    }
    return Disposition::to_run;
}

/*
 * The second pass, over the steps the first left to run: their rate limits
 * admit them or hold them back, all in one statement; a step that became
 * external (redefined) is handed to external workers.  The round's to_run
 * and definitions keep the rest, in order.  Returns how many were handled
 * (handed over or left to run).
 */
int admit_and_hand_over(Round &round)
{
    const PickedInstance **rows = round_array<const PickedInstance *>(round.to_run_count);
    const StepDefinition **definitions = round_array<const StepDefinition *>(round.to_run_count);
    for (int k = 0; k < round.to_run_count; k++) {
        rows[k] = &round.rows[round.to_run[k]];
        definitions[k] = &round.definitions[k];
    }
    bool *admitted = round_array<bool>(round.to_run_count);
    gd_admit_rates(rows, definitions, round.to_run_count, admitted);
    int handled = 0, kept = 0;
    for (int k = 0; k < round.to_run_count; k++) {
        const PickedInstance &row = round.rows[round.to_run[k]];
        const StepDefinition &def = round.definitions[k];
        if (!admitted[k])
            continue; /* it runs when its tokens are there */
        handled++;
        if (def.external) {
            /* Now an external step (redefined): hand it to external workers. */
            Transition t = gd_final_transition(row, Status::runnable, 0, 0);
            t.to.external = true;
            gd_apply_transition(row.id, t, StatusWriter::step);
            continue;
        }
        round.to_run[kept] = round.to_run[k];
        round.definitions[kept++] = def;
    }
    round.to_run_count = kept;
    return handled;
}

bool same_step(const PickedInstance &a, const PickedInstance &b)
{
    return a.version == b.version && strcmp(a.step, b.step) == 0 && strcmp(a.fsm, b.fsm) == 0;
}

/*
 * Leave for later the rows of a batch step that cannot fill its batch now:
 * fewer of them in the round than its batch (or than the round could hold),
 * the oldest changed less than batch_wait ago.  They are postponed until the
 * oldest has waited batch_wait (their last change, updated_at, stays: they
 * run then, however few).  A drain with its scheduled steps waits for none.
 * Returns how many rows were left.
 */
int hold_for_batches(Round &round, int demand, const DrainScope *drain)
{
    if (drain != nullptr && drain->with_scheduled)
        return 0;
    bool *decided = round_array<bool>(round.to_run_count);
    bool *held = round_array<bool>(round.to_run_count);
    int64 *ids = round_array<int64>(round.to_run_count);
    TimestampTz *until = round_array<TimestampTz>(round.to_run_count);
    int held_count = 0;
    TimestampTz now = GetCurrentTimestamp();
    for (int k = 0; k < round.to_run_count; k++)
        decided[k] = held[k] = false;
    for (int k = 0; k < round.to_run_count; k++) {
        const StepDefinition &def = round.definitions[k];
        if (decided[k] || def.batch <= 1 || def.batch_wait_us <= 0)
            continue;
        const PickedInstance &row = round.rows[round.to_run[k]];
        int members = 0;
        TimestampTz oldest = row.updated_at;
        for (int j = k; j < round.to_run_count; j++)
            if (!decided[j] && same_step(row, round.rows[round.to_run[j]])) {
                members++;
                oldest = Min(oldest, round.rows[round.to_run[j]].updated_at);
            }
        bool wait = members < Min(def.batch, demand) && now < oldest + def.batch_wait_us;
        for (int j = k; j < round.to_run_count; j++)
            if (!decided[j] && same_step(row, round.rows[round.to_run[j]])) {
                decided[j] = true;
                if (wait) {
                    held[j] = true;
                    ids[held_count] = round.rows[round.to_run[j]].id;
                    until[held_count++] = oldest + def.batch_wait_us;
                }
            }
    }
    if (held_count == 0)
        return 0;
    gd_postpone_all(ids, until, held_count);
    int kept = 0;
    for (int k = 0; k < round.to_run_count; k++)
        if (!held[k]) {
            round.to_run[kept] = round.to_run[k];
            round.definitions[kept++] = round.definitions[k];
        }
    round.to_run_count = kept;
    return held_count;
}

/*
 * Order the steps to run into units: each row of a single step alone, the
 * rows of a batch step together, up to its batch in each unit (in the
 * order they were picked in).
 */
void form_units(Round &round)
{
    int count = round.to_run_count;
    int *order = round_array<int>(count);
    StepDefinition *definitions = round_array<StepDefinition>(count);
    bool *placed = round_array<bool>(count);
    round.unit_end = round_array<int>(count);
    round.unit_count = 0;
    for (int k = 0; k < count; k++)
        placed[k] = false;
    int next = 0;
    for (int k = 0; k < count; k++) {
        if (placed[k])
            continue;
        const StepDefinition &def = round.definitions[k];
        const PickedInstance &row = round.rows[round.to_run[k]];
        int in_unit = 0;
        for (int j = k; j < count; j++) {
            if (placed[j] || (j > k && (def.batch <= 1 || !same_step(row, round.rows[round.to_run[j]]))))
                continue;
            if (in_unit == Max(def.batch, 1)) {
                round.unit_end[round.unit_count++] = next;
                in_unit = 0;
            }
            placed[j] = true;
            order[next] = round.to_run[j];
            definitions[next++] = round.definitions[j];
            in_unit++;
            if (def.batch <= 1)
                break;
        }
        round.unit_end[round.unit_count++] = next;
    }
    round.to_run = order;
    round.definitions = definitions;
}

int unit_start(const Round &round, int unit)
{
    return unit == 0 ? 0 : round.unit_end[unit - 1];
}

/* Call a step's handler and turn its outcome into a transition (children spawned); may raise. */
Transition run_handler(const PickedInstance &row, const StepDefinition &def, const char *queue)
{
    TimestampTz started = GetCurrentTimestamp();
    HeapTupleHeader outcome = gd_call_handler(row, def, queue);
    Transition t = gd_outcome_transition(row, def, outcome, def.owner);
    if (t.to.status == Status::awaiting_children) {
        /* A child's correlation key an open transaction is inserting fails the attempt, not the round, after a while. */
        int nest_level = gd_bound_lock_waits(GD_TENANT_LOCK_WAIT_MS);
        gd_prepare_transition(row.id, t);
        AtEOXact_GUC(true, nest_level);
    }
    t.ran.started_at = started;
    t.ran.duration_us = GetCurrentTimestamp() - started;
    return t;
}


/*
 * Run a batch step's unit [first, end): its handler once for all its rows,
 * their transitions into the round's (children spawned); may raise.
 */
void run_batch_handler(Round &round, int first, int end)
{
    int count = end - first;
    const StepDefinition &def = round.definitions[first];
    const PickedInstance **rows = round_array<const PickedInstance *>(count);
    for (int i = 0; i < count; i++)
        rows[i] = &round.rows[round.to_run[first + i]];
    HeapTupleHeader *outcomes = round_array<HeapTupleHeader>(count);
    TimestampTz started = GetCurrentTimestamp();
    gd_call_batch_handler(rows, count, def, round.queue, outcomes);
    for (int i = 0; i < count; i++) {
        Transition t = gd_outcome_transition(*rows[i], def, outcomes[i], def.owner);
        if (t.to.status == Status::awaiting_children) {
            int nest_level = gd_bound_lock_waits(GD_TENANT_LOCK_WAIT_MS);
            gd_prepare_transition(rows[i]->id, t);
            AtEOXact_GUC(true, nest_level);
        }
        round.transitions[first + i] = t;
    }
    /* They ran together: each records the call's start and length. */
    TimestampTz ended = GetCurrentTimestamp();
    for (int i = first; i < end; i++) {
        round.transitions[i].ran.started_at = started;
        round.transitions[i].ran.duration_us = ended - started;
    }
}

/*
 * Run the units [first, end) in one subtransaction, their transitions into
 * `transitions`.  Returns nullptr when none raised (the subtransaction is
 * released: their effects stay); else the error, with the subtransaction
 * rolled back (all their effects gone) and `*raising` and `*started` saying
 * which unit raised and when it began.
 */
ErrorData *run_in_subtransaction(Round &round, int first, int end, int *raising, TimestampTz *started)
{
    WorkerSlot *slot = round.slot;
    MemoryContext round_context = CurrentMemoryContext;
    ResourceOwner round_owner = CurrentResourceOwner;
    volatile int running = first;
    ErrorData *volatile raised = nullptr;
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(round_context);
    PG_TRY();
    {
        for (running = first; running < end; running = running + 1) {
            int row_index = unit_start(round, running);
            const PickedInstance &row = round.rows[round.to_run[row_index]];
            const StepDefinition &def = round.definitions[row_index];
            if (slot != nullptr)
                gd_worker_set_activity(slot, row.id);
            *started = GetCurrentTimestamp();
            gd_note_step(row, def.timeout_ms); /* a batch's: noted as its first row's */
            if (def.batch > 1)
                run_batch_handler(round, row_index, round.unit_end[running]);
            else
                round.transitions[row_index] = run_handler(row, def, round.queue);
            gd_note_step_ended();
            CHECK_FOR_INTERRUPTS();
            gd_exit_if_postmaster_died();
        }
        ReleaseCurrentSubTransaction();
    }
    PG_CATCH();
    {
        gd_note_step_ended();
        bool timed_out = gd_handler_timed_out();
        disable_timeout(STATEMENT_TIMEOUT, false);
        MemoryContextSwitchTo(round_context);
        raised = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        gd_forget_handler_session_state(); /* session locks outlive the subtransaction */
        /* A cancel that is not the step's timeout nor a gd_cancel is the session's: never swallowed. */
        if (raised->sqlerrcode == ERRCODE_QUERY_CANCELED && !timed_out && !stopped_by_gd_cancel(slot))
            ReThrowError(raised);
    }
    PG_END_TRY();
    MemoryContextSwitchTo(round_context);
    CurrentResourceOwner = round_owner;
    *raising = Min(running, end - 1); /* past the last handler: ReleaseCurrentSubTransaction raised */
    return raised;
}

/* Record the failed attempt of each step of unit u (it raised `edata`), without running it again: unless
 * a gd_cancel stopped it (see stopped_by_gd_cancel): nothing is written for them then. */
void write_failed_attempt(Round &round, int u, ErrorData *edata, TimestampTz started)
{
    bool cancelled = edata->sqlerrcode == ERRCODE_QUERY_CANCELED && stopped_by_gd_cancel(round.slot);
    for (int i = unit_start(round, u); i < round.unit_end[u]; i++) {
        const PickedInstance &row = round.rows[round.to_run[i]];
        if (cancelled) {
            leave_for_canceller(round, row);
            continue;
        }
        Transition t = gd_retry_transition(row, round.definitions[i], gd_error_json(edata, row), -1);
        t.ran.started_at = started;
        t.ran.duration_us = GetCurrentTimestamp() - started;
        gd_write_transition_batched(round.written, row.id, t);
    }
    FreeErrorData(edata);
}

/* How many steps of the instance ran in this round before the one it is at. */
int steps_before(const PickedInstance &row)
{
    int count = 0;
    for (const Transition *t = row.arrived_by; t != nullptr; t = t->ran.before)
        count++;
    return count;
}

/* Does the instance go on to its next step in this round (see "Chains" above)? */
bool goes_on_in_round(const Round &round, const PickedInstance &row, const StepDefinition &def, const Transition &t)
{
    if (round.slot == nullptr || !def.chain || row.attempt > 1 || row.rate_limit != nullptr)
        return false;
    if (t.ran.event != StatEvent::step_next || t.to.status != Status::runnable || t.to.external || t.to.moved)
        return false;
    TimestampTz now = GetCurrentTimestamp();
    if (t.to.eligible_at > now || now - round.started >= static_cast<int64>(gd_batch_time_ms) * 1000 ||
        steps_before(row) + 1 >= gd_chain_limit)
        return false;
    std::optional<StepDefinition> next = gd_find_step(row.fsm, row.version, t.to.step);
    return next && next->chain && !next->external && next->batch <= 1 && next->rate_limit[0] == '\0';
}

/* A new visit's idempotency key, as gen_random_uuid() makes the row's. */
char *new_visit_key()
{
    return DatumGetCString(DirectFunctionCall1(uuid_out, OidFunctionCall0(F_GEN_RANDOM_UUID)));
}

/* The picked row, now at the step `t` goes on to: its row is written later, with `t` before it. */
void enter_next_step(PickedInstance &row, const Transition &t)
{
    auto *arrived = static_cast<Transition *>(palloc(sizeof(Transition)));
    *arrived = t;
    row.arrived_by = arrived;
    row.step = pstrdup(t.to.step);
    if (t.to.state != 0)
        row.state = t.to.state;
    row.attempt = t.to.attempt;
    row.resume = 0;
    row.visit_key = new_visit_key();
}

/* The transitions of unit u, which ran: into the round's written batch, or on to the next wave (a chain). */
void write_unit(Round &round, int u)
{
    for (int i = unit_start(round, u); i < round.unit_end[u]; i++) {
        PickedInstance &row = round.rows[round.to_run[i]];
        const Transition &t = round.transitions[i];
        if (goes_on_in_round(round, row, round.definitions[i], t)) {
            enter_next_step(row, t);
            round.going_on[round.going_on_count++] = round.to_run[i];
        } else {
            gd_write_transition_batched(round.written, row.id, t);
        }
    }
}

/*
 * Run units [first, end), each in a subtransaction of its own: one that
 * raises (or overruns its timeout, or returns a bad outcome) loses its
 * effects and records a failed attempt of each of its steps; the others go on.
 */
void run_each_isolated(Round &round, int first, int end)
{
    for (int u = first; u < end; u++) {
        int raising;
        TimestampTz started;
        ErrorData *raised = run_in_subtransaction(round, u, u + 1, &raising, &started);
        if (raised == nullptr)
            write_unit(round, u);
        else
            write_failed_attempt(round, u, raised, started);
    }
}

/*
 * Run all the batch's units together in one subtransaction (one per step
 * would weigh on a simple step as much as the step).  When one raises, that
 * subtransaction is rolled back, the raising unit's attempts are recorded as
 * failed without running it again, and the others run again isolated: their
 * effects commit once, as always.  Returns false when one raised.
 */
bool run_together(Round &round)
{
    int raising;
    TimestampTz started;
    ErrorData *raised = run_in_subtransaction(round, 0, round.unit_count, &raising, &started);
    if (raised == nullptr) {
        for (int u = 0; u < round.unit_count; u++)
            write_unit(round, u);
        return true;
    }
    run_each_isolated(round, 0, raising); /* they ran in vain: again */
    write_failed_attempt(round, raising, raised, started);
    run_each_isolated(round, raising + 1, round.unit_count);
    return false;
}


/*
 * One wave of the round: the rows `wave` names, each at its step, prepared,
 * admitted and run (see the runner's comment); the instances that go on to
 * their next step are left in round.going_on.  Returns how many steps were
 * handled; *ran_batch_calls is set when a batch step's call ran.
 */
int run_wave(Round &round, const int *wave, int wave_count, int demand, const DrainScope *drain,
             bool *ran_batch_calls)
{
    round.to_run = round_array<int>(wave_count);
    round.definitions = round_array<StepDefinition>(wave_count);
    round.transitions = round_array<Transition>(wave_count);
    round.to_run_count = 0;
    round.going_on_count = 0;
    int ran = 0;
    for (int w = 0; w < wave_count; w++) {
        int i = wave[w];
        Disposition disposition = prepare_step(round, round.rows[i], round.definitions[round.to_run_count]);
        if (disposition == Disposition::to_run)
            round.to_run[round.to_run_count++] = i;
        else if (disposition == Disposition::handled)
            ran++;
    }
    hold_for_batches(round, demand, drain);
    ran += admit_and_hand_over(round);
    form_units(round);
    for (int u = 0; u < round.unit_count; u++)
        if (round.definitions[unit_start(round, u)].batch > 1)
            *ran_batch_calls = true;
    if (round.unit_count == 1 || (round.unit_count > 1 && last_batch_raised)) {
        run_each_isolated(round, 0, round.unit_count);
        last_batch_raised = false;
    } else if (round.unit_count > 1) {
        last_batch_raised = !run_together(round);
    }
    return ran;
}

} // namespace

BatchRun gd_execute_batch(const char *queue, int limit, WorkerSlot *slot, const DrainScope *drain)
{
    MemoryContext batch_context = CurrentMemoryContext;
    gd_prepare_handler_calls();
    int search_path_level = gd_use_handler_search_path();
    int demand = Max(limit, 1);
    Round &round = *static_cast<Round *>(palloc0(sizeof(Round)));
    round.queue = queue;
    round.slot = slot;
    round.started = GetCurrentTimestamp();
    round.rows = round_array<PickedInstance>(demand);
    gd_begin_transitions(round.written, StatusWriter::step, demand);
    round.count = drain != nullptr ? gd_pick_to_drain(queue, demand, round.rows, batch_context, *drain)
                                   : gd_pick(queue, demand, round.rows, batch_context);
    gd_count(StatEvent::pick);
    gd_count(StatEvent::pick_demand, static_cast<uint64>(demand));
    gd_count(StatEvent::pick_rows, static_cast<uint64>(round.count));
    gd_count_queue_pick(queue, demand, round.count);
    if (slot != nullptr)
        gd_note_round(slot, demand, round.count);
    int *wave = round_array<int>(round.count);
    for (int i = 0; i < round.count; i++)
        wave[i] = i;
    round.going_on = round_array<int>(round.count);
    int wave_count = round.count, ran = 0;
    bool ran_batch_calls = false;
    while (wave_count > 0) {
        note_cancels_under_way(round);
        ran += run_wave(round, wave, wave_count, demand, drain, &ran_batch_calls);
        std::swap(wave, round.going_on);
        wave_count = round.going_on_count;
    }
    gd_flush_transitions(round.written);
    gd_release_concurrency_keys();
    AtEOXact_GUC(true, search_path_level);
    if (slot != nullptr)
        gd_note_round(slot, 0, 0);
    return BatchRun{ran, ran_batch_calls};
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
            pg_atomic_write_u64(&slot.cancel_requested_at, static_cast<uint64>(GetCurrentTimestamp()));
            pg_atomic_write_u64(&slot.cancel_step, instance);
            pid = slot.pid;
        }
    LWLockRelease(gd_shared->lock);
    /* Published whether or not a step of it runs now: a round holding it mid-chain lets go at its next step. */
    publish_cancel(static_cast<int64>(instance));
    if (pid != 0)
        (void) kill(pid, terminate ? SIGTERM : SIGINT);
    PG_RETURN_BOOL(pid != 0);
}
