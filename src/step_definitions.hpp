/*
 * step_definitions.hpp — how a step of one FSM version runs, read from
 * gd._steps and gd._fsms through a backend-local cache (definitions.cpp).
 */
#pragma once

extern "C" {
#include "postgres.h"
}

#include <optional>

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
    int batch;                    /* > 1: a batch step, its handler takes up to this many instances at once */
    int64 batch_wait_us;          /* how long a batch step's first waiting instance waits for its batch to fill */
    bool chain;                   /* may run in a chain: after the step before it in the same round (step_runner.cpp) */
};

/*
 * The definition of a step, or none when the FSM version has no such step.
 * A copy: the cache empties itself whenever a definition changes, which
 * any statement (a handler's, say) may bring about.
 */
std::optional<StepDefinition> gd_find_step(const char *fsm, int version, const char *step);
/*
 * Are the FSM version's steps not there yet?  Only a restore in progress
 * makes one (pg_dump loads gd._steps after gd._instances; the API refuses
 * instances of a version without steps): its instances wait, they do not fail.
 */
bool gd_version_not_ready(const char *fsm, int version);
