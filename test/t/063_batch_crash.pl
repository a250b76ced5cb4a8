# Crashes in the middle of in-database batch steps (batch => 8): 400
# instances of a two-step FSM whose steps are both batch steps, run by two
# executors, while
#   1. an executor inside a batch call is SIGKILLed (a crash-restart), and
#   2. later the server is stopped with `pg_ctl stop -m immediate` and started.
# The batch handler writes one ledger row per instance of its call (PRIMARY
# KEY (instance, step): a second run of a committed step would raise), then
# waits at a gate (a committed flag, as in 030_crash_load.pl), so each kill
# lands on batch calls in flight.  Afterwards every instance is done, the
# ledger holds exactly one row per (instance, step), and the attempts are
# counted as docs/guarantees.md says of batches: the crash in the call counts
# an attempt for its first instance only (the crash note names one step),
# the other instances of that call, the other executor's call and the calls
# an immediate stop interrupted count none.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 40;

my $n     = 400;
my $total = $n * 2;

my $node = GdTest::start_node(
	'batch_crash',
	'gen_durable.queues'     => 'default:2',
	'gen_durable.batch_size' => 16,
	restart_after_crash      => 'on',
);

$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (
    instance bigint NOT NULL,
    step     text   NOT NULL,
    attempt  int    NOT NULL,
    call_size int   NOT NULL,   -- how many instances the call that wrote it had
    PRIMARY KEY (instance, step));
CREATE TABLE gate (open boolean NOT NULL);
INSERT INTO gate VALUES (false);
CREATE FUNCTION walk_batch(states jsonb[], ctxs gd.context[]) RETURNS gd.outcome[]
LANGUAGE plpgsql AS $$
DECLARE
    outcomes gd.outcome[] := '{}';
BEGIN
    -- In the server log, which outlives a crash: the instances of each call.
    RAISE LOG 'walk_batch call: %', (SELECT array_agg(id) FROM unnest(ctxs));
    FOR i IN 1 .. cardinality(ctxs) LOOP
        INSERT INTO ledger VALUES (ctxs[i].id, ctxs[i].step, ctxs[i].attempt, cardinality(ctxs));
        outcomes := outcomes || CASE ctxs[i].step WHEN 'a' THEN gd_next('b', states[i]) ELSE gd_done() END;
    END LOOP;
    PERFORM pg_sleep(0.01);
    WHILE NOT (SELECT open FROM gate) LOOP
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN outcomes;
END $$;
SELECT gd_define_fsm('batched', 'a', 'default', steps => $${
    "a": {"handler": "public.walk_batch(jsonb[], gd.context[])", "batch": 8, "max_attempts": 5, "backoff": "100ms"},
    "b": {"handler": "public.walk_batch(jsonb[], gd.context[])", "batch": 8, "max_attempts": 5, "backoff": "100ms"}
}$$);
});

sub committed { return $node->safe_psql('postgres', 'SELECT count(*) FROM ledger'); }

sub set_gate { GdTest::gate_set($node, $_[0]) }
sub all_held { GdTest::gate_all_held($node, 2, 'batch calls', $_[0]) }
sub run_until { GdTest::gate_run_until($node, $_[0], 50_000) }

$node->safe_psql('postgres', "SELECT count(gd_insert('batched')) FROM generate_series(1, $n)");
all_held('start');

# ---- 1. SIGKILL an executor inside a batch call
run_until(int($total * 0.2));
all_held('before the kill');
my $at_kill = committed();
cmp_ok($at_kill, '<', $total, "$at_kill of $total steps committed before the kill");
# gd.workers names the first instance of the batch call in flight, as its crash note does.
my ($victim, $victim_instance, $victim_step) = split /\|/, $node->safe_psql('postgres', q{
SELECT w.pid, w.instance_id, i.step FROM gd.workers w JOIN gd.instances i ON i.id = w.instance_id
 WHERE w.kind = 'executor' AND w.instance_id IS NOT NULL ORDER BY w.pid LIMIT 1});
