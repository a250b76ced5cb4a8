-- The statuses the engine's C++ knows (gd._live_statuses() and
-- gd._terminal_statuses() come from it) are exactly the gd.status domain's,
-- the live ones first.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
SELECT gd._live_statuses() AS live, gd._terminal_statuses() AS terminal;
SELECT pg_get_constraintdef(c.oid) =
       format('CHECK ((VALUE = ANY (ARRAY[%s])))',
              array_to_string(ARRAY(SELECT quote_literal(s) || '::text'
                                      FROM unnest(gd._live_statuses() || gd._terminal_statuses()) s), ', '))
       AS domain_is_the_same_list
  FROM pg_constraint c WHERE c.contypid = 'gd.status'::regtype;
