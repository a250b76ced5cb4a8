/*
 * handler_call.cpp — calling a step's handler, a tenant's code, inside an
 * engine session, so that it reaches nothing but what its owner may.
 *
 * Every role that can define an FSM is treated as an attacker.  Before each
 * call the handler must still be a plain function (state jsonb, ctx
 * gd.context) returning gd.outcome (a batch step's: (states jsonb[], ctxs
 * gd.context[]) returning gd.outcome[], called once for up to its batch
 * of instances), and its owner a role (42883 or 42704,
 * the instance fails at once: no retry can mend it), that the FSM's owner
 * may execute (42501, a failed attempt: it may be granted again).  The call runs
 *   - as the owner, under SECURITY_RESTRICTED_OPERATION: no SET ROLE, no
 *     temporary table or type, no LISTEN, PREPARE or cursor WITH HOLD;
 *   - with search_path pinned to pg_catalog, the API's schema and pg_temp
 *     (for the batch, gd_use_handler_search_path): gd_*, gd.* and operators resolve
 *     to PostgreSQL's and the extension's objects, never to a schema another
 *     role created (a schema named after the owner, say, which "$user"
 *     would find); the handler's own names are its author's to qualify, or
 *     to pin with the function's own SET search_path;
 *   - inside a GUC nest level that is rolled back when it returns (or by the
 *     subtransaction's abort when it raises): no setting outlives the step;
 *   - with every constraint checked when its statement ends (as after SET
 *     CONSTRAINTS ALL IMMEDIATE), as the owner: a trigger it deferred would
 *     fire at the round's commit, as the engine, and could fail every other
 *     tenant's step with it, so PostgreSQL refuses to queue one in a
 *     security-restricted operation (a handler that defers a constraint
 *     itself fails its step);
 * and after it the cursors and large objects it left open are closed, and,
 * in an engine worker, the session advisory locks it took are
 * released, even when it raised (gd._execute, a superuser's tool, leaves its
 * caller's session alone).  A handler that
 * created temporary objects anyway (a type or function in pg_temp, which
 * would shadow another tenant's names) fails its step, which rolls them back.
 *
 * The call's arguments are built here too: the state, and the gd.context of
 * the step (id, fsm, version, step, attempt, correlation key, what ended its
 * wait, queue).
 */
#include "handler_call.hpp"
#include "gen_durable.hpp"
#include "pg_compat.hpp"
#include "picker.hpp"
#include "step_definitions.hpp"

extern "C" {
#include "utils/array.h"
#include "utils/jsonb.h"
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "access/xact.h"
#include "fmgr.h"
#include "funcapi.h"
#include "libpq/be-fsstubs.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/lock.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/portal.h"
#include "utils/regproc.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/typcache.h"
}

namespace {

constexpr int CONTEXT_COLUMNS = 14;

/* gd.context and gd.outcome, looked up once per batch (the extension may have been re-created). */
Oid context_type = InvalidOid;
Oid outcome_type = InvalidOid;
Oid context_array_type = InvalidOid; /* gd.context[] and gd.outcome[]: a batch step's handler's */
Oid outcome_array_type = InvalidOid;
TupleDesc context_desc = nullptr;
Datum empty_json_array = 0;

Oid gd_type(Oid gd_namespace, const char *name)
{
    Oid type = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid, CStringGetDatum(name), ObjectIdGetDatum(gd_namespace));
    if (type == InvalidOid)
        elog(ERROR, "gen_durable: type gd.%s is missing", name);
    return type;
}

/* A field of the instance's resume document, or nullptr. */
JsonbValue *resume_field(const PickedInstance &row, const char *key)
{
    if (row.resume == 0)
        return nullptr;
    JsonbValue wanted{};
    wanted.type = jbvString;
    wanted.val.string.val = const_cast<char *>(key);
    wanted.val.string.len = static_cast<int>(strlen(key));
    return findJsonbValueFromContainer(&DatumGetJsonbP(row.resume)->root, JB_FOBJECT, &wanted);
}

Datum resume_array(const PickedInstance &row, const char *key)
{
    JsonbValue *value = resume_field(row, key);
    return value == nullptr ? empty_json_array : JsonbPGetDatum(JsonbValueToJsonb(value));
}

} // namespace

TimestampTz gd_step_deadline(const StepDefinition &def, TimestampTz start)
{
    return def.timeout_ms > 0 ? TimestampTzPlusMilliseconds(start, def.timeout_ms) : 0;
}

