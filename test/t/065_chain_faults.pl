# Faults in the middle of a chain (an executor running an instance's steps
# a -> b -> c one after the other in one round, its row written once at the
# end).  One executor; each step writes a ledger row, and step b then waits at
# a gate (a committed flag), so every fault below lands while a has run in the
# same round and b is in flight:
#   1. kill -9 of the executor: the round rolls back whole (a's write too);
#      the attempt is counted against a, the step the round picked, its error
#      naming b; a's retry runs alone, then the instance ends with one ledger
#      row per step;
#   2. an immediate shutdown: the round rolls back, nothing is counted;
#   3. gd_cancel of the instance while its b runs: b is stopped (its write
#      rolled back), a's write and transition commit, and the instance is
#      cancelled at b;
#   4. gd_cancel of an instance whose step is not running (another instance's
#      b holds the executor, both in the same round): honoured at its next
#      step bound: its b commits, its c never runs, it is cancelled at c.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

$PostgreSQL::Test::Utils::timeout_default = 30;

my $node = GdTest::start_node(
	'chain_faults',
	'gen_durable.queues'     => 'default:1',
	'gen_durable.batch_time' => '60s',
	restart_after_crash      => 'on',
);
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE ledger (instance bigint, step text, attempt int, PRIMARY KEY (instance, step));
CREATE TABLE gate (open boolean NOT NULL);
INSERT INTO gate VALUES (false);
CREATE FUNCTION walk(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger VALUES (ctx.id, ctx.step, ctx.attempt);
    IF ctx.step = 'b' THEN
        WHILE NOT (SELECT open FROM gate) LOOP
            PERFORM pg_sleep(0.01);
        END LOOP;
    END IF;
    RETURN CASE ctx.step WHEN 'a' THEN gd_next('b') WHEN 'b' THEN gd_next('c') ELSE gd_done() END;
END $$;
SELECT gd_define_fsm('walk', 'a', 'default', history => true, steps => $${
    "a": {"handler": "public.walk(jsonb, gd.context)", "backoff": "0s"},
    "b": {"handler": "public.walk(jsonb, gd.context)", "backoff": "0s"},
    "c": {"handler": "public.walk(jsonb, gd.context)", "backoff": "0s"}
}$$);
});

sub set_gate { GdTest::gate_set($node, $_[0]) }

# Inserts $_[0] instances in one transaction (picked in one round, in id order); their ids.
sub insert_walks
{
	return split /,/, $node->safe_psql('postgres',
		"SELECT string_agg(gd_insert('walk')::text, ',' ORDER BY g) FROM generate_series(1, $_[0]) g");
}

# The instance the executor holds at the gate (in its step b).
sub held_at_gate
{
	GdTest::gate_all_held($node, 1, 'steps', $_[0]);
	return $node->safe_psql('postgres', q{SELECT instance_id FROM gd.workers WHERE kind = 'executor' AND instance_id IS NOT NULL});
}

sub ledger { return $node->safe_psql('postgres', "SELECT string_agg(step || attempt, ',' ORDER BY step) FROM ledger WHERE instance = $_[0]"); }

sub row_of { return $node->safe_psql('postgres', "SELECT status || ' ' || step || ' ' || attempt FROM gd.instances WHERE id = $_[0]"); }

# ---- 1. kill -9 mid-chain
my ($killed) = insert_walks(1);
is(held_at_gate('kill -9'), $killed, 'the executor holds the instance in step b, a having run in the same round');
is(row_of($killed), 'runnable a 1', 'its row is still as picked: the chain writes it once, at its end');
my $victim = $node->safe_psql('postgres', q{SELECT pid FROM gd.workers WHERE kind = 'executor'});
my $off = -s $node->logfile;
ok(kill('KILL', $victim), "kill -9 executor $victim in the middle of the chain");
ok(GdTest::poll_through_restart($node, 'SELECT true', 't'), 'the server accepts connections again');
# The count is in the history: a's retry (backoff 0s) may already have run and
# moved the row on to b, whose attempt starts at 1 again.
ok($node->poll_query_until('postgres', "SELECT string_agg(step || ':' || attempt, ',') FROM gd_history($killed) WHERE kind = 'retry'", 'a:1'),
	'the attempt is counted against step a, the step the round picked');
