/*
 * guard.hpp — the one boundary between C++ and PostgreSQL error handling.
 *
 * Two hazards, one guard each:
 *   - A C++ exception must never unwind into PostgreSQL frames.  Every
 *     function PostgreSQL calls runs its body through cpp_entry(), which
 *     catches everything and reports it with ereport(ERROR) only after the
 *     catch block has ended (no exception object alive during the longjmp).
 *   - A PostgreSQL ERROR (a longjmp) must never skip the destructors of live
 *     C++ objects.  Code that owns such objects calls PostgreSQL through
 *     pg_call(), which turns the ERROR into a C++ PgError exception; the
 *     exception unwinds normally and cpp_entry() re-throws the original
 *     PostgreSQL error, SQLSTATE and all.
 *
 * Functions that hold no C++ objects with destructors call PostgreSQL
 * directly: the guard is needed only where RAII objects are alive.
 */
#pragma once

extern "C" {
#include "postgres.h"
#include "utils/elog.h"
#include "utils/memutils.h"
}

#include <exception>
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

/* Run f, which calls PostgreSQL and may ERROR, from C++ code that owns RAII objects. */
template <class F>
auto pg_call(F &&f) -> decltype(f())
{
    using Result = decltype(f());
    if constexpr (std::is_void_v<Result>) {
        MemoryContext caller_context = CurrentMemoryContext;
        ErrorData *volatile edata = nullptr; /* set after the longjmp */
        PG_TRY();
        {
            f();
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
    } else {
        static_assert(std::is_trivially_copyable_v<Result>, "pg_call returns plain data only");
        Result result{};
        pg_call([&] { result = f(); });
        return result;
    }
}

/*
 * Run the body of a PostgreSQL-called function.  Returns f()'s value; any C++
 * exception becomes an ERROR raised after all exception objects are gone.
 */
template <class F>
auto cpp_entry(F &&f) -> decltype(f())
{
    ErrorData *pg_error = nullptr;
    char message[256];
    message[0] = '\0';
    try {
        return f();
    } catch (const PgError &e) {
        pg_error = e.edata();
    } catch (const std::exception &e) {
        strlcpy(message, e.what(), sizeof(message));
    } catch (...) {
        strlcpy(message, "unknown C++ exception", sizeof(message));
    }
    if (pg_error)
        ReThrowError(pg_error);
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("gen_durable: internal error: %s", message)));
    pg_unreachable();
}

} // namespace gd
