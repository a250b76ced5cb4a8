# The launcher and its executors: the queue plan follows gen_durable.queues
# across reloads, dead executors are restarted (SIGTERM) or survive a
# postmaster crash-restart (SIGKILL) with every step applied exactly once, a
# database without the extension is waited on quietly and served at CREATE
# EXTENSION, and a database that does not exist gets no workers until it is
# created (and none after it is dropped).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

# Every poll in this file is bounded well below the suite's timeout.
$PostgreSQL::Test::Utils::timeout_default = 30;

my $node = GdTest::start_node(
	'launcher',
	'gen_durable.queues' => 'default:2, mail:1',
	max_worker_processes => 32,
	restart_after_crash  => 'on',
);

# The schema every served database gets: a ledger the handlers write to, with
# one row per (instance, step) at most, and a generic handler that follows
# state.plan (step -> next step) and sleeps state.sleep seconds after writing.
my $schema = q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (
    instance bigint NOT NULL,
    step     text   NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (instance, step));
CREATE FUNCTION walk(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
DECLARE
    next_step text := state->'plan'->>ctx.step;
BEGIN
    INSERT INTO ledger (instance, step) VALUES (ctx.id, ctx.step);
    PERFORM pg_sleep(coalesce((state->>'sleep')::float8, 0));
    IF next_step IS NULL THEN
        RETURN gd_done(jsonb_build_object('id', ctx.id));
    END IF;
    RETURN gd_next(next_step);
END $$;
SELECT gd_define_fsm('three', 'a', 'default', 1, '{"plan": {"a": "b", "b": "c"}, "sleep": 0}');
SELECT gd_define_step('three', s, 'walk(jsonb, gd.context)'::regprocedure, 5, '100ms', '1s')
  FROM unnest('{a,b,c}'::text[]) s;
SELECT gd_define_fsm('slow', 'only', 'default', 1, '{"plan": {}, "sleep": 1.5}');
SELECT gd_define_step('slow', 'only', 'walk(jsonb, gd.context)'::regprocedure, 5, '100ms', '1s');
};
$node->safe_psql('postgres', $schema);

# "queue:count,..." of the running executors of a database, by gd.workers.
sub executor_plan_query
{
	my ($db) = @_;
	return qq{
SELECT coalesce(string_agg(queue || ':' || n, ',' ORDER BY queue), '')
  FROM (SELECT queue, count(*) AS n FROM gd.workers
         WHERE kind = 'executor' AND database = '$db' GROUP BY queue) s};
}

sub executor_pids
{
	my ($db, $queue) = @_;
	my $out = $node->safe_psql('postgres', qq{
SELECT string_agg(pid::text, ' ' ORDER BY pid) FROM gd.workers
 WHERE kind = 'executor' AND database = '$db' AND queue = '$queue'});
	return split ' ', $out;
}

sub log_size { return -s $node->logfile; }

sub log_count
{
	my ($offset, $re) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my @hits = ($log =~ m/$re/g);
	return scalar @hits;
}

# Wait at most $seconds for $re to appear in the log after $offset.
sub wait_log_within
{
	my ($offset, $re, $seconds) = @_;
	my $deadline = time() + $seconds;
	while (time() < $deadline)
	{
		return 1 if slurp_file($node->logfile, $offset) =~ m/$re/;
		usleep(50_000);
	}
	return 0;
}

sub await_status
{
	my ($db, $id, $timeout) = @_;
	return $node->safe_psql($db, "SELECT status FROM gd_await($id, '$timeout')");
}

my $postmaster_started =
  $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
my $launcher_pid = $node->safe_psql('postgres',
	"SELECT pid FROM gd.workers WHERE kind = 'launcher'");

# ---------------------------------------------------------------------------
# (a) executors per queue follow gen_durable.queues, across a reload
# ---------------------------------------------------------------------------
ok( $node->poll_query_until('postgres', executor_plan_query('postgres'),
		'default:2,mail:1'),
	'(a) gd.workers: 2 executors for default, 1 for mail');
ok( $node->poll_query_until('postgres', q{
SELECT count(*) FROM pg_stat_activity
 WHERE backend_type = 'gen_durable executor' AND datname = 'postgres'}, '3'),
	'(a) pg_stat_activity: 3 gen_durable executor backends');

