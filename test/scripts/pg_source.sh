# shellcheck shell=bash
# PostgreSQL majors that bookworm does not package (#32), built from the
# source package of Debian's unstable suite (sid) with bookworm's toolchain,
# and cached for later runs.  Sourced (by bootstrap.sh); defines
#
#   gd_pg_source_provide MAJOR
#
# which makes sure that PostgreSQL MAJOR, from sid's current postgresql-MAJOR
# source package, is installed under
#   ${GD_CACHE:-/var/cache/gen_durable}/postgresql-<source version>-<codename>
# (e.g. /var/cache/gen_durable/postgresql-18.6-3-bookworm) and prints that
# prefix on stdout; its log lines go to stderr.  The prefix holds:
#   bin/ (pg_config, initdb, pg_ctl, postgres, psql, ...), all of contrib
#   (test_decoding, pg_stat_statements, pgstattuple, ...), PL/Proxy (from
#   the postgresql-plproxy source package of sid, or of trixie or bookworm
#   when the mirror lacks sid's tarball), and the test harness where PGXS
#   looks for it: lib/pgxs/src/test/regress/pg_regress,
#   lib/pgxs/src/test/isolation/pg_isolation_regress and
#   lib/pgxs/src/test/perl/PostgreSQL/Test/*.pm (configured with
#   --enable-tap-tests).
# Its file .gd-complete (the versions it was built from) is written last and
# the prefix appears by a rename: a prefix that exists is complete.
#
# Time on this project's machine (2 cores), measured with 18.6-3:
#   fresh (an empty cache, the build deps already installed): 3.5 to 5.5 min
#     (216 s on a quiet machine, 280-330 s beside a running test suite;
#     PostgreSQL + contrib is nearly all of it, PL/Proxy a few seconds); the
#     first run on a new machine adds apt-get install of the missing build
#     deps (bison, flex, liblz4-dev, libzstd-dev: ~20 s).  101 MB installed.
#   warm (the prefix is there): about 2 s (1.3 to 2.9 s measured: finding
#     apt's archive, fetching and verifying sid's InRelease and Sources index,
#     12 MB, and unpacking it, to learn the current version)
# When sid moves to a new postgresql-MAJOR upload, the next run builds the
# new version into a new prefix (the old one is left in the cache).
#
# Where the sources come from: sid's InRelease (its signature checked with
# gpgv against debian-archive-keyring: bookworm's keyring holds the archive
# keys that sign sid), then main/source/Sources.xz (its sha256 from the
# InRelease), then the orig tarballs (their sha256 from Sources).  Only curl:
# the system's apt configuration and state are not touched.  Debian's own
# patches (debian.tar.xz) are not applied: upstream's layout and defaults
# (the socket directory is /tmp, not /var/run/postgresql).
#
# Settings (environment):
#   GD_CACHE            the cache directory (default /var/cache/gen_durable)
#   GD_DEBIAN_MIRROR    the Debian archive to fetch from (default: the one
#                       apt is configured with for this machine's codename,
#                       read with `apt-get indextargets`)
#   GD_PG_SOURCE_PLPROXY_SUITES  where PL/Proxy's source may come from, in
#                       order of preference (default "sid trixie bookworm")
#   GD_PG_SOURCE_KEEP_WORK=1     keep the build directory of a failed build
#   GD_PG_SOURCE_OFFLINE=1   do not fetch the index: use the newest complete
#                       prefix of MAJOR for this codename (also the fallback,
#                       with a warning, when the index cannot be fetched)
#
# Needs root only to install missing build dependencies (apt-get) and to
# write the cache; the prefix is made readable by every user (the servers run
# as postgres).  Safe under `set -euo pipefail` and in `if`/`||` contexts:
# every step is checked explicitly, and a failure returns 1 (the build log's
# tail on stderr, the whole log kept in $GD_CACHE/logs/).

