"""W7 for test/bench/bench.py: the MVCC horizon pinned for minutes, and an overload.

Every system runs at one fixed arrival rate that all of them sustain, in two
scenarios (BENCH_W7_SCENARIOS, default hold,overload) of three phases each
(BENCH_W7_PHASES seconds, default 120,300,180):

  hold      clean; then one idle-in-transaction session holding an XID
            (BEGIN; SELECT txid_current()) plus four REPEATABLE READ sessions
            scanning the queue tables in a loop; then recovery
  overload  clean; then 1.5x the rate (producers outpacing workers); then
            the rate again, the backlog draining

Per 10 s bucket: arrivals, completions, insert-to-done p50/p99, backlog, dead
tuples and size of the queue tables, and the top wait events of the system's
backends.  Jobs carry their enqueue time ({"t": epoch seconds}); the ledger
row the job writes carries the completion time, so latency is measured from
the same clock at both ends.  The figures go to the report and, when
BENCH_W7_PLOT names a file, to a PNG (one panel per metric, a line per system).
"""
import os
import subprocess
import threading
import time

import psycopg

BUCKET_S = 10
TICK_S = 0.05  # the producer enqueues once per tick
READERS = 4


def scenarios():
    return os.environ.get("BENCH_W7_SCENARIOS", "hold,overload").split(",")


def phases():
    clean, middle, recovery = (int(x) for x in os.environ.get("BENCH_W7_PHASES", "120,300,180").split(","))
    return clean, middle, recovery


class Producer:
    """Enqueues rate jobs a second, in one transaction per tick, until stop(); counts arrivals per bucket."""

    def __init__(self, enqueue, rate):
        self.enqueue, self.rate = enqueue, rate
        self.arrivals = 0
        self.lagging_ticks = 0
        self.stopping = False
        self.thread = threading.Thread(target=self.run)

    def run(self):
        owed = 0.0
        next_tick = time.monotonic()
        while not self.stopping:
            owed += self.rate * TICK_S
            k = int(owed)
            if k:
                self.enqueue(k)
                owed -= k
                self.arrivals += k
            next_tick += TICK_S
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                self.lagging_ticks += 1

    def stop(self):
        self.stopping = True
        self.thread.join()


class HorizonHolders:
    """One session holding an XID idle in transaction, and readers scanning the tables in REPEATABLE READ."""

    def __init__(self, connect, tables):
        self.connect, self.tables = connect, tables
        self.stopping = False

    def start(self):
        self.holder = self.connect(autocommit=False)
        self.holder.execute("SELECT txid_current()")
        self.threads = [threading.Thread(target=self.read) for _ in range(READERS)]
        for t in self.threads:
            t.start()

    def read(self):
        conn = self.connect(autocommit=False)
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        scan = " UNION ALL ".join(f"SELECT count(*) FROM {t}" for t in self.tables)
        while not self.stopping:
            conn.execute(scan).fetchall()
            time.sleep(1.0)
        conn.rollback()
        conn.close()

    def stop(self):
        self.stopping = True
        for t in self.threads:
            t.join()
        self.holder.rollback()
        self.holder.close()


class Ledger:
    """Completions read incrementally from a ledger whose payload holds the enqueue time."""

    def __init__(self, conn, table):
        self.conn, self.table = conn, table
        self.last_id = one(conn, f"SELECT coalesce(max(id), 0) FROM {table}")
        self.done = 0

    def take(self):
        n, p50, p99, last = self.conn.execute(
            f"SELECT count(*),"
            f"       percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms),"
            f"       max(id)"
            f"  FROM (SELECT id, 1000 * (extract(epoch FROM at) - (payload->>'t')::float8) AS ms"
            f"          FROM {self.table} WHERE id > %s AND payload ? 't') l", (self.last_id,)).fetchone()
        if last is not None:
            self.last_id = last
        self.done += n
        return n, p50, p99


def one(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def table_figures(conn, tables):
    dead, size = conn.execute(
        "SELECT sum(coalesce(pg_stat_get_dead_tuples(t::regclass), 0)),"
        "       sum(pg_total_relation_size(t::regclass))"
        "  FROM unnest(%s::text[]) t", (tables,)).fetchone()
    return int(dead or 0), int(size or 0)


class WaitSampler:
    """Samples the wait events of the system's backends once a second."""

    def __init__(self, connect, backends_sql):
        self.conn = connect()
        self.backends_sql = backends_sql
        self.counts = {}
        self.stopping = False
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while not self.stopping:
            for (event,) in self.conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity"
                    f" WHERE state <> 'idle' AND ({self.backends_sql})").fetchall():
                self.counts[event] = self.counts.get(event, 0) + 1
            time.sleep(1.0)

    def take(self, top=3):
        counts, self.counts = self.counts, {}
        return sorted(counts.items(), key=lambda kv: -kv[1])[:top]

    def stop(self):
        self.stopping = True
        self.thread.join()
        self.conn.close()


