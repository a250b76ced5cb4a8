# Batch sizing (src/executor.cpp): an executor runs up to batch_size steps
# per transaction, but after a batch of slow steps only as many as fit in
# gen_durable.batch_time at that pace, so slow steps do not hold each other's
# commit back; an idle executor starts again at batch_size.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $node = GdTest::start_node('batch_time', 'gen_durable.queues' => 'default:1',
	'gen_durable.batch_size' => 4, 'gen_durable.batch_time' => '20ms');
$node->safe_psql('postgres', q{
	CREATE EXTENSION gen_durable;
	CREATE TABLE ledger (instance_id bigint PRIMARY KEY, kind text, xid bigint);
	CREATE FUNCTION work(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
	BEGIN
	    PERFORM pg_sleep((state->>'sleep')::float8);
	    INSERT INTO ledger VALUES (ctx.id, state->>'kind', txid_current());
	    RETURN gd_done();
	END $$;
	SELECT gd_define_fsm('timed', initial => 'work');
	SELECT gd_define_step('timed', 'work', 'work(jsonb, gd.context)'::regprocedure);
});

# Steps per transaction of one kind, in commit order: "4,1,1,...".
sub batches
{
	my ($kind) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT string_agg(n::text, ',' ORDER BY first_id) FROM (
		    SELECT count(*) AS n, min(instance_id) AS first_id FROM ledger WHERE kind = '$kind' GROUP BY xid) b});
}

# 12 steps of 50 ms, runnable at once: the first batch is batch_size (4
# steps, 200 ms), then one step fits in 20 ms at that pace: one per commit.
$node->safe_psql('postgres', q{
	SELECT count(gd_insert('timed', '{"sleep": 0.05, "kind": "slow"}')) FROM generate_series(1, 12)});
$node->poll_query_until('postgres', q{SELECT count(*) = 12 FROM ledger WHERE kind = 'slow'})
  or die 'the slow steps did not run';
is(batches('slow'), '4,1,1,1,1,1,1,1,1', 'after a slow batch, slow steps commit one by one');

# 12 quick steps: at their pace batch_size fit again (the first commit may
# still be of one, if the executor's next round began before they came).
$node->safe_psql('postgres', q{
	SELECT count(gd_insert('timed', '{"sleep": 0, "kind": "fast"}')) FROM generate_series(1, 12)});
$node->poll_query_until('postgres', q{SELECT count(*) = 12 FROM ledger WHERE kind = 'fast'})
  or die 'the fast steps did not run';
# (A loaded machine may cut a batch short: what matters is that they share commits again.)
my @fast = split /,/, batches('fast');
cmp_ok(scalar(@fast), '<=', 6, 'quick steps share a commit again (' . join(',', @fast) . ')');

$node->stop;
done_testing();
