# The engine's workers die with the postmaster.  With a backlog of 20,000
# three-step instances (each step a millisecond of work) the executors never
# wait on their latches; after `kill -9` of the postmaster each must still
# exit within about a second (it checks between steps), so the server can
# start again at once, and the backlog then runs to its end: every
# (instance, step) in the ledger exactly once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 120;

my $n = 20000;
my $node = GdTest::start_node('pm_death', 'gen_durable.queues' => 'default:2');

$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (instance bigint, step text, PRIMARY KEY (instance, step));
-- A millisecond of work that never waits on a latch (which would see the postmaster's death).
CREATE FUNCTION walk(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
DECLARE
    until timestamptz := clock_timestamp() + interval '1 millisecond';
BEGIN
    INSERT INTO ledger VALUES (ctx.id, ctx.step);
    WHILE clock_timestamp() < until LOOP
    END LOOP;
    IF ctx.step = 'c' THEN
        RETURN gd_done();
    END IF;
    RETURN gd_next(CASE ctx.step WHEN 'a' THEN 'b' ELSE 'c' END);
END $$;
SELECT gd_define_fsm('three', 'a');
SELECT gd_define_step('three', s, 'walk(jsonb, gd.context)'::regprocedure) FROM unnest('{a,b,c}'::text[]) s;
});
$node->safe_psql('postgres', "SELECT count(*) FROM gd_insert_all('three', (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, $n)))");
$node->poll_query_until('postgres', 'SELECT count(*) > 500 FROM ledger') or die 'the executors do not run';

my @pids = split /\n/, $node->safe_psql('postgres', q{SELECT pid FROM gd.workers ORDER BY pid});
is(scalar(@pids), 5, 'launcher, reaper, collector and two executors are running');

my $postmaster = $node->{_pid};
$node->kill9;
my $killed_at = time();
# A process that exited is gone, even while it waits (a zombie) for init to reap it.
sub running
{
	my ($pid) = @_;
	open(my $stat, '<', "/proc/$pid/stat") or return 0;
	my ($state) = (<$stat> =~ /\) (\S)/);
	return $state ne 'Z';
}
my @alive = @pids;
while (@alive && time() - $killed_at < 30)
{
	usleep(20_000);
	@alive = grep { running($_) } @alive;
}
my $gone_after = time() - $killed_at;
is(scalar(@alive), 0, 'every engine worker exited');
cmp_ok($gone_after, '<', 2, sprintf('within 2 s of the postmaster\'s death (%.2f s)', $gone_after));
diag(sprintf('engine workers gone %.2f s after the postmaster died', $gone_after));

# The lock file names the old postmaster: start once its pid is reaped (this
# machine's init may take a moment), as a server's supervisor would.
usleep(50_000) while kill(0, $postmaster) && time() - $killed_at < 60;
$node->start;
$node->poll_query_until('postgres', "SELECT count(*) = $n FROM gd.instances WHERE status = 'done'")
  or diag('the backlog did not finish after the restart');
is($node->safe_psql('postgres', q{SELECT count(*) FROM ledger}), 3 * $n, 'every step of every instance ran once');
is($node->safe_psql('postgres', q{SELECT count(*) FROM gd.instances WHERE status <> 'done'}), '0', 'none was lost');

$node->stop;
done_testing();
