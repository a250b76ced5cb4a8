/*
 * engine_locks.cpp — the engine's own heavyweight locks: a concurrency key
 * (admission and release under it take turns) and an FSM name (one
 * definition of it at a time).
 *
 * They are advisory locks of a class no SQL function can name (the
 * pg_advisory_* functions take classes 1 and 2 only), so no role can take
 * one from its own session to hold the engine back: a role holds one only
 * through the API, for its own key or its own FSM name, while the
 * transaction that called it is open.  And an engine worker never waits for
 * one: under a key another transaction holds, it admits nothing now and
 * leaves the key to the reaper's repair (gd._repair_keys), which tries again
 * every round; an FSM name being defined fails the step that defines it
 * again (its attempt is retried).  Sessions wait, as for any lock, under
 * their own lock_timeout and statement_timeout.  pg_locks shows the locks as
 * locktype 'advisory' with objsubid the class (docs/internals.md).
 *
 * Here too the bound on the waits an engine worker cannot avoid but a
 * tenant's open transaction could make long (a tick's or a child's
 * correlation key that transaction is inserting): gd_bound_lock_waits.
 */
#include "gen_durable.hpp"
#include "guard.hpp"
#include "labelled_stats.hpp"

extern "C" {
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/guc.h"
}

namespace {

/* The lock classes, in objsubid of pg_locks ('g' 'd' and a number: clear of other extensions' small ones). */
enum class EngineLock : uint16 { concurrency_key = 0x6764, fsm_name = 0x6765 };

/* The lock of `name` of a class; `scope` separates the key spaces of one class (an owner, or 0). */
LOCKTAG engine_lock_tag(EngineLock lock, Oid scope, const text *name)
{
    uint64 hash = hash_bytes_extended(reinterpret_cast<const unsigned char *>(VARDATA_ANY(name)),
                                      static_cast<int>(VARSIZE_ANY_EXHDR(name)), scope);
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, static_cast<uint32>(hash >> 32), static_cast<uint32>(hash),
                         static_cast<uint16>(lock));
    return tag;
}

/* Take the lock for the transaction, now if it is free; false when another transaction holds it. */
bool try_lock(const LOCKTAG &tag)
{
    return LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

void wait_for_lock(const LOCKTAG &tag)
{
    (void) LockAcquire(&tag, ExclusiveLock, false, false);
}

} // namespace

bool gd_lock_concurrency_key(Oid key_owner, const text *key, bool shared)
{
    LOCKTAG tag = engine_lock_tag(EngineLock::concurrency_key, shared ? InvalidOid : key_owner, key);
    if (try_lock(tag))
        return true;
    gd_count(StatEvent::concurrency_contended);
    gd_count_limit(LimitKind::concurrency, text_to_cstring(key), LimitCounts{0, 0, 0, 1});
    WorkerKind worker = gd_my_worker_kind();
    if (worker == WorkerKind::free) {
        wait_for_lock(tag);
        return true;
    }
    if (worker != WorkerKind::reaper)
        gd_wake_reaper_at_commit(); /* its repair makes the room this transaction could not */
    return false;
}

/* gd._lock_key(key_owner oid, key text, shared boolean) → boolean: gd_lock_concurrency_key. */
GD_SQL_FUNCTION(gd_lock_key)
{
    PG_RETURN_BOOL(gd_lock_concurrency_key(PG_GETARG_OID(0), PG_GETARG_TEXT_PP(1), PG_GETARG_BOOL(2)));
}

/*
 * gd._lock_fsm_name(name text): one definition of an FSM name at a time, until
 * the transaction ends.  An engine worker (a handler defining FSMs) does not
 * wait: 55P03, and its step is tried again.
 */
GD_SQL_FUNCTION(gd_lock_fsm_name)
{
    text *name = PG_GETARG_TEXT_PP(0);
    LOCKTAG tag = engine_lock_tag(EngineLock::fsm_name, InvalidOid, name);
    if (try_lock(tag))
        PG_RETURN_VOID();
    if (gd_my_worker_kind() != WorkerKind::free)
        ereport(ERROR, (errcode(ERRCODE_LOCK_NOT_AVAILABLE),
                        errmsg("gen_durable: FSM \"%s\" is being defined by another transaction",
                               text_to_cstring(name)),
                        errhint("An engine worker does not wait for it: the step is tried again.")));
    wait_for_lock(tag);
    PG_RETURN_VOID();
}

int gd_bound_lock_waits(int timeout_ms)
{
    int nest_level = NewGUCNestLevel();
    char value[32];
    snprintf(value, sizeof(value), "%dms", timeout_ms);
    (void) set_config_option("lock_timeout", value, PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
    return nest_level;
}
