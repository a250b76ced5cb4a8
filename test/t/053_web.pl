# gd-web (web/): its HTTP tests (every page and action, as the FSM's owner
# and as a role without grants: filters, keyset pages, CSRF, escaping), what
# it refuses (a foreign Host, a superuser's connection, bad parameters, a
# squatter's schema named after its role) and its browser tests (Debian's
# chromium through Selenium: overview, filter, signal and see it finish,
# cancel, rewind and fork, an inert XSS payload, a stranger refused), each Python test one
# assertion here.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $web = GdTest::project_file("web");
my $node = GdTest::start_node('web', 'gen_durable.queues' => 'default:2');
$node->safe_psql('postgres', 'CREATE EXTENSION gen_durable');

local $ENV{GD_TEST_DSN} = $node->connstr('postgres');
local $ENV{PYTHONPATH} = $web;
local $ENV{HOME} = $node->basedir;   # chromium writes its profile under HOME
my ($out, $err) = run_command(
	[ '/usr/bin/python3', '-m', 'unittest', 'discover', '-v', '-s', "$web/tests", '-t', "$web/tests" ]);
my @results = $err =~ /^(test_\w+) \(([\w.]+)\) \.\.\. (?:.*\n)*?(ok|FAIL|ERROR|skipped.*)$/mg;
cmp_ok(scalar(@results) / 3, '>=', 18, 'the dashboard\'s suite ran');
while (my ($test, $where, $verdict) = splice(@results, 0, 3))
{
	is($verdict, 'ok', "web: $where");
}
like($err, qr/^OK$/m, 'the dashboard\'s suite passed') or diag $err;

$node->stop;
done_testing();
