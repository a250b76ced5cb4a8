# Pick order with the queue's frontier (src/frontier.cpp): a pick starts at
# each priority's mark instead of rescanning the queue from the front, but
# new work that sorts first (a higher priority) is picked as soon as its
# commit wakes the executor, and a row left behind the marks without any
# announcement is picked by the scan from the front that comes about once a
# second.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $node = GdTest::start_node('pick', 'gen_durable.batch_size' => 4);
$node->safe_psql('postgres', q{
	CREATE EXTENSION gen_durable;
	CREATE TABLE ledger (instance_id bigint PRIMARY KEY, priority int, seq bigserial);
	CREATE FUNCTION work(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
	BEGIN
	    INSERT INTO ledger (instance_id, priority) VALUES (ctx.id, (state->>'priority')::int);
	    PERFORM pg_sleep(0.02);
	    RETURN gd_done();
	END $$;
	SELECT gd_define_fsm('ordered', initial => 'work');
	SELECT gd_define_step('ordered', 'work', 'work(jsonb, gd.context)'::regprocedure);
});

# (a) 200 jobs of priority 10 (20 ms each, 4 per round); once 20 have run,
# one of priority 0 arrives: it runs in the round after the one in hand (at
# most 8 steps later), not after the backlog nor after the restart second
# (~50 steps).
$node->safe_psql('postgres', q{
	SELECT count(gd_insert('ordered', '{"priority": 10}', priority => 10)) FROM generate_series(1, 200)});
$node->poll_query_until('postgres', 'SELECT count(*) >= 20 FROM ledger')
  or die 'the backlog did not start';
my ($urgent, $before) = split /\|/, $node->safe_psql('postgres',
	q{SELECT gd_insert('ordered', '{"priority": 0}', priority => 0), (SELECT count(*) FROM ledger)});
GdTest::poll_done($node, $urgent, 1) or die 'the urgent job did not run';
my $overtaken = $node->safe_psql('postgres',
	"SELECT count(*) FROM ledger WHERE seq < (SELECT seq FROM ledger WHERE instance_id = $urgent)") - $before;
cmp_ok($overtaken, '<=', 12,
	"a higher priority is picked as soon as it is committed ($overtaken steps of the backlog ran before it)");

# (b) A row made runnable behind the marks by hand (no announcement: a
# direct UPDATE; eligible as early as the backlog) is picked within about a
# second, before the backlog ends.
my $behind = $node->safe_psql('postgres', 'DELETE FROM ledger WHERE seq = 1 RETURNING instance_id');
$node->safe_psql('postgres', qq{
	UPDATE gd._instances SET status = 'runnable', finished_at = NULL, result = NULL, eligible_at = created_at
	 WHERE id = $behind});
$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ledger WHERE instance_id = $behind")
  or die 'the row behind the marks never ran';
my $left = $node->safe_psql('postgres',
	q{SELECT count(*) FROM gd.instances WHERE fsm = 'ordered' AND status = 'runnable'});
cmp_ok($left, '>', 0, "a row behind the marks ran while $left of the backlog still waited");

$node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM gd.instances WHERE fsm = 'ordered' AND status <> 'done'})
  or die 'not all done';
is($node->safe_psql('postgres', 'SELECT count(*) FROM ledger'), '201', 'every job ran once');

$node->stop;
done_testing();
