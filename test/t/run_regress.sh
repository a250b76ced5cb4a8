#!/usr/bin/env bash
# Run some test/sql files with pg_regress on a throwaway server, as `make
# check` does (no build: run `make -j2 && make install` first).  Each file
# runs alone (it includes test/sql/include/setup.sql); name 001_setup too to
# run after it, as the whole suite does.
#
#   bash test/t/run_regress.sh 030_bad_input          (names without .sql)
#   bash test/t/run_regress.sh                        (the whole suite, REGRESS)
#
# The output dir (regression.diffs, results/, log/postmaster.log) is kept and
# named at the end.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/bootstrap.sh"
ROOT=$GD_ROOT
PGXS=$GD_PGXS_DIR
WORK=$(mktemp -d /tmp/gd_regress.XXXXXX)
chmod 755 "$WORK"
mkdir -p "$WORK"/{sql,expected}
names=()
for a in "$@"; do names+=("$(basename "$a" .sql)"); done
((${#names[@]})) || read -r -a names <<<"$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$ROOT" --no-print-directory print-REGRESS)"
cp -r "$ROOT/test/sql/include" "$WORK/sql/"
cp -r "$ROOT/examples" "$WORK/"   # run by some tests, as in make check
for n in "${names[@]}"; do
    cp "$ROOT/test/sql/$n.sql" "$WORK/sql/"
    [[ -f $ROOT/expected/$n.out ]] && cp "$ROOT/expected/$n.out" "$WORK/expected/" || touch "$WORK/expected/$n.out"
done
cp "$ROOT/test/pg_test.conf" "$WORK/pg_test.conf"
[[ $EUID -ne 0 ]] || chown -R postgres: "$WORK"
export GD_PG_HOME=$WORK
cd "$WORK"
port=$(gd_free_port 5770)
set +e
gd_as_pg "$PGXS/src/test/regress/pg_regress" --temp-instance="$WORK/tmp" --temp-config="$WORK/pg_test.conf" \
    --inputdir="$WORK" --outputdir="$WORK/out" --bindir="$GD_PG_BINDIR" --port="$port" \
    --no-locale --encoding=UTF8 --dbname=gd_regress "${names[@]}"
rc=$?
echo "(results in $WORK/out/results, diffs in $WORK/out/regression.diffs)"
exit $rc
