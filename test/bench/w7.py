"""W7 for test/bench/bench.py: the MVCC horizon pinned for minutes, and an overload.

Every system runs at one fixed arrival rate that all of them sustain, in two
scenarios (BENCH_W7_SCENARIOS, default hold,overload) of three phases each
(BENCH_W7_PHASES seconds, default 120,300,180):

  hold      clean; then one idle-in-transaction session holding an XID
            (BEGIN; SELECT txid_current()) plus four REPEATABLE READ sessions
            scanning the queue tables in a loop; then recovery
  overload  clean; then 1.5x the rate (producers outpacing workers); then
            the rate again, the backlog draining
  chaos     (W9, BENCH_W7_SCENARIOS=chaos) clean; then pg_terminate_backend of a
            random engine executor twice a second, and at its end of every
            connection of the system's own workers once; then recovery.  The
            ledger says how many jobs had their effect, and how many twice

Per 10 s bucket: arrivals, completions, insert-to-done p50/p99, backlog, dead
tuples and size of the queue tables, how busy the machine was (the readers'
scans grow with the tables), and the top wait events of the system's
backends.  Jobs carry their enqueue time ({"t": epoch seconds}); the ledger
row the job writes carries the completion time, so latency is measured from
the same clock at both ends.  The figures go to the report and, when
BENCH_W7_PLOT names a file, to a PNG (one panel per metric, a line per system).
"""
import os
import random
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
        self.error = None
        self.thread = threading.Thread(target=self.run)

    def run(self):
        try:
            self.produce()
        except Exception as e:  # the run reports it at its next bucket
            self.error = e

    def produce(self):
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
        self.last_id = self.first_id = one(conn, f"SELECT coalesce(max(id), 0) FROM {table}")
        self.done = 0

    def effects(self):
        """(jobs with an effect, jobs with more than one) since the start: job_id names the instance."""
        return self.conn.execute(
            f"SELECT count(*), count(*) FILTER (WHERE n > 1)"
            f"  FROM (SELECT job_id, count(*) AS n FROM {self.table} WHERE id > %s GROUP BY job_id) j",
            (self.first_id,)).fetchone()

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


def machine_ticks():
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    return sum(parts[:8]), parts[3] + parts[4]  # all, idle + iowait


def table_figures(conn, tables):
    dead, size = conn.execute(
        "SELECT sum(coalesce(pg_stat_get_dead_tuples(t::regclass), 0)),"
        "       sum(pg_total_relation_size(t::regclass))"
        "  FROM unnest(%s::text[]) t", (tables,)).fetchone()
    return int(dead or 0), int(size or 0)


def size_breakdown(conn, tables):
    """Each queue table's heap and each of its indexes, MiB, largest first: what a hold grows."""
    rows = conn.execute(
        "SELECT r::text, pg_relation_size(r) FROM unnest(%s::regclass[]) t,"
        "       LATERAL (SELECT t AS r UNION ALL SELECT indexrelid::regclass FROM pg_index WHERE indrelid = t) x"
        " ORDER BY 2 DESC", (tables,)).fetchall()
    return ", ".join(f"{name} {size / 2**20:.1f}" for name, size in rows)


class Killer:
    """W9's chaos: pg_terminate_backend of a random engine executor twice a second until stop(),
    then of every connection of the system's own workers once."""

    def __init__(self, connect, workers_sql):
        self.conn = connect()
        self.workers_sql = workers_sql
        self.kills = 0
        self.executors_seen = set()
        self.stopping = False
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while not self.stopping:
            pids = [r[0] for r in self.conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'gen_durable executor'"
                "   AND datname = current_database()").fetchall()]
            self.executors_seen.update(pids)
            if pids:
                self.kills += one(self.conn, "SELECT count(*) FILTER (WHERE pg_terminate_backend(%s))",
                                  (random.choice(pids),))
            time.sleep(0.5)

    def stop(self):
        self.stopping = True
        self.thread.join()
        self.worker_kills = one(self.conn, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                                           f"  FROM pg_stat_activity WHERE {self.workers_sql}")
        self.conn.close()


