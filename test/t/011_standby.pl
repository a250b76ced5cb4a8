# A streaming standby with gen_durable preloaded runs no engine (the launcher
# starts only once recovery has finished): no executors, nothing run there,
# while the primary completes its instances. On promotion the standby's engine
# starts, picks up replicated runnable work and serves new instances.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 30;

my $primary = GdTest::start_node(
	'primary',
	'-init'              => { allows_streaming => 1 },
	'gen_durable.queues' => 'default:2',
	max_worker_processes => 32,
	cluster_name         => 'primary',
);

$primary->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (
    instance bigint NOT NULL,
    step     text   NOT NULL,
    node     text   NOT NULL DEFAULT current_setting('cluster_name'),
    UNIQUE (instance, step));
CREATE FUNCTION walk(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
DECLARE
    next_step text := state->'plan'->>ctx.step;
BEGIN
    INSERT INTO ledger (instance, step) VALUES (ctx.id, ctx.step);
    IF next_step IS NULL THEN
        RETURN gd_done(jsonb_build_object('ran_on', current_setting('cluster_name')));
    END IF;
    RETURN gd_next(next_step);
END $$;
SELECT gd_define_fsm('two', 'a', 'default', 1, '{"plan": {"a": "b"}}');
SELECT gd_define_step('two', s, 'walk(jsonb, gd.context)'::regprocedure) FROM unnest('{a,b}'::text[]) s;
-- A queue only the standby will serve (its gen_durable.queues lists it).
SELECT gd_define_fsm('later', 'a', 'standby_only', 1, '{"plan": {"a": "b"}}');
SELECT gd_define_step('later', s, 'walk(jsonb, gd.context)'::regprocedure) FROM unnest('{a,b}'::text[]) s;
});
ok( $primary->poll_query_until('postgres',
		"SELECT count(*) FROM gd.workers WHERE kind = 'executor'", '2'),
	'primary: 2 executors');

$primary->backup('bkp');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'bkp', has_streaming => 1);
$standby->append_conf(
	'postgresql.conf', q{
cluster_name = 'standby'
gen_durable.queues = 'default:2, standby_only:1'
});
$standby->start;

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
	't', 'standby is in recovery');
is($standby->safe_psql('postgres', 'SHOW shared_preload_libraries'),
	'gen_durable', 'standby preloads gen_durable');

# Work on the primary, including an instance on a queue only the standby's
# configuration serves: the primary leaves it runnable.
my $ids = $primary->safe_psql('postgres',
	"SELECT string_agg(gd_insert('two')::text, ',') FROM generate_series(1, 20)");
my $later_id = $primary->safe_psql('postgres', "SELECT gd_insert('later')");
ok( GdTest::poll_done($primary, $ids, 20),
	'primary completes its instances while the standby streams');
$primary->wait_for_catchup($standby);
is( $standby->safe_psql('postgres', GdTest::done_query($ids)),
	'20', 'the standby sees them done (replicated)');
is( $standby->safe_psql('postgres',
		"SELECT status FROM gd.instances WHERE id = $later_id"),
	'runnable', 'the standby_only instance is replicated as runnable');

# Give a (wrongly) started standby engine time to show itself.
usleep(1_000_000);
is($standby->safe_psql('postgres', 'SELECT count(*) FROM gd.workers'),
	'0', 'standby: gd.workers is empty (no launcher, no executors)');
is( $standby->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'gen_durable%'"),
	'0', 'standby: no gen_durable backends in pg_stat_activity');
ok(!$standby->log_contains(qr/gen_durable: launcher started/),
	'standby: the launcher never started');
is( $primary->safe_psql('postgres',
		"SELECT count(*) FROM ledger WHERE node <> 'primary'"),
	'0', 'every step ran on the primary');

# ---------------------------------------------------------------------------
# Promotion
# ---------------------------------------------------------------------------
$standby->promote;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
	'f', 'standby promoted');
ok( $standby->poll_query_until('postgres', q{
SELECT string_agg(queue || ':' || n, ',' ORDER BY queue)
  FROM (SELECT queue, count(*) n FROM gd.workers WHERE kind = 'executor' GROUP BY queue) s},
		'default:2,standby_only:1'),
	'promoted: executors start per its gen_durable.queues');
ok( $standby->poll_query_until('postgres', q{
SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gen_durable executor'}, '3'),
	'promoted: 3 gen_durable executor backends');
is( $standby->safe_psql('postgres',
		"SELECT status || ' ' || (result->>'ran_on') FROM gd_await($later_id, '15s')"),
	'done standby',
	'promoted: the replicated runnable instance completes on the promoted standby');

my $new_id = $standby->safe_psql('postgres', "SELECT gd_insert('two')");
is( $standby->safe_psql('postgres',
		"SELECT status || ' ' || (result->>'ran_on') FROM gd_await($new_id, '15s')"),
	'done standby', 'promoted: an instance inserted there completes');
is( $standby->safe_psql('postgres',
		"SELECT string_agg(step || '\@' || node, ',' ORDER BY step) FROM ledger WHERE instance = $new_id"),
	'a@standby,b@standby', 'promoted: its steps ran there, once each');
is( $primary->safe_psql('postgres',
		"SELECT status FROM gd.instances WHERE id = $later_id"),
	'runnable', 'the old primary still never ran the standby_only instance');

$standby->stop;
$primary->stop;
done_testing();
