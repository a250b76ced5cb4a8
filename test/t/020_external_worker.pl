# The Python client's external worker (clients/python) against an FSM that
# mixes in-database and external steps:
#   prepare (SQL) -> ext (external, Python) -> finish (SQL)
# - an idle worker, its claim waiting in the server, is woken at the commit
#   of new work, not at the end of its (30 s) wait;
# - SIGKILL mid-step: the claim stays until its lease expires, the reaper
#   reclaims it, another worker runs the step again, and every instance
#   finishes exactly once (the dead worker's attempt is counted, its outcome
#   never applied);
# - SIGTERM: the worker finishes the step in hand, hands back the rest of its
#   batch at once (no lease waited out) and exits 0;
# - work scheduled for later is announced by the reaper when it comes due.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use IPC::Run;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 30;

my @worker_command = GdTest::external_worker();

my $lease = 1.5;    # seconds: a dead worker's claim comes back this soon

my $node = GdTest::start_node(
	'external',
	'gen_durable.queues'          => 'default:2',
	'gen_durable.reaper_interval' => '200ms',
);

$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
-- In-database steps: one row per (instance, step), in the step's transaction.
CREATE TABLE ledger (instance bigint, step text, at timestamptz DEFAULT clock_timestamp());
-- External runs, written by the Python handler on its own connection.
CREATE TABLE external_runs (instance bigint, attempt int, pid int, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION mix_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger (instance, step) VALUES (ctx.id, ctx.step);
    IF ctx.step = 'prepare' THEN
        RETURN gd_next('ext', state || '{"prepared": true}');
    END IF;
    RETURN gd_done(state);
END $$;
SELECT gd_define_fsm('mix', initial => 'prepare', queue => 'default');
SELECT gd_define_step('mix', 'prepare', 'mix_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('mix', 'ext', NULL, max_attempts => 3);
SELECT gd_define_step('mix', 'finish', 'mix_step(jsonb, gd.context)'::regprocedure);
});

my $handlers = $node->basedir . '/mix_handlers.py';
PostgreSQL::Test::Utils::append_to_file($handlers, q{
import os, time
import psycopg
from gen_durable import next_step

def ext(state, ctx):
    # On a connection of its own: the run is recorded even when the step's outcome is never applied.
    with psycopg.connect(os.environ["GD_TEST_DSN"], autocommit=True) as conn:
        conn.execute("INSERT INTO external_runs (instance, attempt, pid) VALUES (%s, %s, %s)",
                     [ctx.id, ctx.attempt, os.getpid()])
    time.sleep(float(state.get("sleep", 0)))
    return next_step("finish", {**state, "external_pid": os.getpid(), "external_attempt": ctx.attempt})

HANDLERS = {("mix", "ext"): ext}
});

$ENV{GD_TEST_DSN} = $node->connstr('postgres');

# Start a worker; returns (IPC::Run handle, pid, name).
my %output;
sub start_worker
{
	my ($name, $batch) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			@worker_command, '--dsn', $node->connstr('postgres'),
			'--queue', 'default', '--handlers', $handlers, '--name', $name,
			'--batch', $batch, '--lease', $lease, '--wait', '30', '--verbose'
		],
		'>', \$out, '2>', \$err);
	$output{$name} = \$err;
	my $pid = $h->{KIDS}[0]{PID};
	ok($node->poll_query_until('postgres', qq{
SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = 'gd worker $name' AND state = 'active'
   AND query LIKE '%gd_claim%'}),
		"worker $name: its claim waits in the server");
	return ($h, $pid);
}

sub count_ids
{
	my @ids = split /,/, shift;
	return scalar @ids;
}

sub insert_instances
{
	my ($n, $options) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(gd_insert('mix', $options)::text, ',' ORDER BY g) FROM generate_series(1, $n) g");
}

sub all_done
{
	my ($ids, $label) = @_;
	my $n = count_ids($ids);
	ok(GdTest::poll_done($node, $ids, $n),
		"$label: all $n instances done")
	  or diag $node->safe_psql('postgres',
		"SELECT id, status, step, attempt, lease_owner, error FROM gd.instances WHERE id IN ($ids)");
}

# Every in-database step of these instances ran exactly once.
sub ledger_exactly_once
{
	my ($ids, $steps, $label) = @_;
	is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM (SELECT instance, step FROM ledger WHERE instance IN ($ids)
                      GROUP BY 1, 2 HAVING count(*) = 1) x}),
		count_ids($ids) * $steps,
		"$label: each in-database step's effect exists exactly once");
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM ledger WHERE instance IN ($ids)"),
		count_ids($ids) * $steps, "$label: and nothing more");
}

# ---------------------------------------------------------------------------
# An idle worker (its claim waiting up to 30 s) picks up new work at once.
# ---------------------------------------------------------------------------
my ($wa, $a_pid) = start_worker('A', 1);
my $t0 = time();
my $ids = insert_instances(1, q{'{"sleep": 0}'});
all_done($ids, 'notify');
my $elapsed = time() - $t0;
cmp_ok($elapsed, '<', 10, sprintf('notify: done in %.2fs, well before its 30 s wait ends', $elapsed));
ledger_exactly_once($ids, 2, 'notify');

