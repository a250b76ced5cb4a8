/*
 * executor.hpp — what the parts of an executor share: the definition cache,
 * the pick, the step runner and the transition writer.
 */
#pragma once

#include "gen_durable.hpp"

#include <initializer_list>

extern "C" {
#include "executor/spi.h"
#include "utils/jsonb.h"
}

constexpr int GD_MAX_BATCH = 1000; /* upper bound of gen_durable.batch_size */

/* How a step of one FSM version runs (definitions.cpp). */
struct StepDefinition {
    bool external;         /* run by external workers: no handler */
    Oid handler;           /* the function its signature names now; InvalidOid when none does (dropped, renamed) */
    Oid owner;             /* role the handler runs as */
    int max_attempts;
    int64 backoff_us;
    int64 max_backoff_us;
    bool backoff_jitter;   /* a retry waits a random time between half and all of its backoff */
    int timeout_ms;        /* 0: no timeout */
    char rate_limit[NAMEDATALEN]; /* "" when the step names no rate limit */
    char queue[NAMEDATALEN];      /* "" when the step runs on its instance's queue */
    bool history;                 /* the FSM version keeps a step history */
};

/* The definition of a step, or nullptr when the FSM version has no such step. */
const StepDefinition *gd_find_step(const char *fsm, int version, const char *step);
/*
 * Are the FSM version's steps not there yet?  Only a restore in progress
 * makes one (pg_dump loads gd._steps after gd._instances; the API refuses
 * instances of a version without steps): its instances wait, they do not fail.
 */
bool gd_version_not_ready(const char *fsm, int version);

/* A row an executor has locked for this round (picker.cpp).  Strings and
 * jsonb live in the round's memory context. */
struct PickedInstance {
    int64 id;
    char *fsm;
    int version;
    char *step;
    Datum state;
    int attempt;
    char *correlation_key; /* nullptr when none */
    int64 parent_id;       /* 0 when none */
    Datum resume;          /* jsonb the step sees in ctx (signals, children, timed_out); 0 when none */
    char *concurrency_key; /* nullptr when none */
    char *rate_limit;      /* the instance's rate limit key, nullptr when none */
    int weight;            /* tokens a step takes */
    Oid owner;             /* the FSM's owner: whose key spaces the instance's keys are in */
    TimestampTz updated_at; /* the row's version: a crashed step's note names it */
    int32 priority;
    TimestampTz eligible_at;
    char *trace_context;   /* the W3C traceparent it was inserted with; nullptr when none */
    char *visit_key;       /* the current visit of its step: ctx.idempotency_key */
    const char *queue;     /* where the current step runs (not among GD_INSTANCE_COLUMNS: its reader knows) */
};

/* The columns gd_read_instance reads, in its order, for queries on gd._instances i. */
#define GD_INSTANCE_COLUMNS                                                                                      \
    "i.id, i.fsm, i.version, i.step, i.state, i.attempt, i.correlation_key, i.parent_id, i.resume, "           \
    "i.concurrency_key, i.rate_limit, i.weight, i.owner, i.updated_at, i.priority, i.eligible_at, i.trace_context, " \
    "i.visit_key::text"
constexpr int GD_INSTANCE_COLUMN_COUNT = 18;

/* The engine's own statements (kept_plans.cpp): prepare one once (a kept,
 * generic plan), and run it as SPI_execute_plan would, planned for the indexes. */
SPIPlanPtr gd_prepare_kept(const char *sql, int nargs, Oid *types);
/* How a kept statement joins: as the planner likes, or by hash only (for a
 * statement joining an array of ids to their rows: see kept_plans.cpp). */
enum class KeptJoins { planner_choice, hashed };
int gd_execute_kept(SPIPlanPtr plan, Datum *args, const char *nulls, bool read_only, long count,
                    KeptJoins joins = KeptJoins::planner_choice);
/* Both: run `sql`, prepared into `plan` at its first run. */
int gd_run_kept(SPIPlanPtr &plan, const char *sql, std::initializer_list<Oid> types, Datum *args, bool read_only,
                long count, const char *nulls = nullptr);
/* The same, with the calling SQL function's arguments as the statement's, in their order. */
int gd_run_kept_on_arguments(SPIPlanPtr &plan, const char *sql, std::initializer_list<Oid> types,
                             FunctionCallInfo fcinfo, bool read_only, long count);
/* Read the columns of GD_INSTANCE_COLUMNS (in that order) into `row`, copied into CurrentMemoryContext. */
void gd_read_instance(HeapTuple tuple, TupleDesc desc, PickedInstance &row);
/* Lock up to `limit` runnable in-database steps of the queue, best first,
 * from the queue's frontier on; the rows are copied into `into`. */
