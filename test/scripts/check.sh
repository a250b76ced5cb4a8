#!/usr/bin/env bash
# `make check`: every test suite (test/scripts/check_major.sh: regress, the
# test module, isolation, TAP with the clients' and the dashboard's suites)
# on every supported PostgreSQL major, each the way Debian's archive serves
# it to this Debian 12 machine:
#
#   15  bookworm's packages, installed here with apt when missing
#   17  trixie's packages, in a trixie chroot (test/scripts/pg_chroot.sh)
#   18  sid's source package, built into a prefix (test/scripts/pg_source.sh)
#
# (16 is in no suite Debian serves: the code keeps its version guards.)  The
# chroot and the build are made once, in ${GD_CACHE:-/var/cache/gen_durable},
# and reused while Debian serves the same version.  Each major's suites end
# with its own "N passed, M failed"; a major that could not be provided
# counts 1 failure.  The last lines sum them: one per major, then exactly
# "N passed, M failed" over all; the exit code is non-zero if M > 0.
#
# GD_PG_MAJORS (default "15 17 18") runs some of them; the other knobs are
# check_major.sh's.
set -euo pipefail

SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bootstrap.sh
source "$SCRIPTS/bootstrap.sh"
for provider in pg_chroot.sh pg_source.sh; do
    # shellcheck source=/dev/null
    [[ ! -f $SCRIPTS/$provider ]] || source "$SCRIPTS/$provider"
done

MAJORS=${GD_PG_MAJORS:-15 17 18}
PASSED=0
FAILED=0
SUMMARY=()

# Run one major's suites (the command given), show their output, and add up
# their closing line; $1 names the major in the summary.
run_major() {
    local name=$1 out line
    shift
    out=$(mktemp /tmp/gd_check_major.XXXXXX)
    set +e
    "$@" 2>&1 | tee "$out"
    set -e
    line=$(tail -n 1 "$out")
    rm -f "$out"
    if [[ $line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
        PASSED=$((PASSED + BASH_REMATCH[1]))
        FAILED=$((FAILED + BASH_REMATCH[2]))
        SUMMARY+=("$name: $line")
    else
        FAILED=$((FAILED + 1))
        SUMMARY+=("$name: did not finish (1 failure counted)")
    fi
}

# A major that could not be provided: 1 failure.
unprovided() {
    FAILED=$((FAILED + 1))
    SUMMARY+=("PostgreSQL $1: could not be provided (1 failure counted)")
}

for major in $MAJORS; do
    printf '\n################ PostgreSQL %s ################\n' "$major"
    case $major in
    15)
        run_major "PostgreSQL 15 (Debian bookworm)" env GD_PG_MAJOR=15 GD_PG_PREFIX= bash "$SCRIPTS/check_major.sh"
        ;;
    17)
        if root=$(gd_pg_chroot_provide 17); then
            # the checkout at its own path inside (check_major.sh builds in its .build/)
            GD_CHROOT_BINDS=$GD_ROOT
            run_major "PostgreSQL 17 (Debian trixie, in ${root##*/})" \
                gd_in_chroot "$root" env GD_PG_MAJOR=17 GD_PG_PREFIX= bash "$SCRIPTS/check_major.sh"
        else
            unprovided 17
        fi
        ;;
    18)
        if prefix=$(gd_pg_source_provide 18); then
            run_major "PostgreSQL 18 (built from Debian sid's source, ${prefix##*/})" \
                env GD_PG_MAJOR=18 GD_PG_PREFIX="$prefix" bash "$SCRIPTS/check_major.sh"
        else
            unprovided 18
        fi
        ;;
    *)
        echo "check: PostgreSQL $major is not one this machine can provide (15, 17, 18)" >&2
        unprovided "$major"
        ;;
    esac
done

echo
printf '%s\n' "${SUMMARY[@]}"
echo "$PASSED passed, $FAILED failed"
exit $((FAILED > 0 ? 1 : 0))
