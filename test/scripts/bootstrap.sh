#!/usr/bin/env bash
# Bootstrap a Debian 12 machine for gen_durable: install the build/test
# dependencies (as root, only when something is missing), then build and
# install the extension against one PostgreSQL major.
#
#   bash test/scripts/bootstrap.sh      deps + build + install (PostgreSQL 15)
#   source test/scripts/bootstrap.sh    only defines the helpers below and puts
#                                       the major's bindir first on PATH; the
#                                       caller runs gd_bootstrap_deps / gd_build_install
#
# The major: GD_PG_MAJOR (default 15), Debian's packages of it
# (/usr/lib/postgresql/MAJOR: bookworm's 15, or trixie's 17 inside the chroot
# of test/scripts/pg_chroot.sh), or, with GD_PG_PREFIX, a PostgreSQL built
# from source into that prefix (18: test/scripts/pg_source.sh).
#
# Helpers for the other scripts: gd_as_pg (run a command as the postgres OS
# user, since initdb refuses root), gd_free_port, gd_log, gd_tap_env, and the
# private installations two TAP files start clusters on
# (gd_build_previous_release, gd_build_pg15_copy).

set -euo pipefail

GD_PG_MAJOR=${GD_PG_MAJOR:-15}
GD_PG_PREFIX=${GD_PG_PREFIX:-}
if [[ -n $GD_PG_PREFIX ]]; then
    GD_PG_BINDIR=$GD_PG_PREFIX/bin
else
    GD_PG_BINDIR=/usr/lib/postgresql/$GD_PG_MAJOR/bin
fi
GD_PG_CONFIG=$GD_PG_BINDIR/pg_config
GD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# PGXS, pg_regress, pg_isolation_regress and the TAP modules (once the major is installed).
gd_pgxs_dir() { echo "$("$GD_PG_CONFIG" --pkglibdir)/pgxs"; }
# shellcheck disable=SC2034 # used by check.sh and the run_* scripts
GD_PGXS_DIR=$([[ -x $GD_PG_CONFIG ]] && gd_pgxs_dir || true)

# Debian's /usr/bin/pg_config may belong to another major: make sure every
# pg_config/initdb/psql/prove helper we run is the major's.
case ":$PATH:" in
    *":$GD_PG_BINDIR:"*) ;;
    *) export PATH="$GD_PG_BINDIR:$PATH" ;;
esac

gd_log() { printf '==> %s\n' "$*"; }

# Packages a build and the demo need (GD_PACKAGES): Debian's PostgreSQL of
# the major (none for one built from source), the compiler, runuser; and what
# the test suites need besides (GD_TEST_PACKAGES).
GD_PACKAGES=()
[[ -n $GD_PG_PREFIX ]] || GD_PACKAGES+=(
    postgresql-$GD_PG_MAJOR             # server, initdb, pg_ctl (pulls postgresql-common: the postgres user)
    postgresql-client-$GD_PG_MAJOR      # psql, createdb, pg_regress, pg_isolation_regress, TAP modules
    postgresql-server-dev-$GD_PG_MAJOR  # pg_config, PGXS
)
GD_PACKAGES+=(
    libboost-dev
    g++
    make
    util-linux                # runuser
)
GD_TEST_PACKAGES=()
[[ -n $GD_PG_PREFIX ]] || GD_TEST_PACKAGES+=(
    postgresql-$GD_PG_MAJOR-plproxy     # the sharding router (sharding/, 055_sharding)
)
GD_TEST_PACKAGES+=(
    perl                      # prove / TAP::Harness
    libipc-run-perl           # PostgreSQL::Test::Utils needs IPC::Run
    python3-psycopg           # the Python client (clients/python), run by TAP tests
    mypy                      # which checks its types (047)
    python3-venv              # its installation test (pip install into a venv)
    pgbouncer                 # the connection pooler test (049_poolers)
    prometheus-postgres-exporter  # the Prometheus example's test (052_prometheus)
    libyaml-tiny-perl         # which reads the example's YAML files
    python3-starlette python3-uvicorn python3-jinja2 python3-psycopg-pool python3-multipart  # gd-web (web/)
    python3-httpx             # its HTTP tests (Starlette's test client)
    python3-selenium chromium chromium-driver  # its browser tests (053_web)
)