like(ledger($killed) // '', qr/^(a2)?$/, "the round rolled back whole: a's first write too (its retry may have run since)");
like($node->safe_psql('postgres', "SELECT error->>'message' FROM gd_history($killed) WHERE kind = 'retry'"),
	qr/the executor running step "b" \(run after step "a" in the same round\) died/, "the error names b, where it died");
is(held_at_gate('the retry'), $killed, "a's retry ran, then b is held again");
is(ledger($killed), 'a2', "a's retry committed on its own: a retry does not chain");
set_gate('true');
ok($node->poll_query_until('postgres', "SELECT status FROM gd.instances WHERE id = $killed", 'done'), 'the instance ends');
is(ledger($killed), 'a2,b1,c1', 'one ledger row per step');
set_gate('false');

# ---- 2. immediate shutdown mid-chain
my ($stopped) = insert_walks(1);
is(held_at_gate('immediate stop'), $stopped, 'held in step b again');
$node->stop('immediate');
$node->start;
is(held_at_gate('after the restart'), $stopped, 'after the restart the chain runs again');
is(ledger($stopped) // '', '', 'nothing of the interrupted round stayed');
is(row_of($stopped), 'runnable a 1', 'no attempt counted: the stop was not the step\'s doing');
set_gate('true');
ok($node->poll_query_until('postgres', "SELECT status FROM gd.instances WHERE id = $stopped", 'done'), 'the instance ends');
is(ledger($stopped), 'a1,b1,c1', 'one ledger row per step, each a first attempt');
set_gate('false');

# ---- 3. gd_cancel of the instance whose b is running
my ($cancelled) = insert_walks(1);
is(held_at_gate('cancel'), $cancelled, 'held in step b');
my $cancel = GdTest::start_cancel($node, $cancelled);
$cancel->{harness}->finish;
is($cancel->{out}, "t\n", 'gd_cancel returns true') or diag $cancel->{err};
is($node->safe_psql('postgres', "SELECT status || ' ' || (error->>'step') FROM gd.instances WHERE id = $cancelled"),
	'cancelled b', 'it is cancelled in step b');
is(ledger($cancelled), 'a1', "a's write committed with its transition; b's was rolled back");
is($node->safe_psql('postgres', "SELECT string_agg(step || ':' || kind, ',' ORDER BY entry) FROM gd_history($cancelled)"),
	'a:next', 'the history has a, which ran to its end');

# ---- 4. gd_cancel of an instance of the same round whose step is not running
my ($first, $second) = insert_walks(2);
is(held_at_gate('two in a round'), $first, 'the first instance is held in step b');
$cancel = GdTest::start_cancel($node, $second);
ok($node->poll_query_until('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT gd_cancel(%' AND wait_event_type = 'Lock'}, '1'),
	'the cancel of the second waits for its row, which the round holds');
set_gate('true');
$cancel->{harness}->finish;
is($cancel->{out}, "t\n", 'gd_cancel returns true once the round let go') or diag $cancel->{err};
is($node->safe_psql('postgres', "SELECT status || ' ' || (error->>'step') FROM gd.instances WHERE id = $second"),
	'cancelled c', 'the second is cancelled at its next step bound, c');
is(ledger($second), 'a1,b1', 'its a and b committed; c never ran');
ok($node->poll_query_until('postgres', "SELECT status FROM gd.instances WHERE id = $first", 'done'), 'the first ends');
is(ledger($first), 'a1,b1,c1', 'one ledger row per step of the first');

ok(!$node->log_contains(qr/PANIC|TRAP:|terminated by signal (6|11)/), 'no PANIC, assertion failure or segfault');
$node->stop;
done_testing();
