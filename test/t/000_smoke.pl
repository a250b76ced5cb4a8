# Smoke test: a server with gen_durable preloaded starts, the extension
# installs, and the engine's launcher background worker comes up.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

my $node = GdTest::start_node('main');

is($node->safe_psql('postgres', 'SHOW shared_preload_libraries'),
	'gen_durable', 'server started with gen_durable preloaded');

$node->safe_psql('postgres', 'CREATE EXTENSION gen_durable');
like($node->safe_psql('postgres', 'SELECT extname FROM pg_extension ORDER BY 1'),
	qr/^gen_durable$/m, 'CREATE EXTENSION gen_durable');

# The launcher is a background worker: its bgw_type shows up as backend_type.
my $launcher_query = q{
	SELECT count(*) FROM pg_stat_activity
	WHERE backend_type ILIKE '%gen_durable%launcher%'};
my $launchers = 0;
my $deadline  = time() + 10;
while (1)
{
	$launchers = $node->safe_psql('postgres', $launcher_query);
	last if $launchers > 0 || time() > $deadline;
	usleep(100_000);
}
cmp_ok($launchers, '>', 0, 'gen_durable launcher is running within 10s')
  or diag $node->safe_psql('postgres',
	'SELECT pid, backend_type, datname FROM pg_stat_activity ORDER BY 1');

# What the engine's processes sleep on: named from PostgreSQL 17 (wait events
# of the extension's own), 'Extension' before.
my $named = $node->safe_psql('postgres', q{SELECT current_setting('server_version_num')::int >= 170000});
my %expected = $named eq 't'
  ? (executor => 'GenDurableExecutorIdle', reaper => 'GenDurableReaperIdle', launcher => 'GenDurableLauncher')
  : (executor => 'Extension', reaper => 'Extension', launcher => 'Extension');
for my $kind (sort keys %expected)
{
	ok( $node->poll_query_until('postgres', qq{
		SELECT count(*) > 0 FROM pg_stat_activity a JOIN gd.workers w ON w.pid = a.pid
		 WHERE w.kind = '$kind' AND a.wait_event_type = 'Extension' AND a.wait_event = '$expected{$kind}'}),
		"an idle $kind waits on $expected{$kind}");
}
# A claim waiting for work, in a session of its own: named while it waits,
# back at the commit of work for its queue.
$node->safe_psql('postgres', q{SELECT gd_define_fsm('smoke_ext', 'work', 'smoke', steps => '{"work": {}}')});
my $claim = $node->background_psql('postgres');
$claim->query_until(qr/waiting/, q{\echo waiting
SELECT 'claimed ' || count(*) FROM gd_claim('smoke', 'smoke-worker', wait => '60 s');
});
my $claim_event = $named eq 't' ? 'GenDurableClaim' : 'Extension';
ok( $node->poll_query_until('postgres', qq{
		SELECT count(*) > 0 FROM pg_stat_activity
		 WHERE query LIKE '%gd_claim%' AND pid <> pg_backend_pid()
		   AND wait_event_type = 'Extension' AND wait_event = '$claim_event'}),
	"a claim waiting for work waits on $claim_event");
$node->safe_psql('postgres', q{SELECT gd_insert('smoke_ext')});
like($claim->query_until(qr/claimed \d/, ''), qr/claimed 1/, 'the waiting claim took the work at its commit');
$claim->quit;

$node->stop;
done_testing();
