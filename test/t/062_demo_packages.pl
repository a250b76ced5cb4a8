# What `make demo` installs is what the demo needs: the build's packages
# (PostgreSQL, the compiler), not the test suites' (Chromium, Selenium, the
# Prometheus exporter, PL/Proxy, the dashboard's Python packages), which
# the test command installs besides.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use GdTest;

my $scripts = GdTest::project_file('test/scripts');

# The packages bootstrap.sh lists in the array named, for PostgreSQL 15 from Debian.
sub listed
{
	my ($array) = @_;
	my $out = `env -u GD_PG_PREFIX GD_PG_MAJOR=15 bash -c 'source "$scripts/bootstrap.sh" >/dev/null && printf "%s\\n" "\${$array\[@]}"'`;
	die "sourcing bootstrap.sh failed: $?" if $?;
	return { map { $_ => 1 } split /\n/, $out };
}

my $build = listed('GD_PACKAGES');
my $test  = listed('GD_TEST_PACKAGES');
for my $needed (qw(postgresql-15 postgresql-client-15 postgresql-server-dev-15 g++ make libboost-dev util-linux))
{
	ok($build->{$needed}, "the demo installs $needed");
}
for my $only_tests (qw(chromium chromium-driver python3-selenium prometheus-postgres-exporter
	postgresql-15-plproxy python3-starlette pgbouncer mypy))
{
	ok(!$build->{$only_tests}, "the demo does not install $only_tests");
	ok($test->{$only_tests},   "the test command does");
}
is(join(' ', sort grep { $test->{$_} } keys %$build), '', 'no package is in both lists');

sub script { return slurp_file("$scripts/$_[0]"); }
like(script('demo.sh'), qr/^gd_bootstrap_deps$/m, 'demo.sh asks for the build\'s packages only');
like(script('check_major.sh'), qr/^if ! gd_bootstrap_deps test; then$/m,
	'the test command asks for the test suites\' too');

done_testing();
