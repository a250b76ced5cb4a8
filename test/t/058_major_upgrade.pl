# Upgrades across majors, from PostgreSQL 15 to the major under test (17,
# 18).  A 15 cluster (this version of gen_durable built for it, in a private
# copy of bookworm's 15: GD_PG15_INSTALL, see gd_build_pg15_copy) holds live
# instances in every state the engine keeps — runnable and due in a few
# seconds, parked with a signal kept in its inbox for a later wait, a parent
# with children done and one runnable, external steps claimed (a long lease
# and one that lapses) and unclaimed, a concurrency key's holder and a gated
# instance, rate-limited work — and a schedule firing every second.  It is
# taken to the major under test both ways docs/operations.md describes:
# pg_dump of that major restored into a fresh cluster, and pg_upgrade (the
# engine idle while it runs) to a cluster started afterwards with the
# library preloaded.  On each, every instance ends as it would have: the
# claim completes with its lease token, the lapsed lease is reclaimed, the
# waiting instance consumes the kept signal, the parent resumes when its
# last child ends, the due instance runs (not before its time), the gated
# one after its key's holder, the rate-limited ones two seconds apart, every
# step once; the schedule fires again with no tick twice.  ALTER EXTENSION
# gen_durable UPDATE after pg_upgrade changes nothing (same version).
use strict;
use warnings;
use Cwd;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

$PostgreSQL::Test::Utils::timeout_default = 60;

plan skip_all => $ENV{GD_PG15_UNAVAILABLE} if $ENV{GD_PG15_UNAVAILABLE};
my $pg15 = $ENV{GD_PG15_INSTALL};
die 'GD_PG15_INSTALL names no PostgreSQL 15 with gen_durable (see gd_build_pg15_copy)'
  unless $pg15 && -x "$pg15/bin/postgres";

# The 15 cluster's engine serves queue 'work' only: what it leaves on 'held'
# stays runnable there, as the external steps on 'ext' do until the test
# claims them.  The major under test serves 'held' with two executors: the
# concurrency key has to keep them apart.
my $old = GdTest::start_node('old', '-install_path' => $pg15, 'gen_durable.queues' => 'work:1');
my $restored = GdTest::start_node('restored', 'gen_durable.database' => 'app', 'gen_durable.queues' => 'work:1, held:2');
$restored->safe_psql('postgres', 'CREATE DATABASE app');

# PostgreSQL 15.20 keeps a version of each column in its options
# (pg_attver), as 17.12 does; a release of a later major from before that
# (18.6) refuses the option, which its pg_dump and pg_upgrade copy from the
# 15 cluster onto every column: neither way can work there, whatever the
# tables.
my ($probe) = $restored->psql('postgres', 'CREATE TEMP TABLE probe (a int); ALTER TABLE probe ALTER COLUMN a SET (pg_attver = 1)');
plan skip_all => sprintf('PostgreSQL %s refuses the column option pg_attver that PostgreSQL %s keeps on every column:'
	  . ' pg_upgrade and a restore of pg_dump from it fail for every table', $restored->pg_version, $old->pg_version)
  if $probe != 0
  && $old->safe_psql('postgres', q{SELECT EXISTS (SELECT FROM pg_attribute WHERE attoptions::text LIKE '%pg_attver=%')}) eq 't';

$old->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
-- Each step writes its run here once (a second run would fail the key).
CREATE TABLE ledger (instance bigint, step text, started timestamptz, ended timestamptz DEFAULT clock_timestamp(),
                     PRIMARY KEY (instance, step));
