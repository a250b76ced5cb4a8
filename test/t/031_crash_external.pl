# Crash under load with external steps:
#   prepare (in-database) -> ext (external, the Python client's worker) -> finish (in-database)
# with a short lease (1.5 s).
# External steps are held at a gate (a file the handler waits for) while the
# test kills things, so every kill lands on claims in flight.
#   - a worker is frozen (SIGSTOP) past its lease, then thawed: its claims
#     were reclaimed meanwhile and its outcomes must not be applied;
#   - a worker is SIGKILLed while it holds claims;
#   - an executor is SIGKILLed (postmaster crash-restart: every worker loses
#     its connection and exits; a supervisor loop here restarts them, as
#     systemd would);
#   - the server is stopped with `-m immediate` and started again.
# Afterwards every instance is done; each external step's effect (a line
# appended to a file, outside the database) was applied at least once; the
# outcome committed for it is exactly one, and one whose effect happened; the
# in-database steps' ledger has exactly one row per (instance, step).
# First, deterministically, a worker that completes after its lease was
# reclaimed gets false, its outcome is dropped and counted as outcome_stale.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use POSIX qw(WNOHANG);
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 30;

my @worker_command = GdTest::external_worker();

my $n       = 600;
my $lease   = 1.5;    # seconds
my $workers = 3;

my $node = GdTest::start_node(
	'crash_external',
	'gen_durable.queues'          => 'default:2',
	'gen_durable.reaper_interval' => '200ms',
	'gen_durable.lease'           => "${lease}s",
	restart_after_crash           => 'on',
);

$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
-- In-database steps; 'finish' also records which external run's outcome it got.
CREATE TABLE ledger (
    instance    bigint NOT NULL,
    step        text   NOT NULL,
    ext_worker  text,
    ext_attempt int,
    PRIMARY KEY (instance, step));
CREATE FUNCTION mix_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger VALUES (ctx.id, ctx.step, state->'ext'->>'worker', (state->'ext'->>'attempt')::int);
    IF ctx.step = 'prepare' THEN
        RETURN gd_next('ext');
    END IF;
    RETURN gd_done(state->'ext');
END $$;
SELECT gd_define_fsm('mix', initial => 'prepare', queue => 'default');
SELECT gd_define_step('mix', 'prepare', 'mix_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_step('mix', 'ext', NULL, max_attempts => 20, backoff => '0s');
SELECT gd_define_step('mix', 'finish', 'mix_step(jsonb, gd.context)'::regprocedure);
-- Probes claimed by hand (queue probe has no worker).
SELECT gd_define_fsm('probe', initial => 'ext', queue => 'probe');
SELECT gd_define_step('probe', 'ext', NULL, max_attempts => 5);
});

# ---------------------------------------------------------------------------
# A stale completion, step by step (the test plays two workers over SQL)
# ---------------------------------------------------------------------------
sub stale_count
{
	return $node->safe_psql('postgres',
		"SELECT coalesce(sum(count), 0) FROM gd.stats WHERE event = 'outcome_stale'");
}

