# Schedules fired by the engine's reaper, against the wall clock: a schedule
# every second starts each tick exactly once through a kill -9 of the
# postmaster; the catch_up policies across a 5-second downtime; overlap =
# skip with a step longer than the period; and the promotion of a standby
# (ticks go on on the new primary, none twice).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 60;

my $node = GdTest::start_node('schedules', '-init' => { allows_streaming => 1 },
	'gen_durable.queues' => 'default:2', 'gen_durable.reaper_interval' => '1s');
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
-- Each tick's step writes its tick once: a second run would fail the key.
CREATE TABLE ticks (schedule text, tick timestamptz, node text DEFAULT current_setting('cluster_name'),
                    PRIMARY KEY (schedule, tick));
CREATE FUNCTION record_tick(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ticks (schedule, tick) VALUES (state->>'schedule', (state->>'scheduled_at')::timestamptz);
    PERFORM pg_sleep((state->>'sleep')::float8) WHERE state ? 'sleep';
    RETURN gd_done();
END $$;
SELECT gd_define_fsm('tick', initial => 'record',
                     steps => '{"record": {"handler": "public.record_tick(jsonb, gd.context)"}}');
});

# How the ticks of a schedule lie: count, distinct, span in seconds, largest gap.
sub tick_shape
{
	my ($on, $schedule) = @_;
	return $on->safe_psql('postgres', qq{
SELECT count(*), count(DISTINCT tick), extract(epoch FROM max(tick) - min(tick))::int,
       coalesce(max(gap), 0)::int
  FROM (SELECT tick, extract(epoch FROM tick - lag(tick) OVER (ORDER BY tick)) AS gap
          FROM ticks WHERE schedule = '$schedule') t});
}

sub schedule_counts
{
	my ($on, $schedule) = @_;
	return split /\|/, $on->safe_psql('postgres',
		"SELECT runs, skipped FROM gd.schedules WHERE name = '$schedule'");
}

sub wait_ticks
{
	my ($on, $schedule, $at_least) = @_;
	$on->poll_query_until('postgres',
		"SELECT count(*) >= $at_least FROM ticks WHERE schedule = '$schedule'")
	  or die "schedule $schedule did not reach $at_least ticks";
}

sub running
{
	my ($pid) = @_;
	open(my $stat, '<', "/proc/$pid/stat") or return 0;
	my ($state) = (<$stat> =~ /\) (\S)/);
	return $state ne 'Z';
}

# ------------------------------------------------------------ kill -9 of the postmaster
$node->safe_psql('postgres', q{
SELECT gd_schedule('crash', '@every 1 second', 'tick', '{"schedule": "crash"}', catch_up => 'all')});
wait_ticks($node, 'crash', 3);
my $postmaster = $node->{_pid};
my @workers = split /\n/, $node->safe_psql('postgres', 'SELECT pid FROM gd.workers');
$node->kill9;
my $killed_at = time();
usleep(20_000) while (grep { running($_) } @workers, $postmaster) && time() - $killed_at < 30;
sleep(2);    # down for a couple of ticks: catch_up => 'all' starts them at the restart
$node->start;
my $restarted_at = time();
wait_ticks($node, 'crash', 3 + int(time() - $killed_at) + 3);
$node->safe_psql('postgres', q{SELECT gd_pause_schedule('crash')});
my ($count, $distinct, $span, $gap) = split /\|/, tick_shape($node, 'crash');
is($distinct, $count, "kill -9: $count ticks, none started twice");
is($span, $count - 1, 'kill -9: one tick for every second from the first to the last, none lost');
my ($runs, $skipped) = schedule_counts($node, 'crash');
is($runs, $count, 'kill -9: the schedule counted each tick it started once');
is($skipped, '0', 'kill -9: no tick skipped (catch_up all)');
cmp_ok($span, '>=', int($restarted_at - $killed_at), 'kill -9: the ticks span the downtime');

# ------------------------------------------------------------ catch_up across 5 s of downtime
$node->safe_psql('postgres', q{
SELECT gd_schedule('catch_' || c, '@every 1 second', 'tick', jsonb_build_object('schedule', 'catch_' || c),
                   catch_up => c)
  FROM unnest(ARRAY['none', 'latest', 'all']) c});
wait_ticks($node, "catch_$_", 2) for qw(none latest all);
$node->stop('fast');
sleep(5);
$node->start;
wait_ticks($node, 'catch_none', 5);
usleep(2_500_000);
$node->safe_psql('postgres',
	q{SELECT gd_pause_schedule(name) FROM gd.schedules WHERE name LIKE 'catch_%'});
my %skipped;
for my $policy (qw(none latest all))
{
	my ($c, $d, $s, $g) = split /\|/, tick_shape($node, "catch_$policy");
	my ($r, $k) = schedule_counts($node, "catch_$policy");
	is($d, $c, "catch_up $policy: no tick twice");
	is($r + $k, $s + 1, "catch_up $policy: every tick from the first to the last either started or skipped");
	$skipped{$policy} = $k;
	if ($policy eq 'all') { is($g, 1, 'catch_up all: no gap') }
	else { cmp_ok($g, '>=', 4, "catch_up $policy: a gap of $g s for the downtime") }
}
cmp_ok($skipped{none}, '>=', 4, "catch_up none skipped the $skipped{none} ticks missed");
is($skipped{latest}, $skipped{none} - 1, 'catch_up latest started the latest of them, skipped the others');
is($skipped{all}, 0, 'catch_up all skipped none');

