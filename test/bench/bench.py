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
import sys
import threading
import time

import psycopg

HOST, PORT = sys.argv[1], sys.argv[2]
DSN = dict(host=HOST, port=PORT, dbname="bench", user="postgres", application_name="gd_bench")

N_JOBS = int(os.environ.get("BENCH_JOBS", "50000"))
N_FSM = int(os.environ.get("BENCH_FSM_INSTANCES", "10000"))
N_LAT = int(os.environ.get("BENCH_LATENCY_SAMPLES", "1000"))
TIMEOUT = float(os.environ.get("BENCH_TIMEOUT", "180"))
DIAGNOSTICS = os.environ.get("BENCH_DIAGNOSTICS", "1") != "0"
LATENCY_BUDGET_S = 120.0  # W2 stops early (and says so) past this
FLOOR_WORKERS = 2          # matches gen_durable.queues = 'default:2'
FLOOR_BATCH = 16           # matches gen_durable.batch_size's default

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


class CpuMeter:
    """CPU used by some processes, and how busy the whole machine was."""

    def __init__(self, pids):
        self.pids = list(pids)
        self.proc0 = proc_cpu_seconds(self.pids)
        self.total0, self.idle0 = machine_ticks()
        self.t0 = time.monotonic()

    def stop(self):
        wall = time.monotonic() - self.t0
        total1, idle1 = machine_ticks()
        total, idle = total1 - self.total0, idle1 - self.idle0
        return {
            "proc_cpu_s": proc_cpu_seconds(self.pids) - self.proc0,
            "wall_s": wall,
            "machine_cores_busy": NPROC * (total - idle) / total if total > 0 else 0.0,
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


def gd_throughput(admin, fsm, n, steps_per_instance, ledger):
    """Insert n instances in one transaction; time from its COMMIT to the last finished_at."""
    quiesce(admin)
    multi0 = next_multixact(admin)
    pids = executor_pids(admin)
    inserter = connect(autocommit=False)
    t = time.monotonic()
    inserter.execute("SELECT count(gd_insert(%s, jsonb_build_object('n', g))) FROM generate_series(1, %s) g",
                     (fsm, n))
    insert_s = time.monotonic() - t
    lsn0 = wal_lsn(inserter)
    xid0 = next_xid(admin)
    cpu = CpuMeter(pids)
    t0 = one(inserter, "SELECT clock_timestamp()")
    t = time.monotonic()
    inserter.commit()
    commit_s = time.monotonic() - t
    inserter.close()

    done, failed = wait_settled(admin, fsm, n, time.monotonic() + TIMEOUT)
    usage = cpu.stop()
    wal = wal_bytes_since(admin, lsn0)
    # Each executor round is a transaction with an xid (its pick locks rows) and
    # each step that writes a subtransaction with its own: rounds = xids - steps.
    xids = next_xid(admin) - xid0
    last = one(admin, "SELECT max(finished_at) FROM gd.instances"
                      " WHERE fsm = %s AND status IN ('done', 'failed', 'cancelled')", (fsm,))
    ledger_rows = one(admin, f"SELECT count(*) FROM {ledger}")
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
        "xids": xids, "rounds": max(xids - (done + failed) * steps_per_instance, 1),
        "wal_bytes_per_instance": wal / max(done + failed, 1),
        "executor_cpu_s": usage["proc_cpu_s"], "executors": len(pids),
        "cpu_us_per_step": 1e6 * usage["proc_cpu_s"] / max((done + failed) * steps_per_instance, 1),
        "multixacts_per_step": multis / max((done + failed) * steps_per_instance, 1),
        "machine_cores_busy": usage["machine_cores_busy"],
    }


def floor_throughput(admin, n, mode="plain"):
    """The hand-written SKIP LOCKED queue: FLOOR_WORKERS sessions CALL bench.floor_worker at once.
    mode 'plain' is the floor; the others are diagnostics (see setup.sql)."""
    admin.execute("TRUNCATE bench.floor_jobs, bench.floor_ledger, bench.floor_runs")
    quiesce(admin)
    t = time.monotonic()
    admin.execute("INSERT INTO bench.floor_jobs (payload) SELECT jsonb_build_object('n', g)"
                  "  FROM generate_series(1, %s) g", (n,))
    insert_s = time.monotonic() - t
    multi0 = next_multixact(admin)
    workers = [connect() for _ in range(FLOOR_WORKERS)]
    pids = [w.info.backend_pid for w in workers]
    errors = []
    gate = threading.Barrier(FLOOR_WORKERS + 1)

    def work(conn):
        try:
            gate.wait()
            conn.execute("CALL bench.floor_worker(%s, %s)", (FLOOR_BATCH, mode))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for th in threads:
        th.start()
    lsn0 = wal_lsn(admin)
    xid0 = next_xid(admin)
    cpu = CpuMeter(pids)
    gate.wait()
    for th in threads:
        th.join(TIMEOUT)
    usage = cpu.stop()
    for w in workers:
        if not any(th.is_alive() for th in threads):
            w.close()
    if errors:
        raise SystemExit(f"bench: floor worker failed: {errors[0]}")
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


# ------------------------------------------------------------------ report

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
    print(f"         gd_insert of {w1['instances']} in one transaction: {w1['insert_s']:.2f} s "
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


def main():
    admin = connect()
    info = machine_info(admin)
    warm_up(admin)

    log(f"W1: {N_JOBS} single-step instances, inserted in one transaction, timed from its commit")
    w1 = gd_throughput(admin, "w1", N_JOBS, 1, "bench.w1_ledger")
    log(f"    {w1['instances_per_s']:,.0f} jobs/s ({w1['elapsed_s']:.2f} s)")

    log(f"floor: {N_JOBS} jobs, {FLOOR_WORKERS} SKIP LOCKED worker sessions, {FLOOR_BATCH} per transaction")
    fl = floor_throughput(admin, N_JOBS)
    log(f"    {fl['jobs_per_s']:,.0f} jobs/s ({fl['elapsed_s']:.2f} s)")

    diags = []
    if DIAGNOSTICS:
        for mode in ("subxact_all", "subxact_handler"):
            log(f"diagnostic floor '{mode}': the floor with a subtransaction per job")
            d = floor_throughput(admin, N_JOBS, mode)
            log(f"    {d['jobs_per_s']:,.0f} jobs/s ({d['elapsed_s']:.2f} s)")
            diags.append(d)

    log(f"W3: {N_FSM} three-step instances")
    w3 = gd_throughput(admin, "w3", N_FSM, 3, "bench.w3_ledger")
    log(f"    {w3['steps_per_s']:,.0f} steps/s ({w3['elapsed_s']:.2f} s)")

    log(f"W2: {N_LAT} x gd_insert + gd_await on the idle system, then {N_LAT} bare autocommit INSERTs")
    w2 = latency(admin, N_LAT)
    log(f"    p50 {w2['insert_await_ms']['p50']:.2f} ms")

    report(info, w1, fl, w3, w2, diags)
    out = os.environ.get("BENCH_JSON")
    if out:
        with open(out, "w") as f:
            json.dump({"machine": info, "w1": w1, "floor": fl, "w3": w3, "w2": w2, "floor_diagnostics": diags}, f, indent=2,
                      default=lambda o: o.isoformat() if isinstance(o, datetime.datetime) else str(o))
    admin.close()


if __name__ == "__main__":
    main()
