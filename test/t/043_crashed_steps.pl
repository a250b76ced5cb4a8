# A step that ends its executor counts an attempt (src/crashed_steps.cpp),
# so it cannot loop: a handler that terminates its own backend fails its
# instance after its max_attempts, the server staying up and other queues
# running meanwhile; a step in flight when its executor is SIGKILLed (a
# crash-restart of the whole server) counts an attempt, while the steps of
# the other executors, interrupted by the restart, count none.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 60;

my $node = GdTest::start_node('crashed_steps',
	'gen_durable.queues' => 'crash:1, other:1',
	restart_after_crash  => 'on');
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (instance bigint, step text, attempt int);
CREATE FUNCTION deadly(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    CASE state->>'how'
    WHEN 'terminate' THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(60);
    WHEN 'sleep' THEN
        PERFORM pg_sleep((state->>'seconds')::float8);
    ELSE
        NULL;
    END CASE;
    INSERT INTO ledger VALUES (ctx.id, ctx.step, ctx.attempt);
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('crash', 'go', queue => 'crash');
SELECT gd_define_step('crash', 'go', 'deadly(jsonb, gd.context)'::regprocedure, max_attempts => 3, backoff => '0s');
SELECT gd_define_fsm('once', 'go', queue => 'crash');
SELECT gd_define_step('once', 'go', 'deadly(jsonb, gd.context)'::regprocedure, max_attempts => 1);
SELECT gd_define_fsm('other', 'go', queue => 'other');
SELECT gd_define_step('other', 'go', 'deadly(jsonb, gd.context)'::regprocedure);
});

# ---- a handler that terminates its own backend
my $off = -s $node->logfile;
my $t0 = time();
my $suicide = $node->safe_psql('postgres', q{SELECT gd_insert('crash', '{"how": "terminate"}')});
my $others = $node->safe_psql('postgres',
	q{SELECT string_agg(gd_insert('other', '{"how": "sleep", "seconds": 0.2}')::text, ',') FROM generate_series(1, 20)});
ok($node->poll_query_until('postgres', "SELECT status = 'failed' FROM gd.instances WHERE id = $suicide"),
	'the instance whose step ends its executor fails');
note(sprintf('failed after %.1f s', time() - $t0));
is($node->safe_psql('postgres', "SELECT attempt || ' ' || (error->>'kind') || ' ' || (error->>'message') FROM gd.instances WHERE id = $suicide"),
	'3 crashed gen_durable: step "go" ended its own executor', 'after its 3 attempts, each counted, kind crashed');
ok(GdTest::poll_done($node, $others, 20), 'the other queue ran its 20 instances meanwhile');
ok(!$node->log_contains(qr/reinitializing/, $off), 'the server stayed up (no crash-restart)');
is($node->safe_psql('postgres', "SELECT count(*) FROM ledger WHERE instance = $suicide"), '0', 'no run of it committed');

# ---- SIGKILL of an executor in a step; another executor is in a step too
my $killed = $node->safe_psql('postgres', q{SELECT gd_insert('once', '{"how": "sleep", "seconds": 30}')});
my $bystander = $node->safe_psql('postgres', q{SELECT gd_insert('other', '{"how": "sleep", "seconds": 3}')});
$node->poll_query_until('postgres',
	"SELECT count(*) = 2 FROM gd.workers WHERE instance_id IN ($killed, $bystander)")
  or die 'the two steps did not start';
my $victim = $node->safe_psql('postgres', "SELECT pid FROM gd.workers WHERE instance_id = $killed");
$off = -s $node->logfile;
ok(kill('KILL', $victim), 'kill -9 the executor in the step');
ok(GdTest::poll_through_restart($node, "SELECT status = 'failed' FROM gd.instances WHERE id = $killed", 't'),
	'after the crash-restart, the step in flight counted its attempt: with max_attempts 1, the instance failed');
ok($node->log_contains(qr/reinitializing/, $off), 'the server crash-restarted');
like($node->safe_psql('postgres', "SELECT (error->>'kind') || ': ' || (error->>'message') FROM gd.instances WHERE id = $killed"),
	qr/^crashed: gen_durable: the executor running step "go" died/, 'with kind crashed');
ok(GdTest::poll_done($node, $bystander, 1), 'the other executor\'s step, interrupted by the restart, ran again');
is($node->safe_psql('postgres', "SELECT attempt FROM ledger WHERE instance = $bystander"), '1',
	'and counted no attempt for the interruption');

$node->stop;
done_testing();
