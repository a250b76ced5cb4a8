# Property-style test: 2,100 random API calls, valid and invalid,
# from three concurrent sessions, while background executors serve one
# queue, the sessions step another (gd._execute) and play external workers
# on both (claim, complete, complete twice, abandon a claim, release,
# heartbeat, complete with garbage).  The calls are generated from a fixed
# seed (printed; set GD_PROPERTY_SEED to replay one): the same seed gives the
# same scripts, though not the same interleaving.
#
# Instances follow a plan carried in their state: each step does plan[n]
# (next, go external, wait for a signal with or without a timeout, spawn
# children, schedule later, fail once, retry once, fail for good, stop, done)
# and every step that moves the state on writes one ledger row (instance, n)
# in its own transaction, and records the signals it consumed.  After the run
# the test drives everything to a terminal status and checks:
#   - the server is up, no internal error was raised, every error message of
#     the API starts with "gen_durable:" (or is PostgreSQL's own for a
#     malformed literal);
#   - every instance has a valid status; terminal ones have finished_at,
#     live ones do not; runnable ones have no wait_* columns; awaiting_signal
#     ones wait for some names; leases only on executing rows;
#   - a parent awaiting_children has a live child, or the reaper resumes it;
#   - every step's ledger row exists exactly once: for each instance the rows
#     are n = 0 .. state.n - 1, no gap, no duplicate (nothing lost, nothing twice);
#   - every signal belongs to an existing instance; every signal a step
#     consumed is marked consumed, and was seen by exactly one step;
#   - nothing is stuck: everything reaches a terminal status.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use POSIX qw(WNOHANG);
use Time::HiRes qw(time usleep);

$PostgreSQL::Test::Utils::timeout_default = 30;

my $seed = $ENV{GD_PROPERTY_SEED} // 20261202;
my $sessions = 3;
my $calls_per_session = 700;
note("GD_PROPERTY_SEED=$seed ($sessions sessions x $calls_per_session calls)");
srand($seed);

my $node = GdTest::start_node(
	'property',
	'gen_durable.queues'          => 'pa:2',
	'gen_durable.poll_interval'   => '100ms',
	'gen_durable.reaper_interval' => '100ms',
	'gen_durable.lease'           => '1s',
	'gen_durable.batch_size'      => 4,
	max_connections               => 40,
	log_statement                 => 'none',
	log_min_error_statement       => 'panic',
);

$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE SCHEMA prop;
-- One row per step that moved an instance's state on (n -> n + 1); no
-- unique constraint, so a duplicate would be counted, not refused.
CREATE TABLE prop.ledger (instance bigint NOT NULL, n int NOT NULL, step text NOT NULL, attempt int NOT NULL,
                          runner text NOT NULL);
CREATE INDEX ON prop.ledger (instance, n);
-- Tags of the signals each committed step consumed.
CREATE TABLE prop.seen (tag text NOT NULL, instance bigint NOT NULL);
-- Every call: its kind and result.
CREATE TABLE prop.log (session int, k int, kind text, code text, message text);

-- What plan[n] does; shared by in-database steps and the external worker.
-- Writes the ledger row (and consumed tags) for every outcome that moves the
-- state on; a failed attempt leaves nothing (its writes roll back).
CREATE FUNCTION prop.decide(state jsonb, ctx gd.context, runner text) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
DECLARE
    n int := (state->>'n')::int;
    act text := coalesce(state->'plan'->>n, 'done');
    moved jsonb;
