# examples/prometheus: every query of queries.yaml runs as a member of
# pg_monitor, returns rows, and has the columns its metrics name (a
# HISTOGRAM column with its _bucket, _sum and _count); a real
# postgres_exporter (Debian's prometheus-postgres-exporter) given that file
# serves the metrics, the steps' histogram buckets among them, with no scrape
# error; and every metric alerts.yaml uses is among them.
use strict;
use warnings;
use HTTP::Tiny;
use IPC::Run;
use Time::HiRes qw(usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use YAML::Tiny;
use GdTest;

my $examples = GdTest::project_file("examples/prometheus");
my $queries = YAML::Tiny->read("$examples/queries.yaml")->[0];
my $alerts = YAML::Tiny->read("$examples/alerts.yaml")->[0];

# Steps of every kind have run, a rate limit held a partition back, a
# concurrency key made one wait, and an external worker claimed a step.
my $node = GdTest::start_node('prometheus', 'gen_durable.queues' => 'default:1',
	'gen_durable.database' => 'postgres, scratch');
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE ROLE gd_monitor LOGIN IN ROLE pg_monitor;
CREATE FUNCTION shop(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'reserve' THEN
        RETURN gd_next('charge');
    END IF;
    IF ctx.attempt = 1 AND (state->>'flaky')::boolean THEN
        RETURN gd_retry('{"reason": "busy"}', backoff => '0s');
    END IF;
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('shop', initial => 'reserve',
                     steps => '{"reserve": {"handler": "public.shop(jsonb, gd.context)"},
                                "charge": {"handler": "public.shop(jsonb, gd.context)"}}');
SELECT gd_define_fsm('outside', initial => 'call', queue => 'external', steps => '{"call": {}}');
SELECT gd_set_rate_limit('api', rate => 1, per => '1 hour', burst => 1);
SELECT gd_set_concurrency_limit('account', 1);
SELECT gd_insert('shop', jsonb_build_object('flaky', n % 2 = 0)) FROM generate_series(1, 20) n;
SELECT gd_insert('shop', rate_limit => 'api:tenant-7');   -- its second step waits an hour for a token
SELECT gd_insert('shop', concurrency_key => 'account:42') FROM generate_series(1, 2);
SELECT gd_insert('outside');
SELECT count(*) FROM gd_claim('external', 'prometheus-test', 1);
});
$node->poll_query_until('postgres', q{
SELECT count(*) = 22 FROM gd.instances WHERE fsm = 'shop' AND status = 'done'})
  or die 'the steps did not run';