# Build dependencies from bookworm, for ./configure with the options below,
# PL/Proxy, and fetching/verifying the sources.
GD_PG_SOURCE_BUILD_DEPS=(
    gcc make bison flex perl pkg-config
    libreadline-dev zlib1g-dev libssl-dev libicu-dev libxml2-dev liblz4-dev libzstd-dev
    libipc-run-perl             # --enable-tap-tests (configure checks for IPC::Run)
    tzdata                      # --with-system-tzdata
    curl ca-certificates xz-utils bzip2 gpgv debian-archive-keyring
)

_gd_pgs_log() { printf '==> pg_source: %s\n' "$*" >&2; }

# The Debian archive's base URL (no trailing slash): GD_DEBIAN_MIRROR, or the
# archive of apt's own source entry for this codename (read only).
_gd_pgs_mirror() {
    local m=${GD_DEBIAN_MIRROR:-} codename
    if [[ -z $m ]]; then
        codename=$(_gd_pgs_codename) || return 1
        # shellcheck disable=SC2016 # $(REPO_URI) is apt's
        m=$(apt-get indextargets --format '$(REPO_URI)' "Release: $codename" "Target-Of: deb" 2>/dev/null | head -n1) || true
    fi
    [[ -n $m ]] || {
        echo "pg_source: apt has no source entry for $codename: set GD_DEBIAN_MIRROR to a Debian archive" >&2
        return 1
    }
    echo "${m%/}"
}

# The host's codename (bookworm).
_gd_pgs_codename() {
    local c=
    # shellcheck disable=SC1091
    [[ -r /etc/os-release ]] && c=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [[ -n $c ]] || c=$(lsb_release -sc 2>/dev/null || true)
    [[ -n $c ]] || { echo "pg_source: cannot tell this machine's distribution codename" >&2; return 1; }
    echo "$c"
}

# Install the missing build dependencies (only those).
_gd_pgs_build_deps() {
    local missing
    mapfile -t missing < <(gd_not_installed "${GD_PG_SOURCE_BUILD_DEPS[@]}")
    gd_apt_install pg_source "${missing[@]}"
}

# Fetch the source index of suite $2 (sid) into $1 (a directory), verified:
# InRelease by gpgv (some signature VALIDSIG by a key of the keyring, none
# BAD; a suite is signed by several keys, and a key the keyring lacks is not
# an error; Valid-Until is not checked), then Sources.xz against InRelease's
# sha256.  Leaves $1/Sources (uncompressed).
_gd_pgs_fetch_index() {
    local dir=$1 suite=$2 mirror
    mirror=$(_gd_pgs_mirror) || return 1
    local keyring=/usr/share/keyrings/debian-archive-keyring.gpg want got
    curl -fsS --retry 3 -o "$dir/InRelease" "$mirror/dists/$suite/InRelease" || return 1
    gpgv --keyring "$keyring" --status-fd 3 --output "$dir/Release" "$dir/InRelease" \
        3>"$dir/gpgv.status" 2>"$dir/gpgv.log" || true
    if ! grep -q '^\[GNUPG:\] VALIDSIG ' "$dir/gpgv.status" ||
        grep -qE '^\[GNUPG:\] (BADSIG|EXPKEYSIG|REVKEYSIG) ' "$dir/gpgv.status"; then
        echo "pg_source: $suite's InRelease is not validly signed by a key of $keyring:" >&2
        cat "$dir/gpgv.log" >&2
        return 1
    fi
    # The SHA256 section of Release: " <sum> <size> main/source/Sources.xz"
    want=$(awk '/^SHA256:/{s=1; next} /^[^ ]/{s=0} s && $3 == "main/source/Sources.xz" {print $1}' "$dir/Release")
    [[ -n $want ]] || { echo "pg_source: $suite's Release lists no main/source/Sources.xz" >&2; return 1; }
    curl -fsS --retry 3 -o "$dir/Sources.xz" "$mirror/dists/$suite/main/source/Sources.xz" || return 1
    got=$(sha256sum "$dir/Sources.xz" | cut -d' ' -f1)
    if [[ $got != "$want" ]]; then
        echo "pg_source: $suite's Sources.xz's sha256 is $got, its Release says $want" >&2
        return 1
    fi
    xz -dc "$dir/Sources.xz" >"$dir/Sources" || return 1
}

