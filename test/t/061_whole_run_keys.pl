# Concurrency keys of the run scope, under the background engine and a
# crash: orders of one customer (limit 1, scope 'run') run one after
# another, whole — through a timed wait on a signal, a wait on a child,
# retries of a failing step, an immediate stop mid-run, and a gd_retry of
# the orders a step stopped — while seats (limit 1, scope 'step', the same
# FSM) interleave, which shows the check below would see an overlap.
#
# The check: each step of a keyed order writes a ledger row (in its own
# transaction: a step rolled back by the crash leaves none).  Per key, in
# time order, the rows fall into stretches of one order each; under a key of
# the run scope every stretch ends with the order's last step of a run
# (ship: done, or stopped for the gd_retry), so no other order's step ran
# between an order's first step and its end.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

$PostgreSQL::Test::Utils::timeout_default = 120;

my $customers = 8;
my $orders    = 96;    # per kind: orders under cust:N, and as many under seat:N

my $node = GdTest::start_node(
	'whole_run_keys',
	'gen_durable.queues'          => 'default:2',
	'gen_durable.reaper_interval' => '100ms',
	'gen_durable.batch_size'      => 4,
);

$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (key text, instance bigint, step text, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION order_step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF state ? 'key' THEN
        INSERT INTO ledger (key, instance, step) VALUES (state->>'key', ctx.id, ctx.step);
    END IF;
    PERFORM pg_sleep(0.002);
    CASE ctx.step
        WHEN 'reserve' THEN
            RETURN gd_wait_signal(ARRAY['paid'], timeout => '30ms', then_step => 'pack');
        WHEN 'pack' THEN
            IF ctx.attempt = 1 AND (state->>'n')::int % 3 = 0 THEN
                RAISE EXCEPTION 'packing machine jammed';
            END IF;
            RETURN gd_spawn(jsonb_build_array(jsonb_build_object('fsm', 'box')), 'ship');
        WHEN 'ship' THEN
            IF (state->>'n')::int % 5 = 0
               AND (SELECT count(*) FROM ledger l WHERE l.instance = ctx.id AND l.step = 'ship') = 1 THEN
                RETURN gd_stop('{"why": "carrier refused"}');
            END IF;
            RETURN gd_done();
        ELSE
            RETURN gd_done();
    END CASE;
END $$;
SELECT gd_define_fsm('order', initial => 'reserve', queue => 'default',
       steps => '{"reserve": {"handler": "public.order_step(jsonb, gd.context)"},
                  "pack": {"handler": "public.order_step(jsonb, gd.context)", "backoff": "10ms"},
                  "ship": {"handler": "public.order_step(jsonb, gd.context)"}}');
SELECT gd_define_fsm('box', initial => 'fold', queue => 'default',
       steps => '{"fold": {"handler": "public.order_step(jsonb, gd.context)"}}');
SELECT gd_set_concurrency_limit('cust', 1, scope => 'run');
SELECT gd_set_concurrency_limit('seat', 1);
});

# Stretches of one order under `kind`'s keys that end in another step than
# ship: an order's run interleaved with another's.
sub interleaved
{
	my ($kind) = @_;
	return $node->safe_psql('postgres', qq{
SELECT count(*) FROM (
    SELECT key, instance, step,
           lead(instance) OVER (PARTITION BY key ORDER BY at) AS next_instance
      FROM ledger WHERE key LIKE '$kind:%') s
 WHERE next_instance IS NOT NULL AND next_instance <> instance AND step <> 'ship'});
}

my $all = "SELECT count(*) FROM gd.instances WHERE fsm = 'order'";
$node->safe_psql('postgres', qq{
SELECT count(gd_insert('order', jsonb_build_object('n', g, 'key', kind || ':' || (g % $customers)),
                       concurrency_key => kind || ':' || (g % $customers)))
  FROM generate_series(1, $orders) g, unnest('{cust,seat}'::text[]) kind});

# An immediate stop once a third of the orders have ended.
ok( $node->poll_query_until('postgres',
		"SELECT count(*) >= " . int(2 * $orders / 3) . " FROM gd.instances WHERE fsm = 'order' AND status IN ('done', 'failed')"),
	'a third of the orders ended before the immediate stop');
$node->stop('immediate');
$node->start;

# Every order ends; those the carrier refused are retried by hand, once each
# has failed (a retried order waits for its customer's order in flight).
my $stopped = int($orders / 5) * 2;
ok($node->poll_query_until('postgres', "SELECT count(*) FROM gd.instances WHERE fsm = 'order' AND status = 'failed'",
		$stopped),
	"the $stopped orders the carrier refused fail");
is($node->safe_psql('postgres', "$all AND status NOT IN ('done', 'failed')"), '0', 'every other order is done');
is($node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE gd_retry(id)) FROM gd.instances WHERE fsm = 'order' AND status = 'failed'"),
	$stopped, 'gd_retry takes each failed order back');
ok($node->poll_query_until('postgres', "$all AND status = 'done'", 2 * $orders), 'every order is done');

is(interleaved('cust'), '0', 'no order of a customer ran a step inside another\'s run (scope run)');
cmp_ok(interleaved('seat'), '>', 0, 'seats of the step scope interleave (the check sees an overlap)');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM (SELECT instance FROM ledger WHERE key LIKE 'cust:%' GROUP BY instance
                       HAVING count(*) FILTER (WHERE step = 'reserve') <> 1
                           OR count(*) FILTER (WHERE step = 'ship') NOT IN (1, 2)) odd}),
	'0', 'each order reserved once and shipped once, or twice when retried');
is($node->safe_psql('postgres', "SELECT count(*) FROM gd.instances WHERE gated"), '0', 'no instance is left waiting');

$node->stop;
done_testing();