my @default_before = executor_pids('postgres', 'default');
my @mail_before    = executor_pids('postgres', 'mail');

$node->safe_psql('postgres', q{
ALTER SYSTEM SET gen_durable.queues = 'default:1, mail:2, bulk:2';
SELECT pg_reload_conf();});
ok( $node->poll_query_until('postgres', executor_plan_query('postgres'),
		'bulk:2,default:1,mail:2'),
	'(a) after reload: bulk:2 started, default down to 1, mail up to 2');
ok( $node->poll_query_until('postgres', q{
SELECT count(*) FROM pg_stat_activity
 WHERE backend_type = 'gen_durable executor' AND datname = 'postgres'}, '5'),
	'(a) after reload: 5 executor backends (the stopped one has exited)');

{
	my %now = map { $_ => 1 }
	  (executor_pids('postgres', 'default'), executor_pids('postgres', 'mail'));
	my $kept_default = grep { $now{$_} } @default_before;
	my $kept_mail    = grep { $now{$_} } @mail_before;
	is($kept_default, 1, '(a) one of the two default executors kept running');
	is($kept_mail,    1, '(a) the mail executor kept running');
}
is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'),
	$postmaster_started, '(a) no server restart');
is( $node->safe_psql('postgres',
		"SELECT pid FROM gd.workers WHERE kind = 'launcher'"),
	$launcher_pid, '(a) the launcher was not restarted');

# The new queue is served.
$node->safe_psql('postgres', q{
SELECT gd_define_fsm('bulky', 'a', 'bulk', 1, '{"plan": {"a": "b"}}');
SELECT gd_define_step('bulky', s, 'walk(jsonb, gd.context)'::regprocedure) FROM unnest('{a,b}'::text[]) s;});
my $bulk_id = $node->safe_psql('postgres', "SELECT gd_insert('bulky')");
is(await_status('postgres', $bulk_id, '10s'), 'done',
	'(a) an instance on the newly added queue completes');

# Back to three default executors for the rest of the file.
$node->safe_psql('postgres', q{
ALTER SYSTEM SET gen_durable.queues = 'default:3, mail:1, bulk:2';
SELECT pg_reload_conf();});
ok( $node->poll_query_until('postgres', executor_plan_query('postgres'),
		'bulk:2,default:3,mail:1'),
	'(a) second reload: default:3, mail:1, bulk:2');

# ---------------------------------------------------------------------------
# (b) pg_terminate_backend on an executor in the middle of a step
# ---------------------------------------------------------------------------
my $slow_id = $node->safe_psql('postgres', "SELECT gd_insert('slow')");
ok( $node->poll_query_until('postgres', qq{
SELECT count(*) FROM gd.workers WHERE kind = 'executor' AND instance_id = $slow_id}, '1'),
	'(b) an executor is running the slow step');
my $victim = $node->safe_psql('postgres',
	"SELECT pid FROM gd.workers WHERE kind = 'executor' AND instance_id = $slow_id");
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($victim)"),
	't', "(b) pg_terminate_backend($victim)");
ok( $node->poll_query_until('postgres', qq{
SELECT count(*) FILTER (WHERE pid = $victim) = 0 AND count(*) = 3
  FROM gd.workers WHERE kind = 'executor' AND database = 'postgres' AND queue = 'default'}),
	'(b) the terminated executor is replaced by a new process');
is(await_status('postgres', $slow_id, '15s'), 'done',
	'(b) the interrupted instance completes');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM ledger WHERE instance = $slow_id"),
	'1', '(b) its step took effect exactly once (the killed round rolled back)');
is( $node->safe_psql('postgres',
		"SELECT attempt || ' ' || (error IS NULL) FROM gd.instances WHERE id = $slow_id"),
	'1 true', '(b) the interrupted round counted no attempt and recorded no error');

# ---------------------------------------------------------------------------
# (c) SIGKILL of an executor mid-run: crash-restart, then exactly-once
# ---------------------------------------------------------------------------
my $n = 300;
$node->safe_psql('postgres', 'TRUNCATE ledger');
my $checkpointer = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'");
$node->safe_psql('postgres',
	"SELECT count(gd_insert('three', '{\"sleep\": 0.01}')) FROM generate_series(1, $n)");