# The stanza of source package $2 in the Sources file $1, its highest version
# when there are several.
_gd_pgs_stanza() {
    local sources=$1 pkg=$2 v best=''
    while read -r v; do
        if [[ -z $best ]] || dpkg --compare-versions "$v" gt "$best"; then best=$v; fi
    done < <(awk -v p="$pkg" '/^Package: /{inp = ($2 == p)} inp && /^Version: /{print $2}' "$sources")
    [[ -n $best ]] || { echo "pg_source: no source package $pkg in $sources" >&2; return 1; }
    awk -v p="$pkg" -v v="$best" '
        /^$/ { if (inp && inv) { printf "%s", buf; exit } buf = ""; inp = inv = 0; next }
        { buf = buf $0 "\n" }
        /^Package: / { inp = ($2 == p) }
        /^Version: / { inv = ($2 == v) }
        END { if (inp && inv) printf "%s", buf }' "$sources"
}

# Field $2 of the stanza $1.
_gd_pgs_field() { awk -v f="$2:" '$1 == f {print $2; exit}' <<<"$1"; }

# Download the orig tarball of the stanza $1 into the directory $2 (kept
# there across runs), checked against the stanza's sha256; prints its path.
_gd_pgs_orig() {
    local stanza=$1 dir=$2 mirror pooldir line sum name
    mirror=$(_gd_pgs_mirror) || return 1
    pooldir=$(_gd_pgs_field "$stanza" Directory)
    line=$(awk '/^Checksums-Sha256:/{s=1; next} /^[^ ]/{s=0} s && $3 ~ /\.orig\.tar\./ {print $1, $3; exit}' <<<"$stanza")
    sum=${line%% *} name=${line#* }
    [[ -n $pooldir && -n $sum && -n $name && $name != "$sum" ]] || {
        echo "pg_source: no orig tarball in the Sources stanza:" >&2
        printf '%s' "$stanza" >&2
        return 1
    }
    if [[ ! -f $dir/$name ]] || [[ $(sha256sum "$dir/$name" | cut -d' ' -f1) != "$sum" ]]; then
        _gd_pgs_log "downloading $name"
        if ! curl -fsS --retry 3 -o "$dir/$name.part" "$mirror/$pooldir/$name"; then
            echo "pg_source: cannot download $mirror/$pooldir/$name" >&2
            rm -f "$dir/$name.part"
            return 1
        fi
        if [[ $(sha256sum "$dir/$name.part" | cut -d' ' -f1) != "$sum" ]]; then
            echo "pg_source: $name: sha256 mismatch (want $sum)" >&2
            rm -f "$dir/$name.part"
            return 1
        fi
        mv -f "$dir/$name.part" "$dir/$name" || return 1
    fi
    echo "$dir/$name"
}

# PL/Proxy's source: the postgresql-plproxy source package of the first suite
# of GD_PG_SOURCE_PLPROXY_SUITES (default: sid trixie bookworm) whose orig
# tarball the mirror serves (a mirror may lack some pool files; the newest
# that supports the major is wanted, and an older one may not build against
# it: then the build fails and says so).  $1: a directory holding sid's
# verified Sources; $2: where tarballs are kept.  Prints "<version> <suite>
# <tarball>".
_gd_pgs_plproxy_orig() {
    local sid_dir=$1 dir=$2 suite idx stanza ver tar
    for suite in ${GD_PG_SOURCE_PLPROXY_SUITES:-sid trixie bookworm}; do
        if [[ $suite == sid ]]; then
            idx=$sid_dir
        else
            idx=$(mktemp -d "${TMPDIR:-/tmp}/gd_pg_index.XXXXXX") || return 1
            _gd_pgs_fetch_index "$idx" "$suite" || { rm -rf "$idx"; continue; }
        fi
        if stanza=$(_gd_pgs_stanza "$idx/Sources" postgresql-plproxy) &&
            ver=$(_gd_pgs_field "$stanza" Version) &&
            tar=$(_gd_pgs_orig "$stanza" "$dir"); then
            [[ $idx == "$sid_dir" ]] || rm -rf "$idx"
            echo "$ver $suite $tar"
            return 0
        fi
        [[ $idx == "$sid_dir" ]] || rm -rf "$idx"
        _gd_pgs_log "no PL/Proxy source from $suite; trying the next suite"
    done
    echo "pg_source: no postgresql-plproxy orig tarball could be had from: ${GD_PG_SOURCE_PLPROXY_SUITES:-sid trixie bookworm}" >&2
    return 1
}

# Run a build step ("$@") with its output appended to the log $_gd_pgs_logf;
# on failure, the log's tail on stderr.
_gd_pgs_step() {
    printf '\n### %s\n' "$*" >>"$_gd_pgs_logf"
    if ! "$@" >>"$_gd_pgs_logf" 2>&1; then
        echo "pg_source: FAILED: $*  (log: $_gd_pgs_logf); its tail:" >&2
        tail -n 60 "$_gd_pgs_logf" >&2
        return 1
    fi
}

# Build PostgreSQL (tarball $1) and PL/Proxy (tarball $2) in the work
# directory $3, configured for the final prefix $4 and installed under
# DESTDIR=$3/stage (so the tree to rename is $3/stage$4); the marker's
# content is $5.
_gd_pgs_build() {
    local pg_tar=$1 plp_tar=$2 work=$3 prefix=$4 marker=$5
    local stage=$3/stage src plp mk
    # Called from make (check.sh under `make check`): not the outer make's jobserver.
    mk=(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make)
    mkdir -p "$work/src" "$stage" || return 1
    _gd_pgs_log "unpacking $(basename "$pg_tar")"
    tar -xf "$pg_tar" -C "$work/src" || return 1
    src=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d -name 'postgresql-*' | head -n1) || true
    [[ -n $src && -x $src/configure ]] || { echo "pg_source: no configure in $pg_tar" >&2; return 1; }
    _gd_pgs_log "configuring (--prefix=$prefix)"
    # Debian's options that matter here (no LLVM, no PL languages, no NLS).
    (cd "$src" && _gd_pgs_step ./configure --prefix="$prefix" \
        --enable-tap-tests --enable-debug \
        --with-openssl --with-icu --with-lz4 --with-zstd --with-libxml \
        --with-system-tzdata=/usr/share/zoneinfo) || return 1
    _gd_pgs_log "building PostgreSQL and contrib (make -j2 world-bin; several minutes)"
    _gd_pgs_step "${mk[@]}" -C "$src" -j2 world-bin || return 1
    _gd_pgs_log "installing into the staging directory"
    _gd_pgs_step "${mk[@]}" -C "$src" DESTDIR="$stage" install-world-bin || return 1
    # The test harness: in 18, install-world-bin (like a plain `make install`)
    # already installs pg_regress, pg_isolation_regress and isolationtester
    # (src/Makefile's SUBDIRS has test/regress and test/isolation) and, with
    # --enable-tap-tests, the PostgreSQL::Test modules (test/perl), all under
    # lib/pgxs/src/test/.  Checked here, with the contrib modules the tests use.
    local f pgxs=$stage$prefix/lib/pgxs
    for f in "$pgxs/src/test/regress/pg_regress" "$pgxs/src/test/isolation/pg_isolation_regress" \
        "$pgxs/src/test/isolation/isolationtester" "$pgxs/src/test/perl/PostgreSQL/Test/Cluster.pm" \
        "$pgxs/src/test/perl/PostgreSQL/Test/Utils.pm" "$stage$prefix/lib/test_decoding.so" \
        "$stage$prefix/lib/pg_stat_statements.so" "$stage$prefix/lib/pgstattuple.so"; do
        [[ -e $f ]] || { echo "pg_source: not installed: ${f#"$stage"}" >&2; return 1; }
    done

    # PL/Proxy, with PGXS against the staged installation: its pg_config
    # tells the staged paths (PostgreSQL is relocatable), so the module lands
    # in the stage; its run path (libpq) must be the final prefix's lib.
    _gd_pgs_log "building PL/Proxy ($(basename "$plp_tar"))"
    mkdir -p "$work/plproxy" || return 1
    tar -xf "$plp_tar" -C "$work/plproxy" || return 1
    plp=$(find "$work/plproxy" -mindepth 1 -maxdepth 1 -type d | head -n1) || true
    [[ -n $plp && -f $plp/Makefile ]] || { echo "pg_source: no Makefile in $plp_tar" >&2; return 1; }
    local plmk=("${mk[@]}" -C "$plp" PG_CONFIG="$stage$prefix/bin/pg_config" rpathdir="$prefix/lib")
    _gd_pgs_step "${plmk[@]}" -j2 || return 1
    _gd_pgs_step "${plmk[@]}" install || return 1
    [[ -e $stage$prefix/lib/plproxy.so && -e $stage$prefix/share/extension/plproxy.control ]] || {
        echo "pg_source: PL/Proxy did not install into the stage" >&2
        return 1
    }

    # Readable and traversable by every user (the servers run as postgres).
    chmod -R u+rwX,go+rX,go-w "$stage$prefix" || return 1
    printf '%s' "$marker" >"$stage$prefix/.gd-complete" || return 1
    chmod 644 "$stage$prefix/.gd-complete" || return 1
}

