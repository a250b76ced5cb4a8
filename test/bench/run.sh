#!/usr/bin/env bash
# `make bench`: bootstrap, build + install gen_durable, install the peers,
# start ONE throwaway PostgreSQL 15 cluster (as the postgres OS user,
# durability defaults: fsync and synchronous_commit on), and run the same
# workloads through every system on it, side by side:
#
#   systems  gen_durable in-database (handlers in PL/pgSQL, 2 executors),
#            gen_durable external (a Node.js worker: gd_claim batches that wait in
#            the server, gd_complete_all), pg-boss and graphile-worker (npm, Node.js workers),
#            PgQ (Debian's postgresql-15-pgq3, a consumer loop in SQL driving
#            its own ticks), DBOS Transact (npm, workflows in Node.js), and a
#            hand-written SKIP LOCKED loop (the floor); and W1's work alone
#            (its ledger INSERTs, no queue): the ceiling
#   W1  throughput: BENCH_JOBS (50000) single-step jobs, each one ledger INSERT
#   W3  BENCH_FSM_INSTANCES (10000) three-step chains
#   W4  one parent, BENCH_FANOUT_CHILDREN (10000) children, then a join
#   W2  latency: BENCH_LATENCY_SAMPLES (1000) jobs one at a time, p50/p99
#   W5  W1 with BENCH_BACKLOG (200000) jobs already waiting (gen_durable: and
#       as many finished rows not yet swept); the issue's 1000000 adds about
#       4 minutes (making the backlogs) on a 2-core machine
#   W6  W1 while another session holds a REPEATABLE READ snapshot: jobs/s,
#       dead tuples and size of the queue tables before and after
#   W7  (not by default: BENCH_WORKLOADS=w1,w7) a fixed arrival rate for
#       minutes with the horizon held, then with 1.5x overload, per 10 s
#       (test/bench/w7.py; BENCH_W7_PLOT=file.png draws it); its `chaos`
#       scenario is W9: executors and worker connections terminated at load
#   WB  (not by default: BENCH_WORKLOADS=wb) W1's work as a single step and as a
#       batch step (batch => BENCH_BATCH, 64), BENCH_JOBS instances, 3 runs of each
#       alternating (BENCH_WB_RUNS): instances/s, executor CPU and WAL per instance
#   W8  (not by default) W1 and W2 with 0, 1,000,000 and 10,000,000 finished
#       instances not yet swept plus 1,000,000 scheduled
#   W11 (not by default) fair share: tenant B inserting BENCH_FAIR_RATE (100) jobs/s
#       alone, tenant A inserting BENCH_FAIR_FLOOD (200000) at once alone, then
#       both on one queue: B's insert-to-done p50/p99 and A's jobs/s, each against alone
#   W10 (not by default) 16 producers each committing one job per transaction
#       for 60 s (BENCH_W10_PRODUCERS, BENCH_W10_SECONDS): completions/s and
#       commit latency, gen_durable's external worker with claims that wait
#       (also with its connections through PgBouncer in transaction mode) and
#       with NOTIFY, graphile-worker (NOTIFY), pg-boss (polling)
#
# It prints figures and tables, never pass/fail; it is not part of `make
# check`. The driver is test/bench/bench.py (Python 3 + psycopg, Debian's
# python3-psycopg, installed here when missing), the Node.js side
# test/bench/node/peers.js, the schemas test/bench/setup.sql and
# test/bench/peers.sql, the peers' install test/bench/peers.sh and the
# cluster's setup test/bench/cluster.sh (shared with test/bench/soak.sh).
# Every workload runs BENCH_REPEAT (3) times, each time on a fresh cluster with
# every system in turn, and the end prints the medians with their ranges and
# CPU per step (test/bench/summarize.py), warning where other processes took
# CPU meanwhile; BENCH_BASE=<commit> also builds that commit (in a worktree of
# its own) and alternates the two builds run by run, the medians side by side
# (the workloads as each build's test/bench/setup.sql defines them).
# BENCH_SYSTEMS / BENCH_WORKLOADS (comma lists) run a subset; BENCH_HISTORY=1
# defines gen_durable's FSMs with a step history (history => true); BENCH_KEEP=1
# keeps the cluster's dir (and log); BENCH_JSON=file also writes the figures
# as JSON; BENCH_EXTRA_CONF adds postgresql.conf lines, one per line (e.g.
# shared_preload_libraries = 'gen_durable,auto_explain' and
# auto_explain.log_min_duration = '20ms' to see slow plans in the log).
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
# shellcheck source=peers.sh
source "$BENCH_DIR/peers.sh"
bench_peers_install
# shellcheck source=cluster.sh
source "$BENCH_DIR/cluster.sh"

