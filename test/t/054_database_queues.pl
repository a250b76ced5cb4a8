# Several engines side by side on one server: gen_durable.queues entries
# qualified by a served database ("billing.invoices:2") are that database's
# alone, and win there over an unqualified entry of the same queue; the
# others serve every database. Two databases with disjoint queues: each runs
# its own queues' steps and not the other's; gd.workers, gd.queue_stats and
# gd.configured_queues() say which database each belongs to; a reload moves
# a queue from one database to the other without a restart.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $node = GdTest::start_node('engines', 'gen_durable.database' => 'app, billing',
	'gen_durable.queues' => 'default:1, app.mail:1, billing.invoices:2, billing.default:0');
for my $db ('app', 'billing')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, q{
CREATE EXTENSION gen_durable;
CREATE FUNCTION finish(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
SELECT gd_define_fsm('send', initial => 'go', queue => 'mail', steps => '{"go": {"handler": "public.finish(jsonb, gd.context)"}}');
SELECT gd_define_fsm('bill', initial => 'go', queue => 'invoices', steps => '{"go": {"handler": "public.finish(jsonb, gd.context)"}}');
SELECT gd_define_fsm('misc', initial => 'go', steps => '{"go": {"handler": "public.finish(jsonb, gd.context)"}}');
});
}

# The executors of each database, as "queue:count" in queue order.
sub executors_of
{
	my ($db) = @_;
	return $node->safe_psql('app', qq{
SELECT coalesce(string_agg(queue || ':' || n, ', ' ORDER BY queue), '')
  FROM (SELECT queue, count(*) AS n FROM gd.workers WHERE kind = 'executor' AND database = '$db' GROUP BY queue) e});
}

my $plan = q{SELECT (SELECT coalesce(string_agg(queue || ':' || n, ', ' ORDER BY queue), '') FROM (SELECT queue, count(*) AS n
                  FROM gd.workers WHERE kind = 'executor' AND database = 'app' GROUP BY queue) e)};
ok($node->poll_query_until('app', "$plan = 'default:1, mail:1'"), 'app: its own mail queue and the shared default')
  or diag executors_of('app');
is(executors_of('app'), 'default:1, mail:1', 'app: default and mail');
ok($node->poll_query_until('app', q{SELECT count(*) = 2 FROM gd.workers WHERE kind = 'executor' AND database = 'billing'}),
	'billing: its executors started');
is(executors_of('billing'), 'invoices:2', 'billing: invoices, and no default (billing.default:0 wins there)');
is($node->safe_psql('app', 'SELECT array_to_string(gd.configured_queues(), \',\')'), 'mail,default',
	'gd.configured_queues() in app');
is($node->safe_psql('billing', 'SELECT array_to_string(gd.configured_queues(), \',\')'), 'invoices,default',
	'gd.configured_queues() in billing');

# Each database runs the steps of its own queues only.
my %ids;
for my $db ('app', 'billing')
{
	$ids{$db}{$_} = $node->safe_psql($db, "SELECT gd_insert('$_')") for qw(send bill misc);
}
my $done = sub {
	my ($db, $fsm) = @_;
	return "SELECT status = 'done' FROM gd.instances WHERE id = $ids{$db}{$fsm}";
};
ok($node->poll_query_until('app', $done->('app', 'send')), 'app: its mail step ran');
ok($node->poll_query_until('app', $done->('app', 'misc')), 'app: its default step ran');
ok($node->poll_query_until('billing', $done->('billing', 'bill')), 'billing: its invoices step ran');
sleep 1;
is($node->safe_psql('app', "SELECT status FROM gd.instances WHERE id = $ids{app}{bill}"), 'runnable',
	'app: no executor for invoices');
is($node->safe_psql('billing',
		"SELECT string_agg(status, ',' ORDER BY id) FROM gd.instances WHERE id IN ($ids{billing}{send}, $ids{billing}{misc})"),
	'runnable,runnable', 'billing: none for mail, none for default');
is($node->safe_psql('billing', q{SELECT string_agg(queue || ':' || executors, ', ' ORDER BY queue) FROM gd.queue_stats
                                  WHERE queue IN ('invoices', 'mail', 'default')}),
	'default:0, invoices:2, mail:0', 'gd.queue_stats: the executors of this database');

# A reload moves invoices to app, and gives billing the shared default again.
$node->append_conf('postgresql.conf', "gen_durable.queues = 'default:1, app.mail:1, app.invoices:1'");
$node->reload;
ok($node->poll_query_until('app', "$plan = 'default:1, invoices:1, mail:1'"), 'app: invoices moved in')
  or diag executors_of('app');
ok($node->poll_query_until('app', q{SELECT string_agg(queue, ',' ORDER BY queue) = 'default'
                                           FROM gd.workers WHERE kind = 'executor' AND database = 'billing'}),
	'billing: invoices moved out, default back') or diag executors_of('billing');
ok($node->poll_query_until('app', $done->('app', 'bill')), 'app: the invoice waiting there ran');
ok($node->poll_query_until('billing', $done->('billing', 'misc')), 'billing: the default step ran');
is($node->safe_psql('billing', "SELECT status FROM gd.instances WHERE id = $ids{billing}{send}"), 'runnable',
	'billing: still no executor for mail');

$node->stop;
done_testing();
