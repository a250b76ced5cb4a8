/*
 * picker.hpp — choosing the next steps of a queue (picker.cpp): the rows an
 * executor, a drain or a claim locks, best first, from the queue's frontier
 * on, and how a picked row is read.
 */
#pragma once

#include "frontier.hpp"

extern "C" {
#include "postgres.h"
#include "access/htup.h"
#include "access/tupdesc.h"
#include "utils/timestamp.h"
}

constexpr int GD_MAX_BATCH = 1000; /* upper bound of gen_durable.batch_size */

struct Transition;

/* A row locked for a round.  Strings and jsonb live in the round's memory context. */
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
    Datum cancelled;       /* compensating: why and where a gd_cancel found it (ctx.cancelled); 0 when not */
    int32 fairness_lane;   /* its lane among its owner's rows (its fairness key's hash; 0 when none) */
    const char *queue;     /* where the current step runs (not among GD_INSTANCE_COLUMNS: its reader knows) */
    /* In a chain (step_runner.cpp): the transition that brought the instance to
     * this step in this round, its row not written yet (it carries those before
     * it); nullptr: the row is as picked.  A chained step's visit_key is new. */
    const Transition *arrived_by;
};

/* The columns gd_read_instance reads, in its order, for queries on gd._instances i. */
#define GD_INSTANCE_COLUMNS                                                                                      \
    "i.id, i.fsm, i.version, i.step, i.state, i.attempt, i.correlation_key, i.parent_id, i.resume, "           \
    "i.concurrency_key, i.rate_limit, i.weight, i.owner, i.updated_at, i.priority, i.eligible_at, i.trace_context, " \
    "i.visit_key::text, i.cancelled, i.fairness_lane"
constexpr int GD_INSTANCE_COLUMN_COUNT = 20;

/* The reaper's look from the front of each queue due for it, for rows nothing announced (frontier.cpp). */
void gd_audit_frontiers();

/* The row's place in the pick (or claim) index. */
PickKey gd_pick_key(const PickedInstance &row);
/* Read the columns of GD_INSTANCE_COLUMNS (in that order) into `row`, copied into CurrentMemoryContext. */
void gd_read_instance(HeapTuple tuple, TupleDesc desc, PickedInstance &row);
/* Lock up to `limit` runnable in-database steps of the queue, best first,
 * from the queue's frontier on, the batch shared between the lanes of a
 * priority; the rows are copied into `into`. */
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
