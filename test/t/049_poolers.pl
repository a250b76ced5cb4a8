# Through PgBouncer in transaction mode (Debian's pgbouncer, a pool of two
# server connections for many clients, so consecutive transactions of one
# client land on different server connections):
# - the API from psql, the Python client and the Node.js client;
# - the Python and Node.js workers with nothing but the pooler: their claims
#   wait in the server (gd_claim(wait => 30 s)), are woken at the commit of
#   new work, not at the end of the wait, and are cancelled at SIGTERM; no
#   NOTIFY is sent (no session listens).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use IPC::Run;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 60;

my $pgbouncer = '/usr/sbin/pgbouncer';
die "no $pgbouncer (Debian's pgbouncer)" unless -x $pgbouncer;
my @python_worker = GdTest::external_worker();    # also puts the Python client on PYTHONPATH
my $node_client = GdTest::project_file("clients/node");
die "no node_modules/pg in $node_client" unless -d "$node_client/node_modules/pg";

my $node = GdTest::start_node('pooled', 'gen_durable.queues' => 'default:2');
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE charges (instance bigint PRIMARY KEY, worker text);
CREATE FUNCTION pooled_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'reserve' THEN
        RETURN gd_next('charge', state || '{"reserved": true}');
    ELSIF ctx.step = 'wait' THEN
        RETURN gd_wait_signal(ARRAY['go'], then_step => 'finish');
    END IF;
    RETURN gd_done(state);
END $$;
-- reserve (in-database) -> charge (external, queue pay) -> finish (in-database)
SELECT gd_define_fsm('pooled', 'reserve', queue => 'default', steps => $${
    "reserve": {"handler": "public.pooled_step(jsonb, gd.context)"},
    "charge": {"queue": "pay"},
    "wait": {"handler": "public.pooled_step(jsonb, gd.context)"},
    "finish": {"handler": "public.pooled_step(jsonb, gd.context)"}
}$$);
});

# PgBouncer in front of the node: a pool of four server connections (a
# waiting claim holds one while it waits: two lanes, and room for the rest).
my $dir = $node->basedir . '/pgbouncer';
mkdir $dir or die "mkdir $dir: $!";
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $user = $ENV{USER} // getpwuid($<);
PostgreSQL::Test::Utils::append_to_file("$dir/userlist.txt", qq{"$user" ""\n});
PostgreSQL::Test::Utils::append_to_file("$dir/pgbouncer.ini", join("\n",
	'[databases]',
	'postgres = host=' . $node->host . ' port=' . $node->port . ' dbname=postgres',
	'[pgbouncer]',
	'listen_addr = 127.0.0.1', "listen_port = $port", "unix_socket_dir = $dir",
	'auth_type = trust', "auth_file = $dir/userlist.txt",
	'pool_mode = transaction', 'default_pool_size = 4', 'max_client_conn = 100',
	"logfile = $dir/pgbouncer.log", "pidfile = $dir/pgbouncer.pid", ''));
my $bouncer = IPC::Run::start([ $pgbouncer, "$dir/pgbouncer.ini" ], '>', \my $bouncer_out, '2>', \my $bouncer_err);
my $pooled = "host=127.0.0.1 port=$port dbname=postgres user=$user";
my $pooled_url = "postgresql://$user\@127.0.0.1:$port/postgres";
my $through = sub { run_command(['psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-d', $pooled, '-c', shift]) };
for (my $tries = 0; $tries < 100 && ($through->('SELECT 1'))[0] !~ /^1$/m; $tries++)
{
	usleep(100_000);
}
like(($through->('SELECT 1'))[0], qr/^1$/m, 'PgBouncer serves the node');

# The API from psql, through the pooler.
my ($out) = $through->(q{SELECT gd_insert('pooled', '{"n": 1}', step => 'wait', correlation_key => 'psql-1')});
chomp(my $waiting = $out);
like($waiting, qr/^\d+$/, 'psql through the pooler: gd_insert');
like(($through->("SELECT status FROM gd_await($waiting, '10s')"))[0], qr/^awaiting$/m, 'gd_await');
like(($through->(q{SELECT gd_signal('psql-1', 'go')}))[0], qr/^t$/m, 'gd_signal');
like(($through->("SELECT status FROM gd_await($waiting, '10s', 'terminal')"))[0], qr/^done$/m,
	'the signalled instance ran to its end');

# The Python client, through the pooler: it sees the pooler, and prepares nothing.
my $script = $node->basedir . '/pooled_client.py';
PostgreSQL::Test::Utils::append_to_file($script, q{
import sys
from gen_durable import Client
with Client(sys.argv[1]) as client:
    print("pooler", client.connection.prepare_threshold is None)
    ids = [client.insert("pooled", {"n": n}, step="wait", correlation_key=f"py-{n}") for n in range(20)]
    print("signalled", sum(bool(client.signal(f"py-{n}", "go")) for n in range(20)))
    print("done", sum(client.wait(i, timeout=20, until="terminal").status == "done" for i in ids))
});
($out, my $err) = run_command([ '/usr/bin/python3', $script, $pooled ]);
is($out, "pooler True\nsignalled 20\ndone 20", 'the Python client through the pooler: 20 of each call')
  or diag $err;

