/*
 * notify.cpp — telling external workers of work, at the commit of whatever
 * makes external work runnable now: the claims waiting in the server for
 * the queue are woken (claim_wait.cpp), and NOTIFY gd_work, '<queue>' is
 * sent while some session listens.
 *
 * Row triggers on gd._instances (and gd._queues, for a resumed queue) record
 * the queue and when the work becomes eligible (and announce the row's key to
 * the queue's claim frontier, frontier.cpp).  Just before commit
 * (XACT_EVENT_PRE_COMMIT, which runs before PostgreSQL queues the
 * transaction's notifications) each recorded queue whose work is eligible by
 * then gets one Async_Notify, so listeners hear of it exactly when the rows
 * become visible.  Work eligible later is announced by the reaper when it
 * comes due (gd._announce_due_external).
 *
 * NOTIFY takes a cluster-wide lock at commit, so a queue is notified at most
 * once per transaction, only when it has external work, and only while some
 * session of the cluster has run LISTEN gd_work (and not UNLISTEN or
 * DISCARD ALL since; the utility hook tells us, gd_note_listening): workers
 * that wait in gd_claim keep it off every commit.  What a rolled
 * back subtransaction recorded is forgotten; an aborted or prepared
 * transaction notifies nothing (a prepared one's work is found by the
 * workers' poll).  Executors are never woken this way (see wakeup.cpp).
 * The waiting claims are woken by wakeup.cpp's commit callback, after it has
 * lowered the claim frontiers to the rows announced: a claim woken before
 * that would pick from the old marks, miss the rows and sleep again.
 */
#include "gen_durable.hpp"
#include "guard.hpp"

extern "C" {
#include "executor/spi.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "commands/async.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "utils/builtins.h"
#include "utils/rel.h"
}

#include <algorithm>
#include <boost/container/small_vector.hpp>

namespace {

constexpr const char *CHANNEL = "gd_work";

struct PendingNotify {
    char queue[NAMEDATALEN];
    TimestampTz eligible_at; /* the earliest recorded: notified if due by commit */
    int level;               /* transaction nesting level that recorded it */
};

/* Backend-local, cleared at the end of every transaction. */
boost::container::small_vector<PendingNotify, 4> pending;
/* The queues whose waiting claims are woken once the commit is visible. */
boost::container::small_vector<PendingNotify, 4> due;
bool callbacks_registered = false;

/* This session has run LISTEN gd_work (counted in gd_shared->work_listeners). */
bool listening = false;

void send_due_notifications()
{
    TimestampTz now = GetCurrentTimestamp();
    bool someone_listens = gd_shared == nullptr || pg_atomic_read_u32(&gd_shared->work_listeners) > 0;
    for (const PendingNotify &p : pending)
        if (p.eligible_at <= now) {
            if (someone_listens) {
                Async_Notify(CHANNEL, p.queue);
                gd_count(StatEvent::work_notified);
            }
            gd::cpp_entry([&] { due.push_back(p); });
        }
}

void on_transaction_end(XactEvent event, void *)
{
    switch (event) {
    case XACT_EVENT_PRE_COMMIT:
        /* Every subtransaction has ended: one entry per queue is left. */
        send_due_notifications();
        pending.clear();
        break;
    case XACT_EVENT_COMMIT:
        break; /* wakeup.cpp's callback wakes the claims, once it has lowered the claim frontiers */
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PREPARE:
    case XACT_EVENT_PRE_PREPARE:
        due.clear();
        pending.clear();
        break;
    default:
        break;
    }
}

void stop_listening(int, Datum)
{
    if (listening && gd_shared != nullptr)
        pg_atomic_fetch_sub_u32(&gd_shared->work_listeners, 1);
    listening = false;
}

void note_listening(bool now_listening)
{
    if (gd_shared == nullptr || now_listening == listening)
        return;
    static bool exit_callback_registered = false;
    if (!exit_callback_registered) {
        before_shmem_exit(stop_listening, 0);
        exit_callback_registered = true;
    }
    if (now_listening)
        pg_atomic_fetch_add_u32(&gd_shared->work_listeners, 1);
    else
        pg_atomic_fetch_sub_u32(&gd_shared->work_listeners, 1);
    listening = now_listening;
}

/* A subtransaction's entries die with it, or pass to its parent. */
void on_subtransaction_end(SubXactEvent event, SubTransactionId, SubTransactionId, void *)
{
    if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
        return;
    int level = GetCurrentTransactionNestLevel();
    auto ending = [level](const PendingNotify &p) { return p.level >= level; };
    if (event == SUBXACT_EVENT_COMMIT_SUB) {
        for (PendingNotify &child : pending) {
            if (!ending(child))
                continue;
            child.level = level - 1;
            for (PendingNotify &parent : pending)
                if (&parent != &child && parent.level == level - 1 && strcmp(parent.queue, child.queue) == 0) {
                    parent.eligible_at = Min(parent.eligible_at, child.eligible_at);
                    child.level = INT_MAX; /* merged: dropped below */
                    break;
                }
        }
        pending.erase(std::remove_if(pending.begin(), pending.end(),
                                     [](const PendingNotify &p) { return p.level == INT_MAX; }),
                      pending.end());
    } else {
        pending.erase(std::remove_if(pending.begin(), pending.end(), ending), pending.end());
    }
}

void record(const char *queue, TimestampTz eligible_at)
{
    if (!callbacks_registered) {
        RegisterXactCallback(on_transaction_end, nullptr);
        RegisterSubXactCallback(on_subtransaction_end, nullptr);
        callbacks_registered = true;
    }
    int level = GetCurrentTransactionNestLevel();
    for (PendingNotify &p : pending)
        if (p.level == level && strcmp(p.queue, queue) == 0) {
            p.eligible_at = Min(p.eligible_at, eligible_at);
            return;
        }
    PendingNotify p{};
    strlcpy(p.queue, queue, sizeof(p.queue));
    p.eligible_at = eligible_at;
    p.level = level;
    gd::cpp_entry([&] { pending.push_back(p); });
}

Datum column_value(TriggerData *trigger, HeapTuple tuple, const char *column)
{
    TupleDesc desc = RelationGetDescr(trigger->tg_relation);
    int attnum = SPI_fnumber(desc, column);
    if (attnum <= 0)
        elog(ERROR, "gen_durable: trigger %s: no column \"%s\"", trigger->tg_trigger->tgname, column);
    bool isnull;
    Datum value = heap_getattr(tuple, attnum, desc, &isnull);
    if (isnull)
        elog(ERROR, "gen_durable: trigger %s: column \"%s\" is NULL", trigger->tg_trigger->tgname, column);
    return value;
}

} // namespace

