/*
 * door.cpp — the one way from a caller's rights to the engine's.
 *
 * The engine's tables are closed to every role but the extension's owner.
 * Every API function that reads or writes them is a door, declared
 * `LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door'`: a door named gd_NAME (or
 * NAME) runs gd._NAME, its implementation, with the same arguments, call
 * context (an event trigger's) and result, and
 *   - as the implementation's owner (the extension's owner), the caller's
 *     security restrictions kept (a handler calling gd_insert stays in its
 *     security-restricted operation);
 *   - with search_path pinned to pg_catalog, pg_temp, so no name in the
 *     implementation resolves to a caller's object;
 *   - with the caller's role remembered: the implementation decides on the
 *     caller's rights explicitly (gd._caller() in SQL, gd_api_caller() here)
 *     before it does anything for it.
 * The implementations are not executable by PUBLIC, so the door is the only
 * way to them.  Identity and setting are restored when the implementation
 * returns; when it raises, the (sub)transaction's abort restores them, as
 * for a SECURITY DEFINER function.
 */
#include "gen_durable.hpp"
#include "guard.hpp"

extern "C" {
#include "catalog/pg_proc.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/guc.h"
#include "utils/syscache.h"
}

namespace {

/* What a door runs, found at its first call and kept with its FmgrInfo. */
struct DoorTarget {
    FmgrInfo implementation;
    Oid engine; /* the implementation's owner */
};

/* The caller of the innermost door running; InvalidOid outside any door. */
Oid door_caller = InvalidOid;

DoorTarget *door_target(FunctionCallInfo fcinfo)
{
    FmgrInfo *flinfo = fcinfo->flinfo;
    if (flinfo->fn_extra != nullptr)
        return static_cast<DoorTarget *>(flinfo->fn_extra);
    HeapTuple door = SearchSysCache1(PROCOID, ObjectIdGetDatum(flinfo->fn_oid));
    if (!HeapTupleIsValid(door))
        elog(ERROR, "gen_durable: cache lookup failed for function %u", flinfo->fn_oid);
    Form_pg_proc form = reinterpret_cast<Form_pg_proc>(GETSTRUCT(door));
    const char *name = NameStr(form->proname);
    if (strncmp(name, "gd_", 3) == 0)
        name += 3;
    char implementation_name[NAMEDATALEN + 1];
    snprintf(implementation_name, sizeof(implementation_name), "_%s", name);
    Oid implementation = LookupFuncName(list_make2(makeString(pstrdup("gd")), makeString(implementation_name)),
                                        form->pronargs, form->proargtypes.values, true);
    ReleaseSysCache(door);
    if (!OidIsValid(implementation))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION),
                        errmsg("gen_durable: function %u has no implementation gd.%s", flinfo->fn_oid,
                               implementation_name)));
    HeapTuple proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(implementation));
    if (!HeapTupleIsValid(proc))
        elog(ERROR, "gen_durable: cache lookup failed for function %u", implementation);
    Oid engine = reinterpret_cast<Form_pg_proc>(GETSTRUCT(proc))->proowner;
    ReleaseSysCache(proc);

    auto *target = static_cast<DoorTarget *>(MemoryContextAllocZero(flinfo->fn_mcxt, sizeof(DoorTarget)));
    fmgr_info_cxt(implementation, &target->implementation, flinfo->fn_mcxt);
    target->implementation.fn_expr = flinfo->fn_expr;
    target->engine = engine;
    flinfo->fn_extra = target;
    return target;
}

} // namespace

int gd_pin_search_path()
{
    int nest_level = NewGUCNestLevel();
    (void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
                             true, 0, false);
    return nest_level;
}

Oid gd_api_caller()
{
    if (!OidIsValid(door_caller))
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("gen_durable: internal functions run only through the API functions")));
    return door_caller;
}

GD_SQL_FUNCTION(gd_door)
{
    DoorTarget *target = door_target(fcinfo);
    LOCAL_FCINFO(inner, FUNC_MAX_ARGS);
    InitFunctionCallInfoData(*inner, &target->implementation, PG_NARGS(), fcinfo->fncollation, fcinfo->context,
                             fcinfo->resultinfo);
    for (int i = 0; i < PG_NARGS(); i++)
        inner->args[i] = fcinfo->args[i];

    Oid caller;
    int security_context;
    GetUserIdAndSecContext(&caller, &security_context);
    int nest_level = gd_pin_search_path();
    SetUserIdAndSecContext(target->engine, security_context | SECURITY_LOCAL_USERID_CHANGE);
    Oid outer_caller = door_caller;
    door_caller = caller;
    volatile Datum result = 0;
    PG_TRY();
    {
        result = FunctionCallInvoke(inner);
    }
    PG_FINALLY();
    {
        door_caller = outer_caller;
    }
    PG_END_TRY();
    SetUserIdAndSecContext(caller, security_context);
    AtEOXact_GUC(true, nest_level);
    fcinfo->isnull = inner->isnull;
    return result;
}

/* gd._caller() → oid: the role that called the door being run. */
GD_SQL_FUNCTION(gd_caller)
{
    PG_RETURN_OID(gd_api_caller());
}
