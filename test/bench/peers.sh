# shellcheck shell=bash
# The peers of `make bench`, sourced by test/bench/run.sh after
# test/scripts/bootstrap.sh:
#
#   bench_peers_install   PgQ from Debian (postgresql-15-pgq3), Node.js when there
#                         is none (Debian's), and graphile-worker, pg-boss, DBOS Transact and pg
#                         from npm, pinned by test/bench/node/package-lock.json,
#                         into $BENCH_NODE_CACHE (default /var/cache/gd-bench; npm
#                         runs again only when the lock file changed); exports
#                         BENCH_NODE_MODULES and the versions for the report
#   bench_peers_schema    load test/bench/peers.sql into the bench database
#                         (after the cluster is up and setup.sql ran)

bench_peers_install() {
    local missing=()
    [[ "$(dpkg-query -W -f='${Status}' postgresql-15-pgq3 2>/dev/null)" == "install ok installed" ]] ||
        missing+=(postgresql-15-pgq3)
    command -v node >/dev/null 2>&1 || missing+=(nodejs)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
    if [[ ${#missing[@]} -gt 0 ]]; then
        if [[ $EUID -ne 0 ]]; then
            echo "bench: missing ${missing[*]} and not root: install them first" >&2
            return 1
        fi
        gd_log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi

    local cache=${BENCH_NODE_CACHE:-/var/cache/gd-bench}
    mkdir -p "$cache" 2>/dev/null || cache=${TMPDIR:-/tmp}/gd-bench-node
    mkdir -p "$cache"
    if [[ ! -d $cache/node_modules/graphile-worker || ! -d $cache/node_modules/pg-boss ]] ||
        ! cmp -s "$BENCH_DIR/node/package-lock.json" "$cache/package-lock.json"; then
        gd_log "installing graphile-worker, pg-boss, DBOS Transact and pg from npm into $cache"
        cp "$BENCH_DIR/node/package.json" "$BENCH_DIR/node/package-lock.json" "$cache/"
        (cd "$cache" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
        cp "$BENCH_DIR/node/package-lock.json" "$cache/package-lock.json" # npm may rewrite it
    fi
    export BENCH_NODE_MODULES=$cache/node_modules
    export BENCH_NODE_VERSION BENCH_PGBOSS_VERSION BENCH_GRAPHILE_VERSION BENCH_PGQ_VERSION BENCH_DBOS_VERSION
    BENCH_NODE_VERSION=$(node --version)
    BENCH_PGBOSS_VERSION=$(node -p "require('$cache/node_modules/pg-boss/package.json').version")
    BENCH_GRAPHILE_VERSION=$(node -p "require('$cache/node_modules/graphile-worker/package.json').version")
    BENCH_DBOS_VERSION=$(node -p "require('$cache/node_modules/@dbos-inc/dbos-sdk/package.json').version")
    BENCH_PGQ_VERSION=$(dpkg-query -W -f='${Version}' postgresql-15-pgq3)
    gd_log "peers: pg-boss $BENCH_PGBOSS_VERSION, graphile-worker $BENCH_GRAPHILE_VERSION, DBOS Transact $BENCH_DBOS_VERSION, PgQ $BENCH_PGQ_VERSION, Node.js $BENCH_NODE_VERSION"
}

bench_peers_schema() {
    cp "$BENCH_DIR/peers.sql" "$DIR/peers.sql"
    [[ $EUID -ne 0 ]] || chown postgres: "$DIR/peers.sql"
    bench_psql -f "$DIR/peers.sql" >/dev/null
}
