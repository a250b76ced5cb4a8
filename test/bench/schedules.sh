#!/usr/bin/env bash
# Schedules benchmark: SCHED_COUNT (10000) schedules each firing every minute,
# gen_durable's (fired by its reaper) and then pg_cron's (Debian's
# postgresql-15-cron, installed here when missing), side by side on one
# throwaway cluster (test/bench/cluster.sh: durability defaults).
#
#   bash test/bench/schedules.sh        (as root on Debian 12, like `make bench`)
#
# For SCHED_MINUTES (3) whole minutes each, after a first minute of warm-up:
#   - delay: from the tick (the minute) to the commit of the row the tick
#     made (gen_durable: the instance; pg_cron: the job's one INSERT into a
#     ledger), read with pg_xact_commit_timestamp (track_commit_timestamp on):
#     p50, p99 and max;
#   - ticks: rows made per minute (SCHED_COUNT when it keeps up);
#   - CPU per tick: the cluster's CPU time over the measured minutes (the
#     postmaster's own and its exited children's, from /proc/PID/stat, plus
#     its children alive at either end), divided by the ticks.
# gen_durable's schedules start an instance of an FSM with an external step
# nobody claims: the measure is the firing, not the work. pg_cron runs its
# jobs in background workers (cron.use_background_workers), at most
# cron.max_running_jobs (SCHED_PGCRON_MAX_RUNNING, 32 by default, its own
# default) at a time. SCHED_SYSTEMS ("gen_durable pg_cron") runs a subset.
# It prints figures, not pass/fail; not part of `make check`.
set -euo pipefail

# shellcheck source=../scripts/bootstrap.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/bootstrap.sh"
BENCH_DIR=$GD_ROOT/test/bench

SCHED_COUNT=${SCHED_COUNT:-10000}
SCHED_MINUTES=${SCHED_MINUTES:-3}
SCHED_PGCRON_MAX_RUNNING=${SCHED_PGCRON_MAX_RUNNING:-32}
SCHED_SYSTEMS=${SCHED_SYSTEMS:-gen_durable pg_cron}
for v in SCHED_COUNT SCHED_MINUTES SCHED_PGCRON_MAX_RUNNING; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || { echo "schedules: $v must be a positive whole number" >&2; exit 2; }
done

gd_bootstrap_deps test
if [[ "$(dpkg-query -W -f='${Status}' postgresql-15-cron 2>/dev/null)" != "install ok installed" ]]; then
    [[ $EUID -eq 0 ]] || { echo "schedules: postgresql-15-cron is missing and we are not root" >&2; exit 1; }
    gd_log "installing postgresql-15-cron"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql-15-cron >/dev/null
fi
gd_build_install

# shellcheck source=cluster.sh
source "$BENCH_DIR/cluster.sh"
SETUP=$(mktemp /tmp/gd_schedules_setup.XXXXXX.sql)
cat >"$SETUP" <<'EOF'
CREATE EXTENSION IF NOT EXISTS gen_durable;
CREATE EXTENSION IF NOT EXISTS pg_cron;
CREATE SCHEMA IF NOT EXISTS bench;
CREATE TABLE IF NOT EXISTS bench.cron_ledger (job int, tick timestamptz);
SELECT gd_define_fsm('tick', initial => 'work', queue => 'unclaimed');
SELECT gd_define_step('tick', 'work');
EOF
bench_cluster_init schedules "$SETUP"
rm -f "$SETUP"
bench_cluster_start "shared_preload_libraries = 'gen_durable,pg_cron'" "cron.database_name = 'bench'" \
    "cron.use_background_workers = on" "cron.max_running_jobs = $SCHED_PGCRON_MAX_RUNNING" \
    "max_worker_processes = 64" "track_commit_timestamp = on"

PGCRON_VERSION=$(dpkg-query -W -f='${Version}' postgresql-15-cron)
echo
echo "engine:      $BENCH_ENGINE_COMMIT"
echo "machine:     $(nproc) CPUs, data on $BENCH_DATA_FS; pg_cron $PGCRON_VERSION"
echo "load:        $SCHED_COUNT schedules every minute, measured over $SCHED_MINUTES minutes after one of warm-up"

