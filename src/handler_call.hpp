/*
 * handler_call.hpp — calling a step's handler (handler_call.cpp): as the
 * FSM's owner, isolated from the engine and from other tenants.
 */
#pragma once

#include "picker.hpp"
#include "step_definitions.hpp"

/* Look up the types a call needs, once per batch. */
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
 * gd.outcome (a batch step's: (jsonb[], gd.context[]) returning gd.outcome[])?  Then the SQLSTATE and message of the instance's failure.
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
/*
 * Call a batch step's handler once with (states jsonb[], ctxs gd.context[])
 * for `count` rows of the step, as gd_call_handler does; its outcomes, one per
 * row in their order, into `outcomes`, or raises (a wrong count, a NULL: 22023).
 */
void gd_call_batch_handler(const PickedInstance *const *rows, int count, const StepDefinition &def, const char *queue,
                           HeapTupleHeader *outcomes);
/* After a handler raised: was it its step's timeout?  (Asked once per raise.) */
bool gd_handler_timed_out();
/* In an engine worker, release the session advisory locks a handler took, even when it raised. */
void gd_forget_handler_session_state();
/* What in this session keeps handlers from running in it (temporary objects, open cursors), or nullptr. */
const char *gd_session_holds_back_handlers();
