# The reaper's scans for timed-out waits and expired leases go on from a
# mark (src/rounds.hpp, DeadlineScan), past the entries a held horizon keeps.
# What a mark can pass by is still found: a wait, or a lease, whose deadline
# a scan passed before it committed (here a transaction held open across its
# deadline) times out, or is reclaimed, by the scan from the front that
# follows within 10 s.  And the reaper's other duties are not starved while
# waits keep timing out: a lease expires and is reclaimed in the middle of a
# stream of timeouts.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

$PostgreSQL::Test::Utils::timeout_default = 60;

my $node = GdTest::start_node('deadline_scans', 'gen_durable.reaper_interval' => '200ms');
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE FUNCTION park(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.timed_out THEN
        RETURN gd_done('{"timed_out": true}');
    END IF;
    RETURN gd_wait_signal(ARRAY['never'], interval '1 hour');
END $$;
SELECT gd_define_fsm('waiter', initial => 'park', queue => 'default');
SELECT gd_define_step('waiter', 'park', handler => 'park(jsonb, gd.context)'::regprocedure);
CREATE FUNCTION tick(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.timed_out THEN
        RETURN gd_done();
    END IF;
    RETURN gd_wait_signal(ARRAY['never'], greatest((state->>'at')::timestamptz - clock_timestamp(), interval '0'));
END $$;
SELECT gd_define_fsm('ticker', initial => 'tick', queue => 'default');
SELECT gd_define_step('ticker', 'tick', handler => 'tick(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('claimed', initial => 'work', queue => 'outside');
SELECT gd_define_step('claimed', 'work');
});

# A wait parked for an hour; then its deadline set to the start of a
# transaction that stays open for 3 s, while the reaper's scans (every
# 200 ms) move their mark past it.
my $waiter = $node->safe_psql('postgres', q{SELECT gd_insert('waiter')});
$node->poll_query_until('postgres', "SELECT status = 'awaiting_signal' FROM gd.instances WHERE id = $waiter")
  or die 'the waiter never parked';
$node->safe_psql('postgres', qq{
BEGIN;
UPDATE gd._instances SET wait_deadline = now() WHERE id = $waiter;
SELECT pg_sleep(3);
COMMIT;
});
ok($node->poll_query_until('postgres', "SELECT result->>'timed_out' = 'true' FROM gd.instances WHERE id = $waiter"),
	'a wait whose deadline the scans passed before it committed still times out');

# The same for a lease: claimed for an hour, its expiry set back in a
# transaction held open across it.
my $claimed = $node->safe_psql('postgres', q{SELECT gd_insert('claimed')});
$node->safe_psql('postgres', q{SELECT count(*) FROM gd_claim('outside', 'w', 1, interval '1 hour')});
$node->safe_psql('postgres', qq{
BEGIN;
UPDATE gd._instances SET lease_expires_at = now() WHERE id = $claimed;
SELECT pg_sleep(3);
COMMIT;
});
ok( $node->poll_query_until(
		'postgres', "SELECT status = 'runnable' AND lease_owner IS NULL AND attempt = 2 FROM gd.instances WHERE id = $claimed"),
	'a lease whose expiry the scans passed before it committed is still reclaimed');

# A stream of timeouts: 30,000 waits ending over 6 s, from 20 s after they
# are inserted (5,000 a second: a round of the reaper always finds some due).
# Leases of 1 s taken as the stream begins are reclaimed within it.
$node->safe_psql('postgres', q{
SELECT gd_insert('ticker', jsonb_build_object('at', now() + make_interval(secs => 20 + g / 5000.0))) FROM generate_series(1, 30000) g});
$node->poll_query_until('postgres', q{SELECT count(*) > 0 FROM gd.instances WHERE fsm = 'ticker' AND status = 'done'})
  or die 'no wait timed out';
$node->safe_psql('postgres', q{SELECT gd_insert('claimed')});
is($node->safe_psql('postgres', q{SELECT count(*) FROM gd_claim('outside', 'w', 10, interval '1 second')}),
	'2', 'leases of 1 s are taken while the waits time out (the instance above, and one more)');
ok( $node->poll_query_until(
		'postgres', q{SELECT bool_and(status = 'runnable' AND lease_owner IS NULL) FROM gd.instances WHERE fsm = 'claimed'}),
	'the leases are reclaimed');
cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM gd.instances WHERE fsm = 'ticker' AND status = 'awaiting_signal'}),
	'>', 0, 'while waits were still timing out: rounds that end waits do not put off the leases');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 30000 FROM gd.instances WHERE fsm = 'ticker' AND status = 'done'}),
	'every wait timed out');

$node->stop;
done_testing();
