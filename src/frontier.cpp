/*
 * frontier.cpp — where each queue's runnable rows begin, so a pick does not
 * walk the entries of rows already run.
 *
 * A row run leaves its entry in the pick (or claim) index until vacuum can
 * remove it: until every snapshot that might still see the row is gone.  A
 * transaction left open for minutes keeps all of them, and a pick that
 * started from the front of the index would visit every one, its cost
 * growing with the work done since.  So each queue has a frontier in shared
 * memory: per lane (priority, owner, fairness lane), a key before which no
 * unclaimed runnable row lies.
 * Picks start at the marks and raise them past the rows they lock; whatever
 * makes a row runnable announces its key at commit (the wake-up of
 * wakeup.cpp, the external-work trigger of notify.cpp), lowering the mark;
 * and a pick's own rows are announced again at the end of its transaction
 * (at commit they may still be runnable: throttled, or not reached; on abort
 * they are all given back).  A pick raises a mark only as far as the keys
 * announced since it began allow: what committed after its snapshot it did
 * not see.
 *
 * A pick scans from the front when a queue has no frontier yet, when an
 * announcement had no key, and when more lanes are in use than the frontier
 * tracks.  What nothing announces (a row changed by hand, a row locked by a
 * session that let go without a change, a prepared transaction committed
 * later) the reaper finds: every second or so it looks from the front of each
 * queue and lowers the marks to the first row of each lane, as an
 * announcement would — less often when its look is slow, which is when a
 * held horizon has left many entries there.  That slow look is the reaper's,
 * never a pick's: a pick that scanned from the front for it would hold up its
 * round, and announcements overflowing the ring meanwhile would leave the
 * frontier unknown, so that the next pick scanned from the front again.
 */
#include "gen_durable.hpp"
#include "guard.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/spin.h"
}

#include <boost/container/small_vector.hpp>

namespace {

/* The reaper's looks from the front: at least a second apart, and so far apart that they take at most 5% of
 * its time. */
constexpr int64 AUDIT_INTERVAL_US = USECS_PER_SEC;
constexpr int64 AUDIT_SHARE = 20;

struct Lock {
    explicit Lock(QueueFrontier *f) : frontier(f) { SpinLockAcquire(&frontier->mutex); }
    ~Lock() { SpinLockRelease(&frontier->mutex); }
    QueueFrontier *frontier;
};

bool of_queue(const QueueFrontier &f, Oid database, const char *queue, bool external)
{
    return f.in_use && f.database == database && f.external == external && strcmp(f.queue, queue) == 0;
}

/* The frontier of (database, queue, external, scope), made if missing and there is room; nullptr if not. */
QueueFrontier *find_or_make(Oid database, const char *queue, bool external, uint32 scope)
{
    if (gd_shared == nullptr)
        return nullptr; /* not preloaded (gd_drain on such a server): every pick scans from the front */
    QueueFrontier *frontiers = gd_shared->frontiers;
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    for (int i = 0; i < GD_MAX_FRONTIERS; i++) {
        QueueFrontier &f = frontiers[i];
        if (of_queue(f, database, queue, external) && f.scope == scope) {
            LWLockRelease(gd_shared->lock);
            return &f;
        }
    }
    LWLockRelease(gd_shared->lock);
    LWLockAcquire(gd_shared->lock, LW_EXCLUSIVE);
    QueueFrontier *found = nullptr, *free_entry = nullptr;
    for (int i = 0; i < GD_MAX_FRONTIERS && found == nullptr; i++) {
        QueueFrontier &f = frontiers[i];
        if (of_queue(f, database, queue, external) && f.scope == scope)
            found = &f;
        else if (!f.in_use && free_entry == nullptr)
            free_entry = &f;
    }
    if (found == nullptr && free_entry != nullptr) {
        Lock lock(free_entry);
        free_entry->in_use = true;
        free_entry->database = database;
        free_entry->external = external;
        free_entry->scope = scope;
        strlcpy(free_entry->queue, queue, sizeof(free_entry->queue));
        free_entry->known = false;
        free_entry->audited_at = 0;
        free_entry->audit_us = 0;
        free_entry->count = 0;
        found = free_entry;
    }
    LWLockRelease(gd_shared->lock);
    return found;
}

int mark_of(const QueueFrontier &f, const PickKey &key)
{
    for (int i = 0; i < f.count; i++)
        if (gd_same_lane(f.marks[i], key))
            return i;
    return -1;
}

/* Whether lane a comes before lane b in the index. */
bool lane_less(const PickKey &a, const PickKey &b)
{
    if (a.priority != b.priority)
        return a.priority < b.priority;
    if (a.owner != b.owner)
        return a.owner < b.owner;
    return a.fairness_lane < b.fairness_lane;
}

/* Lower the key's lane's mark to key, adding the lane (in order) if it has none; false if no room. */
bool lower(QueueFrontier &f, const PickKey &key)
{
    int at = mark_of(f, key);
    if (at >= 0) {
        if (gd_key_less(key, f.marks[at]))
            f.marks[at] = key;
        return true;
    }
    if (f.count == GD_FRONTIER_LANES)
        return false;
    int pos = f.count;
    while (pos > 0 && lane_less(key, f.marks[pos - 1])) {
        f.marks[pos] = f.marks[pos - 1];
        pos--;
    }
    f.marks[pos] = key;
    f.count++;
    return true;
}

/* Whether the announcements since the view are all still in the ring. */
bool ring_covers(const QueueFrontier &f, const FrontierView &view)
{
    return f.announced - view.announced <= static_cast<uint64>(GD_FRONTIER_RING);
}

/* ---- announcements at the end of this transaction ---- */

struct PendingAnnouncement {
    char queue[NAMEDATALEN];
    bool external;
    bool anywhere; /* a row at an unknown key */
    bool also_on_abort;
    PickKey key;   /* the lowest announced of its lane */
};

/* Backend-local, cleared at the end of every transaction. */
boost::container::small_vector<PendingAnnouncement, 4> pending;

} // namespace

