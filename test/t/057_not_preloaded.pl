# A server where gen_durable is installed but not in shared_preload_libraries:
# no engine, no shared memory of its own.  Every API function, view and
# client call either works (what only reads and writes rows) or raises one
# clear gen_durable: error naming the missing setting (what needs the engine)
# — and the server stays up throughout.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(usleep);

my $node = GdTest::start_node('not_preloaded', shared_preload_libraries => undef);

my ($stdout, $stderr);
$node->psql('postgres', 'CREATE EXTENSION gen_durable', stderr => \$stderr);
like($stderr, qr/WARNING:  gen_durable: the library is not in shared_preload_libraries/, 'CREATE EXTENSION warns');
$node->safe_psql('postgres', q{
CREATE SCHEMA app;
CREATE FUNCTION app.h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
SELECT gd_define_fsm('inner', 'run', steps => '{"run": {"handler": "app.h(jsonb, gd.context)"}}');
SELECT gd_define_fsm('outer', 'work', queue => 'ext', steps => '{"work": {}}');
});

# Each call: what it must do — 'works', or 'refused' (55000, naming shared_preload_libraries).
my @calls = (
	[ works => q{SELECT gd_insert('inner', '{"n": 1}', correlation_key => 'k1')} ],
	[ works => q{SELECT gd_insert_all('inner', '[{"state": {"n": 2}}]')} ],
	[ works => q{SELECT gd_insert('outer')} ],
	[ works => q{SELECT gd_signal('k1', 'go')} ],
	[ works => q{SELECT gd_signal((SELECT min(id) FROM gd.instances), 'go')} ],
	[ works => q{SELECT gd_cancel((SELECT max(id) FROM gd.instances WHERE fsm = 'inner'))} ],
	[ works => q{SELECT gd_retry(0)} ],
	[ works => q{SELECT count(*) FROM gd_history((SELECT min(id) FROM gd.instances))} ],
	[ works => q{SELECT gd_define_step('inner', 'more', 'app.h(jsonb, gd.context)'::regprocedure)} ],
	[ works => q{SELECT gd_grant('inner', 'pg_monitor'), gd_accept_grant('inner', 'pg_monitor'), gd_revoke('inner', 'pg_monitor')} ],
	[ works => q{SELECT gd_next('run'), gd_retry('{}'::jsonb), gd_wait_signal(ARRAY['x']), gd_spawn('[]', 'run'), gd_done(), gd_stop('{}'), gd_outcome('{"kind": "done"}')} ],
	[ works => q{SELECT count(*) FROM gd_cron_ticks('0 * * * *', 'UTC', now(), 3)} ],
	[ works => q{SELECT gd_schedule('hourly', '0 * * * *', 'inner'), gd_pause_schedule('hourly'), gd_resume_schedule('hourly'), gd_unschedule('hourly')} ],
	[ works => q{SELECT gd_set_rate_limit('api', 10, '1 second'), gd_drop_rate_limit('api')} ],
	[ works => q{SELECT gd_set_concurrency_limit('pool', 2), gd_drop_concurrency_limit('pool')} ],
	[ works => q{SELECT gd_pause('ext'), gd_resume('ext')} ],
	[ works => q{SELECT gd_heartbeat(0, 0), gd_release(0, 0), gd_complete(0, 0, gd_done())} ],
	[ works => q{SELECT * FROM gd_complete_all('{0}', '{0}', ARRAY[gd_done()])} ],
	(map { [ works => "SELECT count(*) FROM gd.$_" ] }
	  qw(instances signals fsms steps grants queues rate_limits concurrency_limits schedules step_history)),
	[ works => q{SELECT count(*) FROM gd.read_instances()} ],
	[ works => q{SELECT count(*) FROM gd.configured_queues()} ],
	# no engine: no workers, counters at zero
	(map { [ works => "SELECT count(*) FROM gd.$_" ] } qw(workers stats queue_stats step_stats limit_stats)),
	[ works => q{SELECT gd_stats_reset()} ],
	# steps run in the calling session
	[ works => q{SELECT gd_drain('default')} ],
	[ works => q{SELECT gd._execute('default', 1)} ],
	[ works => q{SELECT status FROM gd_await((SELECT min(id) FROM gd.instances WHERE status = 'done'), '1s')} ],
	# what only the engine keeps its promise for: a lease the reaper reclaims, a wake-up
	[ refused => q{SELECT * FROM gd_claim('ext', 'w', 1)} ],
	[ refused => q{SELECT * FROM gd_claim('ext', 'w', 1, fsms => '{outer}')} ],
	[ refused => q{SELECT * FROM gd_await((SELECT id FROM gd.instances WHERE fsm = 'outer'), '1s')} ],
);
for my $call (@calls)
{
	my ($expect, $sql) = @$call;
	my ($out, $err) = ('', '');
	my $rc = $node->psql('postgres', "\\set VERBOSITY default\n$sql", stdout => \$out, stderr => \$err);
	if ($expect eq 'works')
	{
		is($err =~ /ERROR/ ? $err : '', '', "works: $sql");
	}
	else
	{
		like($err, qr/ERROR:  gen_durable: .*shared_preload_libraries/s, "refused with a clear error: $sql");
	}
	ok($node->safe_psql('postgres', 'SELECT 1') eq '1', "the server is up after: $sql");
}
ok(!$node->log_contains(qr/terminated by signal|server process .* was terminated/), 'no backend crashed');

# The Python client's external worker: its claims are refused, clearly, and the server stays up.
{
	my @worker = GdTest::external_worker();
	my $handlers = PostgreSQL::Test::Utils::tempdir() . "/057_handlers.py";
	open(my $file, '>', $handlers) or die "cannot write $handlers: $!";
	print $file qq{from gen_durable import done\nHANDLERS = {("outer", "work"): lambda state, ctx: done({})}\n};
	close $file;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ @worker, '--dsn', $node->connstr('postgres'), '--handlers', $handlers, '--wait', '0.5' ],
		'>', \$out, '2>', \$err);
	my $deadline = time() + 20;
	$h->pump_nb, usleep(200_000) while $out . $err !~ /shared_preload_libraries/ && time() < $deadline;
	$h->signal('TERM');
	$h->finish;
	like($out . $err, qr/gen_durable: gd_claim needs the engine.*shared_preload_libraries/s, 'the Python worker reports the missing setting');
	ok(!$node->log_contains(qr/terminated by signal/), 'and the server stayed up');
}

$node->stop;
done_testing();