# The cluster's CPU time so far, in clock ticks.
cluster_cpu_ticks() {
    local postmaster total=0 pid fields
    postmaster=$(head -1 "$DATA/postmaster.pid")
    read -r -a fields < <(sed 's/^.*) //' "/proc/$postmaster/stat")
    # after the ") ": field 3 is state; utime stime cutime cstime are fields 14-17 of stat
    total=$((fields[11] + fields[12] + fields[13] + fields[14]))
    for pid in $(pgrep -P "$postmaster"); do
        read -r -a fields < <(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null) || continue
        total=$((total + fields[11] + fields[12]))
    done
    echo "$total"
}

# Sleep until `seconds` past the next minute.
until_next_minute() {
    sleep "$(awk -v now="$(date +%s.%N)" -v extra="${1:-0}" 'BEGIN { printf "%.3f", 60 - (now % 60) + extra }')"
}

# measure NAME DELAY_SQL: wait a minute of warm-up, then SCHED_MINUTES; print the figures.
measure() {
    local name=$1 rows_sql=$2 from to cpu0 cpu1 hz
    hz=$(getconf CLK_TCK)
    until_next_minute 0.5
    from=$(date -u +'%Y-%m-%d %H:%M:00+00')
    cpu0=$(cluster_cpu_ticks)
    sleep $((SCHED_MINUTES * 60))
    cpu1=$(cluster_cpu_ticks)
    to=$(date -u +'%Y-%m-%d %H:%M:00+00')
    sleep 30 # the last minute's stragglers
    bench_psql -At -F ' ' -c "
WITH made AS ($rows_sql),
     measured AS (SELECT tick, extract(epoch FROM committed - tick) AS delay FROM made
                   WHERE tick >= '$from' AND tick < '$to')
SELECT '$name', count(*), round(count(*)::numeric / $SCHED_MINUTES),
       round(1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY delay))::int,
       round(1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY delay))::int,
       round(1000 * max(delay))::int,
       round(($cpu1 - $cpu0) * 1e6 / $hz / greatest(count(*), 1))::int
  FROM measured" | awk '{ printf "%-12s %9s %12s %10s %10s %10s %14s\n", $1, $2, $3, $4, $5, $6, $7 }'
}

printf "%-12s %9s %12s %10s %10s %10s %14s\n" system ticks ticks/minute "p50 ms" "p99 ms" "max ms" "CPU us/tick"

if [[ " $SCHED_SYSTEMS " == *" gen_durable "* ]]; then
    gd_log "gen_durable: $SCHED_COUNT schedules" >&2
    bench_psql -c "SELECT count(gd_schedule('s' || n, '* * * * *', 'tick', jsonb_build_object('n', n)))
                     FROM generate_series(1, $SCHED_COUNT) n" >/dev/null
    measure gen_durable "SELECT (i.state->>'scheduled_at')::timestamptz AS tick, pg_xact_commit_timestamp(i.xmin) AS committed
                           FROM gd._instances i WHERE i.fsm = 'tick'"
    bench_psql -c "SELECT count(gd_unschedule(name)) FROM gd.schedules" >/dev/null
fi

if [[ " $SCHED_SYSTEMS " == *" pg_cron "* ]]; then
    # (pg_cron's tick: the minute its job's transaction started in; a job more
    # than a minute late counts for the next minute, and the minute's count falls.)
    gd_log "pg_cron: $SCHED_COUNT jobs" >&2
    bench_psql -c "SELECT count(cron.schedule('j' || n, '* * * * *',
                                              format('INSERT INTO bench.cron_ledger VALUES (%s, date_trunc(''minute'', now()))', n)))
                     FROM generate_series(1, $SCHED_COUNT) n" >/dev/null
    measure pg_cron "SELECT l.tick, pg_xact_commit_timestamp(l.xmin) AS committed FROM bench.cron_ledger l"
    bench_psql -c "SELECT count(cron.unschedule(jobid)) FROM cron.job" >/dev/null
fi
bench_log_errors
