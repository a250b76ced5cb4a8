/*
 * transition.hpp — where an instance goes after a step, and the writing of
 * it (transition.cpp): one row at a time, or a round's plain transitions in
 * one statement, in the transaction of the step's own effects.
 */
#pragma once

#include "instance_status.hpp"
#include "picker.hpp"
#include "stats.hpp"
#include "step_definitions.hpp"

/* Where the row goes. */
struct Destination {
    Status status;           /* not executing; cancelled only where a compensation ends */
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
    Datum wait_names;        /* awaiting_signal: text[] of names */
    TimestampTz wait_deadline; /* awaiting_signal: 0 for no timeout */
    const char *then_step;   /* awaiting_*: the step to resume at */
    Datum children;          /* awaiting_children: jsonb array of insert options */
    Oid spawn_role;          /* awaiting_children: whose rights the children are inserted with */
    int spawned;             /* awaiting_children: how many children were inserted */
    /* A retry: the same visit of the step goes on, with the same ctx signals,
     * children and idempotency key (else the key is made anew). */
    bool same_visit;
    /* A visit begun in this round (a chain's step): its key, which the row
     * keeps where it keeps its visit (a retry, an end), with no resume;
     * nullptr: the row's own. */
    const char *visit_key;
};

/* The step that ran, for telemetry: gd.stats, the step history, the event stream. */
struct RanStep {
    const char *fsm;         /* the instance's FSM and version */
    int version;
    const char *step;
    Datum state;             /* the state it started with (0: unknown), for the step history */
    int attempt;
    bool claimed;            /* an external worker's claim (else an executor's) */
    StatEvent event;         /* its outcome's step event (StatEvent::count_: no step ran to an outcome) */
    TimestampTz started_at;  /* when it started (an external step: when it was claimed); 0: unknown */
    int64 duration_us;       /* how long it ran */
    bool history;            /* its FSM version keeps a step history */
    const char *worker;      /* the external worker that ran it; nullptr: this process */
    /* The attempt was lost (its lease expired): no outcome to count, but a row
     * of the step history, kind 'lost', with the error that ended it. */
    bool lost;
    /* It ran as the instance's compensation (gd._instances.cancelled set when
     * picked): the transition is written only while that is still so, so a
     * step a gd_cancel sent into compensation meanwhile does not write over it. */
    bool compensating;
    /* The step run before it in the same round (a chain), whose row was never
     * written: its telemetry, and that of the steps before it, goes first. */
    const Transition *before;
};

/* Whom the transition concerns beyond its row. */
struct FollowUps {
    int64 parent_id;         /* the instance's parent (0: none): woken when this one ends */
    bool scheduled;          /* started by a schedule's tick: its end may start a held-back tick */
    Oid owner;               /* the instance's owner, in whose key space its concurrency key is */
    const char *concurrency_key; /* the instance's key (nullptr: none): room is made when it stops running */
};

struct Transition {
    Destination to;
    RanStep ran;
    FollowUps then;
};

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
 * MultiXact, which costs every later pick of the queue.  `writer` is who
 * writes (instance_status.hpp): a row no longer in a status it moves
 * instances out of (a handler cancelled its own instance, say) keeps what it has.
 */
void gd_prepare_transition(int64 id, Transition &t);
void gd_write_transition(int64 id, const Transition &t, StatusWriter writer);
/*
 * The same, deferred: an executor round (or a gd_complete_all call) collects
 * its plain transitions (next on the same queue, retry, done, failed) and writes them in one
 * UPDATE at gd_flush_transitions, which saves setting up an UPDATE (its
 * indexes, constraints and triggers) per step.  The rows are the caller's,
 * locked since the pick or claim.  Callers own one batch each, start it with
 * gd_begin_transitions (which allocates room for `capacity` transitions in
 * CurrentMemoryContext), and flush before their SPI connection ends.
 */
struct TransitionBatch {
    StatusWriter writer;
    int count;
    int capacity;
    int64 *ids;
    Transition *items;
};
void gd_begin_transitions(TransitionBatch &batch, StatusWriter writer, int capacity);
void gd_write_transition_batched(TransitionBatch &batch, int64 id, const Transition &t);
void gd_flush_transitions(TransitionBatch &batch);
/* Both halves and the release of concurrency keys, for callers without a subtransaction. */
void gd_apply_transition(int64 id, Transition t, StatusWriter writer);

/* Longer delays mean "never" in practice and are clamped, so no timestamp overflows. */
constexpr int64 GD_MAX_DELAY_US = INT64CONST(100) * 366 * USECS_PER_DAY;

/* A transition of `row` from the step it ran: what every kind of transition carries. */
Transition gd_transition_from(const PickedInstance &row);
/* The transition for a failed attempt: retry after backoff, or fail past max_attempts. */
Transition gd_retry_transition(const PickedInstance &row, const StepDefinition &def, Datum error,
                               int64 explicit_backoff_us);
/* A terminal transition: done with a result, or failed with an error. */
Transition gd_final_transition(const PickedInstance &row, Status status, Datum result, Datum error);
/* Failed without a retry, for what no retry can mend: {"sqlstate", "message", "step", "attempt"}. */
Transition gd_failed_at_once(const PickedInstance &row, int sqlerrcode, const char *message);
/* Leave the (locked) instance as it is, to be picked again at `until`. */
void gd_postpone(int64 id, TimestampTz until);
/* The same for `count` instances, each until its own time, in one statement. */
void gd_postpone_all(const int64 *ids, const TimestampTz *until, int count);