# A served database dropped and made again, twice: its counters' rows are
# not left behind under labels another row has too.
for my $round (1 .. 3)
{
	$node->safe_psql('postgres', 'DROP DATABASE IF EXISTS scratch WITH (FORCE)') if $round > 1;
	$node->safe_psql('postgres', 'CREATE DATABASE scratch');
	$node->safe_psql('scratch', q{
CREATE EXTENSION gen_durable;
CREATE FUNCTION shop(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
SELECT gd_define_fsm('shop', initial => 'reserve', steps => '{"reserve": {"handler": "public.shop(jsonb, gd.context)"}}');
SELECT gd_set_rate_limit('api', rate => 100, per => '1 second');
SELECT gd_insert('shop', rate_limit => 'api');
});
	$node->poll_query_until('scratch', q{SELECT count(*) = 1 FROM gd.instances WHERE status = 'done'})
	  or die "the step in scratch did not run (round $round)";
}
is($node->safe_psql('postgres', q{
SET ROLE gd_monitor;
SELECT (SELECT count(*) - count(DISTINCT (database, fsm, step, kind)) FROM gd.step_stats)
     + (SELECT count(*) - count(DISTINCT (database, kind, name, partition, fsm, step)) FROM gd.limit_stats)}), '0',
	'no two rows of gd.step_stats or gd.limit_stats share their labels after databases were dropped');
is($node->safe_psql('postgres', q{SET ROLE gd_monitor; SELECT count(*) FROM gd.step_stats WHERE database = 'scratch'}), '1',
	'the database made again has its own row');

# Each query: it runs, returns rows, and has every column its metrics name.
for my $namespace (sort keys %$queries)
{
	my $query = $queries->{$namespace}{query};
	my ($columns, $rows) = split /\|/, $node->safe_psql('postgres', qq{
SET ROLE gd_monitor;
CREATE TEMP VIEW exported AS $query;
SELECT (SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
         WHERE attrelid = 'exported'::regclass AND attnum > 0),
       (SELECT count(*) FROM exported)});
	my %has = map { $_ => 1 } split /,/, $columns;
	cmp_ok($rows, '>', 0, "$namespace returns rows");
	my @missing;
	for my $metric (@{ $queries->{$namespace}{metrics} })
	{
		my ($column, $mapping) = %$metric;
		my @needed = $mapping->{usage} eq 'HISTOGRAM'
		  ? ($column, "${column}_bucket", "${column}_sum", "${column}_count")
		  : ($column);
		push @missing, grep { !$has{$_} } @needed;
	}
	is(join(',', @missing), '', "$namespace has the columns its metrics name");
}

# A real exporter with the file: its metrics, scraped over HTTP.
my $exporter = '/usr/bin/prometheus-postgres-exporter';
my $port = PostgreSQL::Test::Cluster::get_free_port();
local $ENV{DATA_SOURCE_NAME} =
  'host=' . $node->host . ' port=' . $node->port . ' user=gd_monitor dbname=postgres sslmode=disable';
my ($out, $err) = ('', '');
my $running = IPC::Run::start(
	[ $exporter, "--extend.query-path=$examples/queries.yaml", "--web.listen-address=127.0.0.1:$port",
		'--disable-default-metrics', '--disable-settings-metrics' ],
	'>', \$out, '2>', \$err);
my $metrics = '';
for (1 .. 100)
{
	my $response = HTTP::Tiny->new(timeout => 5)->get("http://127.0.0.1:$port/metrics");
	if ($response->{success} && $response->{content} =~ /^gen_durable_/m)
	{
		$metrics = $response->{content};
		last;
	}
	usleep(200_000);   # (a bare sleep takes whole seconds: 0.2 would not wait at all)
}
$running->kill_kill;
note($err) if $metrics eq '';

like($metrics, qr/^pg_exporter_last_scrape_error(\{[^}]*\})? 0$/m, 'the exporter scraped without error');
unlike($metrics, qr/^pg_exporter_user_queries_load_error\{[^}]*\} 1$/m, 'it loaded queries.yaml');
like($metrics, qr/^gen_durable_steps_seconds_bucket\{[^}]*fsm="shop"[^}]*kind="retry"[^}]*le="0\.001024"[^}]*\} \d+$/m,
	'the steps\' histogram buckets, by FSM, step and kind');
like($metrics, qr/^gen_durable_steps_seconds_count\{[^}]*kind="done"[^}]*step="charge"[^}]*version="1"[^}]*\} 22$/m,
	'each step counted once');
like($metrics, qr/^gen_durable_queue_executors\{[^}]*queue="default"[^}]*\} 1$/m, 'executors per queue');
like($metrics, qr/^gen_durable_queue_picks_total\{[^}]*queue="external"[^}]*\} 1$/m, 'a gd_claim is a pick');
like($metrics, qr/^gen_durable_limits_throttled_total\{[^}]*kind="rate_limit"[^}]*name="api"[^}]*\} [1-9]/m,
	'the rate limit throttled');
like($metrics, qr/^gen_durable_limit_partitions_throttled_total\{[^}]*partition="tenant-7"[^}]*\} [1-9]/m,
	'its partition');
like($metrics, qr/^gen_durable_limits_granted_total\{[^}]*kind="concurrency"[^}]*name="account"[^}]*\} 2$/m,
	'the concurrency key admitted both, one after the other');
like($metrics, qr/^gen_durable_step_total\{[^}]*kind="retry"[^}]*\} 10$/m, 'the engine\'s step counters');
like($metrics, qr/^gen_durable_queue_depth_instances\{[^}]*queue="default"[^}]*status="done"[^}]*\} 22$/m,
	'instances per queue and status');
like($metrics, qr/^gen_durable_workers_running\{[^}]*kind="launcher"[^}]*\} 1$/m, 'the engine\'s workers');

# Every metric the alerting rules use is exported.
my @used;
for my $group (@{ $alerts->{groups} })
{
	push @used, $_->{expr} =~ /\b(gen_durable_[a-z_]+)/g for @{ $group->{rules} };
}
cmp_ok(scalar(@used), '>=', 5, 'the alerting rules use the metrics');
my @unknown = grep { $metrics !~ /^\Q$_\E[{ ]/m } @used;
is(join(', ', @unknown), '', 'every metric the alerts use is exported');

done_testing();
