# The engine's waits (docs/access-control.md, "Locks"): no role can hold a
# lock the engine's workers wait for.  bob, a tenant like alice, holds every
# advisory lock he can name, holds his own concurrency key in an open
# transaction, and asks to drop the extension while his slow step runs; all
# the while alice's steps, timed waits, schedule and definitions go on, and
# nothing of the engine waits on him.  A wait the engine cannot avoid (a
# superuser's lock on its table) is logged with who holds it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 30;

my $node = GdTest::start_node('engine_waits', 'gen_durable.queues' => 'default:2, slow:1');

sub superuser { return $node->safe_psql('postgres', $_[0]); }
sub as_role { my ($role, $sql) = @_; return $node->safe_psql('postgres', $sql, extra_params => [ '-U', $role ]); }

# SQL as a role, with a statement timeout: (seconds it took, SQLSTATE or '').
sub timed_as
{
	my ($role, $sql) = @_;
	my $t0 = time();
	my ($stdout, $stderr) = ('', '');
	$node->psql('postgres', "SET statement_timeout = '8s';\n\\set VERBOSITY sqlstate\n$sql",
		stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', $role ]);
	return (time() - $t0, $stderr =~ /ERROR:\s+([0-9A-Z]{5})/ ? $1 : '');
}

# Wait until an executor runs a step of the instance.
sub wait_running
{
	my ($id) = @_;
	return $node->poll_query_until('postgres', "SELECT count(*) = 1 FROM gd.workers WHERE instance_id = $id");
}

sub wait_status
{
	my ($ids, $status) = @_;
	return $node->poll_query_until('postgres',
		"SELECT bool_and(status = '$status') FROM gd._instances WHERE id IN ($ids)");
}

superuser(q{
CREATE EXTENSION gen_durable;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
GRANT CREATE ON DATABASE postgres TO alice, bob;
});
for my $role (qw(alice bob))
{
	as_role($role, qq{
CREATE SCHEMA $role;
CREATE TABLE $role.ticks (at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION $role.h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS \$\$
BEGIN
    IF ctx.step = 'wait' AND NOT ctx.timed_out THEN
        RETURN gd_wait_signal(ARRAY['never'], timeout => '1 second');
    END IF;
    PERFORM pg_sleep(coalesce((state->>'sleep')::float8, 0));
    INSERT INTO $role.ticks DEFAULT VALUES;
    RETURN gd_done();
END \$\$;
SELECT gd_define_fsm('${role}_fsm', 'run', steps => '{"run": {"handler": "$role.h(jsonb, gd.context)"},
                                                 "wait": {"handler": "$role.h(jsonb, gd.context)"}}');
SELECT gd_define_fsm('${role}_slow', 'run', queue => 'slow',
                     steps => '{"run": {"handler": "$role.h(jsonb, gd.context)"}}');
});
}
my $alice_oid = superuser(q{SELECT 'alice'::regrole::oid});

# ------------------------------------------------ bob holds every lock he can name
my $bob = $node->background_psql('postgres', extra_params => [ '-U', 'bob' ]);
# Alice's key lock is in pg_locks while her insert's transaction is open: bob reads it there.
my $alice_open = $node->background_psql('postgres', extra_params => [ '-U', 'alice' ]);
$alice_open->query_safe(q{BEGIN; SELECT gd_insert('alice_fsm', concurrency_key => 'k', schedule_in => '1 hour')});
is(superuser(q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid NOT IN (1, 2)}), '1',
	'the engine\'s key lock shows in pg_locks, in a class of its own');
$bob->query_safe(qq{
SELECT pg_advisory_lock(hashtextextended('gen_durable concurrency key ' || $alice_oid || '/k', 0));
SELECT pg_advisory_lock(hashtextextended('gen_durable FSM alice_fsm', 0));
SELECT pg_advisory_lock(hashtextextended('gen_durable FSM alice_new', 0));
SELECT pg_advisory_lock((l.classid::bigint << 32) | l.objid::bigint),
       pg_advisory_lock(((l.classid::bigint + 2147483648) % 4294967296 - 2147483648)::int,
                        ((l.objid::bigint + 2147483648) % 4294967296 - 2147483648)::int)
  FROM pg_locks l WHERE l.locktype = 'advisory' AND l.pid <> pg_backend_pid();
});
$alice_open->query_safe('ROLLBACK');
is(superuser(q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid NOT IN (1, 2)}), '0',
	'bob\'s locks are not the engine\'s');

