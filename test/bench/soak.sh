#!/usr/bin/env bash
# Soak benchmark: do gd.instances and gd.signals stay bounded in size under a
# sustained load, with the garbage collector and autovacuum keeping up?
#
#   bash test/bench/soak.sh              (as root on Debian 12, like `make bench`)
#
# Bootstrap, build + install gen_durable, start one throwaway PostgreSQL 15
# cluster (test/bench/cluster.sh, shared with `make bench`: durability
# defaults, fsync and synchronous_commit on) with
#
#   gen_durable.database = 'bench'    gen_durable.queues = 'default:2'
#   gen_durable.retention = '30s'     gen_durable.gc_interval = '5s'
#   log_autovacuum_min_duration = 0   (to count autovacuum runs in the log)
#
# then, for SOAK_SECONDS, a producer (soak.produce in test/bench/soak.sql, one
# psql session, one CALL per second) inserts SOAK_RATE instances a second,
# one transaction every SOAK_TICK_MS, while the two executors run them: every
# SOAK_SIGNAL_EVERY-th instance is signalled in its inserting transaction and
# takes two steps (wait, which consumes the signal at once; finish), the
# others one. Every SOAK_SAMPLE seconds it prints one sample: instances
# inserted, rows in gd.instances (live / finished), for gd.instances and
# gd.signals the n_live_tup / n_dead_tup / autovacuum_count of
# pg_stat_user_tables, the dead tuples pgstattuple counts in the heap and
# pg_total_relation_size (heap + indexes), gd.stats gc_swept and step counts,
# and the executors' lag (gd.queue_stats.oldest_runnable_age). At the end:
# the table of samples, what gd.stats and pg_stat_user_tables counted, and a
# verdict line: total size at the end vs after the warm-up (SOAK_WARMUP,
# 120 s: retention 30 s, a GC sweep, then one autovacuum_naptime of 60 s for
# the first vacuum to reclaim dead rows), with the size at 60 s. FLAT means
# within +10% (the end and every sample after the warm-up). It prints
# figures, not pass/fail, and is not part of `make check`.
#
# The table settings under test are the schema's own (sql/src/10_schema.sql,
# sql/src/82_gc.sql), printed at the start: fillfactor 80 on
# gd.instances (free room on each page for its rows' next versions), and
# per-table autovacuum settings on both tables (vacuum scale factor 0.02 on
# gd.instances, 0.05 on gd.signals, no cost delay).
#
# Env: SOAK_SECONDS (300), SOAK_RATE (500 instances/s), SOAK_SAMPLE (30 s),
# SOAK_TICK_MS (100), SOAK_SIGNAL_EVERY (2; 0: no signals), SOAK_WARMUP
# (120 s), BENCH_KEEP=1 keeps the cluster's dir and log.
set -euo pipefail

SOAK_START=$(date +%s)

# shellcheck source=../scripts/bootstrap.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/bootstrap.sh"
BENCH_DIR=$GD_ROOT/test/bench

SOAK_SECONDS=${SOAK_SECONDS:-300}
SOAK_RATE=${SOAK_RATE:-500}
SOAK_SAMPLE=${SOAK_SAMPLE:-30}
SOAK_TICK_MS=${SOAK_TICK_MS:-100}
SOAK_SIGNAL_EVERY=${SOAK_SIGNAL_EVERY:-2}
SOAK_WARMUP=${SOAK_WARMUP:-120}
for v in SOAK_SECONDS SOAK_RATE SOAK_SAMPLE SOAK_TICK_MS SOAK_SIGNAL_EVERY SOAK_WARMUP; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "soak: $v must be a whole number, not '${!v}'" >&2; exit 2; }
done
((SOAK_SECONDS > 0 && SOAK_RATE > 0 && SOAK_SAMPLE > 0)) ||
    { echo "soak: SOAK_SECONDS, SOAK_RATE and SOAK_SAMPLE must be > 0" >&2; exit 2; }
((SOAK_TICK_MS > 0 && 1000 % SOAK_TICK_MS == 0)) ||
    { echo "soak: SOAK_TICK_MS must divide 1000" >&2; exit 2; }

gd_bootstrap_deps test
gd_build_install

# shellcheck source=cluster.sh
source "$BENCH_DIR/cluster.sh"
bench_cluster_init soak "$BENCH_DIR/soak.sql"
bench_cluster_start "gen_durable.retention = '30s'" "gen_durable.gc_interval = '5s'" \
    "log_autovacuum_min_duration = 0"

echo
echo "engine:      $BENCH_ENGINE_COMMIT"
echo "machine:     $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GB", $2 / 1048576}' /proc/meminfo) RAM, data on $BENCH_DATA_FS"
echo "load:        $SOAK_RATE instances/s for $SOAK_SECONDS s, one transaction per $SOAK_TICK_MS ms;" \
    "$([[ $SOAK_SIGNAL_EVERY -gt 0 ]] && echo "1 in $SOAK_SIGNAL_EVERY signalled (2 steps)" || echo "no signals (1 step each)")"
