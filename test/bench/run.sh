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
# Debian's python3-psycopg, installed here when missing), the schema in
# test/bench/setup.sql and the cluster's setup in test/bench/cluster.sh
# (shared with test/bench/soak.sh). BENCH_KEEP=1 keeps the cluster's dir (and
# log); BENCH_JSON=file also writes the figures as JSON.
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

# shellcheck source=cluster.sh
source "$BENCH_DIR/cluster.sh"
bench_cluster_init bench "$BENCH_DIR/setup.sql"
bench_cluster_start

"$PY" "$BENCH_DIR/bench.py" "$DIR" "$PORT"

bench_log_errors
echo
echo "bench took $(($(date +%s) - BENCH_START)) s in all (bootstrap, build, cluster, workloads)"
