# The SQL API is declared in several places that must agree; a drift shows
# otherwise only as a 42883 at run time, or as an option silently missing on
# one path.  This file compares them, each difference named:
#
#  - every door (`LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door'`, src/door.cpp)
#    and its implementation gd._NAME: one, with the same argument names,
#    modes and types, result and set-ness.  The door passes the
#    implementation every argument it was called with, defaults already
#    filled in by the caller's parser, so the defaults live on the door and
#    the implementation has none (one there would never be used, and would
#    drift).  The door calls it through fmgr, which applies no STRICT: an
#    implementation may be STRICT only behind a STRICT door.  PUBLIC may not
#    execute an implementation (the door is the only way to it).
#  - sharding/router.sql, loaded into a scratch database (over PL/Proxy, or
#    a stand-in language of that name where PL/Proxy is not installed): each
#    API function the router makes has a door of the same name and the same
#    argument names, modes, types (a handler and a role as text: the router
#    has neither) and defaults, and the same result; every door is routed or
#    listed below as not routed, with the reason.  Each wrapper passes its
#    arguments on by name to the gd_router function of the same names, and
#    each PL/Proxy function calls the partition's door with the door's
#    arguments in the door's order (positionally).  The entry keys the router
#    routes gd_insert_all's entries by are insert options.
#  - sharding/partition.sql: gd_sharding.apply_definitions calls each door
#    with the keys of gd_sharding.definitions() named as the door's
#    arguments, all of them, in order; definitions() describes every option
#    of a step (each gd_define_step option, set to a value, is there), and
#    apply_definitions takes what it describes (a version without steps
#    too).  gd_define_fsm's steps take each gd_define_step option as JSON of
#    its type.
#  - the clients (clients/node/lib, clients/python/gen_durable): every
#    statement that calls an API function (Node.js: sql.js; Python:
#    _core.Statements; no API call anywhere else) names a function the
#    extension has, passes named arguments it has, positional ones where it
#    has them, and every argument without a default; each statement is
#    prepared by the server (names, named arguments and types resolved), and
#    those whose functions the router has are prepared on the router too.
#    The insert options each client takes are gd_insert's, bound to the
#    argument of their name; the entries the Node.js typings declare for
#    insertAll and spawn carry only options the engine takes for an entry;
#    the outcomes both clients build have exactly the arguments of the SQL
#    constructor of their kind (gd_next, ...), and gd_outcome passes those
#    keys to it in its order.
# A drift known and not fixed yet is listed in %KNOWN_DRIFT: its check runs
# as a TODO, reported without failing the file.
use strict;
use warnings;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

# Doors the router does not have, and why.  A door routed and listed here,
# or not routed and not listed, fails.
my %NOT_ROUTED = (
	'gd_claim'            => 'external workers connect to the partitions, one each (sharding/README.md)',
	'gd_heartbeat'        => 'external workers connect to the partitions',
	'gd_release'          => 'external workers connect to the partitions',
	'gd_complete'         => 'external workers connect to the partitions',
	'gd_complete_all'     => 'external workers connect to the partitions',
	'gd_drain'            => 'runs the steps of the database it is called in: a partition\'s (testing)',
	'gd.event_key'        => 'each partition\'s event stream has its own key',
	'gd.refuse_handler_drop' => 'an event trigger\'s function, not a call',
	'gd.read_workers'     => 'the gd views of one database; the router has gd_router.queue_stats',
	'gd.read_step_stats'  => 'the gd views of one database',
	'gd.read_limit_stats' => 'the gd views of one database',
	'gd.read_instances'   => 'the gd views of one database',
);
# The router takes these types as text: it has neither the handlers'
# functions nor, perhaps, the roles; each partition resolves them.
my %ROUTER_TYPE = (regprocedure => 'text', regrole => 'text');

# Known drifts not fixed yet: the check named runs as a TODO (reported,
# not failing); remove the entry with the fix.
my %KNOWN_DRIFT = (
);

my $node = GdTest::start_node('api');
$node->safe_psql('postgres', 'CREATE EXTENSION gen_durable');
my $json = JSON::PP->new->utf8;

# ------------------------------------------------------------------ helpers