ok($node->poll_query_until('postgres', 'SELECT count(*) >= 150 FROM ledger'),
	'(c) the run is under way');
my $busy = $node->safe_psql('postgres', q{
SELECT pid FROM gd.workers WHERE kind = 'executor' AND queue = 'default' AND database = 'postgres'
 ORDER BY instance_id IS NULL, pid LIMIT 1});
my $before_kill = $node->safe_psql('postgres', 'SELECT count(*) FROM ledger');
cmp_ok($before_kill, '<', 3 * $n, "(c) killed mid-run ($before_kill of "
	  . 3 * $n . ' steps committed)');
my $off = log_size();
ok(kill('KILL', $busy), "(c) kill -9 executor $busy");
ok(wait_log_within($off, qr/all server processes terminated; reinitializing/, 20),
	'(c) the postmaster crash-restarted');
ok( $node->poll_query_until('postgres', qq{
SELECT count(*) FILTER (WHERE status = 'done') FROM gd.instances WHERE fsm = 'three'}, $n),
	"(c) all $n instances are done after the crash-restart");
is($node->safe_psql('postgres', 'SELECT count(*) FROM ledger'),
	3 * $n, '(c) the ledger has ' . 3 * $n . ' rows');
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM (SELECT i.id FROM gd.instances i LEFT JOIN ledger l ON l.instance = i.id
                       WHERE i.fsm = 'three' GROUP BY i.id HAVING count(l.*) <> 3) x}),
	'0', '(c) exactly 3 ledger rows per instance');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM gd.instances WHERE fsm = 'three' AND error IS NOT NULL"),
	'0', '(c) no step recorded an error (no duplicate run hit the UNIQUE constraint)');
isnt( $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"),
	$checkpointer, '(c) (it was a real crash-restart: new checkpointer)');
ok( $node->poll_query_until('postgres', executor_plan_query('postgres'),
		'bulk:2,default:3,mail:1'),
	'(c) the executor plan is back after the crash-restart');

# ---------------------------------------------------------------------------
# (d) a served database without the extension
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE noext');
$off = log_size();
$node->safe_psql('postgres', q{
ALTER SYSTEM SET gen_durable.database = 'postgres, noext';
SELECT pg_reload_conf();});
ok( $node->poll_query_until('postgres', executor_plan_query('noext'),
		'bulk:2,default:3,mail:1'),
	'(d) executors start for database noext');
my $missing = qr/gen_durable: database "noext" has no gen_durable extension/;
ok(wait_log_within($off, $missing, 10),
	'(d) the missing extension is logged');
my $noext_pids = $node->safe_psql('postgres', q{
SELECT string_agg(pid::text, ',' ORDER BY pid) FROM gd.workers WHERE database = 'noext'});
my $noext_workers = scalar(split /,/, $noext_pids);
sleep 3;    # the observation window: nothing more may be logged in it
{
	# "[pid]" of every line saying so (the TAP log_line_prefix is '%m [%p] ...').
	my $log = slurp_file($node->logfile, $off);
	my %per_pid;
	$per_pid{$1}++
	  while $log =~ /\[(\d+)\][^\n]*gen_durable: database "noext" has no gen_durable extension/g;
	my $lines = 0;
	$lines += $_ for values %per_pid;
	my @repeated = grep { $per_pid{$_} > 1 } sort keys %per_pid;
	is("@repeated", '', '(d) no worker logged it twice across ~3s');
	cmp_ok($lines, '<=', $noext_workers,
		"(d) logged at most once per waiting worker ($lines lines, $noext_workers workers)");
}
is( $node->safe_psql('postgres', q{
SELECT string_agg(pid::text, ',' ORDER BY pid) FROM gd.workers WHERE database = 'noext'}),
	$noext_pids, '(d) the waiting workers neither exited nor were restarted');

$off = log_size();
$node->safe_psql('noext', $schema);
ok( wait_log_within(
		$off, qr/gen_durable: extension found in database "noext"/, 3),
	'(d) CREATE EXTENSION wakes the waiting workers at once: "extension found" logged < 3s after (not at the 10s recheck)');