CREATE FUNCTION step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
BEGIN
    PERFORM pg_sleep((state->>'sleep')::float8) WHERE state ? 'sleep';
    INSERT INTO ledger (instance, step, started) VALUES (ctx.id, ctx.step, started);
    CASE ctx.step
    WHEN 'park' THEN RETURN gd_wait_signal(ARRAY['go'], then_step => 'take');
    WHEN 'take' THEN RETURN gd_wait_signal(ARRAY['kept'], then_step => 'finish');
    WHEN 'fan_out' THEN RETURN gd_spawn('[{"fsm": "job"}, {"fsm": "job"}, {"fsm": "slow"}]', then_step => 'finish');
    ELSE RETURN gd_done(jsonb_build_object('signals', jsonb_path_query_array(coalesce(ctx.signals, '[]'), '$[*].payload'),
                                           'children', jsonb_path_query_array(coalesce(ctx.children, '[]'), '$[*].status')));
    END CASE;
END $$;
SELECT gd_define_fsm('job', 'finish', queue => 'work', steps => '{"finish": {"handler": "public.step(jsonb, gd.context)"}}');
SELECT gd_define_fsm('slow', 'finish', queue => 'held', state_defaults => '{"sleep": 0.3}',
                     steps => '{"finish": {"handler": "public.step(jsonb, gd.context)"}}');
SELECT gd_define_fsm('waiter', 'park', queue => 'work', steps => '{"park": {"handler": "public.step(jsonb, gd.context)"},
    "take": {"handler": "public.step(jsonb, gd.context)"}, "finish": {"handler": "public.step(jsonb, gd.context)"}}');
SELECT gd_define_fsm('parent', 'fan_out', queue => 'work', steps => '{"fan_out": {"handler": "public.step(jsonb, gd.context)"},
    "finish": {"handler": "public.step(jsonb, gd.context)"}}');
SELECT gd_define_fsm('shipment', 'ship', queue => 'ext', steps => '{"ship": {}}');
SELECT gd_set_concurrency_limit('pool', 1);
SELECT gd_set_rate_limit('api', 1, '2 seconds');
SELECT gd_schedule('every_second', '@every 1 second', 'job', '{"label": "tick"}');
SELECT gd_insert('waiter', '{"label": "waiter"}', correlation_key => 'waiter-1');
SELECT gd_insert('parent', '{"label": "parent"}');
SELECT gd_insert('slow', '{"label": "holder"}', concurrency_key => 'pool');
SELECT gd_insert('slow', '{"label": "gated"}', concurrency_key => 'pool');
SELECT gd_insert('slow', '{"label": "limited"}', rate_limit => 'api') FROM generate_series(1, 3);
SELECT gd_insert('shipment', jsonb_build_object('label', l)) FROM unnest('{claimed,lapsing,unclaimed}'::text[]) l;
});
$old->poll_query_until('postgres', q{
SELECT (SELECT step = 'park' AND status = 'awaiting_signal' FROM gd.instances WHERE state->>'label' = 'waiter')
   AND (SELECT string_agg(status, ',' ORDER BY status) FROM gd.instances WHERE parent_id IS NOT NULL) = 'done,done,runnable'
   AND (SELECT count(*) >= 2 FROM gd.instances WHERE state->>'label' = 'tick' AND status = 'done')})
  or die 'the 15 cluster did not settle';
# A signal for the wait after the one the instance is parked in: kept in its
# inbox.  The external steps claimed: for ten minutes, and for a lease that
# lapses while the cluster is upgraded.  One due in a few seconds.
$old->safe_psql('postgres', q{SELECT gd_signal('waiter-1', 'kept', '{"kept": true}')});
my %claim = map { split /\|/ } split /\n/, $old->safe_psql('postgres', q{
SELECT c.state->>'label', c.lease_token FROM gd_claim('ext', 'before-upgrade', 1, '10 minutes') c;
SELECT c.state->>'label', c.lease_token FROM gd_claim('ext', 'before-upgrade', 1, '8 seconds') c;});
$old->safe_psql('postgres', q{SELECT gd_insert('job', '{"label": "due"}', schedule_in => '3 seconds')});
ok(exists $claim{claimed} && exists $claim{lapsing}, 'two external steps claimed on 15');
my $due = $old->safe_psql('postgres', q{SELECT eligible_at FROM gd.instances WHERE state->>'label' = 'due'});

