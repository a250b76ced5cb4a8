/*
 * concurrency_keys.cpp — room under concurrency keys.  An instance holding
 * a key stops running (its step parks it or ends it, it is cancelled) in a
 * transaction that remembers the key (a key of the run scope is still held
 * by a parked instance: the count finds no room then); once the transaction's last
 * transition is written, the best instances waiting under all the keys are
 * admitted as far as each key's limit leaves room, in one statement, the
 * keys locked in one order (key, then owner) so two rounds never deadlock
 * on them.  gd._ungate does the same for the SQL paths (a limit raised,
 * the reaper's repair).  Limits and waiting instances are SQL's
 * (sql/src/65_concurrency.sql).
 */
#include "concurrency_keys.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
#include "instance_status.hpp"
#include "kept_plans.hpp"
#include "labelled_stats.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
}

namespace {

/* A concurrency key in its owner's key space. */
struct OwnedKey {
    Oid owner;
    const char *key;
};
/* Keys whose holders stopped running in this transaction, in TopTransactionContext. */
OwnedKey *keys_to_release = nullptr;
int keys_to_release_count = 0;
int keys_to_release_capacity = 0;

void forget_keys_at_transaction_end(XactEvent, void *)
{
    /* their memory goes with the transaction */
    keys_to_release = nullptr;
    keys_to_release_count = keys_to_release_capacity = 0;
}

} // namespace

void gd_remember_key_to_release(Oid owner, const char *key)
{
    static bool callback_registered = false;
    if (!callback_registered) {
        RegisterXactCallback(forget_keys_at_transaction_end, nullptr);
        callback_registered = true;
    }
    if (keys_to_release_count == keys_to_release_capacity) {
        keys_to_release_capacity = Max(64, 2 * keys_to_release_capacity);
        Size size = sizeof(OwnedKey) * keys_to_release_capacity;
        keys_to_release = static_cast<OwnedKey *>(keys_to_release == nullptr
                                                      ? MemoryContextAlloc(TopTransactionContext, size)
                                                      : repalloc(keys_to_release, size));
    }
    keys_to_release[keys_to_release_count++] = OwnedKey{owner, MemoryContextStrdup(TopTransactionContext, key)};
}

