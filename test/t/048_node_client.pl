# The Node.js client (clients/node, with npm's pg, TypeScript and the types
# from its package-lock.json, installed by check.sh): its own test suite
# (clients/node/test, node:test: traces.test.js the steps' spans through
# OpenTelemetry's SDK) runs against a cluster, each JavaScript test one
# assertion here; then its install into an application, its ES module
# face and its TypeScript declarations.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $client = GdTest::project_file("clients/node");
die "no node_modules/pg in $client: its dependencies were not installed (gd_node_client_deps)"
  unless -d "$client/node_modules/pg";
my $node = GdTest::start_node('node_client', 'gen_durable.queues' => 'default:1, shop:1');
$node->safe_psql('postgres', 'CREATE EXTENSION gen_durable');

local $ENV{GD_TEST_DSN} = 'postgresql://' . $node->host =~ s{/}{%2F}gr . ':' . $node->port . '/postgres';
my ($out, $err) = run_command(['node', '--test', '--test-reporter=tap', glob("$client/test/*.test.js")]);
my @results = $out =~ /^(ok|not ok) \d+ - (.+)$/mg;
cmp_ok(scalar(@results) / 2, '>=', 18, 'the JavaScript suite ran') or diag "$out\n$err";
while (my ($verdict, $name) = splice(@results, 0, 2))
{
	is($verdict, 'ok', "node: $name");
}
like($out, qr/^# fail 0$/m, 'the JavaScript suite passed') or diag $out;

# The example (examples/shop.sql, examples/shop_worker.js) in an application
# of its own that installed the client as the README says (npm pack, npm
# install of the tarball): its dependencies come with it.
my $app = $node->basedir . '/app';
mkdir $app or die "mkdir $app: $!";
PostgreSQL::Test::Utils::append_to_file("$app/package.json", '{"name": "shop-app", "private": true}');
my ($packed) = run_command([ 'npm', 'pack', '--silent', '--pack-destination', $app, $client ]);
chomp $packed;
like($packed, qr/^gen-durable-[\d.]+\.tgz$/, 'npm pack makes the client\'s tarball');
($out, $err) = run_command([ 'npm', 'install', '--prefix', $app, '--no-audit', '--no-fund', '--loglevel=error', "$app/$packed" ]);
ok(-d "$app/node_modules/pg" && -f "$app/node_modules/gen-durable/lib/index.js",
	'installed into the application with its dependency pg') or diag "$out\n$err";
ok(!-e "$app/node_modules/\@opentelemetry/api",
	'without OpenTelemetry (an optional peer dependency): the example below runs with no tracing');
# As an ES module too, by name.
PostgreSQL::Test::Utils::append_to_file("$app/esm.mjs", q{
import { Client, Worker, nextStep } from 'gen-durable';
console.log(typeof Client, typeof Worker, nextStep('b').kind);
});
($out, $err) = run_command([ 'node', "$app/esm.mjs" ]);
is($out, 'function function next', 'imported as an ES module') or diag $err;
# The TypeScript declarations, checked against the typed example (tsc from npm, the client's devDependencies).
($out, $err) = run_command([ "$client/node_modules/.bin/tsc", '-p', "$client/test/types" ]);
is($out . $err, '', 'tsc --noEmit: the typed example checks against lib/index.d.ts');
{
	local $ENV{NODE_PATH} = "$app/node_modules";
	is(GdTest::run_shop_example($node, 'node', GdTest::project_file("examples/shop_worker.js"), $ENV{GD_TEST_DSN}),
		qq{done {"paid": 5}\ndone {"paid": 7}\nfailed stop\nreceipts 2},
		'the shop example in Node.js: two orders paid (one on its second attempt), one stopped');
}

$node->stop;
done_testing();