# The newest complete prefix of PostgreSQL $1 for codename $2 in $3, if any.
_gd_pgs_newest_prefix() {
    local major=$1 codename=$2 cache=$3 d v best='' bestv=''
    for d in "$cache"/postgresql-"$major".*-"$codename"; do
        [[ -f $d/.gd-complete ]] || continue
        v=${d##*/postgresql-}
        v=${v%-"$codename"}
        if [[ -z $best ]] || dpkg --compare-versions "$v" gt "$bestv"; then best=$d bestv=$v; fi
    done
    [[ -n $best ]] && echo "$best"
}

gd_pg_source_provide() {
    local major=${1:-}
    [[ $major =~ ^[0-9]+$ ]] || { echo "usage: gd_pg_source_provide MAJOR (e.g. 18)" >&2; return 2; }
    local cache=${GD_CACHE:-/var/cache/gen_durable} codename idx prefix name
    local pg_stanza pg_ver plp_ver plp_suite pg_tar plp_tar work marker rc=0
    codename=$(_gd_pgs_codename) || return 1
    mkdir -p "$cache/sources" "$cache/logs" || return 1
    chmod 755 "$cache" || return 1

    if [[ ${GD_PG_SOURCE_OFFLINE:-} == 1 ]]; then
        prefix=$(_gd_pgs_newest_prefix "$major" "$codename" "$cache") || {
            echo "pg_source: GD_PG_SOURCE_OFFLINE=1 and no complete PostgreSQL $major in $cache" >&2
            return 1
        }
        _gd_pgs_log "offline: using $prefix"
        echo "$prefix"
        return 0
    fi

    # Which version is sid's now (the index, fetched and verified each run),
    # from the archive found once here (apt-get indextargets takes 0.5 s).
    local mirror GD_DEBIAN_MIRROR=${GD_DEBIAN_MIRROR:-}
    mirror=$(_gd_pgs_mirror) || mirror=''
    GD_DEBIAN_MIRROR=$mirror
    idx=$(mktemp -d "${TMPDIR:-/tmp}/gd_pg_index.XXXXXX") || return 1
    if [[ -z $mirror ]] || ! _gd_pgs_fetch_index "$idx" sid; then
        rm -rf "$idx"
        if prefix=$(_gd_pgs_newest_prefix "$major" "$codename" "$cache"); then
            _gd_pgs_log "WARNING: cannot fetch sid's source index; using the cached $prefix"
            echo "$prefix"
            return 0
        fi
        echo "pg_source: cannot fetch sid's source index, and nothing cached for PostgreSQL $major" >&2
        return 1
    fi
    if ! pg_stanza=$(_gd_pgs_stanza "$idx/Sources" "postgresql-$major"); then
        rm -rf "$idx"
        return 1
    fi
    pg_ver=$(_gd_pgs_field "$pg_stanza" Version)
    name=postgresql-$pg_ver-$codename
    prefix=$cache/$name
    if [[ -f $prefix/.gd-complete ]]; then
        rm -rf "$idx"
        _gd_pgs_log "PostgreSQL $major ($pg_ver, sid) already built: $prefix"
        echo "$prefix"
        return 0
    fi

    # Build it, one builder at a time (another run may be building it now).
    local lockfd
    exec {lockfd}>"$cache/.lock-$name" || { rm -rf "$idx"; return 1; }
    _gd_pgs_log "taking the build lock of $name"
    flock "$lockfd" || { exec {lockfd}>&-; rm -rf "$idx"; return 1; }
    if [[ -f $prefix/.gd-complete ]]; then   # built by the other run meanwhile
        exec {lockfd}>&-
        rm -rf "$idx"
        _gd_pgs_log "PostgreSQL $major ($pg_ver) built meanwhile: $prefix"
        echo "$prefix"
        return 0
    fi
    # Leftovers of an interrupted run (under this lock, nobody uses them).
    rm -rf "$cache/.work-$name".* "$prefix" || { exec {lockfd}>&-; rm -rf "$idx"; return 1; }

    local t0=$SECONDS plp
    _gd_pgs_log "building PostgreSQL $major from sid's source package postgresql-$major $pg_ver into $prefix"
    if _gd_pgs_build_deps &&
        pg_tar=$(_gd_pgs_orig "$pg_stanza" "$cache/sources") &&
        plp=$(_gd_pgs_plproxy_orig "$idx" "$cache/sources") &&
        work=$(mktemp -d "$cache/.work-$name.XXXXXX"); then
        read -r plp_ver plp_suite plp_tar <<<"$plp"
        _gd_pgs_log "PL/Proxy: $plp_suite's postgresql-plproxy $plp_ver"
        _gd_pgs_logf=$cache/logs/$name.log
        : >"$_gd_pgs_logf"
        marker=$(printf 'postgresql-%s %s (sid)\npostgresql-plproxy %s (%s)\nbuilt-on %s\nbuilt-at %s\n' \
            "$major" "$pg_ver" "$plp_ver" "$plp_suite" "$codename" "$(date -u +%FT%TZ)")
        if _gd_pgs_build "$pg_tar" "$plp_tar" "$work" "$prefix" "$marker" &&
            mv -T "$work/stage$prefix" "$prefix"; then
            _gd_pgs_log "PostgreSQL $major ($pg_ver) installed in $prefix in $((SECONDS - t0)) s"
            rm -rf "$work"
        else
            rc=1
            if [[ ${GD_PG_SOURCE_KEEP_WORK:-} == 1 ]]; then
                _gd_pgs_log "kept the work directory $work (GD_PG_SOURCE_KEEP_WORK=1)"
            else
                rm -rf "$work"
            fi
        fi
        unset _gd_pgs_logf
    else
        rc=1
    fi
    exec {lockfd}>&-
    rm -rf "$idx"
    ((rc == 0)) || return 1
    echo "$prefix"
}