# The Node.js client, through the pooler.
$script = $node->basedir . '/pooled_client.js';
PostgreSQL::Test::Utils::append_to_file($script, q{
const { Client } = require(process.env.GD_NODE_CLIENT);
(async () => {
  const client = await Client.connect(process.argv[2]);
  const ids = [];
  for (let n = 0; n < 20; n++) ids.push(await client.insert('pooled', { n }, { step: 'wait', correlationKey: `js-${n}` }));
  let signalled = 0, done = 0;
  for (let n = 0; n < 20; n++) if (await client.signal(`js-${n}`, 'go')) signalled++;
  for (const id of ids) if ((await client.wait(id, { timeout: 20, until: 'terminal' })).status === 'done') done++;
  console.log(`signalled ${signalled}\ndone ${done}`);
  await client.end();
})().catch((e) => { console.error(e); process.exit(1); });
});
{
	local $ENV{GD_NODE_CLIENT} = $node_client;
	($out, $err) = run_command([ 'node', $script, $pooled_url ]);
}
is($out, "signalled 20\ndone 20", 'the Node.js client through the pooler') or diag $err;

# Workers: claims and completions through the pooler.
my $handlers = $node->basedir . '/pooled_handlers.py';
PostgreSQL::Test::Utils::append_to_file($handlers, q{
from gen_durable import next_step

def charge(state, ctx):
    ctx.connection.execute("INSERT INTO charges VALUES (%s, 'python')", [ctx.id])
    return next_step("finish", {**state, "charged": True})

HANDLERS = {("pooled", "charge"): charge}
});
my $js_worker = $node->basedir . '/pooled_worker.js';
PostgreSQL::Test::Utils::append_to_file($js_worker, q{
const { Worker, nextStep } = require(process.env.GD_NODE_CLIENT);
const worker = new Worker(process.argv[2], {
  queues: ['pay'], wait: 30, concurrency: 2, name: 'js',
  handlers: {
    'pooled/charge': async (state, ctx) => {
      await ctx.connection.query("INSERT INTO charges VALUES ($1, 'node')", [ctx.id]);
      return nextStep('finish', { ...state, charged: true });
    },
  },
});
worker.run().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
});

sub orders
{
	my ($n) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(gd_insert('pooled', jsonb_build_object('n', g))::text, ',') FROM generate_series(1, $n) g");
}

sub all_charged
{
	my ($ids, $label) = @_;
	my $n = scalar split /,/, $ids;
	return ok($node->poll_query_until('postgres',
			"SELECT count(*) = $n FROM gd.instances WHERE id IN ($ids) AND status = 'done' AND (state->>'charged')::boolean"),
		"$label: all $n orders charged and done");
}

# Start a worker and wait until both its lanes' claims wait in the server; returns its IPC::Run handle and stderr.
sub start_worker
{
	my ($name, @command) = @_;
	my $stderr = '';
	my $h = IPC::Run::start(\@command, '>', \my $stdout, '2>', \$stderr);
	ok($node->poll_query_until('postgres',
			"SELECT count(*) = 2 FROM pg_stat_activity WHERE application_name = 'gd worker $name'"
			  . " AND state = 'active' AND query LIKE '%gd_claim%'"),
		"worker $name: its two lanes' claims wait in the server");
	return ($h, \$stderr);
}

my $notified = q{SELECT count FROM gd.stats WHERE event = 'work_notified'};
my $notified_before = $node->safe_psql('postgres', $notified);
for my $worker (
	[ 'python', @python_worker, '--dsn', $pooled, '--queue', 'pay', '--wait', 30, '--concurrency', 2,
		'--handlers', $handlers, '--name', 'python' ],
	[ 'js', 'node', $js_worker, $pooled_url ])
{
	my ($name, @command) = @$worker;
	local $ENV{GD_NODE_CLIENT} = $node_client;
	my ($h, $stderr) = start_worker($name, @command);
	my $t0 = time();
	all_charged(orders(10), "$name worker through the pooler");
	my $elapsed = time() - $t0;
	cmp_ok($elapsed, '<', 15, sprintf('%s: woken by the commits (%.1f s; the wait is 30 s)', $name, $elapsed));
	$t0 = time();
	$h->signal('TERM');
	$h->finish;
	is($h->result(0), 0, "$name worker drains and exits 0") or diag $$stderr;
	cmp_ok(time() - $t0, '<', 10, "$name: SIGTERM cancels the waiting claims (the wait is 30 s)");
}
is($node->safe_psql('postgres', $notified), $notified_before, 'no NOTIFY sent: no session listens');
is($node->safe_psql('postgres', 'SELECT count(*) FROM charges'),
	$node->safe_psql('postgres', "SELECT count(*) FROM gd.instances WHERE state ? 'charged'"),
	'every charge written once, with its outcome');

$bouncer->kill_kill;
$node->stop;
done_testing();
