# The status table (src/instance_status.cpp, gd.status_changes) is the one
# place that says which writer may move an instance from which status to
# which.  This test reads the sources and the installed schema and fails
# where something writes or spells a status past it:
#   - the C++ sources name statuses only through instance_status.hpp
#     (Status, GD_STATUS(name)) and the SQL functions made from the table;
#   - every statement that writes gd._instances.status takes its target from
#     gd._status_after(writer, status) (or, in transition.cpp's two writers,
#     from C++ checked by gd_status_change_check) and writes only over the
#     writer's from-statuses (gd._statuses_before, or an array parameter made
#     by gd_statuses_before); every (writer, status) named is in the table;
#   - no PL/pgSQL writes a status; every INSERT names its status;
#   - the partial indexes' predicates and the views name statuses only, in
#     sets the table makes (one status, the live ones, the terminal ones);
#   - docs/architecture.md shows the table as it is.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $node = GdTest::start_node('states');
$node->safe_psql('postgres', 'CREATE EXTENSION gen_durable');

my @table = map { [ split /\|/, $_, -1 ] }
  split /\n/, $node->safe_psql('postgres', 'SELECT writer, coalesce(from_status, \'\'), to_status FROM gd.status_changes');
my %statuses = map { $_ => 1 } split /,/,
  $node->safe_psql('postgres', q{SELECT array_to_string(gd._live_statuses() || gd._terminal_statuses(), ',')});
my %writes = map { ("$_->[0] $_->[2]" => 1) } @table;
my %writers = map { ($_->[0] => 1) } @table;
my $status_words = join '|', sort keys %statuses;
is(scalar(keys %statuses), 7, 'seven statuses');

sub slurp { my ($path) = @_; open my $fh, '<', $path or die "$path: $!"; local $/; return <$fh>; }
my $root = GdTest::project_file('');
my @cpp = grep { !m{/instance_status\.[ch]pp$} } glob("$root/src/*.cpp $root/src/*.hpp");
my @sql = glob("$root/sql/src/*.sql");
ok(@cpp > 20 && @sql > 10, 'the sources are there');

# The SQL text of a C++ file: its adjacent string literals joined, with GD_STATUS(x) as 'x'.
sub cpp_statements
{
	my ($text) = @_;
	$text =~ s{/\*.*?\*/}{}gs;
	$text =~ s{GD_STATUS\((\w+)\)}{"'$1'"}g;
	my @statements;
	while ($text =~ /((?:"(?:[^"\\]|\\.)*"\s*(?:\w+\s*)?)+)/g)
	{
		my $run = $1;
		my $sql = join '', ($run =~ /"((?:[^"\\]|\\.)*)"/g);
		push @statements, $sql if $sql =~ /gd\._instances/;
	}
	return @statements;
}

