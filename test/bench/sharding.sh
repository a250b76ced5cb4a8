#!/usr/bin/env bash
# The sharding router's cost (sharding/README.md): three throwaway clusters
# on this machine — a router and two shard servers holding four partitions —
# then test/bench/sharding.py times gd_insert, gd_signal and gd_await one at
# a time through the router and straight to a partition (p50/p99, and each
# backend's CPU per call), and W1 (BENCH_JOBS single-step jobs inserted 500 a
# call, straight to the partitions and through the router) with the
# partitions' executors on one shard server, then on both.  Prints figures,
# never pass/fail; not part of `make check`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=/usr/lib/postgresql/15/bin
BASE=$(mktemp -d /tmp/gd_sharding_bench.XXXXXX)
chown postgres: "$BASE"
as_pg() { runuser -u postgres -- "$@"; }
declare -A PORT=([router]=55430 [a]=55431 [b]=55432)
cleanup() {
    for n in router a b; do as_pg "$BIN/pg_ctl" -D "$BASE/$n" -m immediate stop >/dev/null 2>&1 || true; done
    rm -rf "$BASE"
}
trap cleanup EXIT
start() { # name, databases served, queues
    as_pg "$BIN/initdb" -D "$BASE/$1" -A trust >/dev/null
    cat >>"$BASE/$1/postgresql.conf" <<CONF
port = ${PORT[$1]}
unix_socket_directories = '$BASE'
shared_preload_libraries = 'gen_durable'
gen_durable.database = '$2'
gen_durable.queues = '$3'
max_connections = 200
max_worker_processes = 16
CONF
    as_pg "$BIN/pg_ctl" -D "$BASE/$1" -l "$BASE/$1.log" -w start >/dev/null
}
start router postgres 'default:0'
start a 'p0, p2' 'default:2'
start b 'p1, p3' 'default:2'
declare -A SHARD=([0]=a [1]=b [2]=a [3]=b)
for p in 0 1 2 3; do
    port=${PORT[${SHARD[$p]}]}
    as_pg psql -X -q -h "$BASE" -p "$port" -d postgres -c "CREATE DATABASE p$p"
    as_pg psql -X -q -h "$BASE" -p "$port" -d "p$p" -c 'CREATE EXTENSION gen_durable' -c "
CREATE TABLE ledger (id bigint);
CREATE FUNCTION work(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS \$\$
BEGIN
    IF state ? 'wait' AND ctx.step = 'only' THEN RETURN gd_wait_signal(ARRAY['go'], then_step => 'only', state => '{}'); END IF;
    INSERT INTO ledger VALUES (ctx.id);
    RETURN gd_done();
END \$\$;"
    as_pg psql -X -q -h "$BASE" -p "$port" -d "p$p" -v partition=$p -v partitions=4 -f "$ROOT/sharding/partition.sql"
done
servers=""
for p in 0 1 2 3; do servers+="${servers:+, }p$p 'dbname=p$p host=$BASE port=${PORT[${SHARD[$p]}]}'"; done
as_pg psql -X -q -h "$BASE" -p "${PORT[router]}" -d postgres -c 'CREATE EXTENSION plproxy' \
    -c "CREATE SERVER gd_partitions FOREIGN DATA WRAPPER plproxy OPTIONS (connection_lifetime '1800', $servers)" \
    -c "CREATE USER MAPPING FOR PUBLIC SERVER gd_partitions OPTIONS (user 'postgres')"
as_pg psql -X -q -h "$BASE" -p "${PORT[router]}" -d postgres -f "$ROOT/sharding/router.sql"
as_pg psql -X -q -h "$BASE" -p "${PORT[router]}" -d postgres -c \
    "SELECT gd_define_fsm('job', 'only', steps => '{\"only\": {\"handler\": \"public.work(jsonb, gd.context)\"}}')" >/dev/null
export BENCH_SOCKETS=$BASE BENCH_ROUTER_PORT=${PORT[router]} BENCH_A_PORT=${PORT[a]} BENCH_B_PORT=${PORT[b]}
as_pg env BENCH_SOCKETS="$BASE" BENCH_ROUTER_PORT="${PORT[router]}" BENCH_A_PORT="${PORT[a]}" \
    BENCH_B_PORT="${PORT[b]}" BENCH_JOBS="${BENCH_JOBS:-20000}" BENCH_BIN="$BIN" BENCH_BASE="$BASE" \
    /usr/bin/python3 "$ROOT/test/bench/sharding.py"
