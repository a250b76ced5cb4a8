#!/usr/bin/env bash
# Run some TAP files of test/t quickly, as `make check` runs them, without the
# rest of the suite (no build: run `make -j2 && make install` first).
#
#   bash test/t/run_tap.sh 030_crash_load 032_crash_signals     (names or paths)
#
# Prints prove's output; the scratch dir (server logs under tap/tmp_check/log)
# is kept and named at the end.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/bootstrap.sh"
ROOT=$GD_ROOT
PGXS=$GD_PGXS_DIR

WORK=$(mktemp -d /tmp/gd_tap.XXXXXX)
chmod 755 "$WORK"
mkdir -p "$WORK/t" "$WORK/tap"
names=()
for a in "$@"; do
    n=$(basename "$a" .pl)
    cp "$ROOT/test/t/$n.pl" "$WORK/t/"
    names+=("t/$n.pl")
done
((${#names[@]})) || { echo "usage: $0 NAME..." >&2; exit 2; }
cp "$ROOT"/test/t/*.pm "$WORK/t/"   # shared helpers (GdTest.pm), on PERL5LIB
cp "$ROOT/test/scripts/tap_run.pl" "$WORK/tap_run.pl"
cp -r "$ROOT/examples" "$ROOT/clients" "$ROOT/web" "$ROOT/sharding" "$ROOT/src" "$ROOT/sql" "$ROOT/docs" "$WORK/"
mkdir -p "$WORK/test" && cp -r "$ROOT/test/scripts" "$WORK/test/"   # the scripts, read by 062
cp "$ROOT/README.md" "$WORK/README.md"
previous= pg15=
if [[ " ${names[*]} " == *" t/046_update.pl "* && -z $(gd_previous_release_unavailable) ]]; then
    previous=$(gd_build_previous_release "$WORK/previous")
fi
if [[ " ${names[*]} " == *" t/058_major_upgrade.pl "* && -z $(gd_pg15_unavailable) ]]; then
    pg15=$(gd_build_pg15_copy "$WORK/pg15")
fi
if [[ " ${names[*]} " == *" t/048_node_client.pl "* || " ${names[*]} " == *" t/049_poolers.pl "* ]]; then
    gd_node_client_deps "$WORK/clients/node"
fi
[[ $EUID -ne 0 ]] || chown -R postgres: "$WORK"
export GD_PG_HOME=$WORK
cd "$WORK"
port=$(gd_free_port 5670)
set +e
mapfile -t tap_env < <(gd_tap_env "$WORK" "$port" "$previous" "$pg15")
gd_as_pg env "${tap_env[@]}" perl "$WORK/tap_run.pl" "$WORK/tap_counts" "$PGXS/src/test/perl" "$WORK" -- "${names[@]}"
rc=$?
set -e
cat "$WORK/tap_counts"
echo "(scratch dir: $WORK)"
exit $rc
