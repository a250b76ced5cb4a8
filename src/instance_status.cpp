/*
 * instance_status.cpp — the statuses of an instance and the table of their
 * changes (see instance_status.hpp), and the SQL that reads them:
 * gd._live_statuses(), gd._terminal_statuses(), gd.read_status_changes() (the
 * table, for the view gd.status_changes), gd._statuses_before(writer) and
 * gd._status_after(writer, status) (what the engine's statements that write
 * statuses are made of).
 */
#include "instance_status.hpp"
#include "guard.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"
}

namespace {

constexpr const char *status_names[GD_STATUS_COUNT] = {"runnable", "executing", "awaiting_signal",
                                                       "awaiting_children", "done", "failed", "cancelled"};

struct WriterInfo {
    StatusWriter writer;
    const char *name;
    const char *by; /* what writes it */
};

constexpr WriterInfo writers[] = {
    {StatusWriter::insert, "insert", "gd_insert, a spawn's children, a schedule's tick"},
    {StatusWriter::step, "step", "an in-database step ended (an executor's round, gd_drain)"},
    {StatusWriter::completion, "completion", "an external step ended (gd_complete, gd_complete_all)"},
    {StatusWriter::claim, "claim", "gd_claim leased the step to an external worker"},
    {StatusWriter::release, "release", "gd_release handed the claim back unrun"},
    {StatusWriter::lease_expiry, "lease_expiry", "the reaper reclaimed an expired lease (retried or failed)"},
    {StatusWriter::crash, "crash", "an executor died in the step (its attempt counted)"},
    {StatusWriter::resume, "resume", "a signal, the wait's timeout, or the last child's end"},
    {StatusWriter::revive, "revive", "gd_retry of a failed instance"},
    {StatusWriter::cancel, "cancel", "gd_cancel, of the instance and its live descendants"},
    {StatusWriter::compensate, "compensate", "gd_cancel of one whose FSM names an on_cancel step: to that step"},
    {StatusWriter::rewind, "rewind", "gd_rewind moved a failed or stuck instance back to a step"},
};

using S = Status;
using W = StatusWriter;

/* Every change the engine makes to a status, and nothing else. */
constexpr StatusChange changes[] = {
    {W::insert, std::nullopt, S::runnable},
    {W::step, S::runnable, S::runnable},
    {W::step, S::runnable, S::awaiting_signal},
    {W::step, S::runnable, S::awaiting_children},
    {W::step, S::runnable, S::done},
    {W::step, S::runnable, S::failed},
    {W::step, S::runnable, S::cancelled}, /* a compensation ended */
    {W::completion, S::executing, S::runnable},
    {W::completion, S::executing, S::awaiting_signal},
    {W::completion, S::executing, S::awaiting_children},
    {W::completion, S::executing, S::done},
    {W::completion, S::executing, S::failed},
    {W::completion, S::executing, S::cancelled},
    {W::claim, S::runnable, S::executing},
    {W::release, S::executing, S::runnable},
    {W::lease_expiry, S::executing, S::runnable},
    {W::lease_expiry, S::executing, S::failed},
    {W::crash, S::runnable, S::runnable},
    {W::crash, S::runnable, S::failed},
    {W::resume, S::awaiting_signal, S::runnable},
    {W::resume, S::awaiting_children, S::runnable},
    {W::revive, S::failed, S::runnable},
    {W::cancel, S::runnable, S::cancelled},
    {W::cancel, S::executing, S::cancelled},
    {W::cancel, S::awaiting_signal, S::cancelled},
    {W::cancel, S::awaiting_children, S::cancelled},
    {W::compensate, S::runnable, S::runnable},
    {W::compensate, S::executing, S::runnable},
    {W::compensate, S::awaiting_signal, S::runnable},
    {W::compensate, S::awaiting_children, S::runnable},
    {W::rewind, S::runnable, S::runnable},
    {W::rewind, S::executing, S::runnable},
    {W::rewind, S::awaiting_signal, S::runnable},
    {W::rewind, S::awaiting_children, S::runnable},
    {W::rewind, S::failed, S::runnable},
};

const char *writer_name(StatusWriter writer)
{
    for (const WriterInfo &info : writers)
        if (info.writer == writer)
            return info.name;
    pg_unreachable();
}

bool allowed(StatusWriter writer, Status to)
{
    for (const StatusChange &change : changes)
        if (change.writer == writer && change.to == to)
            return true;
    return false;
}

/* The writer a SQL caller names; raises for a name the table does not have. */
StatusWriter writer_named(text *name)
{
    char *wanted = text_to_cstring(name);
    for (const WriterInfo &info : writers)
        if (strcmp(info.name, wanted) == 0)
            return info.writer;
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
                    errmsg("gen_durable: internal error: no status writer \"%s\"", wanted)));
    pg_unreachable();
}