Datum gd_context(const PickedInstance &row, const char *queue, TimestampTz deadline)
{
    JsonbValue *timed_out = resume_field(row, "timed_out");
    Datum values[CONTEXT_COLUMNS] = {
        Int64GetDatum(row.id),      CStringGetTextDatum(row.fsm),
        Int32GetDatum(row.version), CStringGetTextDatum(row.step),
        Int32GetDatum(row.attempt), row.correlation_key ? CStringGetTextDatum(row.correlation_key) : 0,
        resume_array(row, "signals"), resume_array(row, "children"),
        BoolGetDatum(timed_out != nullptr && timed_out->type == jbvBool && timed_out->val.boolean),
        CStringGetTextDatum(queue), row.trace_context ? CStringGetTextDatum(row.trace_context) : 0,
        CStringGetTextDatum(row.visit_key), TimestampTzGetDatum(deadline), row.cancelled};
    bool nulls[CONTEXT_COLUMNS] = {};
    nulls[5] = row.correlation_key == nullptr;
    nulls[10] = row.trace_context == nullptr;
    nulls[12] = deadline == 0;
    nulls[13] = row.cancelled == 0;
    return HeapTupleGetDatum(heap_form_tuple(context_desc, values, nulls));
}

namespace {

/* May the FSM's owner still call the handler as a call by name would: EXECUTE on
 * it, USAGE on its schema?  (A failed attempt otherwise: it may be granted again.) */
void check_executable(const PickedInstance &row, const StepDefinition &def)
{
    Oid schema = get_func_namespace(def.handler);
    if (!gd_may_execute_function(def.handler, def.owner) || !gd_may_use_schema(schema, def.owner))
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("gen_durable: role \"%s\", which handlers of FSM \"%s\" run as, may not execute %s",
                               GetUserNameFromId(def.owner, true), row.fsm, format_procedure(def.handler)),
                        errdetail("It needs EXECUTE on the function and USAGE on schema %s.",
                                  quote_identifier(get_namespace_name(schema)))));
}

/* "pg_catalog, <the API's schema>, pg_temp" (temporary relations and types last, not first): the
 * search_path handlers run with (made per batch, in TopMemoryContext). */
char *handler_search_path = nullptr;

/* The schema CREATE EXTENSION put the API (gd_*) in. */
Oid api_schema()
{
    ScanKeyData key;
    ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ, CStringGetDatum("gen_durable"));
    Relation extensions = table_open(ExtensionRelationId, AccessShareLock);
    SysScanDesc scan = systable_beginscan(extensions, ExtensionNameIndexId, true, nullptr, 1, &key);
    HeapTuple tuple = systable_getnext(scan);
    Oid schema = HeapTupleIsValid(tuple) ? reinterpret_cast<Form_pg_extension>(GETSTRUCT(tuple))->extnamespace
                                         : InvalidOid;
    systable_endscan(scan);
    table_close(extensions, AccessShareLock);
    if (!OidIsValid(schema))
        elog(ERROR, "gen_durable: the extension is not installed in this database");
    return schema;
}

void make_handler_search_path()
{
    char *schema = get_namespace_name(api_schema());
    if (schema == nullptr)
        elog(ERROR, "gen_durable: the schema of the extension's API is gone");
    MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
    if (handler_search_path != nullptr)
        pfree(handler_search_path);
    handler_search_path = psprintf("pg_catalog, %s, pg_temp", quote_identifier(schema));
    MemoryContextSwitchTo(old);
}

/* SET CONSTRAINTS ALL IMMEDIATE: what an earlier handler of the round deferred is not deferred here. */
void check_constraints_immediately()
{
    ConstraintsSetStmt all{};
    all.type = T_ConstraintsSetStmt;
    all.constraints = NIL;
    all.deferred = false;
    AfterTriggerSetState(&all);
}

/* The step's timeout is armed (STATEMENT_TIMEOUT, so a cancel it causes says "statement timeout"). */
bool step_timeout_armed = false;

void refuse_temporary_objects(const PickedInstance &row)
{
    Oid temp_namespace, temp_toast_namespace;
    GetTempNamespaceState(&temp_namespace, &temp_toast_namespace);
    if (OidIsValid(temp_namespace))
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("gen_durable: step \"%s\" of FSM \"%s\" created temporary objects", row.step, row.fsm),
                        errdetail("A handler may leave nothing behind in the engine's session.")));
}

/*
 * Close the cursors and large objects the handler left open: the next step
 * in this session, another tenant's perhaps, could fetch from them, and a
 * name it left could fail another's OPEN.  Large objects opened during the
 * call carry the step's subtransaction; the session runs no cursor of its
 * own meanwhile (an engine worker opens none; gd_drain and gd._execute
 * refuse a session with one open), so every cursor not running is the
 * handler's.
 */
void close_what_the_handler_opened()
{
    AtEOSubXact_LargeObject(false, GetCurrentSubTransactionId(), InvalidSubTransactionId);
    PortalHashTableDeleteAll();
}

} // namespace