namespace {

/* By key, then owner: the order every path takes key locks in, so two never deadlock. */
int compare_keys(const void *a, const void *b)
{
    const auto *x = static_cast<const OwnedKey *>(a), *y = static_cast<const OwnedKey *>(b);
    int by_key = strcmp(x->key, y->key);
    return by_key != 0 ? by_key : (x->owner < y->owner ? -1 : x->owner > y->owner);
}

/* Let the best waiting instances under a shared key run (every owner's), as far as there is room. */
int admit_gated_shared(const char *key)
{
    static SPIPlanPtr admit_plan = nullptr;
    Datum args[1] = {CStringGetTextDatum(key)};
    if (gd_run_kept(admit_plan,
                    "UPDATE gd._instances i SET gated = false"
                    " WHERE i.id IN (SELECT gd._gated_best(0, $1, true,"
                    "                                      (gd._key_limit($1)).max - gd._key_holders(0, $1, gd._key_limit($1))))"
                    " RETURNING i.concurrency_key, " GD_WOKEN_COLUMNS,
                    {TEXTOID}, args, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: admitting instances under concurrency key \"%s\" failed", key);
    return static_cast<int>(SPI_processed);
}

/*
 * The same for keys in their owners' key spaces, all at once: for each
 * (owner, key) pair, its limit less the instances holding it (running, or
 * live for a key of the run scope), of the best waiting ones (an index
 * descent per key).
 */
int admit_gated_owned(Datum owners, Datum keys, Datum limits, Datum run_scopes)
{
    static SPIPlanPtr admit_plan = nullptr;
    Datum args[4] = {owners, keys, limits, run_scopes};
    if (gd_run_kept(admit_plan,
                    "UPDATE gd._instances i SET gated = false"
                    " WHERE i.id = ANY (ARRAY("
                    "       SELECT b.id FROM unnest($1::oid[], $2::text[], $3::int[], $4::bool[]) AS k(owner, key, max, run)"
                    "       CROSS JOIN LATERAL ("
                    "           SELECT w.id FROM gd._instances w"
                    "            WHERE w.concurrency_key = k.key AND w.owner = k.owner AND w.gated"
                    "              AND w.status = " GD_STATUS(runnable)
                    "            ORDER BY w.priority, w.eligible_at, w.id"
                    "            LIMIT greatest(k.max - (SELECT count(*) FROM gd._instances r"
                    "                                     WHERE r.concurrency_key = k.key AND r.owner = k.owner"
                    "                                       AND NOT r.gated AND r.status = ANY (gd._live_statuses())"
                    "                                       AND (k.run OR r.status IN (" GD_STATUS(runnable)
                    ", " GD_STATUS(executing) "))), 0)"
                    "            FOR UPDATE OF w SKIP LOCKED) b))"
                    " RETURNING i.concurrency_key, " GD_WOKEN_COLUMNS,
                    {OIDARRAYOID, TEXTARRAYOID, INT4ARRAYOID, BOOLARRAYOID}, args, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: admitting instances under concurrency keys failed");
    return static_cast<int>(SPI_processed);
}

/* Wake the queues of the rows admitted (RETURNING concurrency_key, GD_WOKEN_COLUMNS), and count them by key. */
void after_admission(int admitted)
{
    for (int r = 0; r < admitted; r++) {
        gd_wake_queue_of_returned(r, 2);
        gd_count_limit(LimitKind::concurrency, SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1),
                       LimitCounts{0, 1, 0, 0});
    }
}

/*
 * Make room under each key of `keys`: sorted here (the order every path
 * takes key locks in), each key locked (in C, no statement), then the best
 * waiting instances under all the locked keys admitted in one statement (a
 * shared key, rare, in one of its own): two statements for a batch's keys,
 * however many.  Returns how many may run now.
 */
int ungate(OwnedKey *keys, int count)
{
    if (count == 0)
        return 0;
    qsort(keys, count, sizeof(keys[0]), compare_keys);
    int distinct = 0;
    for (int i = 0; i < count; i++)
        if (distinct == 0 || compare_keys(&keys[i], &keys[distinct - 1]) != 0)
            keys[distinct++] = keys[i];
    Datum *names = static_cast<Datum *>(palloc(sizeof(Datum) * distinct));
    for (int i = 0; i < distinct; i++)
        names[i] = CStringGetTextDatum(keys[i].key);
    static SPIPlanPtr policy_plan = nullptr;
    Datum policy_args[1] = {gd_array_of(names, nullptr, distinct, TEXTOID)};
    if (gd_run_kept(policy_plan,
                    "SELECT coalesce(l.max, 1), coalesce(l.shared, false), coalesce(l.scope = 'run', false)"
                    "  FROM unnest($1::text[]) WITH ORDINALITY AS k(key, ord)"
                    "  LEFT JOIN gd._concurrency_limits l ON l.name = split_part(k.key, ':', 1)"
                    " ORDER BY k.ord",
                    {TEXTARRAYOID}, policy_args, true, 0) != SPI_OK_SELECT ||
        SPI_processed != static_cast<uint64>(distinct))
        elog(ERROR, "gen_durable: reading the limits of %d concurrency keys failed", distinct);
    SPITupleTable *policies = SPI_tuptable;
    Datum *owners = static_cast<Datum *>(palloc(sizeof(Datum) * distinct));
    Datum *owned_keys = static_cast<Datum *>(palloc(sizeof(Datum) * distinct));
    Datum *limits = static_cast<Datum *>(palloc(sizeof(Datum) * distinct));
    Datum *run_scopes = static_cast<Datum *>(palloc(sizeof(Datum) * distinct));
    const char **shared_keys = static_cast<const char **>(palloc(sizeof(char *) * distinct));
    int owned_count = 0, shared_count = 0;
    for (int i = 0; i < distinct; i++) {
        bool isnull;
        Datum limit = SPI_getbinval(policies->vals[i], policies->tupdesc, 1, &isnull);
        bool shared = DatumGetBool(SPI_getbinval(policies->vals[i], policies->tupdesc, 2, &isnull));
        if (!gd_lock_concurrency_key(keys[i].owner, DatumGetTextPP(names[i]), shared))
            continue; /* another transaction holds it: the reaper's repair makes the room */
        if (shared) {
            shared_keys[shared_count++] = keys[i].key;
            continue;
        }
        owners[owned_count] = ObjectIdGetDatum(keys[i].owner);
        owned_keys[owned_count] = names[i];
        limits[owned_count] = limit;
        run_scopes[owned_count] = SPI_getbinval(policies->vals[i], policies->tupdesc, 3, &isnull);
        owned_count++;
    }
    int admitted = 0;
    if (owned_count > 0) {
        int now = admit_gated_owned(gd_array_of(owners, nullptr, owned_count, OIDOID),
                                    gd_array_of(owned_keys, nullptr, owned_count, TEXTOID),
                                    gd_array_of(limits, nullptr, owned_count, INT4OID),
                                    gd_array_of(run_scopes, nullptr, owned_count, BOOLOID));
        after_admission(now);
        admitted += now;
    }
    for (int i = 0; i < shared_count; i++) {
        int now = admit_gated_shared(shared_keys[i]);
        after_admission(now);
        admitted += now;
    }
    return admitted;
}

} // namespace

void gd_release_concurrency_keys()
{
    int count = keys_to_release_count;
    keys_to_release_count = 0; /* the array stays, for the transaction's next keys */
    (void) ungate(keys_to_release, count);
}

/*
 * gd._ungate(owners oid[], keys text[]) → int: make room under each (owner,
 * key) pair, in the runners' key order, for the SQL paths (a limit raised,
 * the reaper's repair); how many instances may run now.
 */
GD_SQL_FUNCTION(gd_ungate)
{
    Datum *owners, *keys;
    bool *owner_nulls, *key_nulls;
    int owner_count, key_count;
    deconstruct_array(PG_GETARG_ARRAYTYPE_P(0), OIDOID, sizeof(Oid), true, TYPALIGN_INT, &owners, &owner_nulls,
                      &owner_count);
    deconstruct_array(PG_GETARG_ARRAYTYPE_P(1), TEXTOID, -1, false, TYPALIGN_INT, &keys, &key_nulls, &key_count);
    if (owner_count != key_count)
        elog(ERROR, "gen_durable: gd._ungate takes as many owners as keys, got %d and %d", owner_count, key_count);
    OwnedKey *pairs = static_cast<OwnedKey *>(palloc(sizeof(OwnedKey) * Max(key_count, 1)));
    for (int i = 0; i < key_count; i++)
        pairs[i] = OwnedKey{DatumGetObjectId(owners[i]), TextDatumGetCString(keys[i])};
    SPI_connect();
    int admitted = ungate(pairs, key_count);
    SPI_finish();
    PG_RETURN_INT32(admitted);
}
