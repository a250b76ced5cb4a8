# The Python client (clients/python): installed with pip into a virtual
# environment, offline (its build backend needs nothing from an index), then
# its own test suite (clients/python/tests, unittest) runs against a cluster,
# each Python test one assertion here.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $client = GdTest::project_file("clients/python");
my $node = GdTest::start_node('python_client', 'gen_durable.queues' => 'default:1, shop:1');
$node->safe_psql('postgres', 'CREATE EXTENSION gen_durable');

# Debian's psycopg (and mypy) come from the system's site packages.
my $venv = $node->basedir . '/venv';
my ($out, $err) = run_command(['/usr/bin/python3', '-m', 'venv', '--system-site-packages', $venv]);
ok(-x "$venv/bin/pip", 'a virtual environment') or diag $err;
($out, $err) = run_command(
	[ "$venv/bin/pip", 'install', '--no-index', '--no-cache-dir', '--disable-pip-version-check', $client ]);
like($out, qr/Successfully installed gen-durable-0\.2\.0/, 'pip install ./clients/python, offline') or diag "$out\n$err";
($out, $err) = run_command([ "$venv/bin/python", '-c', 'import gen_durable; print(gen_durable.__file__)' ]);
like($out, qr/^\Q$venv\E\/lib\/python3[.0-9]*\/site-packages\/gen_durable\/__init__\.py$/m,
	'the installed package is the one imported') or diag $err;

# Its types (py.typed), as an application's type checker sees the installed package: the package itself,
# and the typed example of the README's client and worker (mypy, Debian's; run by the venv's Python).
foreach my $target ([ '-p', 'gen_durable' ], [ "$client/tests/types/example.py" ])
{
	($out, $err) = run_command([ "$venv/bin/python", '-m', 'mypy', '--config-file', "$client/pyproject.toml",
		'--cache-dir', $node->basedir . '/mypy_cache', @$target ]);
	like($out, qr/^Success: no issues found in \d+ source files?$/m, "mypy @$target") or diag "$out\n$err";
}

# The suite, on the installed package (its directory is not the source's).
local $ENV{GD_TEST_DSN} = $node->connstr('postgres');
($out, $err) = run_command(
	[ "$venv/bin/python", '-m', 'unittest', 'discover', '-v', '-s', "$client/tests", '-t', "$client/tests" ]);
my @results = $err =~ /^(test_\w+) \(([\w.]+)\) \.\.\. (?:.*\n)*?(ok|FAIL|ERROR|skipped.*)$/mg;
cmp_ok(scalar(@results) / 3, '>=', 20, 'the Python suite ran');
while (my ($test, $where, $verdict) = splice(@results, 0, 3))
{
	is($verdict, 'ok', "python: $where");
}
like($err, qr/^OK$/m, 'the Python suite passed') or diag $err;

# The example of the README (examples/shop.sql, examples/shop_handlers.py), with the installed worker.
is( GdTest::run_shop_example(
		$node, "$venv/bin/python", '-m', 'gen_durable', 'worker', '--dsn', $node->connstr('postgres'),
		'--handlers', GdTest::project_file("examples/shop_handlers.py"), '--wait', 1),
	qq{done {"paid": 5}\ndone {"paid": 7}\nfailed stop\nreceipts 2},
	'the shop example: two orders paid (one on its second attempt), one stopped');

$node->stop;
done_testing();
