#!/usr/bin/env bash
# The test suites of one PostgreSQL major (check.sh runs this for each):
# bootstrap what is missing, build + install gen_durable for the major
# (GD_PG_MAJOR, GD_PG_PREFIX: see bootstrap.sh), then run every test suite
# against throwaway instances of it:
#
#   pg_regress            test/sql/NNN_name.sql   vs expected/NNN_name.out
#   pg_regress            test/modules/M/sql/*.sql vs test/modules/M/expected
#                         (test modules, each built and installed first)
#   pg_isolation_regress  test/specs/name.spec    vs expected/name.out
#   TAP (prove)           test/t/*.pl             PostgreSQL::Test::Cluster
#
# Counting: each pg_regress test and each isolation spec is 1 result (ok or
# failed); each TAP assertion is 1 result (a TAP file that dies or exits badly
# adds 1 failure). A failed build counts as 1 failure (a test module's too).
# The last line printed is always exactly "N passed, M failed"; the exit code
# is non-zero if M > 0.  A TAP file that skips itself (skip_all) is named
# with its reason in the lines before.
#
# The regress and isolation tests are the Makefile's REGRESS and ISOLATION
# (read with `make print-REGRESS` / `make print-ISOLATION`), the lists
# `make installcheck` runs against a running server.  A test module's are its
# own Makefile's REGRESS (`make -C test/modules/M install installcheck`).
#
# Conventions for test authors:
#  - the regress database is gd_regress (see test/pg_test.conf), shared by
#    all test/sql files, which run in sorted (C collation) order in one
#    pg_regress invocation; pg_regress does not create the extension, the
#    tests do (001_setup.sql).  Every other file also runs alone (`make
#    installcheck REGRESS=NAME`): it includes test/sql/include/setup.sql
#    (what 001_setup creates, when missing) and creates, when missing, what
#    it uses of earlier files; a file cleans up what outlives its database
#    (roles).
#  - isolation specs run in "isolation_regression"; create the extension in
#    the spec's setup.
#  - TAP tests configure their own nodes (shared_preload_libraries etc.).
#
# Env knobs: GD_KEEP_WORK=1 keeps the scratch dir even on success;
# GD_SUITE_TIMEOUT (seconds per pg_regress or isolation suite, default 180),
# GD_TAP_SUITE_TIMEOUT (seconds for the TAP suite, default 900).
set -euo pipefail

# shellcheck source=bootstrap.sh
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
ROOT=$GD_ROOT
PGXS=$GD_PGXS_DIR
SUITE_TIMEOUT=${GD_SUITE_TIMEOUT:-180}
# The TAP suite starts a cluster per file (crash, standby, load tests): it gets longer.
TAP_SUITE_TIMEOUT=${GD_TAP_SUITE_TIMEOUT:-900}
DIFF_LIMIT=20000

PASSED=0
FAILED=0
WORK=""

# Stop any postmaster we started that is still around (suite killed by the
# timeout, or the script interrupted). Silent: nothing may follow the summary.
stop_leftover_servers() {
    [[ -n $WORK && -d $WORK ]] || return 0
    local pidfile
    while IFS= read -r pidfile; do
        gd_as_pg "$GD_PG_BINDIR/pg_ctl" stop -D "$(dirname "$pidfile")" -m immediate >/dev/null 2>&1 || true
    done < <(find "$WORK" -name postmaster.pid 2>/dev/null)
}
trap stop_leftover_servers EXIT

summary_and_exit() {
    stop_leftover_servers
    if [[ -n $WORK && -d $WORK ]]; then
        if [[ $FAILED -eq 0 && -z ${GD_KEEP_WORK:-} ]]; then
            rm -rf "$WORK"
        else
            echo "(test outputs and server logs kept in $WORK)"
        fi
    fi
    echo "$PASSED passed, $FAILED failed"
    exit $((FAILED > 0 ? 1 : 0))
}

section() { printf '\n======== %s ========\n' "$*"; }

# Print the tail of a server log, if it exists.
show_log_tail() {
    local f=$1
    [[ -f $f ]] || return 0
    echo "---- tail of $f ----"
    tail -n 60 "$f"
}

