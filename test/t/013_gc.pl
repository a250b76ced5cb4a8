# The garbage collector: with a short retention, finished instances (done,
# failed, cancelled) and their signals are deleted by the background
# collector within a few seconds, never before `retention` has passed; the
# finished children of a live parent stay until the parent ends; gd.stats
# gc_swept counts exactly what went, and the log has one "GC swept N" line
# per sweep, never one per row.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time);

# Every poll in this file is bounded well below the suite's timeout.
$PostgreSQL::Test::Utils::timeout_default = 20;

my $node = GdTest::start_node(
	'gc',
	'gen_durable.queues'      => 'default:2',
	'gen_durable.retention'   => '1s',
	'gen_durable.gc_interval' => '200ms',
);

# One handler for every FSM; each step leaves a ledger row (which the GC does
# not touch) with the time it ran.
#   plain:   only -> done
#   waiter:  start waits for 'go' -> finish -> done
#   stopper: only -> gd_stop (failed)
#   parent:  start spawns a plain child and a waiter child -> join, which
#            waits for 'release' -> finish -> done
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (instance bigint NOT NULL, step text NOT NULL,
                     at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION gc_step(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger (instance, step) VALUES (ctx.id, ctx.step);
    CASE ctx.fsm || '.' || ctx.step
        WHEN 'waiter.start' THEN RETURN gd_wait_signal(ARRAY['go'], then_step => 'finish');
        WHEN 'stopper.only' THEN RETURN gd_stop('{"why": "test"}');
        WHEN 'parent.start' THEN RETURN gd_spawn('[{"fsm": "plain"}, {"fsm": "waiter"}]', then_step => 'join');
        WHEN 'parent.join' THEN RETURN gd_wait_signal(ARRAY['release'], then_step => 'finish');
        ELSE RETURN gd_done();
    END CASE;
END $$;
SELECT gd_define_fsm('plain', 'only');
SELECT gd_define_step('plain', 'only', 'gc_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('stopper', 'only');
SELECT gd_define_step('stopper', 'only', 'gc_step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('waiter', 'start');
SELECT gd_define_step('waiter', s, 'gc_step(jsonb, gd.context)'::regprocedure) FROM unnest('{start,finish}'::text[]) s;
SELECT gd_define_fsm('parent', 'start');
SELECT gd_define_step('parent', s, 'gc_step(jsonb, gd.context)'::regprocedure)
  FROM unnest('{start,join,finish}'::text[]) s;
});

ok( $node->poll_query_until('postgres', q{
SELECT count(*) FROM gd.workers WHERE kind = 'gc' AND database = 'postgres'}, '1'),
	'a garbage collector serves the database');

sub query { return $node->safe_psql('postgres', $_[0]); }

sub status_of { return query("SELECT status FROM gd.instances WHERE id = $_[0]"); }

sub gc_swept { return query("SELECT count FROM gd.stats WHERE event = 'gc_swept'"); }

# GC sweep lines since $offset: (timestamp, count) pairs.
sub sweep_lines
{
	my ($offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my @lines;
	while ($log =~ m/^(\d{4}-\d\d-\d\d [\d:.]+ \S+) .*gen_durable: GC swept (\d+) finished instances in database "postgres"$/mg)
	{
		push @lines, [ $1, $2 ];
	}
	return @lines;
}

# A marker instance, inserted now, finishes after everything finished so
# far: once the collector has swept it (the oldest first), every sweep that
# could have taken those has run.
sub sweep_past
{
	my ($what) = @_;
	my $marker = query("SELECT gd_insert('plain')");
	ok($node->poll_query_until('postgres', "SELECT count(*) FROM gd.instances WHERE id = $marker", '0'),
		"$what: the collector swept a marker instance that finished later");
	return 1;
}

query('SELECT gd_stats_reset()');
my $log_offset = -s $node->logfile;

# ---------------------------------------------------------------------------
# (a) finished instances go, with their signals, within a few seconds
# ---------------------------------------------------------------------------
# Rows finished 1 s ago may go at any moment: what ends in this part is
# checked in the same psql call that ends it, within milliseconds.
my $signalled = query("SELECT gd_insert('waiter')");
my $cancelled = query("SELECT gd_insert('waiter')");
ok( $node->poll_query_until('postgres',
		"SELECT string_agg(status, ',') FROM gd.instances WHERE id IN ($signalled, $cancelled)",
		'awaiting_signal,awaiting_signal'),
	'(a) two waiters park on their signal');
my @out = split /\n/, query(qq{
SELECT string_agg(gd_insert(f)::text, ',') AS ids
  FROM (SELECT 'plain' FROM generate_series(1, 20) UNION ALL SELECT 'stopper') s(f) \\gset
SELECT gd_signal($signalled, 'go', '{"n": 1}') AND gd_cancel($cancelled, 'test');
SELECT string_agg(status || ':' || n, ' ' ORDER BY status)
  FROM (SELECT a.status, count(*) AS n
          FROM unnest(string_to_array(:'ids', ',')::bigint[]) id,
               LATERAL gd_await(id, '10s', until => 'terminal') a GROUP BY 1) s;
SELECT status FROM gd_await($signalled, '10s', until => 'terminal');
SELECT status FROM gd.instances WHERE id = $cancelled;
SELECT count(*) FROM gd.signals WHERE instance_id = $signalled;
SELECT :'ids';});
is($out[0], 't', '(a) signal one waiter, cancel the other');
is($out[1], 'done:20 failed:1', '(a) 20 one-step instances are done, the stopped one failed');
is($out[2], 'done', '(a) the signalled instance is done');
is($out[3], 'cancelled', '(a) the other is cancelled');
is($out[4], '1', '(a) the consumed signal is in gd.signals');
my $finished = "$out[5],$signalled,$cancelled";

my $t0 = time();
ok( $node->poll_query_until('postgres', qq{
SELECT (SELECT count(*) FROM gd.instances WHERE id IN ($finished))
     + (SELECT count(*) FROM gd.signals WHERE instance_id IN ($finished))}, '0'),
	'(a) the 23 finished instances and their signal are gone');
my $took = time() - $t0;
cmp_ok($took, '<', 5, sprintf('(a) within a few seconds of finishing (%.1f s)', $took));
is(gc_swept(), '23', '(a) gd.stats gc_swept counts the 23');
{
	my @lines = sweep_lines($log_offset);
	ok(scalar(@lines) >= 1, '(a) the sweep is logged');
	# Never before retention: the first sweep comes at least 1 s after the
	# first of them ran (its row finished even later); the log's timestamps
	# are cut to the millisecond.
	is( query(qq{
SELECT '$lines[0][0]'::timestamptz >= min(at) + interval '0.999s' FROM ledger
 WHERE instance IN ($finished)}), 't',
		"(a) the first sweep ($lines[0][0]) came no sooner than the retention after the first step");
}

# ---------------------------------------------------------------------------
# (b) a live parent keeps its finished children, until it ends
# ---------------------------------------------------------------------------
my $parent = query("SELECT gd_insert('parent')");
ok( $node->poll_query_until('postgres', qq{
SELECT p.status || ' ' || string_agg(c.fsm || ':' || c.status, ' ' ORDER BY c.fsm)
  FROM gd.instances p JOIN gd.instances c ON c.parent_id = p.id WHERE p.id = $parent GROUP BY p.status},
		'awaiting_children plain:done waiter:awaiting_signal'),
	'(b) the parent awaits its children; one is done, one waits for a signal');
my $child_done = query("SELECT id FROM gd.instances WHERE parent_id = $parent AND fsm = 'plain'");
my $child_wait = query("SELECT id FROM gd.instances WHERE parent_id = $parent AND fsm = 'waiter'");
sweep_past('(b) parent awaiting children');
is(status_of($child_done), 'done', '(b) its finished child is kept, past the retention');
is(status_of($parent), 'awaiting_children', '(b) the parent still awaits the other');

is(query("SELECT gd_signal($child_wait, 'go')"), 't', '(b) signal the waiting child');
ok($node->poll_query_until('postgres', "SELECT status || ' ' || step FROM gd.instances WHERE id = $parent",
		'awaiting_signal join'),
	'(b) both children are done: the parent resumed, and waits for a signal of its own');
sweep_past('(b) parent awaiting a signal');
is( query("SELECT string_agg(status, ',') FROM gd.instances WHERE id IN ($child_done, $child_wait)"),
	'done,done', '(b) both finished children are kept while the parent is live');
is(query("SELECT count(*) FROM gd.signals WHERE instance_id = $child_wait"), '1',
	"(b) with the child's signal");

is( query(qq{
SELECT gd_signal($parent, 'release');
SELECT status FROM gd_await($parent, '10s', until => 'terminal');}),
	"t\ndone", '(b) release the parent: it is done');
my $tree = "$parent,$child_done,$child_wait";
ok( $node->poll_query_until('postgres', qq{
SELECT (SELECT count(*) FROM gd.instances WHERE id IN ($tree))
     + (SELECT count(*) FROM gd.signals WHERE instance_id IN ($tree))}, '0'),
	'(b) once the parent has ended, it and its children go, with their signals');

# ---------------------------------------------------------------------------
# (c) the counter and the log agree: one line per sweep
# ---------------------------------------------------------------------------
# 23 in (a), 2 markers, the parent and its 2 children.
is(gc_swept(), '28', '(c) gd.stats gc_swept counts every instance swept');
{
	my @lines = sweep_lines($log_offset);
	my $sum = 0;
	$sum += $_->[1] for @lines;
	is($sum, 28, sprintf('(c) the %d sweep lines add up to the counter', scalar @lines));
	cmp_ok(scalar(@lines), '<', 28, '(c) fewer lines than instances: not one line per row');
	ok((grep { $_->[1] >= 2 } @lines), '(c) a single line reports several instances');
	is(scalar(grep { $_->[1] == 0 } @lines), 0, '(c) a sweep that found nothing is not logged');
}
is( $node->safe_psql('postgres', q{SELECT count(*) FROM gd.instances}),
	'0', '(c) nothing is left');
ok(!$node->log_contains(qr/ (ERROR|FATAL|PANIC): /, $log_offset), '(c) no errors in the log');

$node->stop;
done_testing();
