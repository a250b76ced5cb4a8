#!/usr/bin/python3
"""gen_durable benchmark driver, run by test/bench/run.sh against a throwaway
cluster it has already started and loaded with test/bench/setup.sql.

    bench.py SOCKET_DIR PORT

Prints figures, never pass/fail (the exit status is non-zero only when the
benchmark itself could not run).  Knobs (environment):
  BENCH_JOBS             W1 and floor jobs               (default 50000)
  BENCH_FSM_INSTANCES    W3 instances                    (default 10000)
  BENCH_LATENCY_SAMPLES  W2 and commit-probe samples     (default 1000)
  BENCH_DIAGNOSTICS      0 skips the two diagnostic floor variants (default 1)
  BENCH_TIMEOUT          seconds a throughput run may take before it is
                         reported as incomplete          (default 180)
  BENCH_JSON             also write the figures to this file as JSON
  BENCH_POLICY           gen_durable's W1 and W3 instances under a policy each:
                         concurrency  concurrency_key 'bench:<n mod BENCH_POLICY_KEYS>'
                                      (limit 1 per key: the rest wait, admitted as
                                      holders end)
                         rate         rate_limit 'bench:<n mod BENCH_POLICY_KEYS>'
                                      (a limit far above the run's pace: every
                                      step takes a token, none waits)
  BENCH_POLICY_KEYS      keys or buckets of BENCH_POLICY   (default 1000)
  BENCH_FAIR_FLOOD       W11: tenant A's jobs, inserted at once (default 200000)
  BENCH_FAIR_RATE        W11: tenant B's jobs per second   (default 100)
  BENCH_FAIR_SECONDS     W11: how long tenant B runs alone (default 10)
  BENCH_BATCH            WB's batch step: its batch        (default 64, the
                         executors' gen_durable.batch_size)
  BENCH_WB_RUNS          WB: runs of each kind, alternating (default 3)

Throughput is measured with server timestamps: from just before the COMMIT
that makes the work visible (gen_durable) or from the first worker's start
(floor) to the last row's finished_at/updated_at, so client polling does not
add to the figure.  Latency is measured in this client with a monotonic clock.
"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psycopg

HOST, PORT = sys.argv[1], sys.argv[2]
DSN = dict(host=HOST, port=PORT, dbname="bench", user="postgres", application_name="gd_bench")

N_JOBS = int(os.environ.get("BENCH_JOBS", "50000"))
BATCH = int(os.environ.get("BENCH_BATCH", "64"))          # WB's batch step: its batch
WB_RUNS = int(os.environ.get("BENCH_WB_RUNS", "3"))       # WB: runs of each kind, alternating
POLICY = os.environ.get("BENCH_POLICY", "")
POLICY_KEYS = int(os.environ.get("BENCH_POLICY_KEYS", "1000"))
POLICY_OPTION = {"": None, "concurrency": "concurrency_key", "rate": "rate_limit"}[POLICY]
N_FSM = int(os.environ.get("BENCH_FSM_INSTANCES", "10000"))
N_LAT = int(os.environ.get("BENCH_LATENCY_SAMPLES", "1000"))
TIMEOUT = float(os.environ.get("BENCH_TIMEOUT", "180"))
DIAGNOSTICS = os.environ.get("BENCH_DIAGNOSTICS", "1") != "0"
LATENCY_BUDGET_S = 120.0  # W2 stops early (and says so) past this
FLOOR_WORKERS = 2          # matches gen_durable.queues = 'default:2'
FLOOR_BATCH = 64           # matches gen_durable.batch_size's default
N_W4 = int(os.environ.get("BENCH_FANOUT_CHILDREN", "10000"))
N_BACKLOG = int(os.environ.get("BENCH_BACKLOG", "200000"))
N_FAIR_FLOOD = int(os.environ.get("BENCH_FAIR_FLOOD", "200000"))
FAIR_RATE = float(os.environ.get("BENCH_FAIR_RATE", "100"))
FAIR_SECONDS = float(os.environ.get("BENCH_FAIR_SECONDS", "10"))  # the issue says 1,000,000: see run.sh
N_LAT_BACKLOG = max(N_LAT // 4, 20)  # W5's latency: W2 one at a time with the backlog still waiting
SYSTEMS = [s for s in os.environ.get("BENCH_SYSTEMS", "gd,gdext,pgboss,graphile,pgq,dbos,floor").split(",") if s]
WORKLOADS = [w for w in os.environ.get("BENCH_WORKLOADS", "w1,w3,w4,w2,w5,w6").split(",") if w]
PEERS = ("pgboss", "graphile", "pgq", "dbos")
# Where the bench's own tables hold a system's queue (DBOS keeps its workflows in a database of its
# own): the workloads that read them (W5's backlog, W6 and W7's table figures) skip the others.
IN_BENCH_DATABASE = ("gd", "gdext", "pgboss", "graphile", "pgq", "floor")
NODE = os.environ.get("BENCH_NODE", "node")
NODE_MODULES = os.environ.get("BENCH_NODE_MODULES", "/var/cache/gd-bench/node_modules")
PEERS_JS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node", "peers.js")
NODE_VERSION = os.environ.get("BENCH_NODE_VERSION", "?")
PEER_VERSIONS = {"pgboss": os.environ.get("BENCH_PGBOSS_VERSION", ""),
                 "graphile": os.environ.get("BENCH_GRAPHILE_VERSION", ""),
                 "pgq": os.environ.get("BENCH_PGQ_VERSION", ""),
                 "dbos": os.environ.get("BENCH_DBOS_VERSION", "")}

TICK = os.sysconf("SC_CLK_TCK")
NPROC = os.cpu_count() or 1


def log(msg):
    print(f"==> {msg}", flush=True)


def connect(autocommit=True):
    return psycopg.connect(**DSN, autocommit=autocommit)


def one(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


# ------------------------------------------------------------------ CPU meters

def proc_cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total / TICK


def machine_ticks():
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]  # idle + iowait
    return sum(parts[:8]), idle


def cpu_by_pid(pids):
    """{pid: CPU seconds so far} of the processes of `pids` still there."""
    return {pid: proc_cpu_seconds([pid]) for pid in pids if os.path.exists(f"/proc/{pid}")}


def our_pids():
    """The bench's processes: the cluster's (the postmaster's tree) and this driver's (its Node.js workers)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    with open(os.path.join(HOST, "data", "postmaster.pid")) as f:
        todo = [int(f.readline()), os.getpid()]
    found = []
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


# Each measurement since the last record(): (cores that processes other than the bench's kept busy, the
# load average at its end) — something else competing for this machine makes a figure doubtful.
competition = []
COMPETITION_WARN_CORES = 0.2


class CpuMeter:
    """CPU used by some processes, how busy the whole machine was, and how much of that was not the bench's."""

    def __init__(self, pids):
        self.pids = list(pids)
        self.proc0 = proc_cpu_seconds(self.pids)
        self.ours0 = cpu_by_pid(our_pids())
        self.total0, self.idle0 = machine_ticks()
        self.t0 = time.monotonic()

    def stop(self):
        wall = time.monotonic() - self.t0
        total1, idle1 = machine_ticks()
        total, idle = total1 - self.total0, idle1 - self.idle0
        ours = sum(cpu - self.ours0.get(pid, 0.0) for pid, cpu in cpu_by_pid(our_pids()).items())
        others = max(0.0, (total - idle) / TICK - ours)
        competition.append((others / wall if wall > 0 else 0.0, float(loadavg())))
        return {
            "proc_cpu_s": proc_cpu_seconds(self.pids) - self.proc0,
            "wall_s": wall,
            "machine_cores_busy": NPROC * (total - idle) / total if total > 0 else 0.0,
            "machine_cpu_s": (total - idle) / TICK,
        }


# ------------------------------------------------------------------ helpers

def quiesce(conn):
    """Same starting line for every workload: tables vacuumed, no checkpoint pending."""
    conn.execute("VACUUM ANALYZE")
    conn.execute("CHECKPOINT")


def executor_pids(conn):
    # pg_stat_activity rather than gd.workers: the figures should not depend on the engine's own view.
    return [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'gen_durable executor'"
        "   AND datname = 'bench'").fetchall()]


def wait_settled(conn, fsm, n, deadline):
    """Poll (cheaply, every 200 ms) until n instances of fsm are terminal or the deadline passes."""
    while True:
        done, failed = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'),"
            "       count(*) FILTER (WHERE status IN ('failed', 'cancelled'))"
            "  FROM gd.instances WHERE fsm = %s", (fsm,)).fetchone()
        if done + failed >= n or time.monotonic() > deadline:
            return done, failed
        time.sleep(0.2)


def executor_picks(conn):
    """Executor rounds so far (the engine's pick counter; gd._execute calls count too)."""
    return int(one(conn, "SELECT count FROM gd.stats WHERE event = 'pick'"))


def next_xid(conn):
    """The next transaction id to be assigned (reading it assigns none)."""
    return int(one(conn, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))


def next_multixact(conn):
    """pg_control's next MultiXactId, as of a checkpoint we force now."""
    conn.execute("CHECKPOINT")
    return int(one(conn, "SELECT next_multixact_id::text::bigint FROM pg_control_checkpoint()"))


def wal_lsn(conn):
    return one(conn, "SELECT pg_current_wal_insert_lsn()")


def wal_bytes_since(conn, lsn0):
    return int(one(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (str(lsn0),)))


def pct(sorted_values, p):
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


# ------------------------------------------------------------------ workloads