{
	my ($took, $state) = timed_as('alice', q{SELECT gd_insert('alice_fsm', '{"sleep": 0.2}', concurrency_key => 'k')});
	is($state, '', 'alice inserts under her concurrency key while bob holds its old advisory lock');
	ok($took < 3, 'at once');
	my $keyed = superuser(q{SELECT max(id) FROM gd._instances WHERE fsm = 'alice_fsm'});
	my $plain = as_role('alice', q{SELECT string_agg(gd_insert('alice_fsm')::text, ',') FROM generate_series(1, 5)});
	my $waiting = as_role('alice', q{SELECT gd_insert('alice_fsm', step => 'wait')});
	ok(wait_status("$keyed,$plain,$waiting", 'done'), 'her keyed step, plain steps and a timed wait all ran');
	($took, $state) = timed_as('alice', q{SELECT gd_define_fsm('alice_fsm', 'run', version => 2,
		steps => '{"run": {"handler": "alice.h(jsonb, gd.context)"}}'); SELECT gd_define_fsm('alice_new', 'run')});
	is($state, '', 'she defines a version and a new FSM while bob holds their names\' old locks');
	ok($took < 3, 'at once');
	as_role('alice', q{SELECT gd_schedule('every_second', '* * * * * *', 'alice_fsm')});
	my $before = superuser(q{SELECT count(*) FROM alice.ticks});
	sleep 3;
	cmp_ok(superuser(q{SELECT count(*) FROM alice.ticks}) - $before, '>=', 2, 'her every-second schedule fires');
	as_role('alice', q{SELECT gd_unschedule('every_second')});
}
$bob->query_safe('SELECT pg_advisory_unlock_all()');

# ------------------------------------------------ bob holds his own key open
{
	# bob's instance under his key k runs 1 s; meanwhile his open transaction
	# inserts another under k (so it holds k's engine lock) and stays open.
	my $running = as_role('bob', q{SELECT gd_insert('bob_fsm', '{"sleep": 1}', concurrency_key => 'k')});
	ok(wait_running($running), 'bob\'s keyed step runs');
	$bob->query_safe(q{BEGIN; SELECT gd_insert('bob_fsm', concurrency_key => 'k')});
	my $gated = $bob->query_safe(q{SELECT max(id) FROM gd.instances});
	my $t0 = time();
	my $plain = as_role('alice', q{SELECT string_agg(gd_insert('alice_fsm')::text, ',') FROM generate_series(1, 10)});
	ok(wait_status("$running,$plain", 'done'), 'bob\'s keyed step ends and alice\'s steps all run');
	ok(time() - $t0 < 10, 'promptly, while bob\'s transaction holds his key');
	is(superuser(q{SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
	                 AND application_name LIKE 'gen_durable%'}), '0', 'no engine worker waits for a lock');
	cmp_ok(superuser(q{SELECT count FROM gd.stats WHERE event = 'concurrency_contended'}), '>=', 1,
		'the contended key is counted');
	$bob->query_safe('COMMIT');
	ok(wait_status($gated, 'done'), 'once bob commits, his instance that waited under k runs (the reaper\'s repair)');
}

