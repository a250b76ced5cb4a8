"""test/bench/sharding.sh's measurements: the router's cost per call (latency
and CPU), and W1 straight to the partitions and through the router, on one
shard server's partitions, then on both."""

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


def backend_pid(conn):
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def cpu_ns(pid):
    """Time a process has run on a CPU (ns), from the scheduler's own count."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def routed_backend_of_p0():
    """The backend on p0 that serves the router's PL/Proxy connection."""
    return direct.execute("SELECT pid FROM pg_stat_activity WHERE datname = 'p0' AND backend_type = 'client backend'"
                          " AND pid <> pg_backend_pid()").fetchone()[0]


def timed(conn, statement, arguments, watched):
    """p50, p99 (ms) and the CPU (µs per call) of each watched process."""
    times = []
    before = [cpu_ns(pid) for pid in watched]
    for args in arguments:
        started = time.perf_counter()
        conn.execute(statement, args).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    cpu = [(cpu_ns(pid) - b) / 1000 / len(arguments) for pid, b in zip(watched, before)]
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1], cpu


def line(name, via_router, straight):
    print(f"  {name:26} router p50 {via_router[0]:5.2f} ms p99 {via_router[1]:5.2f} ms, "
          f"CPU router {via_router[2][0]:4.0f} µs + p0 {via_router[2][1]:4.0f} µs   "
          f"direct p50 {straight[0]:5.2f} ms p99 {straight[1]:5.2f} ms, CPU p0 {straight[2][0]:4.0f} µs")


print(f"Per call, one at a time, {CALLS} calls each (partition p0 for both; CPU: each backend's, per call):")
routed_keys, direct_keys = keys_on([0], CALLS + 1, "r"), keys_on([0], CALLS, "d")
insert = "SELECT gd_insert('job', '{\"wait\": true}', correlation_key => %s)"
router.execute(insert, [routed_keys.pop()])   # opens the router's connection to p0
via_router_pids, direct_pids = [backend_pid(router), routed_backend_of_p0()], [backend_pid(direct)]
line("gd_insert (by key)", timed(router, insert, [[k] for k in routed_keys], via_router_pids),
     timed(direct, insert, [[k] for k in direct_keys], direct_pids))
routed_ids = [r[0] for r in direct.execute("SELECT id FROM gd.instances WHERE correlation_key = ANY (%s) ORDER BY id",
                                           [routed_keys])]
direct_ids = [r[0] for r in direct.execute("SELECT id FROM gd.instances WHERE correlation_key = ANY (%s) ORDER BY id",
                                           [direct_keys])]
time.sleep(2)  # the waits are parked
signal = "SELECT gd_signal(%s::bigint, 'go')"
line("gd_signal (by id)", timed(router, signal, [[i] for i in routed_ids], via_router_pids),
     timed(direct, signal, [[i] for i in direct_ids], direct_pids))
time.sleep(2)
wait = "SELECT * FROM gd_await(%s, '5s')"
line("gd_await (already done)", timed(router, wait, [[i] for i in routed_ids], via_router_pids),
     timed(direct, wait, [[i] for i in direct_ids], direct_pids))


def insert_direct(keys):
    """gd_insert_all straight to each key's partition, as a client that knows the map would."""
    by_partition = {}
    for key, p in router.execute("SELECT k, hashtext(k) & 3 FROM unnest(%s::text[]) k", [keys]):
        by_partition.setdefault(p, []).append({"correlation_key": key})
    for p, entries in by_partition.items():
        partitions[p].execute("SELECT count(*) FROM gd_insert_all('job', %s)", [json.dumps(entries)])


def insert_routed(keys):
    router.execute("SELECT count(*) FROM gd_insert_all('job', %s)", [json.dumps([{"correlation_key": k} for k in keys])])


def wait_for_ledger():
    while sum(c.execute("SELECT count(*) FROM ledger").fetchone()[0] for c in partitions.values()) < JOBS:
        time.sleep(0.05)


def clear_ledgers():
    for conn in partitions.values():
        conn.execute("TRUNCATE ledger")


def w1(wanted, label, insert):
    clear_ledgers()
    keys = keys_on(wanted, JOBS, f"w1-{label}")
    router_cpu = cpu_ns(backend_pid(router))
    started = time.perf_counter()
    for i in range(0, JOBS, 500):
        insert(keys[i:i + 500])
    inserted = time.perf_counter() - started
    router_cpu = (cpu_ns(backend_pid(router)) - router_cpu) / 1000 / JOBS
    wait_for_ledger()
    took = time.perf_counter() - started
    print(f"  W1 {label:40} {JOBS / took:8,.0f} jobs/s  ({JOBS:,} jobs in {took:.2f} s; inserts {inserted:.2f} s, "
          f"router CPU {router_cpu:.1f} µs per job)")


print(f"W1 ({JOBS:,} single-step jobs inserted 500 a call, each server 2 executors per partition, 2 vCPUs in all):")
w1([0, 2], "one shard server (p0, p2), direct", insert_direct)
w1([0, 2], "one shard server (p0, p2), router", insert_routed)
w1([0, 1, 2, 3], "two shard servers (p0-p3), direct", insert_direct)
w1([0, 1, 2, 3], "two shard servers (p0-p3), router", insert_routed)


def drain(wanted, label):
    """The partitions' executors alone: the jobs inserted while the queue is paused, timed from gd_resume."""
    clear_ledgers()
    router.execute("SELECT gd_pause('default')")
    keys = keys_on(wanted, JOBS, f"drain-{label}")
    for i in range(0, JOBS, 500):
        insert_direct(keys[i:i + 500])
    started = time.perf_counter()
    router.execute("SELECT gd_resume('default')")
    wait_for_ledger()
    took = time.perf_counter() - started
    print(f"  drain {label:37} {JOBS / took:8,.0f} jobs/s  ({JOBS:,} jobs in {took:.2f} s)")


print("The executors alone (inserted while paused, timed from gd_resume through the router):")
drain([0, 2], "one shard server (p0, p2)")
drain([0, 1, 2, 3], "two shard servers (p0-p3)")
