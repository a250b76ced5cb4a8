# A backup holds the engine's data.  pg_dump of a database with instances in
# every status (runnable, scheduled, parked with a signal kept in its inbox,
# a parent awaiting its children, done, failed), a grant and limits is
# restored, with the engine serving the new database all along, by
# pg_restore from the custom format and by psql from a plain dump.  In each
# restored database every live instance resumes and ends, the kept signal is
# consumed, new ids go on above the restored ones, results and errors are
# those of the source, and the ledger its steps write (a primary key on
# (instance, step), dumped with it) holds every step exactly once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

$PostgreSQL::Test::Utils::timeout_default = 60;

# The source's queue 'work' has no executor: its instances stay where the test puts them.
my $source = GdTest::start_node('dump_source', 'gen_durable.queues' => 'default:1');
$source->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE ROLE reader;
CREATE TABLE ledger (instance bigint, step text, PRIMARY KEY (instance, step));
CREATE FUNCTION flow_h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger VALUES (ctx.id, ctx.step);
    CASE ctx.step
    WHEN 'a' THEN
        IF state ? 'stop' THEN
            RETURN gd_stop(jsonb_build_object('reason', state->>'stop'));
        ELSIF state ? 'fanout' THEN
            RETURN gd_spawn('[{"fsm": "child"}, {"fsm": "child"}]', then_step => 'join');
        END IF;
        RETURN gd_wait_signal(ARRAY['go'], then_step => 'b');
    WHEN 'b' THEN
        RETURN gd_wait_signal(ARRAY['later'], then_step => 'd');
    WHEN 'd' THEN
        RETURN gd_done(jsonb_build_object('later', ctx.signals->0->'payload'));
    ELSE
        RETURN gd_done(jsonb_build_object('children', jsonb_array_length(ctx.children)));
    END CASE;
END $$;
CREATE FUNCTION child_h(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger VALUES (ctx.id, ctx.step);
    RETURN gd_done('{"child": true}');
END $$;
SELECT gd_define_fsm('flow', 'a', queue => 'work');
SELECT gd_define_step('flow', s, 'flow_h(jsonb, gd.context)'::regprocedure) FROM unnest('{a,b,d,join}'::text[]) s;
SELECT gd_define_fsm('child', 'c', queue => 'work');
SELECT gd_define_step('child', 'c', 'child_h(jsonb, gd.context)'::regprocedure);
SELECT gd_grant('flow', 'reader');
SELECT gd_set_rate_limit('api', 100, '1 second');
SELECT gd_set_concurrency_limit('pool', 3);
SELECT gd_schedule('yearly_child', '@yearly', 'child', time_zone => 'Europe/Berlin', enabled => false);
});

my %id;
$id{runnable} = $source->safe_psql('postgres', q{SELECT gd_insert('flow')});
$id{scheduled} = $source->safe_psql('postgres', q{SELECT gd_insert('flow', schedule_in => '3 seconds')});
$id{parked} = $source->safe_psql('postgres', q{SELECT gd_insert('flow', correlation_key => 'parked-1')});
$id{parent} = $source->safe_psql('postgres', q{SELECT gd_insert('flow', '{"fanout": true}')});
$id{failed} = $source->safe_psql('postgres', q{SELECT gd_insert('flow', '{"stop": "on purpose"}')});
$id{done} = $source->safe_psql('postgres', q{SELECT gd_insert('child')});
# Step a of the parked, parent and failed instances, and the done one: the rest stay as inserted.
$source->safe_psql('postgres', qq{
	UPDATE gd._instances SET eligible_at = now() + interval '1 hour' WHERE id IN ($id{runnable}, $id{scheduled});
	SELECT gd._execute('work', 10);
	UPDATE gd._instances SET eligible_at = now() WHERE id = $id{runnable};
	UPDATE gd._instances SET eligible_at = now() + interval '3 seconds' WHERE id = $id{scheduled};
	-- kept for the wait after the one the instance is parked in
	SELECT gd_signal($id{parked}, 'later', '{"kept": true}');
});
is($source->safe_psql('postgres', qq{
	SELECT string_agg(status, ',' ORDER BY id) FROM gd._instances
	 WHERE id IN ($id{runnable}, $id{scheduled}, $id{parked}, $id{parent}, $id{failed}, $id{done})}),
	'runnable,runnable,awaiting_signal,awaiting_children,failed,done', 'the source holds an instance in every status');
