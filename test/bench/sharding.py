"""test/bench/sharding.sh's measurements: the router's cost per call, and W1
through the router on one shard server's partitions, then on both."""

import json
import os
import statistics
import time

import psycopg

SOCKETS = os.environ["BENCH_SOCKETS"]
JOBS = int(os.environ.get("BENCH_JOBS", "20000"))
CALLS = 500


def connect(port, dbname):
    return psycopg.connect(host=SOCKETS, port=port, dbname=dbname, user="postgres", autocommit=True)


router = connect(os.environ["BENCH_ROUTER_PORT"], "postgres")
shard_a = os.environ["BENCH_A_PORT"]
partitions = {p: connect(shard_a if p % 2 == 0 else os.environ["BENCH_B_PORT"], f"p{p}") for p in range(4)}
direct = partitions[0]


def keys_on(wanted, count, prefix):
    """Correlation keys that hash to the partitions in `wanted`."""
    found, n = [], 0
    while len(found) < count:
        batch = [f"{prefix}-{i}" for i in range(n, n + 1000)]
        n += 1000
        rows = router.execute("SELECT k FROM unnest(%s::text[]) k WHERE hashtext(k) & 3 = ANY (%s)", [batch, wanted])
        found += [r[0] for r in rows]
    return found[:count]


def timed(conn, statement, arguments):
    times = []
    for args in arguments:
        started = time.perf_counter()
        conn.execute(statement, args).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


def line(name, via_router, straight):
    print(f"  {name:34} router p50 {via_router[0]:6.2f} ms  p99 {via_router[1]:6.2f} ms   "
          f"direct p50 {straight[0]:6.2f} ms  p99 {straight[1]:6.2f} ms   (+{via_router[0] - straight[0]:.2f} ms p50)")


print(f"Per call, one at a time, {CALLS} calls each (partition p0 for both):")
routed_keys, direct_keys = keys_on([0], CALLS, "r"), keys_on([0], CALLS, "d")
insert = "SELECT gd_insert('job', '{\"wait\": true}', correlation_key => %s)"
line("gd_insert (by key)", timed(router, insert, [[k] for k in routed_keys]),
     timed(direct, insert, [[k] for k in direct_keys]))
routed_ids = [r[0] for r in direct.execute("SELECT id FROM gd.instances WHERE correlation_key = ANY (%s) ORDER BY id",
                                           [routed_keys])]
direct_ids = [r[0] for r in direct.execute("SELECT id FROM gd.instances WHERE correlation_key = ANY (%s) ORDER BY id",
                                           [direct_keys])]
time.sleep(2)  # the waits are parked
signal = "SELECT gd_signal(%s::bigint, 'go')"
line("gd_signal (by id)", timed(router, signal, [[i] for i in routed_ids]), timed(direct, signal, [[i] for i in direct_ids]))
time.sleep(2)
wait = "SELECT * FROM gd_await(%s, '5s')"
line("gd_await (already done)", timed(router, wait, [[i] for i in routed_ids]), timed(direct, wait, [[i] for i in direct_ids]))


def w1(wanted, label):
    for conn in partitions.values():
        conn.execute("TRUNCATE ledger")
    keys = keys_on(wanted, JOBS, f"w1-{label}")
    started = time.perf_counter()
    for i in range(0, JOBS, 500):
        router.execute("SELECT count(*) FROM gd_insert_all('job', %s)",
                       [json.dumps([{"correlation_key": k} for k in keys[i:i + 500]])])
    inserted = time.perf_counter() - started
    while sum(c.execute("SELECT count(*) FROM ledger").fetchone()[0] for c in partitions.values()) < JOBS:
        time.sleep(0.05)
    took = time.perf_counter() - started
    print(f"  W1 {label:28} {JOBS / took:8,.0f} jobs/s  ({JOBS:,} jobs in {took:.2f} s; inserts through the router "
          f"{inserted:.2f} s)")


print(f"W1 through the router ({JOBS:,} single-step jobs, each server 2 executors per partition, 2 vCPUs in all):")
w1([0, 2], "one shard server (p0, p2)")
w1([0, 1, 2, 3], "two shard servers (p0-p3)")
