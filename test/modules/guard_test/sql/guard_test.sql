--
-- src/guard.hpp: every path of the boundary between C++ exceptions and
-- PostgreSQL errors, forced by gd_guard_test_throw(kind).  Each error must
-- arrive with its SQLSTATE and message, and the session must survive it:
-- one backend from the first statement to the last, no FATAL, no PANIC, no
-- "ERRORDATA_STACK_SIZE exceeded".
--
CREATE EXTENSION gd_guard_test;
SELECT pg_backend_pid() AS backend_pid \gset
\set SHOW_CONTEXT never

-- Each kind at the top level: psql shows the message, then its SQLSTATE.
SELECT gd_guard_test_throw('runtime');
\echo :LAST_ERROR_SQLSTATE
SELECT gd_guard_test_throw('bad_alloc');
\echo :LAST_ERROR_SQLSTATE
SELECT gd_guard_test_destructors() AS destructors_before;
SELECT gd_guard_test_throw('pg_error');
\echo :LAST_ERROR_SQLSTATE
-- the Sentinel alive in the C++ frame was destroyed: the ERROR unwound it
SELECT gd_guard_test_destructors() AS destructors_after;
SELECT gd_guard_test_throw('throw_in_pg_call');
\echo :LAST_ERROR_SQLSTATE
-- its Sentinel was destroyed too
SELECT gd_guard_test_destructors() AS destructors_after_throw;
SELECT gd_guard_test_throw('through_pg_try');
\echo :LAST_ERROR_SQLSTATE
-- the ERROR was caught by the PG_CATCH around the throw, then re-thrown
SELECT gd_guard_test_caught() AS caught;
SELECT 'ok' AS none FROM (SELECT gd_guard_test_throw('none')) AS call;
SELECT gd_guard_test_throw('no such kind');
\echo :LAST_ERROR_SQLSTATE

-- The same kinds caught by PL/pgSQL (a subtransaction rolled back under a
-- PG_TRY of the server's own).
CREATE FUNCTION guard_outcome(kind text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd_guard_test_throw(kind);
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;
SELECT kind, guard_outcome(kind) AS outcome
FROM unnest(ARRAY['runtime', 'bad_alloc', 'pg_error', 'throw_in_pg_call', 'through_pg_try', 'none']) AS kind;
SELECT gd_guard_test_destructors() AS destructors, gd_guard_test_caught() AS caught;

-- Many times over in one statement: always the same outcome, nothing left
-- behind by one error to trouble the next.
SELECT kind, outcome, count(*) AS calls
FROM (SELECT kind, guard_outcome(kind) AS outcome
      FROM unnest(ARRAY['runtime', 'bad_alloc', 'pg_error', 'throw_in_pg_call', 'through_pg_try', 'none']) AS kind,
           generate_series(1, 200)) AS calls
GROUP BY kind, outcome ORDER BY kind;
SELECT gd_guard_test_destructors() AS destructors, gd_guard_test_caught() AS caught;

-- In a transaction block: the error aborts the subtransaction, a rollback
-- to the savepoint recovers, the transaction commits.
BEGIN;
SAVEPOINT before_error;
SELECT gd_guard_test_throw('pg_error');
SELECT 1 AS in_aborted_transaction;
ROLLBACK TO SAVEPOINT before_error;
SELECT gd_guard_test_throw('none') IS NOT NULL AS after_rollback_to;
COMMIT;

-- The server's own PG_TRY still works after all this: a division by zero
-- caught by PL/pgSQL, then an error at the top level, then plain queries.
DO $$
BEGIN
    PERFORM 1 / 0;
EXCEPTION WHEN division_by_zero THEN
    RAISE NOTICE 'caught: % %', SQLSTATE, SQLERRM;
END
$$;
SELECT 1 / 0;
\echo :LAST_ERROR_SQLSTATE
SELECT sum(i) AS normal_query FROM generate_series(1, 100) AS i;
-- the same session throughout
SELECT pg_backend_pid() = :backend_pid AS same_backend;
DROP FUNCTION guard_outcome(text);
DROP EXTENSION gd_guard_test;
