# DROP EXTENSION and CREATE EXTENSION, again and again, while executors,
# the reaper and the garbage collector run: each round holds the extension's
# lock, so a DROP waits for the round in hand and never deadlocks with it; the
# workers wait while the extension is gone, never crash the server, and serve
# the extension once it is back.  (A round that found gd.context recreated but
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
unlike($log, qr/deadlock detected/, 'no DROP EXTENSION deadlocked with a round');
# Nor did a round find the extension half made or half dropped.
my @round_errors = $log =~ /^.*(?:ERROR|firing schedules raised).*$/mg;
is(scalar(@round_errors), 0, 'no round failed across the cycles') or diag(join("\n", splice(@round_errors, 0, 5)));

# A step in hand when DROP EXTENSION comes: the DROP waits for its round,
# which commits the step's effect, then drops.
$node->safe_psql('postgres', $setup . q{
	CREATE TABLE effects (at timestamptz);
	CREATE FUNCTION slow(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$
		SELECT pg_sleep(1); INSERT INTO effects VALUES (clock_timestamp()); SELECT gd_done() $$;
	SELECT gd_define_fsm('slow', initial => 'work');
	SELECT gd_define_step('slow', 'work', 'slow(jsonb, gd.context)'::regprocedure);
	SELECT gd_insert('slow');
});
$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'})
	or die 'the slow step never started';
my ($rc, $out, $err) = $node->psql('postgres', 'DROP EXTENSION gen_durable CASCADE; SELECT clock_timestamp()');
is($rc, 0, 'DROP EXTENSION under a running step succeeds') or diag($err);
is($node->safe_psql('postgres', "SELECT count(*) FROM effects WHERE at < '$out'"), '1',
	'the step finished and committed before the DROP went on');
$node->safe_psql('postgres', 'DROP TABLE effects');

# A schema gd made before the extension (another role's, say): refused, saying so.
$node->safe_psql('postgres', q{CREATE ROLE early; CREATE SCHEMA gd AUTHORIZATION early});
($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\nCREATE EXTENSION gen_durable");
like($err, qr/ERROR:  42P06: gen_durable: schema "gd" already exists\nDETAIL:  It belongs to role early;/,
	'CREATE EXTENSION over an existing schema gd says whose it is');
$node->safe_psql('postgres', q{DROP SCHEMA gd; DROP ROLE early});

$node->safe_psql('postgres', $setup);
my $ids = $node->safe_psql('postgres', q{SELECT string_agg(id::text, ',') FROM gd.instances});
ok(GdTest::poll_done($node, $ids, 20), 'the extension created once more is served');

$node->stop;
done_testing();
