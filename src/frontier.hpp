/*
 * frontier.hpp — where each queue's runnable rows begin in its pick (or
 * claim) index, shared by every backend that picks from it (frontier.cpp).
 */
#pragma once

extern "C" {
#include "postgres.h"
#include "storage/s_lock.h"
#include "utils/timestamp.h"
}

/*
 * A row's place in the pick and claim indexes (after the queue).  Its lane
 * is (priority, owner, fairness_lane): a pick shares its batch between the
 * lanes of a priority (picker.cpp), and takes each lane's rows in order.
 */
struct PickKey {
    int32 priority;
    Oid owner;
    int32 fairness_lane;
    TimestampTz eligible_at;
    int64 id;
};

bool gd_key_less(const PickKey &a, const PickKey &b);
bool gd_same_lane(const PickKey &a, const PickKey &b);

constexpr int GD_FRONTIER_LANES = 32; /* lanes a queue's frontier tracks before it gives up */
constexpr int GD_FRONTIER_RING = 64;      /* recent announcements, to tell a pick what it may have missed */
constexpr int GD_MAX_FRONTIERS = 128;     /* (database, queue, in-database or external) entries */

/*
 * One queue's frontier: for each lane in use, a key before which no
 * unclaimed runnable row of that priority lies, so a pick starts there
 * rather than at the front of the index, past the entries of rows already
 * run (which stay until vacuum removes them: as long as the oldest
 * snapshot needs them).  Announcements lower it; picks raise it.
 */
struct QueueFrontier {
    slock_t mutex;
    bool in_use;
    bool external;
    Oid database;
    char queue[NAMEDATALEN];
    uint32 scope;            /* which FSMs' rows: 0 all of them, else a hash of the FSM names (a claim's) */
    bool known;              /* the marks hold: else the next pick scans from the front */
    TimestampTz audited_at;  /* the reaper's last look from the front */
    int64 audit_us;          /* how long it took */
    int count;
    PickKey marks[GD_FRONTIER_LANES]; /* by lane, ascending */
    uint64 announced;        /* announcements so far; the last GD_FRONTIER_RING are in ring */
    PickKey ring[GD_FRONTIER_RING];
};

/* What a pick starts from: its frontier's marks, or the front of the index. */
struct FrontierView {
    QueueFrontier *entry; /* nullptr: the table is full, scan from the front */
    bool from_front;
    int count;
    PickKey *marks;   /* palloc'd: count keys, by lane */
    uint64 announced; /* when the view was taken */
};

void gd_frontiers_init(QueueFrontier *frontiers);

/* The frontier of this database's queue (in-database steps, or external
 * ones) to pick from: of every row (scope 0), or of the rows of some FSMs
 * only (a claim of the FSMs a worker may use passes the others' rows by:
 * their pickers have frontiers of their own). */
FrontierView gd_frontier_view(const char *queue, bool external, uint32 scope = 0);
/* A pick's scan from the front found these keys: the first row of each lane (ascending). */
void gd_frontier_found(const FrontierView &view, const PickKey *firsts, int count);
/* A pick from the view locked rows up to last[i] in the lane of last[i] (one per lane, ascending). */
void gd_frontier_passed(const FrontierView &view, const PickKey *last, int count);

/* A queue whose frontiers the reaper looks at from the front (frontier.cpp's header says why). */
struct FrontierAudit {
    char queue[NAMEDATALEN];
    bool external;
};
/* This database's queues due for that look (up to max). */
int gd_frontiers_to_audit(FrontierAudit *out, int max);
/* The look found these keys, the first row of each lane, in audit_us: lower the queue's marks to them; the
 * next look comes at least a second, and 20 × audit_us, later. */
void gd_frontier_audited(const FrontierAudit &audit, const PickKey *firsts, int count, int64 audit_us);

/* Rows of the queue at `key` or after may be runnable and unclaimed (nullptr: anywhere) — now, in shared
 * memory, in each of the queue's frontiers, whatever their scope. */
void gd_frontier_announce(Oid database, const char *queue, bool external, const PickKey *key);
/* The same, at the end of this transaction: at commit only, or whether it commits or aborts. */
void gd_frontier_announce_at_end(const char *queue, bool external, const PickKey *key, bool also_on_abort);
/* Called by wakeup.cpp's transaction callback before it wakes anyone. */
void gd_frontier_transaction_end(bool committed);
