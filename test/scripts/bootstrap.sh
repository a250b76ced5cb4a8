#!/usr/bin/env bash
# Bootstrap a Debian 12 machine for gen_durable: install the build/test
# dependencies (as root, only when something is missing), then build and
# install the extension against PostgreSQL 15.
#
#   bash test/scripts/bootstrap.sh      deps + build + install
#   source test/scripts/bootstrap.sh    only defines the helpers below and puts
#                                       PG 15's bindir first on PATH; the caller
#                                       runs gd_bootstrap_deps / gd_build_install
#
# Helpers for the other scripts: gd_as_pg (run a command as the postgres OS
# user, since initdb refuses root), gd_free_port, gd_log.

set -euo pipefail

GD_PG_MAJOR=15
GD_PG_BINDIR=/usr/lib/postgresql/$GD_PG_MAJOR/bin
GD_PG_CONFIG=$GD_PG_BINDIR/pg_config
# shellcheck disable=SC2034 # used by check.sh
GD_PGXS_DIR=/usr/lib/postgresql/$GD_PG_MAJOR/lib/pgxs
GD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# Debian's /usr/bin/pg_config may belong to another major: make sure every
# pg_config/initdb/psql/prove helper we run is PG 15's.
case ":$PATH:" in
    *":$GD_PG_BINDIR:"*) ;;
    *) export PATH="$GD_PG_BINDIR:$PATH" ;;
esac

gd_log() { printf '==> %s\n' "$*"; }

# Packages the build and the three test suites need.
GD_PACKAGES=(
    postgresql-15             # server, initdb, pg_ctl (pulls postgresql-common: the postgres user)
    postgresql-client-15      # psql, createdb
    postgresql-server-dev-15  # pg_config, PGXS, pg_regress, pg_isolation_regress, TAP modules
    libboost-dev
    g++
    make
    perl                      # prove / TAP::Harness
    libipc-run-perl           # PostgreSQL::Test::Utils needs IPC::Run
    python3-psycopg           # the Python client (clients/python), run by TAP tests
    python3-venv              # its installation test (pip install into a venv)
    pgbouncer                 # the connection pooler test (049_poolers)
    prometheus-postgres-exporter  # the Prometheus example's test (052_prometheus)
    libyaml-tiny-perl         # which reads the example's YAML files
    python3-starlette python3-uvicorn python3-jinja2 python3-psycopg-pool python3-multipart  # gd-web (web/)
    python3-httpx             # its HTTP tests (Starlette's test client)
    python3-selenium chromium chromium-driver  # its browser tests (053_web)
    postgresql-15-plproxy     # the sharding router (sharding/, 055_sharding)
    util-linux                # runuser
)

gd_missing_packages() {
    local p
    for p in "${GD_PACKAGES[@]}"; do
        if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
            echo "$p"
        fi
    done
}

# Install whatever is missing; silent when everything is already there.
gd_bootstrap_deps() {
    local missing
    missing=$(gd_missing_packages | tr '\n' ' ')
    if [[ -n "${missing// }" ]]; then
        if [[ $EUID -ne 0 ]]; then
            echo "bootstrap: missing packages ($missing) and not root: install them first" >&2
            return 1
        fi
        gd_log "installing: $missing"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
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
}

