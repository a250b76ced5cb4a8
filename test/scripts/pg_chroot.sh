# shellcheck shell=bash
# PostgreSQL MAJOR the way Debian trixie ships it (trixie's binary packages,
# from trixie, trixie-updates and trixie-security), in a trixie chroot made
# with debootstrap and kept in a cache directory that later runs reuse.  The
# chroot holds everything the whole test suite needs (GD_PACKAGES of
# bootstrap.sh, plus git, Node.js/npm, locales, procps, and bookworm's
# PostgreSQL 15 for the upgrade test: below), so `make check`'s suites for
# that major run inside it.  Sourced by check.sh (after
# bootstrap.sh); defines:
#
#   root=$(gd_pg_chroot_provide 17)
#       makes sure the chroot exists at
#       ${GD_CACHE:-/var/cache/gen_durable}/debian-trixie-postgresql-<version>
#       (<version>: postgresql-17's in trixie, e.g. 17.12-0+deb13u1) and
#       prints that path on stdout (progress and errors on stderr; non-zero
#       when it cannot be provided).  Warm (its marker file is there, written
#       last, and trixie still serves that version): only trixie's three
#       signed Release files are fetched (and a Packages index when it
#       changed).  Fresh: debootstrap --variant=minbase trixie into a temp
#       dir next to it, the packages installed inside with apt
#       (--no-install-recommends), then renamed into place; older chroots of
#       the major are removed when nothing uses them.  Where the index cannot
#       be fetched, the newest ready chroot of the major is used (warning).
#       A warm chroot is not upgraded: it is rebuilt when postgresql-MAJOR's
#       version in trixie, the package list below or GD_CHROOT_FORMAT
#       changes, or with GD_CHROOT_REFRESH=1.  One provider of a major at a
#       time (flock).  Root only.
#
#   GD_CHROOT_BINDS="/work/main /tmp/gd17"   # optional: directories (or files)
#   gd_in_chroot "$root" CMD [ARGS...]       # CMD's exit status
#       runs CMD as root inside (use runuser -u postgres -- ... inside for the
#       server), in the caller's working directory when it exists inside
#       (else /), with the caller's environment except PATH (the standard
#       one) and locale variables naming a locale the chroot lacks (C.UTF-8
#       instead: the chroot has C.UTF-8 only).  Mounted for it: /proc, /sys,
#       /dev (with /dev/pts), a private tmpfs on /dev/shm, the host's
#       /etc/resolv.conf and, read-only, its CA bundle
#       (/etc/ssl/certs/ca-certificates.crt: npm's registry is reached
#       through a TLS-intercepting proxy whose CA only the host's bundle
#       has), and each of GD_CHROOT_BINDS (absolute paths,
#       whitespace-separated) at the same path inside; the checkout and a
#       scratch dir, typically.  The rest of the chroot (its /tmp included)
#       is the cache directory's, shared by every call, and writable: `make
#       install` inside installs into the cached chroot.
#       The mounts are made in a private mount namespace (unshare --mount)
#       that only CMD and its children live in: the host never sees them,
#       they vanish when the last of those processes ends, however it ends
#       (error, Ctrl-C, SIGKILL: nothing to undo, no trap that could be
#       skipped), and calls one after another or at the same time do not
#       interfere.  A server CMD leaves running keeps its namespace (and its
#       /dev/shm) until it stops; stop it with another call (pg_ctl stop).
#
# The postgres OS user inside has the host's postgres uid/gid when the host
# has one (files the tests write into bound directories have the same owner
# on both sides).
#
# Special handling:
#  - postgresql-server-dev-17 depends on clang-19 and llvm-19-dev (about
#    550 MB installed, for the JIT's bitcode), which PGXS builds with
#    with_llvm=no (gen_durable's Makefiles) never run: a local stub package
#    (gen-durable-no-llvm) that Provides them is installed first, so the
#    real postgresql-server-dev-17 installs through apt without them and
#    dpkg's state stays consistent (`apt-get check` passes; dpkg-query reports
#    it installed, as bootstrap.sh checks).  An extension built with
#    with_llvm=yes would fail inside (no clang-19).
#  - no cluster is created by the packages (create_main_cluster = false) and
#    no service is started (policy-rc.d).
#  - trixie's python3-multipart is another library (defnull's multipart
#    1.x): Starlette's form parser there is python3-python-multipart (both
#    are installed: bootstrap.sh's check asks for python3-multipart).
#  - the host's CA bundle is lent read-only (above): an apt run inside that
#    makes ca-certificates rewrite it fails while it is mounted.
#  - PostgreSQL 15, which the upgrade test (058) upgrades from, is not in
#    trixie: bookworm's postgresql-15, postgresql-client-15 and
#    postgresql-server-dev-15 are unpacked (dpkg-deb -x; trixie's dpkg knows
#    nothing of them) under GD_CHROOT_PG15, where bootstrap.sh looks for its
#    pg_config.  The .debs come from bookworm's archive, their versions and
#    sha256 from its signed indices, as trixie's (the versions of the day the
#    chroot is made: it is not rebuilt for a new one).  PostgreSQL finds its
#    lib and share dirs next to its binaries; the bookworm libraries they
#    link that trixie lacks (ICU 72, OpenLDAP 2.5, LLVM 14: sonames trixie
#    has not, never a libc) are unpacked with them and linked into its lib/,
#    which is all the library path its binaries need: PostgreSQL::Test::
#    Cluster puts a node's lib/ on LD_LIBRARY_PATH for a node of another
#    installation, and 058 runs pg_upgrade (which runs the old binaries)
#    with it.  The build checks with ldd that every binary and module of 15
#    finds its libraries that way, and that trixie's own PostgreSQL finds
#    none there.
#
# Measured on the 2-core development machine (fast mirror; another build
# running alongside), postgresql-17 17.12-0+deb13u1:
#   fresh: 3 min 40 s (3:37 and 3:46 in two runs; debootstrap and ~750 packages;
#          2:17 on a quiet machine, bookworm's 15 included: about 11 s of it)
#   warm:  1 s (2 s when a Packages index changed and is fetched again)
#   size:  2.4 GB (du -sh; chromium ~400 MB, boost headers ~160 MB,
#          libllvm19 ~125 MB: postgresql-17 itself links it for the JIT;
#          bookworm's 15 under /opt 215 MB, LLVM 14 most of it)
#   `make check`'s suites for 17 inside (check_major.sh): about 6 to 7 min.
#
# TAP inside (17's PostgreSQL::Test::Utils): the modules are in
# /usr/lib/postgresql/17/lib/pgxs/src/test/perl; 17 reads TESTDATADIR (node
# data dirs, portlock/) and TESTLOGDIR (regress_log_*, server logs), not
# TESTDIR (without them: ./tmp_check and ./log in the working directory);
# it needs PG_REGRESS (pg_regress --config-auth at every init; it bails out
# without) and PATH starting with /usr/lib/postgresql/17/bin; run as postgres.

