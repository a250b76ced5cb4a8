\echo Use "CREATE EXTENSION gd_guard_test" to load this file. \quit

-- kind: 'runtime', 'bad_alloc', 'pg_error', 'throw_in_pg_call', 'through_pg_try' or 'none'.
CREATE FUNCTION gd_guard_test_throw(kind text) RETURNS void
    AS 'MODULE_PATHNAME' LANGUAGE C STRICT;

-- How many Sentinel destructors have run in this backend ('pg_error').
CREATE FUNCTION gd_guard_test_destructors() RETURNS int
    AS 'MODULE_PATHNAME' LANGUAGE C STRICT;

-- How many errors the PG_CATCH of 'through_pg_try' has caught in this backend.
CREATE FUNCTION gd_guard_test_caught() RETURNS int
    AS 'MODULE_PATHNAME' LANGUAGE C STRICT;