# A suite that is one result: run the command ($3...), its output kept in
# $WORK/NAME.out and its last $2 lines shown when it fails; counted as NAME ($1).
one_result() {
    local name=$1 lines=$2
    shift 2
    if "$@" >"$WORK/$name.out" 2>&1; then
        PASSED=$((PASSED + 1))
        echo "$name: 1 passed, 0 failed"
    else
        FAILED=$((FAILED + 1))
        tail -n "$lines" "$WORK/$name.out"
        echo "$name: 0 passed, 1 failed"
        return 1
    fi
}

# ---------------------------------------------------------------- bootstrap
if ! gd_bootstrap_deps test; then
    FAILED=$((FAILED + 1))
    summary_and_exit
fi
PGXS=$GD_PGXS_DIR
echo "$("$GD_PG_CONFIG" --version)${GD_PG_PREFIX:+, built from source into $GD_PG_PREFIX}"

WORK=$(mktemp -d /tmp/gd_check.XXXXXX)
# postgres needs to traverse and write the scratch dir, never the checkout.
chmod 755 "$WORK"

if ! gd_build_install "$WORK/build.log"; then
    FAILED=$((FAILED + 1))
    summary_and_exit
fi
# The release the update test starts from (a failure here fails that test;
# on a major it does not build on, the test skips itself).
previous_install=""
[[ -n $(gd_previous_release_unavailable) ]] ||
    previous_install=$(gd_build_previous_release "$WORK/previous") || previous_install=""
# This version built for PostgreSQL 15, which the upgrade test (058)
# upgrades from (a failure here fails that test; on 15, or without a 15 to
# build for, it skips itself).
pg15_install=""
[[ -n $(gd_pg15_unavailable) ]] || pg15_install=$(gd_build_pg15_copy "$WORK/pg15") || pg15_install=""


# --------------------------------------------------- scratch copy of the tests
# The checkout may live in a root-only directory: copy what postgres needs.
mkdir -p "$WORK"/{sql,expected,specs,t,tap}
# The test lists: the Makefile's, one name a line (without PGXS: no pg_config needed).
make_list() { # REGRESS | ISOLATION
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$ROOT" --no-print-directory "print-$1" | tr -s ' ' '\n' | sed '/^$/d'
}
if ! regress_list=$(make_list REGRESS) || ! iso_list=$(make_list ISOLATION); then
    echo "could not read REGRESS and ISOLATION from the Makefile" >&2
    FAILED=$((FAILED + 1))
    summary_and_exit
fi
shopt -s nullglob
sql_files=("$ROOT"/test/sql/*.sql)
spec_files=("$ROOT"/test/specs/*.spec)
tap_files=("$ROOT"/test/t/*.pl)
tap_mods=("$ROOT"/test/t/*.pm)     # shared helpers (GdTest.pm), on PERL5LIB
exp_files=("$ROOT"/expected/*.out)
shopt -u nullglob
((${#sql_files[@]})) && cp "${sql_files[@]}" "$WORK/sql/"
cp -r "$ROOT/test/sql/include" "$WORK/sql/"   # setup.sql, included by the tests
((${#spec_files[@]})) && cp "${spec_files[@]}" "$WORK/specs/"
((${#tap_files[@]})) && cp "${tap_files[@]}" "$WORK/t/"
((${#tap_mods[@]})) && cp "${tap_mods[@]}" "$WORK/t/"
((${#exp_files[@]})) && cp "${exp_files[@]}" "$WORK/expected/"
cp "$ROOT/test/pg_test.conf" "$WORK/pg_test.conf"
# Isolation: same settings, with the overrides of pg_test_isolation.conf last
# (in postgresql.conf the last occurrence of a setting wins).
cat "$ROOT/test/pg_test.conf" "$ROOT/test/pg_test_isolation.conf" >"$WORK/pg_test_isolation.conf"
cp "$ROOT/test/scripts/tap_run.pl" "$WORK/tap_run.pl"
cp -r "$ROOT/examples" "$ROOT/clients" "$ROOT/web" "$ROOT/sharding" "$ROOT/src" "$ROOT/sql" "$ROOT/docs" "$WORK/"   # examples, the client libraries and gd-web, run by TAP tests; the sources and docs, read by some
mkdir -p "$WORK/test" && cp -r "$ROOT/test/scripts" "$WORK/test/"   # the scripts, read by 062
# (a failure here fails the Node.js client's test)
gd_node_client_deps "$WORK/clients/node" || echo "the Node.js client's dependencies could not be installed" >&2
cp "$ROOT/README.md" "$WORK/README.md"     # its tutorial, run by a TAP test
# The test modules' regress tests, each module in a directory of its own.
shopt -s nullglob
module_dirs=("$ROOT"/test/modules/*/)
shopt -u nullglob
for dir in "${module_dirs[@]}"; do
    dir=${dir%/}
    mkdir -p "$WORK/modules/${dir##*/}"
    cp -r "$dir/sql" "$dir/expected" "$WORK/modules/${dir##*/}/"