def run_scenario(system, scenario, rate, connect, log):
    """One 3-phase scenario of one system; returns its buckets."""
    clean, middle, recovery = phases()
    admin = connect()
    ledger = Ledger(admin, system.ledger)
    producer = Producer(system.enqueue, rate)
    sampler = WaitSampler(connect, system.backends_sql)
    holders = None
    buckets = []
    t0 = time.monotonic()
    producer.thread.start()
    phase = "clean"
    try:
        for end in range(BUCKET_S, clean + middle + recovery + 1, BUCKET_S):
            if phase == "clean" and end > clean:
                phase = scenario
                if scenario == "hold":
                    holders = HorizonHolders(connect, system.tables)
                    holders.start()
                else:
                    producer.rate = rate * 1.5
            elif phase == scenario and end > clean + middle:
                phase = "recovery"
                if holders:
                    holders.stop()
                    holders = None
                producer.rate = rate
            arrivals0 = producer.arrivals
            time.sleep(max(0.0, t0 + end - time.monotonic()))
            done, p50, p99 = ledger.take()
            dead, size = table_figures(admin, system.tables)
            b = {"t": end, "phase": phase, "arrivals": producer.arrivals - arrivals0, "completions": done,
                 "p50_ms": p50, "p99_ms": p99, "backlog": producer.arrivals - ledger.done,
                 "dead_tuples": dead, "table_mib": size / 2**20, "waits": sampler.take()}
            buckets.append(b)
            log(f"      {end:4d}s {phase:8s} in {b['arrivals']:6d} done {done:6d} backlog {b['backlog']:7d}"
                f" p50 {fmt_ms(p50)} p99 {fmt_ms(p99)} dead {dead:9,d} {b['table_mib']:7.1f} MiB  "
                + " ".join(f"{e}×{n}" for e, n in b["waits"]))
    finally:
        if holders:
            holders.stop()
        producer.stop()
        sampler.stop()
    # The last of the backlog, so the next system starts clean.
    deadline = time.monotonic() + 120
    while ledger.done < producer.arrivals and time.monotonic() < deadline:
        time.sleep(0.5)
        ledger.take()
    admin.close()
    return {"rate": rate, "lagging_ticks": producer.lagging_ticks, "buckets": buckets,
            "lost": producer.arrivals - ledger.done}


def fmt_ms(v):
    return "    -   " if v is None else f"{v:8.1f}"


# ---------------------------------------------------------------- systems

class GdInDatabase:
    """gen_durable's in-database path: W1's FSM, its handler writing bench.w1_ledger."""
    name = "gd"
    ledger = "bench.w1_ledger"
    tables = ["gd._instances"]
    backends_sql = "backend_type = 'gen_durable executor'"

    def __init__(self, connect):
        self.conn = connect()

    def enqueue(self, k):
        self.conn.execute(
            "SELECT count(*) FROM gd_insert_all('w1', (SELECT jsonb_agg(jsonb_build_object("
            "'state', jsonb_build_object('t', extract(epoch FROM clock_timestamp())))) FROM generate_series(1, %s)))",
            (k,))

    def close(self):
        self.conn.close()


class NodeSystem:
    """A system whose workers and producer run in test/bench/node/peers.js (workload `steady`):
    it enqueues the number of jobs each line on its stdin names."""
    ledger = "bench.peer_ledger"

    def __init__(self, name, tables, node_cmd, env):
        self.name, self.tables = name, tables
        self.backends_sql = f"application_name LIKE 'bench {name}%'"
        self.proc = subprocess.Popen(node_cmd + [name, "steady", "0"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if '"ready"' not in line:
            raise SystemExit(f"bench: W7: {name} did not start: {line!r}")
        self.lock = threading.Lock()

    def enqueue(self, k):
        with self.lock:
            self.proc.stdin.write(f"{k}\n")
            self.proc.stdin.flush()
            self.proc.stdout.readline()  # enqueued: one line back per line sent

    def close(self):
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        self.proc.wait(60)


def plot(results, path):
    """One panel per metric, a line per system and scenario."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    metrics = [("completions", "completions / 10 s"), ("p99_ms", "insert-to-done p99 (ms, log)"),
               ("p50_ms", "insert-to-done p50 (ms, log)"), ("backlog", "backlog (jobs)"),
               ("dead_tuples", "dead tuples in the queue tables"), ("table_mib", "queue tables (MiB)")]
    scenarios = sorted({sc for per in results.values() for sc in per})
    fig, axes = plt.subplots(len(metrics), len(scenarios), figsize=(7 * len(scenarios), 2.6 * len(metrics)),
                             squeeze=False, sharex=True)
    clean, middle, _ = phases()
    for col, sc in enumerate(scenarios):
        for row, (key, title) in enumerate(metrics):
            ax = axes[row][col]
            for system, per in results.items():
                if sc not in per:
                    continue
                b = per[sc]["buckets"]
                ax.plot([x["t"] for x in b], [x[key] if x[key] is not None else float("nan") for x in b],
                        label=system)
            ax.axvspan(clean, clean + middle, color="0.9")
            if key.endswith("_ms"):
                ax.set_yscale("log")
            ax.set_title(f"{sc}: {title}", fontsize=9)
            ax.grid(True, alpha=0.3)
        axes[-1][col].set_xlabel("seconds (shaded: horizon held / 1.5x load)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
