/*
 * gd_guard_test — forces every path of src/guard.hpp, the boundary between
 * C++ and PostgreSQL error handling, from SQL (sql/guard_test.sql).
 *
 * gd_guard_test_throw(kind):
 *   'runtime'         a std::runtime_error("boom") leaves the body: XX000
 *   'bad_alloc'       a std::bad_alloc leaves the body: 53200
 *   'pg_error'        an ERROR (22012) raised through gd::pg_call while a
 *                     Sentinel is alive: it unwinds as a PgError, the
 *                     Sentinel's destructor runs, the ERROR is re-thrown as is
 *   'throw_in_pg_call' a std::runtime_error thrown inside gd::pg_call's
 *                     PG_TRY while a Sentinel is alive: it leaves the PG_TRY
 *                     frame only after PG_END_TRY (the next ERROR of the
 *                     session still finds a live jump buffer), the Sentinel's
 *                     destructor runs, XX000
 *   'through_pg_try'  inside PG_TRY, gd::cpp_entry turns a C++ throw into an
 *                     ERROR before it can leave the PG_TRY frame (and its jump
 *                     buffer, PG_exception_stack, dangling); the PG_CATCH
 *                     counts it and re-throws it
 *   'none'            returns
 * Were any exception to reach a C frame, nothing above would catch it:
 * std::terminate, the backend aborts, and the regress test loses its session
 * (the postmaster restarts every backend).
 */
#include "guard.hpp"

extern "C" {
#include "fmgr.h"
#include "utils/builtins.h"
PG_MODULE_MAGIC;
}

#include <cstring>
#include <new>
#include <stdexcept>

namespace {

int destructors_run = 0; /* Sentinels destroyed in this backend */
int pg_catches = 0;      /* errors caught by through_pg_try's PG_CATCH */

struct Sentinel {
    Sentinel() = default;
    Sentinel(const Sentinel &) = delete;
    Sentinel &operator=(const Sentinel &) = delete;
    ~Sentinel() { destructors_run++; }
};

void pg_error_through_cpp()
{
    Sentinel alive; /* must be destroyed although the ERROR longjmps */
    gd::pg_call([] {
        ereport(ERROR, (errcode(ERRCODE_DIVISION_BY_ZERO), errmsg("gen_durable test: pg error through C++")));
    });
    elog(ERROR, "gen_durable test: pg_call returned after an ERROR");
}

void throw_in_pg_call()
{
    Sentinel alive;
    gd::pg_call([] { throw std::runtime_error("thrown inside pg_call"); });
    elog(ERROR, "gen_durable test: pg_call returned after a throw");
}

void throw_inside_pg_try()
{
    PG_TRY();
    {
        gd::cpp_entry([] { throw std::runtime_error("inner"); });
        elog(ERROR, "gen_durable test: cpp_entry returned after a throw");
    }
    PG_CATCH();
    {
        pg_catches++;
        PG_RE_THROW();
    }
    PG_END_TRY();
}

} // namespace

GD_SQL_FUNCTION(gd_guard_test_throw)
{
    const char *kind = text_to_cstring(PG_GETARG_TEXT_PP(0));
    if (strcmp(kind, "runtime") == 0)
        throw std::runtime_error("boom");
    if (strcmp(kind, "bad_alloc") == 0)
        throw std::bad_alloc();
    if (strcmp(kind, "pg_error") == 0)
        pg_error_through_cpp();
    else if (strcmp(kind, "throw_in_pg_call") == 0)
        throw_in_pg_call();
    else if (strcmp(kind, "through_pg_try") == 0)
        throw_inside_pg_try();
    else if (strcmp(kind, "none") != 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("unknown kind \"%s\"", kind)));
    PG_RETURN_VOID();
}

GD_SQL_FUNCTION(gd_guard_test_destructors)
{
    PG_RETURN_INT32(destructors_run);
}

GD_SQL_FUNCTION(gd_guard_test_caught)
{
    PG_RETURN_INT32(pg_catches);
}
