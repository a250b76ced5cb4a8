/*
 * guard.hpp — the one boundary between C++ and PostgreSQL error handling.
 *
 * Two hazards, one guard each:
 *   - A C++ exception must never unwind into PostgreSQL frames (a C caller,
 *     or a PG_TRY block whose jump buffer would be left dangling).
 *     cpp_entry() runs C++ code, catches everything and reports it with
 *     ereport(ERROR) only after the catch block has ended (no exception
 *     object alive during the longjmp).  It wraps every function PostgreSQL
 *     calls, by construction: SQL-callable functions are defined with
 *     GD_SQL_FUNCTION and background workers' entry points with
 *     GD_WORKER_ENTRY, never by hand.  Inside the engine it wraps the few
 *     C++ operations that may throw (a container growing) where they are
 *     called, since PostgreSQL frames may lie between them and the entry.
 *     Code with a better answer than an ERROR catches for itself: a GUC
 *     check hook rejects the value, the launcher keeps its previous plan.
 *   - A PostgreSQL ERROR (a longjmp) must never skip the destructors of live
 *     C++ objects.  Code that owns such objects calls PostgreSQL through
 *     pg_call(), which turns the ERROR into a C++ PgError exception; the
 *     exception unwinds normally and cpp_entry() re-throws the original
 *     PostgreSQL error, SQLSTATE and all.  Everything else keeps its frames
 *     trivially destructible: per-round data is palloc'd, not owned by C++.
 */
#pragma once

extern "C" {
#include "postgres.h"
#include "utils/elog.h"
#include "utils/memutils.h"
}

#include <exception>
#include <new>
#include <optional>
#include <type_traits>

namespace gd {

/* A PostgreSQL error travelling through C++ frames as an exception. */
class PgError final : public std::exception {
public:
    explicit PgError(ErrorData *edata) : edata_(edata) {}
    const char *what() const noexcept override { return edata_->message ? edata_->message : "PostgreSQL error"; }
    ErrorData *edata() const { return edata_; }

private:
    ErrorData *edata_;
};

/*
 * Run f, which calls PostgreSQL and may ERROR, from C++ code that owns RAII
 * objects.  A C++ exception f throws is caught inside the PG_TRY and thrown
 * again after PG_END_TRY, so it never leaves the PG_TRY frame with
 * PG_exception_stack still pointing into it.
 */
template <class F>
auto pg_call(F &&f) -> decltype(f())
{
    using Result = decltype(f());
    if constexpr (std::is_void_v<Result>) {
        MemoryContext caller_context = CurrentMemoryContext;
        ErrorData *volatile edata = nullptr; /* set after the longjmp */
        std::exception_ptr thrown;          /* set only where no longjmp follows */
        PG_TRY();
        {
            try {
                f();
            } catch (...) {
                thrown = std::current_exception();
            }
        }
        PG_CATCH();
        {
            MemoryContextSwitchTo(caller_context);
            edata = CopyErrorData();
            FlushErrorState();
        }
        PG_END_TRY();
        if (edata)
            throw PgError(edata);
        if (thrown)
            std::rethrow_exception(thrown);
    } else {
        static_assert(std::is_trivially_copyable_v<Result>, "pg_call returns plain data only");
        Result result{};
        pg_call([&] { result = f(); });
        return result;
    }
}

/*
 * Run C++ code for PostgreSQL: returns f()'s value; any C++ exception becomes
 * an ERROR (53200 for std::bad_alloc) raised after all exception objects are
 * gone.
 */
template <class F>
auto cpp_entry(F &&f) -> decltype(f())
{
    ErrorData *pg_error = nullptr;
    bool out_of_memory = false;
    char message[256];
    message[0] = '\0';
    try {
        return f();
    } catch (const PgError &e) {
        pg_error = e.edata();
    } catch (const std::bad_alloc &) {
        out_of_memory = true;
    } catch (const std::exception &e) {
        strlcpy(message, e.what(), sizeof(message));
    } catch (...) {
        strlcpy(message, "unknown C++ exception", sizeof(message));
    }
    if (pg_error)
        ReThrowError(pg_error);
    if (out_of_memory)
        ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("gen_durable: out of memory")));
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("gen_durable: internal error: %s", message)));
    pg_unreachable();
}

} // namespace gd

/*
 * Define a SQL-callable function (LANGUAGE c, fmgr version 1) whose body runs
 * through cpp_entry:
 *
 *     GD_SQL_FUNCTION(gd_complete)
 *     {
 *         int64 id = PG_GETARG_INT64(0);
 *         ...
 *         PG_RETURN_BOOL(done);
 *     }
 */
#define GD_SQL_FUNCTION(name)                                                                                  \
    static Datum name##_body(FunctionCallInfo fcinfo);                                                          \
    extern "C" {                                                                                               \
    PG_FUNCTION_INFO_V1(name);                                                                                 \
    }                                                                                                          \
    Datum name(PG_FUNCTION_ARGS)                                                                               \
    {                                                                                                          \
        return gd::cpp_entry([fcinfo] { return name##_body(fcinfo); });                                         \
    }                                                                                                          \
    static Datum name##_body(FunctionCallInfo fcinfo)

/* Define a background worker's entry point (bgw_function_name) whose body runs through cpp_entry. */
#define GD_WORKER_ENTRY(name)                                                                                  \
    static void name##_body(Datum arg);                                                                        \
    extern "C" PGDLLEXPORT void name(Datum arg)                                                                \
    {                                                                                                          \
        gd::cpp_entry([arg] { name##_body(arg); });                                                             \
    }                                                                                                          \
    static void name##_body(Datum arg)
