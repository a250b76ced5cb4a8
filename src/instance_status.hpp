/*
 * instance_status.hpp — an instance's status (gd._instances.status) and the
 * one table of the changes the engine makes to it: from which status, to
 * which, by which writer.  Every statement that writes a status takes its
 * allowed from-statuses and its target from this table: the C++ writers
 * through gd_status_change_check / gd_statuses_before, the SQL ones through
 * gd._statuses_before(writer) and gd._status_after(writer, status), which
 * fold to constants when a statement is planned.  gd.status_changes shows
 * the table; docs/architecture.md draws it.
 */
#pragma once

extern "C" {
#include "postgres.h"
}

#include <optional>

/*
 * An instance's status.  The names are the gd.status domain's
 * (sql/src/10_schema.sql), the live ones first: gd._live_statuses() and
 * gd._terminal_statuses() are made from this list.
 */
enum class Status { runnable, executing, awaiting_signal, awaiting_children, done, failed, cancelled };
constexpr int GD_STATUS_COUNT = static_cast<int>(Status::cancelled) + 1;
const char *gd_status_name(Status status);
inline bool gd_status_is_live(Status status) { return status <= Status::awaiting_children; }

/* The paths that change statuses: the table's "writer" column (their names are its SQL spelling). */
enum class StatusWriter { insert, step, completion, claim, release, lease_expiry, crash, resume, revive, cancel, compensate,
                          rewind };

/* One allowed change: `from` nothing is a new row. */
struct StatusChange {
    StatusWriter writer;
    std::optional<Status> from;
    Status to;
};

/* Raise an internal error unless the table lets `writer` move an instance to `to`. */
void gd_status_change_check(StatusWriter writer, Status to);
/* The statuses `writer` moves instances out of, a text[] for a statement's `status = ANY ($n)`. */
Datum gd_statuses_before(StatusWriter writer);

/* A status in the engine's SQL text, for statements that read statuses:
 * GD_STATUS(runnable) is 'runnable' (test/t/060_instance_states.pl checks
 * that each names a status, and that no other spelling is used). */
#define GD_STATUS(name) "'" #name "'"
