# The engine's statements are never compiled by the JIT (src/kept_plans.cpp,
# gd_claim's among them, and gd_cancel's SET clause): a generic plan's LIMIT
# $n is costed as a tenth of the rows, so with a backlog every pick would look
# worth compiling, and compiling takes longer than running it many times over.  Here jit_above_cost is low enough for a backlog
# of 20,000 rows to cross it, as 1,000,000 do with the default settings;
# pg_stat_statements tells which statements were compiled.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $node = GdTest::start_node('no_jit',
	shared_preload_libraries  => 'gen_durable,pg_stat_statements',
	'pg_stat_statements.track' => 'all',
	jit                       => 'on',
	jit_above_cost            => 100,
	jit_inline_above_cost     => -1,
	jit_optimize_above_cost   => -1);
$node->safe_psql('postgres', q{
	CREATE EXTENSION gen_durable;
	CREATE EXTENSION pg_stat_statements;
	CREATE TABLE ledger (instance_id bigint PRIMARY KEY);
	CREATE FUNCTION work(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
	BEGIN
	    INSERT INTO ledger VALUES (ctx.id);
	    RETURN gd_done();
	END $$;
	SELECT gd_define_fsm('inside', initial => 'work');
	SELECT gd_define_step('inside', 'work', 'work(jsonb, gd.context)'::regprocedure);
	SELECT gd_define_fsm('outside', initial => 'work');
	SELECT gd_define_step('outside', 'work', handler => NULL);
	-- The backlog: scheduled a day ahead, for both paths.
	SELECT count(*) FROM gd_insert_all('inside', (SELECT jsonb_agg('{"schedule_in": "1 day"}'::jsonb) FROM generate_series(1, 10000)));
	SELECT count(*) FROM gd_insert_all('outside', (SELECT jsonb_agg('{"schedule_in": "1 day"}'::jsonb) FROM generate_series(1, 10000)));
	VACUUM ANALYZE gd._instances;
});

# The control: a user's query over the backlog is compiled here, so the
# assertions below can fail.
$node->safe_psql('postgres', q{SELECT pg_stat_statements_reset()});
$node->safe_psql('postgres', q{SELECT count(*) AS jit_control FROM gd.instances, generate_series(1, 10) WHERE state ? 'n'});
my $control = $node->safe_psql('postgres',
	q{SELECT sum(jit_functions) FROM pg_stat_statements WHERE query LIKE '%jit_control%' AND query NOT LIKE '%pg_stat_statements%'});
plan skip_all => 'the server has no JIT provider (llvmjit) to compile with' unless $control && $control > 0;

$node->safe_psql('postgres', q{SELECT pg_stat_statements_reset()});
# In the database: 200 steps, picked in rounds over the backlog.
my $ids = $node->safe_psql('postgres',
	q{SELECT string_agg(id::text, ',') FROM gd_insert_all('inside', (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, 200))) id});
ok(GdTest::poll_done($node, $ids, 200), 'the in-database steps ran');
# Outside: claims and completions over the backlog.
$node->safe_psql('postgres', q{SELECT count(*) FROM gd_insert_all('outside', (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, 50)))});
my $completed = 0;
for my $round (1 .. 5)
{
	$completed += $node->safe_psql('postgres', q{
		WITH c AS MATERIALIZED (SELECT * FROM gd_claim('default', 'w', 10))
		SELECT count(*) FILTER (WHERE completed)
		  FROM gd_complete_all(ARRAY(SELECT id FROM c ORDER BY id), ARRAY(SELECT lease_token FROM c ORDER BY id),
		                       ARRAY(SELECT gd_done() FROM c ORDER BY id))});
}
is($completed, 50, 'the external steps were claimed and completed');
# gd_cancel walks the instance's tree of descendants.
is($node->safe_psql('postgres', q{SELECT gd_cancel(min(id)) FROM gd.instances WHERE fsm = 'outside' AND status = 'runnable'}),
	't', 'a scheduled instance was cancelled');

my $compiled = $node->safe_psql('postgres', q{
	SELECT string_agg(left(regexp_replace(query, '\s+', ' ', 'g'), 120) || ' (' || jit_functions || ' functions)', E'\n')
	  FROM pg_stat_statements
	 WHERE jit_functions > 0 AND query ~ 'gd\._instances' AND query NOT LIKE '%pg_stat_statements%'});
is($compiled, '', 'no statement of the engine on gd._instances was compiled by the JIT');
# The executors' pick (of in-database steps) and gd_claim's (of external ones) were seen.
my $seen = $node->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE query ~ 'NOT i\.external') || ' ' || count(*) FILTER (WHERE query !~ 'NOT i\.external')
	  FROM pg_stat_statements WHERE query ~ 'unnest\(\$3::int4\[\]' AND query ~ 'SKIP LOCKED'});
is($seen, '1 1', 'the pick and the claim were among the statements seen');

$node->stop;
done_testing();
