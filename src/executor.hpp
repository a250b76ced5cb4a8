/*
 * executor.hpp — what the parts of an executor share: the definition cache,
 * the pick, the step runner and the transition writer.
 */
#pragma once

#include "gen_durable.hpp"

extern "C" {
#include "executor/spi.h"
#include "utils/jsonb.h"
}

constexpr int GD_MAX_BATCH = 1000; /* upper bound of gen_durable.batch_size */

/* How a step of one FSM version runs (definitions.cpp). */
struct StepDefinition {
    Oid handler;           /* InvalidOid: an external step */
    Oid owner;             /* role the handler runs as */
    int max_attempts;
    int64 backoff_us;
    int64 max_backoff_us;
    int timeout_ms;        /* 0: no timeout */
};

/* The definition of a step, or nullptr when the FSM version has no such step. */
const StepDefinition *gd_find_step(const char *fsm, int version, const char *step);

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
};

/* Lock up to `limit` runnable in-database steps of the queue, best first;
 * the rows are copied into `into`. */
int gd_pick(const char *queue, int limit, PickedInstance *out, MemoryContext into);
/* When the next row of the queue not yet eligible becomes eligible; 0 when none. */
TimestampTz gd_next_due(const char *queue);

/* Where an instance goes after a step (transition.cpp). */
struct Transition {
    const char *status;      /* runnable | done | failed */
    const char *step;
    Datum state;             /* 0: keep the state */
    int attempt;
    TimestampTz eligible_at;
    Datum result;            /* 0: NULL */
    Datum error;             /* 0: NULL */
    bool external;
};

void gd_apply_transition(int64 id, const Transition &t);
/* The transition for a failed attempt: retry after backoff, or fail past max_attempts. */
Transition gd_retry_transition(const PickedInstance &row, const StepDefinition &def, Datum error,
                               int64 explicit_backoff_us);
/* {"sqlstate", "message", "detail", "step", "attempt"} for an error raised by a step. */
Datum gd_error_json(const ErrorData *edata, const PickedInstance &row);

/*
 * Pick up to `limit` steps of the queue and run each to its transition, in
 * the caller's transaction and SPI connection; gd_await callers are woken at
 * commit.  Rows are copied into CurrentMemoryContext.  Reports progress in
 * `slot` when given.  Returns how many steps ran (step_runner.cpp).
 */
int gd_execute_batch(const char *queue, int limit, WorkerSlot *slot);