echo "table settings (pg_class.reloptions):"
bench_psql -At -F ': ' -c "
SELECT '  ' || c.oid::regclass, coalesce(array_to_string(c.reloptions, ', '), '(defaults)')
  FROM pg_class c WHERE c.oid IN ('gd.instances'::regclass, 'gd.signals'::regclass) ORDER BY 1"
echo "server:      $(bench_psql -At -c "
SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ', ' ORDER BY name) FROM pg_settings
 WHERE name IN ('autovacuum_naptime', 'autovacuum_vacuum_cost_limit', 'autovacuum_max_workers',
                'synchronous_commit', 'fsync', 'shared_buffers', 'gen_durable.batch_size',
                'gen_durable.retention', 'gen_durable.gc_interval')")"

bench_psql -c "SELECT gd_stats_reset(), pg_stat_reset()" >/dev/null

SAMPLES=$DIR/samples.tsv
: >"$SAMPLES"
# i_: gd.instances, s_: gd.signals; *_dead_tup: pg_stat_user_tables (what
# autovacuum goes by), *_dead: pgstattuple (counted in the heap); MB:
# pg_total_relation_size; av: autovacuum runs; done/s since the sample before.
COLS=(t_s inserted rows live finished i_live_tup i_dead_tup i_dead i_MB i_av
    s_rows s_live_tup s_dead_tup s_dead s_MB s_av gc_swept steps done/s lag_s)
FMT='%5s %9s %7s %6s %8s %10s %10s %7s %6s %4s %7s %10s %10s %7s %6s %4s %9s %9s %6s %6s\n'
header() {
    # shellcheck disable=SC2059
    printf "$FMT" "${COLS[@]}"
}
# Lines of $SAMPLES (t, then soak.sample()'s columns) as table lines.
format_samples() {
    awk -F '\t' -v fmt="$FMT" '
        { dt = $1 - pt; rate = (NR > 1 && dt > 0) ? sprintf("%.0f", ($19 - pd) / dt) : "-"; pt = $1; pd = $19
          printf fmt, $1, $2, $3, $4, $5, $6, $7, $8, sprintf("%.1f", $9 / 1024), $10,
                 $11, $12, $13, $14, sprintf("%.1f", $15 / 1024), $16, $17, $18, rate, $20 }'
}

gd_log "producing for $SOAK_SECONDS s, a sample every $SOAK_SAMPLE s"
# One CALL per second of load, from one session: between calls the session
# goes idle and reports its table statistics, as an application's would.
for ((s = 0; s < SOAK_SECONDS; s++)); do
    echo "CALL soak.produce($s, $SOAK_RATE, $SOAK_TICK_MS, $SOAK_SIGNAL_EVERY);"
done | bench_psql -f - >"$DIR/producer.log" 2>&1 &
PRODUCER=$!
T0=$(date +%s%N)
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
header
for ((t = 0; t <= SOAK_SECONDS; t += SOAK_SAMPLE)); do
    wait_ms=$(((T0 / 1000000 + t * 1000) - $(date +%s%N) / 1000000))
    ((wait_ms <= 0)) || sleep "$(printf '%d.%03d' $((wait_ms / 1000)) $((wait_ms % 1000)))"
    line=$(bench_psql -At -F $'\t' -c "SELECT * FROM soak.sample()")
    printf '%s\t%s\n' "$t" "$line" >>"$SAMPLES"
    tail -n 2 "$SAMPLES" | format_samples | tail -n 1
    if ((t + SOAK_SAMPLE <= SOAK_SECONDS)) && ! kill -0 "$PRODUCER" 2>/dev/null; then
        break # it ended early: an error, said below
    fi
done
if ! wait "$PRODUCER" || [[ -s $DIR/producer.log ]]; then
    cat "$DIR/producer.log" >&2
    echo "soak: the producer failed" >&2
    exit 1
fi
bench_psql -At -c "
SELECT format('producer:    %s instances in %s s (%s ticks of %s ms, %s late, worst %s ms behind)',
              made, round(extract(epoch FROM clock_timestamp() - started)::numeric, 1), ticks, $SOAK_TICK_MS,
              late, round(worst_ms::numeric, 1))
  FROM soak.producer"

# After the load: how long until the last instances are run.
drain_start=$(date +%s%N)
until [[ $(bench_psql -At -c "SELECT count(*) FROM gd.instances WHERE status NOT IN ('done', 'failed', 'cancelled')") == 0 ]]; do
    if (($(date +%s%N) - drain_start > 60000000000)); then
        echo "soak: live instances still there 60 s after the producer stopped" >&2
        break
    fi
    sleep 0.1
done
echo "cpu load:    1-min load average $LOAD_START at the start, $(cut -d' ' -f1 /proc/loadavg) at the end" \
    "(above $(nproc), something else competed for the CPUs)"
echo "drained:     the last instance finished $((($(date +%s%N) - drain_start) / 1000000)) ms after the producer's last commit"