# ------------------------------------------------ keys the engine must insert, held open
{
	# A schedule's next ticks: alice's open transaction inserts their correlation keys.
	as_role('alice', q{SELECT gd_schedule('held', '* * * * * *', 'alice_fsm')});
	my $keys = superuser(q{
		SELECT string_agg(quote_literal(format('schedule:held:%s', gd._tick_text(t))), ',')
		  FROM gd._schedules s, gd_cron_ticks(s.cron, s.time_zone, s.next_run_at + interval '1 second', 4) t
		 WHERE s.name = 'held'});
	$alice_open->query_safe("BEGIN; SELECT gd_insert('alice_fsm', correlation_key => k, schedule_in => '1 hour')
	                           FROM unnest(ARRAY[$keys]) k");
	my $waiting = as_role('bob', q{SELECT gd_insert('bob_fsm', step => 'wait')});
	ok(wait_status($waiting, 'done'), 'bob\'s timed wait ends while alice holds her next ticks\' keys');
	ok($node->poll_query_until('postgres', q{SELECT skipped >= 1 AND last_error LIKE '%lock timeout%'
	                                           FROM gd.schedules WHERE name = 'held'}),
		'the reaper skips a tick whose key an open transaction holds, and says why');
	$alice_open->query_safe('ROLLBACK');
	as_role('alice', q{SELECT gd_unschedule('held')});

	# Children whose correlation keys bob's open transaction inserts.
	as_role('bob', q{
		CREATE FUNCTION bob.spawner(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
		BEGIN
		    IF ctx.step = 'joined' THEN RETURN gd_done(); END IF;
		    RETURN gd_spawn(jsonb_build_array(jsonb_build_object('fsm', 'bob_fsm', 'correlation_key', state->>'child')),
		                    then_step => 'joined');
		END $$;
		SELECT gd_define_fsm('bob_spawner', 'spawn', steps => '{"spawn": {"handler": "bob.spawner(jsonb, gd.context)", "max_attempts": 50},
		                                                      "joined": {"handler": "bob.spawner(jsonb, gd.context)"}}')});
	$bob->query_safe(q{BEGIN; SELECT gd_insert('bob_fsm', correlation_key => c, schedule_in => '1 hour')
	                    FROM unnest(ARRAY['child-1', 'child-2']) c});
	my $spawners = as_role('bob', q{SELECT string_agg(gd_insert('bob_spawner', jsonb_build_object('child', c))::text, ',')
	                                  FROM unnest(ARRAY['child-1', 'child-2']) c});
	ok($node->poll_query_until('postgres', "SELECT bool_and(error->>'sqlstate' = '55P03') FROM gd._instances WHERE id IN ($spawners)"),
		'a spawn whose child\'s key an open transaction holds fails its attempt (55P03)');
	my $plain = as_role('alice', q{SELECT string_agg(gd_insert('alice_fsm')::text, ',') FROM generate_series(1, 5)});
	ok(wait_status($plain, 'done'), 'and both executors go on with alice\'s steps');
	$bob->query_safe('ROLLBACK');
	ok(wait_status($spawners, 'done'), 'once bob lets go, the spawns are tried again and succeed');

	# A rate limit bucket alice's open transaction is making, which her step's limit needs too.
	superuser(q{SELECT gd_set_rate_limit('api', 100, '1 second')});
	as_role('alice', q{SELECT gd_define_fsm('alice_limited', 'run',
		steps => '{"run": {"handler": "alice.h(jsonb, gd.context)", "rate_limit": "api"}}')});
	$alice_open->query_safe(q{BEGIN; SELECT gd_insert('alice_fsm', rate_limit => 'api', schedule_in => '1 hour')});
	my $limited = as_role('alice', q{SELECT string_agg(gd_insert('alice_limited')::text, ',') FROM generate_series(1, 2)});
	sleep 1;
	my $bobs = as_role('bob', q{SELECT string_agg(gd_insert('bob_fsm')::text, ',') FROM generate_series(1, 5)});
	ok(wait_status($bobs, 'done'), 'bob\'s steps run while alice\'s open transaction makes a bucket her steps need');
	is(superuser("SELECT count(*) FROM gd._instances WHERE id IN ($limited) AND status = 'done'"), '0',
		'hers wait for it');
	$alice_open->query_safe('COMMIT');
	ok(wait_status($limited, 'done'), 'and run once it is made');
}

# ------------------------------------------------ bob asks to drop the extension
{
	my $slow = as_role('bob', q{SELECT gd_insert('bob_slow', '{"sleep": 4}')});
	ok(wait_running($slow), 'bob\'s slow step runs');
	my ($took, $state) = timed_as('bob', q{DROP EXTENSION gen_durable});
	is($state, '42501', 'bob may not drop the extension');
	ok($took < 2, 'refused at once, not after his step ended');
	my ($stdout, $stderr) = ('', '');
	$node->psql('postgres', 'DROP EXTENSION IF EXISTS gen_durable CASCADE', stderr => \$stderr,
		extra_params => [ '-U', 'bob' ]);
	like($stderr, qr/ERROR:  gen_durable: must be owner of extension gen_durable/, 'with PostgreSQL\'s reason');
	my $plain = as_role('alice', q{SELECT string_agg(gd_insert('alice_fsm')::text, ',') FROM generate_series(1, 5)});
	ok(wait_status($plain, 'done'), 'alice\'s steps run meanwhile');
	is(superuser("SELECT count(*) FROM gd.workers WHERE instance_id = $slow"), '1', 'while bob\'s step still runs');
	ok(wait_status($slow, 'done'), 'which ends in its time');
}

# ------------------------------------------------ a wait the engine cannot avoid is logged
{
	my $off = -s $node->logfile;
	my $holder = $node->background_psql('postgres');
	my $holder_pid = $holder->query_safe(q{BEGIN; LOCK TABLE gd._instances IN ACCESS EXCLUSIVE MODE; SELECT pg_backend_pid()});
	sleep 1;
	$holder->query_safe('COMMIT');
	ok($node->wait_for_log(qr/still waiting for \w+ on relation \d+ of database \d+ after [\d.]+ ms\n.*DETAIL:  Process holding the lock: $holder_pid\. Wait queue: [\d, ]+\.\n.*CONTEXT:  [^\n]*(?:\n\t[^\n]*)*?\n\tgen_durable (?:executor|reaper|garbage collector)/, $off),
		'an engine worker that waits logs what for and who holds it');
	$holder->quit;
}

$bob->quit;
$alice_open->quit;
$node->stop;
done_testing();