my $source_rows = $source->safe_psql('postgres', q{SELECT count(*) FROM gd._instances});
my $source_max = $source->safe_psql('postgres', q{SELECT max(id) FROM gd._instances});
my $failed_error = $source->safe_psql('postgres', "SELECT error FROM gd._instances WHERE id = $id{failed}");
my $done_result = $source->safe_psql('postgres', "SELECT result FROM gd._instances WHERE id = $id{done}");

my $dir = PostgreSQL::Test::Utils::tempdir();
command_ok([ 'pg_dump', '-Fc', '-d', $source->connstr('postgres'), '-f', "$dir/app.dump" ], 'pg_dump -Fc');
command_ok([ 'pg_dump', '-d', $source->connstr('postgres'), '-f', "$dir/app.sql" ], 'pg_dump, plain');
$source->stop;

# The target serves both restored databases from the start.
my $target = GdTest::start_node('dump_target',
	'gen_durable.database' => 'from_custom, from_plain',
	'gen_durable.queues'   => 'work:2');
$target->safe_psql('postgres', q{CREATE ROLE reader; CREATE DATABASE from_custom; CREATE DATABASE from_plain});
command_ok([ 'pg_restore', '-d', $target->connstr('from_custom'), "$dir/app.dump" ], 'pg_restore');
command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $target->connstr('from_plain'), '-f', "$dir/app.sql" ],
	'psql of the plain dump');

for my $db ('from_custom', 'from_plain')
{
	my $q = sub { return $target->safe_psql($db, $_[0]); };
	is($q->(q{SELECT count(*) FROM gd._instances}), $source_rows, "$db: every instance was restored");
	is($q->(q{SELECT string_agg(fsm || ':' || role, ',') FROM gd.grants}), 'flow:reader', "$db: the grant");
	is($q->(q{SELECT string_agg(name || ' ' || rate || '/' || per, ',') FROM gd.rate_limits}) . ' '
		. $q->(q{SELECT string_agg(name || ' ' || max, ',') FROM gd.concurrency_limits}),
		'api 100/00:00:01 pool 3', "$db: the limits");
	is($q->(q{SELECT name || ' ' || cron || ' ' || time_zone || ' ' || owner || ' ' || enabled FROM gd.schedules}),
		'yearly_child @yearly Europe/Berlin postgres false', "$db: the schedule");
	# The runnable and scheduled instances run step a and park on 'go', as the parked one is.
	$target->poll_query_until($db, qq{
		SELECT count(*) = 3 FROM gd._instances
		 WHERE id IN ($id{runnable}, $id{scheduled}, $id{parked}) AND status = 'awaiting_signal' AND step = 'a'})
	  or diag("$db: the restored instances did not park");
	$q->(qq{SELECT gd_signal(id, 'go', '{}') FROM unnest(ARRAY[$id{runnable}, $id{scheduled}]::bigint[]) id});
	$q->(qq{SELECT gd_signal(id, 'later', '{"kept": false}') FROM unnest(ARRAY[$id{runnable}, $id{scheduled}]::bigint[]) id});
	$q->(q{SELECT gd_signal('parked-1', 'go')});
	$target->poll_query_until($db, q{SELECT count(*) = 0 FROM gd._instances WHERE status <> ALL ('{done,failed}')})
	  or diag("$db: instances did not end");
	is($q->(qq{SELECT string_agg(status, ',' ORDER BY id) FROM gd._instances
	             WHERE id IN ($id{runnable}, $id{scheduled}, $id{parked}, $id{parent}, $id{failed}, $id{done})}),
		'done,done,done,done,failed,done', "$db: every live instance ran to its end");
	is($q->(qq{SELECT result->'later'->>'kept' FROM gd._instances WHERE id = $id{parked}}), 'true',
		"$db: the parked instance consumed the signal kept in its inbox");
	is($q->(qq{SELECT count(*) FROM gd._signals WHERE instance_id = $id{parked} AND consumed_at IS NULL}), '0',
		"$db: and nothing is left in it");
	is($q->(qq{SELECT result FROM gd._instances WHERE id = $id{parent}}), '{"children": 2}',
		"$db: the parent resumed when its children ended");
	is($q->(qq{SELECT error FROM gd._instances WHERE id = $id{failed}}), $failed_error, "$db: the error is intact");
	is($q->(qq{SELECT result FROM gd._instances WHERE id = $id{done}}), $done_result, "$db: the result is intact");
	is($q->(q{SELECT count(*) FROM ledger}), '15', "$db: every step ran once, before or after the dump");
	cmp_ok($q->(q{SELECT gd_insert('child')}), '>', $source_max, "$db: new ids go on above the restored ones");
}

$target->stop;
done_testing();
