-- Setup shared by the regression suites (they run in order in one database).
CREATE EXTENSION gen_durable;

-- The API lives in the extension's schema, internals in gd.
SELECT count(*) > 10 AS api_functions, count(*) FILTER (WHERE n.nspname <> 'public') AS api_outside_public
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.proname LIKE 'gd\_%';
SELECT count(*) > 10 AS internals_in_gd FROM pg_proc p WHERE p.pronamespace = 'gd'::regnamespace;

-- What every file includes (schema t and its helpers, the engine's
-- workers up): made here, once, for the whole suite.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
-- The executors of gen_durable.queues ('default:2, mail:1'), the reaper and the
-- collector are up and serving.
SELECT kind, database, queue, count(*) FROM gd.workers GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;