def warm_up(admin):
    """Wait for the engine to serve `bench`, and run a few steps so plans and caches are warm."""
    deadline = time.monotonic() + 30
    while len(executor_pids(admin)) < 2:
        if time.monotonic() > deadline:
            raise SystemExit("bench: the engine has not started 2 executors for database bench in 30 s "
                             "(see pg_stat_activity and the server log)")
        time.sleep(0.2)
    n = 200
    admin.execute("SELECT count(gd_insert('w2', jsonb_build_object('warm', g))) FROM generate_series(1, %s) g", (n,))
    done, failed = wait_settled(admin, "w2", n, time.monotonic() + 30)
    if done + failed < n:
        raise SystemExit(f"bench: warm-up: only {done + failed} of {n} instances settled in 30 s; "
                         "the engine is not running steps")
    log(f"engine serving: {len(executor_pids(admin))} executors, warm-up {done} done / {failed} failed")


def wait_ledger(conn, ledger, n, deadline, where="true"):
    """Poll (every 100 ms) a ledger's row count until it reaches n or the deadline passes.
    The ledger is small, unlike gd.instances with W5's backlog in it."""
    while True:
        got = one(conn, f"SELECT count(*) FROM {ledger} WHERE {where}")
        if got >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def gd_throughput(admin, fsm, n, steps_per_instance, ledger, before=None):
    """Insert n instances in one transaction; time from its commit to the last ledger row
    (written by the last step, in the transaction that finishes its instance).
    before(): called once the server is quiet, just before the insert (W6 opens its horizon there)."""
    admin.execute(f"TRUNCATE {ledger}")
    quiesce(admin)
    multi0 = next_multixact(admin)
    if before:
        before()
    pids = executor_pids(admin)
    inserter = connect(autocommit=False)
    t = time.monotonic()
    # One call for the lot, as the peers' bulk APIs (pg-boss insert, graphile-worker addJobs).
    if POLICY_OPTION:
        inserter.execute("SELECT count(*) FROM gd_insert_all(%s, (SELECT jsonb_agg(jsonb_build_object("
                         "'state', jsonb_build_object('n', g), %s::text, 'bench:' || g %% %s)) FROM generate_series(1, %s) g))",
                         (fsm, POLICY_OPTION, POLICY_KEYS, n))
    else:
        inserter.execute("SELECT count(*) FROM gd_insert_all(%s, (SELECT jsonb_agg(jsonb_build_object("
                         "'state', jsonb_build_object('n', g))) FROM generate_series(1, %s) g))", (fsm, n))
    insert_s = time.monotonic() - t
    lsn0 = wal_lsn(inserter)
    picks0 = executor_picks(admin)
    cpu = CpuMeter(pids)
    t = time.monotonic()
    inserter.commit()
    commit_s = time.monotonic() - t
    inserter.close()
    t0 = one(admin, "SELECT clock_timestamp()")  # queued: committed (as the peers are timed, peers.js)

    wait_ledger(admin, ledger, n, time.monotonic() + TIMEOUT)
    usage = cpu.stop()
    wal = wal_bytes_since(admin, lsn0)
    rounds = executor_picks(admin) - picks0  # a round's pick, with rows or not
    last, ledger_rows = admin.execute(f"SELECT max(at), count(*) FROM {ledger}").fetchone()
    done, failed = admin.execute(
        "SELECT count(*) FILTER (WHERE status = 'done'),"
        "       count(*) FILTER (WHERE status IN ('failed', 'cancelled'))"
        "  FROM gd.instances WHERE fsm = %s AND status IN ('done', 'failed', 'cancelled')", (fsm,)).fetchone()
    multis = next_multixact(admin) - multi0
    complete = done + failed >= n
    if last is None:
        elapsed = usage["wall_s"]
    elif complete:
        elapsed = (last - t0).total_seconds()
    else:  # timed out: rate over what finished, up to the deadline
        elapsed = usage["wall_s"]
    return {
        "instances": n, "done": done, "failed": failed, "complete": complete,
        "elapsed_s": elapsed, "client_wall_s": usage["wall_s"],
        "instances_per_s": (done + failed) / elapsed if elapsed > 0 else 0.0,
        "steps_per_s": (done + failed) * steps_per_instance / elapsed if elapsed > 0 else 0.0,
        "insert_s": insert_s, "insert_per_s": n / insert_s, "commit_s": commit_s,
        "ledger_rows": ledger_rows, "ledger_ok": ledger_rows == n,
        "rounds": max(rounds, 1),
        "wal_bytes_per_instance": wal / max(done + failed, 1),
        "executor_cpu_s": usage["proc_cpu_s"], "executors": len(pids),
        "cpu_us_per_step": 1e6 * usage["proc_cpu_s"] / max((done + failed) * steps_per_instance, 1),
        "machine_cpu_us_per_job": 1e6 * usage["machine_cpu_s"] / max(done + failed, 1),
        "multixacts_per_step": multis / max((done + failed) * steps_per_instance, 1),
        "machine_cores_busy": usage["machine_cores_busy"],
    }


def wb_batch_steps(admin):
    """WB: W1's work (one ledger row per instance) as a single step and as a batch step (batch =>
    BENCH_BATCH, one call and one multi-row INSERT per batch), BENCH_JOBS instances each, WB_RUNS runs of
    each kind alternating; the medians.  In-database only."""
    admin.execute("SELECT gd_define_step('wb', 'only', handler => 'bench.batch_step(jsonb[], gd.context[])'"
                  "::regprocedure, batch => %s)", (BATCH,))
    log(f"WB: {N_JOBS:,} one-step instances, single step (W1's) against a batch step of {BATCH}, "
        f"{WB_RUNS} runs each, alternating")
    runs = {"single": [], "batch": []}
    for _ in range(WB_RUNS):
        for kind, fsm in (("single", "w1"), ("batch", "wb")):
            reset(admin)
            r = gd_throughput(admin, fsm, N_JOBS, 1, "bench.w1_ledger")
            runs[kind].append(r)
            log(f"    {kind}: {r['instances_per_s']:,.0f} instances/s, {r['cpu_us_per_step']:.1f} us executor CPU "
                f"per instance, {r['wal_bytes_per_instance']:.0f} WAL bytes per instance"
                + ("" if r["complete"] and r["ledger_ok"] else " (INCOMPLETE)"))
    out = {"batch": BATCH, "jobs": N_JOBS, "runs": runs}
    for kind in runs:
        out[kind] = {key: statistics.median(r[key] for r in runs[kind])
                     for key in ("instances_per_s", "cpu_us_per_step", "wal_bytes_per_instance",
                                 "machine_cpu_us_per_job")}
    single, batch = out["single"], out["batch"]
    log(f"WB medians: single {single['instances_per_s']:,.0f}/s, {single['cpu_us_per_step']:.1f} us CPU, "
        f"{single['wal_bytes_per_instance']:.0f} B WAL per instance; batch of {BATCH} "
        f"{batch['instances_per_s']:,.0f}/s, {batch['cpu_us_per_step']:.1f} us CPU, "
        f"{batch['wal_bytes_per_instance']:.0f} B WAL per instance "
        f"({single['cpu_us_per_step'] / max(batch['cpu_us_per_step'], 1e-9):.2f}x less CPU per instance)")
    return out


def run_sessions(calls):
    """Run each (sql, params) of calls in its own session, all released at once; returns their CpuMeter
    usage.  A session still running after TIMEOUT is left behind (the run is then incomplete)."""
    sessions = [connect() for _ in calls]
    errors = []
    gate = threading.Barrier(len(calls) + 1)

    def work(conn, sql, params):
        try:
            gate.wait()
            conn.execute(sql, params)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(conn, sql, params)) for conn, (sql, params) in zip(sessions, calls)]
    for th in threads:
        th.start()
    cpu = CpuMeter([conn.info.backend_pid for conn in sessions])
    gate.wait()
    for th in threads:
        th.join(TIMEOUT)
    usage = cpu.stop()
    if not any(th.is_alive() for th in threads):
        for conn in sessions:
            conn.close()
    if errors:
        raise SystemExit(f"bench: a session failed: {errors[0]}")
    return usage


