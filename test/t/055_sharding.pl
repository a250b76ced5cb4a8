# One engine across servers with PL/Proxy (sharding/): a router and two shard
# servers holding four partitions (p0, p2 on one; p1, p3 on the other).
# Through the router: definitions on every partition; inserts by key (each on
# the partition its key hashes to) and without (spread), one at a time and
# with gd_insert_all; ids naming their partition; signals by key and by id;
# gd_await; a spawn whose children stay on their parent's partition;
# gd_cancel; the aggregated queue stats; bad input raising what the
# partition's engine raises; router roles mapped to their own users, the
# engine's rights and grants (accepted by their grantees) holding through
# the router, and none of its calls resolved in a schema another role made
# on a partition; one external worker process serving every partition.  A
# shard server stopped: its partitions' calls fail naming the partition, the
# others go on, and nothing is lost when it is back.  A partition made again
# receives the definitions, with owners whose names must be quoted and
# grants accepted or not.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $sharding = GdTest::project_file("sharding");
my $partitions = 4;
my %shard_of = (0 => 'a', 1 => 'b', 2 => 'a', 3 => 'b');
my %shards = (
	a => GdTest::start_node('shard_a', 'gen_durable.database' => 'p0, p2'),
	b => GdTest::start_node('shard_b', 'gen_durable.database' => 'p1, p3'));
my $router = GdTest::start_node('router');
my $user = getpwuid($<);

