#!/usr/bin/env bash
# `make bench`: bootstrap, build + install gen_durable, start ONE throwaway
# PostgreSQL 15 cluster (as the postgres OS user, durability defaults: fsync
# and synchronous_commit on), and measure on it, in this order:
#
#   W1     throughput of single-step in-database instances (BENCH_JOBS, 50000)
#   floor  the same work through a hand-written SKIP LOCKED queue, 2 workers
#   W3     a 3-step FSM (BENCH_FSM_INSTANCES, 10000): steps/s and instances/s
#   W2     gd_insert + gd_await latency, one client (BENCH_LATENCY_SAMPLES, 1000)
#
# It prints figures and a final table, never pass/fail; it is not part of
# `make check`. The work is in test/bench/bench.py (Python 3 + psycopg,
# Debian's python3-psycopg, installed here when missing) and the schema in
# test/bench/setup.sql. BENCH_KEEP=1 keeps the cluster's dir (and log);
# BENCH_JSON=file also writes the figures as JSON.
set -euo pipefail

BENCH_START=$(date +%s)

# shellcheck source=../scripts/bootstrap.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/bootstrap.sh"
BENCH_DIR=$GD_ROOT/test/bench
PY=/usr/bin/python3 # Debian's, where python3-psycopg installs (not a pyenv shim)

gd_bootstrap_deps
if ! "$PY" -c 'import psycopg' 2>/dev/null; then
    if [[ $EUID -ne 0 ]]; then
        echo "bench: $PY has no psycopg and we are not root: apt-get install python3-psycopg" >&2
        exit 1
    fi
    gd_log "installing python3-psycopg"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-psycopg >/dev/null
fi
gd_build_install
# The install is system-wide, shared with any other build on this machine
# (a concurrent `make check`, say): remember what we installed, and say so
# in the report if the server ends up running something else.
PKGLIBDIR=$("$GD_PG_CONFIG" --pkglibdir)
EXTDIR=$("$GD_PG_CONFIG" --sharedir)/extension
BUILT_SUM=$(cat "$GD_ROOT/gen_durable.so" "$GD_ROOT/sql/gen_durable--0.1.sql" | md5sum | cut -c1-32)
installed_sum() { cat "$PKGLIBDIR/gen_durable.so" "$EXTDIR/gen_durable--0.1.sql" | md5sum | cut -c1-32; }

DIR=$(mktemp -d /tmp/gd_bench.XXXXXX)
DATA=$DIR/data
LOG=$DIR/server.log
export GD_PG_HOME=$DIR

cleanup() {
    local rc=$?
    if [[ -f $DATA/postmaster.pid ]]; then
        gd_log "stopping the bench cluster"
        gd_as_pg pg_ctl -D "$DATA" -m fast -w stop >/dev/null 2>&1 ||
            gd_as_pg pg_ctl -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
    fi
    if [[ $rc -ne 0 && -f $LOG ]]; then
        echo "---- bench FAILED; tail of the server log ----" >&2
        tail -n 40 "$LOG" >&2
    fi
    if [[ -n ${BENCH_KEEP:-} ]]; then
        echo "(bench cluster dir kept: $DIR)"
    else
        rm -rf "$DIR"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# initdb refuses root: the cluster belongs to the postgres OS user, and so
# must everything it reads.
chmod 755 "$DIR"
cp "$BENCH_DIR/setup.sql" "$DIR/setup.sql"
chown -R postgres: "$DIR"
cd "$DIR"

PORT=$(gd_free_port 5490)
gd_log "creating a throwaway cluster in $DATA"
gd_as_pg initdb -D "$DATA" -A trust --no-sync --no-locale -E UTF8 >"$DIR/initdb.log" 2>&1 ||
    { cat "$DIR/initdb.log" >&2; exit 1; }

# Create the database before the engine is configured to serve it, so the
# server log has no "database does not exist" noise from early executors.
cat >>"$DATA/postgresql.conf" <<EOF

# ---- gen_durable bench ----
listen_addresses = ''
unix_socket_directories = '$DIR'
port = $PORT
log_line_prefix = '%m [%p] %b '
max_worker_processes = 16
shared_buffers = 256MB
EOF
gd_as_pg pg_ctl -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null
gd_as_pg createdb -h "$DIR" -p "$PORT" bench
gd_as_pg pg_ctl -D "$DATA" -m fast -w stop >/dev/null

# Durability defaults on purpose (fsync, synchronous_commit, full_page_writes):
# the figures must be what a real deployment would see.
cat >>"$DATA/postgresql.conf" <<EOF
shared_preload_libraries = 'gen_durable'
gen_durable.database = 'bench'
gen_durable.queues = 'default:2'
EOF

gd_log "starting PostgreSQL 15 (socket $DIR, port $PORT): gen_durable.queues='default:2', fsync and synchronous_commit on"
LOADED_SUM=$(installed_sum)
gd_as_pg pg_ctl -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null
gd_as_pg psql -X -q -h "$DIR" -p "$PORT" -d bench -v ON_ERROR_STOP=1 -f "$DIR/setup.sql" >/dev/null
[[ $(installed_sum) == "$LOADED_SUM" ]] || LOADED_SUM=changed

BENCH_DATA_FS="$(df -T "$DATA" | awk 'NR==2 {print $2 " (" $1 ")"}')"
if [[ -z ${BENCH_ENGINE_COMMIT:-} ]]; then # preset when benchmarking an exported tree
    BENCH_ENGINE_COMMIT="$(git -C "$GD_ROOT" log -1 --format='%h %s' 2>/dev/null || echo '?')"
    if [[ -n "$(git -C "$GD_ROOT" status --porcelain -- src sql 2>/dev/null)" ]]; then
        BENCH_ENGINE_COMMIT+=" (+ uncommitted changes in src/ or sql/)"
    fi
fi
if [[ $LOADED_SUM != "$BUILT_SUM" ]]; then
    BENCH_ENGINE_COMMIT+=" (WARNING: the installed gen_durable.so or install script was replaced by another build meanwhile: these figures may not be this tree's)"
fi
export BENCH_DATA_FS BENCH_ENGINE_COMMIT

"$PY" "$BENCH_DIR/bench.py" "$DIR" "$PORT"

ERRORS=$(grep -cE ' (ERROR|FATAL|PANIC): ' "$LOG" || true)
if [[ $ERRORS -gt 0 ]]; then
    echo
    echo "server log: $ERRORS ERROR/FATAL/PANIC lines; the first ones:"
    grep -E ' (ERROR|FATAL|PANIC): ' "$LOG" | head -n 5
fi
echo
echo "bench took $(($(date +%s) - BENCH_START)) s in all (bootstrap, build, cluster, workloads)"
