# Signals across a crash.  Every signal whose transaction committed before
# `pg_ctl stop -m immediate` is delivered after the restart, deduplicated ones
# exactly once; a signal whose transaction had not committed is gone.
#   - parked instances (awaiting_signal) that were woken by a signal just
#     before the crash resume after it, with the signal in ctx.signals;
#   - signals that arrive before their wait (the instance is parked on
#     another name, or has not run its first step yet) stay in the inbox and
#     are consumed by the later wait, after the restart;
#   - a signal of a name nobody waits for stays, unconsumed, in the inbox;
#   - a second immediate stop while the woken instances run rolls back the
#     rounds in flight, including their consumption of signals: those
#     signals are consumed again, once, by the rerun;
#   - a timed wait whose deadline passes while the server is down resumes
#     with ctx.timed_out after the restart.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 30;

my $n_parked  = 100;    # queue default: parked on 'go' before the signals
my $n_fresh   = 50;    # queue fresh (paused): not started when signalled
my $n_timed   = 20;     # parked on a 1 s timed wait across the downtime

my $node = GdTest::start_node(
	'crash_signals',
	'gen_durable.queues'          => 'default:2, fresh:1',
	'gen_durable.reaper_interval' => '200ms',
	'gen_durable.batch_size'      => 4,
);

# start -> (wait 'go') -> second -> (wait 'more') -> finish -> done;
# a timed wait that times out ends at 'second'.
# Every step writes what it received in ctx.signals; the PRIMARY KEY makes a
# signal delivered twice to one step an error (which would show as a retry).
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE TABLE received (
    instance  bigint NOT NULL,
    step      text   NOT NULL,
    name      text   NOT NULL,
    dedup_key text   NOT NULL,
    payload   jsonb  NOT NULL,
    timed_out boolean NOT NULL,
    PRIMARY KEY (instance, step, dedup_key));
CREATE TABLE steps_run (instance bigint, step text, PRIMARY KEY (instance, step));
CREATE FUNCTION sig_step(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO steps_run VALUES (ctx.id, ctx.step);
    INSERT INTO received
    SELECT ctx.id, ctx.step, s->>'name', coalesce(s->>'dedup_key', 'none:' || (s->'payload')::text), s->'payload', ctx.timed_out
      FROM jsonb_array_elements(ctx.signals) s;
    PERFORM pg_sleep(0.005);
    CASE ctx.step
        WHEN 'start' THEN
            RETURN gd_wait_signal(ARRAY['go'], then_step => 'second',
                                  timeout => (state->>'timeout')::interval);
        WHEN 'second' THEN
            IF ctx.timed_out THEN
                RETURN gd_done(jsonb_build_object('timed_out', true));
            END IF;
            RETURN gd_wait_signal(ARRAY['more'], then_step => 'finish');
        ELSE
            RETURN gd_done(jsonb_build_object('signals', ctx.signals));
    END CASE;
END $$;
SELECT gd_define_fsm('sig', 'start', 'default');
SELECT gd_define_fsm('sig_fresh', 'start', 'fresh');
SELECT gd_define_step(f, s, 'sig_step(jsonb, gd.context)'::regprocedure, 3, '100ms', '1s')
  FROM unnest('{sig,sig_fresh}'::text[]) f, unnest('{start,second,finish}'::text[]) s;
SELECT gd_pause('fresh');
});

my $parked = $node->safe_psql('postgres', qq{
SELECT string_agg(gd_insert('sig', correlation_key => 'parked-' || g)::text, ',' ORDER BY g)
  FROM generate_series(1, $n_parked) g});
my $fresh = $node->safe_psql('postgres', qq{
SELECT string_agg(gd_insert('sig_fresh', correlation_key => 'fresh-' || g)::text, ',' ORDER BY g)
  FROM generate_series(1, $n_fresh) g});
my $timed = $node->safe_psql('postgres', qq{
SELECT string_agg(gd_insert('sig', '{"timeout": "1s"}')::text, ',' ORDER BY g)
  FROM generate_series(1, $n_timed) g});

ok( $node->poll_query_until('postgres', qq{
SELECT count(*) FROM gd.instances WHERE id IN ($parked, $timed) AND status = 'awaiting_signal' AND step = 'start'},
		$n_parked + $n_timed),
	"$n_parked + $n_timed instances are parked on 'go'");
is($node->safe_psql('postgres', "SELECT string_agg(DISTINCT status, ',') FROM gd.instances WHERE id IN ($fresh)"),
	'runnable', "$n_fresh instances of the paused queue have not started");

# From here on no step runs until the restart: every signal below is only
# stored (and wakes the parked instances to runnable).
$node->safe_psql('postgres', "SELECT gd_pause('default')");

