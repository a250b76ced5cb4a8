# The transactional event stream (gen_durable.events = transitions): each
# change of an instance's step or status is a logical decoding message
# (prefix gen_durable) in the transaction that made it. Read through a
# test_decoding slot: the insert and every transition of a 3-step FSM arrive
# once, in order; a signal's resumption, gd_cancel and gd_retry too; a
# completion rolled back emits nothing; with the setting off, nothing.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;
use IPC::Run;

my $node = GdTest::start_node('events', wal_level => 'logical', max_replication_slots => 4,
	'gen_durable.events' => 'transitions');
$node->safe_psql('postgres', q{
CREATE EXTENSION gen_durable;
CREATE FUNCTION walk(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE ctx.step WHEN 'a' THEN gd_next('b') WHEN 'b' THEN gd_next('c') ELSE gd_done('{"walked": true}') END;
END $$;
SELECT gd_define_fsm('walk', initial => 'a', steps => '{"a": {"handler": "public.walk(jsonb, gd.context)"},
                                                        "b": {"handler": "public.walk(jsonb, gd.context)"},
                                                        "c": {"handler": "public.walk(jsonb, gd.context)"}}');
SELECT gd_define_fsm('outside', initial => 'work', queue => 'external_only');
SELECT gd_define_step('outside', 'work');
CREATE FUNCTION park(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'wait' THEN
        RETURN gd_wait_signal(ARRAY['go'], then_step => 'end');
    END IF;
    RETURN gd_stop('{"reason": "ended"}');
END $$;
SELECT gd_define_fsm('parked', initial => 'wait', steps => '{"wait": {"handler": "public.park(jsonb, gd.context)"},
                                                            "end": {"handler": "public.park(jsonb, gd.context)",
                                                                    "max_attempts": 1}}');
SELECT pg_create_logical_replication_slot('events', 'test_decoding');
});

# The messages of the slot since the last read: "step from>to kind" per event of instance $id.
sub events_of
{
	my ($id) = @_;
	my @lines = split /\n/, $node->safe_psql('postgres', q{
SELECT substring(data FROM 'content:(.*)$') FROM pg_logical_slot_get_changes('events', NULL, NULL)
 WHERE data LIKE 'message: transactional: 1 prefix: gen_durable,%'});
	my @mine;
	for my $json (@lines)
	{
		my ($event) = $node->safe_psql('postgres', qq{
SELECT coalesce(e->>'step', '-') || ' ' || coalesce(e->>'from', '-') || '>' || (e->>'to') || ' ' || (e->>'next_step')
       || ' ' || (e->>'kind')
  FROM (SELECT '$json'::jsonb AS e) x WHERE (e->>'id')::bigint = $id AND e->>'fsm' IS NOT NULL AND e ? 'at'});
		push @mine, $event if $event ne '';
	}
	return join(', ', @mine);
}

my $id = $node->safe_psql('postgres', q{SELECT gd_insert('walk')});
$node->poll_query_until('postgres', "SELECT status = 'done' FROM gd.instances WHERE id = $id")
  or die 'the instance did not finish';
is(events_of($id), '- ->runnable a inserted, a runnable>runnable b next, b runnable>runnable c next, c runnable>done c done',
	'the insert and every transition of a 3-step FSM, once, in order');

my $parked = $node->safe_psql('postgres', q{SELECT gd_insert('parked')});
$node->poll_query_until('postgres', "SELECT status = 'awaiting_signal' FROM gd.instances WHERE id = $parked")
  or die 'the instance did not park';
$node->safe_psql('postgres', "SELECT gd_signal($parked, 'go')");
$node->poll_query_until('postgres', "SELECT status = 'failed' FROM gd.instances WHERE id = $parked")
  or die 'the instance did not end';
$node->safe_psql('postgres', "SELECT gd_retry($parked)");
$node->poll_query_until('postgres', "SELECT status = 'failed' FROM gd.instances WHERE id = $parked")
  or die 'the retried instance did not end';   # (gd_retry made it runnable when it returned)
is(events_of($parked), '- ->runnable wait inserted, wait runnable>awaiting_signal wait await, '
	. 'wait awaiting_signal>runnable end resumed, end runnable>failed end stop, end failed>runnable end retried, '
	. 'end runnable>failed end stop', 'a resumption by a signal and gd_retry too');
my $cancelled = $node->safe_psql('postgres', q{SELECT gd_insert('parked')});
$node->poll_query_until('postgres', "SELECT status = 'awaiting_signal' FROM gd.instances WHERE id = $cancelled")
  or die 'the instance did not park';
$node->safe_psql('postgres', "SELECT gd_cancel($cancelled, 'enough')");
is(events_of($cancelled), '- ->runnable wait inserted, wait runnable>awaiting_signal wait await, '
	. 'wait awaiting_signal>cancelled wait cancelled', 'and gd_cancel');

my $ext = $node->safe_psql('postgres', q{SELECT gd_insert('outside')});
$node->safe_psql('postgres', q{
BEGIN;
SELECT gd_complete(c.id, c.lease_token, gd_done()) FROM gd_claim('external_only', 'w', 1) c;
ROLLBACK;});
is(events_of($ext), '- ->runnable work inserted', 'a completion rolled back emits nothing');
$node->safe_psql('postgres', q{
SELECT gd_complete(c.id, c.lease_token, gd_next('work')) FROM gd_claim('external_only', 'w', 1) c;});
is(events_of($ext), 'work executing>runnable work next', 'a committed external completion emits its transition');
$node->safe_psql('postgres', q{
SET gen_durable.events = off;
SELECT gd_complete(c.id, c.lease_token, gd_done()) FROM gd_claim('external_only', 'w', 1) c;});
is(events_of($ext), '', 'with gen_durable.events off, nothing');
is($node->safe_psql('postgres', "SELECT status FROM gd.instances WHERE id = $ext"), 'done', 'the instance moved on all the same');

my ($out, $err) = (q{}, q{});
$node->psql('postgres', q{CREATE ROLE plain_user; SET ROLE plain_user; SET gen_durable.events = off;},
	stdout => \$out, stderr => \$err);
like($err, qr/permission denied to set parameter "gen_durable.events"/, 'only a superuser may turn it off in a session');

# Any role may write a message with the prefix: a consumer tells the engine's
# by the documented check (docs/reference.md): the mac under gd.event_key(),
# and the xid of the transaction the message arrived in.  The check, as a
# consumer would write it, reads "xid<TAB>content" lines.
my $check = <<'PYTHON';
import hashlib, hmac, json, sys
key = bytes.fromhex(sys.argv[1])
for line in sys.stdin.read().splitlines():
    xid, content = line.split("\t", 1)
    suffix = len(', "mac": "') + 64 + len('"}')
    body, mac = content[:-suffix] + "}", content[-66:-2]
    genuine = (content.endswith('"}') and hmac.compare_digest(hmac.new(key, body.encode(), hashlib.sha256).hexdigest(), mac)
               and json.loads(body).get("xid") == int(xid))
    print("engine" if genuine else "forged")
PYTHON
$node->safe_psql('postgres', q{
CREATE ROLE forger;
CREATE TABLE copied (content text);
GRANT ALL ON copied TO forger;});
my $key = $node->safe_psql('postgres', q{SELECT encode(gd.event_key(), 'hex')});
like($key, qr/^[0-9a-f]{64}$/, 'gd.event_key() gives a superuser the database\'s 32-byte key');
is($node->psql('postgres', q{SET ROLE forger; SELECT gd.event_key()}), 3, 'and no one else');
my $genuine = $node->safe_psql('postgres', q{SELECT gd_insert('walk')});
$node->poll_query_until('postgres', "SELECT status = 'done' FROM gd.instances WHERE id = $genuine") or die;
my $stream = $node->safe_psql('postgres', q{
SELECT xid || E'\t' || substring(data FROM 'content:(.*)$') FROM pg_logical_slot_peek_changes('events', NULL, NULL)
 WHERE data LIKE 'message: transactional: 1 prefix: gen_durable,%'});
$node->safe_psql('postgres', q{INSERT INTO copied SELECT substring(data FROM 'content:(.*)$')
  FROM pg_logical_slot_get_changes('events', NULL, NULL) WHERE data LIKE 'message: transactional: 1 prefix: gen_durable,%'});
my $verdicts = sub {
	my ($lines) = @_;
	my ($stdout, $stderr) = ('', '');
	IPC::Run::run([ '/usr/bin/python3', '-c', $check, $key ], '<', \$lines, '>', \$stdout, '2>', \$stderr);
	die $stderr if $stderr;
	return join(',', split /\n/, $stdout);
};
is($verdicts->($stream), 'engine,engine,engine,engine', 'the engine\'s messages pass the check');
$node->safe_psql('postgres', qq{
SET ROLE forger;
SELECT pg_logical_emit_message(true, 'gen_durable',
  '{"id": $parked, "fsm": "parked", "version": 1, "step": "end", "from": "runnable", "to": "done", "next_step": "end", "kind": "done", "attempt": 1, "at": "2026-01-01 00:00:00+00"}');
SELECT pg_logical_emit_message(true, 'gen_durable',
  '{"id": $parked, "fsm": "parked", "version": 1, "step": "end", "from": "runnable", "to": "done", "next_step": "end", "kind": "done", "attempt": 1, "at": "2026-01-01 00:00:00+00", "xid": ' || txid_current() || ', "mac": "' || repeat('ab', 32) || '"}');
SELECT pg_logical_emit_message(true, 'gen_durable', c.content) FROM copied c LIMIT 1;});
my $forged = $node->safe_psql('postgres', q{
SELECT xid || E'\t' || substring(data FROM 'content:(.*)$') FROM pg_logical_slot_get_changes('events', NULL, NULL)
 WHERE data LIKE 'message: transactional: 1 prefix: gen_durable,%'});
is($verdicts->($forged), 'forged,forged,forged',
	'a forger\'s messages do not: without a mac, with a made-up one, or a copy of the engine\'s in another transaction');

done_testing();