# The pieces of $s separated by $sep (a character) outside quotes ('...',
# "...", `...`) and brackets, trimmed.
sub split_top
{
	my ($s, $sep) = @_;
	$sep //= ',';
	my @pieces;
	my ($depth, $quote, $cur) = (0, undef, '');
	for my $c (split //, $s)
	{
		if (defined $quote) { $quote = undef if $c eq $quote; }
		elsif ($c eq "'" || $c eq '"' || $c eq '`') { $quote = $c; }
		elsif ($c =~ /[([{]/) { $depth++; }
		elsif ($c =~ /[)\]}]/) { $depth--; }
		elsif ($c eq $sep && $depth == 0) { push @pieces, $cur; $cur = ''; next; }
		$cur .= $c;
	}
	push @pieces, $cur;
	s/^\s+|\s+$//g for @pieces;
	return grep { $_ ne '' } @pieces;
}

# The calls in $text of functions whose name matches $name_re (with its
# qualifier, if any, matched by $qualifier_re before it): [name, args text].
sub calls_in
{
	my ($text, $name_re, $qualifier_re) = @_;
	$qualifier_re //= '';
	my @calls;
	while ($text =~ /$qualifier_re\b($name_re)\s*\(/g)
	{
		my ($name, $start) = ($1, pos($text));
		my ($depth, $quote, $i) = (1, undef, $start);
		for (; $i < length($text) && $depth > 0; $i++)
		{
			my $c = substr($text, $i, 1);
			if (defined $quote) { $quote = undef if $c eq $quote; }
			elsif ($c eq "'" || $c eq '"') { $quote = $c; }
			elsif ($c eq '(') { $depth++; }
			elsif ($c eq ')') { $depth--; }
		}
		push @calls, [ $name, substr($text, $start, $i - 1 - $start) ];
	}
	return @calls;
}

# A call's arguments: { positional => [expr...], named => [[name, expr]...] }.
sub call_arguments
{
	my ($args) = @_;
	my (@positional, @named);
	for my $a (split_top($args))
	{
		if ($a =~ /^(\w+)\s*=>\s*(.*)$/s) { push @named, [ $1, $2 ]; }
		else { push @positional, $a; }
	}
	return { positional => \@positional, named => \@named };
}

# The functions of a database that $where selects (on pg_proc p, pg_namespace n):
# each with its arguments (name, mode, type, default), result and source.
sub functions
{
	my ($database, $where) = @_;
	my $rows = $node->safe_psql($database, qq{
SELECT coalesce(json_agg(json_build_object(
         'schema', n.nspname, 'name', p.proname, 'signature', p.oid::regprocedure::text,
         'names', coalesce(p.proargnames, array_fill(''::text, ARRAY[p.pronargs])),
         'modes', coalesce(p.proargmodes::text[], array_fill('i'::text, ARRAY[p.pronargs])),
         'types', ARRAY(SELECT format_type(t, NULL) FROM unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]))
                                                           WITH ORDINALITY AS u(t, o) ORDER BY o),
         'arguments', pg_get_function_arguments(p.oid), 'ndefaults', p.pronargdefaults,
         'result', pg_get_function_result(p.oid), 'retset', p.proretset, 'strict', p.proisstrict,
         'language', l.lanname, 'source', p.prosrc,
         'public_executes', has_function_privilege('api_nobody', p.oid, 'EXECUTE'))
         ORDER BY n.nspname, p.proname, p.oid::regprocedure::text), '[]')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang
 WHERE $where});
	my $functions = $json->decode($rows);
	for my $f (@$functions)
	{
		$f->{qualified} = $f->{schema} eq 'public' ? $f->{name} : "$f->{schema}.$f->{name}";
		# each argument: name, mode, type, default (pg_get_function_arguments
		# lists every argument but a TABLE column, in order)
		my @declared = split_top($f->{arguments});
		my @arguments;
		for my $i (0 .. $#{ $f->{types} })
		{
			my $mode = $f->{modes}[$i];
			my $declared = $mode eq 't' ? '' : shift(@declared) // '';
			push @arguments, { name => $f->{names}[$i], mode => $mode, type => $f->{types}[$i],
				default => $declared =~ /\sDEFAULT\s(.*)$/s ? $1 : undef };
		}
		$f->{arguments} = \@arguments;
		$f->{in} = [ grep { $_->{mode} =~ /^[ibv]$/ } @arguments ];
	}
	return @$functions;
}

# A default without a trailing cast to its argument's own type ('{}'::jsonb: '{}').
sub bare_default
{
	my ($default, $type) = @_;
	return undef unless defined $default;
	(my $bare = $default) =~ s/::\Q$type\E$//;
	return $bare;
}

my %MODE = (i => 'IN', o => 'OUT', b => 'INOUT', v => 'VARIADIC', t => 'TABLE');
sub argument_text
{
	my ($a) = @_;
	return "$MODE{ $a->{mode} } $a->{name} $a->{type}" . (defined $a->{default} ? " DEFAULT $a->{default}" : '');
}