# What both ways start from.
my $live = q{
SELECT string_agg(state->>'label' || ' ' || status || CASE WHEN gated THEN ' gated' ELSE '' END, E'\n' ORDER BY id)
  FROM gd.instances WHERE parent_id IS NULL AND state->>'label' <> 'tick'};
is($old->safe_psql('postgres', $live), 'waiter awaiting_signal
parent awaiting_children
holder runnable
gated runnable gated
limited runnable
limited runnable
limited runnable
claimed executing
lapsing executing
unclaimed runnable
due runnable', 'on 15: instances in every live state');
is($old->safe_psql('postgres', q{SELECT count(*) FROM gd.signals WHERE consumed_at IS NULL}), '1', 'a signal kept in an inbox');

my $dir = PostgreSQL::Test::Utils::tempdir();
command_ok([ 'pg_dump', '-Fc', '-d', $old->connstr('postgres'), '-f', "$dir/app.dump" ],
	'pg_dump of the major under test from the 15 cluster');
$old->stop;

# Where the ends are the same both ways: each instance's status, attempt
# and result.
my $ends = q{
SELECT string_agg(state->>'label' || ' ' || status || ' ' || attempt || ' ' || coalesce(result::text, '-'), E'\n' ORDER BY id)
  FROM gd.instances WHERE parent_id IS NULL AND state->>'label' <> 'tick'};
my $none = '{"signals": [], "children": []}';
my $expected_ends = qq{waiter done 1 {"signals": [{"kept": true}], "children": []}
parent done 1 {"signals": [], "children": ["done", "done", "done"]}
holder done 1 $none
gated done 1 $none
limited done 1 $none
limited done 1 $none
limited done 1 $none
claimed done 1 {"by": "before"}
lapsing done 2 {"by": "after"}
unclaimed done 1 {"by": "after"}
due done 1 $none};

# Run what is left on database $db of $node, named $name, to the end, and check how it ended.
sub finish
{
	my ($node, $db, $name) = @_;
	my $q = sub { return $node->safe_psql($db, $_[0]); };
	my $since = $q->('SELECT now()');
	is($q->("SELECT gd_complete(id, $claim{claimed}, gd_done('{\"by\": \"before\"}')) FROM gd.instances"
			. q{ WHERE state->>'label' = 'claimed'}),
		't', "$name: the claim made on 15 completes with its lease token");
	$q->(q{SELECT gd_signal('waiter-1', 'go')});
	# An external worker, until the lapsed lease is reclaimed and nothing is left to claim.
	my $work = q{SELECT count(gd_complete(id, lease_token, gd_done('{"by": "after"}')))
	               FROM gd_claim('ext', 'after-upgrade', 10)};
	ok( $node->poll_query_until(
			$db, "SELECT ($work) >= 0 AND NOT EXISTS (SELECT FROM gd.instances WHERE fsm = 'shipment' AND status <> 'done')"),
		"$name: the lapsed lease is reclaimed, the external steps end");
	ok( $node->poll_query_until(
			$db, qq{SELECT EXISTS (SELECT FROM gd.instances WHERE state->>'label' = 'tick' AND status = 'done'
			                          AND (state->>'scheduled_at')::timestamptz > '$since')}),
		"$name: the schedule fires");
	$q->(q{SELECT gd_pause_schedule('every_second')});
	ok( $node->poll_query_until(
			$db, q{SELECT NOT EXISTS (SELECT FROM gd.instances
			                           WHERE status IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children'))}),
		"$name: every instance ended");
	is($q->($ends), $expected_ends, "$name: each as it would have");
	is($q->(q{SELECT count(*) = count(DISTINCT state->>'scheduled_at')
	                 AND count(*) = (SELECT runs FROM gd.schedules WHERE name = 'every_second')
	            FROM gd.instances WHERE state->>'label' = 'tick'}),
		't', "$name: no tick started twice");
	my $started = q{SELECT l.started FROM ledger l JOIN gd.instances i ON i.id = l.instance WHERE i.state->>'label' = };
	is($q->("SELECT ($started 'due') >= '$due'"), 't', "$name: the due instance ran when it was due");
	is($q->("SELECT ($started 'gated') >= (SELECT l.ended FROM ledger l JOIN gd.instances i ON i.id = l.instance"
			. " WHERE i.state->>'label' = 'holder')"),
		't', "$name: the gated instance ran after its key's holder");
	# (picked 2 s apart, each may wait for the steps picked with it: 0.3 s each)
	is($q->("SELECT max(started) - min(started) >= interval '3 seconds' FROM ($started 'limited') l"),
		't', "$name: the rate limit spaced its instances");
	return;
}

# pg_dump's way (docs/operations.md, Backup and restore): into a fresh
# cluster whose engine serves the database from the start, in one
# transaction (the steps write a table of the dump).
command_ok([ 'pg_restore', '--single-transaction', '-d', $restored->connstr('app'), "$dir/app.dump" ],
	'pg_restore into the major under test');
finish($restored, 'app', 'restored');
$restored->stop;

# pg_upgrade's way (docs/operations.md, Upgrading): the major under test's
# pg_upgrade, both clusters with the library preloaded (in binary-upgrade
# mode it runs no engine); then the new cluster starts.  The old binaries need their
# lib/ on the library path (PostgreSQL::Test::Cluster gives it to the old
# cluster's commands): pg_upgrade runs them.
my $upgraded = GdTest::start_node('upgraded', '-init' => { no_data_checksums => 1 },
	'gen_durable.queues' => 'work:1, held:2');
$upgraded->stop;
my $cwd = getcwd();
chdir PostgreSQL::Test::Utils::tempdir() or die "chdir: $!";    # where pg_upgrade leaves its scripts
my ($pg_upgraded, $pg_upgrade_out);
{
	local $ENV{LD_LIBRARY_PATH} = join(':', "$pg15/lib", $ENV{LD_LIBRARY_PATH} // ());
	$pg_upgraded = ok(
		run_log(
			[
				'pg_upgrade',
				'--old-bindir'  => "$pg15/bin",
				'--new-bindir'  => $upgraded->config_data('--bindir'),
				'--old-datadir' => $old->data_dir,
				'--new-datadir' => $upgraded->data_dir,
				'--old-port'    => PostgreSQL::Test::Cluster::get_free_port(),
				'--new-port'    => PostgreSQL::Test::Cluster::get_free_port(),
				'--socketdir'   => PostgreSQL::Test::Utils::tempdir_short()
			],
			'>&' => \$pg_upgrade_out),
		'pg_upgrade from 15');
}
chdir $cwd or die "chdir: $!";
if (!$pg_upgraded)
{
	# What pg_upgrade refused, and why it stopped.
	diag($pg_upgrade_out =~ /((?:.*\n){0,12})\z/);
	diag(slurp_file($_)) for glob($upgraded->data_dir . '/pg_upgrade_output.d/*/*.txt');
	diag(grep { /error/i } split /^/, slurp_file($_)) for glob($upgraded->data_dir . '/pg_upgrade_output.d/*/log/*.log');
	done_testing();
	exit;
}
$upgraded->start;
my $version = $upgraded->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'gen_durable'});
my ($update, $update_out, $update_err) = $upgraded->psql('postgres', 'ALTER EXTENSION gen_durable UPDATE');
is($update . ' ' . $upgraded->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'gen_durable'}),
	"0 $version", 'ALTER EXTENSION gen_durable UPDATE after pg_upgrade: the same version');
like($update_err, qr/version "\Q$version\E" of extension "gen_durable" is already installed/, '(nothing to do)');
finish($upgraded, 'postgres', 'upgraded');
ok(!$upgraded->log_contains(qr/PANIC|TRAP:|terminated by signal/), 'no crash');
$upgraded->stop;
done_testing();