int gd_pick(const char *queue, int limit, PickedInstance *out, MemoryContext into);
/* What gd_drain runs: the instances of owners `member` is a member of, those
 * scheduled for later too when `with_scheduled`. */
struct DrainScope {
    Oid member;
    bool with_scheduled;
};
/* A drain's pick: as gd_pick, of the scope's instances, due by gd_session_now() (not by the transaction's start). */
int gd_pick_to_drain(const char *queue, int limit, PickedInstance *out, MemoryContext into, const DrainScope &scope);
/* gd_claim's pick: as gd_pick, due by gd_session_now(), from the claim frontier, of the external steps of the
 * FSMs named in `usable` (a text[]; 0: every FSM). */
int gd_pick_external(const char *queue, int limit, Datum usable, PickedInstance *out, MemoryContext into);
/* When the next row of the queue not yet eligible becomes eligible; 0 when none. */
TimestampTz gd_next_due(const char *queue);

/*
 * An instance's status.  The names are the gd.status domain's
 * (sql/src/10_schema.sql), the live ones first: gd._live_statuses() and
 * gd._terminal_statuses() are made from this list (transition.cpp).
 */
enum class Status { runnable, executing, awaiting_signal, awaiting_children, done, failed, cancelled };
const char *gd_status_name(Status status);
inline bool gd_status_is_live(Status status) { return status <= Status::awaiting_children; }

/* Where an instance goes after a step (transition.cpp). */
struct Transition {
    Status status;           /* not executing, not cancelled */
    const char *step;
    Datum state;             /* 0: keep the state */
    int attempt;
    TimestampTz eligible_at;
    Datum result;            /* 0: NULL */
    Datum error;             /* 0: NULL */
    bool external;
    /* Perhaps to another queue (gd._route, in the UPDATE): the next step's own
     * queue, or nullptr for the instance's home queue.  Only gd_next moves. */
    bool moved;
    const char *route;
    int64 parent_id;         /* the instance's parent (0: none): woken when this one ends */
    bool scheduled;          /* started by a schedule's tick: its end may start a held-back tick */
    const char *fsm;         /* the instance's FSM and version, and the step that ran (the event stream) */
    int version;
    const char *ran_step;
    bool claimed;            /* the step that ran was an external worker's claim (else an executor's) */
    Oid owner;               /* the instance's owner, in whose key space its concurrency key is */
    const char *concurrency_key; /* the instance's key (nullptr: none): room is made when it stops running */
    Datum wait_names;        /* awaiting_signal: text[] of names */
    TimestampTz wait_deadline; /* awaiting_signal: 0 for no timeout */
    const char *then_step;   /* awaiting_*: the step to resume at */
    Datum children;          /* awaiting_children: jsonb array of insert options */
    Oid spawn_role;          /* awaiting_children: whose rights the children are inserted with */
    int spawned;             /* awaiting_children: how many children were inserted */
    /* A retry: the same visit of the step goes on, with the same ctx signals,
     * children and idempotency key (else the key is made anew). */
    bool same_visit;
    /* The step that ran, for telemetry (step_records.cpp). */
    StatEvent event;         /* its outcome's step event (StatEvent::count_: no step ran to an outcome) */
    int ran_attempt;         /* its attempt */
    TimestampTz started_at;  /* when it started (an external step: when it was claimed); 0: unknown */
    int64 duration_us;       /* how long it ran */
    bool history;            /* its FSM version keeps a step history */
    const char *worker;      /* the external worker that ran it; nullptr: this process */
};

/*
 * Count a finished step (gd.stats, gd.step_stats) and, when its FSM version
 * keeps a history, write its row: into `batch` when given (written by
 * gd_write_history, one INSERT for a batch of transitions), else at once.
 */
struct HistoryBatch;
HistoryBatch *gd_begin_history(int capacity);
void gd_record_finished_step(int64 id, const Transition &t, HistoryBatch *batch = nullptr);
void gd_write_history(HistoryBatch *batch);
/* A one-dimensional array of `count` values of `type` (NULL where nulls says, if given). */
Datum gd_array_of(Datum *values, bool *nulls, int count, Oid type);

/*
 * Validate a handler's gd.outcome and return the instance's transition;
 * raises 22023 for a bad outcome (the caller counts it as a failed attempt).
 * `outcome_role` produced it (the FSM's owner, or the completing worker's
 * role): a spawn's children are inserted with its rights.
 */