BEGIN
    IF act = 'raise1' THEN
        IF ctx.attempt = 1 THEN
            INSERT INTO prop.ledger VALUES (ctx.id, n, ctx.step, ctx.attempt, runner);   -- rolled back
            RAISE EXCEPTION 'planned failure of attempt 1';
        END IF;
        act := 'next';
    ELSIF act = 'retry1' THEN
        IF ctx.attempt = 1 THEN
            RETURN gd_retry('{"planned": true}'::jsonb, '0s');
        END IF;
        act := 'next';
    ELSIF act = 'raise' THEN
        INSERT INTO prop.ledger VALUES (ctx.id, n, ctx.step, ctx.attempt, runner);       -- rolled back
        RAISE EXCEPTION 'planned failure, every attempt';
    END IF;
    INSERT INTO prop.seen SELECT s->'payload'->>'tag', ctx.id FROM jsonb_array_elements(ctx.signals) s
     WHERE s->'payload' ? 'tag';
    IF act = 'stop' THEN
        RETURN gd_stop(jsonb_build_object('planned', 'stop', 'n', n));
    ELSIF act = 'done' THEN
        RETURN gd_done(jsonb_build_object('n', n));
    END IF;
    INSERT INTO prop.ledger VALUES (ctx.id, n, ctx.step, ctx.attempt, runner);
    moved := state || jsonb_build_object('n', n + 1);
    RETURN CASE act
        WHEN 'next' THEN gd_next(CASE WHEN n % 2 = 0 THEN 's2' ELSE 's1' END, moved)
        WHEN 'ext' THEN gd_next('x', moved)
        WHEN 'later' THEN gd_next('s1', moved, '150ms')
        WHEN 'wait' THEN gd_wait_signal('{go}', NULL, 's1', moved)
        WHEN 'wait_t' THEN gd_wait_signal('{go,other}', '300ms', 's1', moved)
        WHEN 'spawn' THEN gd_spawn(coalesce(state->'children', '[]'), 's1', moved - 'children')
        ELSE gd_next('s1', moved)
    END;
END $$;
CREATE FUNCTION prop.step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql
AS $$ SELECT prop.decide(state, ctx, 'db') $$;

SELECT gd_define_fsm('p', initial => 's1', queue => 'pa', state_defaults => '{"n": 0, "plan": []}');
SELECT gd_define_step('p', 's1', 'prop.step(jsonb, gd.context)'::regprocedure, max_attempts => 3, backoff => '20ms', max_backoff => '100ms');
SELECT gd_define_step('p', 's2', 'prop.step(jsonb, gd.context)'::regprocedure, max_attempts => 3, backoff => '20ms', max_backoff => '100ms');
SELECT gd_define_step('p', 'x', NULL, max_attempts => 4, backoff => '20ms', max_backoff => '100ms');
INSERT INTO gd._queues (name) VALUES ('pm') ON CONFLICT DO NOTHING;   -- the manual queue: stepped by gd._execute