int gd_use_handler_search_path()
{
    make_handler_search_path(); /* the extension may have been made again elsewhere */
    int nest_level = NewGUCNestLevel();
    (void) set_config_option("search_path", handler_search_path, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true,
                             0, false);
    return nest_level;
}

void gd_prepare_handler_calls()
{
    Oid gd_namespace = get_namespace_oid("gd", false);
    Oid type = gd_type(gd_namespace, "context");
    outcome_type = gd_type(gd_namespace, "outcome");
    context_array_type = get_array_type(type);
    outcome_array_type = get_array_type(outcome_type);
    if (type != context_type) {
        MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
        if (context_desc != nullptr)
            FreeTupleDesc(context_desc);
        /* Forgotten before the look-up, which raises if the type is being dropped (no double free next time). */
        context_desc = nullptr;
        context_type = InvalidOid;
        context_desc = lookup_rowtype_tupdesc_copy(type, -1);
        BlessTupleDesc(context_desc);
        context_type = type;
        MemoryContextSwitchTo(old);
    }
    if (empty_json_array == 0) {
        MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
        empty_json_array = DirectFunctionCall1(jsonb_in, CStringGetDatum("[]"));
        MemoryContextSwitchTo(old);
    }
}

bool gd_handler_gone(const PickedInstance &row, const StepDefinition &def, HandlerGone *why)
{
    if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(def.owner))) {
        why->sqlerrcode = ERRCODE_UNDEFINED_OBJECT;
        why->message = psprintf("gen_durable: role %u, the owner of FSM \"%s\", which its handlers run as, no longer exists",
                                def.owner, row.fsm);
        return true;
    }
    HeapTuple proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(def.handler));
    if (!HeapTupleIsValid(proc)) {
        why->sqlerrcode = ERRCODE_UNDEFINED_FUNCTION;
        why->message = psprintf("gen_durable: the handler of step \"%s\" of FSM \"%s\" version %d no longer exists "
                                "(dropped, or renamed: define the step again)", row.step, row.fsm, row.version);
        return true;
    }
    const auto *form = reinterpret_cast<Form_pg_proc>(GETSTRUCT(proc));
    bool batched = def.batch > 1;
    bool fits = form->prokind == PROKIND_FUNCTION && !form->proretset && form->pronargs == 2 &&
                form->proargtypes.values[0] == (batched ? JSONBARRAYOID : JSONBOID) &&
                form->proargtypes.values[1] == (batched ? context_array_type : context_type) &&
                form->prorettype == (batched ? outcome_array_type : outcome_type);
    ReleaseSysCache(proc);
    if (fits)
        return false;
    why->sqlerrcode = ERRCODE_UNDEFINED_FUNCTION;
    why->message = psprintf("gen_durable: the handler of step \"%s\" of FSM \"%s\" version %d, %s, is not a function "
                            "%s",
                            row.step, row.fsm, row.version, format_procedure(def.handler),
                            batched ? "(states jsonb[], ctxs gd.context[]) returning gd.outcome[] (a batch step's)"
                                    : "(state jsonb, ctx gd.context) returning gd.outcome");
    return true;
}

namespace {

/*
 * Call the handler with `fcinfo`'s arguments as the FSM's owner, isolated
 * (see the top of this file); its result, or raises.  `row` names the step
 * in errors (a batch's first).
 */
Datum invoke_isolated(FunctionCallInfo fcinfo, const PickedInstance &row, const StepDefinition &def)
{
    Oid engine_user;
    int engine_context;
    GetUserIdAndSecContext(&engine_user, &engine_context);
    int nest_level = NewGUCNestLevel();
    SetUserIdAndSecContext(def.owner,
                           engine_context | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
    check_constraints_immediately();
    if (def.timeout_ms > 0) {
        enable_timeout_after(STATEMENT_TIMEOUT, def.timeout_ms);
        step_timeout_armed = true;
    }
    Datum result = FunctionCallInvoke(fcinfo);
    if (def.timeout_ms > 0)
        disable_timeout(STATEMENT_TIMEOUT, false);
    step_timeout_armed = false;
    refuse_temporary_objects(row);
    close_what_the_handler_opened();
    AtEOXact_GUC(false, nest_level);
    SetUserIdAndSecContext(engine_user, engine_context);
    gd_forget_handler_session_state();
    return result;
}

} // namespace

HeapTupleHeader gd_call_handler(const PickedInstance &row, const StepDefinition &def, const char *queue)
{
    check_executable(row, def);
    LOCAL_FCINFO(fcinfo, 2);
    FmgrInfo flinfo;
    fmgr_info(def.handler, &flinfo);
    InitFunctionCallInfoData(*fcinfo, &flinfo, 2, InvalidOid, nullptr, nullptr);
    fcinfo->args[0].value = row.state;
    fcinfo->args[0].isnull = false;
    fcinfo->args[1].value = gd_context(row, queue, gd_step_deadline(def, GetCurrentTimestamp()));
    fcinfo->args[1].isnull = false;
    Datum outcome = invoke_isolated(fcinfo, row, def);
    if (fcinfo->isnull)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: step \"%s\" of FSM \"%s\" returned a bad outcome: the handler returned NULL",
                               row.step, row.fsm)));
    return DatumGetHeapTupleHeader(outcome);
}