Transition gd_outcome_transition(const PickedInstance &row, const StepDefinition &def, HeapTupleHeader outcome,
                                 Oid outcome_role);
/*
 * Writing a transition comes in two halves.  gd_prepare_transition does what
 * may fail on the handler's account (a spawn inserts its children, which may
 * be refused), so the in-database runner calls it inside the step's
 * subtransaction.  gd_write_transition updates the instance row (one UPDATE,
 * which also clears any lease) and does what follows: a wait consumes signals
 * already in the inbox, an empty spawn resumes at once, a finished child wakes
 * the reaper to check its parent, and gd_await callers are woken at commit.
 * The runner writes in the round's own transaction, which holds the row lock:
 * an UPDATE from a subtransaction of the locker would make the row's xmax a
 * MultiXact, which costs every later pick of the queue.
 */
void gd_prepare_transition(int64 id, Transition &t);
void gd_write_transition(int64 id, const Transition &t);
/*
 * The same, deferred: an executor round (or a gd_complete_all call) collects
 * its plain transitions (next on the same queue, retry, done, failed) and writes them in one
 * UPDATE at gd_flush_transitions, which saves setting up an UPDATE (its
 * indexes, constraints and triggers) per step.  The rows are the caller's,
 * locked since the pick or claim; a row no longer in `locked_status` (a
 * handler of the round ended its own instance, say) keeps what it has.
 * Callers own one batch each, start it with gd_begin_transitions (which
 * allocates room for `capacity` transitions in CurrentMemoryContext), and
 * flush before their SPI connection ends.
 */
struct TransitionBatch {
    Status locked_status;      /* the status the rows were locked in */
    int count;
    int capacity;
    int64 *ids;
    Transition *items;
};
void gd_begin_transitions(TransitionBatch &batch, Status locked_status, int capacity);
void gd_write_transition_batched(TransitionBatch &batch, int64 id, const Transition &t);
void gd_flush_transitions(TransitionBatch &batch);
/* Both halves, for callers without a subtransaction (external completions). */
void gd_apply_transition(int64 id, Transition t);
/*
 * Resume a parked instance, its row locked by the caller, at its then_step
 * with `resume` (jsonb: what the step sees in ctx); its queue's executors and
 * its awaiters are woken at commit.
 */
void gd_resume_parked(int64 id, Datum resume);
/* The instances a drain ends the waits of (those of `queue` whose owner `member` is a member of), as the
 * reaper would by `now`. */
struct DueScope {
    const char *queue;
    Oid member;
    TimestampTz now;
};
/* Resume the parents (all, or `parent` when not 0, or the scope's when given) whose children have all
 * ended; returns how many. */
int gd_resume_parents(int64 parent, const DueScope *scope = nullptr);
/* Leave the (locked) instance as it is, to be picked again at `until`. */
void gd_postpone(int64 id, TimestampTz until);
/*
 * Make room under the concurrency keys whose holders stopped running in this
 * transaction (gd._ungate), in key order so two rounds never deadlock on
 * them.  Runners call it once, after their last transition.
 */
void gd_release_concurrency_keys();
/* The transition for a failed attempt: retry after backoff, or fail past max_attempts. */
Transition gd_retry_transition(const PickedInstance &row, const StepDefinition &def, Datum error,
                               int64 explicit_backoff_us);
/* A terminal transition: done with a result, or failed with an error. */
Transition gd_final_transition(const PickedInstance &row, Status status, Datum result, Datum error);
/* Failed without a retry, for what no retry can mend: {"sqlstate", "message", "step", "attempt"}. */
Transition gd_failed_at_once(const PickedInstance &row, int sqlerrcode, const char *message);
/* The event stream (events.cpp): what one event says of an instance. */
struct InstanceEvent {
    int64 id;
    const char *fsm;
    int version;
    const char *step;      /* the step that ran, or the instance was at (nullptr: none, an insert) */
    const char *from;      /* the status before (nullptr: none) */
    const char *to;        /* the status after */
    const char *next_step; /* the step after */
    const char *kind;
    int attempt;
};
/* Write an event into the WAL as a transactional logical decoding message. */
void gd_emit_event(const InstanceEvent &event);
/* The event of a written step transition. */
void gd_emit_transition_event(int64 id, const Transition &t);
/* Before the engine changes an instance itself: what the event will say of
 * it before (read only when gen_durable.events is on); after the change,
 * gd_emit_event_after reads the rest and emits it. */
