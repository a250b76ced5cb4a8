# GdTest: the setup the gen_durable TAP files (test/t/*.pl) share, and
# nothing else: a started node with gen_durable preloaded and the usual
# gen_durable.* settings, the reference external worker's prerequisites
# (skip_all when missing), and the "are these instances done" query/poll.
# check.sh and run_tap.sh copy this file next to the .pl files and put that
# directory on PERL5LIB.
package GdTest;

use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

# The settings every test node starts from, in postgresql.conf order.
# (fsync = off is also Cluster.pm's own default; lc_messages = 'C' keeps the
# server's messages matchable.)
my @DEFAULT_CONF = (
	shared_preload_libraries  => 'gen_durable',
	'gen_durable.database'    => 'postgres',
	'gen_durable.queues'      => 'default:1',
	'gen_durable.poll_interval' => '200ms',
	max_worker_processes      => 16,
	fsync                     => 'off',
	lc_messages               => 'C',
);

# start_node($name, %settings): init, configure and start a node.
# %settings override the defaults above (a value of undef drops a default)
# or add settings (written after the defaults, in sorted order); every value
# is written single-quoted.  The key '-init' (a hash ref) is passed to
# $node->init, e.g. '-init' => { allows_streaming => 1 }; '-install_path'
# runs the node on another PostgreSQL installation (Cluster.pm's install_path).
sub start_node
{
	my ($name, %settings) = @_;
	my $init = delete $settings{'-init'} // {};
	my $install_path = delete $settings{'-install_path'};

	my @order;
	my %conf;
	for (my $i = 0; $i < @DEFAULT_CONF; $i += 2)
	{
		push @order, $DEFAULT_CONF[$i];
		$conf{ $DEFAULT_CONF[$i] } = $DEFAULT_CONF[ $i + 1 ];
	}
	for my $k (sort keys %settings)
	{
		push @order, $k unless exists $conf{$k};
		$conf{$k} = $settings{$k};
	}

	my $text = "\n";
	for my $k (@order)
	{
		next unless defined $conf{$k};
		(my $v = $conf{$k}) =~ s/'/''/g;
		$text .= "$k = '$v'\n";
	}

	my $node = PostgreSQL::Test::Cluster->new($name, $install_path ? (install_path => $install_path) : ());
	$node->init(%$init);
	$node->append_conf('postgresql.conf', $text);
	$node->start;
	return $node;
}

