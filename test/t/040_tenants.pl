# Two tenants who may define FSMs, alice and bob (plain LOGIN roles with
# CREATE on the database), and bob tries every way we know to reach the
# engine's rights or alice's work (README, Access control: the threat model).
# Each attack must fail, and alice's work must go on untouched.
#
# One executor serves queue 'default', so bob's handlers and alice's share
# one engine session (what a handler leaves behind would reach the next);
# queue 'slow' has its own, for alice's long step.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time);

$PostgreSQL::Test::Utils::timeout_default = 30;

my $node = GdTest::start_node('tenants', 'gen_durable.queues' => 'default:1, slow:1');

# Run SQL as a role, over its own login connection; returns (stdout, stderr).
sub as_role
{
	my ($role, $sql) = @_;
	my ($stdout, $stderr) = ('', '');
	$node->psql('postgres', $sql, stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', $role ]);
	return ($stdout, $stderr);
}

sub superuser { return $node->safe_psql('postgres', $_[0]); }

# Run SQL as a role that must succeed (a tenant setting up).
sub setup_as { my ($role, $sql) = @_; return $node->safe_psql('postgres', $sql, extra_params => [ '-U', $role ]); }

# The SQLSTATE of SQL run as a role ('' if it succeeded).
sub sqlstate_as
{
	my ($role, $sql) = @_;
	my ($stdout, $stderr) = as_role($role, "\\set VERBOSITY sqlstate\n$sql");
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5})/ ? $1 : '';
}

# Wait until the instances (a comma list) have all ended; returns their statuses, in id order.
sub wait_ended
{
	my ($ids) = @_;
	$node->poll_query_until('postgres',
		"SELECT bool_and(status IN ('done', 'failed', 'cancelled')) FROM gd._instances WHERE id IN ($ids)")
	  or diag("instances $ids did not end");
	return superuser("SELECT string_agg(status, ',' ORDER BY id) FROM gd._instances WHERE id IN ($ids)");
}

superuser(q{
CREATE EXTENSION gen_durable;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE ROLE carol;
GRANT CREATE ON DATABASE postgres TO alice, bob;
-- Whoever runs a spy function says so here.
CREATE TABLE public.spy_log (who text, what text);
GRANT SELECT, INSERT ON public.spy_log TO PUBLIC;
SELECT gd_set_rate_limit('api', 1, '1 hour');
});