for my $p (0 .. $partitions - 1)
{
	my $node = $shards{ $shard_of{$p} };
	$node->safe_psql('postgres', "CREATE DATABASE p$p");
	$node->safe_psql("p$p", q{
CREATE EXTENSION gen_durable;
CREATE FUNCTION ship(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'pack' AND state ? 'children' THEN
        RETURN gd_spawn(jsonb_build_array(jsonb_build_object('fsm', 'order', 'state', '{}'::jsonb),
                                          jsonb_build_object('fsm', 'order', 'state', '{}'::jsonb)), then_step => 'done');
    END IF;
    IF ctx.step = 'pack' AND state ? 'wait' THEN
        RETURN gd_wait_signal(ARRAY['paid'], then_step => 'done');
    END IF;
    RETURN gd_done(jsonb_build_object('partition', current_database()));
END $$;
});
	my ($out, $err) = run_command([ 'psql', '-X', '-q', '-d', $node->connstr("p$p"), '-v', "partition=$p",
		'-v', "partitions=$partitions", '-f', "$sharding/partition.sql" ]);
	is($err, '', "partition $p set up");
}
my $servers = join(', ', map {
	my $node = $shards{ $shard_of{$_} };
	"p$_ 'dbname=p$_ host=" . $node->host . ' port=' . $node->port . "'"
} 0 .. $partitions - 1);
$router->safe_psql('postgres', qq{
CREATE EXTENSION plproxy;
CREATE SERVER gd_partitions FOREIGN DATA WRAPPER plproxy OPTIONS (connection_lifetime '60', $servers);
CREATE USER MAPPING FOR PUBLIC SERVER gd_partitions OPTIONS (user '$user');
});
my ($out, $err) = run_command([ 'psql', '-X', '-q', '-d', $router->connstr('postgres'), '-f', "$sharding/router.sql" ]);
is($err, '', 'the router set up');

sub routed { return $router->safe_psql('postgres', $_[0]) }

# A correlation key starting with $prefix that routes to partition $p.
sub key_on
{
	my ($p, $prefix) = @_;
	return routed("SELECT k FROM (SELECT '$prefix-' || n AS k FROM generate_series(1, 1000) n) keys
	                WHERE hashtext(k) & " . ($partitions - 1) . " = $p ORDER BY k LIMIT 1");
}

sub on_partition
{
	my ($p, $sql) = @_;
	return $shards{ $shard_of{$p} }->safe_psql("p$p", $sql);
}

# Definitions reach every partition.
is(routed(q{SELECT gd_define_fsm('order', initial => 'pack', steps => '{"pack": {"handler": "public.ship(jsonb, gd.context)"},
                                                                        "done": {"handler": "public.ship(jsonb, gd.context)"}}')}),
	'1', 'gd_define_fsm through the router');
is(join(',', map { on_partition($_, q{SELECT count(*) FROM gd.fsms WHERE name = 'order'}) } 0 .. 3), '1,1,1,1',
	'defined on every partition');

# By key: on the partition the key hashes to; without: spread; each id names its partition.
my %keyed;
$keyed{"order-$_"} = routed("SELECT gd_insert('order', '{\"wait\": true}', correlation_key => 'order-$_')") for 1 .. 16;
my @loose = map { routed(q{SELECT gd_insert('order')}) } 1 .. 16;
my @misplaced;
for my $key (sort keys %keyed)
{
	my $p = routed("SELECT hashtext('$key') & " . ($partitions - 1));
	push @misplaced, $key
	  unless on_partition($p, "SELECT count(*) FROM gd.instances WHERE correlation_key = '$key' AND id = $keyed{$key}") eq '1';
	push @misplaced, "$key id" unless $keyed{$key} % $partitions == $p;
}
is(join(', ', @misplaced), '', 'every keyed instance on the partition its key hashes to, its id naming it');
my %used = map { $_ % $partitions => 1 } @loose;
cmp_ok(scalar(keys %used), '>=', 2, 'instances without a key spread over partitions');
my $ids = join(',', @loose);
ok($router->poll_query_until('postgres',
		"SELECT bool_and(status = 'done' AND result->>'partition' = 'p' || (id % $partitions))
		   FROM unnest('{$ids}'::bigint[]) id, gd_await(id, '1s')"),
	'each ran on the partition its id names (gd_await through the router)');

# gd_insert_all: each entry on its key's partition, in the order given.
my @batch_keys = map { "batch-$_" } 1 .. 8;
my @batch = split /\n/, routed(q{SELECT gd_insert_all('order', '[} . join(', ', map { qq({"correlation_key": "$_"}) } @batch_keys) . q{]')});
is(scalar(@batch), 8, 'gd_insert_all through the router: an id for every entry');
is(join(',', map { $batch[$_] % $partitions } 0 .. 7),
	join(',', map { routed("SELECT hashtext('$_') & " . ($partitions - 1)) } @batch_keys),
	'each on the partition its key hashes to');

# Instances sharing a limit key and no correlation key share its partition,
# so the limit holds for all of them, as on one engine.
my @limited = map { routed(q{SELECT gd_insert('order', concurrency_key => 'room:7')}) } 1 .. 4;
push @limited, split /\n/, routed(q{SELECT gd_insert_all('order', '[{"concurrency_key": "room:7"}, {"concurrency_key": "room:7"}]')});
is(join(',', map { $_ % $partitions } @limited), join(',', (routed(q{SELECT hashtext('room:7') & 3})) x 6),
	'instances with one concurrency key and no correlation key: all on the partition the key hashes to');

# Signals by key and by id, then gd_await.
my ($first, $second) = @keyed{ 'order-1', 'order-2' };
ok($router->poll_query_until('postgres',
		"SELECT bool_and(status = 'awaiting') FROM unnest(ARRAY[$first, $second]) id, gd_await(id, '1s')"),
	'the keyed instances wait for their signal');
is(routed(q{SELECT gd_signal('order-1', 'paid', '{"amount": 5}')}), 't', 'signal by key');
is(routed("SELECT gd_signal(${second}::bigint, 'paid')"), 't', 'signal by id');
is(routed("SELECT string_agg(status, ',') FROM unnest(ARRAY[$first, $second]) id, gd_await(id, '10s', 'terminal')"),
	'done,done', 'both done');

# A repair and the step history through the router, on the id's partition.
my $stuck = routed(q{SELECT gd_insert('order', '{"wait": true}', correlation_key => 'stuck')});
ok($router->poll_query_until('postgres', "SELECT status = 'awaiting' FROM gd_await($stuck, '1s')"), 'an order waits');
is(routed("SELECT gd_rewind($stuck, 'pack')"), 't', 'gd_rewind through the router');
ok($router->poll_query_until('postgres', "SELECT status = 'awaiting' FROM gd_await($stuck, '1s')"),
	'it ran its step again, and waits again');
is(routed("SELECT string_agg(step || ':' || kind || ':' || (detail->>'from_status'), ',' ORDER BY entry) FROM gd_history($stuck)"),
	'pack:rewind:awaiting_signal', 'gd_history through the router: the rewind, recorded on the id\'s partition');

# Children stay on their parent's partition.
my $parent = routed(q{SELECT gd_insert('order', '{"children": true}', correlation_key => 'family')});
is(routed("SELECT status FROM gd_await($parent, '10s', 'terminal')"), 'done', 'the parent ended after its children')
  or diag routed("SELECT error FROM gd_await($parent, '1s')");
my $p = $parent % $partitions;
is(on_partition($p, "SELECT count(*) FROM gd.instances WHERE parent_id = $parent AND id % $partitions = $p"), '2',
	'its two children on its partition');

# More definitions everywhere; a schedule on one partition.
routed(q{SELECT gd_define_step('order', 'audit', handler => 'public.ship(jsonb, gd.context)')});
is(join(',', map { on_partition($_, q{SELECT count(*) FROM gd.steps WHERE fsm = 'order' AND step = 'audit'}) } 0 .. 3),
	'1,1,1,1', 'gd_define_step through the router: on every partition');
routed(q{SELECT gd_set_concurrency_limit('room', 2)});
routed(q{SELECT gd_set_owner_weight('postgres', 4)});
is(join(',', map { on_partition($_, q{SELECT weight FROM gd.owner_weights}) } 0 .. 3), '4,4,4,4',
	'gd_set_owner_weight through the router: on every partition');
is(routed(q{SELECT gd_drop_concurrency_limit('room')}), 't', 'a limit set and dropped on every partition');
routed(q{SELECT gd_schedule('nightly', '0 3 * * *', 'order')});
is(routed(q{SELECT partition || ' ' || (partition = 'p' || (hashtext('nightly') & 3)) FROM gd_router.schedules}),
	'p' . routed(q{SELECT hashtext('nightly') & 3}) . ' true', 'a schedule on the partition its name hashes to, once');
is(routed(q{SELECT gd_unschedule('nightly')}), 't', 'and gone');

# gd_cancel, the aggregated stats, the engine's errors unchanged.
is(routed("SELECT gd_cancel($keyed{'order-3'})"), 't', 'gd_cancel by id');
is(routed(q{SELECT cancelled FROM gd_router.queue_stats WHERE queue = 'default'}), '1', 'aggregated queue stats');
$router->safe_psql('postgres', q{
CREATE FUNCTION try(statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    code text;
    message text;
BEGIN
    EXECUTE statement;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
    RETURN code || ' ' || message;
END $$;
});
# Bad input: the same SQLSTATE and message through the router as from the
# partition's engine itself (psql's verbose "ERROR:  <SQLSTATE>: <message>").
sub error_of
{
	my ($node, $database, $sql) = @_;
	my (undef, undef, $stderr) = $node->psql($database, "\\set VERBOSITY verbose\n$sql");
	return $stderr =~ /ERROR:  (\w{5}: [^\n]*)/ ? $1 : "no error ($stderr)";
}
my $key4_partition = routed(q{SELECT hashtext('order-4') & 3});
for my $bad ([ 'an unknown FSM', q{SELECT gd_insert('no_such_fsm', correlation_key => 'x')},
		routed(q{SELECT hashtext('x') & 3}), qr/^42704: gen_durable: unknown FSM/ ],
	[ 'a duplicate key', q{SELECT gd_insert('order', correlation_key => 'order-4')}, $key4_partition,
		qr/^23505: gen_durable: correlation key 'order-4'/ ],
	[ 'no target', q{SELECT gd_signal(-8::bigint, 'paid')}, 0, qr/^P0002: gen_durable: signal 'paid': instance -8/ ])
{
	my ($what, $sql, $p, $expected) = @$bad;
	my $through_router = error_of($router, 'postgres', $sql);
	like($through_router, $expected, "$what through the router: the engine's SQLSTATE and message");
	is($through_router, error_of($shards{ $shard_of{$p} }, "p$p", $sql), "$what: as the partition's engine says it");
}
my ($rc, $stdout, $stderr) = $router->psql('postgres', q{SELECT gd_define_fsm('order', initial => 'nowhere')});
like($stderr, qr/ERROR:  gen_durable: [^\n]*\n(?:DETAIL:  [^\n]*\n)?[^\n]*\(on partition p[0-3]\)/,
	'a definition refused: the engine\'s message, the partition after the detail') or diag $stderr;

# Each router role mapped to its own user on the partitions: the engine's
# per-role rights hold through the router, and grants reach every partition.
for my $node ($router, values %shards)
{
	$node->safe_psql('postgres', 'CREATE ROLE alice LOGIN; CREATE ROLE bob LOGIN; CREATE ROLE "Team A" LOGIN');
}
$router->safe_psql('postgres', q{
CREATE USER MAPPING FOR alice SERVER gd_partitions OPTIONS (user 'alice');
CREATE USER MAPPING FOR bob SERVER gd_partitions OPTIONS (user 'bob');
CREATE USER MAPPING FOR "Team A" SERVER gd_partitions OPTIONS (user 'Team A');
GRANT USAGE ON FOREIGN SERVER gd_partitions TO alice, bob, "Team A";
});
sub routed_as { my ($role, $sql) = @_; return routed("SET ROLE $role; $sql") }

# Name squatting: mallory, who may create schemas on the partitions, makes
# schemas alice and bob there (first on their default search_path, "$user",
# public), each with a function of every API name and signature that
# records that it ran.  The router sends only qualified names, so the routed
# calls below reach the engine's functions, never mallory's.
$_->safe_psql('postgres', 'CREATE ROLE mallory') for values %shards;
for my $p (0 .. $partitions - 1)
{
	on_partition($p, qq{GRANT CREATE ON DATABASE p$p TO mallory; SET ROLE mallory;} . q{
DO $$
DECLARE
    victim text;
    api record;
BEGIN
    FOREACH victim IN ARRAY ARRAY['alice', 'bob'] LOOP
        EXECUTE format('CREATE SCHEMA %1$I; GRANT USAGE ON SCHEMA %1$I TO PUBLIC;
                        CREATE TABLE %1$I.ran (call text); GRANT INSERT ON %1$I.ran TO PUBLIC', victim);
        FOR api IN SELECT p.oid, p.proname, p.proretset OR p.prorettype = 'void'::regtype AS bare
                     FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'gd\_%' LOOP
            EXECUTE format('CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L', victim, api.proname,
                           pg_get_function_arguments(api.oid), pg_get_function_result(api.oid),
                           format('BEGIN INSERT INTO %I.ran VALUES (%L); RETURN %s; END', victim, api.proname,
                                  CASE WHEN api.bare THEN '' ELSE 'NULL' END));
        END LOOP;
    END LOOP;
END $$;
});
}
on_partition(0, q{SET ROLE alice; SELECT gd_cancel(-1)});
is(on_partition(0, q{SELECT string_agg(call, ',') FROM alice.ran}), 'gd_cancel',
	'the squat works: alice\'s unqualified call on a partition runs mallory\'s function');
on_partition(0, q{TRUNCATE alice.ran});

routed_as('alice', q{SELECT gd_define_fsm('invoice', initial => 'pack', steps => '{"pack": {"handler": "public.ship(jsonb, gd.context)"},
                                                                                 "done": {"handler": "public.ship(jsonb, gd.context)"}}')});
is(join(',', map { on_partition($_, q{SELECT owner::text FROM gd.fsms WHERE name = 'invoice'}) } 0 .. 3),
	'alice,alice,alice,alice', 'an FSM defined through the router belongs to the router role\'s user everywhere');
my $invoice = routed_as('alice', q{SELECT gd_insert('invoice', '{"wait": true}', correlation_key => 'inv-1')});
is(routed_as('bob', q{SELECT try($$SELECT gd_insert('invoice')$$)}),
	"42501 gen_durable: permission denied for FSM 'invoice'", 'another role may not insert alice\'s FSM');
is(routed_as('bob', "SELECT status FROM gd_await($invoice, '0s')"), 'not_found', 'nor see her instance');
is(routed_as('bob', q{SELECT try($$SELECT gd_signal('inv-1', 'paid')$$)}) =~ s/ .*//r, 'P0002', 'nor signal it by key');
is(routed_as('bob', q{SELECT try($$SELECT gd_grant('invoice', 'bob')$$)}) =~ s/ .*//r, '42501', 'nor grant it himself');
routed_as('alice', q{SELECT gd_grant('invoice', 'bob')});
is(join(',', map { on_partition($_, q{SELECT string_agg(role::text, ',') FROM gd.grants WHERE fsm = 'invoice'}) } 0 .. 3),
	'bob,bob,bob,bob', 'gd_grant through the router: on every partition');
is(routed_as('bob', q{SELECT try($$SELECT gd_signal('inv-1', 'paid')$$)}) =~ s/ .*//r, 'P0002',
	'granted, not yet accepted: a signal by key does not look in her FSM');
is(routed_as('bob', q{SELECT gd_accept_grant('invoice')}), 't', 'gd_accept_grant through the router');
is(join(',', map { on_partition($_, q{SELECT accepted FROM gd.grants WHERE fsm = 'invoice'}) } 0 .. 3), 't,t,t,t',
	'accepted on every partition');
is(routed_as('bob', q{SELECT gd_signal('inv-1', 'paid')}), 't', 'granted and accepted: bob signals her instance by key');
my $bobs = routed_as('bob', q{SELECT gd_insert('invoice')});
is(routed_as('bob', q{SELECT count(*) FROM gd_insert_all('invoice', '[{}, {}]')}), '2', 'in a batch too');
is(routed_as('bob', "SELECT string_agg(status, ',') FROM unnest(ARRAY[$invoice, $bobs]) id, gd_await(id, '10s', 'terminal')"),
	'done,done', 'and inserts his own');
is(routed_as('alice', q{SELECT gd_revoke('invoice', 'bob')}), 't', 'gd_revoke through the router');
is(routed_as('bob', q{SELECT try($$SELECT gd_insert('invoice')$$)}) =~ s/ .*//r, '42501', 'revoked everywhere');
routed_as('alice', q{SELECT gd_grant('invoice', 'bob')});
# A role whose name must be quoted owns an FSM, granted to bob, who accepts it.
routed_as('"Team A"', q{SELECT gd_define_fsm('report', initial => 'print', steps => '{"print": {}}')});
routed_as('"Team A"', q{SELECT gd_grant('report', 'bob')});
is(routed_as('bob', q{SELECT gd_accept_grant('report', 'bob')}), 't', 'bob accepts the grant of "Team A"\'s FSM');
is(join(',', map { on_partition($_, q{SELECT count(*) FROM alice.ran}) + on_partition($_, q{SELECT count(*) FROM bob.ran}) }
		0 .. 3), '0,0,0,0', 'none of mallory\'s functions ran through the router');

# External workers: one process serving every partition (lanes in each
# database: a claim waits for the work of its own database).
routed(q{SELECT gd_define_fsm('label', initial => 'print', steps => '{"print": {}}')});
my $handlers = $router->basedir . '/label_handlers.py';
PostgreSQL::Test::Utils::append_to_file($handlers, q{
from gen_durable import done

def print_label(state, ctx):
    database = ctx.connection.execute("SELECT pg_catalog.current_database()").fetchone()[0]
    return done({"partition": database})

HANDLERS = {("label", "print"): print_label}
});
local $ENV{PYTHONPATH} = GdTest::project_file("clients/python");
my $worker = IPC::Run::start(
	[ '/usr/bin/python3', '-m', 'gen_durable', 'worker', '--handlers', $handlers, '--wait', '30',
	  map { ('--dsn', $shards{ $shard_of{$_} }->connstr("p$_")) } 0 .. $partitions - 1 ],
	'>', \my $worker_out, '2>', \my $worker_err);
my @labels = split /\n/, routed(q{
SELECT gd_insert('label', correlation_key => key)
  FROM (SELECT key, row_number() OVER (PARTITION BY hashtext(key) & 3) AS nth
          FROM (SELECT 'label-' || n AS key FROM generate_series(1, 64) n) k) keys
 WHERE nth <= 3});
is(scalar(@labels), 12, 'three labels for each partition');
my $label_ids = join(',', @labels);
ok($router->poll_query_until('postgres',
		"SELECT bool_and(status = 'done' AND result->>'partition' = 'p' || (id % $partitions))
		   FROM unnest('{$label_ids}'::bigint[]) id, gd_await(id, '1s')"),
	'one worker process ran the external steps of every partition, each on its own')
  or diag $worker_err;
$worker->signal('TERM');
ok($worker->finish, 'and drained on SIGTERM') or diag $worker_err;

# A shard server down: its partitions' calls fail naming the partition; the others go on; nothing lost.
$shards{b}->stop('immediate');
my ($down) = grep { $_ % 2 == 1 } map { $keyed{"order-$_"} } 5 .. 16;
my ($up) = grep { $_ % 2 == 0 } map { $keyed{"order-$_"} } 5 .. 16;
like(routed("SELECT try('SELECT gd_signal(${down}::bigint, ''paid'')')"),
	qr/^08006 gen_durable: partition p[13] is unreachable: .*connection to server .* failed/,
	'a call for a partition of the stopped server fails naming it');
is(routed("SELECT gd_signal(${up}::bigint, 'paid')"), 't', 'the other server\'s partitions go on');
my $even_key = key_on(0, 'even');
is(routed(qq{SELECT count(*) FROM gd_insert_all('order', '[{"correlation_key": "$even_key"}]')}), '1',
	'gd_insert_all to a partition that is up');
$shards{b}->start;
is(routed("SELECT gd_signal(${down}::bigint, 'paid')"), 't', 'back: the call goes through');
is(routed("SELECT string_agg(status, ',') FROM unnest(ARRAY[$down, $up]) id, gd_await(id, '10s', 'terminal')"),
	'done,done', 'and nothing was lost');

# Moving a partition to another server (the README's procedure): p1, with
# an instance waiting for a signal, from shard b to shard a.
my $key1 = key_on(1, 'moving');
my $moving = routed("SELECT gd_insert('order', '{\"wait\": true}', correlation_key => '$key1')");
ok($router->poll_query_until('postgres', "SELECT status = 'awaiting' FROM gd_await($moving, '1s')"),
	'an instance on p1 waits for its signal');
$router->safe_psql('postgres', q{ALTER SERVER gd_partitions OPTIONS (SET p1 'dbname=p1 host=/nonexistent')});
like(routed(qq{SELECT try('SELECT gd_signal(''$key1'', ''paid'')')}), qr/^08006 gen_durable: partition p1 is unreachable/,
	'1. the router holds p1\'s calls back');
$shards{b}->append_conf('postgresql.conf', "gen_durable.database = 'p3'");
$shards{b}->reload;
ok($shards{b}->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = 'p1' AND backend_type <> 'client backend'}),
	'2. shard b no longer serves p1');
my $dump = $shards{b}->basedir . '/p1.dump';
($out, $err) = run_command([ 'pg_dump', '-Fc', '-d', $shards{b}->connstr('p1'), '-f', $dump ]);
is($err, '', '3. p1 dumped');
$shards{a}->safe_psql('postgres', 'CREATE DATABASE p1');
($out, $err) = run_command([ 'pg_restore', '-d', $shards{a}->connstr('p1'), $dump ]);
is($err, '', '   and restored on shard a');
($out, $err) = run_command([ 'psql', '-X', '-q', '-d', $shards{a}->connstr('p1'), '-v', 'partition=1',
	'-v', "partitions=$partitions", '-f', "$sharding/partition.sql" ]);
is($err, '', '   partition.sql run there again');
$shards{a}->append_conf('postgresql.conf', "gen_durable.database = 'p0, p1, p2'");
$shards{a}->reload;
$shard_of{1} = 'a';
my $p1_at_a = 'dbname=p1 host=' . $shards{a}->host . ' port=' . $shards{a}->port;
$router->safe_psql('postgres', "ALTER SERVER gd_partitions OPTIONS (SET p1 '$p1_at_a')");
is(routed("SELECT gd_signal('$key1', 'paid')"), 't', '4. the cluster map changed: the signal reaches p1 on shard a');
is(routed("SELECT status FROM gd_await($moving, '10s', 'terminal')"), 'done', 'and the instance ran on to its end there');
my $key1b = key_on(1, 'moved');
my $after_move = routed("SELECT gd_insert('order', correlation_key => '$key1b')");
ok($after_move % $partitions == 1 && $after_move > $moving, 'a new instance of p1: its id names p1, after the old ones');
is(routed("SELECT status FROM gd_await($after_move, '10s', 'terminal')"), 'done', 'and it runs on shard a');

# A partition created later (p3 made again, empty) receives the others' definitions and limits.
routed(q{SELECT gd_set_rate_limit('api', 10, '1 second')});
$shards{b}->safe_psql('postgres', 'DROP DATABASE p3 WITH (FORCE)');
$shards{b}->safe_psql('postgres', 'CREATE DATABASE p3');
$shards{b}->safe_psql('p3', 'CREATE EXTENSION gen_durable');
($out, $err) = run_command([ 'psql', '-X', '-q', '-d', $shards{b}->connstr('p3'), '-v', 'partition=3',
	'-v', "partitions=$partitions", '-f', "$sharding/partition.sql" ]);
is($err, '', 'p3 made again');
$shards{b}->safe_psql('p3', q{CREATE FUNCTION ship(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$});
is(routed('SELECT gd_router.copy_definitions(0, 3)'), '4', 'gd_router.copy_definitions: four FSM versions');
is(on_partition(3, q{SELECT (SELECT count(*) FROM gd.steps WHERE fsm = 'order') || ' steps, rate ' ||
                            (SELECT rate FROM gd.rate_limits WHERE name = 'api') || ', weight ' ||
                            (SELECT weight FROM gd.owner_weights WHERE owner = 'postgres'::regrole) || '; ' ||
                            (SELECT string_agg(name || ' owned by ' || owner::text, ', ' ORDER BY name)
                               FROM gd.fsms WHERE name IN ('invoice', 'report'))}),
	'3 steps, rate 10, weight 4; invoice owned by alice, report owned by "Team A"',
	'p3 has the FSMs\' steps, owners, the limit and the owner\'s weight');
my $grants = q{SELECT string_agg(fsm || ' to ' || role::text || CASE WHEN accepted THEN ', accepted' ELSE '' END, '; '
                                 ORDER BY fsm) FROM gd.grants};
is(on_partition(0, $grants), 'invoice to bob; report to bob, accepted', 'p0\'s grants: one accepted, one not');
is(on_partition(3, $grants), on_partition(0, $grants), 'p3 has them, accepted or not as on p0');
my $key3 = key_on(3, 'late');
my $late = routed("SELECT gd_insert('order', correlation_key => '$key3', fairness_key => 'tenant-9')");
is(routed("SELECT status || ' on p' || ($late % $partitions) FROM gd_await($late, '10s', 'terminal')"), 'done on p3',
	'an instance keyed to p3 runs there');
is(on_partition(3, "SELECT fairness_key FROM gd.instances WHERE id = $late"), 'tenant-9',
	'gd_insert\'s fairness_key through the router');

$_->stop for values %shards;
$router->stop;
done_testing();
