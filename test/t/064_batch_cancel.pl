# gd_cancel of an instance in a running in-database batch call (batch => 4,
# one executor; the handler writes a ledger row per instance, then waits at a
# gate: a committed flag).  The executor's running step is its call's first
# instance (gd.workers, the crash note):
#   1. a cancel of another instance of the call does not stop the call: it
#      waits for the round (the row's lock), which commits every instance's
#      outcome and writes, then cancels the instance from where that left it
#      (step b, an hour away: the round cannot run it on);
#   2. a cancel of the call's first instance stops the call (its writes, the
#      companions' too, rolled back; no attempt counted): the companions run
#      again in a later round, as attempt 1.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

$PostgreSQL::Test::Utils::timeout_default = 30;

my $node = GdTest::start_node('batch_cancel', 'gen_durable.queues' => 'default:1', 'gen_durable.batch_time' => '60s');
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (instance bigint, step text, attempt int, PRIMARY KEY (instance, step));
CREATE TABLE gate (open boolean NOT NULL);
INSERT INTO gate VALUES (false);
CREATE FUNCTION held_batch(states jsonb[], ctxs gd.context[]) RETURNS gd.outcome[]
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger SELECT id, step, attempt FROM unnest(ctxs);
    WHILE NOT (SELECT open FROM gate) LOOP
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN (SELECT array_agg(CASE c.step WHEN 'a' THEN gd_next('b', NULL, '1 hour') ELSE gd_done() END) FROM unnest(ctxs) c);
END $$;
SELECT gd_define_fsm('batched', 'a', 'default', steps => $${
    "a": {"handler": "public.held_batch(jsonb[], gd.context[])", "batch": 4, "backoff": "0s"},
    "b": {"handler": "public.held_batch(jsonb[], gd.context[])", "batch": 4, "backoff": "0s"}
}$$);
});

sub set_gate { $node->safe_psql('postgres', "UPDATE gate SET open = $_[0]"); }

# The four instances of a call held at the gate, its first one first.
sub held_call
{
	my $ids = $node->safe_psql('postgres',
		q{SELECT string_agg(gd_insert('batched', jsonb_build_object('n', n))::text, ',' ORDER BY n) FROM generate_series(1, 4) n});
	$node->poll_query_until('postgres', q{
SELECT count(*) FROM gd.workers w JOIN pg_stat_activity a USING (pid)
 WHERE w.kind = 'executor' AND w.instance_id IS NOT NULL AND a.wait_event = 'PgSleep'}, '1')
	  or die 'the executor is not in the call';
	my $first = $node->safe_psql('postgres', q{SELECT instance_id FROM gd.workers WHERE kind = 'executor' AND instance_id IS NOT NULL});
	my @ids = split /,/, $ids;
	die "the call's first instance is $first, not one of @ids" unless grep { $_ == $first } @ids;
	return ($first, grep { $_ != $first } @ids);
}

# Polls until $_[0] of the instances $_[1] (a comma list) are at step b, not cancelled.
sub poll_at_b
{
	my ($n, $ids) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) FROM gd.instances WHERE id IN ($ids) AND step = 'b' AND status <> 'cancelled'", $n);
}

sub ledger { return $node->safe_psql('postgres', "SELECT string_agg(instance || step || attempt, ',' ORDER BY instance, step) FROM ledger WHERE instance IN ($_[0])"); }

# ---- 1. another instance of the call
my ($first, @companions) = held_call();
my $target = $companions[1];
my $cancel = GdTest::start_cancel($node, $target);
ok($node->poll_query_until('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT gd_cancel(%' AND wait_event_type = 'Lock'}, '1'),
	'the cancel of an instance that is not the first of the running call waits for a lock');
is($node->safe_psql('postgres', q{SELECT count(*) FROM gd.workers w JOIN pg_stat_activity a USING (pid)
 WHERE w.kind = 'executor' AND w.instance_id IS NOT NULL AND a.wait_event = 'PgSleep'}), '1',
	'and the call goes on, not stopped');
set_gate('true');
$cancel->{harness}->finish;
is($cancel->{out}, "t\n", 'once the round committed, the cancel returns true') or diag $cancel->{err};
ok(poll_at_b(3, join(',', grep { $_ != $target } $first, @companions)), 'the other three went on to step b');
is($node->safe_psql('postgres', "SELECT status || ' ' || step || ' ' || (error->>'kind') || ' ' || (error->>'step') FROM gd.instances WHERE id = $target"),
	'cancelled b cancelled b', 'the cancelled instance ends where the round left it: its step a had committed');
is($node->safe_psql('postgres', "SELECT count(*) FROM ledger WHERE instance = $target AND step = 'a'"), '1',
	"the call's write for it committed with the round");
set_gate('false');

# ---- 2. the first instance of the call
($first, @companions) = held_call();
$cancel = GdTest::start_cancel($node, $first);
$cancel->{harness}->finish;
is($cancel->{out}, "t\n", 'the cancel of the first instance of the running call returns true') or diag $cancel->{err};
is($node->safe_psql('postgres', "SELECT status || ' ' || (error->>'step') FROM gd.instances WHERE id = $first"),
	'cancelled a', 'it is cancelled in step a');
set_gate('true');
ok(poll_at_b(3, join(',', @companions)), 'its companions go on to step b');
is(ledger(join(',', $first, @companions)), join(',', map { "${_}a1" } @companions),
	"the stopped call's writes were rolled back (none for the cancelled one), the companions ran again as attempt 1");

$node->stop;
done_testing();
