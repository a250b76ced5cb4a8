# Crash under load: 5,000 instances of a 3-step in-database FSM, run by the
# background executors of a queue, while
#   1. an executor that is inside a step is SIGKILLed (the postmaster then
#      terminates every backend and reinitializes: a crash-restart), and
#   2. later the whole server is stopped with `pg_ctl stop -m immediate` (no
#      shutdown checkpoint: WAL recovery at the next start) and started again.
# Afterwards every instance is done, and the ledger the handlers write (a
# PRIMARY KEY on (instance, step), in the step's own transaction) holds exactly
# one row per (instance, step): nothing lost, nothing twice.  Each ledger row
# also records the state the step saw (state.n, incremented by every step's
# transition), so a transition committed without its effect, or an effect
# committed without its transition, would show as a gap or a mismatch.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 40;

my $n     = 5000;
my $steps = 3;
my $total = $n * $steps;

my $node = PostgreSQL::Test::Cluster->new('crash_load');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'gen_durable'
gen_durable.database = 'postgres'
gen_durable.queues = 'default:3'
gen_durable.poll_interval = '200ms'
gen_durable.batch_size = 8
max_worker_processes = 16
restart_after_crash = on
fsync = off
lc_messages = 'C'
});
$node->start;

$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (
    instance bigint NOT NULL,
    step     text   NOT NULL,
    seen_n   int    NOT NULL,   -- state.n as the step saw it
    attempt  int    NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (instance, step));
CREATE FUNCTION walk(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
DECLARE
    n int := (state->>'n')::int;
BEGIN
    INSERT INTO ledger (instance, step, seen_n, attempt) VALUES (ctx.id, ctx.step, n, ctx.attempt);
    PERFORM pg_sleep((state->>'sleep')::float8);
    IF ctx.step = 'c' THEN
        RETURN gd_done(jsonb_build_object('n', n + 1));
    END IF;
    RETURN gd_next(CASE ctx.step WHEN 'a' THEN 'b' ELSE 'c' END, state || jsonb_build_object('n', n + 1));
END $$;
SELECT gd_define_fsm('three', 'a', 'default', 1, '{"n": 0, "sleep": 0.001}');
SELECT gd_define_step('three', s, 'walk(jsonb, gd.context)'::regprocedure, 5, '100ms', '1s')
  FROM unnest('{a,b,c}'::text[]) s;
});

# The ledger's row count; -1 while the server does not accept connections
# (crash recovery in progress).
sub ledger_count
{
	my ($rc, $out) = $node->psql('postgres', 'SELECT count(*) FROM ledger');
	return $rc == 0 ? $out : -1;
}

sub log_size { return -s $node->logfile; }

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

# Poll (every 20 ms) until the ledger holds at least $rows rows; returns the count.
sub wait_ledger_at_least
{
	my ($rows) = @_;
	my $deadline = time() + 30;
	my $count = 0;
	while (time() < $deadline)
	{
		$count = ledger_count();
		return $count if $count >= $rows;
		usleep(20_000);
	}
	return $count;
}

sub executors_busy
{
	return $node->safe_psql('postgres', q{
SELECT count(*) FROM gd.workers WHERE kind = 'executor' AND instance_id IS NOT NULL});
}

my $t_start = time();
$node->safe_psql('postgres',
	"SELECT count(gd_insert('three')) FROM generate_series(1, $n)");
note(sprintf('inserted %d instances in %.1fs', $n, time() - $t_start));

# ---------------------------------------------------------------------------
# 1. SIGKILL an executor in the middle of a step
# ---------------------------------------------------------------------------
my $at_kill = wait_ledger_at_least(int($total * 0.15));
my $victim = $node->safe_psql('postgres', q{
SELECT pid FROM gd.workers WHERE kind = 'executor' AND instance_id IS NOT NULL ORDER BY pid LIMIT 1});
$victim ||= $node->safe_psql('postgres',
	"SELECT pid FROM gd.workers WHERE kind = 'executor' ORDER BY pid LIMIT 1");
my $off = log_size();
ok(kill('KILL', $victim), "kill -9 executor $victim with $at_kill of $total steps committed");
cmp_ok($at_kill, '<', $total, '... while the run was in flight');
ok(wait_log_within($off, qr/all server processes terminated; reinitializing/, 20),
	'the postmaster crash-restarted every backend');

# The engine comes back by itself and goes on.
my $after_crash = wait_ledger_at_least($at_kill + int($total * 0.2));
cmp_ok($after_crash, '>', $at_kill,
	"work resumed after the crash-restart ($after_crash steps committed)");

# ---------------------------------------------------------------------------
# 2. pg_ctl stop -m immediate while steps run, then start
# ---------------------------------------------------------------------------
my $busy = executors_busy();
my $at_stop = ledger_count();
$node->stop('immediate');
cmp_ok($at_stop, '<', $total,
	"immediate stop with $at_stop of $total steps committed ($busy executors inside a step)");
$off = log_size();
$node->start;
ok($node->log_contains(qr/database system was interrupted|was not properly shut down; automatic recovery in progress/, $off),
	'the restart ran crash recovery');

ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM gd.instances WHERE status = 'done'", $n),
	"all $n instances are done")
  or diag $node->safe_psql('postgres',
	'SELECT status, step, count(*) FROM gd.instances GROUP BY 1, 2 ORDER BY 1, 2');
note(sprintf('whole run: %.1fs', time() - $t_start));

# ---------------------------------------------------------------------------
# Nothing lost, nothing twice
# ---------------------------------------------------------------------------
is($node->safe_psql('postgres', 'SELECT count(*) FROM gd.instances'),
	$n, "still exactly $n instances");
is(ledger_count(), $total, "the ledger holds $total rows");
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM gd.instances i
 WHERE (SELECT string_agg(l.step || l.seen_n, ',' ORDER BY l.step) FROM ledger l WHERE l.instance = i.id)
       IS DISTINCT FROM 'a0,b1,c2'}),
	'0',
	'every instance has exactly the rows a, b, c, each seeing the state the previous transition committed');
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM gd.instances
 WHERE status <> 'done' OR step <> 'c' OR attempt <> 1 OR error IS NOT NULL
    OR result <> '{"n": 3}' OR (state->>'n')::int <> 2 OR finished_at IS NULL}),
	'0',
	'every instance: done at step c, result n = 3, attempt 1, no error (no rerun hit the primary key)');
is($node->safe_psql('postgres', 'SELECT count(*) FROM ledger WHERE attempt <> 1'),
	'0', 'no step needed a second attempt');
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM gd.instances WHERE lease_token IS NOT NULL OR wait_names IS NOT NULL OR resume IS NOT NULL}),
	'0', 'no leftover lease, wait or resume data');
ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM gd.workers WHERE kind = 'executor'", '3'),
	'the three executors are back');
ok(!$node->log_contains(qr/PANIC|TRAP:|terminated by signal (6|11)/),
	'no PANIC, assertion failure or segfault in the log');

$node->stop;
done_testing();
