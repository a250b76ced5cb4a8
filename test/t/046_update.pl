# An update from the previous release, with the engine running.  A cluster
# on the previous release (built from the checkout's history by check.sh into
# a private copy of the PostgreSQL installation: GD_PREVIOUS_INSTALL) holds
# definitions made by a tenant, a grant, limits, and instances in every
# status.  Its library and scripts are replaced by this version's and the
# server restarted: the engine waits, and says so, until ALTER EXTENSION
# gen_durable UPDATE, which runs while it waits.  Then every instance runs to
# the end the same history reaches on a cluster that was on this version all
# along, and the updated extension's catalog is that of a fresh install.
use strict;
use warnings;
use File::Copy;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

$PostgreSQL::Test::Utils::timeout_default = 60;

plan skip_all => $ENV{GD_PREVIOUS_UNAVAILABLE} if $ENV{GD_PREVIOUS_UNAVAILABLE};
my $previous = $ENV{GD_PREVIOUS_INSTALL};
die 'GD_PREVIOUS_INSTALL names no build of the previous release (see gd_build_previous_release)'
  unless $previous && -x "$previous/bin/postgres";

# Queue 'ext' has no executors: its (external) steps wait for the test's worker.
my %conf = ('gen_durable.queues' => 'default:2', 'gen_durable.lease' => '10min');
my $updated = GdTest::start_node('updated', %conf, '-install_path' => $previous);
my $fresh = GdTest::start_node('fresh', %conf);

# What both clusters do before the update: the same calls, through the API
# both versions have.
my $history = q{
CREATE EXTENSION gen_durable;
CREATE ROLE shop_owner;
CREATE ROLE clerk;
CREATE SCHEMA shop AUTHORIZATION shop_owner;
GRANT USAGE ON SCHEMA gd TO shop_owner;
SET ROLE shop_owner;
CREATE FUNCTION shop.step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'finish' THEN
        RETURN gd_done(jsonb_build_object('label', state->>'label',
                                          'paid', ctx.signals->0->'payload'->'amount',
                                          'children', jsonb_array_length(coalesce(ctx.children, '[]'))));
    END IF;
    CASE state->>'kind'
    WHEN 'fail' THEN RAISE EXCEPTION 'card declined';
    WHEN 'wait' THEN RETURN gd_wait_signal(ARRAY['paid'], then_step => 'finish');
    WHEN 'spawn' THEN RETURN gd_spawn('[{"fsm": "parcel"}, {"fsm": "parcel"}]', then_step => 'finish');
    WHEN 'external' THEN RETURN gd_next('ship');
    ELSE RETURN gd_next('finish');
    END CASE;
END $$;
SELECT gd_define_fsm('order', 'start', queue => 'default', state_defaults => '{"kind": "plain"}');
SELECT gd_define_step('order', 'start', 'shop.step(jsonb, gd.context)'::regprocedure, max_attempts => 1);
SELECT gd_define_step('order', 'ship');
SELECT gd_define_step('order', 'finish', 'shop.step(jsonb, gd.context)'::regprocedure);
SELECT gd_define_fsm('parcel', 'pick', queue => 'ext');
SELECT gd_define_step('parcel', 'pick');
SELECT gd_grant('order', 'clerk');
RESET ROLE;
SELECT gd_set_rate_limit('api', 100, '1 second');
SELECT gd_set_concurrency_limit('pool', 1);
SET ROLE shop_owner;
SELECT gd_insert('order', '{"label": "done"}');
SELECT gd_insert('order', '{"label": "limited"}', rate_limit => 'api');
SELECT gd_insert('order', '{"label": "failed", "kind": "fail"}');
SELECT gd_insert('order', '{"label": "cancelled", "kind": "wait"}');
SELECT gd_insert('order', '{"label": "awaiting_signal", "kind": "wait"}', correlation_key => 'order-w');
SELECT gd_insert('order', '{"label": "awaiting_children", "kind": "spawn"}');
SELECT gd_insert('order', '{"label": "claimed", "kind": "external"}');
SELECT gd_insert('order', '{"label": "external", "kind": "external"}');
SELECT gd_insert('order', '{"label": "key_holder", "kind": "external"}', concurrency_key => 'pool');
SELECT gd_insert('order', '{"label": "key_waiter", "kind": "external"}', concurrency_key => 'pool');
};
# Settled: each instance where the engine leaves it.
my $settled = q{
SELECT count(*) = 10 FROM gd.instances WHERE state ? 'label'
   AND (status IN ('done', 'failed', 'awaiting_signal', 'awaiting_children')
        OR (status = 'runnable' AND (step = 'ship' OR gated)))};
