-- What every test/sql file needs, made by the first to include it (001_setup
-- in the whole suite, or a file run alone: make installcheck REGRESS=NAME):
-- the extension, the schema t and its helpers, and the engine's workers up.
-- A test includes it silently, right after its first comment:
--   \set ECHO none
--   \getenv abs_srcdir PG_ABS_SRCDIR
--   \set gd_setup :abs_srcdir '/sql/include/setup.sql'
--   \i :gd_setup
-- (pg_regress 15 exports PG_ABS_SRCDIR, its --inputdir); this file ends with
-- \set ECHO all, so the rest of the test is echoed as usual.
SELECT to_regnamespace('t') IS NULL AS gd_setup_needed \gset
\if :gd_setup_needed
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gen_durable;
CREATE SCHEMA t;

-- Run a statement; report 'ok' or its SQLSTATE, message and detail.
CREATE FUNCTION t.try(statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    code text;
    message text;
    detail text;
BEGIN
    EXECUTE statement;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL;
    RETURN code || ' ' || message || CASE WHEN detail <> '' THEN ' [' || detail || ']' ELSE '' END;
END $$;

-- Wait (bounded) until the background engine moves an instance to a status.
CREATE FUNCTION t.until_status(instance bigint, wanted text, timeout interval DEFAULT '10s') RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + timeout;
    current text;
BEGIN
    LOOP
        SELECT status INTO current FROM gd.instances WHERE id = instance;
        EXIT WHEN current = wanted OR clock_timestamp() > deadline;
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN current;
END $$;

-- Every step a handler runs writes one row here (in the step's transaction).
CREATE TABLE t.ledger (
    instance_id bigint,
    step text,
    attempt int,
    run_as text,
    at timestamptz DEFAULT clock_timestamp()
);

-- The executors of gen_durable.queues ('default:2, mail:1'), the reaper and
-- the collector are up and serving (they start when the extension is created).
DO $$
BEGIN
    FOR i IN 1..100 LOOP
        EXIT WHEN (SELECT count(*) FROM gd.workers WHERE database = current_database()) = 5;
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
RESET client_min_messages;
\endif
\unset gd_setup_needed
\set ECHO all