-- Run one call; log its result.
CREATE FUNCTION prop.call(session int, k int, kind text, statement text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    code text := 'ok';
    message text;
BEGIN
    BEGIN
        EXECUTE statement;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
    END;
    INSERT INTO prop.log VALUES (session, k, kind, code, left(message, 300));
END $$;

-- A random instance id of some kind (or one that does not exist).
CREATE FUNCTION prop.pick(what text) RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce((SELECT i.id FROM gd.instances i
                      WHERE CASE what
                                WHEN 'parked' THEN i.status = 'awaiting_signal'
                                WHEN 'live' THEN i.status IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children')
                                WHEN 'failed' THEN i.status = 'failed'
                                WHEN 'keyed' THEN i.correlation_key IS NOT NULL
                                ELSE true END
                      ORDER BY random() LIMIT 1), -1)
$$;

-- A random correlation key in use (or NULL).
CREATE FUNCTION prop.pick_key() RETURNS text LANGUAGE sql AS $$
    SELECT i.correlation_key FROM gd.instances i WHERE i.correlation_key IS NOT NULL ORDER BY random() LIMIT 1
$$;

-- Play an external worker on a queue, in one of several manners.
CREATE FUNCTION prop.work(queue text, worker text, max int, manner text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    c record;
    o gd.outcome;
    done int := 0;
BEGIN
    FOR c IN SELECT * FROM gd_claim(queue, worker, max) LOOP
        IF manner = 'abandon' THEN
            CONTINUE;                                   -- the lease (1 s) runs out; the reaper reclaims it
        ELSIF manner = 'release' THEN
            PERFORM gd_release(c.id, c.lease_token);
            CONTINUE;
        ELSIF manner = 'heartbeat' THEN
            PERFORM gd_heartbeat(c.id, c.lease_token, '2s');
        ELSIF manner = 'garbage' THEN
            BEGIN
                PERFORM gd_complete(c.id, c.lease_token, ROW('explode', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::gd.outcome);
            EXCEPTION WHEN invalid_parameter_value THEN
                NULL;                                   -- refused; the claim is still ours
            END;
        END IF;
        BEGIN
            BEGIN
                o := prop.decide(c.state, c.ctx, 'ext');
            EXCEPTION WHEN raise_exception THEN
                o := gd_retry(jsonb_build_object('message', SQLERRM));
            END;
            IF NOT gd_complete(c.id, c.lease_token, o) THEN
                RAISE EXCEPTION USING ERRCODE = 'P0003', MESSAGE = 'stale';   -- undo our ledger row
            END IF;
            done := done + 1;
            IF manner = 'double' AND gd_complete(c.id, c.lease_token, gd_done()) THEN
                RAISE EXCEPTION 'a second completion of one claim was accepted';
            END IF;
        EXCEPTION WHEN SQLSTATE 'P0003' THEN
            NULL;
        END;
    END LOOP;
    RETURN done;
END $$;
});

# ---------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------
my @actions = (
	('next') x 6, ('ext') x 4, ('later') x 2, ('wait') x 3, ('wait_t') x 3,
	('spawn') x 2, ('raise1') x 2, ('retry1') x 2, 'raise', 'stop', 'done');

sub pick { return $_[ int(rand(@_)) ]; }

sub gen_plan
{
	my ($max_len, $allow_spawn) = @_;
	my @plan;
	for (1 .. 1 + int(rand($max_len)))
	{
		my $a = pick(@actions);
		$a = 'next' if $a eq 'spawn' && !$allow_spawn;
		push @plan, $a;
	}
	return '[' . join(',', map { "\"$_\"" } @plan) . ']';
}

sub child_list
{
	my @c;
	for (1 .. 1 + int(rand(3)))
	{
		my $q = rand() < 0.5 ? '' : ', "queue": "pm"';
		push @c, sprintf('{"fsm": "p", "state": {"plan": %s}%s}', gen_plan(3, 0), $q);
	}
	return '[' . join(', ', @c) . ']';
}

sub state_literal
{
	my $children = child_list();
	return sprintf(q{'{"plan": %s, "children": %s}'}, gen_plan(6, 1), $children);
}

sub lit { my ($s) = @_; $s =~ s/'/''/g; return "'$s'"; }

my %kinds;
sub gen_call
{
	my ($s, $k) = @_;
	my $tag = "s$s-$k";
	my $queue = rand() < 0.6 ? 'pa' : 'pm';
	my $r = rand();
	my ($kind, $sql);
	if ($r < 0.22)
	{
		$kind = 'insert';
		my @opt;
		push @opt, "queue => '$queue'";
		push @opt, 'priority => ' . (int(rand(7)) - 3) if rand() < 0.3;
		push @opt, "correlation_key => 'ck-" . int(rand(60)) . "'" if rand() < 0.3;
		push @opt, "on_duplicate => '" . pick('error', 'existing', 'skip') . "'" if rand() < 0.3;
		push @opt, "schedule_in => '" . int(rand(300)) . " ms'" if rand() < 0.2;
		push @opt, "step => '" . pick('s1', 's2', 'x') . "'" if rand() < 0.2;
		$sql = sprintf('SELECT gd_insert(%s, %s, %s)', lit('p'), state_literal(), join(', ', @opt));
	}
	elsif ($r < 0.27)
	{
		$kind = 'insert_all';
		my @e = map { sprintf('{"state": {"plan": %s}, "queue": "%s"%s}', gen_plan(4, 0), $queue,
				rand() < 0.3 ? ', "correlation_key": "ck-' . int(rand(60)) . '"' : '') } 1 .. 1 + int(rand(4));
		$sql = sprintf("SELECT count(*) FROM gd_insert_all('p', %s)", lit('[' . join(', ', @e) . ']'));
	}
	elsif ($r < 0.42)
	{
		$kind = 'signal';
		my $name = rand() < 0.8 ? 'go' : pick('other', 'nobody', '');
		my $dedup = rand() < 0.3 ? lit('d' . int(rand(20))) : 'NULL';
		my $target = rand() < 0.2 ? "prop.pick_key()"
		  : rand() < 0.9 ? "prop.pick('parked')" : "prop.pick('any')";
		$sql = sprintf(q{SELECT gd_signal(%s, %s, '{"tag": "%s"}', %s)}, $target, lit($name), $tag, $dedup);
	}
	elsif ($r < 0.47)
	{
		$kind = 'cancel';
		$sql = sprintf("SELECT gd_cancel(prop.pick('%s'), 'random')", pick('live', 'any'));
	}
	elsif ($r < 0.52)
	{
		$kind = 'retry';
		$sql = "SELECT gd_retry(prop.pick('failed'))";
	}
	elsif ($r < 0.56)
	{
		$kind = pick('pause', 'resume', 'resume');
		$sql = sprintf("SELECT gd_%s('%s')", $kind, pick('pa', 'pm'));
	}
	elsif ($r < 0.70)
	{
		$kind = 'work';
		my $manner = pick('complete', 'complete', 'complete', 'double', 'abandon', 'release', 'heartbeat', 'garbage');
		$sql = sprintf("SELECT prop.work('%s', 'w%d', %d, '%s')", $queue, $s, 1 + int(rand(5)), $manner);
	}
	elsif ($r < 0.80)
	{
		$kind = 'execute';
		$sql = sprintf("SELECT gd._execute('pm', %d)", 1 + int(rand(8)));
	}
	elsif ($r < 0.83)
	{
		$kind = 'await';
		$sql = sprintf("SELECT * FROM gd_await(prop.pick('any'), '%d ms', '%s')", int(rand(50)),
			pick('settled', 'terminal'));
	}
	elsif ($r < 0.85)
	{
		$kind = 'redefine';
		$sql = sprintf("SELECT gd_define_step('p', '%s', 'prop.step(jsonb, gd.context)'::regprocedure, max_attempts => %d, backoff => '%d ms', max_backoff => '100ms')",
			pick('s1', 's2'), 2 + int(rand(3)), int(rand(40)));
	}
	elsif ($r < 0.865)
	{
		# A completion or heartbeat with a token that owns nothing (tokens are
		# positive): false.
		$kind = 'stale';
		$sql = pick("SELECT gd_complete(prop.pick('live'), -1, gd_done())", "SELECT gd_heartbeat(prop.pick('any'), -2)",
			"SELECT gd_release(prop.pick('any'), -3)");
	}
	elsif ($r < 0.88)
	{
		$kind = 'constructor';
		$sql = pick(
			"SELECT gd_next('s1', '{\"n\": 1}', '1 ms')", "SELECT gd_wait_signal('{go}', '1s', 's2')",
			"SELECT gd_spawn('[]', 's1')", "SELECT gd_done('{}')", "SELECT gd_stop('{}')",
			"SELECT gd_retry('{}'::jsonb, '1s')");
	}
	else
	{
		# Invalid calls across the API.
		$kind = 'invalid';
		$sql = pick(
			"SELECT gd_insert('nope')",
			"SELECT gd_insert(NULL)",
			"SELECT gd_insert('p', '[1]')",
			"SELECT gd_insert('p', NULL)",
			"SELECT gd_insert('p', queue => 'nowhere')",
			"SELECT gd_insert('p', step => 'nowhere')",
			"SELECT gd_insert('p', priority => NULL)",
			"SELECT gd_insert('p', weight => 0)",
			"SELECT gd_insert('p', schedule_in => '-1s')",
			"SELECT gd_insert('p', correlation_key => '')",
			"SELECT gd_insert('p', correlation_scope => '{bogus}')",
			"SELECT gd_insert('p', on_duplicate => 'maybe')",
			"SELECT gd_insert('p', '{\"plan\": []}', eligible_at => now(), schedule_in => '1s')",
			"SELECT gd_insert_all('p', '{}')",
			"SELECT gd_insert_all('p', '[{\"bogus\": 1}]')",
			"SELECT gd_insert_all('p', '[{\"weight\": \"heavy\"}]')",
			"SELECT gd_signal(prop.pick('any'), '')",
			"SELECT gd_signal(prop.pick('any'), 'go', NULL)",
			"SELECT gd_signal(-1, 'go')",
			"SELECT gd_signal('no-such-key', 'go')",
			"SELECT * FROM gd_await(NULL)",
			"SELECT * FROM gd_await(prop.pick('any'), '-1s')",
			"SELECT * FROM gd_await(prop.pick('any'), '0s', 'whenever')",
			"SELECT gd_pause('nowhere')",
			"SELECT gd_resume(NULL)",
			"SELECT * FROM gd_claim('nowhere', 'w')",
			"SELECT * FROM gd_claim('pa', '')",
			"SELECT * FROM gd_claim('pa', 'w', 0)",
			"SELECT * FROM gd_claim('pa', 'w', 1, '-1s')",
			"SELECT gd_complete(prop.pick('any'), NULL, gd_done())",
			"SELECT gd_complete(prop.pick('any'), 1, NULL)",
			"SELECT gd_heartbeat(prop.pick('any'), 1, '0s')",
			"SELECT gd_release(NULL, 1)",
			"SELECT gd_next(NULL)",
			"SELECT gd_next('s1', '[]')",
			"SELECT gd_next('s1', NULL, '-1s')",
			"SELECT gd_retry('{}'::jsonb, '-1s')",
			"SELECT gd_wait_signal('{}')",
			"SELECT gd_wait_signal(NULL)",
			"SELECT gd_spawn('{}', 's1')",
			"SELECT gd_spawn('[]', NULL)",
			"SELECT gd_define_step('p', '')",
			"SELECT gd_define_step('nope', 's1')",
			"SELECT gd_define_step('p', 's1', 'now()'::regprocedure)",
			"SELECT gd_define_step('p', 's1', max_attempts => 0)",
			"SELECT gd_define_fsm('', 's1')",
			"SELECT gd_define_fsm('p2', 's1', 'pa', 1, '[]')",
			"SELECT gd_insert('p', '{\"a\": 1')",
			"SELECT gd_insert('p', schedule_in => 'later')",
			"SELECT gd_cancel('abc')");
	}
	$kinds{$kind}++;
	return sprintf("SELECT prop.call(%d, %d, '%s', %s);\n", $s, $k, $kind, lit($sql));
}

my @scripts;
for my $s (1 .. $sessions)
{
	my $script = sprintf("SELECT setseed(%.6f);\n", (($seed * 7 + $s) % 1000) / 1000);
	$script .= gen_call($s, $_) for 1 .. $calls_per_session;
	push @scripts, $script;
}
note('calls per kind: ' . join(', ', map { "$_ $kinds{$_}" } sort keys %kinds));

# ---------------------------------------------------------------------------
# Run the sessions concurrently
# ---------------------------------------------------------------------------
my $t0 = time();
my %running;    # pid -> session
for my $s (0 .. $#scripts)
{
	my $file = $node->basedir . "/session_$s.sql";
	PostgreSQL::Test::Utils::append_to_file($file, $scripts[$s]);
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDOUT, '>', $node->basedir . "/session_$s.out") or POSIX::_exit(127);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(127);
		exec('psql', '-XAtq', '-d', $node->connstr('postgres'), '-v', 'ON_ERROR_STOP=1', '-f', $file)
		  or POSIX::_exit(127);
	}
	$running{$pid} = $s + 1;
}
# While they run, every committed snapshot must satisfy the row invariants.
my $snapshot_check = q{
SELECT count(*) FILTER (WHERE status IN ('done', 'failed', 'cancelled') AND finished_at IS NULL)
     + count(*) FILTER (WHERE status NOT IN ('done', 'failed', 'cancelled') AND finished_at IS NOT NULL)
     + count(*) FILTER (WHERE status IN ('runnable', 'executing')
                          AND (wait_names IS NOT NULL OR wait_deadline IS NOT NULL OR wait_then_step IS NOT NULL))
     + count(*) FILTER (WHERE status = 'awaiting_signal' AND coalesce(cardinality(wait_names), 0) = 0)
     + count(*) FILTER (WHERE (status = 'executing') <> (lease_token IS NOT NULL))
     + count(*) FILTER (WHERE jsonb_typeof(state) <> 'object')
  FROM gd.instances};
my ($snapshots, $bad_snapshots) = (0, 0);
my $all_ok = 1;
my $run_deadline = time() + 90;
while (%running && time() < $run_deadline)
{
	for my $pid (keys %running)
	{
		next unless waitpid($pid, WNOHANG) == $pid;
		my $s = delete $running{$pid};
		if ($? != 0)
		{
			$all_ok = 0;
			diag("session $s exited $?: " . slurp_file($node->basedir . '/session_' . ($s - 1) . '.out'));
		}
	}
	my ($rc, $out) = $node->psql('postgres', $snapshot_check);
	if ($rc == 0)
	{
		$snapshots++;
		$bad_snapshots++ if $out ne '0';
	}
	usleep(100_000);
}
if (%running)
{
	$all_ok = 0;
	diag('sessions still running after 90 s: ' . join(' ', values %running));
	kill 'KILL', keys %running;
	waitpid($_, 0) for keys %running;
}
ok($all_ok, sprintf('%d sessions ran %d calls each (%.1fs)', $sessions, $calls_per_session, time() - $t0));
is($node->safe_psql('postgres', 'SELECT count(*) FROM prop.log'),
	$sessions * $calls_per_session, 'every call was logged');
is($bad_snapshots, 0, "row invariants held in every snapshot taken during the run ($snapshots)");
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'the server is up');
ok(!$node->log_contains(qr/server process .* was terminated by signal|PANIC|TRAP:/),
	'no backend crashed');