def executors_running(conn):
    return one(conn, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gen_durable executor'"
                     "   AND datname = current_database()")


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
    holders = killer = None
    buckets = []
    t0 = time.monotonic()
    producer.thread.start()
    phase = "clean"
    try:
        for end in range(BUCKET_S, clean + middle + recovery + 1, BUCKET_S):
            if (phase == "clean" and end > clean) or (phase == scenario and end > clean + middle):
                log(f"      MiB at the end of {phase}: {size_breakdown(admin, system.tables)}")
            if phase == "clean" and end > clean:
                phase = scenario
                if scenario == "hold":
                    holders = HorizonHolders(connect, system.tables)
                    holders.start()
                elif scenario == "chaos":
                    killer = Killer(connect, system.workers_sql)
                else:
                    producer.rate = rate * 1.5
            elif phase == scenario and end > clean + middle:
                phase = "recovery"
                if holders:
                    holders.stop()
                    holders = None
                if killer:
                    killer.stop()
                producer.rate = rate
            arrivals0 = producer.arrivals
            total0, idle0 = machine_ticks()
            time.sleep(max(0.0, t0 + end - time.monotonic()))
            total1, idle1 = machine_ticks()
            if producer.error:
                raise SystemExit(f"bench: W7: {system.name}'s producer stopped: {producer.error!r}")
            done, p50, p99 = ledger.take()
            dead, size = table_figures(admin, system.tables)
            b = {"t": end, "phase": phase, "arrivals": producer.arrivals - arrivals0, "completions": done,
                 "p50_ms": p50, "p99_ms": p99, "backlog": producer.arrivals - ledger.done,
                 "dead_tuples": dead, "table_mib": size / 2**20, "waits": sampler.take(),
                 "machine_busy": 1 - (idle1 - idle0) / max(total1 - total0, 1),
                 "executors": executors_running(admin)}
            buckets.append(b)
            log(f"      {end:4d}s {phase:8s} in {b['arrivals']:6d} done {done:6d} backlog {b['backlog']:7d}"
                f" p50 {fmt_ms(p50)} p99 {fmt_ms(p99)} dead {dead:9,d} {b['table_mib']:7.1f} MiB"
                f" cpu {100 * b['machine_busy']:3.0f}%  "
                + " ".join(f"{e}×{n}" for e, n in b["waits"]))
    finally:
        if holders:
            holders.stop()
        if killer and not killer.stopping:
            killer.stop()
        producer.stop()
        sampler.stop()
    log(f"      MiB at the end: {size_breakdown(admin, system.tables)}")
    # The last of the backlog, so the next system starts clean.
    deadline = time.monotonic() + 120
    while ledger.done < producer.arrivals and time.monotonic() < deadline:
        time.sleep(0.5)
        ledger.take()
    with_effect, twice = ledger.effects()
    admin.close()
    out = {"rate": rate, "lagging_ticks": producer.lagging_ticks, "buckets": buckets,
           "lost": producer.arrivals - with_effect, "effects_twice": twice}
    if killer:
        out.update(executor_kills=killer.kills, worker_kills=killer.worker_kills,
                   executor_pids_seen=len(killer.executors_seen))
        log(f"      chaos: {killer.kills} executors and {killer.worker_kills} worker connections terminated,"
            f" {len(killer.executors_seen)} executor processes seen; {with_effect:,} jobs with an effect,"
            f" {twice} of them twice, {out['lost']} lost")
    return out


def fmt_ms(v):
    return "    -   " if v is None else f"{v:8.1f}"


# ---------------------------------------------------------------- systems

class GdInDatabase:
    """gen_durable's in-database path: W1's FSM, its handler writing bench.w1_ledger."""
    name = "gd"
    ledger = "bench.w1_ledger"
    tables = ["gd._instances"]
    backends_sql = "backend_type = 'gen_durable executor'"
    workers_sql = backends_sql

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
        self.workers_sql = f"application_name ~ '^bench {name} (lane|listener)'"  # W9: not the producer's
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
               ("dead_tuples", "dead tuples in the queue tables"), ("table_mib", "queue tables (MiB)"),
               ("machine_busy", "machine CPU busy (fraction)")]
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


def summarize(results):
    """Per system and scenario, the figures the goals name: latency before, during (its last minute) and
    after the middle phase, whether completions kept pace, the tables' size, and (overload) how fast
    the backlog drained.  A list of dicts, one per (system, scenario)."""
    clean, middle, recovery = phases()
    rows = []
    for system, per in results.items():
        for scenario, run in per.items():
            b = run["buckets"]
            before = [x for x in b if x["phase"] == "clean"]
            during = [x for x in b if x["phase"] == scenario]
            late = [x for x in during if x["t"] > clean + middle - 60] or during
            after = [x for x in b if x["phase"] == "recovery"]
            if not before or not during:
                continue  # cut short

            def worst(xs, key):
                vals = [x[key] for x in xs if x[key] is not None]
                return max(vals) if vals else float("nan")

            def median(xs, key):
                vals = sorted(x[key] for x in xs if x[key] is not None)
                return vals[len(vals) // 2] if vals else float("nan")

            pace = min((x["completions"] / x["arrivals"] for x in during if x["arrivals"]), default=float("nan"))
            drained = next((x["t"] - (clean + middle) for x in after
                            if x["backlog"] <= 2 * max(before[-1]["backlog"], run["rate"] * 0.05)), None)
            rows.append({
                "system": system, "scenario": scenario, "rate": run["rate"],
                "p50_before": median(before, "p50_ms"), "p99_before": worst(before, "p99_ms"),
                "p50_late": median(late, "p50_ms"), "p99_late": worst(late, "p99_ms"),
                "p99_after": worst(after[-6:], "p99_ms"),
                "worst_pace": pace, "backlog_peak": max(x["backlog"] for x in b),
                "mib_before": before[-1]["table_mib"], "mib_release": during[-1]["table_mib"],
                "mib_end": b[-1]["table_mib"], "drained_s": drained, "lost": run["lost"],
            })
    return rows


def print_summary(rows, log):
    log("W7 summary (ms; 'late' = the last minute of the hold or overload; pace = the worst 10 s of"
        " completions / arrivals then; MiB = the queue tables before, at the end of, and after it)")
    for r in rows:
        drained = "-" if r["drained_s"] is None else f"{r['drained_s']} s"
        log(f"    {r['system']:18s} {r['scenario']:8s} p50 {r['p50_before']:6.1f} -> {r['p50_late']:7.1f}"
            f"  p99 {r['p99_before']:7.1f} -> {r['p99_late']:7.1f} (after {r['p99_after']:7.1f})"
            f"  pace {r['worst_pace']:4.2f}  backlog peak {r['backlog_peak']:7,d} drained in {drained}"
            f"  MiB {r['mib_before']:6.1f} / {r['mib_release']:6.1f} / {r['mib_end']:6.1f}  lost {r['lost']}")
