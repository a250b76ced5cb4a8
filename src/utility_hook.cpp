/*
 * utility_hook.cpp — the engine's word on utility statements that name the
 * extension, said before PostgreSQL acts on them:
 *   - DROP EXTENSION gen_durable by a role that may not drop it is refused
 *     before PostgreSQL requests the extension's lock (it checks ownership
 *     only once it holds it).  Every engine round holds that lock shared, so
 *     the request alone, queued behind a running step, would hold every
 *     other round back for as long as the step runs.
 *   - CREATE EXTENSION gen_durable over an existing schema gd, which the
 *     extension would have to own, is refused with a message that says so.
 * It also tells notify.cpp who listens on gd_work (LISTEN, UNLISTEN,
 * DISCARD ALL), so commits send NOTIFY only while someone does, and wakes
 * the launcher when CREATE DATABASE commits (the database may be one it
 * waits for).
 */
#include "gen_durable.hpp"
#include "guard.hpp"
#include "pg_compat.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "commands/extension.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

namespace {

ProcessUtility_hook_type previous_utility_hook = nullptr;

constexpr const char *EXTENSION_NAME = "gen_durable";

void refuse_drop_by_non_owner(const DropStmt *drop)
{
    if (drop->removeType != OBJECT_EXTENSION)
        return;
    ListCell *cell;
    foreach (cell, drop->objects) {
        const char *name = strVal(lfirst(cell));
        if (strcmp(name, EXTENSION_NAME) != 0)
            continue;
        Oid extension = get_extension_oid(name, true);
        if (OidIsValid(extension) && !gd_owns_extension(extension, GetUserId()))
            ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                            errmsg("gen_durable: must be owner of extension %s", EXTENSION_NAME)));
    }
}

void refuse_create_over_schema_gd(const CreateExtensionStmt *create)
{
    if (strcmp(create->extname, EXTENSION_NAME) != 0 || OidIsValid(get_extension_oid(EXTENSION_NAME, true)))
        return;
    Oid schema = get_namespace_oid("gd", true);
    if (!OidIsValid(schema))
        return;
    HeapTuple tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(schema));
    Oid owner = HeapTupleIsValid(tuple) ? reinterpret_cast<Form_pg_namespace>(GETSTRUCT(tuple))->nspowner
                                        : InvalidOid;
    if (HeapTupleIsValid(tuple))
        ReleaseSysCache(tuple);
    const char *owner_name = GetUserNameFromId(owner, true);
    ereport(ERROR, (errcode(ERRCODE_DUPLICATE_SCHEMA),
                    errmsg("gen_durable: schema \"gd\" already exists"),
                    errdetail("It belongs to role %s; gen_durable keeps its tables, types and views in a schema gd "
                              "of its own.",
                              owner_name != nullptr ? quote_identifier(owner_name) : "(dropped)"),
                    errhint("Drop or rename that schema, then create the extension.")));
}

void check_utility(const PlannedStmt *statement)
{
    const Node *parsed = statement->utilityStmt;
    if (IsA(parsed, DropStmt))
        refuse_drop_by_non_owner(reinterpret_cast<const DropStmt *>(parsed));
    else if (IsA(parsed, CreateExtensionStmt))
        refuse_create_over_schema_gd(reinterpret_cast<const CreateExtensionStmt *>(parsed));
    else if (IsA(parsed, CreatedbStmt))
        gd_wake_launcher_at_commit(); /* it may be one gen_durable.database lists and the launcher waits for */
    else
        gd_note_listening(parsed);
}

void gd_process_utility(PlannedStmt *statement, const char *query, bool read_only_tree,
                        ProcessUtilityContext context, ParamListInfo params, QueryEnvironment *environment,
                        DestReceiver *destination, QueryCompletion *completion)
{
    gd::cpp_entry([statement] { check_utility(statement); });
    if (previous_utility_hook != nullptr)
        previous_utility_hook(statement, query, read_only_tree, context, params, environment, destination,
                              completion);
    else
        standard_ProcessUtility(statement, query, read_only_tree, context, params, environment, destination,
                                completion);
}

} // namespace

void gd_install_utility_hook()
{
    previous_utility_hook = ProcessUtility_hook;
    ProcessUtility_hook = gd_process_utility;
}