bool gd_same_lane(const PickKey &a, const PickKey &b)
{
    return a.priority == b.priority && a.owner == b.owner && a.fairness_lane == b.fairness_lane;
}

bool gd_key_less(const PickKey &a, const PickKey &b)
{
    if (!gd_same_lane(a, b))
        return lane_less(a, b);
    if (a.eligible_at != b.eligible_at)
        return a.eligible_at < b.eligible_at;
    return a.id < b.id;
}

void gd_frontiers_init(QueueFrontier *frontiers)
{
    for (int i = 0; i < GD_MAX_FRONTIERS; i++) {
        SpinLockInit(&frontiers[i].mutex);
        frontiers[i].in_use = false;
    }
}

FrontierView gd_frontier_view(const char *queue, bool external, uint32 scope)
{
    FrontierView view{};
    view.entry = find_or_make(MyDatabaseId, queue, external, scope);
    view.from_front = true;
    view.marks = static_cast<PickKey *>(palloc(sizeof(PickKey) * GD_FRONTIER_LANES));
    if (view.entry == nullptr)
        return view;
    Lock lock(view.entry);
    QueueFrontier &f = *view.entry;
    view.announced = f.announced;
    if (!f.known)
        return view;
    view.from_front = false;
    view.count = f.count;
    memcpy(view.marks, f.marks, sizeof(PickKey) * f.count);
    return view;
}

void gd_frontier_found(const FrontierView &view, const PickKey *firsts, int count)
{
    if (view.entry == nullptr)
        return;
    Lock lock(view.entry);
    QueueFrontier &f = *view.entry;
    PickKey current[GD_FRONTIER_LANES];
    int current_count = f.count;
    memcpy(current, f.marks, sizeof(PickKey) * f.count);
    bool exact = ring_covers(f, view) && count <= GD_FRONTIER_LANES;
    f.count = 0;
    bool fits = true;
    for (int i = 0; i < count && fits; i++)
        fits = lower(f, firsts[i]);
    if (exact) {
        /* What committed after the scan's snapshot it could not see: the announcements since. */
        for (uint64 a = view.announced; a < f.announced && fits; a++)
            fits = lower(f, f.ring[a % GD_FRONTIER_RING]);
        f.known = fits;
    } else {
        /* Too much was announced meanwhile to tell what: keep the old marks too, and scan again. */
        for (int i = 0; i < current_count && fits; i++)
            fits = lower(f, current[i]);
        f.known = false;
    }
}

