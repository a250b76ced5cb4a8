#!/usr/bin/perl
# Run TAP test files with TAP::Harness (the engine behind `prove`) and count
# assertions, for check.sh.
#
#   perl tap_run.pl COUNTS_FILE LIBDIR... -- t/001_x.pl t/002_y.pl ...
#
# Prints prove's usual per-file progress and failure details, then writes one
# line per test file to COUNTS_FILE:  "<passed> <failed> <file>"
#   passed  assertions that are ok (a failing TODO test counts as ok, as in prove)
#   failed  assertions that are not ok, plus 1 when the file itself has a
#           problem no assertion shows (died, bad exit code, plan mismatch,
#           parse errors), so a crashed test can never count as clean.
use strict;
use warnings;
use TAP::Harness;

my $counts_file = shift @ARGV or die "usage: $0 COUNTS_FILE LIBDIR... -- FILES...\n";
my (@libs, @files);
my $seen_sep = 0;
for my $a (@ARGV)
{
	if ($a eq '--') { $seen_sep = 1; next; }
	if   ($seen_sep) { push @files, $a; }
	else             { push @libs,  $a; }
}
die "no test files given\n" unless @files;

my $harness = TAP::Harness->new(
	{
		lib      => \@libs,
		verbosity => 0,
		failures => 1,    # show the failing assertion lines
		comments => 1,    # and the diagnostics around them
		color    => 0,
		merge    => 0,
	});
my $agg = $harness->runtests(@files);

open my $out, '>', $counts_file or die "cannot write $counts_file: $!\n";
for my $file (@files)
{
	my ($parser) = $agg->parsers($file);
	my ($passed, $failed) = (0, 1);    # no parser at all: count the file as one failure
	if ($parser)
	{
		$passed = scalar(my @p = $parser->passed);
		$failed = scalar(my @f = $parser->failed);
		$failed += 1 if $failed == 0 && $parser->has_problems;
	}
	print $out "$passed $failed $file\n";
}
close $out;
exit($agg->all_passed ? 0 : 1);
