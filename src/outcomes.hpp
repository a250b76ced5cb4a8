/*
 * outcomes.hpp — gd.outcome, both ways (outcomes.cpp): the constructors a
 * handler calls check their arguments, and an outcome returned is decoded
 * into its instance's transition.
 */
#pragma once

#include "transition.hpp"

extern "C" {
#include "utils/array.h"
}

/* Argument checks the API shares (22023, naming `what`): a delay, timeout or backoff from 0 to
 * 100 years; a lease, positive and at most 100 years. */
void gd_check_interval(Datum value, const char *what);
void gd_check_lease(Datum value, const char *what);
/* Signal names of a wait: a one-dimensional, non-empty array of non-empty names. */
bool gd_signal_names_ok(ArrayType *names);
/*
 * Validate a handler's gd.outcome and return the instance's transition;
 * raises 22023 for a bad outcome (the caller counts it as a failed attempt).
 * `outcome_role` produced it (the FSM's owner, or the completing worker's
 * role): a spawn's children are inserted with its rights.
 */
Transition gd_outcome_transition(const PickedInstance &row, const StepDefinition &def, HeapTupleHeader outcome,
                                 Oid outcome_role);
