#!/usr/bin/env bash
# Build and install this test module, gd_guard_test (as root: it installs
# into PostgreSQL 15's directories, only gd_guard_test's files), then run its
# regress tests with pg_regress on a throwaway server, as `make check` does.
#
#   bash test/modules/guard_test/run.sh
#
# The output dir (regression.diffs, results/, log/postmaster.log) is kept and
# named at the end.
set -euo pipefail
# shellcheck source=../../scripts/bootstrap.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/bootstrap.sh"
MOD=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=$(mktemp -d /tmp/gd_guard_test.XXXXXX)
chmod 755 "$WORK"
gd_mirror_sources
gd_build_install_module "$(basename "$MOD")" "$WORK/build.log"
# The checkout may live in a root-only directory: copy what postgres needs.
cp -r "$MOD/sql" "$MOD/expected" "$WORK/"
[[ $EUID -ne 0 ]] || chown -R postgres: "$WORK"
export GD_PG_HOME=$WORK
cd "$WORK"
port=$(gd_free_port 5770)
mapfile -t names < <(gd_module_regress "$(basename "$MOD")")
set +e
gd_as_pg "$GD_PGXS_DIR/src/test/regress/pg_regress" --temp-instance="$WORK/tmp" \
    --inputdir="$WORK" --outputdir="$WORK/out" --bindir="$GD_PG_BINDIR" --port="$port" \
    --no-locale --encoding=UTF8 --dbname=contrib_regression "${names[@]}"
rc=$?
echo "(results in $WORK/out/results, diffs in $WORK/out/regression.diffs)"
exit $rc