for my $node ($updated, $fresh)
{
	$node->safe_psql('postgres', $history);
	ok($node->poll_query_until('postgres', $settled), $node->name . ': the instances settled');
	$node->safe_psql('postgres', q{
SELECT gd_cancel(id) FROM gd.instances WHERE state->>'label' = 'cancelled';
SELECT count(*) FROM gd_claim('default', 'before-update', 1, '10 minutes');});
}
is($updated->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'gen_durable'}),
	'0.1', 'the first cluster is on the previous release');

my $statuses = q{SELECT string_agg(status || ':' || count, ' ' ORDER BY status)
  FROM (SELECT status, count(*) FROM gd.instances GROUP BY status) s};
my $every_status = 'awaiting_children:1 awaiting_signal:1 cancelled:1 done:2 executing:1 failed:1 runnable:5';
is($updated->safe_psql('postgres', $statuses), $every_status, 'before the update: instances in every status');
is($fresh->safe_psql('postgres', $statuses), $every_status, 'the same on the cluster without an update');

# One more, due in a few seconds: it comes due while the engine waits.
$_->safe_psql('postgres', q{SET ROLE shop_owner; SELECT gd_insert('order', '{"label": "due_later"}', schedule_in => '4 seconds')})
  for $updated, $fresh;

# Install this version over the previous one, as a package upgrade does, and restart.
$updated->stop;
my $pg_config = 'pg_config';    # this version's installation: first on PATH
chomp(my $pkglib = `$pg_config --pkglibdir`);
chomp(my $share = `$pg_config --sharedir`);
chomp(my $previous_share = `$previous/bin/pg_config --sharedir`);
unlink glob("$previous_share/extension/gen_durable*");
copy("$pkglib/gen_durable.so", "$previous/lib/gen_durable.so") or die "copy: $!";
copy($_, "$previous_share/extension/") or die "copy $_: $!" for glob("$share/extension/gen_durable*");
my $log_offset = -s $updated->logfile;
$updated->start;

ok( $updated->wait_for_log(
		qr/database "postgres" has gen_durable 0\.1, the loaded library is 0\.2; reaper waits/, $log_offset),
	'the engine waits for the update, and says so');
$updated->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM gd.instances WHERE state->>'label' = 'due_later' AND eligible_at < now() - interval '2 seconds'})
  or die 'due_later never came due';
is($updated->safe_psql('postgres', q{SELECT status FROM gd.instances WHERE state->>'label' = 'due_later'}),
	'runnable', 'a step due while the engine waits does not run');

$updated->safe_psql('postgres', 'ALTER EXTENSION gen_durable UPDATE');
is($updated->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'gen_durable'}),
	'0.2', 'updated to this version');
ok($updated->poll_query_until('postgres',
	q{SELECT status = 'done' FROM gd.instances WHERE state->>'label' = 'due_later'}),
	'after the update the engine runs the step that came due');

# Every object of the extension, with what defines it: equal after an update and a fresh install.
my $catalog = q{
WITH members AS (
    SELECT d.classid, d.objid FROM pg_depend d
     WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
       AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'gen_durable'))