# The packages among $@ that are not installed, one a line.
gd_not_installed() {
    local p
    for p in "$@"; do
        [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || echo "$p"
    done
}

# Install the packages $2... with apt (none: nothing to do); $1 names who
# needs them in messages, which go to stderr.  Only root may.
gd_apt_install() {
    local who=$1
    shift
    (($#)) || return 0
    if [[ $EUID -ne 0 ]]; then
        echo "$who: missing packages ($*) and not root: install them first" >&2
        return 1
    fi
    gd_log "$who: installing $*" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Install whatever is missing; silent when everything is already there.
# gd_bootstrap_deps [test]: install what a build needs, and with `test` what
# the test suites need too.
gd_bootstrap_deps() {
    local missing wanted=("${GD_PACKAGES[@]}")
    [[ ${1:-} != test ]] || wanted+=("${GD_TEST_PACKAGES[@]}")
    mapfile -t missing < <(gd_not_installed "${wanted[@]}")
    gd_apt_install bootstrap "${missing[@]}" || return 1
    # postgresql-common creates it; be robust on a machine where it was removed.
    if ! id postgres >/dev/null 2>&1; then
        if [[ $EUID -ne 0 ]]; then
            echo "bootstrap: no 'postgres' OS user and not root" >&2
            return 1
        fi
        gd_log "creating OS user postgres"
        useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres
    fi
    [[ -x $GD_PG_CONFIG ]] || { echo "bootstrap: $GD_PG_CONFIG not found" >&2; return 1; }
    GD_PGXS_DIR=$(gd_pgxs_dir)
}

# Build the extension in directory $2 (must be warning-free: -Werror, and we
# also reject linker/other warnings) and install it; $1 names it in messages.
# The full make output goes to the log file $3, and is printed only when
# something is wrong; further arguments go to make (DESTDIR=...).
gd_make_install() {
    local what=$1 dir=$2 log=$3
    # Called from `make check`: do not inherit the outer make's flags/jobserver.
    local mk=(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$dir" --no-print-directory PG_CONFIG="$GD_PG_CONFIG" "${@:4}")
    gd_log "building $what (make -j2, PG_CONFIG=$GD_PG_CONFIG)"
    if ! "${mk[@]}" -j2 >"$log" 2>&1; then
        echo "$what: build FAILED; make output:" >&2
        tail -c 20000 "$log" >&2
        return 1
    fi
    if grep -qi 'warning:' "$log"; then
        echo "$what: build produced warnings (treated as failure):" >&2
        grep -i -B2 -A4 'warning:' "$log" | head -c 20000 >&2
        return 1
    fi
    if ! "${mk[@]}" install >>"$log" 2>&1; then
        echo "$what: make install FAILED:" >&2
        tail -c 20000 "$log" >&2
        return 1
    fi
}

# Where the major's build happens: a mirror of what the build reads
# (.build/ in the checkout, ignored by git), one per major and kind of
# installation, so a build for one major never links objects compiled for
# another, and the next run rebuilds only what changed.
gd_build_dir() {
    echo "$GD_ROOT/.build/pg$GD_PG_MAJOR${GD_PG_PREFIX:+-source}"
}

# Mirror the build's inputs into $1 (default gd_build_dir): files gone from
# the checkout go from the mirror too (the Makefile builds every src/*.cpp);
# the others are copied with their times, so make sees what changed.
gd_mirror_sources() {
    local dest=${1:-$(gd_build_dir)} f
    local inputs=(Makefile gen_durable.control src sql test/modules)
    mkdir -p "$dest"
    while IFS= read -r f; do
        [[ -e $GD_ROOT/$f ]] || rm -f "$dest/$f"
    done < <(cd "$dest" && find "${inputs[@]}" -type f ! -name '*.o' ! -name '*.so' ! -name '*.bc' \
                 ! -path 'sql/gen_durable--*' 2>/dev/null)
    tar -C "$GD_ROOT" --exclude='*.o' --exclude='*.so' --exclude='*.bc' --exclude='sql/gen_durable--*' \
        -cf - "${inputs[@]}" | tar -C "$dest" -xf -
}

# Build and install gen_durable; the make output goes to $1 (default: a temp file).
gd_build_install() {
    gd_mirror_sources
    gd_make_install gen_durable "$(gd_build_dir)" "${1:-$(mktemp /tmp/gd_build.XXXXXX.log)}" || return 1
    gd_log "built and installed into $("$GD_PG_CONFIG" --pkglibdir)"
}

# Build and install a test module of test/modules ($1, its name; its own
# extension, gen_durable's files untouched; after gd_build_install, whose
# mirror holds it); the make output goes to $2.
gd_build_install_module() {
    gd_make_install "test module $1" "$(gd_build_dir)/test/modules/$1" "$2"
}

# The regress tests of a test module ($1, its name): its Makefile's
# REGRESS, one name a line.
gd_module_regress() {
    # shellcheck disable=SC2016 # $(REGRESS) is make's
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$(gd_build_dir)/test/modules/$1" --no-print-directory PG_CONFIG="$GD_PG_CONFIG" \
        --eval='gd-print-REGRESS: ; @echo $(REGRESS)' gd-print-REGRESS | tr -s ' ' '\n' | sed '/^$/d'
}

# The release the update test (test/t/046_update.pl) starts from: its tag, or
# its commit where the clone has no tags.
GD_PREVIOUS_RELEASE=v0.1
GD_PREVIOUS_COMMIT=de17bc96fd8d313cd3975fcb4f93467457e88832

# Install gen_durable, built from the sources in $1/src, into a private copy
# of the PostgreSQL installation whose pg_config is $2, under $1/pg: real
# binaries, so that PostgreSQL finds its lib and share directories next to
# them; links to everything else but gen_durable's files.  $3 names it in
# messages.  Prints the copy's install path (its bin/ and lib/ are under it:
# PostgreSQL::Test::Cluster's install_path).
gd_private_install() {
    local dest=$1 what=$3 bindir pkglib sharedir prefix f
    local GD_PG_CONFIG=$2 # gd_make_install's
    bindir=$("$GD_PG_CONFIG" --bindir) && pkglib=$("$GD_PG_CONFIG" --pkglibdir) &&
        sharedir=$("$GD_PG_CONFIG" --sharedir) || return 1
    prefix=$dest/pg
    mkdir -p "$prefix$pkglib" "$prefix$sharedir/extension" || return 1
    cp -a "$bindir" "$prefix$(dirname "$bindir")/" || return 1
    for f in "$pkglib"/*; do
        [[ $(basename "$f") == gen_durable* ]] || ln -s "$f" "$prefix$pkglib/"
    done
    for f in "$sharedir"/*; do
        [[ $(basename "$f") == extension ]] || ln -s "$f" "$prefix$sharedir/"
    done
    for f in "$sharedir"/extension/*; do
        [[ $(basename "$f") == gen_durable* ]] || ln -s "$f" "$prefix$sharedir/extension/"
    done
    gd_make_install "$what" "$dest/src" "$dest/build.log" DESTDIR="$prefix" >&2 || return 1
    [[ $EUID -ne 0 ]] || chown -R postgres: "$dest"
    echo "$prefix$(dirname "$bindir")"
}

# The previous release, built from the checkout's history, in a private copy
# of the major's installation under $1 (gd_private_install).  The update
# test starts a cluster there, then puts this version's installed files in
# their place.  Prints the copy's install path.
gd_build_previous_release() {
    local dest=$1 rev
    rm -rf "$dest" && mkdir -p "$dest/src" || return 1
    rev=$GD_PREVIOUS_RELEASE
    git -C "$GD_ROOT" rev-parse -q --verify "$rev^{commit}" >/dev/null || rev=$GD_PREVIOUS_COMMIT
    if ! git -C "$GD_ROOT" archive "$rev" | tar -x -C "$dest/src"; then
        echo "previous release: $GD_PREVIOUS_RELEASE ($GD_PREVIOUS_COMMIT) is not in the history of $GD_ROOT" >&2
        return 1
    fi
    gd_private_install "$dest" "$GD_PG_CONFIG" "the previous release ($GD_PREVIOUS_RELEASE) for the update test"
}

# The previous release does not build on PostgreSQL 17 and later (nor ran on
# them): the reason the update test is skipped there, or nothing.
gd_previous_release_unavailable() {
    ((GD_PG_MAJOR < 17)) || echo "the previous release ($GD_PREVIOUS_RELEASE) does not build on PostgreSQL $GD_PG_MAJOR"
}

# The PostgreSQL 15 the upgrade test (058) upgrades from, beside the major
# under test: bookworm's, here, or in the trixie chroot, where trixie has
# none, unpacked from bookworm's packages (pg_chroot.sh's GD_CHROOT_PG15).
GD_PG15_CONFIGS=(/usr/lib/postgresql/15/bin/pg_config /opt/bookworm-postgresql-15/usr/lib/postgresql/15/bin/pg_config)

# The first of GD_PG15_CONFIGS with PGXS (its server development files).
gd_pg15_config() {
    local c
    for c in "${GD_PG15_CONFIGS[@]}"; do
        if [[ -x $c && -f $("$c" --pgxs 2>/dev/null) ]]; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

# Why the upgrade test cannot run with this major, or nothing.
gd_pg15_unavailable() {
    if ((GD_PG_MAJOR <= 15)); then
        echo "it upgrades from PostgreSQL 15 to a later major, not to $GD_PG_MAJOR"
    elif ! gd_pg15_config >/dev/null; then
        echo "no PostgreSQL 15 with its server development files (${GD_PG15_CONFIGS[*]})"
    fi
}

# This version of gen_durable, from the checkout, for PostgreSQL 15 in a
# private copy of its installation under $1 (gd_private_install): the
# cluster the upgrade test starts on.  Prints the copy's install path.
gd_build_pg15_copy() {
    local dest=$1 pg_config
    pg_config=$(gd_pg15_config) || return 1
    rm -rf "$dest" && mkdir -p "$dest/src" && gd_mirror_sources "$dest/src" || return 1
    gd_private_install "$dest" "$pg_config" "gen_durable for PostgreSQL 15 (the upgrade test's)"
}

# The environment of a TAP file, one NAME=value a line (for env): what
# Makefile.global's prove_installcheck sets for a PGXS build — the TAP
# modules' directories (TESTDIR up to 16; TESTDATADIR and TESTLOGDIR from 17:
# both are set, to the same place), the major's bindir first on PATH
# (Cluster.pm runs initdb/pg_ctl/pg_config from PATH), PGPORT, PG_REGRESS
# (--config-auth) — and ours: the scratch copy of the project the files
# read (GD_PROJECT_DIR: GdTest::project_file), the previous release's
# install (046_update), the 15 copy's (058_major_upgrade), or why there is none.
#   $1 scratch dir (TAP files in $1/t, their data under $1/tap)  $2 port
#   $3 previous install  $4 the 15 copy's install
gd_tap_env() {
    local work=$1
    printf '%s\n' "TESTDIR=$work/tap" "TESTDATADIR=$work/tap/tmp_check" "TESTLOGDIR=$work/tap/tmp_check/log" \
        "GD_PROJECT_DIR=$work" \
        "PATH=$GD_PG_BINDIR:$PATH" "PGPORT=$2" "GD_PREVIOUS_INSTALL=$3" \
        "GD_PREVIOUS_UNAVAILABLE=$(gd_previous_release_unavailable)" \
        "GD_PG15_INSTALL=${4:-}" "GD_PG15_UNAVAILABLE=$(gd_pg15_unavailable)" \
        "PG_REGRESS=$GD_PGXS_DIR/src/test/regress/pg_regress" \
        "PERL5LIB=$work/t:$GD_PGXS_DIR/src/test/perl${PERL5LIB:+:$PERL5LIB}"
}

# The Node.js client's dependencies (npm's pg, pinned by its package-lock.json)
# installed into the copy of clients/node at $1, with Node.js and npm from
# Debian when there are none (a Node.js of another origin is kept).
gd_node_client_deps() {
    local dir=$1 missing=()
    command -v node >/dev/null 2>&1 || missing+=(nodejs)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
    gd_apt_install bootstrap "${missing[@]}" || return 1
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
}

# Run a command as the postgres OS user (initdb refuses root). When we are not
# root, we simply run it as ourselves. HOME points at a dir postgres can use.
gd_as_pg() {
    if [[ $EUID -eq 0 ]]; then
        runuser -u postgres -- env HOME="${GD_PG_HOME:-/tmp}" "$@"
    else
        "$@"
    fi
}

# A port with no TCP listener on localhost and no leftover socket in /tmp.
# (Our servers listen on private unix-socket dirs, so this is belt and braces.)
gd_free_port() {
    local base=${1:-5470} p
    for ((p = base; p < base + 200; p++)); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null &&
            [[ ! -e /tmp/.s.PGSQL.$p && ! -e /var/run/postgresql/.s.PGSQL.$p ]]; then
            echo "$p"
            return 0
        fi
    done
    echo "no free port in $base..$((base + 199))" >&2
    return 1
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    gd_bootstrap_deps
    gd_build_install
fi
