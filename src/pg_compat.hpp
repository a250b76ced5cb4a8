/*
 * pg_compat.hpp — the PostgreSQL APIs the engine uses that later majors
 * renamed or replaced, behind one name each.  Built and tested against
 * PostgreSQL 15; the branches for 16 and later follow those releases'
 * headers.
 */
#pragma once

extern "C" {
#include "postgres.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "miscadmin.h"
#include "replication/message.h"
#include "utils/wait_event.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/datetime.h"
}

#if PG_VERSION_NUM < 150000
#error "gen_durable needs PostgreSQL 15 or later (shmem_request_hook)"
#endif

/* This backend's index among the MaxBackends regular backends' slots (17 renamed BackendId to ProcNumber). */
inline int gd_my_backend_index()
{
#if PG_VERSION_NUM >= 170000
    return MyProcNumber;
#else
    return MyBackendId - 1;
#endif
}

/* May `role` execute `function`?  (16 replaced the per-catalog ACL checks with object_aclcheck.) */
inline bool gd_may_execute_function(Oid function, Oid role)
{
#if PG_VERSION_NUM >= 160000
    return object_aclcheck(ProcedureRelationId, function, role, ACL_EXECUTE) == ACLCHECK_OK;
#else
    return pg_proc_aclcheck(function, role, ACL_EXECUTE) == ACLCHECK_OK;
#endif
}

/* May `role` look up names in `schema` (USAGE)? */
inline bool gd_may_use_schema(Oid schema, Oid role)
{
#if PG_VERSION_NUM >= 160000
    return object_aclcheck(NamespaceRelationId, schema, role, ACL_USAGE) == ACLCHECK_OK;
#else
    return pg_namespace_aclcheck(schema, role, ACL_USAGE) == ACLCHECK_OK;
#endif
}

/* Does `role` own the extension (or is it a superuser)?  (16 replaced the per-catalog owner checks with object_ownercheck.) */
inline bool gd_owns_extension(Oid extension, Oid role)
{
#if PG_VERSION_NUM >= 160000
    return object_ownercheck(ExtensionRelationId, extension, role);
#else
    return pg_extension_ownercheck(extension, role);
#endif
}

/* Write a transactional logical decoding message (17 added the flush argument: a transactional one is flushed at commit). */
inline void gd_log_transactional_message(const char *prefix, const char *message, size_t size)
{
#if PG_VERSION_NUM >= 170000
    (void) LogLogicalMessage(prefix, message, size, true, false);
#else
    (void) LogLogicalMessage(prefix, message, size, true);
#endif
}

/*
 * The wait event of a wait of the engine's, as pg_stat_activity names it: its
 * own name under wait_event_type 'Extension' from 17 (WaitEventExtensionNew,
 * once per process and name), 'Extension' alone before.
 */
inline uint32 gd_wait_event(uint32 &cached, const char *name)
{
#if PG_VERSION_NUM >= 170000
    if (cached == 0)
        cached = WaitEventExtensionNew(name);
    return cached;
#else
    (void) name;
    return cached = PG_WAIT_EXTENSION;
#endif
}

/* Read `text` as timestamptz_in would (zone: the session's), without raising: false when it is not a finite
 * timestamp.  (16 gave DecodeDateTime a place to report what was wrong.) */
inline bool gd_parse_timestamptz(const char *text, TimestampTz *out)
{
    char workbuf[MAXDATELEN + MAXDATEFIELDS];
    char *field[MAXDATEFIELDS];
    int ftype[MAXDATEFIELDS], fields, dtype, zone = 0;
    struct pg_tm tm;
    fsec_t fsec;
    if (ParseDateTime(text, workbuf, sizeof(workbuf), field, ftype, MAXDATEFIELDS, &fields) != 0)
        return false;
#if PG_VERSION_NUM >= 160000
    DateTimeErrorExtra extra;
    if (DecodeDateTime(field, ftype, fields, &dtype, &tm, &fsec, &zone, &extra) != 0)
        return false;
#else
    if (DecodeDateTime(field, ftype, fields, &dtype, &tm, &fsec, &zone) != 0)
        return false;
#endif
    return dtype == DTK_DATE && tm2timestamp(&tm, fsec, &zone, out) == 0 && IS_VALID_TIMESTAMP(*out);
}