SELECT kind || ' ' || name || ': ' || detail FROM (
  SELECT 'function' AS kind, p.oid::regprocedure::text AS name,
         concat_ws(' | ', pg_get_function_result(p.oid), pg_get_function_arguments(p.oid), p.prolang::regtype::text,
                   p.provolatile::text, p.proisstrict::text, p.prosecdef::text, array_to_string(p.proconfig, ','),
                   p.proacl::text, md5(p.prosrc || coalesce(p.probin, ''))) AS detail
    FROM members m JOIN pg_proc p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
  UNION ALL
  SELECT 'relation ' || c.relkind::text, c.oid::regclass::text,
         concat_ws(' | ', c.relacl::text, array_to_string(c.reloptions, ','), c.relrowsecurity::text,
                   CASE c.relkind WHEN 'v' THEN md5(pg_get_viewdef(c.oid)) END)
    FROM members m JOIN pg_class c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
  UNION ALL
  SELECT 'column', a.attrelid::regclass::text || ' ' || a.attnum || ' ' || a.attname,
         concat_ws(' ', format_type(a.atttypid, a.atttypmod), a.attnotnull::text, pg_get_expr(ad.adbin, ad.adrelid),
                   nullif(a.attidentity::text, ''))
    FROM members m JOIN pg_class c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid AND c.relkind IN ('r', 'v')
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
  UNION ALL
  SELECT 'index', i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
    FROM members m JOIN pg_index i ON m.classid = 'pg_class'::regclass AND i.indrelid = m.objid
  UNION ALL
  SELECT 'constraint', co.conrelid::regclass::text || ' ' || co.conname, pg_get_constraintdef(co.oid)
    FROM members m JOIN pg_constraint co ON m.classid = 'pg_class'::regclass AND co.conrelid = m.objid
  UNION ALL
  SELECT 'trigger', t.tgrelid::regclass::text || ' ' || t.tgname, pg_get_triggerdef(t.oid)
    FROM members m JOIN pg_trigger t ON m.classid = 'pg_class'::regclass AND t.tgrelid = m.objid AND NOT t.tgisinternal
  UNION ALL
  SELECT 'policy', po.polrelid::regclass::text || ' ' || po.polname, ''
    FROM members m JOIN pg_policy po ON m.classid = 'pg_class'::regclass AND po.polrelid = m.objid
  UNION ALL
  SELECT 'type ' || t.typtype::text, t.oid::regtype::text,
         concat_ws(' | ', t.typacl::text,
                   (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
                      FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped),
                   (SELECT string_agg(pg_get_constraintdef(co.oid), ', ') FROM pg_constraint co WHERE co.contypid = t.oid))
    FROM members m JOIN pg_type t ON m.classid = 'pg_type'::regclass AND t.oid = m.objid
  UNION ALL
  SELECT 'event trigger', e.evtname, e.evtevent || ' ' || e.evtfoid::regproc::text
    FROM members m JOIN pg_event_trigger e ON m.classid = 'pg_event_trigger'::regclass AND e.oid = m.objid
  UNION ALL
  SELECT 'schema', n.nspname, coalesce(n.nspacl::text, '')
    FROM members m JOIN pg_namespace n ON m.classid = 'pg_namespace'::regclass AND n.oid = m.objid
  UNION ALL
  SELECT 'dumped', c::regclass::text, coalesce(cond, '')
    FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS x(c, cond) WHERE e.extname = 'gen_durable'
  UNION ALL
  SELECT 'member', pg_describe_object(m.classid, m.objid, 0), ''
    FROM members m WHERE m.classid NOT IN ('pg_proc'::regclass, 'pg_class'::regclass, 'pg_type'::regclass,
                                           'pg_event_trigger'::regclass, 'pg_namespace'::regclass)
) x ORDER BY 1};
my $updated_catalog = $updated->safe_psql('postgres', $catalog);
my $fresh_catalog = $fresh->safe_psql('postgres', $catalog);
cmp_ok(scalar(split /\n/, $fresh_catalog), '>', 300, 'the catalog listing lists the extension');
is($updated_catalog, $fresh_catalog, 'the updated extension is a fresh install of this version, object by object');

# After the update: the rest of the history, the same on both clusters.
for my $node ($updated, $fresh)
{
	$node->safe_psql('postgres', q{
SET ROLE clerk;
SELECT gd_accept_grant('order');   -- (made under 0.1, it was accepted by the update already)
SELECT gd_signal('order-w', 'paid', '{"amount": 12.5}');
RESET ROLE;
SELECT gd_complete(id, lease_token, gd_next('finish')) FROM gd.instances WHERE lease_owner = 'before-update';});
	# An external worker on both queues, until nothing is left to claim.
	my $work = q{
SELECT count(gd_complete(id, lease_token, CASE fsm WHEN 'parcel' THEN gd_done('{"picked": true}') ELSE gd_next('finish') END))
  FROM (SELECT * FROM gd_claim('default', 'after-update', 100) UNION ALL SELECT * FROM gd_claim('ext', 'after-update', 100)) c};
	ok( $node->poll_query_until(
			'postgres',
			"SELECT ($work) = 0 AND NOT EXISTS (SELECT FROM gd.instances WHERE status IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children'))"),
		$node->name . ': every instance ended');
}
my $ends = q{
SELECT coalesce(i.state->>'label', 'child of ' || (p.state->>'label')) || ' ' || i.status || ' ' || i.step || ' '
       || coalesce(i.result::text, '-') || ' ' || (i.error IS NOT NULL)
  FROM gd.instances i LEFT JOIN gd.instances p ON p.id = i.parent_id ORDER BY 1};
my $fresh_ends = $fresh->safe_psql('postgres', $ends);
is($updated->safe_psql('postgres', $ends), $fresh_ends, 'every instance ended as it does without the update');
like($fresh_ends, qr/^awaiting_signal done finish \{"paid": 12.5, "label": "awaiting_signal", "children": 0\} false$/m,
	'(the signal reached the parked instance)');
like($fresh_ends, qr/^key_waiter done finish /m, '(the instance waiting for its key ran)');
ok(!$updated->log_contains(qr/PANIC|TRAP:|terminated by signal/), 'no crash');

$_->stop for $updated, $fresh;
done_testing();