# project_file($relative): a file or directory of the project (clients/,
# examples/, web/, README.md, ...): in check.sh's scratch copy of it
# (GD_PROJECT_DIR), else in the checkout TESTDIR names (PGXS's `make
# installcheck` runs the TAP files there).
sub project_file
{
	my ($relative) = @_;
	return ($ENV{GD_PROJECT_DIR} // $ENV{TESTDIR}) . "/$relative";
}

# external_worker(): the command that runs the Python client's external
# worker (clients/python, put on PYTHONPATH here), to be followed by its
# options: ('/usr/bin/python3', '-m', 'gen_durable', 'worker').
sub external_worker
{
	my $python = '/usr/bin/python3';
	my $client = GdTest::project_file("clients/python");
	die "no Python client at $client" unless -d "$client/gen_durable";
	die 'python3-psycopg is not installed' unless system($python, '-c', 'import psycopg') == 0;
	$ENV{PYTHONPATH} = $client;
	return ($python, '-m', 'gen_durable', 'worker');
}

# run_shop_example($node, @worker_command): load examples/shop.sql into a node
# whose gen_durable.queues serves 'shop', insert three orders (one paid at
# once, one whose provider fails its first attempt, one with nothing to
# charge), run the example's worker until they end and stop it.  Returns
# their ends, "status result" per line, and the receipts written.
sub run_shop_example
{
	my ($node, @worker_command) = @_;
	my $examples = GdTest::project_file("examples");
	$node->safe_psql('postgres', PostgreSQL::Test::Utils::slurp_file("$examples/shop.sql"));
	my $ids = $node->safe_psql('postgres', q{
SELECT string_agg(gd_insert('shop_order', o)::text, ',' ORDER BY n)
  FROM unnest(ARRAY['{"amount": 5}', '{"amount": 7, "card": "flaky"}', '{"amount": 0}']::jsonb[])
       WITH ORDINALITY AS x(o, n)});
	my $worker = IPC::Run::start(\@worker_command, '>', \my $out, '2>', \my $err);
	my $ended = $node->poll_query_until('postgres',
		"SELECT count(*) = 3 FROM gd.instances WHERE id IN ($ids) AND status IN ('done', 'failed')");
	$worker->signal('TERM');
	$worker->finish;
	diag("the example's worker said:\n$out$err") unless $ended;
	return $node->safe_psql('postgres', qq{
SELECT string_agg(i.status || ' ' || coalesce(i.result::text, i.error->>'kind'), E'\n' ORDER BY i.id)
       || E'\nreceipts ' || (SELECT count(*) FROM shop.receipts)
  FROM gd.instances i WHERE i.id IN ($ids)});
}

# done_query($ids): how many of the instances $ids (a comma list) are done.
sub done_query
{
	my ($ids) = @_;
	return "SELECT count(*) FROM gd.instances WHERE id IN ($ids) AND status = 'done'";
}

# poll_done($node, $ids, $n): true once $n of the instances $ids are done
# (within PostgreSQL::Test::Utils::timeout_default).
sub poll_done
{
	my ($node, $ids, $n) = @_;
	return $node->poll_query_until('postgres', done_query($ids), $n);
}

# poll_through_restart($node, $sql, $want): true once $sql returns $want, while
# the server may be crash-restarting (within timeout_default).  A psql that
# finds the server restarting may exit before it reads the query, and
# IPC::Run's write to it then dies on a broken pipe: poll_query_until would
# die with it.
sub poll_through_restart
{
	my ($node, $sql, $want) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		my ($rc, $out) = eval { $node->psql('postgres', $sql) };
		return 1 if defined $rc && $rc == 0 && $out eq $want;
		usleep(100_000);
	}
	return 0;
}

# A gate the crash tests' handlers wait at (a table gate(open boolean) their
# handler polls with pg_sleep while it is closed), and their ledger (a table
# ledger: a row per step run).
sub gate_set
{
	my ($node, $open) = @_;
	$node->safe_psql('postgres', "UPDATE gate SET open = $open");
}

# ok() once $executors executors sleep inside steps ($what: "steps", "batch calls") at the closed gate.
sub gate_all_held
{
	my ($node, $executors, $what, $label) = @_;
	return ok( $node->poll_query_until('postgres', q{
SELECT count(*) FROM gd.workers w JOIN pg_stat_activity a USING (pid)
 WHERE w.kind = 'executor' AND w.instance_id IS NOT NULL AND a.wait_event = 'PgSleep'}, $executors),
		"$label: the $executors executors are inside $what, held at the gate");
}

# Open the gate in pulses of $pulse_us until at least $rows ledger rows are
# committed (within 30 s); it is closed again on return.  The rows committed.
sub gate_run_until
{
	my ($node, $rows, $pulse_us) = @_;
	my $deadline = time() + 30;
	my $count = 0;
	while (time() < $deadline)
	{
		gate_set($node, 'true');
		usleep($pulse_us);
		gate_set($node, 'false');
		$count = $node->safe_psql('postgres', 'SELECT count(*) FROM ledger');
		last if $count >= $rows;
	}
	return $count;
}

# gd_cancel($id) in a session of its own, which may wait (for the row a round
# holds): its harness (->{harness}->finish to wait) and its output.
sub start_cancel
{
	my ($node, $id) = @_;
	my %run = (out => '', err => '');
	$run{harness} = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-c', "SELECT gd_cancel($id, 'changed my mind')" ],
		'>', \$run{out}, '2>', \$run{err});
	return \%run;
}

1;