my (@bad_spellings, @bad_macros, @unchecked, @unknown_pairs);
my $status_writes = 0;
for my $file (@cpp)
{
	my $text = slurp($file);
	(my $name = $file) =~ s{.*/}{};
	for my $macro ($text =~ /GD_STATUS\((\w+)\)/g)
	{
		push @bad_macros, "$name: GD_STATUS($macro)" unless $statuses{$macro};
	}
	my $code = $text;
	$code =~ s{/\*.*?\*/}{}gs;
	$code =~ s{'kind', '(?:cancelled)'}{}g;    # an error document's kind, not a status
	while ($code =~ /'($status_words)'/g)
	{
		my $literal = $1;
		my $before = substr($code, 0, pos($code));
		next if $before =~ /_status_after\('\w+', '$literal'$/;
		push @bad_spellings, "$name: '$literal'";
	}
	for my $sql (cpp_statements($text))
	{
		my ($set) = $sql =~ /\bUPDATE gd\._instances\b.*?\bSET\b(.*?)(?:\bFROM\b|\bWHERE\b|$)/s;
		next unless defined $set && $set =~ /(?:^|[\s,(])status\s*=/;
		my $target_ok = $set =~ /status\s*=\s*gd\._status_after\(/
		  || ($name eq 'transition.cpp' && $set =~ /status\s*=\s*(?:\$\d+|t\.status)/);
		my $from_ok = $sql =~ /\bstatus\s*=\s*ANY\s*\(\s*(?:gd\._statuses_before\('\w+'\)|\$\d+)\s*\)/;
		$status_writes++;
		push @unchecked, "$name: " . substr($sql, 0, 90) unless $target_ok && $from_ok;
	}
}
for my $file (@cpp, @sql)
{
	my $text = slurp($file);
	(my $name = $file) =~ s{.*/}{};
	while ($text =~ /_status_after\('(\w+)', '(\w+)'\)/g)
	{
		push @unknown_pairs, "$name: $1 -> $2" unless $writes{"$1 $2"};
	}
	while ($text =~ /_statuses_before\('(\w+)'\)/g)
	{
		push @unknown_pairs, "$name: writer $1" unless $writers{$1};
	}
}
is_deeply(\@bad_spellings, [], 'the C++ sources spell no status but through instance_status.hpp');
is_deeply(\@bad_macros, [], 'every GD_STATUS names a status');
cmp_ok($status_writes, '>=', 7, "the C++ statements that write a status are found ($status_writes)");
is_deeply(\@unchecked, [], 'every C++ statement that writes a status takes it and its from-statuses from the table');
is_deeply(\@unknown_pairs, [], 'every (writer, status) a statement names is in the table');

my (@sql_writes, @unnamed_inserts);
for my $file (@sql)
{
	my $text = slurp($file);
	(my $name = $file) =~ s{.*/}{};
	$text =~ s{--[^\n]*}{}g;
	for my $update ($text =~ /(UPDATE\s+gd\._instances\b.*?;)/gs)
	{
		push @sql_writes, "$name: " . substr($update, 0, 80) if $update =~ /\bSET\b[^;]*?(?:^|[\s,(])status\s*=/s;
	}
	for my $insert ($text =~ /(INSERT\s+INTO\s+gd\._instances\b.*?\))/gs)
	{
		push @unnamed_inserts, "$name: " . substr($insert, 0, 80) unless $insert =~ /\(\s*status\s*,/;
		push @unnamed_inserts, "$name: its status is not gd._status_after('insert', ...)"
		  unless $text =~ /gd\._status_after\('insert', 'runnable'\)/;
	}
}
is_deeply(\@sql_writes, [], 'no PL/pgSQL writes a status (C++ does, from the table)');
is_deeply(\@unnamed_inserts, [], 'every INSERT into gd._instances names its status from the table');

# Sets of statuses the schema names: one status, or a set the table makes.
my $live = $node->safe_psql('postgres', q{SELECT array_to_string(gd._live_statuses(), ',')});
my $terminal = $node->safe_psql('postgres', q{SELECT array_to_string(gd._terminal_statuses(), ',')});
my %known_sets = map { ($_ => 1) } ($live, $terminal, 'executing,runnable');
sub status_sets
{
	my ($text) = @_;
	my @found;
	while ($text =~ /status\)?(?:::text)?\s*(?:=\s*ANY\s*\(\s*(?:\(?ARRAY\[(.*?)\]|'\{(.*?)\}')|IN\s*\((.*?)\)|=\s*'(\w+)')/g)
	{
		my $list = $1 // $2 // $3 // $4;
		my @names = map { s/^\s*'?|'?(?:::text)?\s*$//gr } split /,/, $list;
		push @found, [@names];
	}
	return @found;
}
my @odd;
my $definitions = $node->safe_psql('postgres', q{
	SELECT 'index ' || c.relname || ': ' || pg_get_expr(i.indpred, i.indrelid)
	  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
	 WHERE i.indrelid = 'gd._instances'::regclass AND i.indpred IS NOT NULL
	UNION ALL
	SELECT 'view ' || c.relname || ': ' || pg_get_viewdef(c.oid)
	  FROM pg_class c WHERE c.relnamespace = 'gd'::regnamespace AND c.relkind = 'v'});
my $predicates = 0;
for my $line (split /\n(?=index |view )/, $definitions)
{
	for my $set (status_sets($line))
	{
		$predicates++;
		my @names = @$set;
		my @unknown = grep { !$statuses{$_} } @names;
		my $sorted_live = join ',', sort split /,/, $live;
		my $joined = join ',', @names;
		push @odd, substr($line, 0, 60) . ": unknown status @unknown" if @unknown;
		push @odd, substr($line, 0, 60) . ": set $joined"
		  if !@unknown && @names > 1 && !$known_sets{$joined} && !$known_sets{join ',', sort @names}
			&& join(',', sort @names) ne $sorted_live && join(',', sort @names) ne join(',', sort split /,/, $terminal);
	}
}
cmp_ok($predicates, '>=', 10, "the index predicates and views name statuses ($predicates places)");
is_deeply(\@odd, [], 'index predicates and views name statuses only, in sets the table makes');

# docs/architecture.md shows the table, row for row.
my $doc = slurp(GdTest::project_file('docs/architecture.md'));
my @doc_rows;
while ($doc =~ /^\|\s*`(\w+)`\s*\|\s*(?:`(\w+)`|\(new\))\s*\|\s*`(\w+)`\s*\|/mg)
{
	push @doc_rows, join ' ', $1, $2 // '', $3;
}
is_deeply(\@doc_rows, [ map { join ' ', @$_ } @table ], 'docs/architecture.md shows the status table as it is');

$node->stop;
done_testing();