InstanceEvent gd_event_before(int64 id, const char *kind);
void gd_emit_event_after(InstanceEvent event);
/* At commit, NOTIFY gd_work, '<queue>' for external workers: once per transaction and queue (notify.cpp). */
void gd_notify_external_at_commit(const char *queue);
/*
 * gd.instances.error, one shape for every way a step fails:
 * {"kind", "message", "step", "attempt"}, with "sqlstate" and "detail" for
 * an error raised, "worker" for an expired lease, and, where the outcome
 * gave one (gd_retry, gd_stop), the user's error: its keys when an object
 * (its "message" the message), else under "data".  Kinds: error (a handler
 * raised, returned NULL or a bad outcome), timeout, retry, stop, cancelled,
 * lease_expired, crashed, undefined (its step, handler or owner is gone).
 */
struct ErrorFields {
    const char *kind;
    const char *message;
    const char *sqlstate = nullptr;
    const char *detail = nullptr;
    const char *worker = nullptr;
};
Datum gd_error_document(const PickedInstance &row, const ErrorFields &fields, Datum given = 0);
/* The error document of an error raised by a step. */
Datum gd_error_json(const ErrorData *edata, const PickedInstance &row);

/* Calling a handler (handler_call.cpp): look up the types a call needs, once per batch. */
void gd_prepare_handler_calls();
/* A new GUC nest level with the search_path handlers run with; the caller
 * ends it with AtEOXact_GUC(true, level). */
int gd_use_handler_search_path();
/* The gd.context a step of the row sees, running on `queue` until `deadline` (0: no timeout; after
 * gd_prepare_handler_calls). */
Datum gd_context(const PickedInstance &row, const char *queue, TimestampTz deadline);
/* When a step that starts at `start` must end by under its definition's timeout; 0: no timeout. */
TimestampTz gd_step_deadline(const StepDefinition &def, TimestampTz start);
/*
 * Can the step's handler never run again — the function or the FSM's owner
 * was dropped, or the function is no longer (jsonb, gd.context) returning
 * gd.outcome?  Then the SQLSTATE and message of the instance's failure.
 */
struct HandlerGone {
    int sqlerrcode;
    const char *message;
};
bool gd_handler_gone(const PickedInstance &row, const StepDefinition &def, HandlerGone *why);
/*
 * Call the step's handler with (state, ctx) as the FSM's owner, isolated
 * from the engine and other tenants; returns its outcome, or raises (the
 * caller's subtransaction rolls its effects back).
 */
HeapTupleHeader gd_call_handler(const PickedInstance &row, const StepDefinition &def, const char *queue);
/* After a handler raised: was it its step's timeout?  (Asked once per raise.) */
bool gd_handler_timed_out();
/* In an engine worker, release the session advisory locks a handler took, even when it raised. */
void gd_forget_handler_session_state();
/* What in this session keeps handlers from running in it (temporary objects, open cursors), or nullptr. */
const char *gd_session_holds_back_handlers();

/*
 * Steps that end their executor (crashed_steps.cpp).  An executor installs
 * its SIGTERM/SIGQUIT handlers at start, opens its slot's note once its
 * database is served, and notes each step around its handler call; the
 * workers of a database count the notes dead executors left.
 */
void gd_install_step_note_handlers();
void gd_open_step_note(int slot_index);
void gd_note_step(const PickedInstance &row, int timeout_ms);
void gd_note_step_ended();
/* Count the notes of this database's dead executors; true when one is left for later (its row is running). */
bool gd_count_crashed_steps();

/*
 * Take the tokens a step needs from its rate limits (the instance's and the
 * step's), or push the instance back until they will be there; false when
 * the step must not run now (rate_limits.cpp).
 */
bool gd_admit_rate(const PickedInstance &row, const StepDefinition &def);

/*
 * Pick up to `limit` steps of the queue and run each to its transition, in
 * the caller's transaction and SPI connection; gd_await callers are woken at
 * commit.  Rows are copied into CurrentMemoryContext.  Reports progress in
 * `slot` when given; picks only `drain`'s instances when given.  Returns how
 * many steps ran (step_runner.cpp).
 */
int gd_execute_batch(const char *queue, int limit, WorkerSlot *slot, const DrainScope *drain = nullptr);

/* A worker's work inside one round's transaction; each returns the ms to sleep after it. */
long gd_executor_round(WorkerSlot *slot, const char *queue); /* executor.cpp */
long gd_reaper_round();                                      /* reaper.cpp */
/* The reaper's duty to external work (claims.cpp): reclaim up to `batch`
 * expired leases, announce scheduled work come due; returns when it next has
 * something to do (now: a full batch may leave more), or 0 for nothing. */
TimestampTz gd_expire_leases(int batch);
long gd_gc_round(const char *database);                      /* gc.cpp */