# ---------------------------------------------------------------------------
# SIGKILL mid-step.
# ---------------------------------------------------------------------------
$ids = insert_instances(3, q{'{"sleep": 1.5}'});
ok($node->poll_query_until('postgres', qq{
SELECT count(*) FROM gd.instances i JOIN external_runs r ON r.instance = i.id AND r.pid = $a_pid
 WHERE i.id IN ($ids) AND i.status = 'executing' AND i.lease_owner = 'A'}, 1),
	'kill: worker A is inside an external step');
my $killed = $node->safe_psql('postgres',
	"SELECT id FROM gd.instances WHERE id IN ($ids) AND status = 'executing' AND lease_owner = 'A'");
$wa->signal('KILL');
$wa->finish;
my $killed_at = time();
is($node->safe_psql('postgres', "SELECT status || ' ' || lease_owner FROM gd.instances WHERE id = $killed"),
	'executing A', 'kill: the dead worker\'s claim holds until its lease expires');

ok($node->poll_query_until('postgres',
		"SELECT status <> 'executing' FROM gd.instances WHERE id = $killed"),
	'kill: the reaper reclaims the dead worker\'s step');
my $reclaimed_after = time() - $killed_at;
cmp_ok($reclaimed_after, '<', $lease + 3,
	sprintf('kill: ... %.2fs after the kill (lease %.1fs, heartbeats every %.1fs)',
		$reclaimed_after, $lease, $lease / 3));
is($node->safe_psql('postgres', "SELECT status || ' ' || attempt FROM gd.instances WHERE id = $killed"),
	'runnable 2', 'kill: runnable again, the attempt counted');

my ($wb, $b_pid) = start_worker('B', 1);
all_done($ids, 'kill');
ledger_exactly_once($ids, 2, 'kill');
is( $node->safe_psql('postgres', qq{
SELECT string_agg(attempt || ':' || CASE pid WHEN $a_pid THEN 'A' WHEN $b_pid THEN 'B' END, ' ' ORDER BY attempt)
  FROM external_runs WHERE instance = $killed}),
	'1:A 2:B', 'kill: the killed step ran again as attempt 2, by worker B');
is( $node->safe_psql('postgres', qq{
SELECT attempt || ' ' || (state->>'external_attempt') || ' ' || (state->>'external_pid' = '$b_pid')
  FROM gd.instances i WHERE id = $killed}),
	'1 2 true', 'kill: only worker B\'s outcome was applied');
is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM external_runs WHERE instance IN ($ids) AND instance <> $killed GROUP BY instance HAVING count(*) > 1}),
	'', 'kill: every other external step ran once');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM gd.instances WHERE lease_token IS NOT NULL OR status = 'executing'"),
	'0', 'kill: no claim is left');

# ---------------------------------------------------------------------------
# SIGTERM drains: the step in hand completes, the rest of the batch is released.
# ---------------------------------------------------------------------------
$wb->signal('TERM');
$wb->finish;
is($wb->result(0), 0, 'drain: an idle worker exits 0 on SIGTERM');

my ($wc, $c_pid) = start_worker('C', 5);
$ids = insert_instances(5, q{'{"sleep": 1}', step => 'ext'});
ok($node->poll_query_until('postgres', qq{
SELECT count(*) = 5 AND (SELECT count(*) FROM external_runs WHERE pid = $c_pid) = 1
  FROM gd.instances WHERE id IN ($ids) AND status = 'executing' AND lease_owner = 'C'}),
	'drain: worker C claimed a batch of 5 and is inside the first step');
$t0 = time();
$wc->signal('TERM');
$wc->finish;
$elapsed = time() - $t0;
is($wc->result(0), 0, 'drain: worker C exits 0 on SIGTERM');
cmp_ok($elapsed, '<', 3, sprintf('drain: ... after finishing its step (%.2fs)', $elapsed));
is( $node->safe_psql('postgres', qq{
SELECT string_agg(status || '/' || attempt || '/' || coalesce(lease_owner, '-'), ' ' ORDER BY status)
  FROM (SELECT CASE WHEN status = 'done' OR step = 'finish' THEN 'completed' ELSE status END AS status,
               attempt, lease_owner FROM gd.instances WHERE id IN ($ids)) x}),
	'completed/1/- runnable/1/- runnable/1/- runnable/1/- runnable/1/-',
	'drain: one step completed, four handed back at once, no attempt counted');

# ---------------------------------------------------------------------------
# Work scheduled for later is announced when it comes due.
# ---------------------------------------------------------------------------
my ($wd, $d_pid) = start_worker('D', 10);
all_done($ids, 'drain');
is($node->safe_psql('postgres', "SELECT count(*) FROM external_runs WHERE instance IN ($ids)"),
	'5', 'drain: each external step of the batch ran once');
$t0 = time();
$ids = insert_instances(1, q{'{"sleep": 0}', step => 'ext', schedule_in => '1 second'});
all_done($ids, 'scheduled');
$elapsed = time() - $t0;
ok($elapsed >= 1 && $elapsed < 10,
	sprintf('scheduled: done %.2fs after insert (due after 1 s; the wait is 30 s)', $elapsed));

$wd->signal('TERM');
$wd->finish;
is($wd->result(0), 0, 'worker D exits 0');
unless (Test::More->builder->is_passing)
{
	diag("worker $_ stderr:\n" . ${ $output{$_} }) for sort keys %output;
}

$node->stop;
done_testing();