my $noext_id = $node->safe_psql('noext', "SELECT gd_insert('three')");
is(await_status('noext', $noext_id, '10s'), 'done',
	'(d) an instance inserted in noext completes');
is($node->safe_psql('noext', "SELECT count(*) FROM ledger WHERE instance = $noext_id"),
	'3', '(d) with its 3 ledger rows');

# ---------------------------------------------------------------------------
# (e) a listed database that does not exist: the launcher says so once, starts
# no worker for it (no slot used, nothing failing to connect), and starts
# them when it is created; dropped again, the same
# ---------------------------------------------------------------------------
$checkpointer = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'");
$launcher_pid = $node->safe_psql('postgres',
	"SELECT pid FROM gd.workers WHERE kind = 'launcher'");
my $per_db = $node->safe_psql('postgres',
	"SELECT count(*) FROM gd.workers WHERE database = 'postgres'");
my $ghost_workers = "SELECT count(*) FROM gd.workers WHERE database = 'ghost_db'";
my $ghost_missing = qr/gen_durable: database "ghost_db" in gen_durable.database does not exist; its workers start when it is created/;
$off = log_size();
$node->safe_psql('postgres', q{
ALTER SYSTEM SET gen_durable.database = 'postgres, noext, ghost_db';
SELECT pg_reload_conf();});
ok(wait_log_within($off, $ghost_missing, 10), '(e) the launcher says ghost_db does not exist');
my $t0 = time();
# Work keeps flowing in the real databases meanwhile.
my $pg_id = $node->safe_psql('postgres', "SELECT gd_insert('three')");
my $ne_id = $node->safe_psql('noext',    "SELECT gd_insert('three')");
is(await_status('postgres', $pg_id, '10s'), 'done',
	'(e) postgres is still served');
is(await_status('noext', $ne_id, '10s'), 'done', '(e) noext is still served');
my $left = 7 - (time() - $t0);
usleep(int($left * 1_000_000)) if $left > 0;    # observe ~7s: past the launcher's 5 s look
is($node->safe_psql('postgres', $ghost_workers), '0', '(e) no worker for ghost_db');
is(log_count($off, qr/database "ghost_db" does not exist\n/), 0, '(e) no worker tried to connect to it');
is(log_count($off, $ghost_missing), 1, '(e) said once');
is($node->safe_psql('postgres', 'SELECT 1'), '1', '(e) the server is up');
is( $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"),
	$checkpointer, '(e) same checkpointer (no crash-restart)');
is( $node->safe_psql('postgres',
		"SELECT pid FROM gd.workers WHERE kind = 'launcher'"),
	$launcher_pid, '(e) same launcher');

# Created: its workers start at the commit (they wait for the extension there).
$off = log_size();
my $created = time();
$node->safe_psql('postgres', 'CREATE DATABASE ghost_db');
ok($node->poll_query_until('postgres', $ghost_workers, $per_db), "(e) its $per_db workers start once it is created");
cmp_ok(time() - $created, '<', 4, '(e) at once: CREATE DATABASE woke the launcher');
ok(wait_log_within($off, qr/gen_durable: database "ghost_db" exists now; starting its workers/, 5),
	'(e) the launcher says so');
$node->safe_psql('ghost_db', $schema);
my $ghost_id = $node->safe_psql('ghost_db', "SELECT gd_insert('three')");
is(await_status('ghost_db', $ghost_id, '10s'), 'done', '(e) ghost_db is served');

# Dropped: its workers end with it and are not started again.
$off = log_size();
$node->safe_psql('postgres', 'DROP DATABASE ghost_db WITH (FORCE)');
ok(wait_log_within($off, $ghost_missing, 10), '(e) dropped: the launcher says so');
ok($node->poll_query_until('postgres', $ghost_workers, '0'), '(e) no worker for the dropped database');
sleep 6;
is($node->safe_psql('postgres', $ghost_workers), '0', '(e) none started again');
is(log_count($off, qr/database "ghost_db" does not exist\n/), 0, '(e) none tried to connect to it');
is( $node->safe_psql('postgres',
		"SELECT pid FROM gd.workers WHERE kind = 'launcher'"),
	$launcher_pid, '(e) same launcher');

$node->stop;
done_testing();
