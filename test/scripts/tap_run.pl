#!/usr/bin/perl
# Run TAP test files with TAP::Harness (the engine behind `prove`) and count
# assertions, for check.sh.
#
#   perl tap_run.pl COUNTS_FILE LIBDIR... -- t/001_x.pl t/002_y.pl ...
#
# Prints prove's usual per-file progress and failure details, and appends one
# line per test file to COUNTS_FILE as soon as the file ends (so a suite
# stopped by its time limit still counts the files that finished):
#   "<passed> <failed> <file>[ skipped: <reason>]"
#   passed  assertions that are ok (a failing TODO test counts as ok, as in prove)
#   failed  assertions that are not ok, plus 1 when the file itself has a
#           problem no assertion shows (died, bad exit code, plan mismatch,
#           parse errors), so a crashed test can never count as clean.
#           A file without a line never finished: check.sh counts 1 failure.
#   skipped  the reason a file skipped all its tests (skip_all).
# Each file runs in a harness of its own, so one that bails out (a server
# that cannot start) stops itself, not the files after it.
use strict;
use warnings;
use TAP::Harness;

# prove's console output, without the "All tests successful" summary after
# each file that passed (each file runs alone: see below).
package FileByFile;
use parent 'TAP::Formatter::Console';
sub summary
{
	my ($self, $aggregate, @rest) = @_;
	$self->SUPER::summary($aggregate, @rest) unless $aggregate->all_passed || $aggregate->get_status eq 'NOTESTS';
}

package main;

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
		formatter_class => 'FileByFile',
	});
open my $out, '>', $counts_file or die "cannot write $counts_file: $!\n";
$out->autoflush(1);
my $counted;
$harness->callback(
	after_test => sub {
		my ($job, $parser) = @_;
		my $passed = scalar(my @p = $parser->passed);
		my $failed = scalar(my @f = $parser->failed);
		$failed += 1 if $failed == 0 && $parser->has_problems;
		my $skipped = $parser->skip_all ? ' skipped: ' . $parser->skip_all : '';
		print $out "$passed $failed $job->[0]$skipped\n";
		$counted = 1;
	});
my $all_passed = 1;
for my $file (@files)
{
	$counted = 0;
	my $agg = eval { $harness->runtests($file) };
	if (!$agg)
	{
		print "$file: $@";    # a bail-out: the file stops here, the others go on
		print $out "0 1 $file\n" unless $counted;
	}
	$all_passed &&= $agg && $agg->all_passed;
}
close $out;
exit($all_passed ? 0 : 1);
