# Crash under load: 5,000 instances of a 3-step in-database FSM, run by the
# background executors of a queue (the step a killed executor was in counts
# an attempt: it may have been the step's doing), while
#   1. an executor that is inside a step is SIGKILLed (the postmaster then
#      terminates every backend and reinitializes: a crash-restart), and
#   2. later the whole server is stopped with `pg_ctl stop -m immediate` (no
#      shutdown checkpoint: WAL recovery at the next start) and started again.
# The kills are timed with a gate: a committed flag every handler checks
# after writing its ledger row, spinning while it is closed.  With the gate
# closed every executor sits inside a step with uncommitted writes, so each
# kill lands on rounds in flight, whatever the machine's speed; and as the
# flag is a table row, it stays closed across the crash, so the test can see
# that the rounds in flight left nothing behind (the committed count is the
# same after the restart).
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
use GdTest;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 40;

my $n     = 5000;
my $steps = 3;
my $total = $n * $steps;

my $node = GdTest::start_node(
	'crash_load',
	'gen_durable.queues'     => 'default:3',
	'gen_durable.batch_size' => 16,
	restart_after_crash      => 'on',
);

$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (
    instance bigint NOT NULL,
    step     text   NOT NULL,
    seen_n   int    NOT NULL,   -- state.n as the step saw it
    attempt  int    NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (instance, step));
CREATE TABLE gate (open boolean NOT NULL);
INSERT INTO gate VALUES (false);
CREATE FUNCTION walk(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
DECLARE
    n int := (state->>'n')::int;
BEGIN
    INSERT INTO ledger (instance, step, seen_n, attempt) VALUES (ctx.id, ctx.step, n, ctx.attempt);
    WHILE NOT (SELECT open FROM gate) LOOP
        PERFORM pg_sleep(0.01);
    END LOOP;
    IF ctx.step = 'c' THEN
        RETURN gd_done(jsonb_build_object('n', n + 1));
    END IF;
    RETURN gd_next(CASE ctx.step WHEN 'a' THEN 'b' ELSE 'c' END, state || jsonb_build_object('n', n + 1));
END $$;
SELECT gd_define_fsm('three', 'a', 'default', 1, '{"n": 0}');
SELECT gd_define_step('three', s, 'walk(jsonb, gd.context)'::regprocedure, 5, '100ms', '1s')
  FROM unnest('{a,b,c}'::text[]) s;
});

sub committed { return $node->safe_psql('postgres', 'SELECT count(*) FROM ledger'); }

sub log_size { return -s $node->logfile; }

sub set_gate { GdTest::gate_set($node, $_[0]) }
sub all_held { GdTest::gate_all_held($node, 3, 'steps', $_[0]) }
sub run_until { GdTest::gate_run_until($node, $_[0], 10_000) }   # short: a pulse runs whole chains

my $t_start = time();
$node->safe_psql('postgres', "SELECT count(gd_insert('three')) FROM generate_series(1, $n)");
note(sprintf('inserted %d instances in %.1fs', $n, time() - $t_start));
all_held('start');

# ---------------------------------------------------------------------------
# 1. SIGKILL an executor in the middle of a step
# ---------------------------------------------------------------------------
run_until(int($total * 0.1));
all_held('before the kill');
my $at_kill = committed();
cmp_ok($at_kill, '<', $total, "$at_kill of $total steps committed before the kill");
my ($victim, $victim_instance) = split /\|/, $node->safe_psql('postgres',
	"SELECT pid, instance_id FROM gd.workers WHERE kind = 'executor' AND instance_id IS NOT NULL ORDER BY pid LIMIT 1");
my $off = log_size();
ok(kill('KILL', $victim), "kill -9 executor $victim, inside a step");
ok(GdTest::poll_through_restart($node, 'SELECT true', 't'), 'the server accepts connections again');
ok($node->log_contains(qr/all server processes terminated; reinitializing/, $off),
	'the postmaster crash-restarted every backend');
all_held('after the crash-restart');
is(committed(), $at_kill, 'the rounds in flight at the crash left nothing behind');

# ---------------------------------------------------------------------------
# 2. pg_ctl stop -m immediate while steps run, then start
# ---------------------------------------------------------------------------
run_until($at_kill + int($total * 0.2));
all_held('before the immediate stop');
my $at_stop = committed();
cmp_ok($at_stop, '<', $total, "$at_stop of $total steps committed before the immediate stop");
$node->stop('immediate');
$off = log_size();
$node->start;
ok($node->log_contains(qr/database system was interrupted|was not properly shut down; automatic recovery in progress/, $off),
	'the restart ran crash recovery');
all_held('after the restart');
is(committed(), $at_stop, 'the rounds in flight at the stop left nothing behind');

set_gate('true');
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
is(committed(), $total, "the ledger holds $total rows");
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM gd.instances i
 WHERE (SELECT string_agg(l.step || l.seen_n, ',' ORDER BY l.step) FROM ledger l WHERE l.instance = i.id)
       IS DISTINCT FROM 'a0,b1,c2'}),
	'0',
	'every instance has exactly the rows a, b, c, each seeing the state the previous transition committed');
is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM gd.instances
 WHERE status <> 'done' OR step <> 'c' OR (attempt <> 1 AND id <> $victim_instance) OR error IS NOT NULL
    OR result <> '{"n": 3}' OR (state->>'n')::int <> 2 OR finished_at IS NULL}),
	'0',
	'every instance: done at step c, result n = 3, attempt 1, no error (no rerun hit the primary key)');
# The step the SIGKILLed executor was in counts an attempt (it could have been
# the step's doing: crashed_steps.cpp); the steps of the rounds an immediate
# stop interrupted, and the other steps of the killed round, count none.
is($node->safe_psql('postgres', q{SELECT string_agg(instance || ' attempt ' || attempt, ',') FROM ledger WHERE attempt <> 1}),
	"$victim_instance attempt 2", 'only the step the killed executor was in needed a second attempt');
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM gd.instances WHERE lease_token IS NOT NULL OR wait_names IS NOT NULL OR resume IS NOT NULL}),
	'0', 'no leftover lease, wait or resume data');
ok(!$node->log_contains(qr/PANIC|TRAP:|terminated by signal (6|11)/),
	'no PANIC, assertion failure or segfault in the log');

$node->stop;
done_testing();