def work_ceiling(admin, n):
    """W1's work alone, no queue: FLOOR_WORKERS sessions split n ledger INSERTs, one commit each.
    No queue running W1 here can pass this rate."""
    admin.execute("TRUNCATE bench.ceiling_ledger, bench.floor_runs")
    quiesce(admin)
    share = -(-n // FLOOR_WORKERS)
    usage = run_sessions([("CALL bench.ceiling_worker(%s, %s)", (1 + k * share, min(share, n - k * share)))
                                 for k in range(FLOOR_WORKERS)])
    rows, t0, last = admin.execute(
        "SELECT (SELECT count(*) FROM bench.ceiling_ledger), (SELECT min(started_at) FROM bench.floor_runs),"
        "       (SELECT max(at) FROM bench.ceiling_ledger)").fetchone()
    elapsed = (last - t0).total_seconds() if rows == n else usage["wall_s"]
    return {"jobs": n, "rows": rows, "complete": rows == n, "elapsed_s": elapsed,
            "per_s": rows / elapsed if elapsed > 0 else 0.0,
            "cpu_us_per_job": 1e6 * usage["proc_cpu_s"] / max(rows, 1),
            "machine_cores_busy": usage["machine_cores_busy"]}


def floor_throughput(admin, n, mode="plain", backlog=0, before=None):
    """The hand-written SKIP LOCKED queue: FLOOR_WORKERS sessions CALL bench.floor_worker at once.
    mode 'plain' is the floor; the others are diagnostics (see setup.sql).  backlog: that many
    rows already waiting (status 'waiting', which the floor's partial index leaves out)."""
    admin.execute("TRUNCATE bench.floor_jobs, bench.floor_ledger, bench.floor_runs")
    if backlog:
        admin.execute("INSERT INTO bench.floor_jobs (status, payload) SELECT 'waiting', jsonb_build_object('n', -g)"
                      "  FROM generate_series(1, %s) g", (backlog,))
    quiesce(admin)
    if before:
        before()
    t = time.monotonic()
    admin.execute("INSERT INTO bench.floor_jobs (payload) SELECT jsonb_build_object('n', g)"
                  "  FROM generate_series(1, %s) g", (n,))
    insert_s = time.monotonic() - t
    multi0 = next_multixact(admin)
    lsn0 = wal_lsn(admin)
    xid0 = next_xid(admin)
    usage = run_sessions([("CALL bench.floor_worker(%s, %s)", (FLOOR_BATCH, mode))] * FLOOR_WORKERS)
    wal = wal_bytes_since(admin, lsn0)
    commits = next_xid(admin) - xid0
    t0 = one(admin, "SELECT min(started_at) FROM bench.floor_runs")
    done, last = admin.execute(
        "SELECT count(*), max(updated_at) FROM bench.floor_jobs WHERE status = 'done'").fetchone()
    ledger_rows = one(admin, "SELECT count(*) FROM bench.floor_ledger")
    multis = next_multixact(admin) - multi0
    complete = done >= n
    elapsed = (last - t0).total_seconds() if (complete and last) else usage["wall_s"]
    return {
        "mode": mode, "jobs": n, "done": done, "complete": complete, "elapsed_s": elapsed,
        "client_wall_s": usage["wall_s"], "jobs_per_s": done / elapsed if elapsed > 0 else 0.0,
        "insert_s": insert_s, "insert_per_s": n / insert_s,
        "ledger_rows": ledger_rows, "ledger_ok": ledger_rows == n, "commits": commits,
        "wal_bytes_per_job": wal / max(done, 1),
        "worker_cpu_s": usage["proc_cpu_s"], "cpu_us_per_job": 1e6 * usage["proc_cpu_s"] / max(done, 1),
        "machine_cpu_us_per_job": 1e6 * usage["machine_cpu_s"] / max(done, 1),
        "multixacts_per_job": multis / max(done, 1), "machine_cores_busy": usage["machine_cores_busy"],
    }


def latency(admin, n):
    """W2: gd_insert (autocommit) then gd_await, one client; plus a bare autocommit INSERT for reference."""
    quiesce(admin)
    conn = connect()
    cur = conn.cursor()
    # Warm the connection (and psycopg's auto-prepared statements) first.
    for i in range(20):
        new_id = cur.execute("SELECT gd_insert('w2', %s::jsonb)", (json.dumps({"warm": i}),)).fetchone()[0]
        cur.execute("SELECT status FROM gd_await(%s, '5s')", (new_id,)).fetchone()
        cur.execute("INSERT INTO bench.commit_probe (job_id) VALUES (%s)", (i,))

    totals, inserts, statuses = [], [], {}
    started = time.monotonic()
    for i in range(n):
        t0 = time.monotonic()
        new_id = cur.execute("SELECT gd_insert('w2', %s::jsonb)", (json.dumps({"n": i}),)).fetchone()[0]
        t1 = time.monotonic()
        status = cur.execute("SELECT status FROM gd_await(%s, '5s')", (new_id,)).fetchone()[0]
        t2 = time.monotonic()
        totals.append((t2 - t0) * 1000)
        inserts.append((t1 - t0) * 1000)
        statuses[status] = statuses.get(status, 0) + 1
        if t2 - started > LATENCY_BUDGET_S:
            break

    probes = []
    for i in range(n):
        t0 = time.monotonic()
        cur.execute("INSERT INTO bench.commit_probe (job_id) VALUES (%s)", (i,))
        probes.append((time.monotonic() - t0) * 1000)
    conn.close()

    def summary(values):
        s = sorted(values)
        return {"n": len(s), "p50": pct(s, 50), "p90": pct(s, 90), "p99": pct(s, 99),
                "max": s[-1] if s else float("nan"), "mean": statistics.fmean(s) if s else float("nan")}

    head = sorted(totals[:100])
    tail = sorted(totals[-100:])
    return {"insert_await_ms": summary(totals), "insert_only_ms": summary(inserts),
            "first100_p50": pct(head, 50), "last100_p50": pct(tail, 50),
            "statuses": statuses, "commit_probe_ms": summary(probes),
            "stopped_early": len(totals) < n}


# ------------------------------------------------------------------ the peers
#
# graphile-worker, pg-boss, PgQ and gen_durable's external-worker path run
# through test/bench/node/peers.js (one process per workload and system, its
# workers in Node.js); gen_durable's in-database path and the floor run here.

def summary(values):
    s = sorted(values)
    return {"n": len(s), "p50": pct(s, 50), "p90": pct(s, 90), "p99": pct(s, 99),
            "max": s[-1] if s else float("nan"), "mean": statistics.fmean(s) if s else float("nan")}


def reset(admin):
    """Same starting line for every run: no rows left by earlier runs in any queue
    (nothing is live between runs), the ledgers empty."""
    admin.execute("TRUNCATE bench.peer_ledger, bench.peer_fanout, bench.w4_ledger")
    live = one(admin, "SELECT count(*) FROM gd.instances WHERE status NOT IN ('done', 'failed', 'cancelled')"
                      "   AND eligible_at <= now() + interval '1 hour'")
    if live:
        log(f"    (warning: {live} live gen_durable instances left by the previous run)")
    admin.execute("TRUNCATE gd._instances, gd._signals")
    if one(admin, "SELECT to_regclass('pgboss.job') IS NOT NULL"):
        admin.execute("TRUNCATE pgboss.job, pgboss.archive")
    if one(admin, "SELECT to_regclass('graphile_worker._private_jobs') IS NOT NULL"):
        admin.execute("DELETE FROM graphile_worker._private_jobs")


def pids_of(admin, system):
    if system == "gd":
        return executor_pids(admin)
    return [r[0] for r in admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s", (f"bench {system}%",)).fetchall()]


class NodeRun:
    """test/bench/node/peers.js SYSTEM WORKLOAD N, driven through its stdin/stdout protocol."""

    def __init__(self, system, workload, n, extra_env=None):
        env = dict(os.environ, BENCH_HOST=HOST, BENCH_PORT=str(PORT), NODE_PATH=NODE_MODULES,
                   BENCH_TIMEOUT=str(int(TIMEOUT)), BENCH_W2_BUDGET=str(int(LATENCY_BUDGET_S)), **(extra_env or {}))
        self.what = f"{system} {workload}"
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([NODE, PEERS_JS, system, workload, str(n)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True, env=env)

    def fail(self, why):
        self.proc.kill()
        self.err.seek(0)
        raise SystemExit(f"bench: peers.js {self.what}: {why}\n{self.err.read()[-3000:]}")

    def read(self):
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                self.fail(f"exited ({self.proc.returncode}) without an answer")
            if line.startswith("{"):
                return json.loads(line)

    def send(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def finish(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            rc = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.fail("did not stop in 120 s")
        if rc != 0:
            self.fail(f"exited {rc}")


def node_setup(system):
    run = NodeRun(system, "setup", 0)
    run.read()
    run.finish()


def node_throughput(admin, system, workload, n, before=None):
    """W1/W3/W4 through peers.js: its workers start idle; n jobs (W4: one parent with n
    children) are enqueued in one call; timed from that call's return (server clock) to
    the last ledger row (W4: the final job's)."""
    admin.execute("TRUNCATE bench.peer_ledger, bench.peer_fanout")
    quiesce(admin)
    if before:
        before()
    run = NodeRun(system, workload, n)
    ready = run.read()
    pids0 = pids_of(admin, system)
    cpu_backends0 = {p: proc_cpu_seconds([p]) for p in pids0}
    cpu = CpuMeter([run.proc.pid])
    lsn0 = wal_lsn(admin)
    run.send("go")
    res = run.read()["result"]
    usage = cpu.stop()
    pids1 = pids_of(admin, system)
    backend_cpu = sum(proc_cpu_seconds([p]) - cpu_backends0.get(p, 0.0) for p in set(pids0) | set(pids1))
    wal = wal_bytes_since(admin, lsn0)
    run.send("stop")
    run.finish()
    t0 = datetime.datetime.fromisoformat(res["enqueued_at"].replace("Z", "+00:00"))
    if workload == "w4":
        last, last_child, rows = admin.execute(
            "SELECT max(at) FILTER (WHERE job_id = -1), max(at) FILTER (WHERE job_id <> -1),"
            "       count(*) FILTER (WHERE job_id <> -1) FROM bench.peer_ledger").fetchone()
        jobs = n
    else:
        last, rows = admin.execute("SELECT max(at), count(*) FROM bench.peer_ledger").fetchone()
        last_child, jobs = None, rows
    complete = res["complete"] and rows >= n
    elapsed = (last - t0).total_seconds() if (last and complete) else usage["wall_s"]
    return {
        "system": system, "workload": workload, "jobs": n, "done": rows, "complete": complete,
        "elapsed_s": elapsed, "per_s": jobs / elapsed if elapsed > 0 else 0.0,
        "last_child_s": (last_child - t0).total_seconds() if last_child else None,
        "enqueue_s": res["enqueue_s"], "knobs": ready.get("knobs"),
        "node_cpu_s": usage["proc_cpu_s"], "backend_cpu_s": backend_cpu,
        "machine_cpu_s": usage["machine_cpu_s"], "machine_cores_busy": usage["machine_cores_busy"],
        "machine_cpu_us_per_job": 1e6 * usage["machine_cpu_s"] / max(jobs * (3 if workload == "w3" else 1), 1),
        "node_cpu_us_per_job": 1e6 * usage["proc_cpu_s"] / max(jobs, 1),
        "backend_cpu_us_per_job": 1e6 * backend_cpu / max(jobs, 1),
        "wal_bytes_per_job": wal / max(jobs, 1),
    }


def node_latency(admin, system, n, fresh=True):
    """W2 through peers.js: one job at a time on the idle system, enqueue to completion seen by the client.
    fresh=False keeps the rows already there (W5's backlog)."""
    if fresh:
        reset(admin)
    quiesce(admin)
    run = NodeRun(system, "w2", n)
    run.read()
    run.send("go")
    res = run.read()["result"]
    run.send("stop")
    run.finish()
    out = {"insert_await_ms": summary(res["latencies_ms"]), "lost": res["lost"],
           "stopped_early": res["stopped_early"]}
    return out


def gd_fanout(admin, children):
    """W4 in the database: one parent (w4_parent) spawns `children` children and joins;
    timed from the insert's commit to the join's ledger row."""
    admin.execute("TRUNCATE bench.w4_ledger")
    quiesce(admin)
    pids = executor_pids(admin)
    cpu = CpuMeter(pids)
    c = connect(autocommit=False)
    one(c, "SELECT gd_insert('w4_parent', jsonb_build_object('children', %s::int))", (children,))
    t0 = one(c, "SELECT clock_timestamp()")
    c.commit()
    c.close()
    wait_ledger(admin, "bench.w4_ledger", 1, time.monotonic() + TIMEOUT, where="job_id < 0")
    usage = cpu.stop()
    last, last_child, rows = admin.execute(
        "SELECT max(at) FILTER (WHERE job_id < 0), max(at) FILTER (WHERE job_id > 0),"
        "       count(*) FILTER (WHERE job_id > 0) FROM bench.w4_ledger").fetchone()
    complete = last is not None and rows >= children
    elapsed = (last - t0).total_seconds() if complete else usage["wall_s"]
    return {"system": "gd", "workload": "w4", "jobs": children, "done": rows, "complete": complete,
            "elapsed_s": elapsed, "per_s": children / elapsed if elapsed > 0 else 0.0,
            "last_child_s": (last_child - t0).total_seconds() if last_child else None,
            "executor_cpu_s": usage["proc_cpu_s"],
            "cpu_us_per_step": 1e6 * usage["proc_cpu_s"] / max(children + 2, 1),
            "machine_cpu_us_per_job": 1e6 * usage["machine_cpu_s"] / max(children, 1),
            "machine_cores_busy": usage["machine_cores_busy"]}


# ---- W5: a backlog already waiting

def gd_clone(admin, template_id, count, state_sql="jsonb_build_object('n', -g, 'backlog', true)", extra=None):
    """count copies of one gd.instances row (made by the API), in one INSERT: W5's backlog
    without calling gd_insert a million times (13,000/s here, it would dominate the run)."""
    cols = [r[0] for r in admin.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'gd._instances'::regclass AND attnum > 0"
        "   AND NOT attisdropped AND attidentity = '' AND attgenerated = '' ORDER BY attnum").fetchall()]
    extra = extra or {}
    exprs = [state_sql if c == "state" else extra.get(c, f"t.{c}") for c in cols]
    admin.execute(f"INSERT INTO gd._instances ({', '.join(cols)})"
                  f" SELECT {', '.join(exprs)} FROM gd.instances t, generate_series(1, %s) g WHERE t.id = %s",
                  (count, template_id))


def gd_backlog(admin, fsm, count, finished):
    """count instances of fsm waiting (eligible in a day), and `finished` done ones not yet swept."""
    t = time.monotonic()
    if finished:
        done_id = one(admin, "SELECT gd_insert('w2', '{\"backlog\": true}')")
        status = one(admin, "SELECT status FROM gd_await(%s, '30s')", (done_id,))
        if status != "done":
            raise SystemExit(f"bench: W5: the finished-row template ended {status}")
        gd_clone(admin, done_id, finished - 1)
    waiting_id = one(admin, "SELECT gd_insert(%s, '{\"backlog\": true}', schedule_in => '1 day')", (fsm,))
    gd_clone(admin, waiting_id, count - 1)
    return time.monotonic() - t


def gd_backlog_clear_waiting(admin):
    admin.execute("DELETE FROM gd._instances WHERE status = 'runnable' AND eligible_at > now() + interval '1 hour'")


def node_backlog(admin, system, count):
    t = time.monotonic()
    run = NodeRun(system, "backlog", count)
    run.read()
    run.send("go")
    run.read()
    run.finish()
    return time.monotonic() - t


def pgq_recreate(admin):
    """A fresh PgQ queue (drops the backlog and its laggard consumer)."""
    admin.execute("SELECT pgq.drop_queue('bench', true)")
    admin.execute("SELECT pgq.create_queue('bench')")
    admin.execute("SELECT pgq.set_queue_config('bench', 'ticker_max_lag', '0')")


# ---- W6: a held horizon

def queue_tables(admin, system):
    if system in ("gd", "gdext"):
        return ["gd._instances"]
    if system == "pgboss":
        return [r[0] for r in admin.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'pgboss.job'::regclass").fetchall()]
    if system == "graphile":
        return ["graphile_worker._private_jobs", "graphile_worker._private_job_queues"]
    if system == "pgq":
        parent = one(admin, "SELECT queue_data_pfx FROM pgq.queue WHERE queue_name = 'bench'")
        kids = [r[0] for r in admin.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = %s::regclass", (parent,)).fetchall()]
        return kids + ["pgq.tick", "pgq.subscription"]
    return ["bench.floor_jobs"]


def table_stats(admin, tables):
    dead = live = heap = total = 0
    for t in tables:
        d, l, h = admin.execute("SELECT dead_tuple_count, tuple_count, table_len FROM pgstattuple(%s)", (t,)).fetchone()
        dead, live, heap = dead + d, live + l, heap + h
        total += one(admin, "SELECT pg_total_relation_size(%s::regclass)", (t,))
    return {"dead_tuples": dead, "live_tuples": live, "heap_bytes": heap, "total_bytes": total}


class Horizon:
    """Another session's REPEATABLE READ transaction, open (its snapshot taken) until release()."""

    def __init__(self, admin, tables):
        self.admin, self.tables = admin, tables
        self.before = None
        self.conn = None

    def hold(self):
        self.before = table_stats(self.admin, self.tables)
        self.conn = connect(autocommit=False)
        self.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self.conn.execute("SELECT count(*) FROM bench.floor_runs")
        self.xmin = one(self.admin, "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = %s",
                        (self.conn.info.backend_pid,))

    def release(self):
        after = table_stats(self.admin, self.tables)
        self.conn.rollback()
        self.conn.close()
        return {"before": self.before, "after": after, "xmin": self.xmin}


def run_w1(admin, system, before=None, backlog=0):
    """One W1 run of a system; returns (jobs/s, the run's details)."""
    if system == "gd":
        r = gd_throughput(admin, "w1", N_JOBS, 1, "bench.w1_ledger", before=before)
        return r["instances_per_s"], r
    if system == "floor":
        r = floor_throughput(admin, N_JOBS, backlog=backlog, before=before)
        return r["jobs_per_s"], r
    r = node_throughput(admin, system, "w1", N_JOBS, before=before)
    return r["per_s"], r


def w5_backlog(admin, system):
    reset(admin)
    prep = 0.0
    if system == "gd":
        prep = gd_backlog(admin, "w1", N_BACKLOG, N_BACKLOG)
    elif system == "gdext":
        prep = gd_backlog(admin, "x1", N_BACKLOG, N_BACKLOG)
    elif system in ("pgboss", "graphile", "pgq"):
        prep = node_backlog(admin, system, N_BACKLOG)
    log(f"    {system}: backlog of {N_BACKLOG:,} ready in {prep:.1f} s")
    rate, r = run_w1(admin, system, backlog=N_BACKLOG if system == "floor" else 0)
    r = dict(r, backlog_prep_s=prep)
    if system != "floor":
        # The backlog is still waiting (due in a day): what it costs a job enqueued on an idle system.
        lat = latency(admin, N_LAT_BACKLOG) if system == "gd" else node_latency(admin, system, N_LAT_BACKLOG, fresh=False)
        r["latency_ms"] = lat["insert_await_ms"]
        log(f"    {LABELS[system]}: with the backlog waiting, W2 p50 {r['latency_ms']['p50']:.2f} ms,"
            f" p99 {r['latency_ms']['p99']:.2f} ms")
    if system == "pgq":
        pgq_recreate(admin)
    reset(admin)
    return rate, r


def w6_horizon(admin, system):
    reset(admin)
    tables = queue_tables(admin, system)
    h = Horizon(admin, tables)
    bloat = None
    try:
        rate, r = run_w1(admin, system, before=h.hold)
    finally:
        if h.conn is not None:
            bloat = h.release()
    r = dict(r, horizon=bloat, tables=tables)
    if system == "pgq":
        pgq_recreate(admin)
    reset(admin)
    return rate, r


def fair_trickle(stop, inserted):
    """W11's tenant B: a job every 1/FAIR_RATE s, each in its own transaction, until `stop` is set."""
    conn = connect()
    conn.execute("SET ROLE bench_tenant_b")
    period, due = 1.0 / FAIR_RATE, time.monotonic()
    while not stop.is_set():
        conn.execute("SELECT gd_insert('fair_b')")
        inserted.append(1)
        due += period
        time.sleep(max(0.0, due - time.monotonic()))
    conn.close()


def fair_flood(admin):
    """W11's tenant A: N_FAIR_FLOOD jobs in one transaction; its jobs/s from the commit to its last completion."""
    conn = connect(autocommit=False)
    conn.execute("SET ROLE bench_tenant_a")
    conn.execute("SELECT count(*) FROM gd_insert_all('fair_a', (SELECT jsonb_agg(jsonb_build_object("
                 "'state', jsonb_build_object('n', g))) FROM generate_series(1, %s) g))", (N_FAIR_FLOOD,))
    conn.commit()
    conn.close()
    t0 = one(admin, "SELECT clock_timestamp()")
    done = wait_ledger(admin, "bench.fair_ledger", N_FAIR_FLOOD, time.monotonic() + TIMEOUT, "tenant = 'fair_a'")
    last = one(admin, "SELECT max(at) FROM bench.fair_ledger WHERE tenant = 'fair_a'")
    elapsed = (last - t0).total_seconds() if last else float("nan")
    return {"jobs": done, "complete": done >= N_FAIR_FLOOD, "elapsed_s": elapsed,
            "jobs_per_s": done / elapsed if elapsed and elapsed > 0 else 0.0}


def fair_b_latency(admin):
    """Tenant B's jobs, insert to completion (created_at, its insert's transaction, to finished_at), in ms."""
    rows = admin.execute("SELECT (extract(epoch FROM finished_at - created_at) * 1000)::float8 FROM gd.instances"
                         " WHERE fsm = 'fair_b' AND status = 'done'").fetchall()
    return summary([r[0] for r in rows])


def w11_fair_share(admin):
    """W11: tenant B's latency and tenant A's throughput, each alone, then B's trickle through A's flood on the
    same queue (docs/performance.md: B's p99 within 2x of B alone, A's jobs/s within 10% of A alone)."""
    def scenario(with_flood, with_trickle):
        reset(admin)
        admin.execute("TRUNCATE bench.fair_ledger")
        quiesce(admin)
        stop, inserted = threading.Event(), []
        trickle = threading.Thread(target=fair_trickle, args=(stop, inserted))
        if with_trickle:
            trickle.start()
        flood = fair_flood(admin) if with_flood else None
        if with_trickle:
            if not with_flood:
                time.sleep(FAIR_SECONDS)
            stop.set()
            trickle.join()
            wait_ledger(admin, "bench.fair_ledger", len(inserted), time.monotonic() + TIMEOUT, "tenant = 'fair_b'")
        return {"flood": flood, "b_ms": fair_b_latency(admin) if with_trickle else None}

    log(f"W11: tenant B alone ({FAIR_RATE:.0f} jobs/s for {FAIR_SECONDS:.0f} s)")
    b_alone = scenario(False, True)["b_ms"]
    log(f"    B p50 {b_alone['p50']:.1f} ms, p99 {b_alone['p99']:.1f} ms over {b_alone['n']}")
    log(f"W11: tenant A alone ({N_FAIR_FLOOD:,} jobs at once)")
    a_alone = scenario(True, False)["flood"]
    log(f"    A {a_alone['jobs_per_s']:,.0f} jobs/s")
    log("W11: tenant B's trickle through tenant A's flood, one queue")
    both = scenario(True, True)
    log(f"    A {both['flood']['jobs_per_s']:,.0f} jobs/s; B p50 {both['b_ms']['p50']:.1f} ms,"
        f" p99 {both['b_ms']['p99']:.1f} ms over {both['b_ms']['n']}")
    return {"b_alone_ms": b_alone, "a_alone": a_alone, "a_with_b": both["flood"], "b_with_a_ms": both["b_ms"],
            "b_p99_ratio": both["b_ms"]["p99"] / b_alone["p99"] if b_alone["p99"] else None,
            "a_ratio": both["flood"]["jobs_per_s"] / a_alone["jobs_per_s"] if a_alone["jobs_per_s"] else None}


def w8_growth():
    """W8: W1 and W2 of gen_durable (in-db, and external when measured) with 0, 1,000,000 and
    10,000,000 finished instances not yet swept (BENCH_W8_SIZES) plus 1,000,000 scheduled in each
    path's queue (BENCH_W8_SCHEDULED): what one step costs as the table grows."""
    sizes = [int(x) for x in os.environ.get("BENCH_W8_SIZES", "0,1000000,10000000").split(",")]
    scheduled = int(os.environ.get("BENCH_W8_SCHEDULED", "1000000"))
    paths = [s for s in ("gd", "gdext") if s in SYSTEMS]
    admin = connect()
    reset(admin)
    t = time.monotonic()
    for s in paths:
        waiting_id = one(admin, "SELECT gd_insert(%s, '{\"backlog\": true}', schedule_in => '1 day')",
                         ("w1" if s == "gd" else "x1",))
        gd_clone(admin, waiting_id, scheduled - 1)
    finished_template = one(admin, "SELECT gd_insert('w2', '{\"backlog\": true}')")
    if one(admin, "SELECT status FROM gd_await(%s, '30s')", (finished_template,)) != "done":
        raise SystemExit("bench: W8: the finished-row template did not finish")
    log(f"    {scheduled:,} scheduled per path ready in {time.monotonic() - t:.0f} s")
    finished = 1
    out = []
    for size in sizes:
        if size > finished:
            t = time.monotonic()
            gd_clone(admin, finished_template, size - finished)
            finished = size
            log(f"    {size:,} finished rows ready ({time.monotonic() - t:.0f} s)")
        row = {"finished": size, "scheduled": scheduled,
               "table_mib": one(admin, "SELECT pg_total_relation_size('gd._instances')") / 2**20}
        for s in paths:
            # Each W1 counts its own instances: the previous run's are deleted (not the finished backlog).
            admin.execute("DELETE FROM gd._instances WHERE fsm IN ('w1', 'x1') AND status = 'done'")
            if s == "gd":
                r = gd_throughput(admin, "w1", N_JOBS, 1, "bench.w1_ledger")
                row[s] = {"w1_per_s": r["instances_per_s"], "cpu_us_per_step": r["cpu_us_per_step"],
                          "w2_ms": latency(admin, N_LAT)["insert_await_ms"]}
            else:
                r = node_throughput(admin, s, "w1", N_JOBS)
                row[s] = {"w1_per_s": r["per_s"], "w2_ms": node_latency(admin, s, N_LAT, fresh=False)["insert_await_ms"]}
            log(f"    {LABELS[s]}, {size:,} finished: W1 {row[s]['w1_per_s']:,.0f} jobs/s, W2 p50"
                f" {row[s]['w2_ms']['p50']:.2f} ms p99 {row[s]['w2_ms']['p99']:.2f} ms ({row['table_mib']:,.0f} MiB)")
        out.append(row)
    reset(admin)
    admin.close()
    return out


def w7_horizon_for_minutes(res):
    """W7 (test/bench/w7.py) for every system but the floor, at one rate all of them sustain."""
    import w7
    measured = [r[0] for s, r in res.get("w1", {}).items() if s != "floor" and s in IN_BENCH_DATABASE]
    rate = float(os.environ.get("BENCH_W7_RATE") or (0.6 * min(measured) if measured else 1000))
    clean, middle, recovery = w7.phases()
    log(f"W7: {rate:,.0f} jobs/s for {clean}+{middle}+{recovery} s per scenario and system: the horizon held"
        f" (an XID idle in transaction and {w7.READERS} REPEATABLE READ readers), then 1.5x the rate")
    env = dict(os.environ, BENCH_HOST=HOST, BENCH_PORT=str(PORT), NODE_PATH=NODE_MODULES)
    out = {}
    admin = connect()
    # Finished instances are swept after a minute here (the default keeps them a day), as graphile-worker
    # deletes a job at completion: the queue tables' size is then the dead rows', not the history's.
    admin.execute("ALTER SYSTEM SET gen_durable.retention = '60s'")
    admin.execute("ALTER SYSTEM SET gen_durable.gc_interval = '10s'")
    admin.execute("SELECT pg_reload_conf()")
    for s in SYSTEMS:
        if s == "floor" or s not in IN_BENCH_DATABASE:
            continue
        for scenario in w7.scenarios():
            reset(admin)
            quiesce(admin)
            log(f"    {LABELS[s]}, {scenario}:")
            system = (w7.GdInDatabase(connect) if s == "gd"
                      else w7.NodeSystem(s, queue_tables(admin, s), [NODE, PEERS_JS], env))
            try:
                out.setdefault(s, {})[scenario] = w7.run_scenario(system, scenario, rate, connect, log)
            finally:
                system.close()
    admin.execute("ALTER SYSTEM RESET gen_durable.retention")
    admin.execute("ALTER SYSTEM RESET gen_durable.gc_interval")
    admin.execute("SELECT pg_reload_conf()")
    admin.close()
    w7.print_summary(w7.summarize({LABELS[s]: per for s, per in out.items()}), log)
    plot = os.environ.get("BENCH_W7_PLOT")
    if plot:
        w7.plot({LABELS[s]: per for s, per in out.items()}, plot)
        log(f"W7 plot: {plot}")
    return out


# ------------------------------------------------------------------ report

W10_VARIANTS = (("gdext", "gen_durable ext, claims wait", {"BENCH_GDEXT_NOTIFY": "0"}),
                 ("gdext", "gen_durable ext, wait, PgBouncer", {"BENCH_GDEXT_NOTIFY": "0", "via_pgbouncer": True}),
                 ("gdext", "gen_durable ext, NOTIFY", {"BENCH_GDEXT_NOTIFY": "1"}),
                 ("graphile", "graphile-worker (NOTIFY)", {}),
                 ("pgboss", "pg-boss (polling)", {}))
PGBOUNCER = "/usr/sbin/pgbouncer"


class PgBouncer:
    """Debian's PgBouncer in transaction mode in front of the bench database (as the postgres user:
    it refuses root), a server connection per client up to `pool_size`."""

    def __init__(self, pool_size):
        self.dir = tempfile.mkdtemp(prefix="gd_bench_pgbouncer.")
        self.port = int(PORT) + 1000
        with open(os.path.join(self.dir, "userlist.txt"), "w") as f:
            f.write('"postgres" ""\n')
        with open(os.path.join(self.dir, "pgbouncer.ini"), "w") as f:
            f.write("\n".join([
                "[databases]", f"bench = host={HOST} port={PORT} dbname=bench",
                "[pgbouncer]", "listen_addr = 127.0.0.1", f"listen_port = {self.port}",
                f"unix_socket_dir = {self.dir}", "auth_type = trust",
                f"auth_file = {self.dir}/userlist.txt", "pool_mode = transaction",
                f"default_pool_size = {pool_size}", "max_client_conn = 200",
                f"logfile = {self.dir}/pgbouncer.log", f"pidfile = {self.dir}/pgbouncer.pid", ""]))
        subprocess.run(["chown", "-R", "postgres", self.dir], check=True)
        command = [PGBOUNCER, os.path.join(self.dir, "pgbouncer.ini")]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--"] + command
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                psycopg.connect(host="127.0.0.1", port=self.port, dbname="bench", user="postgres").close()
                return
            except psycopg.OperationalError:
                time.sleep(0.1)
        self.close()
        raise SystemExit(f"bench: PgBouncer did not start (see {self.dir}/pgbouncer.log)")

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def w10_producers(admin):
    """W10: BENCH_W10_PRODUCERS (16) producers, each committing one job per transaction with the
    system's single-job API for BENCH_W10_SECONDS (60): completions per second while they produce,
    their commit latency, and how long after they stop the last job is done."""
    seconds = int(os.environ.get("BENCH_W10_SECONDS", "60"))
    log(f"W10: {os.environ.get('BENCH_W10_PRODUCERS', '16')} producers, one job per transaction, {seconds} s")
    out = {}
    for system, label, extra in W10_VARIANTS:
        if system not in SYSTEMS:
            continue
        reset(admin)
        quiesce(admin)
        extra = dict(extra)
        bouncer = None
        if extra.pop("via_pgbouncer", False):
            bouncer = PgBouncer(pool_size=int(os.environ.get("BENCH_GDEXT_LANES", "4")) + 2)
            extra.update(BENCH_GDEXT_WORKER_HOST="127.0.0.1", BENCH_GDEXT_WORKER_PORT=str(bouncer.port))
        try:
            run = NodeRun(system, "producers", seconds, extra)
            run.read()
            run.send("go")
            res = run.read()["result"]
            run.send("stop")
            run.finish()
        finally:
            if bouncer:
                bouncer.close()
        end = datetime.datetime.fromisoformat(res["started_at"].replace("Z", "+00:00")) + \
            datetime.timedelta(seconds=seconds)
        in_window, last = admin.execute("SELECT count(*) FILTER (WHERE at <= %s), max(at) FROM bench.peer_ledger",
                                        [end]).fetchone()
        commit = summary(res["commit_ms"])
        out[label] = {"produced": res["produced"], "done": res["ledger"], "produced_per_s": res["produced"] / seconds,
                      "completed_per_s": in_window / seconds, "commit_p50_ms": commit["p50"],
                      "commit_p99_ms": commit["p99"],
                      "last_done_after_s": (last - end).total_seconds() if last else None}
        r = out[label]
        log(f"    {label:33} produced {r['produced_per_s']:8,.0f}/s  completed {r['completed_per_s']:8,.0f}/s"
            f"  commit p50 {r['commit_p50_ms']:6.2f} p99 {r['commit_p99_ms']:7.2f} ms"
            f"  last done {r['last_done_after_s'] if r['last_done_after_s'] is not None else float('nan'):5.2f} s after"
            f"  ({r['done']:,} of {r['produced']:,} done)")
    return out


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def machine_info(admin):
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    settings = dict(admin.execute(
        "SELECT name, current_setting(name) FROM pg_settings WHERE name IN"
        " ('shared_buffers', 'fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes',"
        "  'max_worker_processes', 'gen_durable.queues', 'gen_durable.batch_size',"
        "  'gen_durable.poll_interval')").fetchall())
    return {
        "nproc": NPROC, "cpu_model": model, "kernel": platform.release(),
        "pg_version": one(admin, "SELECT version()"),
        "data_fs": os.environ.get("BENCH_DATA_FS", "?"),
        "engine_commit": os.environ.get("BENCH_ENGINE_COMMIT", "?"),
        "settings": settings, "loadavg_start": loadavg(),
    }


def fmt_ratio(x, floor):
    return f"{x / floor:.2f}x" if floor > 0 else "-"


def report(info, w1, fl, w3, w2, diags):
    print()
    print("=" * 96)
    print("gen_durable benchmark")
    print("=" * 96)
    print(f"machine   : {info['nproc']} cores, {info['cpu_model']}, Linux {info['kernel']}")
    print(f"postgres  : {info['pg_version']}")
    s = info["settings"]
    print(f"settings  : shared_buffers={s.get('shared_buffers')} fsync={s.get('fsync')} "
          f"synchronous_commit={s.get('synchronous_commit')} wal_sync_method={s.get('wal_sync_method')} "
          f"full_page_writes={s.get('full_page_writes')}")
    print(f"            gen_durable.queues='{s.get('gen_durable.queues')}' "
          f"batch_size={s.get('gen_durable.batch_size')} poll_interval={s.get('gen_durable.poll_interval')} "
          f"max_worker_processes={s.get('max_worker_processes')}; data dir on {info['data_fs']}")
    print(f"engine    : {info['engine_commit']}")
    print()

    floor = fl["jobs_per_s"]
    rows = []

    def flag(r):
        return "" if r["complete"] else "  INCOMPLETE"

    rows.append((f"W1 gen_durable 1-step x{w1['instances']}",
                 f"{w1['instances_per_s']:,.0f} jobs/s{flag(w1)}", fmt_ratio(w1["instances_per_s"], floor)))
    rows.append((f"floor SKIP LOCKED queue x{fl['jobs']} ({FLOOR_WORKERS} workers, batch {FLOOR_BATCH})",
                 f"{floor:,.0f} jobs/s{flag(fl)}", "1.00x"))
    labels = {"subxact_all": "   diag: floor + subxact per job (INSERT+UPDATE in it)",
              "subxact_handler": "   diag: floor + subxact per job (INSERT only in it)"}
    for d in diags:
        rows.append((labels[d["mode"]], f"{d['jobs_per_s']:,.0f} jobs/s{flag(d)}", fmt_ratio(d["jobs_per_s"], floor)))
    rows.append((f"W3 gen_durable 3-step x{w3['instances']}",
                 f"{w3['steps_per_s']:,.0f} steps/s, {w3['instances_per_s']:,.0f} inst/s{flag(w3)}",
                 f"{fmt_ratio(w3['steps_per_s'], floor)} (steps vs floor jobs)"))
    lat = w2["insert_await_ms"]
    probe = w2["commit_probe_ms"]
    rows.append((f"W2 gd_insert+gd_await latency x{lat['n']}",
                 f"p50 {lat['p50']:.2f} / p90 {lat['p90']:.2f} / p99 {lat['p99']:.2f} ms",
                 f"{lat['p50'] / probe['p50']:.1f}x commit (p50)" if probe["p50"] > 0 else "-"))
    rows.append((f"   ref: autocommit INSERT x{probe['n']} (one commit)",
                 f"p50 {probe['p50']:.2f} / p90 {probe['p90']:.2f} / p99 {probe['p99']:.2f} ms", ""))
    w_a = max(len(r[0]) for r in rows)
    w_b = max(len(r[1]) for r in rows)
    print(f"{'workload':<{w_a}}  {'figure':<{w_b}}  vs floor")
    print(f"{'-' * w_a}  {'-' * w_b}  {'-' * 24}")
    for a, b, c in rows:
        print(f"{a:<{w_a}}  {b:<{w_b}}  {c}")

    print()
    print("details (CPU = CPU time of the executors / floor worker backends, from /proc; robust to other load)")
    ok = lambda r: "= N" if r["ledger_ok"] else "MISMATCH"
    print(f"  W1   : {w1['done']} done, {w1['failed']} failed in {w1['elapsed_s']:.2f} s (commit -> last finished_at); "
          f"ledger {w1['ledger_rows']} rows ({ok(w1)})")
    print(f"         CPU {w1['cpu_us_per_step']:,.0f} us/job ({w1['executor_cpu_s']:.1f} CPU-s over {w1['executors']} executors, "
          f"{100 * w1['executor_cpu_s'] / max(w1['elapsed_s'], 1e-9) / max(w1['executors'], 1):.0f}% of each); "
          f"~{(w1['done'] + w1['failed']) / w1['rounds']:.1f} steps per round (~{w1['rounds']} rounds)")
    print(f"         {w1['wal_bytes_per_instance']:,.0f} WAL bytes/job; {w1['multixacts_per_step']:.2f} MultiXacts/job; "
          f"machine {w1['machine_cores_busy']:.2f} of {NPROC} cores busy")
    print(f"         gd_insert_all of {w1['instances']} in one call: {w1['insert_s']:.2f} s "
          f"({w1['insert_per_s']:,.0f}/s), its commit {1000 * w1['commit_s']:.1f} ms")
    print(f"  floor: {fl['done']} done in {fl['elapsed_s']:.2f} s; ledger {fl['ledger_rows']} rows ({ok(fl)}); "
          f"CPU {fl['cpu_us_per_job']:,.0f} us/job ({fl['worker_cpu_s']:.1f} CPU-s); "
          f"{fl['done'] / max(fl['commits'], 1):.1f} jobs per commit")
    print(f"         {fl['wal_bytes_per_job']:,.0f} WAL bytes/job; {fl['multixacts_per_job']:.2f} MultiXacts/job; "
          f"machine {fl['machine_cores_busy']:.2f} of {NPROC} cores busy; "
          f"plain INSERT of {fl['jobs']} jobs: {fl['insert_s']:.2f} s ({fl['insert_per_s']:,.0f}/s)")
    print(f"  W3   : {w3['done']} done, {w3['failed']} failed in {w3['elapsed_s']:.2f} s; ledger {w3['ledger_rows']} rows ({ok(w3)}); "
          f"CPU {w3['cpu_us_per_step']:,.0f} us/step; ~{3 * (w3['done'] + w3['failed']) / w3['rounds']:.1f} steps per round")
    print(f"         {w3['wal_bytes_per_instance'] / 3:,.0f} WAL bytes/step; {w3['multixacts_per_step']:.2f} MultiXacts/step; "
          f"machine {w3['machine_cores_busy']:.2f} of {NPROC} cores busy")
    for d in diags:
        print(f"  diag {d['mode']}: {d['done']} done in {d['elapsed_s']:.2f} s; ledger ({ok(d)}); "
              f"CPU {d['cpu_us_per_job']:,.0f} us/job; {d['multixacts_per_job']:.2f} MultiXacts/job; "
              f"{d['wal_bytes_per_job']:,.0f} WAL bytes/job")
    ins = w2["insert_only_ms"]
    print(f"  W2   : await statuses {w2['statuses']}; gd_insert alone p50 {ins['p50']:.2f} / p99 {ins['p99']:.2f} ms; "
          f"insert+await mean {lat['mean']:.2f}, max {lat['max']:.2f} ms; "
          f"p50 of the first 100 {w2['first100_p50']:.2f} ms, of the last 100 {w2['last100_p50']:.2f} ms"
          + ("; STOPPED EARLY (time budget)" if w2["stopped_early"] else ""))
    print(f"  load : 1-min load average {info['loadavg_start']} at the start, {loadavg()} at the end "
          f"(above {NPROC} means something else competed for the CPUs and the figures are low)")


LABELS = {"gd": "gen_durable in-db", "gdext": "gen_durable ext", "pgboss": "pg-boss",
          "graphile": "graphile-worker", "pgq": "PgQ", "dbos": "DBOS", "floor": "SKIP LOCKED floor"}
GD_SYSTEMS = ("gd", "gdext")


JOB_QUEUES = ("pgboss", "graphile")  # the peers that keep per-job state (PgQ is a batch event log)


def best_peer(row, higher_is_better=True, among=PEERS):
    """(system, value) of the best peer (of `among`) in a row {system: value}, or (None, None)."""
    vals = [(s, v) for s, v in row.items() if s in among and v is not None and v == v]
    if not vals:
        return None, None
    return (max if higher_is_better else min)(vals, key=lambda sv: sv[1])


def comparison_report(info, res):
    """The side-by-side table and the targets."""
    systems = [s for s in ("gd", "gdext", "pgboss", "graphile", "pgq", "floor") if s in SYSTEMS]
    w1 = {s: v for s, (v, _) in res.get("w1", {}).items()}

    rows = []  # (label, {system: value}, fmt, higher_is_better, note per system)

    def rate_row(label, wl, unit_fmt="{:,.0f}"):
        if wl in res:
            rows.append((label, {s: v for s, (v, _) in res[wl].items()}, unit_fmt, True))

    rate_row(f"W1 jobs/s ({N_JOBS:,} single-step)", "w1")
    if "w2" in res:
        rows.append((f"W2 p50 ms ({N_LAT:,} one at a time)", {s: r["insert_await_ms"]["p50"] for s, r in res["w2"].items()}, "{:.2f}", False))
        rows.append(("W2 p99 ms", {s: r["insert_await_ms"]["p99"] for s, r in res["w2"].items()}, "{:.2f}", False))
    rate_row(f"W3 chains/s ({N_FSM:,} x 3 steps)", "w3")
    if "w4" in res:
        rows.append((f"W4 children/s ({N_W4:,}, spawn to join)", {s: v for s, (v, _) in res["w4"].items()}, "{:,.0f}", True))
    rate_row(f"W5 jobs/s (W1 + {N_BACKLOG:,} waiting)", "w5")
    if "w5" in res:
        rows.append((f"W5 p50 ms (W2, {N_LAT_BACKLOG:,} one at a time, the backlog waiting)",
                     {s: r["latency_ms"]["p50"] for s, (_, r) in res["w5"].items() if "latency_ms" in r}, "{:.2f}", False))
    rate_row("W6 jobs/s (W1 + horizon held)", "w6")

    cells = []
    for label, row, fmt, hib in rows:
        bs, bv = best_peer(row, hib)
        line = [label]
        for s in systems:
            v = row.get(s)
            if v is None:
                line.append("-")
                continue
            text = fmt.format(v)
            if s in GD_SYSTEMS and bv:
                ratio = v / bv if hib else bv / v
                text += f" ({ratio:.2f}x)"
            elif s == bs:
                text += " *"
            cells_w = text
            line.append(cells_w)
        cells.append(line)
    # W5/W6 against the system's own W1, and W6's bloat
    for wl, label in (("w5", "W5 / own W1"), ("w6", "W6 / own W1")):
        if wl in res and "w1" in res:
            cells.append([label] + [f"{res[wl][s][0] / w1[s]:.2f}" if s in res[wl] and w1.get(s) else "-" for s in systems])
    if "w6" in res:
        def bloat(s, key):
            h = res["w6"].get(s, (None, {}))[1].get("horizon") if s in res["w6"] else None
            if not h:
                return "-"
            if key == "dead_tuples":
                return f"{h['before']['dead_tuples']:,} -> {h['after']['dead_tuples']:,}"
            return f"{h['before']['total_bytes'] / 2**20:.1f} -> {h['after']['total_bytes'] / 2**20:.1f}"
        cells.append(["W6 queue dead tuples"] + [bloat(s, "dead_tuples") for s in systems])
        cells.append(["W6 queue MiB (with indexes)"] + [bloat(s, "total_bytes") for s in systems])

    head = ["workload"] + [LABELS[s] for s in systems]
    widths = [max(len(str(r[i])) for r in cells + [head]) for i in range(len(head))]
    print()
    print("=" * 100)
    print("gen_durable vs its peers, one cluster, one run")
    print("=" * 100)
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths))))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    print("(x) = gen_durable's ratio to the best peer (* = that peer; for latency best peer / gen_durable):"
          " above 1 gen_durable leads, below 1 the peer does.")
    print("Peers: " + "; ".join(f"{LABELS[s]} {PEER_VERSIONS.get(s, '')}".strip() for s in systems if s in PEERS)
          + f"; Node.js {NODE_VERSION}.")
    ceilings = {"ceiling": f"in the server ({FLOOR_WORKERS} sessions, one commit each)",
                "ceiling_ext": f"from gen_durable's Node.js worker (its lanes, one round trip per INSERT, a commit per batch)"}
    for key, how in ceilings.items():
        if key in res:
            c = res[key]
            print(f"W1's work alone, no queue, {how}: {c['per_s']:,.0f} jobs/s{'' if c['complete'] else ' INCOMPLETE'}")
    if ceilings.keys() & res.keys():
        print("  (no system can run W1 faster than the first on this machine, nor an external worker faster than the second)")

    # targets
    print()
    print("targets (docs/performance.md):")

    def target(name, value, goal, ok, note=""):
        if value is None:
            print(f"  {name:<46} not measured")
        else:
            print(f"  {name:<46} {value:>8.2f}   goal {goal:<8} {'met' if ok(value) else 'MISSED'}{note}")

    def peer_ratio(wl, s, among=PEERS):
        if wl not in res or s not in res[wl]:
            return None
        _, bv = best_peer({k: v for k, (v, _) in res[wl].items()}, among=among)
        return res[wl][s][0] / bv if bv else None

    def past_ceiling(factor, key):
        """A note when factor x the best peer's W1 is more than W1's work alone (res[key]) reaches here."""
        _, bv = best_peer(w1)
        if key not in res or not bv or factor * bv <= res[key]["per_s"]:
            return ""
        return (f" (needs {factor * bv:,.0f} jobs/s; the work alone peaks at {res[key]['per_s']:,.0f}:"
                " out of reach on this machine)")

    target("in-db W1 / best peer W1", peer_ratio("w1", "gd"), ">= 5", lambda v: v >= 5, past_ceiling(5, "ceiling"))
    fl = w1.get("floor")
    target("in-db W1 / floor W1", w1["gd"] / fl if fl and w1.get("gd") else None, ">= 0.8", lambda v: v >= 0.8)
    target("external W1 / best peer W1", peer_ratio("w1", "gdext"), ">= 1.5", lambda v: v >= 1.5,
           past_ceiling(1.5, "ceiling_ext"))
    # The same two against the job queues only (pg-boss, graphile-worker): not the goals, for reading them.
    target("  (in-db W1 / best job queue W1)", peer_ratio("w1", "gd", JOB_QUEUES), ">= 5", lambda v: v >= 5)
    target("  (external W1 / best job queue W1)", peer_ratio("w1", "gdext", JOB_QUEUES), ">= 1.5", lambda v: v >= 1.5)
    for s in GD_SYSTEMS:
        p50 = res.get("w2", {}).get(s, {}).get("insert_await_ms", {}).get("p50")
        target(f"W2 p50 ms, {LABELS[s]}", p50, "< 3", lambda v: v < 3)
    for s in GD_SYSTEMS:
        for wl, goal in (("w5", 0.8), ("w6", 0.7)):
            v = res[wl][s][0] / w1[s] if wl in res and s in res[wl] and w1.get(s) else None
            target(f"{wl.upper()} / W1, {LABELS[s]}", v, f">= {goal}", lambda x, g=goal: x >= g)

    # details
    print()
    print("per-run details (CPU per job = every process on the machine, busy time / jobs; "
          "node = the Node.js workers, backends = their Postgres sessions):")
    for wl in ("w1", "w3", "w4", "w5", "w6"):
        for s, (v, r) in res.get(wl, {}).items():
            bits = [f"{wl.upper()} {LABELS[s]:<18} {v:>9,.0f}/s in {r.get('elapsed_s', 0):6.2f} s"]
            if not r.get("complete", True):
                bits.append("INCOMPLETE")
            if r.get("machine_cpu_us_per_job") is not None:
                bits.append(f"machine {r['machine_cpu_us_per_job']:,.0f} us/job")
            if "node_cpu_us_per_job" in r:
                bits.append(f"node {r['node_cpu_us_per_job']:,.0f} + backends {r['backend_cpu_us_per_job']:,.0f} us/job")
            if "cpu_us_per_step" in r:
                bits.append(f"executors {r['cpu_us_per_step']:,.0f} us/step")
            if r.get("enqueue_s") is not None:
                bits.append(f"enqueue {r['enqueue_s']:.2f} s")
            if r.get("insert_s") is not None:
                bits.append(f"insert {r['insert_s']:.2f} s")
            if r.get("last_child_s") is not None:
                bits.append(f"last child at {r['last_child_s']:.2f} s")
            if r.get("backlog_prep_s"):
                bits.append(f"backlog ready in {r['backlog_prep_s']:.0f} s")
            h = r.get("horizon")
            if h:
                bits.append(f"horizon xmin {h['xmin']}; live {h['before']['live_tuples']:,} -> {h['after']['live_tuples']:,}")
            print("  " + "; ".join(bits))
    for s, r in res.get("w2", {}).items():
        lat = r["insert_await_ms"]
        extra = f"; {r['lost']} not seen within 5 s" if r.get("lost") else ""
        extra += "; STOPPED EARLY (time budget)" if r.get("stopped_early") else ""
        print(f"  W2 {LABELS[s]:<18} p50 {lat['p50']:.2f} / p90 {lat['p90']:.2f} / p99 {lat['p99']:.2f} / max {lat['max']:.2f} ms"
              f" over {lat['n']}{extra}")
    print("knobs: " + "; ".join(f"{LABELS[s]} {json.dumps(r.get('knobs'))}"
                                for s, (v, r) in res.get("w1", {}).items() if r.get("knobs")))


def main():
    admin = connect()
    info = machine_info(admin)
    warm_up(admin)
    if POLICY == "rate":
        admin.execute("SELECT gd_set_rate_limit('bench', 100000000, '1 second')")
    if POLICY:
        log(f"gen_durable's W1 and W3 instances under {POLICY_OPTION} 'bench:<n mod {POLICY_KEYS}>'")
    for s in ("pgboss", "graphile", "dbos"):
        if s in SYSTEMS:
            node_setup(s)
    res = {}

    def record(wl, s, value, r, unit="jobs/s"):
        if competition:
            r["others_cores"] = max(cores for cores, _ in competition)
            r["loadavg"] = max(load for _, load in competition)
            competition.clear()
        res.setdefault(wl, {})[s] = (value, r)
        warn = (f" (WARNING: other processes kept {r['others_cores']:.2f} cores busy meanwhile; load {r['loadavg']:.2f})"
                if r.get("others_cores", 0.0) > COMPETITION_WARN_CORES else "")
        log(f"    {LABELS[s]}: {value:,.0f} {unit}" + ("" if r.get("complete", True) else " (INCOMPLETE)") + warn)

    w1 = fl = w3 = w2 = None
    diags = []
    if "w1" in WORKLOADS:
        log(f"W1: {N_JOBS:,} single-step jobs per system, enqueued at once, timed from the enqueue's commit to the last completion")
        for s in SYSTEMS:
            reset(admin)
            rate, r = run_w1(admin, s)
            record("w1", s, rate, r)
            if s == "gd":
                w1 = r
            elif s == "floor":
                fl = r
        log("W1's work alone: its ledger INSERTs with no queue, in the server and from a Node.js worker")
        res["ceiling"] = work_ceiling(admin, N_JOBS)
        log(f"    in the server: {res['ceiling']['per_s']:,.0f} jobs/s")
        if "gdext" in SYSTEMS:
            reset(admin)
            res["ceiling_ext"] = node_throughput(admin, "gdext", "work", N_JOBS)
            log(f"    from the external worker: {res['ceiling_ext']['per_s']:,.0f} jobs/s")
        if DIAGNOSTICS and "floor" in SYSTEMS:
            for mode in ("subxact_all", "subxact_handler"):
                log(f"diagnostic floor '{mode}': the floor with a subtransaction per job")
                d = floor_throughput(admin, N_JOBS, mode)
                log(f"    {d['jobs_per_s']:,.0f} jobs/s ({d['elapsed_s']:.2f} s)")
                diags.append(d)

    if "wb" in WORKLOADS:
        res["wb"] = wb_batch_steps(admin)

    if "w3" in WORKLOADS:
        log(f"W3: {N_FSM:,} three-step chains per system")
        for s in SYSTEMS:
            if s == "floor":
                continue
            reset(admin)
            if s == "gd":
                w3 = gd_throughput(admin, "w3", N_FSM, 3, "bench.w3_ledger")
                record("w3", s, w3["instances_per_s"], w3, "chains/s")
            else:
                r = node_throughput(admin, s, "w3", N_FSM)
                record("w3", s, r["per_s"], r, "chains/s")

    if "w4" in WORKLOADS:
        log(f"W4: one parent, {N_W4:,} children, then the join, per system")
        for s in SYSTEMS:
            if s == "floor":
                continue
            reset(admin)
            r = gd_fanout(admin, N_W4) if s == "gd" else node_throughput(admin, s, "w4", N_W4)
            record("w4", s, r["per_s"], r, "children/s")

    if "w2" in WORKLOADS:
        log(f"W2: {N_LAT:,} jobs one at a time on the idle system, per system")
        for s in SYSTEMS:
            if s == "floor":
                continue
            reset(admin)
            if s == "gd":
                w2 = latency(admin, N_LAT)
                r = w2
            else:
                r = node_latency(admin, s, N_LAT)
            res.setdefault("w2", {})[s] = r
            log(f"    {LABELS[s]}: p50 {r['insert_await_ms']['p50']:.2f} ms, p99 {r['insert_await_ms']['p99']:.2f} ms")

    if "w5" in WORKLOADS:
        log(f"W5: W1 with {N_BACKLOG:,} jobs already waiting (due in a day); gen_durable also {N_BACKLOG:,} finished rows")
        for s in [s for s in SYSTEMS if s in IN_BENCH_DATABASE]:
            rate, r = w5_backlog(admin, s)
            record("w5", s, rate, r)

    if "w6" in WORKLOADS:
        log("W6: W1 while another session holds a REPEATABLE READ snapshot open for the whole run")
        for s in [s for s in SYSTEMS if s in IN_BENCH_DATABASE]:
            rate, r = w6_horizon(admin, s)
            record("w6", s, rate, r)
            h = r.get("horizon") or {}
            if h:
                log(f"      dead tuples {h['before']['dead_tuples']:,} -> {h['after']['dead_tuples']:,}, "
                    f"{h['before']['total_bytes'] / 2**20:.1f} -> {h['after']['total_bytes'] / 2**20:.1f} MiB")

    if "w7" in WORKLOADS:
        res["w7"] = w7_horizon_for_minutes(res)

    if "w10" in WORKLOADS:
        res["w10"] = w10_producers(admin)

    if "w11" in WORKLOADS:
        res["w11"] = w = w11_fair_share(admin)
        print(f"W11 fair share: B's p99 with A's flood / alone {w['b_p99_ratio']:.1f} (goal <= 2);"
              f" A's jobs/s with B / alone {w['a_ratio']:.2f} (goal >= 0.9)")

    if "w8" in WORKLOADS:
        log("W8: W1 and W2 as the table grows (finished rows not yet swept, plus scheduled ones)")
        res["w8"] = w8_growth()

    if w1 and fl and w3 and w2:
        report(info, w1, fl, w3, w2, diags)
    comparison_report(info, res)
    out = os.environ.get("BENCH_JSON")
    if out:
        with open(out, "w") as f:
            json.dump({"machine": info, "results": res, "floor_diagnostics": diags}, f, indent=2,
                      default=lambda o: o.isoformat() if isinstance(o, datetime.datetime) else str(o))
    admin.close()


if __name__ == "__main__":
    main()