{
	# Two probes claimed by "slow" with a 1 s lease, reclaimed together.
	my ($p1, $p2) = split /,/, $node->safe_psql('postgres',
		"SELECT string_agg(gd_insert('probe')::text, ',' ORDER BY g) FROM generate_series(1, 2) g");
	my %slow = map { my ($i, $t, $a) = split /\|/; ($i => [ $t, $a ]) } split /\n/,
	  $node->safe_psql('postgres', "SELECT id, lease_token, (ctx).attempt FROM gd_claim('probe', 'slow', 2, '1s')");
	is(join(' ', map { "$_:$slow{$_}[1]" } sort { $a <=> $b } keys %slow), "$p1:1 $p2:1",
		'probes: worker "slow" claims both with a 1 s lease');
	ok( $node->poll_query_until('postgres',
			"SELECT count(*) = 2 FROM gd.instances WHERE id IN ($p1, $p2) AND status = 'runnable' AND attempt = 2 AND lease_token IS NULL"),
		'probes: the reaper reclaims the expired leases (attempt 2)');
	my ($slow1, $slow2) = ($slow{$p1}[0], $slow{$p2}[0]);

	# Probe 2: the late completion comes before anyone claimed it again.
	my $stale_before = stale_count();
	is( $node->safe_psql('postgres', qq{
SELECT gd_complete($p2, $slow2, gd_done('{"by": "slow"}'))
       || ' ' || (SELECT status || ' ' || attempt || ' ' || (result IS NULL) FROM gd.instances WHERE id = $p2)}),
		'false runnable 2 true', 'probe 2: a completion after the reclaim is refused (false), the step still runnable');

	# Probe 1: claimed again by "fast"; then "slow" completes late.
	my ($id2, $fast_token, $attempt2) = split /\|/, $node->safe_psql('postgres',
		"SELECT id, lease_token, (ctx).attempt FROM gd_claim('probe', 'fast', 1, '30s')");
	is("$id2 $attempt2", "$p1 2", 'probe 1: worker "fast" claims it again (attempt 2)');
	is( $node->safe_psql('postgres', qq{
SELECT gd_complete($p1, $slow1, gd_done('{"by": "slow"}')) || ' ' || gd_heartbeat($p1, $slow1)
       || ' ' || (SELECT status || ' ' || lease_owner || ' ' || (lease_token = $fast_token) FROM gd.instances WHERE id = $p1)}),
		'false false executing fast true',
		'probe 1: "slow" completes and heartbeats with its old token: false, and "fast" still holds the claim');
	is( $node->safe_psql('postgres', qq{
SELECT gd_complete($p1, $fast_token, gd_done('{"by": "fast"}')) || ' '
       || gd_complete($p1, $fast_token, gd_done('{"by": "again"}'))}),
		'true false', 'probe 1: "fast" completes (true); a second completion of its claim: false');
	is(stale_count() - $stale_before, 3, 'probes: the three stale outcomes are counted as outcome_stale');
	is( $node->safe_psql('postgres',
			"SELECT status || ' ' || (result->>'by') || ' ' || attempt FROM gd.instances WHERE id = $p1"),
		'done fast 2', 'probe 1: exactly one outcome committed: "fast", at attempt 2');
	$node->safe_psql('postgres', "SELECT gd_cancel($p2, 'done probing')");
}

# ---------------------------------------------------------------------------
# The load, with workers supervised here
# ---------------------------------------------------------------------------
my $effects  = $node->basedir . '/effects.log';
my $handlers = $node->basedir . '/ext_handlers.py';
my $gate     = $node->basedir . '/gate_open';    # exists: the external steps may finish
PostgreSQL::Test::Utils::append_to_file($effects, '');
PostgreSQL::Test::Utils::append_to_file($handlers, qq{
import os, time
from gen_durable import next_step

EFFECTS = "$effects"
GATE = "$gate"
NAME = os.environ["GD_WORKER_NAME"]

def ext(state, ctx):
    # The external effect: one line per run, outside the database.
    with open(EFFECTS, "a") as f:
        f.write(f"{ctx.id} {ctx.attempt} {NAME}\\n")
    while not os.path.exists(GATE):     # held here while the test's gate is closed
        time.sleep(0.01)
    time.sleep(0.005)                   # at most ~200 steps a second per worker
    return next_step("finish", {**state, "ext": {"worker": NAME, "attempt": ctx.attempt}})

HANDLERS = {("mix", "ext"): ext}
});

my @slot;    # per slot: {pid, name, gen, started}
my $starts = 0;
my $worker_log = $node->basedir . '/workers.log';

# Workers are plain children (fork/exec) so that a dead one is seen at once.
sub start_worker
{
	my ($i) = @_;
	my $gen = ($slot[$i] ? $slot[$i]{gen} : 0) + 1;
	my $name = "w$i.$gen";
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		$ENV{GD_WORKER_NAME} = $name;
		open(STDOUT, '>>', $worker_log) or POSIX::_exit(127);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(127);
		exec(@worker_command, '--dsn', $node->connstr('postgres'),
			'--queue', 'default', '--handlers', $handlers, '--name', $name,
			'--batch', 10, '--lease', $lease, '--wait', 1)
		  or POSIX::_exit(127);
	}
	$slot[$i] = { pid => $pid, name => $name, gen => $gen, started => time(), alive => 1 };
	$starts++;
}