# What differs between the door's arguments @$d and the $other's @$o
# (their types as %$type_map maps the door's; their defaults too, if
# $defaults), one line each.
sub argument_differences
{
	my ($other, $d, $o, $type_map, $defaults) = @_;
	my @problems = ((map { "$other lacks the door's argument " . argument_text($_) } @$d[ @$o .. $#$d ]),
		(map { "$other has an argument the door does not: " . argument_text($_) } @$o[ @$d .. $#$o ]));
	for my $i (0 .. ($#$d < $#$o ? $#$d : $#$o))
	{
		my ($a, $b) = ($d->[$i], $o->[$i]);
		my $type = $type_map->{ $a->{type} } // $a->{type};
		push @problems, "argument " . ($i + 1) . ": the door's $MODE{ $a->{mode} } $a->{name} $a->{type}, $other\'s "
		  . "$MODE{ $b->{mode} } $b->{name} $b->{type}"
		  if $a->{name} ne $b->{name} || $a->{mode} ne $b->{mode} || $type ne $b->{type};
		next unless $defaults;
		my ($da, $db) = (bare_default($a->{default}, $a->{type}), bare_default($b->{default}, $b->{type}));
		push @problems, "argument $a->{name}: the door's default " . ($a->{default} // 'none') . ", $other\'s "
		  . ($b->{default} // 'none')
		  if ($da // "\0") ne ($db // "\0");
	}
	return @problems;
}

# Whether a call with these arguments reaches one of the overloads
# @candidates: '' if so, else what is wrong with it (for the first).
sub call_problem
{
	my ($what, $arguments, @candidates) = @_;
	return "$what: no such API function" unless @candidates;
	my @problems;
	for my $f (@candidates)
	{
		my @in = @{ $f->{in} };
		my $npos = @{ $arguments->{positional} };
		my @p;
		push @p, "$npos positional arguments, $f->{signature} has " . scalar(@in) if $npos > @in;
		my %given = map { $_ => 1 } 0 .. $npos - 1;
		for my $named (@{ $arguments->{named} })
		{
			my ($i) = grep { $in[$_]{name} eq $named->[0] } 0 .. $#in;
			if (!defined $i) { push @p, "$f->{signature} has no argument named $named->[0]"; }
			elsif ($given{$i}++) { push @p, "argument $named->[0] of $f->{signature} given twice"; }
		}
		push @p, map { "argument $in[$_]{name} of $f->{signature} has no default and is not passed" }
		  grep { !$given{$_} && !defined $in[$_]{default} } 0 .. $#in;
		return '' unless @p;
		push @problems, @p;
	}
	return "$what: " . join('; ', @problems);
}

sub check
{
	my ($name, @problems) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	local $TODO = $KNOWN_DRIFT{$name};
	is(join("\n", @problems), '', $name);
}

sub snake { my ($camel) = @_; return $camel =~ s/([A-Z])/_\l$1/gr }

# ------------------------------------------------- doors and implementations

$node->safe_psql('postgres', 'CREATE ROLE api_nobody');
my @api = functions('postgres', q{n.nspname IN ('public', 'gd') AND EXISTS (
    SELECT FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
     WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e' AND e.extname = 'gen_durable')});
my @doors = grep { $_->{language} eq 'c' && $_->{source} eq 'gd_door' } @api;
my %api_named;
push @{ $api_named{ $_->{qualified} } }, $_ for @api;
cmp_ok(scalar(@doors), '>=', 30, 'the extension has its doors (' . scalar(@doors) . ')');

for my $door (@doors)
{
	my $implementation_name = '_' . ($door->{name} =~ s/^gd_//r);
	my $in_types = join(',', map { $_->{type} } @{ $door->{in} });
	my @implementations = grep { $_->{schema} eq 'gd' && $_->{name} eq $implementation_name
		  && join(',', map { $_->{type} } @{ $_->{in} }) eq $in_types } @api;
	my @problems;
	if (@implementations != 1)
	{
		push @problems, "no implementation gd.$implementation_name($in_types)";
	}
	else
	{
		my $impl = $implementations[0];
		push @problems, argument_differences('the implementation', $door->{arguments}, $impl->{arguments}, {}, 0);
		push @problems, "result: the door's $door->{result}, the implementation's $impl->{result}"
		  if $door->{result} ne $impl->{result} || $door->{retset} != $impl->{retset};
		push @problems, "the implementation has defaults (they live on the door): $impl->{ndefaults}"
		  if $impl->{ndefaults};
		push @problems, 'the implementation is STRICT behind a door that is not: it would run with NULLs'
		  if $impl->{strict} && !$door->{strict};
		push @problems, "PUBLIC may execute the implementation $impl->{signature}" if $impl->{public_executes};
	}
	check("door $door->{signature} and its implementation", @problems);
}

# ------------------------------------------------------------------ router

my $sharding = GdTest::project_file('sharding');
my $plproxy = $node->safe_psql('postgres', q{SELECT count(*) FROM pg_available_extensions WHERE name = 'plproxy'});
$node->safe_psql('postgres', 'CREATE DATABASE router');
if ($plproxy)
{
	$node->safe_psql('router', 'CREATE EXTENSION plproxy');
}
else
{
	# A language named plproxy that takes any body: the router's functions
	# are made and can be read, not called.
	$node->safe_psql('router', q{
CREATE FUNCTION plproxy_stand_in() RETURNS language_handler AS 'plpgsql', 'plpgsql_call_handler' LANGUAGE c;
CREATE LANGUAGE plproxy HANDLER plproxy_stand_in;});
}
note($plproxy ? 'router.sql over PL/Proxy' : 'router.sql over a stand-in for PL/Proxy (not installed)');
my ($out, $err) = run_command([ 'psql', '-X', '-q', '-d', $node->connstr('router'), '-v', 'api_schema=public',
	'-f', "$sharding/router.sql" ]);
is($err, '', 'router.sql loads');
($out, $err) = run_command([ 'psql', '-X', '-q', '-d', $node->connstr('postgres'), '-v', 'partition=0',
	'-v', 'partitions=1', '-f', "$sharding/partition.sql" ]);
is($err, '', 'partition.sql loads');

my @wrappers = functions('router', q{n.nspname = 'public' AND p.proname LIKE 'gd\_%'});
my @proxies = functions('router', q{n.nspname = 'gd_router'});
my %proxy_named;
push @{ $proxy_named{ $_->{name} } }, $_ for @proxies;

# Every door routed or listed as not routed; every wrapper a door's.
my (%routed, @unrouted, @stale, @strays);
for my $wrapper (@wrappers)
{
	# the door of its name with its types, else the one door of its name
	my $types = join(',', map { $_->{type} } @{ $wrapper->{in} });
	my @named = grep { $_->{qualified} eq $wrapper->{name} } @doors;
	my ($door) = grep { join(',', map { $ROUTER_TYPE{ $_->{type} } // $_->{type} } @{ $_->{in} }) eq $types } @named;
	$door //= $named[0] if @named == 1 && !$routed{ $named[0]{signature} };
	if ($door) { $routed{ $door->{signature} } = [ $door, $wrapper ]; }
	else { push @strays, "the router's $wrapper->{signature} has no door of that name and types"; }
}
for my $door (@doors)
{
	my $listed = exists $NOT_ROUTED{ $door->{qualified} };
	push @unrouted, "$door->{signature} is not routed (route it, or list it in \%NOT_ROUTED with the reason)"
	  if !$routed{ $door->{signature} } && !$listed;
	push @stale, "$door->{signature} is routed but listed in \%NOT_ROUTED" if $routed{ $door->{signature} } && $listed;
}
my %door_named = map { $_->{qualified} => 1 } @doors;
push @stale, map { "\%NOT_ROUTED lists $_, which is no door" } grep { !$door_named{$_} } sort keys %NOT_ROUTED;
check('every door routed or listed as not routed', @unrouted, @stale);
check('every API function of the router is a door\'s', @strays);

for my $signature (sort keys %routed)
{
	my ($door, $wrapper) = @{ $routed{$signature} };
	my @problems;
	push @problems, argument_differences('the router', $door->{arguments}, $wrapper->{arguments}, \%ROUTER_TYPE, 1);
	push @problems, "result: the door's $door->{result}, the router's $wrapper->{result}"
	  if $door->{result} ne $wrapper->{result} || $door->{retset} != $wrapper->{retset};

	# The wrapper passes its arguments on, by position, to the gd_router
	# function's arguments of the same names.
	my @passed;
	for my $call (calls_in($wrapper->{source}, '\w+', 'gd_router\.'))
	{
		my $args = call_arguments($call->[1]);
		my @targets = @{ $proxy_named{ $call->[0] } // [] };
		my ($target) = grep { @{ $_->{in} } == @{ $args->{positional} } } @targets;
		if (!$target) { push @problems, "the body calls gd_router.$call->[0] with no such function"; next; }
		for my $i (0 .. $#{ $args->{positional} })
		{
			my $arg = $args->{positional}[$i];
			next unless $arg =~ /^\w+$/ && grep { $_->{name} eq $arg } @{ $wrapper->{in} };
			push @passed, $arg;
			push @problems, "passes $arg as gd_router.$call->[0]'s argument $target->{in}[$i]{name}"
			  if $target->{in}[$i]{name} ne $arg;
		}
	}
	my %passed = map { $_ => 1 } @passed;
	push @problems, map { "argument $_->{name} is not passed on" } grep { !$passed{ $_->{name} } } @{ $wrapper->{in} };
	check("router $wrapper->{signature} as door $signature", @problems);
}

# Each PL/Proxy function calls a door with the door's arguments, in its order.
for my $proxy (grep { $_->{language} eq 'plproxy' && $_->{source} =~ /\.gd_\w+\(/ } @proxies)
{
	my @problems;
	for my $call (calls_in($proxy->{source}, 'gd_\w+', '(?:"?public"?)\.'))
	{
		my $args = call_arguments($call->[1]);
		my @named = map { $_->[0] } @{ $args->{named} };
		my @positional = map { s/::[\w.]+$//r } @{ $args->{positional} };
		my @named_doors = grep { $_->{qualified} eq $call->[0] } @doors;
		my ($door) = ((grep { @{ $_->{in} } == @positional } @named_doors), @named_doors);
		if (!$door) { push @problems, "calls $call->[0], which is no door"; next; }
		my $expected = join(', ', map { $_->{name} } @{ $door->{in} });
		push @problems, "calls $call->[0](" . join(', ', @positional) . "), the door takes ($expected)"
		  if join(', ', @positional) ne $expected || @named;
	}
	check("router $proxy->{signature} calls its door with the door's arguments", @problems);
}

# gd_insert_all's entries are routed by insert options.
my ($insert) = grep { $_->{name} eq 'gd_insert' } @doors;
my %insert_options = map { $_->{name} => 1 } @{ $insert->{in} };
check('the router routes entries by insert options',
	map { "gd_router.$_->[0] reads entry key $_->[1], not an argument of gd_insert" }
	grep { !$insert_options{ $_->[1] } }
	map { my $f = $_; map { [ $f->{name}, $_ ] } $f->{source} =~ /entry->>?'(\w+)'/g } @proxies);

# ----------------------------------------------------------- partition.sql

my ($apply) = functions('postgres', q{n.nspname = 'gd_sharding' AND p.proname = 'apply_definitions'});
my @applied = calls_in($apply->{source}, 'gd_\w+');
ok(scalar(@applied) >= 4, 'gd_sharding.apply_definitions calls the API');
for my $call (@applied)
{
	my @keys = map { /item->>?'(\w+)'/ ? $1 : "($_)" } split_top($call->[1]);
	my @candidates = grep { $_->{qualified} eq $call->[0] && @{ $_->{in} } == @keys } @doors;
	my $expected = @candidates ? join(', ', map { $_->{name} } @{ $candidates[0]{in} }) : 'no door with ' . @keys . ' arguments';
	is(join(', ', @keys), $expected, "partition.sql: apply_definitions calls $call->[0] with every argument, by its key");
}
# definitions(): every option of a step, each set, is described.
my ($define_step) = grep { $_->{name} eq 'gd_define_step' } @doors;
my @step_options = grep { !/^(fsm|step|version)$/ } map { $_->{name} } @{ $define_step->{in} };
my %option_type = map { $_->{name} => $_->{type} } @{ $define_step->{in} };
# a value of each type: as an SQL literal, and as JSON (gd_define_fsm's steps)
my %probe_value = (integer => [ '5', '5' ], interval => [ q{'7 seconds'}, '"7 seconds"' ],
	text => [ q{'probe'}, '"probe"' ], boolean => [ 'false', 'false' ],
	regprocedure => [ q{'public.api_probe(jsonb, gd.context)'}, '"public.api_probe(jsonb, gd.context)"' ]);
is(join(', ', map { "$_ $option_type{$_}" } grep { !$probe_value{ $option_type{$_} } } @step_options), '',
	'a value to set each gd_define_step option to');
# Every option set at once makes a batch step (batch => 5): its handler is a batch handler.
my %all_set = map { $_ => $probe_value{ $option_type{$_} }[0] } @step_options;
$all_set{handler} = q{'public.api_probe_batch(jsonb[], gd.context[])'} if exists $all_set{batch};
$node->safe_psql('postgres', q{
CREATE FUNCTION public.api_probe(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE sql AS $$ SELECT gd_done() $$;
CREATE FUNCTION public.api_probe_batch(states jsonb[], ctxs gd.context[]) RETURNS gd.outcome[] LANGUAGE sql
    AS $$ SELECT array_fill(gd_done(), ARRAY[cardinality(states)]) $$;
SELECT gd_define_fsm('api_probe', initial => 'only');
SELECT gd_define_fsm('api_probe_bare', initial => 'only');
SELECT gd_set_rate_limit('probe', 1, '1s');
SELECT gd_define_step('api_probe', 'only', }
	. join(', ', map { "$_ => " . ($all_set{$_} // 'NULL') } @step_options) . ');');
my $definitions = $json->decode($node->safe_psql('postgres', 'SELECT gd_sharding.definitions()'));
my ($probe_fsm) = grep { $_->{name} eq 'api_probe' } @{ $definitions->{fsms} };
my %described = map { $_ => 1 } keys %{ $probe_fsm->{steps}{only} // {} };
is(join(', ', grep { !$described{$_} } @step_options), '',
	'partition.sql: definitions() describes every gd_define_step option of a step');
is(join(', ', grep { my $k = $_; !grep { $_ eq $k } @step_options } sort keys %described), '',
	'partition.sql: and nothing gd_define_fsm\'s steps do not take');
# What definitions() describes, a version without steps too, is defined again as it is.
my ($rc, $stdout, $stderr) = $node->psql('postgres',
	'SELECT gd_sharding.apply_definitions(gd_sharding.definitions())', on_error_stop => 1);
is($stderr, '', 'partition.sql: apply_definitions takes what definitions() describes');
# gd_define_fsm's steps take each gd_define_step option as JSON of its type.
my @refused;
for my $option (@step_options)
{
	my $value = $probe_value{ $option_type{$option} }[1] // next;
	($rc, $stdout, $stderr) = $node->psql('postgres',
		qq{SELECT gd_define_fsm('api_probe_json', initial => 'only', steps => '{"only": {"$option": $value}}')},
		on_error_stop => 1);
	push @refused, "$option $option_type{$option} as $value: " . ($stderr =~ s/^.*?ERROR:\s+//sr =~ s/\n.*//sr)
	  if $stderr ne '';
}
check('gd_define_fsm steps: each gd_define_step option as JSON of its type', @refused);

# ------------------------------------------------------------------ clients

my $clients = GdTest::project_file('clients');

# Statements: { client, name, sql }, the API's schema written API.
my @statements;

# Node.js: lib/sql.js's apiStatements(api) and SQL.
my $sql_js = slurp_file("$clients/node/lib/sql.js");
my ($api_statements) = $sql_js =~ /function apiStatements\(api\)\s*\{\s*return\s*\{(.*?)\n  \};\n\}/s;
ok(defined $api_statements, 'node: sql.js has apiStatements');
while (($api_statements // '') =~ /(\w+):\s*`((?:[^`\\]|\\.)*)`/gs)
{
	my ($name, $sql) = ($1, $2);
	push @statements, { client => 'node', name => $name, sql => $sql =~ s/\$\{api\}/API/gr };
}
my ($plain_js) = $sql_js =~ /\nconst SQL = \{(.*?)\n\};/s;
while (($plain_js // '') =~ /(\w+):\s*(?:`((?:[^`\\]|\\.)*)`|"((?:[^"\\]|\\.)*)")/gs)
{
	my ($name, $sql) = ($1, $2 // $3);
	push @statements, { client => 'node', name => "SQL.$name", sql => $sql };
}

# Python: _core.Statements (each attribute a concatenation of literals, f-strings
# with {api}) and the module's statements.
my $core_py = slurp_file("$clients/python/gen_durable/_core.py");
sub python_string
{
	my ($expression, $where) = @_;
	my $s = '';
	while ($expression =~ /(f?)"((?:[^"\\]|\\.)*)"/g)
	{
		my ($f, $literal) = ($1, $2);
		fail("python: $where: {api} in a literal that is not an f-string") if !$f && $literal =~ /\{api\}/;
		$s .= $f ? $literal =~ s/\{api\}/API/gr =~ s/\{\{/{/gr =~ s/\}\}/}/gr : $literal;
	}
	return $s;
}
my ($statements_py) = $core_py =~ /\nclass Statements:.*?def __init__\(self, api: str\):\n(.*?)\n\n\n/s;
ok(defined $statements_py, 'python: _core.py has Statements');
for my $assignment (split /\n        self\./, "\n" . (($statements_py // '') =~ s/^\s*#.*\n//mgr))
{
	next unless $assignment =~ /^(\w+) = (.*)$/s;
	my ($name, $value) = ($1, $2);
	push @statements, { client => 'python', name => $name, sql => python_string($value, "Statements.$name") };
}
while ($core_py =~ /^([A-Z_]+) = (\(.*?\)|"[^\n]*")\n/gms)
{
	my ($name, $value) = ($1, $2);
	my $sql = python_string($value, $name);
	push @statements, { client => 'python', name => $name, sql => $sql } if $sql =~ /\bSELECT\b/;
}

# No API call outside the statements read above.
for my $client ([ 'node', "$clients/node/lib", qr/\.js$/, qr/\$\{api\}\.gd_/ ],
	[ 'python', "$clients/python/gen_durable", qr/\.py$/, qr/\{api\}\.gd_/ ])
{
	my ($name, $dir, $files, $call) = @$client;
	my $calls = 0;
	opendir(my $dh, $dir) or die "$dir: $!";
	for my $file (grep { $_ =~ $files } readdir $dh)
	{
		$calls += () = slurp_file("$dir/$file") =~ /$call/g;
	}
	my $read = 0;
	$read += () = $_->{sql} =~ /\bAPI\.gd_/g for grep { $_->{client} eq $name } @statements;
	is($read, $calls, "$name: every API call of the client's sources is in the statements read ($calls)");
}

# Each statement's API calls reach a function of the extension.
my %routed_names = map { $_->[1]{name} => 1 } values %routed;
for my $statement (@statements)
{
	my $label = "$statement->{client} $statement->{name}";
	my @problems;
	my $through_router = 1;
	for my $call (calls_in($statement->{sql}, 'gd_\w+', 'API\.'))
	{
		push @problems, call_problem("$call->[0]()", call_arguments($call->[1]), @{ $api_named{ $call->[0] } // [] });
		$through_router = 0 unless $routed_names{ $call->[0] };
	}
	$through_router = 0 unless $statement->{sql} =~ /\bAPI\.gd_/;
	check("$label: API calls", grep { $_ ne '' } @problems) if $statement->{sql} =~ /\bAPI\.gd_/;

	# The server resolves it: placeholders as $n.
	my ($sql, %numbered) = ($statement->{sql});
	if ($statement->{client} eq 'python')
	{
		my $n = 0;
		$sql =~ s{%\((\w+)\)s}{'$' . ($numbered{$1} //= ++$n)}ge;
		$sql =~ s{%s}{'$' . ++$n}ge;
		$sql =~ s/%%/%/g;
	}
	for my $database ('postgres', $through_router ? ('router') : ())
	{
		my ($rc, $stdout, $stderr) = $node->psql($database,
			'PREPARE s AS ' . ($sql =~ s/\bAPI\./public./gr), on_error_stop => 1);
		is($stderr, '', "$label: prepared " . ($database eq 'router' ? 'on the router' : 'in a partition'));
	}
}

# The insert options each client takes are gd_insert's, each bound to its argument.
my ($insert_statement_node) = grep { $_->{client} eq 'node' && $_->{name} eq 'insert' } @statements;
my ($insert_statement_py) = grep { $_->{client} eq 'python' && $_->{name} eq 'insert' } @statements;
my @insert_arguments = map { $_->{name} } @{ $insert->{in} };
my $client_js = slurp_file("$clients/node/lib/client.js");
my ($node_options) = $client_js =~ /const INSERT_OPTIONS = \[(.*?)\];/s;
is(join(', ', 'fsm', 'state', map { snake(s/'//gr) } split_top($node_options // '')), join(', ', @insert_arguments),
	'node: INSERT_OPTIONS are gd_insert\'s options, in its order');
my ($parameters) = $client_js =~ /function insertParameters\(.*?return \[(.*?)\];/s;
my @parameter_names = map { /\bo\.(\w+)/ ? snake($1) : /^(fsm)$/ ? $1 : /\bstate\b/ ? 'state' : "($_)" }
  split_top($parameters // '');
my ($node_call) = calls_in($insert_statement_node->{sql}, 'gd_insert', 'API\.');
my $node_args = call_arguments($node_call->[1]);
my @bound;    # the argument each $k is passed to
$bound[ $node_args->{positional}[$_] =~ /^\$(\d+)/ ? $1 : 0 ] = $insert_arguments[$_] for 0 .. $#{ $node_args->{positional} };
$bound[ $_->[1] =~ /^\$(\d+)/ ? $1 : 0 ] = $_->[0] for @{ $node_args->{named} };
is(join(', ', map { $bound[ $_ + 1 ] // '(none)' } 0 .. $#parameter_names), join(', ', @parameter_names),
	'node: insertParameters puts each option where the statement passes it to the argument of its name');
my $index_d_ts = slurp_file("$clients/node/lib/index.d.ts");
my ($insert_options_ts) = $index_d_ts =~ /export interface InsertOptions \{(.*?)\}/s;
my @typed_options = ($insert_options_ts // '') =~ /^\s*(\w+)\??:/mg;
is(join(', ', sort map { snake($_) } @typed_options), join(', ', sort grep { $_ ne 'fsm' } @insert_arguments),
	'node: index.d.ts\'s InsertOptions are gd_insert\'s options');

my ($py_option_set) = $core_py =~ /def insert_parameters\(.*?unknown = set\(options\) - \{(.*?)\}/s;
is(join(', ', 'fsm', 'state', map { s/"//gr } split_top($py_option_set // '')), join(', ', @insert_arguments),
	'python: insert_parameters takes gd_insert\'s options, in its order');
my ($py_call) = calls_in($insert_statement_py->{sql}, 'gd_insert', 'API\.');
my $py_args = call_arguments($py_call->[1]);
is(join(', ', (map { /^%\((\w+)\)s/ ? $1 : "($_)" } @{ $py_args->{positional} }),
		map { $_->[1] =~ /^%\((\w+)\)s/ && $1 eq $_->[0] ? $1 : "($_->[0] => $_->[1])" } @{ $py_args->{named} }),
	join(', ', @insert_arguments), 'python: Statements.insert passes each option to the argument of its name');

# The entries the Node.js typings declare for insertAll and spawn (insert's
# options but onDuplicate) are turned into the engine's entry keys by
# outcomes.js's ENTRY_OPTIONS, each of which gd_insert_all takes.
my $outcomes_entry_js = slurp_file("$clients/node/lib/outcomes.js");
my ($entry_map) = $outcomes_entry_js =~ /const ENTRY_OPTIONS = \{(.*?)\};/s;
my %entry_options = ($entry_map // '') =~ /(\w+): '(\w+)'/g;
is(join(', ', sort keys %entry_options), join(', ', sort 'fsm', grep { $_ ne 'onDuplicate' } @typed_options),
	'node: ENTRY_OPTIONS names every InsertEntry option');
my $refused = $node->safe_psql('postgres', q{
CREATE FUNCTION pg_temp.refused(k text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd_insert_all('api_probe', jsonb_build_array(jsonb_build_object(k, NULL)));
    RETURN false;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLERRM LIKE '%unknown insert option%';
END $$;
SELECT string_agg(k, ', ' ORDER BY n) FROM unnest(ARRAY['} . join("', '", sort values %entry_options) . q{']) WITH ORDINALITY u(k, n)
 WHERE pg_temp.refused(k)});
check('node: ENTRY_OPTIONS sends keys gd_insert_all takes',
	$refused eq '' ? () : "gd_insert_all refuses entry keys ENTRY_OPTIONS sends: $refused");
like($index_d_ts, qr/export type InsertEntry = Omit<InsertOptions, 'onDuplicate'>;/, 'node typings: InsertEntry is insert\'s options but onDuplicate');
like($index_d_ts, qr/\binsertAll\(fsm: string, entries: Iterable<InsertEntry>\)/, 'node typings: insertAll entries are InsertEntry');
like($index_d_ts, qr/\bspawn\(children: Iterable<InsertEntry &/, 'node typings: spawn children are InsertEntry');

# Outcomes: each client's keys are the SQL constructor's arguments; gd_outcome passes them in its order.
my %constructor = map { ($_->{name} =~ s/^gd_//r) => $_ } grep { $_->{schema} eq 'public' && $_->{result} eq 'gd.outcome' && $_->{name} ne 'gd_outcome' } @api;
my $outcomes_js = slurp_file("$clients/node/lib/outcomes.js");
my $outcomes_py = slurp_file("$clients/python/gen_durable/outcomes.py");
my %client_outcomes;
while ($outcomes_js =~ /\boutcome\('(\w+)', \{([^}]*)\}\)/g)    # outcome('next', { step, state, delay: ... })
{
	my ($kind, $arguments) = ($1, $2);
	$client_outcomes{node}{$kind} = [ map { /^(\w+)/ ? $1 : $_ } split_top($arguments) ];
}
while ($outcomes_py =~ /\b_outcome\("(\w+)",\s*(.*?)\)\n/gs)    # _outcome("next", step=step, ...)
{
	my ($kind, $arguments) = ($1, $2);
	$client_outcomes{python}{$kind} = [ map { /^(\w+)=/ ? $1 : $_ } split_top($arguments) ];
}
for my $client (sort keys %client_outcomes)
{
	is(join(', ', sort keys %{ $client_outcomes{$client} }), join(', ', sort keys %constructor),
		"$client: an outcome of every kind");
	for my $kind (sort keys %{ $client_outcomes{$client} })
	{
		my $f = $constructor{$kind};
		is(join(', ', sort @{ $client_outcomes{$client}{$kind} }),
			$f ? join(', ', sort map { $_->{name} } @{ $f->{in} }) : "(no gd_$kind)",
			"$client: outcome $kind has gd_$kind\'s arguments");
	}
}
my ($gd_outcome) = grep { $_->{name} eq 'gd_outcome' } @api;
my %branches = $gd_outcome->{source} =~ /WHEN '(\w+)' THEN\s*(.*?)(?=\s*WHEN '|\s*ELSE\b)/gs;
is(join(', ', sort keys %branches), join(', ', sort keys %constructor), 'gd_outcome: a branch for every kind');
for my $kind (sort keys %branches)
{
	my ($call) = calls_in($branches{$kind}, 'gd_\w+');
	my @keys = map { /outcome->>?'(\w+)'/ ? $1 : "($_)" } split_top($call->[1] // '');
	is(($call->[0] // '') . '(' . join(', ', @keys) . ')',
		"gd_$kind(" . join(', ', map { $_->{name} } @{ $constructor{$kind}{in} // [] }) . ')',
		"gd_outcome: $kind passes its keys to gd_$kind in its order");
}

$node->stop;
done_testing();