# ---------------------------------------------------------------- alice
setup_as('alice', q{
CREATE SCHEMA alice;
CREATE TABLE alice.orders (item text);
INSERT INTO alice.orders VALUES ('alice-tea');
CREATE TABLE alice.runs (id bigint, started timestamptz, ended timestamptz);
-- What alice's steps see of their session: setting, names, rights.
CREATE FUNCTION alice.h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
    her_cursor refcursor := 'alice_cursor';
    shared_name refcursor := 'shared_cursor';
BEGIN
    IF ctx.step = 's2' THEN
        RETURN gd_done(jsonb_build_object('secret', 'alice-result'));
    END IF;
    IF state ? 'leave_open' THEN
        -- a large object (descriptor 0) and a cursor, left open
        PERFORM lo_open(lo_from_bytea(0, 'alice-lo-secret'), 393216);   -- INV_READ | INV_WRITE
        OPEN her_cursor FOR SELECT 'alice-row';
    END IF;
    IF state ? 'open_shared_name' THEN
        OPEN shared_name FOR SELECT 1;
        CLOSE shared_name;
    END IF;
    IF state ? 'park' THEN
        RETURN gd_wait_signal(ARRAY['go']);
    END IF;
    IF state ? 'sleep' THEN
        PERFORM pg_sleep((state->>'sleep')::float8);
    END IF;
    BEGIN
        EXECUTE 'EXECUTE bob_stmt';     -- a prepared statement bob's step left behind
    EXCEPTION WHEN invalid_sql_statement_name THEN NULL;
    END;
    INSERT INTO alice.runs VALUES (ctx.id, started, clock_timestamp());
    RETURN gd_done(jsonb_build_object(
        'who', current_user, 'item', (SELECT item FROM alice.orders LIMIT 1),
        'search_path', current_setting('search_path'),
        'synchronous_commit', current_setting('synchronous_commit'),
        'read_only', current_setting('default_transaction_read_only'),
        'advisory_locks', (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())));
END $$;
-- A SECURITY DEFINER function of alice's, which nobody else may execute.
CREATE FUNCTION alice.private(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql SECURITY DEFINER
    AS $$ SELECT gd_done(jsonb_build_object('ran_as', current_user)) $$;
REVOKE EXECUTE ON FUNCTION alice.private(jsonb, gd.context) FROM PUBLIC;
-- One she lends to bob, for a while.
CREATE FUNCTION alice.lent(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql
    AS $$ SELECT gd_done(jsonb_build_object('ran_as', current_user)) $$;
REVOKE EXECUTE ON FUNCTION alice.lent(jsonb, gd.context) FROM PUBLIC;
GRANT USAGE ON SCHEMA alice TO bob;
GRANT EXECUTE ON FUNCTION alice.lent(jsonb, gd.context) TO bob;

SELECT gd_define_fsm('afsm', 's1', state_defaults => '{"api_key": "alice-secret"}');
SELECT gd_define_step('afsm', 's1', 'alice.h(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('afsm', 's2', 'alice.h(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('aslow', 's1', queue => 'slow');
SELECT gd_define_step('aslow', 's1', 'alice.h(jsonb, gd.context)'::regprocedure);
-- An FSM she lets bob use (and carol: a grant bob must not see).
SELECT gd_define_fsm('ashared', 's1');
SELECT gd_define_step('ashared', 's1', 'alice.h(jsonb, gd.context)'::regprocedure);
SELECT gd_grant('ashared', 'bob');
SELECT gd_grant('afsm', 'carol');
});

# ---------------------------------------------------------------- bob
setup_as('bob', q{
CREATE SCHEMA bob;
GRANT USAGE ON SCHEMA bob TO PUBLIC;
-- What a superuser would run if it resolved a name through bob's schema.
CREATE FUNCTION bob.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.spy_log VALUES (current_user, 'clock_timestamp');
    BEGIN EXECUTE 'ALTER ROLE bob SUPERUSER'; EXCEPTION WHEN insufficient_privilege THEN NULL; END;
    RETURN pg_catalog.clock_timestamp();
END $$;
CREATE FUNCTION bob.spy() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.spy_log VALUES (current_user, 'spy');
    RETURN 'bob-spied';
END $$;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA bob TO PUBLIC;
CREATE TABLE bob.t (x int);
CREATE FUNCTION bob.late() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.spy_log VALUES (current_user, 'deferred');
    BEGIN EXECUTE 'ALTER ROLE bob SUPERUSER'; EXCEPTION WHEN insufficient_privilege THEN NULL; END;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER late AFTER INSERT ON bob.t DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION bob.late();
-- One trick per instance, named by its state.
CREATE FUNCTION bob.h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
DECLARE
    her_cursor refcursor := 'alice_cursor';
    shared_name refcursor := 'shared_cursor';
    peeked text;
    peeked_lo text;
BEGIN
    CASE state->>'trick'
    WHEN 'leave_cursor' THEN OPEN shared_name FOR SELECT 'bob-row';
    WHEN 'peek' THEN
        BEGIN FETCH her_cursor INTO peeked; EXCEPTION WHEN OTHERS THEN peeked := SQLSTATE; END;
        BEGIN peeked_lo := encode(loread(0, 100), 'escape'); EXCEPTION WHEN OTHERS THEN peeked_lo := SQLSTATE; END;
        RETURN gd_done(jsonb_build_object('cursor', peeked, 'lo', peeked_lo));
    WHEN 'drain' THEN PERFORM gd_drain('default');
    WHEN 'search_path' THEN PERFORM set_config('search_path', 'bob, pg_catalog, public', false);
    WHEN 'deferred' THEN INSERT INTO bob.t VALUES (1);
    WHEN 'deferred_explicitly' THEN SET CONSTRAINTS ALL DEFERRED; INSERT INTO bob.t VALUES (2);
    WHEN 'temp_view' THEN EXECUTE 'CREATE TEMP VIEW orders AS SELECT bob.spy() AS item';
    WHEN 'temp_domain' THEN EXECUTE 'CREATE DOMAIN pg_temp.item AS text CHECK (bob.spy() IS NOT NULL)';
    WHEN 'temp_function' THEN EXECUTE 'CREATE FUNCTION pg_temp.item() RETURNS text LANGUAGE sql AS ''SELECT bob.spy()''';
    WHEN 'read_only' THEN PERFORM set_config('default_transaction_read_only', 'on', false);
    WHEN 'sync_off' THEN PERFORM set_config('synchronous_commit', 'off', false);
    WHEN 'advisory' THEN PERFORM pg_advisory_lock(4242);
    WHEN 'advisory_raise' THEN PERFORM pg_advisory_lock(4343); RAISE EXCEPTION 'after the lock';
    WHEN 'prepare' THEN EXECUTE 'PREPARE bob_stmt AS SELECT bob.spy()';
    WHEN 'set_role' THEN EXECUTE 'SET ROLE alice';
    WHEN 'park' THEN RETURN gd_wait_signal(ARRAY['go']);
    WHEN 'spawn_alice' THEN
        RETURN gd_spawn(jsonb_build_array(jsonb_build_object('fsm', 'afsm', 'step', 's2', 'state', '{"from": "bob"}')),
                        then_step => 'collect');
    WHEN 'engine_table' THEN UPDATE gd._instances SET status = 'done';
    ELSE NULL;
    END CASE;
    RETURN gd_done(jsonb_build_object('who', current_user));
END $$;
SELECT gd_define_fsm('bfsm', 'go');
SELECT gd_define_step('bfsm', 'go', 'bob.h(jsonb, gd.context)'::regprocedure, max_attempts => 1);
SELECT gd_define_step('bfsm', 'collect', 'bob.h(jsonb, gd.context)'::regprocedure, max_attempts => 1);
});

sub bob_trick
{
	my ($trick) = @_;
	my ($id) = as_role('bob', "SELECT gd_insert('bfsm', '{\"trick\": \"$trick\"}')");
	return $id;
}

sub bob_error
{
	my ($id) = @_;
	return superuser("SELECT coalesce(error->>'sqlstate', '') || ' ' || coalesce(error->>'message', '') FROM gd._instances WHERE id = $id");
}

# Alice's step, after bob's tricks ran in the same engine session.
sub alice_sees
{
	my ($id) = as_role('alice', q{SELECT gd_insert('afsm')});
	is(wait_ended($id), 'done', 'alice\'s step ran after bob\'s');
	return superuser("SELECT result FROM gd._instances WHERE id = $id");
}

# ------------------------------------------- bob becomes superuser? three ways
{
	my @ids = map { bob_trick($_) } qw(search_path deferred read_only sync_off advisory advisory_raise prepare);
	wait_ended(join(',', @ids));
	like(bob_error($ids[-1]), qr/^42501 cannot execute PREPARE within security-restricted operation/,
		'a handler cannot leave a prepared statement');
	my $alice = alice_sees();
	like($alice, qr/"search_path": "pg_catalog, public, pg_temp"/, 'a search_path a handler set is gone at its step\'s end');
	like($alice, qr/"synchronous_commit": "on"/, 'synchronous_commit = off did not outlive bob\'s step');
	like($alice, qr/"read_only": "off"/, 'default_transaction_read_only did not outlive bob\'s step');
	like($alice, qr/"advisory_locks": 0/, 'bob\'s session advisory locks were released, also after a raise');
	is(superuser(q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'}), '0', 'no advisory lock is held');
	is(superuser(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'bob'}), 'f', 'bob is not a superuser');
	is(superuser(q{SELECT count(*) FROM spy_log WHERE what = 'clock_timestamp'}), '0',
		'no engine statement resolved a name through bob\'s search_path');
	is(superuser(q{SELECT string_agg(DISTINCT who, ',') FROM spy_log WHERE what = 'deferred'}), 'bob',
		'bob\'s initially deferred trigger fired in his step, as bob');
	is(superuser(q{SELECT count(*) FROM spy_log WHERE what = 'spy'}), '0', 'no statement of bob\'s reached alice\'s step');
	my $deferred = bob_trick('deferred_explicitly');
	is(wait_ended($deferred), 'failed', 'a step that defers a constraint itself fails');
	like(bob_error($deferred), qr/^42501 cannot fire deferred trigger within security-restricted operation/,
		'refused by PostgreSQL: it would fire at the round\'s commit');
	is(superuser(q{SELECT count(*) FROM bob.t}), '1', 'and its row is gone');
	my $set_role = bob_trick('set_role');
	wait_ended($set_role);
	like(bob_error($set_role), qr/^42501 cannot set parameter "role" within security-/,
		'a handler cannot SET ROLE');
}

{
	my $view = bob_trick('temp_view');
	my $domain = bob_trick('temp_domain');
	my $function = bob_trick('temp_function');
	is(wait_ended("$view,$domain,$function"), 'failed,failed,failed', 'steps making temporary objects fail');
	like(bob_error($view), qr/^42501 cannot create temporary table within security-restricted operation/,
		'a handler cannot create a temporary view');
	# (PostgreSQL refuses a temporary type up to 17; from 18 it lets the handler make one, and the engine refuses it.)
	like(bob_error($domain), qr/^42501 (cannot create a type in a temporary schema within security-restricted operation|gen_durable: step "go" of FSM "bfsm" created temporary objects)/,
		'nor a temporary type');
	like(bob_error($function), qr/^42501 gen_durable: step "go" of FSM "bfsm" created temporary objects/,
		'nor a temporary function (PostgreSQL allows it; the engine does not)');
	is(superuser(q{SELECT count(*) FROM pg_proc WHERE proname = 'item'}), '0', 'which is gone with its step');
	like(alice_sees(), qr/"item": "alice-tea"/, 'alice\'s step reads her table, not a temporary object of bob\'s');
	is(superuser(q{SELECT count(*) FROM spy_log WHERE what = 'spy'}), '0', 'bob\'s spy never ran');
}

# ------------------------------------------- cursors and large objects left open
{
	my ($opened) = as_role('alice', q{SELECT gd_insert('afsm', '{"leave_open": true}')});
	is(wait_ended($opened), 'done', 'alice\'s step leaves a large object and a cursor open');
	my $peek = bob_trick('peek');
	is(wait_ended($peek), 'done', 'bob\'s next step in the same session');
	is(superuser("SELECT result FROM gd._instances WHERE id = $peek"), '{"lo": "42704", "cursor": "34000"}',
		'finds neither: both were closed when her step ended');
	my $left = bob_trick('leave_cursor');
	is(wait_ended($left), 'done', 'bob\'s step leaves a cursor open under a name alice uses');
	my ($reused) = as_role('alice', q{SELECT gd_insert('afsm', '{"open_shared_name": true}')});
	is(wait_ended($reused), 'done', 'her step opens a cursor of that name all the same');
}
{
	my $drain = bob_trick('drain');
	is(wait_ended($drain), 'failed', 'gd_drain called by a handler an executor runs fails its step');
	like(bob_error($drain), qr/^55000 gen_durable: gd_drain cannot run inside a step/, 'refused: a nested run would take rows its round holds');
}

# The API and the engine's statements resolve no name through a caller's search_path.
setup_as('bob', q{
	SET search_path = bob, pg_catalog, public;
	SELECT gd_insert('bfsm', '{"trick": "park"}', correlation_key => 'path-1', schedule_in => '1 second');
	SELECT gd_signal('path-1', 'go');
	SELECT * FROM gd_await((SELECT max(id) FROM gd.instances), '0s');
	SELECT gd_cancel((SELECT max(id) FROM gd.instances));
	SELECT count(*) FROM gd_claim('default', 'bob-worker');
});
setup_as('bob', q{SELECT gd_define_fsm('bmanual', 'go', queue => 'manual');
	SELECT gd_define_step('bmanual', 'go', 'bob.h(jsonb, gd.context)'::regprocedure)});
{
	my ($manual) = as_role('bob', q{SELECT gd_insert('bmanual', '{"trick": "none"}')});
	# a superuser stepping the queue by hand, with bob's schema on its path
	superuser(q{SET search_path = bob, pg_catalog, public; SELECT gd._execute('manual', 10)});
	is(superuser("SELECT status FROM gd._instances WHERE id = $manual"), 'done', 'gd._execute ran bob\'s step');
}
is(superuser(q{SELECT count(*) FROM spy_log WHERE what = 'clock_timestamp'}), '0',
	'no API function nor engine statement called bob.clock_timestamp() through a search_path');

# ------------------------------------------- "$user" squatting
# dave has no schema named after him; bob makes one, with a gd_done and a ->>
# of his own.  dave's handler, written as the README's are (gd_* and
# operators unqualified), must reach the extension's and PostgreSQL's.
superuser(q{CREATE ROLE dave LOGIN; GRANT CREATE ON DATABASE postgres TO dave});
setup_as('bob', q{
CREATE SCHEMA dave;
GRANT USAGE ON SCHEMA dave TO PUBLIC;
CREATE FUNCTION dave.gd_done(result jsonb DEFAULT '{}') RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.spy_log VALUES (current_user, 'squat gd_done');
    RETURN public.gd_done('{"squatted": true}');
END $$;
CREATE FUNCTION dave.arrow(jsonb, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.spy_log VALUES (current_user, 'squat ->>');
    RETURN 'squatted';
END $$;
CREATE OPERATOR dave.->> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = dave.arrow);
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA dave TO PUBLIC;
});
setup_as('dave', q{
CREATE SCHEMA dave_app;
CREATE FUNCTION dave_app.h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    RETURN gd_done(jsonb_build_object('item', state->>'item'));
END $$;
SELECT gd_define_fsm('dfsm', 'go', steps => '{"go": {"handler": "dave_app.h(jsonb, gd.context)"}}');
});
{
	my ($squatted) = as_role('dave', q{SELECT gd_insert('dfsm', '{"item": "dave-tea"}')});
	is(wait_ended($squatted), 'done', 'dave\'s step runs');
	is(superuser("SELECT result FROM gd._instances WHERE id = $squatted"), '{"item": "dave-tea"}',
		'his gd_done and ->> are the extension\'s and PostgreSQL\'s, not those of the schema bob named after him');
	is(superuser(q{SELECT count(*) FROM spy_log WHERE what LIKE 'squat%'}), '0', 'nothing of bob\'s ran as dave');
}

# ------------------------------------------- bob takes over alice's work?
is(sqlstate_as('bob', q{INSERT INTO gd.fsms VALUES ('afsm', 2, 'x', 'default', '{}', 'bob')}), '42501',
	'bob cannot write a definition through the view');
is(sqlstate_as('bob', q{INSERT INTO gd._fsms VALUES ('afsm', 2, 'x', 'default', '{}', 'bob')}), '42501',
	'nor into the table');
is(sqlstate_as('bob', q{SELECT gd_define_fsm('afsm', 's1', version => 2)}), '42501', 'nor define a version of alice\'s FSM');
is(sqlstate_as('bob', q{SELECT gd_define_step('afsm', 'evil', 'bob.h(jsonb, gd.context)'::regprocedure)}), '42501',
	'nor a step of it');
{
	my $spawn = bob_trick('spawn_alice');
	is(wait_ended($spawn), 'failed', 'bob\'s spawn of alice\'s FSM fails his step');
	like(bob_error($spawn), qr/^42501 gen_durable: permission denied for FSM 'afsm'/, 'with a permission error');
	is(superuser(q{SELECT count(*) FROM gd._instances WHERE fsm = 'afsm' AND state->>'from' = 'bob'}), '0',
		'no instance of alice\'s was spawned');
	my $engine = bob_trick('engine_table');
	is(wait_ended($engine), 'failed', 'a handler cannot write the engine\'s tables');
	like(bob_error($engine), qr/^42501 permission denied for table _instances/, 'with a permission error');
}
my $private = superuser(q{SELECT 'alice.private(jsonb, gd.context)'::regprocedure::oid});
is(sqlstate_as('bob', "SELECT gd_define_step('bfsm', 'steal', ${private}::regprocedure)"), '42501',
	'bob cannot make alice\'s SECURITY DEFINER function his handler by its OID');
# A SECURITY DEFINER function of alice's in a schema bob may not use: its EXECUTE is PUBLIC's, but a call by name
# would not reach it, and neither may a step by its OID.
setup_as('alice', q{
	CREATE SCHEMA alice_vault;
	CREATE TABLE alice_vault.secrets (s text);
	INSERT INTO alice_vault.secrets VALUES ('vault-secret');
	CREATE FUNCTION alice_vault.reveal(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql SECURITY DEFINER
		AS $$ SELECT gd_done(jsonb_build_object('secret', (SELECT s FROM alice_vault.secrets))) $$;
	CREATE SCHEMA alice_shelf;
	GRANT USAGE ON SCHEMA alice_shelf TO bob;
	CREATE FUNCTION alice_shelf.f(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql
		AS $$ SELECT gd_done(jsonb_build_object('ran_as', current_user)) $$;
});
{
	my $vault = superuser(q{SELECT 'alice_vault.reveal(jsonb, gd.context)'::regprocedure::oid});
	is(sqlstate_as('bob', "SELECT gd_define_step('bfsm', 'vault', ${vault}::regprocedure)"), '42501',
		'bob cannot make a function in a schema he may not use his handler by its OID');
	setup_as('bob', q{SELECT gd_define_fsm('bshelf', 'go');
		SELECT gd_define_step('bshelf', 'go', 'alice_shelf.f(jsonb, gd.context)'::regprocedure, max_attempts => 1)});
	as_role('alice', q{REVOKE USAGE ON SCHEMA alice_shelf FROM bob});
	my ($shelf) = as_role('bob', q{SELECT gd_insert('bshelf')});
	is(wait_ended($shelf), 'failed', 'once USAGE on its schema is revoked, his step on alice\'s function fails');
	like(bob_error($shelf), qr/^42501 gen_durable: role "bob", which handlers of FSM "bshelf" run as, may not execute/,
		'checked at every call');
	is(sqlstate_as('alice', q{DROP FUNCTION alice_shelf.f(jsonb, gd.context)}), '',
		'alice drops her own function although bob\'s step names it');
}
setup_as('bob', q{CREATE FUNCTION bob.many(state jsonb, ctx gd.context) RETURNS SETOF gd.outcome LANGUAGE sql
	AS $$ SELECT gd_done() $$});
is(sqlstate_as('bob', q{SELECT gd_define_step('bfsm', 'many', 'bob.many(jsonb, gd.context)'::regprocedure)}), '42P13',
	'a set-returning handler is refused');
setup_as('bob', q{CREATE FUNCTION bob.fold(so_far gd.outcome, state jsonb, ctx gd.context) RETURNS gd.outcome
	LANGUAGE sql AS $$ SELECT gd_done() $$;
	CREATE AGGREGATE bob.agg(jsonb, gd.context) (sfunc = bob.fold, stype = gd.outcome)});
is(sqlstate_as('bob', q{SELECT gd_define_step('bfsm', 'agg', 'bob.agg(jsonb, gd.context)'::regprocedure)}), '42883',
	'an aggregate handler is refused');
{
	setup_as('bob', q{SELECT gd_define_fsm('blent', 'go');
		SELECT gd_define_step('blent', 'go', 'alice.lent(jsonb, gd.context)'::regprocedure, max_attempts => 1)});
	my ($first) = as_role('bob', q{SELECT gd_insert('blent')});
	is(wait_ended($first), 'done', 'a lent handler runs');
	like(superuser("SELECT result FROM gd._instances WHERE id = $first"), qr/"ran_as": "bob"/, 'as bob');
	as_role('alice', q{REVOKE EXECUTE ON FUNCTION alice.lent(jsonb, gd.context) FROM bob});
	my ($second) = as_role('bob', q{SELECT gd_insert('blent')});
	is(wait_ended($second), 'failed', 'once its EXECUTE is revoked, the step fails');
	like(bob_error($second), qr/^42501 gen_durable: role "bob", which handlers of FSM "blent" run as, may not execute/,
		'checked at the call, not only at the definition');
}

# ------------------------------------------- the tables are closed
my @relations = split /\n/, superuser(q{
	SELECT c.relname || ' ' || c.relkind::text || ' ' || a.attname FROM pg_class c
	  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = c.relnatts
	 WHERE c.relnamespace = 'gd'::regnamespace AND c.relkind IN ('r', 'v', 'S') ORDER BY 1});
for my $relation (@relations)
{
	my ($name, $kind, $column) = split / /, $relation;
	my @statements = $kind eq 'S'
	  ? ("SELECT nextval('gd.$name')", "SELECT setval('gd.$name', 1000000)")
	  : ("INSERT INTO gd.$name DEFAULT VALUES", "UPDATE gd.$name SET $column = $column",
		"DELETE FROM gd.$name", "LOCK TABLE gd.$name IN ACCESS EXCLUSIVE MODE");
	push @statements, "TRUNCATE gd.$name" if $kind eq 'r';
	push @statements, "SELECT FROM gd.$name LIMIT 1" unless $kind eq 'v';
	for my $statement (@statements)
	{
		my $state = sqlstate_as('bob', "BEGIN; $statement; ROLLBACK;");
		# 42501: permission denied; a view that is not updatable at all (55000) refuses before that.
		ok($state eq '42501' || ($kind eq 'v' && $state eq '55000'), "bob: $statement refused ($state)");
	}
}
is(superuser(q{
	SELECT string_agg(c.relname || ':' || a.privilege_type, ', ') FROM pg_class c, aclexplode(c.relacl) a
	 WHERE c.relnamespace = 'gd'::regnamespace AND a.grantee = 0 AND NOT (c.relkind = 'v' AND a.privilege_type = 'SELECT')}),
	'', 'PUBLIC holds no privilege on a relation of gd but SELECT on its views');
is(superuser(q{
	SELECT string_agg(c.relname, ', ' ORDER BY c.relname) FROM pg_class c, aclexplode(c.relacl) a
	 WHERE c.relnamespace = 'gd'::regnamespace AND a.grantee = 0}),
	'concurrency_limits, fsms, grants, instances, limit_stats, owner_weights, queue_stats, queues, rate_limits, schedules, '
	  . 'signals, stats, '
	  . 'status_changes, step_history, step_stats, steps, workers',
	'PUBLIC reads the documented views');
is(superuser(q{
	SELECT string_agg(p.proname, ', ' ORDER BY p.proname) FROM pg_proc p
	 WHERE p.pronamespace = 'gd'::regnamespace AND has_function_privilege('public', p.oid, 'EXECUTE')}),
	'configured_queues, read_instances, read_limit_stats, read_queue_counters, read_stats, read_status_changes, '
	  . 'read_step_stats, read_workers',
	'PUBLIC executes no internal function of gd');
is(superuser(q{
	SELECT string_agg(DISTINCT p.proname, ', ' ORDER BY p.proname) FROM pg_proc p
	 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'gd\_%'
	   AND has_function_privilege('public', p.oid, 'EXECUTE')}),
	'gd_accept_grant, gd_await, gd_cancel, gd_claim, gd_complete, gd_complete_all, gd_cron_ticks, gd_define_fsm, gd_define_step, gd_done, '
	  . 'gd_drain, gd_fork, gd_grant, gd_heartbeat, gd_history, gd_insert, gd_insert_all, gd_migrate, gd_next, gd_outcome, '
	  . 'gd_pause_schedule, gd_release, gd_resume_schedule, gd_retry, gd_revoke, gd_rewind, gd_schedule, gd_signal, gd_spawn, gd_stop, '
	  . 'gd_unschedule, gd_wait_signal',
	'PUBLIC executes the documented API, not its administration');
is(sqlstate_as('bob', q{SELECT gd._count('step_done', 1000000000000)}), '42501', 'bob cannot count events');
is(sqlstate_as('bob', q{SELECT gd._await_publish(1)}), '42501', 'nor publish an await');
is(sqlstate_as('bob', q{SELECT gd._insert_instance(10, 'afsm', '{}', NULL, NULL, 0, NULL, NULL, NULL, NULL, 1, NULL, NULL, 'error')}),
	'42501', 'nor call an implementation past its door');
is(sqlstate_as('bob', q{SELECT gd._caller()}), '42501', 'nor ask who called');

# A grant left in the table by a definition deleted by hand is not inherited.
superuser(q{INSERT INTO gd._grants VALUES ('payroll', 'bob')});
setup_as('alice', q{SELECT gd_define_fsm('payroll', 's1'); SELECT gd_define_step('payroll', 's1', 'alice.h(jsonb, gd.context)'::regprocedure)});
is(sqlstate_as('bob', q{SELECT gd_insert('payroll')}), '42501', 'a stale grant gives bob nothing');

# ------------------------------------------- bob sees nothing of alice's
my ($parked) = as_role('alice', q{SELECT gd_insert('afsm', '{"park": true}', correlation_key => 'order-2')});
$node->poll_query_until('postgres', "SELECT status = 'awaiting_signal' FROM gd._instances WHERE id = $parked");
is((as_role('bob', q{SELECT count(*) FROM gd.fsms WHERE name = 'afsm'}))[0], '0', 'bob does not see alice\'s definitions');
is((as_role('bob', q{SELECT count(*) FROM gd.fsms WHERE state_defaults ? 'api_key'}))[0], '0', 'nor her state_defaults');
is((as_role('bob', q{SELECT string_agg(fsm || ':' || role, ',') FROM gd.grants}))[0], 'ashared:bob',
	'bob sees only the grant made to him');
is((as_role('bob', q{SELECT count(*) FROM gd.instances WHERE fsm NOT LIKE 'b%'}))[0], '0',
	'bob sees no instance of alice\'s');
is((as_role('alice', q{SELECT count(*) FROM gd.instances WHERE fsm LIKE 'b%'}))[0], '0', 'nor alice one of bob\'s');

# ------------------------------------------- key spaces
{
	my $t0 = time();
	my ($mine) = as_role('bob', q{SELECT gd_insert('bfsm', '{"trick": "park"}', correlation_key => 'order-2', on_duplicate => 'skip')});
	ok($mine =~ /^\d+$/ && $mine != $parked, 'bob takes a correlation key alice holds, in his own key space');
	ok(time() - $t0 < 5, 'at once');
	$node->poll_query_until('postgres', "SELECT status = 'awaiting_signal' FROM gd._instances WHERE id = $mine");
	my ($signalled) = as_role('bob', q{SELECT gd_signal('order-2', 'go')});
	is($signalled, 't', 'bob\'s signal by that key goes to his instance');
	is(superuser("SELECT count(*) FROM gd._signals WHERE instance_id = $parked"), '0', 'not to alice\'s');
	my ($held) = as_role('alice', q{SELECT gd_insert('afsm', '{"park": true}', correlation_key => 'order-9')});
	my ($stdout, $stderr) = as_role('bob', q{SELECT gd_insert('ashared', correlation_key => 'order-9')});
	like($stderr, qr/correlation key 'order-9' is already taken\nDETAIL:  An instance of an FSM you may not use holds it\./,
		'in alice\'s key space, bob (a grantee) is refused without the occupant\'s id');
	as_role('alice', "SELECT gd_cancel($held)");
	# bob may use two key spaces, his own and (through ashared) alice's: his signal by key looks in his own first
	as_role('alice', q{SELECT gd_insert('ashared', '{"park": true}', correlation_key => 'both')});
	my ($his) = as_role('bob', q{SELECT gd_insert('bfsm', '{"trick": "park"}', correlation_key => 'both')});
	$node->poll_query_until('postgres', "SELECT status = 'awaiting_signal' FROM gd._instances WHERE id = $his");
	is((as_role('bob', q{SELECT gd_signal('both', 'go')}))[0], 't', 'a key held in bob\'s own key space and a granted one');
	is(superuser("SELECT count(*) FROM gd._signals WHERE instance_id = $his"), '1', 'goes to his own instance');
	my ($granted) = as_role('alice', q{SELECT gd_insert('ashared', '{"park": true}', correlation_key => 'only-granted')});
	is(sqlstate_as('bob', q{SELECT gd_signal('only-granted', 'go')}), 'P0002',
		'a key held only in the space of a grant bob has not accepted is not found');
	is((as_role('bob', q{SELECT gd_accept_grant('ashared')}))[0], 't', 'bob accepts alice\'s grant');
	is((as_role('bob', q{SELECT accepted FROM gd.grants WHERE fsm = 'ashared'}))[0], 't', 'gd.grants says so');
	is((as_role('bob', q{SELECT gd_signal('only-granted', 'go')}))[0], 't', 'then his signal by that key finds it');
	is(superuser("SELECT count(*) FROM gd._signals WHERE instance_id = $granted"), '1', 'in alice\'s instance');
	is(sqlstate_as('bob', q{SELECT gd_accept_grant('afsm', 'carol')}), '42501', 'bob cannot accept a grant made to carol');
}
# ------------------------------------------- grants without consent
{
	setup_as('bob', q{
		SELECT gd_define_fsm('bgift', 'go', steps => '{"go": {"handler": "bob.h(jsonb, gd.context)"}}');
		SELECT gd_grant('bgift', 'alice');
		SELECT gd_define_fsm('bext', 'work', queue => 'ext', steps => '{"work": {}}');
		SELECT gd_grant('bext', 'alice');
		SELECT gd_insert('bext', priority => -10) FROM generate_series(1, 5);
	});
	is((as_role('alice', q{SELECT accepted FROM gd.grants WHERE fsm = 'bgift'}))[0], 'f', 'bob\'s grant to alice waits for her');
	my ($hers) = as_role('alice', q{SELECT gd_insert('afsm', '{"park": true}', correlation_key => 'order-8')});
	my ($decoy) = as_role('bob', q{SELECT gd_insert('bgift', '{"trick": "park"}', correlation_key => 'order-8')});
	my ($bait) = as_role('bob', q{SELECT gd_insert('bgift', '{"trick": "park"}', correlation_key => 'order-11')});
	$node->poll_query_until('postgres', "SELECT bool_and(status = 'awaiting_signal') FROM gd._instances WHERE id IN ($hers, $decoy, $bait)");
	is((as_role('alice', q{SELECT gd_signal('order-8', 'go', '{"card": "alice-card"}')}))[0], 't',
		'alice\'s signal by a key bob\'s granted instance holds too');
	is(superuser("SELECT string_agg(instance_id::text, ',') FROM gd._signals WHERE payload->>'card' = 'alice-card'"), $hers,
		'reaches her own instance, not his');
	is((as_role('alice', q{SELECT gd_signal('order-11', 'go', '{"card": "alice-card-2"}', missing_ok => true) IS NULL}))[0], 't',
		'a key only his instance holds is not found for her');
	is(superuser("SELECT count(*) FROM gd._signals WHERE instance_id = $bait"), '0', 'so her payload never reaches him');
	setup_as('alice', q{SELECT gd_define_fsm('aext', 'work', queue => 'ext', steps => '{"work": {}}');
		SELECT gd_insert('aext') FROM generate_series(1, 5)});
	is((as_role('alice', q{SELECT string_agg(DISTINCT fsm, ',') FROM gd_claim('ext', 'alice-worker', 10)}))[0], 'aext',
		'her claim without fsms takes her own steps, not those of bob\'s grant');
	is((as_role('alice', q{SELECT count(*) FROM gd_claim('ext', 'alice-worker', 10, fsms => '{bext}')}))[0], '5',
		'his only when she names his FSM');
	is((as_role('alice', q{SELECT count(*) FROM gd_claim('ext', 'alice-worker', 10, fsms => '{bfsm}')}))[0], '0',
		'and never an FSM she may not use');
	is((as_role('alice', q{SELECT gd_revoke('bgift', 'alice')}))[0], 't', 'she drops the grant she did not want');
	is(sqlstate_as('alice', qq{SELECT gd_signal($decoy, 'go')}), 'P0002', 'and bob\'s instances are no longer hers to use');
	# A grantee starts an FSM at its initial step only.
	setup_as('alice', q{SELECT gd_define_step('ashared', 's2', 'alice.h(jsonb, gd.context)'::regprocedure)});
	is(sqlstate_as('bob', q{SELECT gd_insert('ashared', step => 's2')}), '42501', 'bob (a grantee) cannot start alice\'s FSM past its first step');
	is(sqlstate_as('bob', q{SELECT gd_insert('ashared')}), '', 'he starts it at its initial step');
}
{
	# Concurrency keys: bob holds 'k' for a century; alice's two instances on
	# 'k' (limit 1) run, one after the other.
	as_role('bob', q{SELECT gd_insert('bfsm', '{"trick": "none"}', concurrency_key => 'k', schedule_in => '100 years')});
	my ($a1) = as_role('alice', q{SELECT gd_insert('afsm', '{"sleep": 0.5}', concurrency_key => 'k')});
	my ($a2) = as_role('alice', q{SELECT gd_insert('afsm', '{"sleep": 0.5}', concurrency_key => 'k')});
	is(wait_ended("$a1,$a2"), 'done,done', 'bob\'s instance on key k does not hold alice\'s back');
	is(superuser("SELECT count(*) FROM alice.runs a JOIN alice.runs b ON a.id < b.id AND a.started < b.ended AND b.started < a.ended
	               WHERE a.id IN ($a1, $a2) AND b.id IN ($a1, $a2)"), '0', 'alice\'s own instances on k still ran one at a time');
	# Rate limits: bob's bucket of 'api' is his own.
	my @bobs = map { (as_role('bob', q{SELECT gd_insert('bfsm', '{"trick": "none"}', rate_limit => 'api')}))[0] } 1 .. 3;
	$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM gd._instances WHERE id IN (" . join(',', @bobs) . ") AND status = 'done'");
	my ($a3) = as_role('alice', q{SELECT gd_insert('afsm', rate_limit => 'api')});
	is(wait_ended($a3), 'done', 'bob exhausting his tokens of api leaves alice\'s');
}

# ------------------------------------------- stale outcomes tell bob nothing
{
	my $theirs = superuser(q{SELECT min(id) FROM gd._instances WHERE fsm = 'aext' AND status = 'executing'});
	my $stale_before = superuser(q{SELECT stale_outcomes FROM gd.queue_stats WHERE queue = 'ext'});
	my $off = -s $node->logfile;
	my $padding = '-- ' . ('x' x 100_000);
	my ($completed) = as_role('bob', qq{SELECT count(*) FILTER (WHERE completed) FROM gd_complete_all(
		ARRAY(SELECT $theirs + g FROM generate_series(0, 1999) g), array_fill(1::bigint, ARRAY[2000]),
		array_fill(gd_done(), ARRAY[2000]))
$padding});
	is($completed, '0', 'bob completes none of 2000 ids of alice\'s and others');
	my $log = slurp_file($node->logfile, $off);
	my @lines = $log =~ /^.*stale outcome.*$/mg;
	is(scalar(@lines), 1, 'the server log says so in one line');
	my ($message) = $lines[0] =~ /(gen_durable: .*)$/;   # (not the line's timestamp, which may hold the number)
	ok(defined $message && $message !~ /\b$theirs\b/, 'which names no instance of alice\'s')
	  or diag $lines[0];
	unlike($log, qr/stale outcome[^\n]*\n[^\n]*STATEMENT:/, 'nor repeats the statement');
	is(superuser(q{SELECT stale_outcomes FROM gd.queue_stats WHERE queue = 'ext'}), $stale_before,
		'and her queue\'s stale_outcomes did not count them: it would tell bob which ids exist');
}

# ------------------------------------------- no timing tells bob of alice's
{
	my ($slow) = as_role('alice', q{SELECT gd_insert('aslow', '{"sleep": 6}')});
	$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM gd.workers WHERE instance_id = $slow");
	is((as_role('bob', "SELECT count(*) FROM gd.workers WHERE instance_id = $slow"))[0], '0',
		'gd.workers does not show bob which instance alice\'s step is');
	is((as_role('alice', "SELECT count(*) FROM gd.workers WHERE instance_id = $slow"))[0], '1', 'it shows alice');
	my $t0 = time();
	is(sqlstate_as('bob', "SELECT gd_signal($slow, 'go')"), 'P0002', 'bob\'s signal to it: not a live instance');
	ok(time() - $t0 < 3, 'at once, not after alice\'s step released the row');
	$t0 = time();
	is((as_role('bob', "SELECT status FROM gd_await($slow, '4s')"))[0], 'not_found', 'bob awaiting it: not_found');
	is((as_role('bob', "SELECT gd_cancel($slow), gd_retry($slow)"))[0], 'f|f', 'bob can neither cancel nor retry it');
	is((as_role('bob', "SELECT gd_rewind($slow, 'x')"))[0], 'f', 'nor rewind it');
	is(sqlstate_as('bob', "SELECT gd_fork($slow, 1)"), 'P0002', 'nor fork it: not found');
	is(sqlstate_as('bob', "SELECT gd_migrate('aslow', 1, 2)"), '42704', 'nor migrate its FSM: unknown');
	ok(time() - $t0 < 3, 'at once');
	is(wait_ended($slow), 'done', 'alice\'s step finished untouched');
}
is(superuser(q{SELECT count(*) FROM spy_log WHERE who <> 'bob'}), '0', 'nothing of bob\'s ran as anyone else');
is(superuser(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'bob'}), 'f', 'bob is still not a superuser');

$node->stop;
done_testing();
