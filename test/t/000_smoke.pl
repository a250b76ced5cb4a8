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

$node->stop;
done_testing();