# Each signal in its own transaction (psql autocommit), half by id, half by
# correlation key; each deduplicated signal sent twice.
my @ids = (split(/,/, $parked), split(/,/, $fresh));
my %key;
{
	my $i = 0;
	$key{$_} = 'parked-' . ++$i for split /,/, $parked;
	$i = 0;
	$key{$_} = 'fresh-' . ++$i for split /,/, $fresh;
}
my $script = '';
my $expect_true  = 0;
my $expect_false = 0;
for my $id (@ids)
{
	my $target = ($id % 2) ? $id : "'$key{$id}'";
	$script .= qq{SELECT gd_signal($target, 'go', '{"g": $id}', 'go-$id');\n};
	$script .= qq{SELECT gd_signal($target, 'go', '{"g": -1}', 'go-$id');\n};      # duplicate
	$script .= qq{SELECT gd_signal($id, 'more', '{"m": 1}', 'm1-$id');\n};
	$script .= qq{SELECT gd_signal($id, 'more', '{"m": 1}', 'm1-$id');\n};         # duplicate
	$script .= qq{SELECT gd_signal($id, 'more', '{"m": 2}', 'm2-$id');\n};
	$script .= qq{SELECT gd_signal($id, 'noise', '{"x": 0}', 'noise-$id');\n};    # nobody waits for it
	$expect_true  += 4;
	$expect_false += 2;
}
my $answers = $node->safe_psql('postgres', $script);
my %seen;
$seen{$_}++ for split /\n/, $answers;
is($seen{t} // 0, $expect_true,  "$expect_true signals stored (gd_signal returned true)");
is($seen{f} // 0, $expect_false, "$expect_false duplicates refused (gd_signal returned false)");

# A signal in a transaction that never commits.
my $open = $node->background_psql('postgres');
my $ghost_target = (split /,/, $parked)[0];
$open->query_safe("BEGIN; SELECT gd_signal($ghost_target, 'more', '{\"ghost\": true}', 'ghost');");

is( $node->safe_psql('postgres', qq{
SELECT status || ' ' || step || ' ' || count(*) FROM gd.instances WHERE id IN ($parked) GROUP BY status, step}),
	"runnable second $n_parked",
	"before the crash: the parked instances were woken by 'go' (runnable at 'second', queue paused)");
is($node->safe_psql('postgres', qq{SELECT count(*) FROM steps_run WHERE step <> 'start'}),
	'0', 'before the crash: no step after the wait has run');

# ---------------------------------------------------------------------------
# Crash: immediate stop, start
# ---------------------------------------------------------------------------
my $off = -s $node->logfile;
$node->stop('immediate');
eval { $open->quit; };
sleep 1.2;    # the 1 s timed waits expire while the server is down
$node->start;
ok($node->log_contains(qr/database system was interrupted|automatic recovery in progress/, $off),
	'restart after immediate stop ran crash recovery');

is( $node->safe_psql('postgres', "SELECT count(*) FROM gd.signals WHERE dedup_key = 'ghost'"),
	'0', 'the uncommitted signal is gone');
is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM gd.signals WHERE instance_id IN ($parked, $fresh)}),
	4 * ($n_parked + $n_fresh), 'every committed signal is in the inboxes (4 per instance, duplicates stored once)');

# The paused queues stay paused across the restart; resume them.
is($node->safe_psql('postgres', "SELECT string_agg(name, ',' ORDER BY name) FROM gd.queues WHERE paused"),
	'default,fresh', 'pause survives the restart');
$node->safe_psql('postgres', "SELECT gd_resume('default'), gd_resume('fresh')");

# A second immediate stop while the woken instances are being run.
ok( $node->poll_query_until('postgres', qq{
SELECT count(*) >= 20 FROM steps_run WHERE step <> 'start' AND instance IN ($parked, $fresh)}),
	'after the restart the woken instances run');
my $before_second = $node->safe_psql('postgres', qq{
SELECT count(*) FROM gd.instances WHERE id IN ($parked, $fresh) AND status = 'done'});
$node->stop('immediate');
$node->start;
cmp_ok($before_second, '<', $n_parked + $n_fresh,
	"second immediate stop while steps ran ($before_second of " . ($n_parked + $n_fresh) . ' done)');

ok( $node->poll_query_until('postgres', qq{
SELECT count(*) FROM gd.instances WHERE id IN ($parked, $fresh, $timed) AND status = 'done'},
		$n_parked + $n_fresh + $n_timed),
	'every instance is done')
  or diag $node->safe_psql('postgres', qq{
SELECT status, step, count(*) FROM gd.instances GROUP BY 1, 2 ORDER BY 1, 2});

# ---------------------------------------------------------------------------
# Delivered, once each
# ---------------------------------------------------------------------------
my $all = "$parked, $fresh";
is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM gd.instances i
 WHERE i.id IN ($all)
   AND (SELECT string_agg(r.step || ':' || r.name || ':' || r.payload::text, ' ' ORDER BY r.step, r.dedup_key)
          FROM received r WHERE r.instance = i.id)
       IS DISTINCT FROM format('finish:more:{"m": 1} finish:more:{"m": 2} second:go:{"g": %s}', i.id)}),
	'0',
	"each instance got 'go' once (its first payload) in ctx.signals of 'second', and the two 'more' once each in 'finish'");
is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM gd.instances
 WHERE id IN ($all) AND (attempt <> 1 OR error IS NOT NULL OR jsonb_array_length(result->'signals') <> 2)}),
	'0', 'no step was retried (a signal delivered twice would have hit the PRIMARY KEY)');
is( $node->safe_psql('postgres', qq{
SELECT count(*) FILTER (WHERE consumed_at IS NOT NULL) || ' consumed, '
       || count(*) FILTER (WHERE consumed_at IS NULL AND name = 'noise') || ' noise left, '
       || count(*) FILTER (WHERE consumed_at IS NULL AND name <> 'noise') || ' other left'
  FROM gd.signals WHERE instance_id IN ($all)}),
	3 * ($n_parked + $n_fresh) . ' consumed, ' . ($n_parked + $n_fresh) . ' noise left, 0 other left',
	"the awaited signals are consumed; the 'noise' signal nobody waited for stays in the inbox");
is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM received WHERE instance IN ($timed)}),
	'0', 'the timed waits got no signal');
is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM steps_run s WHERE s.instance IN ($timed) AND s.step = 'second'}),
	$n_timed, 'the timed waits that expired during the downtime resumed at their then_step');
is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM gd.instances WHERE id IN ($timed) AND result = '{"timed_out": true}'}),
	$n_timed, '... with ctx.timed_out = true');

$node->stop;
done_testing();