done
: >"$WORK/module.conf"   # the modules need no settings of their own
[[ $EUID -ne 0 ]] || chown -R postgres: "$WORK"
export GD_PG_HOME=$WORK
cd "$WORK"   # postgres inherits the cwd: it must be one it can enter

# Run one pg_regress-style suite and count its results.
#   $1 label  $2 driver binary  $3 temp-config  $4 out dir  $5 temp instance
#   $6.. extra driver args, then "--", then test names
#   (REGRESS_INPUTDIR=DIR run_regress_suite ...: sql/ and expected/ under DIR,
#   not $WORK)
run_regress_suite() {
    local label=$1 driver=$2 conf=$3 outdir=$4 inst=$5 indir=${REGRESS_INPUTDIR:-$WORK}
    shift 5
    local extra=()
    while [[ $1 != -- ]]; do extra+=("$1"); shift; done
    shift
    # A test without an expected output counts as failed and is not handed to
    # pg_regress (which would abort the whole suite on the missing file).
    local names=() name port rc

    for name in "$@"; do
        if [[ -f $indir/expected/$name.out ]]; then
            names+=("$name")
        else
            echo "test $name ... FAILED (no expected/$name.out in the repository)"
            FAILED=$((FAILED + 1))
        fi
    done
    ((${#names[@]})) || return 0

    port=$(gd_free_port 5470)
    set +e
    gd_as_pg timeout --kill-after=15 "$SUITE_TIMEOUT" "$driver" \
        --temp-instance="$inst" --temp-config="$conf" \
        --inputdir="$indir" --outputdir="$outdir" \
        --bindir="$GD_PG_BINDIR" --port="$port" \
        --no-locale --encoding=UTF8 "${extra[@]}" "${names[@]}" 2>&1 |
        tee "$WORK/$label.out"
    rc=${PIPESTATUS[0]}
    set -e
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo "$label: suite TIMED OUT after ${SUITE_TIMEOUT}s"
        stop_leftover_servers   # the killed driver could not stop its postmaster
    fi

    local ok=0 bad=0
    for name in "${names[@]}"; do
        # pg_regress prints "test NAME   ... ok   12 ms" (or FAILED / failed (ignored)) up to
        # PostgreSQL 15, "ok 1  - NAME   12 ms" (or "not ok", "+" in a parallel group) from 16
        if grep -Eq "^((test)? +$name +\.\.\. +ok( |$)|ok +[0-9]+ +[-+] +$name( |$))" "$WORK/$label.out"; then
            ok=$((ok + 1))
        else
            bad=$((bad + 1))
        fi
    done
    PASSED=$((PASSED + ok))
    FAILED=$((FAILED + bad))
    echo "$label: $ok passed, $bad failed"

    if ((bad > 0)) || [[ $rc -ne 0 ]]; then
        if [[ -s $outdir/regression.diffs ]]; then
            echo "---- $outdir/regression.diffs (first $DIFF_LIMIT bytes) ----"
            head -c "$DIFF_LIMIT" "$outdir/regression.diffs"
            echo
        fi
        # initdb's log only matters when the server never came up.
        [[ -f $outdir/log/postmaster.log ]] || show_log_tail "$outdir/log/initdb.log"
        show_log_tail "$outdir/log/postmaster.log"
    fi
}

# ------------------------------------------------------------------ pg_regress
section "pg_regress (test/sql)"
mapfile -t regress_names <<<"$regress_list"
[[ -n ${regress_names[0]:-} ]] || regress_names=()
if ((${#regress_names[@]})); then
    run_regress_suite regress "$PGXS/src/test/regress/pg_regress" \
        "$WORK/pg_test.conf" "$WORK/out" "$WORK/tmp_check" \
        --dbname=gd_regress -- "${regress_names[@]}"
else
    echo "no test/sql/*.sql: skipped"
fi

# Build and install each test module of test/modules (its own extension,
# gen_durable's files untouched), then run its regress tests on a server of
# its own.  A module that does not build counts as 1 failure.
run_module_suites() {
    local dir name list names
    for dir in "${module_dirs[@]}"; do
        dir=${dir%/}
        name=${dir##*/}
        section "pg_regress (test/modules/$name)"
        if ! gd_build_install_module "$name" "$WORK/modules/$name.build.log" ||
            ! list=$(gd_module_regress "$name"); then
            FAILED=$((FAILED + 1))
            continue
        fi
        mapfile -t names <<<"$list"
        [[ -n ${names[0]:-} ]] || { echo "no REGRESS in test/modules/$name/Makefile: skipped"; continue; }
        REGRESS_INPUTDIR="$WORK/modules/$name" run_regress_suite "module_$name" \
            "$PGXS/src/test/regress/pg_regress" "$WORK/module.conf" \
            "$WORK/modules/$name/out" "$WORK/modules/$name/tmp_check" \
            --dbname=contrib_regression -- "${names[@]}"
    done
}
run_module_suites

# ------------------------------------------------------------------- isolation
section "isolation (test/specs)"
mapfile -t iso_names <<<"$iso_list"
[[ -n ${iso_names[0]:-} ]] || iso_names=()
if ((${#iso_names[@]})); then
    # Database name is pg_isolation_regress's default, "isolation_regression".
    run_regress_suite isolation "$PGXS/src/test/isolation/pg_isolation_regress" \
        "$WORK/pg_test_isolation.conf" "$WORK/out_iso" "$WORK/tmp_check_iso" \
        -- "${iso_names[@]}"
else
    echo "no test/specs/*.spec: skipped"
fi

# ------------------------------------------------------------------------- TAP
section "TAP (test/t)"
if ((${#tap_files[@]})); then
    mapfile -t tap_rel < <(for f in "${tap_files[@]}"; do echo "t/$(basename "$f")"; done | LC_ALL=C sort)
    port=$(gd_free_port 5570)
    mapfile -t tap_env < <(gd_tap_env "$WORK" "$port" "$previous_install" "$pg15_install")
    set +e
    gd_as_pg timeout --kill-after=15 "$TAP_SUITE_TIMEOUT" env "${tap_env[@]}" \
        perl "$WORK/tap_run.pl" "$WORK/tap_counts" "$PGXS/src/test/perl" "$WORK" -- "${tap_rel[@]}" 2>&1
    rc=$?
    set -e
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo "TAP: suite TIMED OUT after ${TAP_SUITE_TIMEOUT}s"
        stop_leftover_servers
    fi

    ok=0 bad=0
    for f in "${tap_rel[@]}"; do
        # "<passed> <failed> <file>" per file; a file missing here never finished.
        line=$(awk -v f="$f" '$3 == f' "$WORK/tap_counts" 2>/dev/null || true)
        if [[ -n $line ]]; then
            read -r p q _ <<<"$line"
            [[ $line != *" skipped: "* ]] || echo "skipped: $f (${line#* skipped: })"
        else
            p=0 q=1
        fi
        ok=$((ok + p))
        bad=$((bad + q))
        if ((q > 0)); then
            # Utils.pm sends everything the test prints (and the commands it
            # runs) to regress_log_<name>; each node has its own server log.
            stem=$(basename "$f" .pl)
            show_log_tail "$WORK/tap/tmp_check/log/regress_log_$stem"
            for log in "$WORK/tap/tmp_check/log/${stem}_"*.log; do
                show_log_tail "$log"
            done
        fi
    done
    PASSED=$((PASSED + ok))
    FAILED=$((FAILED + bad))
    echo "TAP: $ok passed, $bad failed"
else
    echo "no test/t/*.pl: skipped"
fi

# ---------------------------------------------------------------- installcheck
# The PGXS way (the Makefile's installcheck: pg_regress, pg_isolation_regress
# and prove_installcheck) against a running server of the major, with the
# test settings included, from a copy of the project postgres may write:
# a few tests of each kind, 1 result.
section "make installcheck (PGXS, against a running server)"
installcheck_suite() {
    local project=$WORK/installcheck data=$WORK/installcheck_data port
    mkdir -p "$project"
    tar -C "$ROOT" --exclude=./.git --exclude=./.build --exclude=node_modules --exclude='*.o' --exclude='*.so' \
        -cf - . | tar -C "$project" -xf -
    [[ $EUID -ne 0 ]] || chown -R postgres: "$project"
    port=$(gd_free_port 5770)
    gd_as_pg "$GD_PG_BINDIR/initdb" -D "$data" -A trust --no-locale -E UTF8 >"$WORK/installcheck_initdb.log" 2>&1 &&
        printf "include '%s'\nport = %s\nunix_socket_directories = '%s'\nlisten_addresses = ''\n" \
            "$project/test/pg_test_installcheck.conf" "$port" "$WORK" | gd_as_pg tee -a "$data/postgresql.conf" >/dev/null &&
        gd_as_pg "$GD_PG_BINDIR/pg_ctl" start -w -D "$data" -l "$WORK/installcheck_server.log" >/dev/null &&
        gd_as_pg env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$project" --no-print-directory installcheck \
            PG_CONFIG="$GD_PG_CONFIG" PGHOST="$WORK" PGPORT="$port" PGUSER=postgres \
            REGRESS='001_setup 002_definitions' ISOLATION=signal_dedup PROVE_TESTS=test/t/000_smoke.pl
}
one_result installcheck 40 installcheck_suite || show_log_tail "$WORK/installcheck_server.log"
stop_leftover_servers

# --------------------------------------------------------------------- package
# The Debian package of the major (make deb: debian/, pg_buildext) installed
# in place of make install's files, its autopkgtest run against it
# (debian/tests/installcheck: the regress and isolation suites on a
# pg_virtualenv server given the installcheck settings), then purged, none
# of its files left, and make install's files back: 1 result.  Last, as it
# takes the files the other suites use away for a while.  Only where the
# package tools are (pg_chroot.sh's chroot), for Debian's packages.
section "package (make deb; installed, debian/tests/installcheck, purged)"
package_skip_reason() {
    local tool
    if [[ -n $GD_PG_PREFIX ]]; then
        echo "PostgreSQL $GD_PG_MAJOR is built from source here, not Debian's"
        return
    fi
    for tool in dpkg-buildpackage dh pg_buildext; do
        if ! command -v "$tool" >/dev/null; then
            echo "no $tool here; debhelper, dpkg-dev and postgresql-server-dev-all are in pg_chroot.sh's chroot"
            return
        fi
    done
}
package_suite() {
    local pkg=postgresql-$GD_PG_MAJOR-gen-durable deb src f rc=0
    local mk=(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory PG_CONFIG="$GD_PG_CONFIG")
    "${mk[@]}" -C "$ROOT" deb DEB_DIR="$WORK/deb" || return 1
    if ! deb=$(compgen -G "$WORK/deb/${pkg}_*.deb") || ! src=$(compgen -G "$WORK/deb/gen-durable-*/"); then
        echo "make deb made no $pkg"
        return 1
    fi
    "${mk[@]}" -C "$(gd_build_dir)" uninstall || rc=1
    if ((rc == 0)) && dpkg -i "$deb"; then
        (cd "$src" && PGPORT=$(gd_free_port 5870) timeout --kill-after=15 "$SUITE_TIMEOUT" debian/tests/installcheck) || rc=1
    else
        rc=1
    fi
    dpkg --purge "$pkg" || rc=1
    while IFS= read -r f; do
        [[ ! -e $f || -d $f ]] || { echo "left behind by dpkg --purge: $f"; rc=1; }
    done < <(dpkg-deb --fsys-tarfile "$deb" | tar -t | sed 's|^\.||')
    "${mk[@]}" -C "$(gd_build_dir)" install || rc=1
    return $rc
}
reason=$(package_skip_reason)
if [[ -n $reason ]]; then
    echo "package: skipped ($reason)"
else
    one_result package 60 package_suite || true
fi

echo
summary_and_exit