# Build the extension in directory $2 (must be warning-free: -Werror, and we
# also reject linker/other warnings) and install it; $1 names it in messages.
# The full make output goes to the log file $3, and is printed only when
# something is wrong.
gd_make_install() {
    local what=$1 dir=$2 log=$3
    # Called from `make check`: do not inherit the outer make's flags/jobserver.
    local mk=(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$dir" --no-print-directory PG_CONFIG="$GD_PG_CONFIG")
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

# Build and install gen_durable; the make output goes to $1 (default: a temp file).
gd_build_install() {
    gd_make_install gen_durable "$GD_ROOT" "${1:-$(mktemp /tmp/gd_build.XXXXXX.log)}" || return 1
    gd_log "built and installed into $("$GD_PG_CONFIG" --pkglibdir)"
}

# Build and install a test module of test/modules ($1, its directory; its own
# extension, gen_durable's files untouched); the make output goes to $2.
gd_build_install_module() {
    gd_make_install "test module $(basename "$1")" "$1" "$2"
}

# The regress tests of a test module ($1, its directory): its Makefile's
# REGRESS, one name a line.
gd_module_regress() {
    # shellcheck disable=SC2016 # $(REGRESS) is make's
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$1" --no-print-directory PG_CONFIG="$GD_PG_CONFIG" \
        --eval='gd-print-REGRESS: ; @echo $(REGRESS)' gd-print-REGRESS | tr -s ' ' '\n' | sed '/^$/d'
}

# The release the update test (test/t/046_update.pl) starts from: its tag, or
# its commit where the clone has no tags.
GD_PREVIOUS_RELEASE=v0.1
GD_PREVIOUS_COMMIT=de17bc96fd8d313cd3975fcb4f93467457e88832

# Build the previous release from the checkout's history and install it into
# a private copy of the PostgreSQL 15 installation under $1 (real binaries,
# so that PostgreSQL finds its lib and share directories next to them; links
# to everything else but gen_durable's files).  The update test starts a
# cluster there, then puts this version's installed files in their place.
# Prints the copy's install path (its bin/ and lib/ are under it).
gd_build_previous_release() {
    local dest=$1 log=$1/build.log rev f
    local pkglib sharedir prefix
    pkglib=$("$GD_PG_CONFIG" --pkglibdir)
    sharedir=$("$GD_PG_CONFIG" --sharedir)
    prefix=$dest/pg
    rm -rf "$dest" && mkdir -p "$dest/src" "$prefix$pkglib" "$prefix$sharedir/extension"
    rev=$GD_PREVIOUS_RELEASE
    git -C "$GD_ROOT" rev-parse -q --verify "$rev^{commit}" >/dev/null || rev=$GD_PREVIOUS_COMMIT
    if ! git -C "$GD_ROOT" archive "$rev" | tar -x -C "$dest/src"; then
        echo "previous release: $GD_PREVIOUS_RELEASE ($GD_PREVIOUS_COMMIT) is not in the history of $GD_ROOT" >&2
        return 1
    fi
    cp -a "$GD_PG_BINDIR" "$prefix$(dirname "$GD_PG_BINDIR")/"
    for f in "$pkglib"/*; do
        [[ $(basename "$f") == gen_durable* ]] || ln -s "$f" "$prefix$pkglib/"
    done
    for f in "$sharedir"/*; do
        [[ $(basename "$f") == extension ]] || ln -s "$f" "$prefix$sharedir/"
    done
    for f in "$sharedir"/extension/*; do
        [[ $(basename "$f") == gen_durable* ]] || ln -s "$f" "$prefix$sharedir/extension/"
    done
    unset MAKEFLAGS MFLAGS MAKELEVEL
    gd_log "building the previous release ($GD_PREVIOUS_RELEASE) for the update test" >&2
    if ! make -C "$dest/src" --no-print-directory PG_CONFIG="$GD_PG_CONFIG" -j2 >"$log" 2>&1 ||
        ! make -C "$dest/src" --no-print-directory PG_CONFIG="$GD_PG_CONFIG" DESTDIR="$prefix" install >>"$log" 2>&1; then
        echo "previous release: build FAILED; make output:" >&2
        tail -c 20000 "$log" >&2
        return 1
    fi
    [[ $EUID -ne 0 ]] || chown -R postgres: "$dest"
    echo "$prefix$(dirname "$GD_PG_BINDIR")"
}

# The Node.js client's dependencies (npm's pg, pinned by its package-lock.json)
# installed into the copy of clients/node at $1, with Node.js and npm from
# Debian when there are none (a Node.js of another origin is kept).
gd_node_client_deps() {
    local dir=$1 missing=()
    command -v node >/dev/null 2>&1 || missing+=(nodejs)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
    if ((${#missing[@]})); then
        if [[ $EUID -ne 0 ]]; then
            echo "bootstrap: missing ${missing[*]} and not root: install them first" >&2
            return 1
        fi
        gd_log "installing ${missing[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
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