void gd_frontier_passed(const FrontierView &view, const PickKey *last, int count)
{
    if (view.entry == nullptr)
        return;
    Lock lock(view.entry);
    QueueFrontier &f = *view.entry;
    if (!ring_covers(f, view))
        return; /* it may have missed more than the ring holds: leave the marks where they are */
    for (int i = 0; i < count; i++) {
        int at = mark_of(f, last[i]);
        if (at < 0)
            continue;
        PickKey bound = last[i];
        for (uint64 a = view.announced; a < f.announced; a++) {
            const PickKey &announced = f.ring[a % GD_FRONTIER_RING];
            if (gd_same_lane(announced, bound) && gd_key_less(announced, bound))
                bound = announced;
        }
        if (gd_key_less(f.marks[at], bound))
            f.marks[at] = bound;
    }
}

int gd_frontiers_to_audit(FrontierAudit *out, int max)
{
    if (gd_shared == nullptr)
        return 0;
    TimestampTz now = GetCurrentTimestamp();
    int count = 0;
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    for (int i = 0; i < GD_MAX_FRONTIERS && count < max; i++) {
        QueueFrontier &f = gd_shared->frontiers[i];
        Lock lock(&f);
        if (!f.in_use || f.database != MyDatabaseId ||
            !gd_interval_passed(f.audited_at, now, Max(AUDIT_INTERVAL_US, AUDIT_SHARE * f.audit_us)))
            continue;
        bool listed = false;
        for (int j = 0; j < count && !listed; j++)
            listed = out[j].external == f.external && strcmp(out[j].queue, f.queue) == 0;
        if (!listed) {
            strlcpy(out[count].queue, f.queue, sizeof(out[count].queue));
            out[count++].external = f.external;
        }
    }
    LWLockRelease(gd_shared->lock);
    return count;
}

void gd_frontier_audited(const FrontierAudit &audit, const PickKey *firsts, int count, int64 audit_us)
{
    for (int i = 0; i < count; i++)
        gd_frontier_announce(MyDatabaseId, audit.queue, audit.external, &firsts[i]);
    TimestampTz now = GetCurrentTimestamp();
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    for (int i = 0; i < GD_MAX_FRONTIERS; i++) {
        QueueFrontier &f = gd_shared->frontiers[i];
        Lock lock(&f);
        if (of_queue(f, MyDatabaseId, audit.queue, audit.external)) {
            f.audited_at = now;
            f.audit_us = audit_us;
        }
    }
    LWLockRelease(gd_shared->lock);
}

void gd_frontier_announce(Oid database, const char *queue, bool external, const PickKey *key)
{
    /* A queue without a frontier yet has nothing to lower: its first pick scans from the front. */
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    for (int i = 0; i < GD_MAX_FRONTIERS; i++) {
        QueueFrontier &f = gd_shared->frontiers[i];
        if (!of_queue(f, database, queue, external))
            continue;
        Lock lock(&f);
        if (key == nullptr || !lower(f, *key)) {
            f.known = false;
            f.announced += GD_FRONTIER_RING + 1; /* picks under way cannot tell what they missed */
        } else {
            f.ring[f.announced % GD_FRONTIER_RING] = *key;
            f.announced++;
        }
    }
    LWLockRelease(gd_shared->lock);
}

void gd_frontier_announce_at_end(const char *queue, bool external, const PickKey *key, bool also_on_abort)
{
    /* One entry per queue and lane (a key lowers its own lane's mark only), and one for "anywhere". */
    for (PendingAnnouncement &p : pending)
        if (p.external == external && p.anywhere == (key == nullptr) && strcmp(p.queue, queue) == 0 &&
            (key == nullptr || gd_same_lane(p.key, *key))) {
            if (key != nullptr && gd_key_less(*key, p.key))
                p.key = *key;
            p.also_on_abort = p.also_on_abort || also_on_abort;
            return;
        }
    PendingAnnouncement p{};
    strlcpy(p.queue, queue, sizeof(p.queue));
    p.external = external;
    p.anywhere = key == nullptr;
    if (key != nullptr)
        p.key = *key;
    p.also_on_abort = also_on_abort;
    gd::cpp_entry([&] { pending.push_back(p); });
}

void gd_frontier_transaction_end(bool committed)
{
    if (gd_shared != nullptr)
        for (const PendingAnnouncement &p : pending)
            if (committed || p.also_on_abort)
                gd_frontier_announce(MyDatabaseId, p.queue, p.external, p.anywhere ? nullptr : &p.key);
    pending.clear();
}
