# The README's tutorial runs as written.  Every ```sql block of its
# "Five-minute tutorial" section is run, in order, by psql on a fresh
# database served with the tutorial's settings, and must succeed; each
# result row the tutorial shows in a comment (a `--` line of cells split by
# `|`, after its header line) must be among the rows psql printed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $readme = $ENV{GD_README} // GdTest::project_file("README.md");
plan skip_all => "no $readme" unless -f $readme;

open(my $fh, '<', $readme) or die "$readme: $!";
my $text = do { local $/; <$fh> };
close($fh);
my ($tutorial) = $text =~ /^## Five-minute tutorial\n(.*?)^## /ms or die 'no tutorial section in the README';

my (@blocks, @expected);
while ($tutorial =~ /^( *)```sql\n(.*?)^\1```/msg)
{
	my ($indent, $block) = ($1, $2);
	$block =~ s/^$indent//mg;
	push @blocks, $block;
	# A result: consecutive `--` lines with cells, its header first.
	my @lines = split /\n/, $block;
	for (my $i = 1; $i < @lines; $i++)
	{
		next unless $lines[$i] =~ /^--.*\|/ && $lines[ $i - 1 ] =~ /^--.*\|/;
		(my $row = $lines[$i]) =~ s/^--\s*//;
		push @expected, join('|', map { s/^\s+|\s+$//gr } split /\|/, $row);
	}
}
cmp_ok(scalar(@blocks), '>=', 6, sprintf('the tutorial has %d SQL blocks', scalar(@blocks)));
cmp_ok(scalar(@expected), '>=', 3, 'and shows results to check');

my $node = GdTest::start_node('tutorial',
	'gen_durable.database' => 'app',
	'gen_durable.queues'   => 'default:4, mail:2');
$node->safe_psql('postgres', 'CREATE DATABASE app');

my $script = PostgreSQL::Test::Utils::tempdir() . '/tutorial.sql';
open(my $out, '>', $script) or die "$script: $!";
print $out join("\n", @blocks);
close($out);
my ($stdout, $stderr) = ('', '');
my $ok = IPC::Run::run([ 'psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('app'), '-f', $script ],
	'>', \$stdout, '2>', \$stderr);
ok($ok, 'every SQL block of the tutorial ran') or diag($stderr);
my %printed = map { $_ => 1 } split /\n/, $stdout;
for my $row (@expected)
{
	ok($printed{$row}, "the tutorial's result row '$row' is what psql printed");
}

$node->stop;
done_testing();