# ------------------------------------------------------------ overlap = skip, a step longer than the period
$node->safe_psql('postgres', q{
SELECT gd_schedule('slow', '@every 1 second', 'tick', '{"schedule": "slow", "sleep": 2.5}', overlap => 'skip')});
wait_ticks($node, 'slow', 3);
$node->safe_psql('postgres', q{SELECT gd_pause_schedule('slow')});
my ($overlapping) = $node->safe_psql('postgres', q{
SELECT count(*) FROM gd.instances a JOIN gd.instances b ON a.id < b.id
 WHERE a.correlation_key LIKE 'schedule:slow:%' AND b.correlation_key LIKE 'schedule:slow:%'
   AND b.created_at < a.finished_at});
is($overlapping, '0', 'overlap skip: no instance started while the previous one ran');
(undef, undef, undef, $gap) = split /\|/, tick_shape($node, 'slow');
cmp_ok($gap, '>=', 3, "overlap skip: ticks $gap s apart with a 2.5 s step");
($runs, $skipped) = schedule_counts($node, 'slow');
cmp_ok($skipped, '>=', 2 * ($runs - 1), "overlap skip: $skipped ticks skipped for $runs started");

# ------------------------------------------------------------ overlap = buffer_one
# A tick held back starts when the previous instance ends: the reaper is
# woken by that commit (its longest sleep is made 10 s here, the period 4 s).
$node->safe_psql('postgres', q{
ALTER SYSTEM SET gen_durable.reaper_interval = '10s';
SELECT pg_reload_conf();
SELECT gd_schedule('buffered', '*/4 * * * * *', 'tick', '{"schedule": "buffered", "sleep": 5}',
                   overlap => 'buffer_one')});
wait_ticks($node, 'buffered', 3);
$node->safe_psql('postgres', q{
SELECT gd_pause_schedule('buffered');
ALTER SYSTEM RESET gen_durable.reaper_interval;
SELECT pg_reload_conf();});
my ($earliest, $handover) = split /\|/, $node->safe_psql('postgres', q{
SELECT min(extract(epoch FROM b.created_at - a.finished_at)), max(extract(epoch FROM b.created_at - a.finished_at))
  FROM gd.instances a JOIN gd.instances b ON b.id = (SELECT min(c.id) FROM gd.instances c
                                                    WHERE c.id > a.id AND c.correlation_key LIKE 'schedule:buffered:%')
 WHERE a.correlation_key LIKE 'schedule:buffered:%' AND a.finished_at IS NOT NULL});
cmp_ok($handover, '<', 1, sprintf('buffer_one: the held tick started %.3f s after the previous ended', $handover));
cmp_ok($earliest, '>=', 0, 'buffer_one: each instance started after the previous one ended (5 s steps every 4 s)');

# ------------------------------------------------------------ a tick that raises
# The reaper's round raises, is fired again one tick at a time: the poisoned
# tick is skipped with its error, the healthy schedule misses nothing.
$node->safe_psql('postgres', q{
CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state ? 'poison' THEN
        RAISE EXCEPTION 'poisoned tick';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_poison BEFORE INSERT ON gd._instances FOR EACH ROW EXECUTE FUNCTION refuse_poison();
SELECT gd_schedule('poisoned', '@every 1 second', 'tick', '{"schedule": "poisoned", "poison": true}');
SELECT gd_schedule('healthy', '@every 1 second', 'tick', '{"schedule": "healthy"}');});
wait_ticks($node, 'healthy', 4);
$node->safe_psql('postgres', q{
SELECT gd_pause_schedule('poisoned'), gd_pause_schedule('healthy');
DROP TRIGGER refuse_poison ON gd._instances;});
($count, $distinct, $span) = split /\|/, tick_shape($node, 'healthy');
is($span, $count - 1, "a poisoned neighbour: the healthy schedule started all its $count ticks");
my ($poison_runs, $poison_skipped, $poison_error) = split /\|/, $node->safe_psql('postgres',
	q{SELECT runs, skipped, last_error FROM gd.schedules WHERE name = 'poisoned'});
is($poison_runs, '0', 'the poisoned schedule started nothing');
cmp_ok($poison_skipped, '>=', 3, "it skipped its $poison_skipped ticks");
is($poison_error, 'poisoned tick', 'with the error');

# ------------------------------------------------------------ promotion of a standby
$node->safe_psql('postgres', q{
SELECT gd_schedule('failover', '@every 1 second', 'tick', '{"schedule": "failover"}')});
$node->backup('bkp');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'bkp', has_streaming => 1);
$standby->append_conf('postgresql.conf', "cluster_name = 'standby'\n");
$standby->start;
wait_ticks($node, 'failover', 3);
$node->wait_for_catchup($standby);
my $fired_on_primary = $node->safe_psql('postgres', q{SELECT count(*) FROM ticks WHERE schedule = 'failover'});
$node->stop('immediate');
$standby->promote;
wait_ticks($standby, 'failover', $fired_on_primary + 3);
my ($on_standby) = $standby->safe_psql('postgres',
	q{SELECT count(*) FROM ticks WHERE schedule = 'failover' AND node = 'standby'});
cmp_ok($on_standby, '>=', 3, "promotion: the new primary fired $on_standby ticks");
($count, $distinct) = split /\|/, tick_shape($standby, 'failover');
is($distinct, $count, 'promotion: no tick started twice across the two primaries');
is($standby->safe_psql('postgres', q{
SELECT count(*) FROM gd.instances WHERE correlation_key LIKE 'schedule:failover:%'
 GROUP BY correlation_key HAVING count(*) > 1}), '', 'promotion: one instance per tick');

done_testing();