echo
echo "==== samples: $SOAK_RATE instances/s, retention 30 s, GC every 5 s ===="
echo "(i_: gd.instances, s_: gd.signals; *_tup: pg_stat_user_tables, *_dead: pgstattuple;" \
    "MB: pg_total_relation_size; av: autovacuum runs; lag_s: oldest_runnable_age)"
header
format_samples <"$SAMPLES"

echo
sweeps=$(grep -c 'gen_durable: GC swept' "$LOG" || true)
echo "GC sweeps logged: $sweeps ($(grep -o 'GC swept [0-9]* finished' "$LOG" | awk '{ s += $3 } END { print s + 0 }') instances);" \
    "autovacuum runs logged: gd.instances $(grep -c 'automatic vacuum of table "bench.gd.instances"' "$LOG" || true)," \
    "gd.signals $(grep -c 'automatic vacuum of table "bench.gd.signals"' "$LOG" || true)"
bench_psql -At -c "
SELECT 'steps:       ' || string_agg(event || ' ' || count || ' (' || round(total_ms::numeric / nullif(count, 0), 3)
                                     || ' ms avg, max ' || round(max_ms::numeric, 1) || ' ms)', ', ' ORDER BY event)
  FROM gd.stats WHERE event LIKE 'step\_%' AND count > 0"
bench_psql -At -c "
SELECT 'picks:       ' || max(count) FILTER (WHERE event = 'pick') || ' rounds, '
       || max(count) FILTER (WHERE event = 'pick_rows') || ' rows of '
       || max(count) FILTER (WHERE event = 'pick_demand') || ' asked ('
       || round(100.0 * max(count) FILTER (WHERE event = 'pick_rows')
                / nullif(max(count) FILTER (WHERE event = 'pick_demand'), 0), 1) || '%)'
  FROM gd.stats"
bench_psql -At -c "
SELECT format('sizes:       %s: heap %s, indexes %s (%s of them), at the end',
              c.oid::regclass, pg_size_pretty(pg_relation_size(c.oid)), pg_size_pretty(pg_indexes_size(c.oid)),
              (SELECT count(*) FROM pg_index x WHERE x.indrelid = c.oid))
  FROM pg_class c WHERE c.oid IN ('gd.instances'::regclass, 'gd.signals'::regclass) ORDER BY 1"
# What the statistics system was told, against what the engine did.
bench_psql -At -c "
SELECT format('pg_stat:     %s: n_tup_ins %s, n_tup_upd %s (hot %s), n_tup_del %s, vacuums %s auto + %s manual',
              relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, autovacuum_count, vacuum_count)
  FROM pg_stat_user_tables WHERE schemaname = 'gd' AND relname IN ('instances', 'signals') ORDER BY relname"

# The verdict: total size (both tables) at the end vs after the warm-up
# (SOAK_WARMUP: retention 30 s, a GC sweep, and one autovacuum_naptime (60 s)
# for the first vacuum to have reclaimed the first dead rows), and vs 60 s.
awk -F '\t' -v warmup="$SOAK_WARMUP" '
    { t[NR] = $1; kb[NR] = $9 + $15; dead[NR] = $8 + $14; rows[NR] = $3; lag[NR] = $20; n = NR }
    function first_at(limit,   i) { for (i = 1; i <= n; i++) if (t[i] >= limit && t[i] > 0) return i; return 0 }
    END {
        r = first_at(warmup)
        if (r == 0 || r == n) r = first_at(60)
        if (r == 0 || r == n) r = first_at(1)
        if (r == 0 || r == n) { print "verdict: run too short for a verdict (need two samples after 0 s)"; exit }
        s60 = first_at(60)
        maxkb = 0; maxdead = 0; maxlag = 0; maxrows = 0
        for (i = r; i <= n; i++) {
            if (kb[i] > maxkb) maxkb = kb[i]
            if (dead[i] > maxdead) maxdead = dead[i]
            if (rows[i] > maxrows) maxrows = rows[i]
        }
        for (i = 1; i <= n; i++) if (lag[i] > maxlag) maxlag = lag[i]
        growth = 100 * (kb[n] - kb[r]) / kb[r]
        printf "verdict: size %s: gd.instances + gd.signals %.1f MB at %d s, %.1f MB at %d s (%+.1f%%, %+.2f MB/min;" \
               " max %.1f MB from %d s on%s); rows <= %d, dead tuples (pgstattuple) <= %d from %d s on;" \
               " executor lag max %.2f s\n",
               (growth <= 10 && maxkb <= 1.1 * kb[r]) ? "FLAT" : "GREW",
               kb[r] / 1024, t[r], kb[n] / 1024, t[n], growth, (kb[n] - kb[r]) / 1024 / (t[n] - t[r]) * 60,
               maxkb / 1024, t[r],
               (s60 && s60 != r) ? sprintf("; %.1f MB at %d s", kb[s60] / 1024, t[s60]) : "",
               maxrows, maxdead, t[r], maxlag
    }' "$SAMPLES"

bench_log_errors
echo
echo "soak took $(($(date +%s) - SOAK_START)) s in all (bootstrap, build, cluster, load)"