# Restart dead workers (at most once per 0.3 s each), as a supervisor would.
sub supervise
{
	for my $i (0 .. $#slot)
	{
		my $s = $slot[$i];
		$s->{alive} = 0 if $s->{alive} && waitpid($s->{pid}, WNOHANG) == $s->{pid};
		next if $s->{alive} || time() - $s->{started} < 0.3;
		start_worker($i);
	}
}

# Poll a query (tolerating a server that is down or recovering) until it
# returns $want, supervising the workers meanwhile.
sub wait_for
{
	my ($sql, $want, $seconds) = @_;
	my $deadline = time() + ($seconds // 30);
	my $last = '';
	while (time() < $deadline)
	{
		supervise();
		# (a psql that finds the server restarting may exit before it reads
		# the query: IPC::Run's write then dies on a broken pipe)
		my ($rc, $out) = eval { $node->psql('postgres', $sql) };
		$last = $out // $@;
		return 1 if defined $rc && $rc == 0 && $out eq $want;
		usleep(50_000);
	}
	diag("wait_for: '$sql' returned '$last', wanted '$want'");
	return 0;
}

sub effect_lines
{
	my @lines = grep { /^\d+ \d+ \S+$/ } split /\n/, slurp_file($effects);
	return @lines;
}

# Claims a worker holds now: "id:attempt" strings.
sub held_by
{
	my ($name) = @_;
	return split ' ', $node->safe_psql('postgres', qq{
SELECT string_agg(id || ':' || attempt, ' ') FROM gd.instances WHERE status = 'executing' AND lease_owner = '$name'});
}

sub set_gate
{
	my ($open) = @_;
	if ($open) { PostgreSQL::Test::Utils::append_to_file($gate, ''); }
	else       { unlink $gate; }
}

sub finished
{
	my ($rc, $out) = $node->psql('postgres', "SELECT count(*) FROM ledger WHERE step = 'finish'");
	return $rc == 0 ? $out : -1;
}

# Open the gate in short pulses until at least $rows instances finished;
# closed again on return.
sub run_until
{
	my ($rows) = @_;
	my $deadline = time() + 30;
	my $count = 0;
	while (time() < $deadline)
	{
		supervise();
		set_gate(1);
		usleep(100_000);
		set_gate(0);
		$count = finished();
		last if $count >= $rows;
	}
	return $count;
}

# Every worker holds claims and sits inside a step at the closed gate.
sub all_held
{
	my ($label) = @_;
	ok(wait_for(q{SELECT count(DISTINCT lease_owner) FROM gd.instances WHERE status = 'executing'}, $workers),
		"$label: each of the $workers workers holds claims, inside a step at the closed gate");
}

start_worker($_) for 0 .. $workers - 1;
my $ids = $node->safe_psql('postgres',
	"SELECT string_agg(gd_insert('mix')::text, ',') FROM generate_series(1, $n)");
my $t0 = time();
all_held('start');

# 1. Freeze a worker past its lease, then thaw it.
my $frozen = $slot[0];
kill 'STOP', $frozen->{pid};
my $frozen_at = time();
my @frozen_held = held_by($frozen->{name});
note("froze $frozen->{name} holding @frozen_held");
my $frozen_ids = join(',', map { (split /:/)[0] } @frozen_held) || '0';
ok( wait_for(qq{SELECT count(*) FROM gd.instances WHERE id IN ($frozen_ids) AND lease_owner = '$frozen->{name}'}, '0', 15),
	"the frozen worker's claims (" . scalar(@frozen_held) . ') are reclaimed after its lease');
my $took = time() - $frozen_at;
cmp_ok($took, '>=', $lease - 0.5, sprintf('... not before the lease ran out (%.1fs)', $took));
kill 'CONT', $frozen->{pid};

# 2. SIGKILL a worker holding claims.
run_until($n / 4);
all_held('before the worker kill');
my $victim = $slot[1];
my @killed_held = held_by($victim->{name});
kill 'KILL', $victim->{pid};
note("killed $victim->{name} holding @killed_held");
my $killed_name = $victim->{name};

# 3. SIGKILL an executor: crash-restart.
run_until($n / 2);
all_held('before the executor kill');
my $exec_pid = $node->safe_psql('postgres',
	"SELECT pid FROM gd.workers WHERE kind = 'executor' ORDER BY instance_id IS NULL, pid LIMIT 1");
my $off = -s $node->logfile;
kill 'KILL', $exec_pid;
ok(wait_for('SELECT 1', '1'), 'the server accepts connections again after the crash-restart');
ok($node->log_contains(qr/all server processes terminated; reinitializing/, $off),
	'killing an executor crash-restarted the server');

# 4. Immediate stop and start, with claims in flight.
my $finished_at_stop = run_until(3 * $n / 4);
all_held('before the immediate stop');
$node->stop('immediate');
cmp_ok($finished_at_stop, '<', $n, "immediate stop with $finished_at_stop of $n finished");
$node->start;

set_gate(1);
ok(wait_for(qq{SELECT count(*) FROM gd.instances WHERE fsm = 'mix' AND status = 'done'}, $n, 40),
	"all $n instances done")
  or diag $node->safe_psql('postgres',
	"SELECT status, step, lease_owner, count(*) FROM gd.instances GROUP BY 1, 2, 3 ORDER BY 1, 2, 3");
note(sprintf('load phase: %.1fs, %d worker starts', time() - $t0, $starts));
for my $s (grep { $_->{alive} } @slot)
{
	kill 'TERM', $s->{pid};
	waitpid($s->{pid}, 0);
}

# ---------------------------------------------------------------------------
# At least once (effects), exactly once (outcomes, in-database steps)
# ---------------------------------------------------------------------------
my @lines = effect_lines();
my %runs;
$runs{(split / /)[0]}++ for @lines;
my @ids = split /,/, $ids;
my @never = grep { !$runs{$_} } @ids;
is(scalar(@never), 0, "every external step's effect happened at least once (" . scalar(@lines) . " runs for $n steps)")
  or diag("no effect for: @never[0 .. ($#never < 9 ? $#never : 9)]");
my $repeated = grep { $runs{$_} > 1 } @ids;
note("$repeated instances' external effect happened more than once");

is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM (SELECT instance FROM ledger WHERE instance IN ($ids)
                       GROUP BY instance HAVING string_agg(step, ',' ORDER BY step) = 'finish,prepare') x}),
	$n, 'each in-database step ran exactly once (one prepare and one finish row per instance)');