void gd_call_batch_handler(const PickedInstance *const *rows, int count, const StepDefinition &def, const char *queue,
                           HeapTupleHeader *outcomes)
{
    const PickedInstance &first = *rows[0];
    check_executable(first, def);
    TimestampTz deadline = gd_step_deadline(def, GetCurrentTimestamp());
    Datum *states = static_cast<Datum *>(palloc(sizeof(Datum) * count));
    Datum *contexts = static_cast<Datum *>(palloc(sizeof(Datum) * count));
    for (int i = 0; i < count; i++) {
        states[i] = rows[i]->state;
        contexts[i] = gd_context(*rows[i], queue, deadline);
    }
    int16 context_len;
    bool context_byval;
    char context_align;
    get_typlenbyvalalign(context_type, &context_len, &context_byval, &context_align);
    LOCAL_FCINFO(fcinfo, 2);
    FmgrInfo flinfo;
    fmgr_info(def.handler, &flinfo);
    InitFunctionCallInfoData(*fcinfo, &flinfo, 2, InvalidOid, nullptr, nullptr);
    fcinfo->args[0].value = PointerGetDatum(construct_array(states, count, JSONBOID, -1, false, TYPALIGN_INT));
    fcinfo->args[0].isnull = false;
    fcinfo->args[1].value =
        PointerGetDatum(construct_array(contexts, count, context_type, context_len, context_byval, context_align));
    fcinfo->args[1].isnull = false;
    Datum result = invoke_isolated(fcinfo, first, def);
    if (fcinfo->isnull)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: batch step \"%s\" of FSM \"%s\" returned a bad outcome: the handler "
                               "returned NULL for a batch of %d", first.step, first.fsm, count)));
    ArrayType *array = DatumGetArrayTypeP(result);
    int16 outcome_len;
    bool outcome_byval;
    char outcome_align;
    get_typlenbyvalalign(outcome_type, &outcome_len, &outcome_byval, &outcome_align);
    if (ARR_ELEMTYPE(array) != outcome_type)
        elog(ERROR, "gen_durable: batch step \"%s\" returned an array of type %u", first.step, ARR_ELEMTYPE(array));
    Datum *elements;
    bool *nulls;
    int returned;
    deconstruct_array(array, outcome_type, outcome_len, outcome_byval, outcome_align, &elements, &nulls, &returned);
    if (ARR_NDIM(array) > 1 || returned != count)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: batch step \"%s\" of FSM \"%s\" returned a bad outcome: %d outcomes for "
                               "%d instances", first.step, first.fsm, returned, count),
                        errdetail("A batch handler returns a one-dimensional array of one outcome per instance, in "
                                  "the order of its arguments.")));
    for (int i = 0; i < count; i++) {
        if (nulls[i])
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("gen_durable: batch step \"%s\" of FSM \"%s\" returned a bad outcome: outcome %d "
                                   "of %d is NULL", first.step, first.fsm, i + 1, count)));
        outcomes[i] = DatumGetHeapTupleHeader(elements[i]);
    }
}

bool gd_handler_timed_out()
{
    /* Armed and no longer pending: it fired (ProcessInterrupts resets its indicator when it cancels). */
    bool fired = step_timeout_armed && !get_timeout_active(STATEMENT_TIMEOUT);
    step_timeout_armed = false;
    return fired;
}

void gd_forget_handler_session_state()
{
    /* An engine worker's session holds none of its own; gd._execute's caller's are not the handler's to drop. */
    if (gd_my_worker_kind() != WorkerKind::free)
        LockReleaseSession(USER_LOCKMETHOD);
}

const char *gd_session_holds_back_handlers()
{
    Oid temp_namespace, temp_toast_namespace;
    GetTempNamespaceState(&temp_namespace, &temp_toast_namespace);
    if (OidIsValid(temp_namespace))
        return "temporary objects"; /* a handler's names would find them */
    if (!ThereAreNoReadyPortals())
        return "open cursors"; /* they would be closed with the handlers' */
    return nullptr;
}