# What the calls answered.
note("results:\n" . $node->safe_psql('postgres', q{
SELECT kind || ': ' || string_agg(code || ' x' || n, ', ' ORDER BY n DESC)
  FROM (SELECT kind, code, count(*) AS n FROM prop.log GROUP BY 1, 2) x GROUP BY kind ORDER BY kind}));
is( $node->safe_psql('postgres', q{
SELECT string_agg(DISTINCT code || ' ' || message, E'\n') FROM prop.log WHERE code LIKE 'XX%' OR code LIKE '58%'}),
	'', 'no internal error');
# Errors of the API start with "gen_durable:", except PostgreSQL's own for
# malformed literals, unknown signatures, serialization/deadlock (a client retries).
is( $node->safe_psql('postgres', q{
SELECT string_agg(DISTINCT kind || ': ' || code || ' ' || message, E'\n') FROM prop.log
 WHERE code <> 'ok' AND message NOT LIKE 'gen_durable: %'
   AND code NOT IN ('22P02', '22007', '42883', '42725', '40001', '40P01')
   AND NOT (kind = 'work' AND message LIKE 'planned failure%')}),
	'', 'every other error message starts with "gen_durable:"');
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM prop.log WHERE kind = 'invalid' AND code = 'ok'}),
	'0', 'every invalid call was refused');