void gd_wake_claimers_at_commit()
{
    for (const PendingNotify &p : due)
        gd_wake_claimers(p.queue);
    due.clear();
}

void gd_note_listening(const Node *statement)
{
    /* (A LISTEN its transaction rolls back is counted too: a NOTIFY no one hears.) */
    if (IsA(statement, ListenStmt)) {
        if (strcmp(reinterpret_cast<const ListenStmt *>(statement)->conditionname, CHANNEL) == 0)
            note_listening(true);
    } else if (IsA(statement, UnlistenStmt)) {
        const char *channel = reinterpret_cast<const UnlistenStmt *>(statement)->conditionname;
        if (channel == nullptr || strcmp(channel, CHANNEL) == 0)
            note_listening(false);
    } else if (IsA(statement, DiscardStmt)) {
        if (reinterpret_cast<const DiscardStmt *>(statement)->target == DISCARD_ALL)
            note_listening(false);
    }
}

void gd_notify_external_at_commit(const char *queue)
{
    record(queue, GetCurrentTimestamp());
}

/* gd._notify_work_on_commit(queue text): NOTIFY gd_work, queue at commit. */
GD_SQL_FUNCTION(gd_notify_work_on_commit)
{
    char queue[NAMEDATALEN];
    text_to_cstring_buffer(PG_GETARG_TEXT_PP(0), queue, sizeof(queue));
    gd_notify_external_at_commit(queue);
    PG_RETURN_VOID();
}

/*
 * Row trigger gd._external_work_changed(queue_column [, eligible_at_column]):
 * the new row is runnable external work of that queue.
 */
GD_SQL_FUNCTION(gd_external_work_changed)
{
    if (!CALLED_AS_TRIGGER(fcinfo))
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("gen_durable: gd._external_work_changed() must be called as a trigger")));
    TriggerData *trigger = reinterpret_cast<TriggerData *>(fcinfo->context);
    if (!TRIGGER_FIRED_FOR_ROW(trigger->tg_event) || trigger->tg_trigger->tgnargs < 1)
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("gen_durable: trigger %s must fire for each row and name the queue column",
                               trigger->tg_trigger->tgname)));
    HeapTuple row = TRIGGER_FIRED_BY_UPDATE(trigger->tg_event) ? trigger->tg_newtuple : trigger->tg_trigtuple;
    char **args = trigger->tg_trigger->tgargs;
    char queue[NAMEDATALEN];
    text_to_cstring_buffer(DatumGetTextPP(column_value(trigger, row, args[0])), queue, sizeof(queue));
    TimestampTz eligible_at = GetCurrentTimestamp();
    if (trigger->tg_trigger->tgnargs > 1) { /* a row of gd._instances: its place in the claim index too */
        eligible_at = DatumGetTimestampTz(column_value(trigger, row, args[1]));
        PickKey key{DatumGetInt32(column_value(trigger, row, "priority")),
                    DatumGetObjectId(column_value(trigger, row, "owner")),
                    DatumGetInt32(column_value(trigger, row, "fairness_lane")), eligible_at,
                    DatumGetInt64(column_value(trigger, row, "id"))};
        gd_frontier_announce_at_end(queue, true, &key, false);
    }
    record(queue, eligible_at);
    return PointerGetDatum(nullptr);
}
