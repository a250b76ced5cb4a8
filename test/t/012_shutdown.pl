# Shutting down while steps run: `pg_ctl stop -m fast` does not wait for the
# running steps (the executors roll their rounds back and exit at once), and
# `-m immediate` is a crash. Either way, after a restart the interrupted
# instances run again and complete, each handler's effect committed once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 30;

my $step_seconds = 2;
my $n_instances  = 3;

my $node = GdTest::start_node(
	'shutdown',
	'gen_durable.queues'     => "default:$n_instances",
	'gen_durable.batch_size' => 1,
	max_worker_processes     => 32,
);

$node->safe_psql('postgres', qq{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (
    instance bigint NOT NULL,
    step     text   NOT NULL,
    UNIQUE (instance, step));
CREATE FUNCTION long_step(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS \$\$
BEGIN
    INSERT INTO ledger (instance, step) VALUES (ctx.id, ctx.step);
    PERFORM pg_sleep($step_seconds);
    RETURN gd_done(jsonb_build_object('attempt', ctx.attempt));
END \$\$;
SELECT gd_define_fsm('long', 'work');
SELECT gd_define_step('long', 'work', 'long_step(jsonb, gd.context)'::regprocedure, 3, '100ms', '1s');
});

# Insert a batch and wait until every instance's handler is inside pg_sleep.
sub start_long_steps
{
	my ($label) = @_;
	my $ids = $node->safe_psql('postgres',
		"SELECT string_agg(gd_insert('long')::text, ',') FROM generate_series(1, $n_instances)");
	ok( $node->poll_query_until('postgres', qq{
SELECT count(*) FROM pg_stat_activity a JOIN gd.workers w USING (pid)
 WHERE w.instance_id IN ($ids) AND a.wait_event = 'PgSleep'}, $n_instances),
		"$label: $n_instances executors are inside the long step");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM gd.instances WHERE id IN ($ids) AND status IN ('done', 'failed')"),
		'0', "$label: none has finished yet");
	return $ids;
}

sub check_completed
{
	my ($label, $ids) = @_;
	ok( GdTest::poll_done($node, $ids, $n_instances),
		"$label: after restart the interrupted instances complete");
	is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM (SELECT i.id FROM gd.instances i LEFT JOIN ledger l ON l.instance = i.id
                       WHERE i.id IN ($ids) GROUP BY i.id HAVING count(l.*) = 1) x}),
		$n_instances, "$label: each handler's ledger row exists exactly once");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM gd.instances WHERE id IN ($ids) AND error IS NOT NULL"),
		'0', "$label: no error recorded for the interrupted runs");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM gd.instances WHERE id IN ($ids) AND result->>'attempt' = '1'"),
		$n_instances, "$label: the interrupted run counted no attempt (the rerun is attempt 1)");
}

# ---------------------------------------------------------------------------
# stop -m fast
# ---------------------------------------------------------------------------
my $ids = start_long_steps('fast');
my $off = -s $node->logfile;
my $t0  = time();
$node->stop('fast');
my $elapsed = time() - $t0;
cmp_ok($elapsed, '<', 1.5,
	sprintf('fast: pg_ctl stop -m fast returned in %.2fs, without waiting for the %ds steps',
		$elapsed, $step_seconds));
ok(!$node->log_contains(qr/PANIC|process .* was terminated by signal/, $off),
	'fast: a clean shutdown');
{
	my $log = slurp_file($node->logfile, $off);
	my @cut = ($log =~ /FATAL:  terminating background worker "gen_durable executor" due to administrator command\n[^\n]*CONTEXT:[^\n]*pg_sleep/g);
	is(scalar @cut, $n_instances, "fast: the $n_instances executors were cut off inside pg_sleep");
}
$node->start;
check_completed('fast', $ids);

# ---------------------------------------------------------------------------
# stop -m immediate
# ---------------------------------------------------------------------------
$ids = start_long_steps('immediate');
$t0 = time();
$node->stop('immediate');
$elapsed = time() - $t0;
cmp_ok($elapsed, '<', 1.5,
	sprintf('immediate: pg_ctl stop -m immediate returned in %.2fs', $elapsed));
$node->start;
check_completed('immediate', $ids);

$node->stop;
done_testing();