is( $node->safe_psql('postgres', q{
SELECT string_agg(DISTINCT kind || ': ' || code || ' ' || message, E'\n') FROM prop.log
 WHERE kind IN ('work', 'execute', 'redefine', 'constructor', 'await', 'pause', 'resume', 'retry', 'cancel', 'stale')
   AND code NOT IN ('ok', '40P01', '40001') AND NOT (kind = 'retry' AND code = '23505')}),
	'', 'valid calls that cannot legitimately fail did not fail');

# ---------------------------------------------------------------------------
# Drive everything to a terminal status
# ---------------------------------------------------------------------------
my $settle = q{
SELECT gd_resume('pa'), gd_resume('pm');
DO $$
DECLARE
    parked bigint;
BEGIN
    FOR parked IN SELECT id FROM gd.instances WHERE status = 'awaiting_signal' LOOP
        BEGIN
            PERFORM gd_signal(parked, 'go', jsonb_build_object('tag', 'settle-' || parked || '-' || clock_timestamp()));
        EXCEPTION WHEN no_data_found THEN
            NULL;   -- it moved on meanwhile (its timed wait ended, it was cancelled)
        END;
    END LOOP;
END $$;
SELECT gd_cancel(id, 'settle: scheduled too far') FROM gd.instances WHERE status = 'runnable' AND eligible_at > now() + interval '10 seconds';
SELECT gd._execute('pm', 200);
SELECT prop.work('pa', 'settler', 200, 'complete');
SELECT prop.work('pm', 'settler', 200, 'complete');
SELECT count(*) FROM gd.instances WHERE status IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children');
};
my $live = -1;
my $deadline = time() + 30;
while (time() < $deadline)
{
	my @out = split /\n/, $node->safe_psql('postgres', $settle);
	$live = $out[-1];
	last if $live eq '0';
	usleep(100_000);
}
is($live, '0', 'every instance reached a terminal status (nothing stuck)')
  or diag $node->safe_psql('postgres', q{
SELECT status, step, queue, external, count(*), min(eligible_at), bool_or(lease_token IS NOT NULL) AS leased
  FROM gd.instances WHERE status NOT IN ('done', 'failed', 'cancelled') GROUP BY 1, 2, 3, 4});
