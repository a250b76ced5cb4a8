/*
 * error_documents.hpp — gd.instances.error, one shape for every way a step
 * fails (error_documents.cpp): {"kind", "message", "step", "attempt"}, with
 * "sqlstate" and "detail" (and "hint", if any) for an error raised, "worker" for an expired
 * lease, and, where the outcome gave one (gd_retry, gd_stop), the user's
 * error: its keys when an object (its "message" the message), else under
 * "data".  Kinds: error (a handler raised, returned NULL or a bad outcome),
 * timeout, retry, stop, cancelled, lease_expired, crashed, undefined (its
 * step, handler or owner is gone).
 */
#pragma once

#include "picker.hpp"

struct ErrorFields {
    const char *kind;
    const char *message;
    const char *sqlstate = nullptr;
    const char *detail = nullptr;
    const char *worker = nullptr;
    const char *hint = nullptr;
};
Datum gd_error_document(const PickedInstance &row, const ErrorFields &fields, Datum given = 0);
/* The error document of an error raised by a step (with "hint" where the error has one, or the engine
 * knows what the handler missed). */
Datum gd_error_json(const ErrorData *edata, const PickedInstance &row);
