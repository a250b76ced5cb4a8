/*
 * concurrency_keys.cpp — room under concurrency keys.  An instance holding
 * a key stops running (its step parks it or ends it, it is cancelled) in a
 * transaction that remembers the key; once the transaction's last
 * transition is written, the best instances waiting under each key are
 * admitted as far as gd._key_room says there is room, the keys taken in
 * one order (key, then owner) so two rounds never deadlock on them.
 * gd._ungate does the same for the SQL paths (a limit raised, the reaper's
 * repair).  The key arithmetic is SQL's (sql/src/65_concurrency.sql).
 */
#include "concurrency_keys.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"
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

/* Let the best waiting instances under the owner's key run, as far as there is room; returns how many. */
int admit_gated(Oid owner, const char *key)
{
    static SPIPlanPtr room_plan = nullptr, admit_plan = nullptr;
    Datum args[3] = {ObjectIdGetDatum(owner), CStringGetTextDatum(key), 0};
    /* gd._key_room locks the key: admissions and releases under it take turns */
    if (gd_run_kept(room_plan, "SELECT gd._key_room($1, $2)", {OIDOID, TEXTOID}, args, false, 1) != SPI_OK_SELECT ||
        SPI_processed != 1)
        elog(ERROR, "gen_durable: counting the room under concurrency key \"%s\" failed", key);
    bool isnull;
    int room = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    if (room <= 0)
        return 0;
    args[2] = Int32GetDatum(room);
    if (gd_run_kept(admit_plan,
                    "UPDATE gd._instances i SET gated = false"
                    " WHERE i.id IN (SELECT gd._gated_best($1, $2, (gd._key_limit($2)).shared, $3))"
                    " RETURNING " GD_WOKEN_COLUMNS,
                    {OIDOID, TEXTOID, INT4OID}, args, false, 0) != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "gen_durable: admitting instances under concurrency key \"%s\" failed", key);
    int admitted = static_cast<int>(SPI_processed);
    for (int i = 0; i < admitted; i++)
        gd_wake_queue_of_returned(i);
    gd_count_limit(LimitKind::concurrency, key, LimitCounts{0, static_cast<uint64>(admitted), 0, 0});
    return admitted;
}

/* Make room under each key of `keys` (sorted here: the order every path takes key locks in); how many ran. */
int ungate(OwnedKey *keys, int count)
{
    if (count == 0)
        return 0;
    qsort(keys, count, sizeof(keys[0]), compare_keys);
    int admitted = 0;
    for (int i = 0; i < count; i++)
        if (i == 0 || compare_keys(&keys[i], &keys[i - 1]) != 0)
            admitted += admit_gated(keys[i].owner, keys[i].key);
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