note('final: ' . $node->safe_psql('postgres',
	"SELECT string_agg(status || ' ' || n, ', ' ORDER BY status) FROM (SELECT status, count(*) AS n FROM gd.instances GROUP BY 1) x"));
cmp_ok($node->safe_psql('postgres', "SELECT count(*) FROM gd.instances WHERE status = 'done'"), '>', 100,
	'a good number of instances completed');

# ---------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------
my %invariant = (
	'every status is valid' => q{
SELECT count(*) FROM gd.instances WHERE status NOT IN
  ('runnable', 'executing', 'awaiting_signal', 'awaiting_children', 'done', 'failed', 'cancelled')},
	'terminal instances have finished_at' => q{
SELECT count(*) FROM gd.instances WHERE status IN ('done', 'failed', 'cancelled') AND finished_at IS NULL},
	'live instances have no finished_at' => q{
SELECT count(*) FROM gd.instances WHERE status NOT IN ('done', 'failed', 'cancelled') AND finished_at IS NOT NULL},
	'no runnable or executing instance has wait_* set' => q{
SELECT count(*) FROM gd.instances WHERE status IN ('runnable', 'executing')
   AND (wait_names IS NOT NULL OR wait_deadline IS NOT NULL OR wait_then_step IS NOT NULL)},
	'awaiting_signal instances wait for some names' => q{
SELECT count(*) FROM gd.instances WHERE status = 'awaiting_signal' AND coalesce(cardinality(wait_names), 0) = 0},
	'leases only on executing rows' => q{
SELECT count(*) FROM gd.instances WHERE (status = 'executing') <> (lease_token IS NOT NULL)},
	'every state is a JSON object' => q{
SELECT count(*) FROM gd.instances WHERE jsonb_typeof(state) <> 'object'},
	'children point at existing parents' => q{
SELECT count(*) FROM gd.instances c WHERE c.parent_id IS NOT NULL
   AND NOT EXISTS (SELECT FROM gd.instances p WHERE p.id = c.parent_id)},
	'no ledger row twice (nothing twice)' => q{
SELECT count(*) FROM (SELECT instance, n FROM prop.ledger GROUP BY 1, 2 HAVING count(*) > 1) x},
	'ledger rows are exactly n = 0 .. state.n - 1 per instance (nothing lost)' => q{
SELECT count(*) FROM gd.instances i
 WHERE (SELECT count(DISTINCT l.n) FILTER (WHERE l.n BETWEEN 0 AND (i.state->>'n')::int - 1) FROM prop.ledger l WHERE l.instance = i.id)
       <> (i.state->>'n')::int
    OR EXISTS (SELECT FROM prop.ledger l WHERE l.instance = i.id AND l.n >= (i.state->>'n')::int)},
	'no ledger row of an unknown instance' => q{
SELECT count(*) FROM prop.ledger l WHERE NOT EXISTS (SELECT FROM gd.instances i WHERE i.id = l.instance)},
	'done instances report the n of their state' => q{
SELECT count(*) FROM gd.instances WHERE status = 'done' AND (result->>'n')::int IS DISTINCT FROM (state->>'n')::int},
	'every signal belongs to an existing instance' => q{
SELECT count(*) FROM gd.signals s WHERE NOT EXISTS (SELECT FROM gd.instances i WHERE i.id = s.instance_id)},
	'every signal a step consumed is marked consumed' => q{
SELECT count(*) FROM prop.seen x JOIN gd.signals s ON s.payload->>'tag' = x.tag AND s.instance_id = x.instance
 WHERE s.consumed_at IS NULL},
	'every consumed tag names a stored signal of that instance' => q{
SELECT count(*) FROM prop.seen x WHERE NOT EXISTS
  (SELECT FROM gd.signals s WHERE s.payload->>'tag' = x.tag AND s.instance_id = x.instance)},
	'each signal was consumed by one step only' => q{
SELECT count(*) FROM (SELECT tag FROM prop.seen GROUP BY tag HAVING count(*) > 1) x},
	'a dedup key is stored once per instance' => q{
SELECT count(*) FROM (SELECT instance_id, dedup_key FROM gd.signals WHERE dedup_key IS NOT NULL GROUP BY 1, 2 HAVING count(*) > 1) x},
	'consumed signals were delivered before they were consumed' => q{
SELECT count(*) FROM gd.signals WHERE consumed_at < delivered_at},
	'awaiting_children parents have a live child' => q{
SELECT count(*) FROM gd.instances p WHERE p.status = 'awaiting_children'
   AND NOT EXISTS (SELECT FROM gd.instances c WHERE c.parent_id = p.id
                    AND c.status IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children'))},
	'a correlation key is held by one instance at most' => q{
SELECT count(*) FROM (SELECT correlation_key FROM gd.instances WHERE correlation_key IS NOT NULL AND status = ANY (correlation_scope) GROUP BY 1 HAVING count(*) > 1) x},
);
# All in one query (one psql run): name|violations per line.
my @names = sort keys %invariant;
my %got = map { split /\|/, $_, 2 } split /\n/, $node->safe_psql('postgres',
	join("\nUNION ALL\n", map { my $n = $names[$_]; "SELECT $_, ($invariant{$n})" } 0 .. $#names) . "\nORDER BY 1");
is($got{$_} // 'missing', '0', "invariant: $names[$_]") for 0 .. $#names;
note($node->safe_psql('postgres', q{
SELECT 'ledger rows: ' || (SELECT count(*) FROM prop.ledger) || ' (db ' || (SELECT count(*) FROM prop.ledger WHERE runner = 'db')
       || ', ext ' || (SELECT count(*) FROM prop.ledger WHERE runner = 'ext') || '), signals: '
       || (SELECT count(*) FROM gd.signals) || ' (' || (SELECT count(*) FROM gd.signals WHERE consumed_at IS NOT NULL)
       || ' consumed), children: ' || (SELECT count(*) FROM gd.instances WHERE parent_id IS NOT NULL)}));
ok(!$node->log_contains(qr/server process .* was terminated by signal|PANIC|TRAP:/),
	'still no crash after the checks');
note("replay with GD_PROPERTY_SEED=$seed");

$node->stop;
done_testing();
