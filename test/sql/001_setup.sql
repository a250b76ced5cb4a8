-- Setup shared by the regression suites (they run in order in one database).
CREATE EXTENSION gen_durable;

-- The API lives in the extension's schema, internals in gd.
SELECT count(*) > 10 AS api_functions, count(*) FILTER (WHERE n.nspname <> 'public') AS api_outside_public
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.proname LIKE 'gd\_%';
SELECT count(*) > 10 AS internals_in_gd FROM pg_proc p WHERE p.pronamespace = 'gd'::regnamespace;

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

-- The executors of gen_durable.queues ('default:2, mail:1'), the reaper and the
-- collector are up and serving.
DO $$
BEGIN
    FOR i IN 1..100 LOOP
        EXIT WHEN (SELECT count(*) FROM gd.workers WHERE database = current_database()) = 5;
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT kind, database, queue, count(*) FROM gd.workers GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;
