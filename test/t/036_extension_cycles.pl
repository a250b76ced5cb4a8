# DROP EXTENSION and CREATE EXTENSION, again and again, while executors,
# the reaper and the garbage collector run: their rounds fail while the
# extension is gone (logged, retried), never crash the server, and serve the
# extension once it is back.  (A round that found gd.context recreated but
# dropped again under its look-up once freed the cached descriptor twice.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $node = GdTest::start_node('cycles',
	'gen_durable.queues' => 'default:2, mail:1', 'gen_durable.poll_interval' => '10ms');

my $setup = q{
	CREATE EXTENSION gen_durable;
	CREATE FUNCTION work(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
	SELECT gd_define_fsm('cycle', initial => 'work');
	SELECT gd_define_step('cycle', 'work', 'work(jsonb, gd.context)'::regprocedure);
	SELECT count(gd_insert('cycle')) FROM generate_series(1, 20);
};
for my $cycle (1 .. 30)
{
	$node->safe_psql('postgres', $setup);
	$node->safe_psql('postgres', 'DROP EXTENSION gen_durable CASCADE');    # and work(), built on its types
}

my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal/, 'no engine process crashed across 30 drop/create cycles');

$node->safe_psql('postgres', $setup);
my $ids = $node->safe_psql('postgres', q{SELECT string_agg(id::text, ',') FROM gd.instances});
ok(GdTest::poll_done($node, $ids, 20), 'the extension created once more is served');

$node->stop;
done_testing();