is($node->safe_psql('postgres', "SELECT count(*) FROM ledger WHERE instance IN ($ids)"),
	2 * $n, '... and nothing more');

# The outcome the finish step saw, per instance, is one whose effect happened.
my %effect = map { $_ => 1 } map { my ($i, $a, $w) = split / /; "$i $a $w" } @lines;
my %committed = map { my ($i, $a, $w) = split /\|/; ($i => "$i $a $w") } split /\n/,
  $node->safe_psql('postgres', "SELECT instance, ext_attempt, ext_worker FROM ledger WHERE step = 'finish' AND instance IN ($ids)");
my @orphans = grep { !$effect{ $committed{$_} // '' } } @ids;
is(scalar(@orphans), 0, 'each committed outcome is that of a run whose effect happened')
  or diag("e.g. @orphans[0 .. ($#orphans < 4 ? $#orphans : 4)]");
is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM gd.instances i JOIN ledger l ON l.instance = i.id AND l.step = 'finish'
 WHERE i.id IN ($ids) AND i.result IS DISTINCT FROM jsonb_build_object('worker', l.ext_worker, 'attempt', l.ext_attempt)}),
	'0', "every instance's result is the outcome its finish step saw");

# Claims held by the frozen and the killed worker: their outcomes were never applied.
for my $case ([ 'frozen', $frozen->{name}, \@frozen_held ], [ 'killed', $killed_name, \@killed_held ])
{
	my ($label, $name, $held) = @$case;
	my @applied;
	for my $claim (@$held)
	{
		my ($id, $attempt) = split /:/, $claim;
		my ($a, $w) = (split / /, ($committed{$id} // '- - -'))[1, 2];
		push @applied, $claim if $w eq $name && $a == $attempt;
	}
	cmp_ok(scalar(@$held), '>', 0, "$label worker $name held claims");
	is("@applied", '', "$label worker $name: none of the " . scalar(@$held) . ' claims it held has its outcome committed');
}
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM gd.instances WHERE status = 'executing' OR lease_token IS NOT NULL"),
	'0', 'no claim is left');
ok(!$node->log_contains(qr/PANIC|TRAP:|terminated by signal (6|11)/),
	'no PANIC, assertion failure or segfault in the log');
{
	my $wlog = -f $worker_log ? slurp_file($worker_log) : '';
	my $lost = () = $wlog =~ /lease lost/g;
	note("the workers logged $lost 'lease lost' warnings");
	diag("workers' log:\n$wlog") unless Test::More->builder->is_passing;
}

$node->stop;
done_testing();