# The builds compared: this tree (head), and with BENCH_BASE that commit (base),
# built in a worktree of its own; each run installs its build.
REPEAT=${BENCH_REPEAT:-3}
builds=(head)
declare -A build_tree=([head]=$(gd_build_dir)) build_commit=()
if [[ -n ${BENCH_BASE:-} ]]; then
    base_dir=$(mktemp -d /tmp/gd_bench_base.XXXXXX)
    git -C "$GD_ROOT" worktree add -q --detach "$base_dir/tree" "$BENCH_BASE"
    gd_make_install "the base build ($BENCH_BASE)" "$base_dir/tree" "$base_dir/build.log"
    builds=(base head)
    build_tree[base]=$base_dir/tree
    build_commit[base]="$(git -C "$base_dir/tree" log -1 --format='%h %s') (BENCH_BASE)"
fi
runs_dir=$(mktemp -d /tmp/gd_bench_runs.XXXXXX)
extra_conf=()
[[ -z ${BENCH_EXTRA_CONF:-} ]] || mapfile -t extra_conf <<<"$BENCH_EXTRA_CONF"

# One run of every workload and system (interleaved: each system once per
# run) on a fresh cluster, with the build $1 installed; its figures into $2.
run_once() {
    local build=$1 json=$2 setup=$BENCH_DIR/setup.sql
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "${build_tree[$build]}" --no-print-directory \
        PG_CONFIG="$GD_PG_CONFIG" install >/dev/null
    [[ $build == head ]] || setup=${build_tree[$build]}/test/bench/setup.sql   # the workloads as that build defines them
    BENCH_BUILD_DIR=${build_tree[$build]}
    BENCH_ENGINE_COMMIT=${build_commit[$build]:-}   # head's: found by bench_cluster_start
    bench_cluster_init bench "$setup"
    bench_cluster_start "${extra_conf[@]}"
    bench_peers_schema
    if [[ ${BENCH_HISTORY:-0} == 1 ]]; then
        # gen_durable's FSMs keep a step history (their version 2: gd_insert takes it)
        bench_psql -c "
            SELECT gd_define_fsm(f.name, f.initial_step, f.queue, version => 2, history => true,
                                 steps => (SELECT jsonb_object_agg(s.step, jsonb_strip_nulls(jsonb_build_object(
                                                     'handler', s.handler::text, 'max_attempts', s.max_attempts)))
                                             FROM gd.steps s WHERE s.fsm = f.name AND s.version = 1))
              FROM gd.fsms f WHERE f.version = 1 AND f.name IN ('w1', 'w2', 'w3', 'x1')"
    fi
    gd_log "run $build: $json"
    BENCH_JSON=$json "$PY" "$BENCH_DIR/bench.py" "$DIR" "$PORT"
    bench_log_errors
    bench_cluster_stop
}

summary_args=()
for rep in $(seq 1 "$REPEAT"); do
    for build in "${builds[@]}"; do
        run_once "$build" "$runs_dir/$build-$rep.json"
        summary_args+=("$build=$runs_dir/$build-$rep.json")
    done
done
if [[ -n ${BENCH_BASE:-} ]]; then
    git -C "$GD_ROOT" worktree remove --force "$base_dir/tree"
    rm -rf "$base_dir"
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "${build_tree[head]}" --no-print-directory \
        PG_CONFIG="$GD_PG_CONFIG" install >/dev/null   # this tree's build stays installed
fi
"$PY" "$BENCH_DIR/summarize.py" "${summary_args[@]}"
[[ -n ${BENCH_KEEP:-} ]] && echo "(each run's figures kept: $runs_dir)" || rm -rf "$runs_dir"
echo
echo "bench took $(($(date +%s) - BENCH_START)) s in all (bootstrap, build, clusters, workloads)"