Datum text_array(const char *const *names, int count)
{
    Datum *items = static_cast<Datum *>(palloc(sizeof(Datum) * Max(count, 1)));
    for (int i = 0; i < count; i++)
        items[i] = CStringGetTextDatum(names[i]);
    return PointerGetDatum(construct_array(items, count, TEXTOID, -1, false, TYPALIGN_INT));
}

/* The names of the statuses that are live (or not), in their order. */
Datum status_names_where_live(bool live)
{
    const char *names[GD_STATUS_COUNT];
    int count = 0;
    for (int s = 0; s < GD_STATUS_COUNT; s++)
        if (gd_status_is_live(static_cast<Status>(s)) == live)
            names[count++] = status_names[s];
    return text_array(names, count);
}

} // namespace

const char *gd_status_name(Status status)
{
    return status_names[static_cast<int>(status)];
}

void gd_status_change_check(StatusWriter writer, Status to)
{
    if (!allowed(writer, to))
        ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
                        errmsg("gen_durable: internal error: a %s may not make an instance %s", writer_name(writer),
                               gd_status_name(to))));
}

Datum gd_statuses_before(StatusWriter writer)
{
    const char *names[GD_STATUS_COUNT];
    int count = 0;
    for (int s = 0; s < GD_STATUS_COUNT; s++)
        for (const StatusChange &change : changes)
            if (change.writer == writer && change.from == static_cast<Status>(s)) {
                names[count++] = status_names[s];
                break;
            }
    return text_array(names, count);
}

/* gd._live_statuses() → text[]: the statuses of an instance still going. */
GD_SQL_FUNCTION(gd_live_statuses)
{
    PG_RETURN_DATUM(status_names_where_live(true));
}

/* gd._terminal_statuses() → text[]: the statuses an instance ends in. */
GD_SQL_FUNCTION(gd_terminal_statuses)
{
    PG_RETURN_DATUM(status_names_where_live(false));
}

/* gd.read_status_changes() → (writer, from_status, to_status, by): the table, in its order. */
GD_SQL_FUNCTION(gd_status_changes)
{
    InitMaterializedSRF(fcinfo, 0);
    auto *result_info = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    for (const StatusChange &change : changes) {
        const char *by = "";
        for (const WriterInfo &info : writers)
            if (info.writer == change.writer)
                by = info.by;
        Datum values[4] = {CStringGetTextDatum(writer_name(change.writer)),
                           change.from ? CStringGetTextDatum(gd_status_name(*change.from)) : 0,
                           CStringGetTextDatum(gd_status_name(change.to)), CStringGetTextDatum(by)};
        bool nulls[4] = {false, !change.from.has_value(), false, false};
        tuplestore_putvalues(result_info->setResult, result_info->setDesc, values, nulls);
    }
    return static_cast<Datum>(0);
}

/* gd._statuses_before(writer text) → text[]: the statuses the writer moves instances out of. */
GD_SQL_FUNCTION(gd_statuses_before_sql)
{
    PG_RETURN_DATUM(gd_statuses_before(writer_named(PG_GETARG_TEXT_PP(0))));
}

/* gd._status_after(writer text, status text) → text: the status, once the table lets the writer write it. */
GD_SQL_FUNCTION(gd_status_after)
{
    StatusWriter writer = writer_named(PG_GETARG_TEXT_PP(0));
    char *wanted = text_to_cstring(PG_GETARG_TEXT_PP(1));
    for (int s = 0; s < GD_STATUS_COUNT; s++)
        if (strcmp(status_names[s], wanted) == 0) {
            gd_status_change_check(writer, static_cast<Status>(s));
            PG_RETURN_DATUM(PG_GETARG_DATUM(1));
        }
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("gen_durable: internal error: no status \"%s\"", wanted)));
    pg_unreachable();
}