my $off = -s $node->logfile;
# The instances of that call, as its latest start logged them.
my @killed_call = map { [ split /,/ ] } slurp_file($node->logfile) =~ /walk_batch call: \{($victim_instance,[\d,]+)\}/g;
my @companions = @{ $killed_call[-1] // [$victim_instance] }[1 .. 7];
is(scalar(grep { defined } @companions), 7, 'the call in flight there holds 8 instances');
ok(kill('KILL', $victim), "kill -9 executor $victim, in a batch call whose first instance is $victim_instance");
ok(GdTest::poll_through_restart($node, 'SELECT true', 't'), 'the server accepts connections again');
ok($node->log_contains(qr/all server processes terminated; reinitializing/, $off),
	'the postmaster crash-restarted every backend');
all_held('after the crash-restart');
is(committed(), $at_kill, 'the batch calls in flight at the crash left nothing behind');

# ---- 2. pg_ctl stop -m immediate while batch calls run, then start
run_until($at_kill + int($total * 0.2));
all_held('before the immediate stop');
my $at_stop = committed();
cmp_ok($at_stop, '<', $total, "$at_stop of $total steps committed before the immediate stop");
$node->stop('immediate');
$off = -s $node->logfile;
$node->start;
ok($node->log_contains(qr/database system was interrupted|was not properly shut down; automatic recovery in progress/, $off),
	'the restart ran crash recovery');
all_held('after the restart');
is(committed(), $at_stop, 'the batch calls in flight at the stop left nothing behind');

set_gate('true');
ok($node->poll_query_until('postgres', "SELECT count(*) FROM gd.instances WHERE status = 'done'", $n),
	"all $n instances are done")
  or diag $node->safe_psql('postgres', 'SELECT status, step, count(*) FROM gd.instances GROUP BY 1, 2 ORDER BY 1, 2');

# ---- nothing lost, nothing twice, attempts counted as documented
is($node->safe_psql('postgres', 'SELECT count(*) FROM gd.instances'), $n, "still exactly $n instances");
is(committed(), $total, "the ledger holds $total rows");
is($node->safe_psql('postgres', q{
SELECT count(*) FROM gd.instances i
 WHERE (SELECT string_agg(l.step, ',' ORDER BY l.step) FROM ledger l WHERE l.instance = i.id) IS DISTINCT FROM 'a,b'}),
	'0', 'every instance has exactly one ledger row per step');
is($node->safe_psql('postgres', 'SELECT max(call_size) FROM ledger'), '8', 'the steps ran in batches of up to 8');
# The gate holds calls far past batch_time: rounds paced to it keep a whole call (not one instance each).
is($node->safe_psql('postgres', 'SELECT count(*) FILTER (WHERE call_size = 8) >= 0.8 * count(*) FROM ledger'), 't',
	'slow calls stay batches: most steps ran in calls of 8');
is($node->safe_psql('postgres', q{SELECT string_agg(instance || ' ' || step || ' attempt ' || attempt, ',') FROM ledger WHERE attempt <> 1}),
	"$victim_instance $victim_step attempt 2",
	'only the first instance of the killed call counted an attempt; its companions, the other call and those of the immediate stop none');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM gd.instances WHERE status <> 'done' OR step <> 'b' OR error IS NOT NULL OR lease_token IS NOT NULL}),
	'0', 'every instance: done at step b, no error left, no lease');
is($node->safe_psql('postgres', 'SELECT count(*) FROM ledger WHERE attempt = 1 AND instance IN (' .
		join(',', grep { defined } @companions) . ") AND step = '$victim_step'"),
	'7', "the killed call's 7 other instances ran their step again as attempt 1");
ok(!$node->log_contains(qr/PANIC|TRAP:|terminated by signal (6|11)/),
	'no PANIC, assertion failure or segfault in the log');

$node->stop;
done_testing();
