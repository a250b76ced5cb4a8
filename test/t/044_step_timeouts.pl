# Timeouts that hold, and cancelling a running step.
#   - A handler that catches the cancel of its timeout and goes on is ended
#     with its executor a second after its timeout; the attempt is counted
#     (kind timeout), and past max_attempts its instance fails.
#   - gd_cancel of an instance whose step is running stops that step now
#     (its effects rolled back, no attempt counted) and cancels it, even when
#     the step ignores the cancel (its executor is ended).
#   - The step runner never swallows a cancel that is not the step's own: a
#     gd._execute running a step is cancelled like any statement.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use IPC::Run;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 60;

my $node = GdTest::start_node('step_timeouts', 'gen_durable.queues' => 'slow:1');
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (instance bigint, attempt int);
CREATE FUNCTION hold(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger VALUES (ctx.id, ctx.attempt);
    IF state ? 'stubborn' THEN
        LOOP
            BEGIN
                PERFORM pg_sleep(0.2);
            EXCEPTION WHEN query_canceled THEN
                NULL;   -- and on, regardless
            END;
        END LOOP;
    END IF;
    PERFORM pg_sleep((state->>'seconds')::float8);
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('timed', 'go', queue => 'slow');
SELECT gd_define_step('timed', 'go', 'hold(jsonb, gd.context)'::regprocedure, max_attempts => 2, backoff => '0s',
                      timeout => '1s');
SELECT gd_define_fsm('untimed', 'go', queue => 'slow');
SELECT gd_define_step('untimed', 'go', 'hold(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('by_hand', 'go', queue => 'manual');
SELECT gd_define_step('by_hand', 'go', 'hold(jsonb, gd.context)'::regprocedure);
});

sub running
{
	my ($id) = @_;
	return $node->poll_query_until('postgres', "SELECT count(*) = 1 FROM gd.workers WHERE instance_id = $id");
}

# ---- a step that ignores its timeout's cancel
my $t0 = time();
my $stubborn = $node->safe_psql('postgres', q{SELECT gd_insert('timed', '{"stubborn": true}')});
ok($node->poll_query_until('postgres', "SELECT status = 'failed' FROM gd.instances WHERE id = $stubborn"),
	'a step that catches its timeout\'s cancel still ends: its instance fails after 2 attempts');
my $took = time() - $t0;
note(sprintf('failed after %.1f s', $took));
like($node->safe_psql('postgres', "SELECT attempt || ' ' || (error->>'kind') || ' ' || (error->>'message') FROM gd.instances WHERE id = $stubborn"),
	qr/^2 timeout gen_durable: step "go" ran past its timeout of 1000 ms and did not stop when cancelled/,
	'each attempt counted, kind timeout');
cmp_ok($took, '<', 15, 'within its attempts\' timeouts, their grace and the executor\'s restarts');

# ---- gd_cancel of a running step
my $long = $node->safe_psql('postgres', q{SELECT gd_insert('untimed', '{"seconds": 60}')});
ok(running($long), 'a 60 s step is running');
$t0 = time();
is($node->safe_psql('postgres', "SELECT gd_cancel($long, 'enough')"), 't', 'gd_cancel of it');
cmp_ok(time() - $t0, '<', 5, 'returns at once, not after the step');
is($node->safe_psql('postgres', "SELECT status || ' ' || attempt FROM gd.instances WHERE id = $long"), 'cancelled 1',
	'the instance is cancelled, no attempt counted');
is($node->safe_psql('postgres', "SELECT count(*) FROM ledger WHERE instance = $long"), '0', 'the step\'s writes are gone');

my $deaf = $node->safe_psql('postgres', q{SELECT gd_insert('untimed', '{"stubborn": true}')});
ok(running($deaf), 'a step that ignores cancels is running');
$t0 = time();
is($node->safe_psql('postgres', "SELECT gd_cancel($deaf)"), 't', 'gd_cancel of it');
cmp_ok(time() - $t0, '<', 10, 'returns once its executor was ended');
is($node->safe_psql('postgres', "SELECT status FROM gd.instances WHERE id = $deaf"), 'cancelled', 'it is cancelled');
my $after = $node->safe_psql('postgres', q{SELECT gd_insert('untimed', '{"seconds": 0}')});
ok(GdTest::poll_done($node, $after, 1), 'the queue runs on with a new executor');

# ---- a cancel of gd._execute's session is not swallowed by the step runner
my $manual = $node->safe_psql('postgres', q{SELECT gd_insert('by_hand', '{"seconds": 30}')});
my ($stdout, $stderr) = ('', '');
my $session = IPC::Run::start(
	[ 'psql', '-X', '-At', '-d', $node->connstr('postgres'), '-c',
	  q{SET application_name = 'stepping'; SELECT gd._execute('manual', 1)} ],
	'>', \$stdout, '2>', \$stderr);
$node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'stepping' AND wait_event = 'PgSleep'});
$t0 = time();
$node->safe_psql('postgres', q{SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'stepping'});
$session->finish;
like($stderr, qr/canceling statement due to user request/, 'gd._execute is cancelled');
cmp_ok(time() - $t0, '<', 5, 'at once');
is($node->safe_psql('postgres', "SELECT status || ' ' || attempt || ' ' || (error IS NULL) FROM gd.instances WHERE id = $manual"),
	'runnable 1 true', 'and its step counted no attempt');

$node->stop;
done_testing();
