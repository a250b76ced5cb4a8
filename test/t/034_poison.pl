# One bad row must not stop a queue.  Background executors run a queue in
# which one instance's step makes its whole round fail outside the handler's
# subtransaction:
#   (a) the handler deletes its own instance row: the transition's UPDATE
#       finds no row (before d4171b7: "gen_durable: could not record the
#       transition", the round rolled back and was tried again a second
#       later, forever);
#   (b) a step defined with a backoff too large for int8 microseconds
#       ('1000000 years'): gd_define_step refuses it, so no round fails.
# The contract (the guarantees, "Exactly once"): a step that fails is a failed
# attempt of its instance, retried with backoff and then failed; other
# instances are not affected.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 30;

my $node = GdTest::start_node(
	'poison',
	'gen_durable.queues'        => 'vanish:1, huge:1',
	'gen_durable.poll_interval' => '100ms',
);

$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (instance bigint PRIMARY KEY);
CREATE FUNCTION work(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF state->>'do' = 'vanish' THEN
        DELETE FROM gd._instances WHERE id = ctx.id;
    END IF;
    INSERT INTO ledger VALUES (ctx.id);
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('v', 'a', 'vanish');
SELECT gd_define_step('v', 'a', 'work(jsonb, gd.context)'::regprocedure, max_attempts => 2, backoff => '0s');
SELECT gd_define_fsm('h', 'a', 'huge');
SELECT gd_define_step('h', 'a', 'work(jsonb, gd.context)'::regprocedure);
});

sub count_done
{
	my ($ids) = @_;
	return $node->safe_psql('postgres', GdTest::done_query($ids));
}

# Poll up to $seconds for all of $ids to be done; returns how many are.
sub wait_done
{
	my ($ids, $n, $seconds) = @_;
	my $deadline = time() + $seconds;
	my $done = 0;
	while (time() < $deadline)
	{
		$done = count_done($ids);
		return $done if $done == $n;
		usleep(100_000);
	}
	return $done;
}

# ---------------------------------------------------------------------------
# (a) a handler that deletes its own instance row
# ---------------------------------------------------------------------------
my $off = -s $node->logfile;
my $poison = $node->safe_psql('postgres', q{SELECT gd_insert('v', '{"do": "vanish"}', priority => -1)});
my $others = $node->safe_psql('postgres',
	q{SELECT string_agg(gd_insert('v', '{"do": "work"}')::text, ',') FROM generate_series(1, 20)});
my $done = wait_done($others, 20, 3);
{
	is($done, 20, '(a) the 20 other instances of the queue complete');
	like( $node->safe_psql('postgres',
			"SELECT coalesce((SELECT status || ' ' || attempt FROM gd.instances WHERE id = $poison), 'gone')"),
		qr/^(failed \d+|runnable [2-9]|gone)$/,
		'(a) the vanishing instance had failed attempts counted (or is gone), not a round failing over and over');
	is($node->log_contains(qr/could not record the transition of instance $poison/, $off) ? 1 : 0,
		0, '(a) no round failed outside a step');
}
{
	my @rounds = (slurp_file($node->logfile, $off) =~ /could not record the transition of instance $poison/g);
	note("(a) $done of 20 done after 3 s; the executor logged " . scalar(@rounds) . ' failed rounds');
}
# Whatever happened, no instance was lost: cancelling the culprit frees the queue.
# (A culprit still live can be cancelled.)
$node->safe_psql('postgres', "SELECT gd_cancel($poison, 'poison')");
is(wait_done($others, 20, 10), 20, '(a) then every other instance completes');
is($node->safe_psql('postgres', "SELECT count(*) FROM ledger WHERE instance IN ($others)"),
	'20', '(a) each exactly once');

# ---------------------------------------------------------------------------
# (b) a step whose backoff does not fit in int8 microseconds
# ---------------------------------------------------------------------------
my ($rc, $out, $err) = $node->psql('postgres',
	q{SELECT gd_define_step('h', 'a', 'work(jsonb, gd.context)'::regprocedure, backoff => '1000000 years', max_backoff => '1000000 years')});
like($err, qr/ERROR:  gen_durable: .*backoff/, '(b) gd_define_step refuses a backoff of 1,000,000 years (22023)');
$off = -s $node->logfile;
my $huge = $node->safe_psql('postgres',
	q{SELECT string_agg(gd_insert('h')::text, ',') FROM generate_series(1, 5)});
$done = wait_done($huge, 5, 2);
is($done, 5, '(b) instances at that step still run (or fail as attempts)');
ok(!$node->log_contains(qr/bigint out of range/, $off), '(b) no round failed with "bigint out of range"');
note("(b) $done of 5 done after 2 s");
# Redefining the step frees the queue; nothing was lost.
$node->safe_psql('postgres', q{SELECT gd_define_step('h', 'a', 'work(jsonb, gd.context)'::regprocedure)});
is(wait_done($huge, 5, 10), 5, '(b) after a sane redefinition every instance completes');
is($node->safe_psql('postgres', "SELECT count(*) FROM ledger WHERE instance IN ($huge)"),
	'5', '(b) each exactly once');
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'the server is up');
ok(!$node->log_contains(qr/terminated by signal|PANIC|TRAP:/), 'no crash');

$node->stop;
done_testing();