GD_CHROOT_SUITE=trixie
GD_CHROOT_MIRROR=${GD_CHROOT_MIRROR:-http://deb.debian.org/debian}
GD_CHROOT_SECURITY_MIRROR=${GD_CHROOT_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
GD_CHROOT_KEYRING=${GD_CHROOT_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
# Bump when the way a chroot is made changes: the next provide rebuilds it.
GD_CHROOT_FORMAT=2
# The marker, at the chroot's top, written last.
GD_CHROOT_MARKER=.gen_durable-chroot

# What the chroot holds (@M@: the major): bootstrap.sh's GD_PACKAGES and
# GD_TEST_PACKAGES (so that its check finds nothing missing inside), and
# what else the suites run.  postgresql-server-dev-@M@ is installed after the stub of its LLVM
# dependencies (see above).  python3-python-multipart: the form parser
# Starlette needs in trixie, where python3-multipart is another library
# (defnull's multipart 1.x; bookworm's python3-multipart is the one
# Starlette uses).
GD_CHROOT_PACKAGES=(
    postgresql-@M@ postgresql-client-@M@ postgresql-server-dev-@M@ postgresql-@M@-plproxy
    libboost-dev g++ make perl libipc-run-perl
    python3-psycopg python3-venv mypy
    pgbouncer prometheus-postgres-exporter libyaml-tiny-perl
    python3-starlette python3-uvicorn python3-jinja2 python3-psycopg-pool python3-multipart python3-httpx
    python3-python-multipart
    python3-selenium chromium chromium-driver
    util-linux git nodejs npm ca-certificates locales procps
    build-essential debhelper postgresql-server-dev-all   # check_major.sh's package suite (make deb)
)

# Bookworm's PostgreSQL 15 in the chroot (see the header): its packages, and
# the bookworm libraries they need that trixie does not have.
GD_CHROOT_PG15=/opt/bookworm-postgresql-15
GD_CHROOT_PG15_SUITE=bookworm
GD_CHROOT_PG15_PACKAGES=(postgresql-15 postgresql-client-15 postgresql-server-dev-15 libicu72 libldap-2.5-0 libllvm14)

_gd_chroot_log() { printf '==> pg_chroot: %s\n' "$*" >&2; }
_gd_chroot_err() { printf 'pg_chroot: %s\n' "$*" >&2; }

# The candidate of binary package $3 in Debian release $2 (the highest
# version of $2, $2-updates and $2-security, as apt would pick): "VERSION
# URL SHA256" of its .deb, from the signed Release files (verified with gpgv
# against the Debian archive keyring) and the main Packages indices, cached
# under $1 by their hash.  Uses only apt's own downloader (apt-helper), with
# the host's apt configuration read, never changed.
_gd_chroot_candidate() {
    local idx=$1/.index.debian-$2 release=$2 pkg=$3 arch tmp entry mirror base suite hash lines line best="" found=""
    local helper=(/usr/lib/apt/apt-helper -o APT::Sandbox::User=root download-file)
    arch=$(dpkg --print-architecture) || return 1
    mkdir -p "$idx" && tmp=$(mktemp -d "$idx/.fetch.XXXXXX") || return 1
    for entry in "$GD_CHROOT_MIRROR $release" "$GD_CHROOT_MIRROR $release-updates" \
        "$GD_CHROOT_SECURITY_MIRROR $release-security"; do
        mirror=${entry% *}
        suite=${entry#* }
        base=$mirror/dists/$suite
        if ! "${helper[@]}" "$base/InRelease" "$tmp/$suite.InRelease" >"$tmp/out" 2>&1 ||
            ! gpgv --keyring "$GD_CHROOT_KEYRING" --output "$tmp/$suite.Release" "$tmp/$suite.InRelease" >>"$tmp/out" 2>&1; then
            _gd_chroot_err "cannot fetch or verify $base/InRelease: $(tail -n 3 "$tmp/out")"
            rm -rf "$tmp"
            return 1
        fi
        if ! grep -qx "Codename: $suite" "$tmp/$suite.Release"; then
            _gd_chroot_err "$base/InRelease is not $suite's"
            rm -rf "$tmp"
            return 1
        fi
        hash=$(awk -v f="main/binary-$arch/Packages.xz" '/^SHA256:/ { s = 1; next } /^[^ ]/ { s = 0 } s && $3 == f { print $1 }' \
            "$tmp/$suite.Release")
        if [[ ! $hash =~ ^[0-9a-f]{64}$ ]]; then
            _gd_chroot_err "$suite's Release names no main/binary-$arch/Packages.xz"
            rm -rf "$tmp"
            return 1
        fi
        if [[ ! -f $idx/$suite.$hash.xz ]]; then
            if ! "${helper[@]}" "$base/main/binary-$arch/Packages.xz" "$tmp/Packages.xz" "SHA256:$hash" >"$tmp/out" 2>&1; then
                _gd_chroot_err "cannot fetch $base/main/binary-$arch/Packages.xz: $(tail -n 3 "$tmp/out")"
                rm -rf "$tmp"
                return 1
            fi
            rm -f "$idx/$suite".*.xz
            mv "$tmp/Packages.xz" "$idx/$suite.$hash.xz" || { rm -rf "$tmp"; return 1; }
        fi
        # (awk reads to the end: no SIGPIPE for xzcat under pipefail)
        lines=$(xzcat "$idx/$suite.$hash.xz" | awk -v p="Package: $pkg" -v m="$mirror" '
            function out() { if (f && v != "") print v, m "/" u, h; f = 0 }
            $0 == p { f = 1; v = u = h = ""; next }
            /^$/ { out() }
            f && /^Version: / { v = $2 }
            f && /^Filename: / { u = $2 }
            f && /^SHA256: / { h = $2 }
            END { out() }') || { rm -rf "$tmp"; return 1; }
        while read -r line; do
            [[ -n $line ]] || continue
            if [[ -z $best ]] || dpkg --compare-versions "${line%% *}" gt "$best"; then
                best=${line%% *}
                found=$line
            fi
        done <<<"$lines"
    done
    rm -rf "$tmp"
    if [[ -z $found ]]; then
        _gd_chroot_err "$pkg is not in $release"
        return 1
    fi
    echo "$found"
}

# The packages for major $1, one a line, sorted.
_gd_chroot_packages() {
    local p
    for p in "${GD_CHROOT_PACKAGES[@]}"; do echo "${p//@M@/$1}"; done | LC_ALL=C sort -u
}

# What the marker of a ready chroot of major $1, postgresql-$1 version $2, says.
_gd_chroot_marker_text() {
    printf 'format %s\nsuite %s\npostgresql-%s %s\npackages %s\n%s %s\n' "$GD_CHROOT_FORMAT" "$GD_CHROOT_SUITE" \
        "$1" "$2" "$(_gd_chroot_packages "$1" | tr '\n' ' ')" "$GD_CHROOT_PG15_SUITE" "${GD_CHROOT_PG15_PACKAGES[*]}"
}

# Remove a chroot (or a failed build of one) at $1, unless something uses it:
# a mount under it (this namespace), or a process whose root is inside it.
_gd_chroot_discard() {
    local dir=$1 p r
    [[ -n $dir && $dir == /*/* && -d $dir ]] || return 0
    dir=$(realpath -e -- "$dir") || return 1
    if awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
        _gd_chroot_err "not removing $dir: something is mounted under it"
        return 1
    fi
    for p in /proc/[0-9]*; do
        r=$(readlink "$p/root" 2>/dev/null) || continue
        if [[ $r == "$dir" || $r == "$dir"/* ]]; then
            _gd_chroot_err "not removing $dir: in use (process ${p#/proc/})"
            return 1
        fi
    done
    rm -rf --one-file-system -- "$dir"
}

# The stub that stands in for the LLVM dependencies of
# postgresql-server-dev-$2 (see the header), built and installed in the
# chroot at $1.
_gd_chroot_llvm_stub() {
    local root=$1 major=$2 deps provides
    deps=$(gd_in_chroot "$root" apt-cache show --no-all-versions "postgresql-server-dev-$major") || return 1
    provides=$(printf '%s\n' "$deps" | sed -n 's/^Depends: //p' | tr ',' '\n' | sed 's/^ *//; s/ .*//' |
        grep -E '^(clang|llvm)-[0-9]+(-dev)?$' | paste -sd, - | sed 's/,/, /g') || true
    if [[ -z $provides ]]; then
        _gd_chroot_log "postgresql-server-dev-$major depends on no clang/llvm package: no stub"
        return 0
    fi
    _gd_chroot_log "stub for postgresql-server-dev-$major's $provides (PGXS with with_llvm=no needs neither)"
    rm -rf "$root/tmp/gd-no-llvm" && mkdir -p "$root/tmp/gd-no-llvm/DEBIAN" || return 1
    cat >"$root/tmp/gd-no-llvm/DEBIAN/control" <<EOF || return 1
Package: gen-durable-no-llvm
Version: 1
Architecture: all
Maintainer: gen_durable test scripts <root@localhost>
Provides: $provides
Section: devel
Priority: optional
Description: stands in for $provides in gen_durable's test chroot
 postgresql-server-dev-$major depends on them for the JIT's LLVM bitcode,
 which PGXS builds with with_llvm=no never make.
EOF
    gd_in_chroot "$root" dpkg-deb --root-owner-group --build /tmp/gd-no-llvm /tmp/gen-durable-no-llvm.deb >&2 &&
        gd_in_chroot "$root" dpkg -i /tmp/gen-durable-no-llvm.deb >&2 &&
        rm -rf "$root/tmp/gd-no-llvm" "$root/tmp/gen-durable-no-llvm.deb"
}

# Bookworm's PostgreSQL 15 (see the header) into the chroot at $1, the
# indices cached under $2; the details go to $3.
_gd_chroot_pg15() {
    local root=$1 cache=$2 log=$3 debs p candidate version url sha f lib=$GD_CHROOT_PG15/usr/lib/postgresql/15/lib
    local helper=(/usr/lib/apt/apt-helper -o APT::Sandbox::User=root download-file)
    _gd_chroot_log "$GD_CHROOT_PG15_SUITE's PostgreSQL 15 for the upgrade test, unpacked into $GD_CHROOT_PG15"
    debs=$(mktemp -d "$root/tmp/gd-$GD_CHROOT_PG15_SUITE.XXXXXX") || return 1
    for p in "${GD_CHROOT_PG15_PACKAGES[@]}"; do
        candidate=$(_gd_chroot_candidate "$cache" "$GD_CHROOT_PG15_SUITE" "$p") || return 1
        read -r version url sha <<<"$candidate"
        echo "$p $version: $url" >>"$log"
        if ! "${helper[@]}" "$url" "$debs/$p.deb" "SHA256:$sha" >>"$log" 2>&1 ||
            ! dpkg-deb -x "$debs/$p.deb" "$root$GD_CHROOT_PG15" >>"$log" 2>&1; then
            _gd_chroot_err "cannot fetch or unpack $p $version ($url)"
            return 1
        fi
    done
    rm -rf "$debs"
    for f in "$root$GD_CHROOT_PG15"/usr/lib/*-linux-gnu/lib*.so.*; do
        ln -sr "$f" "$root$lib/" || return 1
    done
    # shellcheck disable=SC2016 # expanded by that bash
    if ! gd_in_chroot "$root" /bin/bash -c '
        export LD_LIBRARY_PATH=$1
        for f in "${1%/lib}"/bin/* "$1"/*.so*; do ldd "$f" 2>/dev/null | sed -n "s|^[[:space:]]*\(.* not found\)|$f: \1|p"; done
        for f in /usr/lib/postgresql/*/bin/* /usr/lib/postgresql/*/lib/*.so; do
            ldd "$f" 2>/dev/null | grep -F "$2" | sed "s|^[[:space:]]*|$f, trixie'"'"'s, loads |"
        done
        ' gd_ldd "$lib" "$GD_CHROOT_PG15" >"$root/tmp/gd-ldd.out" 2>&1 || [[ -s $root/tmp/gd-ldd.out ]]; then
        _gd_chroot_err "PostgreSQL 15's libraries in the chroot:"
        cat "$root/tmp/gd-ldd.out" >&2
        return 1
    fi
    rm -f "$root/tmp/gd-ldd.out"
}

# Build a chroot of major $2 in the empty directory $1; the installed
# postgresql-$2 version is in $1/$GD_CHROOT_MARKER.tmp when it succeeds.
# All output goes to $3.
_gd_chroot_build() {
    local root=$1 major=$2 log=$3 pkgs uid gid
    # (the host's CA bundle is not lent while ca-certificates makes the chroot's)
    local GD_CHROOT_BINDS="" _GD_CHROOT_HOST_FILES=/etc/resolv.conf
    local -x DEBIAN_FRONTEND=noninteractive DEBCONF_NONINTERACTIVE_SEEN=true
    mapfile -t pkgs < <(gd_not_installed debootstrap)
    gd_apt_install pg_chroot "${pkgs[@]}" || return 1
    _gd_chroot_log "debootstrap --variant=minbase $GD_CHROOT_SUITE (log: $log)"
    # (in a mount namespace of its own: the /proc and /sys it mounts in the
    # target go with it, even when it is killed)
    if ! setpriv --pdeathsig TERM -- unshare --mount --propagation private -- \
        debootstrap --variant=minbase --components=main --keyring="$GD_CHROOT_KEYRING" \
        "$GD_CHROOT_SUITE" "$root" "$GD_CHROOT_MIRROR" >>"$log" 2>&1; then
        _gd_chroot_err "debootstrap failed"
        return 1
    fi
    # apt's sources, the chroot's own; no recommends; no service started.
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF || return 1
Types: deb
URIs: $GD_CHROOT_MIRROR
Suites: $GD_CHROOT_SUITE $GD_CHROOT_SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $GD_CHROOT_SECURITY_MIRROR
Suites: $GD_CHROOT_SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    printf '%s\n' 'APT::Install-Recommends "false";' 'APT::Install-Suggests "false";' 'Acquire::Languages "none";' \
        >"$root/etc/apt/apt.conf.d/99gen-durable" || return 1
    printf '#!/bin/sh\n# gen_durable test chroot: no service starts here\nexit 101\n' >"$root/usr/sbin/policy-rc.d" &&
        chmod 755 "$root/usr/sbin/policy-rc.d" || return 1
    printf 'LANG=C.UTF-8\n' >"$root/etc/default/locale" || return 1
    if ! grep -qE '^127\.0\.0\.1[[:space:]].*localhost' "$root/etc/hosts" 2>/dev/null; then
        printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >>"$root/etc/hosts" || return 1
    fi
    # The postgres user with the host's uid/gid, when free inside.
    if uid=$(id -u postgres 2>/dev/null) && gid=$(id -g postgres 2>/dev/null) &&
        ! gd_in_chroot "$root" getent passwd "$uid" >/dev/null && ! gd_in_chroot "$root" getent group "$gid" >/dev/null; then
        gd_in_chroot "$root" groupadd --system --gid "$gid" postgres >>"$log" 2>&1 &&
            gd_in_chroot "$root" useradd --system --uid "$uid" --gid "$gid" --home-dir /var/lib/postgresql --no-create-home \
                --shell /bin/bash --comment 'PostgreSQL administrator' postgres >>"$log" 2>&1 || return 1
    fi
    _gd_chroot_log "apt-get install inside: postgresql-common, then $(_gd_chroot_packages "$major" | wc -l) packages"
    if ! gd_in_chroot "$root" apt-get update >>"$log" 2>&1 ||
        ! gd_in_chroot "$root" apt-get install -y --no-install-recommends postgresql-common >>"$log" 2>&1; then
        _gd_chroot_err "apt-get (postgresql-common) failed inside"
        return 1
    fi
    # No cluster "main" made by postgresql-MAJOR's postinst.
    if grep -qE '^[#[:space:]]*create_main_cluster' "$root/etc/postgresql-common/createcluster.conf"; then
        sed -i -E 's/^[#[:space:]]*create_main_cluster.*/create_main_cluster = false/' "$root/etc/postgresql-common/createcluster.conf"
    else
        echo 'create_main_cluster = false' >>"$root/etc/postgresql-common/createcluster.conf"
    fi || return 1
    _gd_chroot_llvm_stub "$root" "$major" >>"$log" 2>&1 || { _gd_chroot_err "the LLVM stub failed"; return 1; }
    mapfile -t pkgs < <(_gd_chroot_packages "$major")
    if ! gd_in_chroot "$root" apt-get install -y --no-install-recommends "${pkgs[@]}" >>"$log" 2>&1; then
        _gd_chroot_err "apt-get install failed inside"
        return 1
    fi
    gd_in_chroot "$root" apt-get clean >>"$log" 2>&1 || return 1
    if ! gd_in_chroot "$root" apt-get check >>"$log" 2>&1; then
        _gd_chroot_err "apt-get check fails inside"
        return 1
    fi
    if [[ ! -x $root/usr/lib/postgresql/$major/bin/pg_config || ! -x $root/usr/lib/postgresql/$major/bin/postgres ]]; then
        _gd_chroot_err "no PostgreSQL $major (pg_config, postgres) in the chroot"
        return 1
    fi
    # shellcheck disable=SC2016 # dpkg-query's format
    gd_in_chroot "$root" dpkg-query -W -f='${Version}' "postgresql-$major" >"$root/$GD_CHROOT_MARKER.tmp" || return 1
}

# root=$(gd_pg_chroot_provide MAJOR): see the header.  Runs in a subshell
# (its lock and cleanup trap are its own); checks every step itself, as
# check.sh calls it in an `if` (where set -e is off).
gd_pg_chroot_provide() (
    local major=${1:-} cache version dir tmp log installed old d lockfd
    if [[ ! $major =~ ^[0-9]+$ ]]; then
        _gd_chroot_err "usage: gd_pg_chroot_provide MAJOR"
        return 2
    fi
    if [[ $EUID -ne 0 ]]; then
        _gd_chroot_err "making or checking the chroot needs root"
        return 1
    fi
    cache=${GD_CACHE:-/var/cache/gen_durable}
    mkdir -p "$cache" || return 1
    cache=$(realpath -e -- "$cache") || return 1
    # One provider of the major at a time (a second waits for the first's chroot).
    exec {lockfd}>"$cache/.lock.debian-$GD_CHROOT_SUITE-postgresql-$major" || return 1
    if ! flock -w 3600 "$lockfd"; then
        _gd_chroot_err "timed out waiting for $cache/.lock.debian-$GD_CHROOT_SUITE-postgresql-$major"
        return 1
    fi

    if ! version=$(_gd_chroot_candidate "$cache" "$GD_CHROOT_SUITE" "postgresql-$major"); then
        while IFS= read -r d; do
            if [[ -f $d/$GD_CHROOT_MARKER ]]; then
                _gd_chroot_err "warning: cannot tell which postgresql-$major $GD_CHROOT_SUITE serves; using $d"
                echo "$d"
                return 0
            fi
        done < <(printf '%s\n' "$cache/debian-$GD_CHROOT_SUITE-postgresql-$major".* | sort -rV)
        _gd_chroot_err "cannot tell which postgresql-$major $GD_CHROOT_SUITE serves, and no chroot of it is ready"
        return 1
    fi
    version=${version%% *}
    dir=$cache/debian-$GD_CHROOT_SUITE-postgresql-$version
    if [[ -z ${GD_CHROOT_REFRESH:-} && -f $dir/$GD_CHROOT_MARKER &&
        "$(cat "$dir/$GD_CHROOT_MARKER")" == "$(_gd_chroot_marker_text "$major" "$version")" ]]; then
        _gd_chroot_log "ready: $dir"
        echo "$dir"
        return 0
    fi

    _gd_chroot_log "making a $GD_CHROOT_SUITE chroot with postgresql-$major $version (a few minutes)"
    tmp=$(mktemp -d "$cache/.build.debian-$GD_CHROOT_SUITE-postgresql-$major.XXXXXX") || return 1
    log=$tmp.log
    # shellcheck disable=SC2064 # expanded now: the paths are fixed
    trap "_gd_chroot_discard '$tmp' || true" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM HUP
    chmod 755 "$tmp" || return 1
    if ! _gd_chroot_build "$tmp" "$major" "$log" || ! _gd_chroot_pg15 "$tmp" "$cache" "$log"; then
        _gd_chroot_err "making the chroot failed; the end of its log ($log):"
        tail -n 40 "$log" >&2
        return 1
    fi
    installed=$(cat "$tmp/$GD_CHROOT_MARKER.tmp") && rm -f "$tmp/$GD_CHROOT_MARKER.tmp" || return 1
    if [[ $installed != "$version" ]]; then
        _gd_chroot_err "warning: apt installed postgresql-$major $installed, the index said $version"
        dir=$cache/debian-$GD_CHROOT_SUITE-postgresql-$installed
    fi
    # The marker last, then the rename: a chroot with a marker is complete.
    _gd_chroot_marker_text "$major" "$installed" >"$tmp/$GD_CHROOT_MARKER" || return 1
    if [[ -e $dir ]]; then
        old=$(mktemp -d "$cache/.old.debian-$GD_CHROOT_SUITE-postgresql-$major.XXXXXX") || return 1
        mv -T "$dir" "$old/chroot" || return 1
        _gd_chroot_discard "$old" || _gd_chroot_err "warning: left $old behind"
    fi
    mv -T "$tmp" "$dir" || return 1
    trap - EXIT
    rm -f "$log"
    # Older chroots of the major (and leftovers of interrupted builds), when unused.
    # (a build under way holds the lock: none can be, as we hold it)
    for d in "$cache/debian-$GD_CHROOT_SUITE-postgresql-$major".* "$cache/.build.debian-$GD_CHROOT_SUITE-postgresql-$major".* \
        "$cache/.old.debian-$GD_CHROOT_SUITE-postgresql-$major".*; do
        [[ -e $d && $d != "$dir" ]] || continue
        if [[ $d == *.log ]]; then
            [[ -e ${d%.log} ]] || rm -f "$d"
            continue
        fi
        _gd_chroot_log "removing $d"
        _gd_chroot_discard "$d" || _gd_chroot_err "warning: left $d behind"
    done
    _gd_chroot_log "ready: $dir ($(du -sh "$dir" 2>/dev/null | cut -f1))"
    echo "$dir"
)

# The script that gd_in_chroot runs in its private mount namespace:
#   bash -c SCRIPT gd_in_chroot ROOT CWD NFILES HOSTFILE... NBINDS BIND... CMD ARGS...
# shellcheck disable=SC2016 # expanded by that bash
_GD_CHROOT_INNER='
set -euo pipefail
root=$1 cwd=$2 n=$3
shift 3
files=("${@:1:n}")
shift "$n"
n=$1
shift
binds=("${@:1:n}")
shift "$n"
mount -t proc proc "$root/proc" 2>/dev/null || mount --rbind /proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
# /dev/shm: a tmpfs of its own, alone on its mount point (the host may
# stack several there: chromium'"'"'s launcher reads one findmnt line)
while mountpoint -q "$root/dev/shm"; do umount -l "$root/dev/shm" || break; done
mkdir -p "$root/dev/shm"
mount -t tmpfs -o nosuid,nodev,mode=1777 shm "$root/dev/shm"
# The host'"'"'s resolver and CA bundle (a TLS-intercepting proxy'"'"'s CA that
# the host trusts for npm'"'"'s registry is trusted inside as well).
for f in "${files[@]}"; do
    [[ -f $f && -d $root${f%/*} ]] || continue
    t=$root$f
    [[ ! -L $t ]] || rm -f "$t"
    [[ -e $t ]] || : >"$t"
    mount --bind "$f" "$t"
    mount -o remount,bind,ro "$t" 2>/dev/null || true
done
for b in "${binds[@]}"; do
    # the path as the chroot resolves it (its own symlinks, e.g. /var/run)
    t=$root$(chroot "$root" /usr/bin/realpath -m -- "$b")
    if [[ -d $b ]]; then
        mkdir -p "$t"
    else
        mkdir -p "$(dirname "$t")"
        [[ -e $t ]] || : >"$t"
    fi
    mount --rbind "$b" "$t"
done
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
for v in $(compgen -e); do
    if [[ $v == LANG || $v == LC_* ]]; then
        case ${!v} in "" | C | POSIX | C.UTF-8 | C.utf8) ;; *) export "$v=C.UTF-8" ;; esac
    fi
done
exec chroot "$root" /bin/sh -c '\''cd "$1" 2>/dev/null || cd /; shift; exec "$@"'\'' gd_in_chroot "$cwd" "$@"
'

# gd_in_chroot ROOT CMD [ARGS...]: see the header.
gd_in_chroot() {
    if (($# < 2)); then
        _gd_chroot_err "usage: gd_in_chroot ROOT CMD [ARGS...]"
        return 2
    fi
    local root binds=() files=() b
    root=$(realpath -e -- "$1") || return 2
    shift
    if [[ $root == / || ! -f $root/etc/debian_version || ! -x $root/bin/sh || ! -x $root/usr/bin/realpath ]]; then
        _gd_chroot_err "$root is not a chroot of pg_chroot.sh"
        return 2
    fi
    if [[ $EUID -ne 0 ]]; then
        _gd_chroot_err "gd_in_chroot needs root"
        return 2
    fi
    read -r -a binds <<<"${GD_CHROOT_BINDS:-}" || true
    for b in "${binds[@]}"; do
        if [[ $b != /* || ! -e $b ]]; then
            _gd_chroot_err "GD_CHROOT_BINDS: $b is not an absolute path that exists"
            return 2
        fi
    done
    read -r -a files <<<"${_GD_CHROOT_HOST_FILES:-/etc/resolv.conf /etc/ssl/certs/ca-certificates.crt}" || true
    # (setpriv: the command gets SIGTERM if the calling shell dies first)
    setpriv --pdeathsig TERM -- unshare --mount --propagation private -- /bin/bash -c "$_GD_CHROOT_INNER" gd_in_chroot \
        "$root" "$PWD" "${#files[@]}" "${files[@]}" "${#binds[@]}" "${binds[@]}" "$@"
}
