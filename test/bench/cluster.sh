# shellcheck shell=bash
# A throwaway, durable PostgreSQL 15 cluster for the benchmarks, sourced by
# test/bench/run.sh (`make bench`) and test/bench/soak.sh, after
# test/scripts/bootstrap.sh and gd_build_install:
#
#   bench_cluster_init NAME SETUP_SQL    mktemp /tmp/gd_NAME.XXXXXX, initdb (as the
#                                        postgres OS user), create database "bench";
#                                        sets DIR DATA LOG PORT; cleanup trap on EXIT
#   bench_cluster_start [CONF_LINE...]   configure gen_durable (database 'bench',
#                                        queues 'default:2', then CONF_LINE...), start,
#                                        run SETUP_SQL in "bench"; sets and exports
#                                        BENCH_DATA_FS and BENCH_ENGINE_COMMIT
#   bench_cluster_stop                   stop it and remove its dir (another may start)
#   bench_psql ARGS...                   psql -X -q -v ON_ERROR_STOP=1 on "bench"
#   bench_log_errors                     print the server log's ERROR/FATAL/PANIC lines
#
# Durability defaults on purpose (fsync, synchronous_commit, full_page_writes):
# the figures must be what a real deployment would see. BENCH_KEEP=1 keeps the
# cluster's dir (and log).

BENCH_NAME=bench
BENCH_SETUP_SQL=

# The install is system-wide, shared with any other build on this machine
# (a concurrent `make check`, say): remember what we installed, and say so
# in the report if the server ends up running something else.
# The install script of the checkout's version (gen_durable.control).
bench_install_script() {
    echo "gen_durable--$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$GD_ROOT/gen_durable.control").sql"
}

bench_installed_sum() {
    cat "$("$GD_PG_CONFIG" --pkglibdir)/gen_durable.so" \
        "$("$GD_PG_CONFIG" --sharedir)/extension/$(bench_install_script)" | md5sum | cut -c1-32
}

bench_cleanup() {
    local rc=$?
    if [[ -n ${DATA:-} && -f $DATA/postmaster.pid ]]; then
        gd_log "stopping the $BENCH_NAME cluster"
        gd_as_pg pg_ctl -D "$DATA" -m fast -w stop >/dev/null 2>&1 ||
            gd_as_pg pg_ctl -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
    fi
    if [[ $rc -ne 0 && -n ${LOG:-} && -f $LOG ]]; then
        echo "---- $BENCH_NAME FAILED; tail of the server log ----" >&2
        tail -n 40 "$LOG" >&2
    fi
    if [[ -n ${DIR:-} ]]; then
        if [[ -n ${BENCH_KEEP:-} ]]; then
            echo "($BENCH_NAME cluster dir kept: $DIR)"
        else
            rm -rf "$DIR"
        fi
    fi
    exit "$rc"
}

bench_cluster_init() {
    BENCH_NAME=$1
    local built=${BENCH_BUILD_DIR:-$(gd_build_dir)}   # the tree whose build the cluster is to run
    BENCH_BUILT_SUM=$(cat "$built/gen_durable.so" "$built/sql/$(bench_install_script)" | md5sum | cut -c1-32)
    DIR=$(mktemp -d "/tmp/gd_$BENCH_NAME.XXXXXX")
    DATA=$DIR/data
    LOG=$DIR/server.log
    export GD_PG_HOME=$DIR
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM

    # initdb refuses root: the cluster belongs to the postgres OS user, and so
    # must everything it reads.
    chmod 755 "$DIR"
    BENCH_SETUP_SQL=$DIR/$(basename "$2")
    cp "$2" "$BENCH_SETUP_SQL"
    [[ $EUID -ne 0 ]] || chown -R postgres: "$DIR"
    cd "$DIR" || return 1

    PORT=$(gd_free_port 5490)
    gd_log "creating a throwaway cluster in $DATA"
    gd_as_pg initdb -D "$DATA" -A trust --no-sync --no-locale -E UTF8 >"$DIR/initdb.log" 2>&1 ||
        { cat "$DIR/initdb.log" >&2; return 1; }

    # Create the database before the engine is configured to serve it, so the
    # server log has no "database does not exist" noise from early executors.
    cat >>"$DATA/postgresql.conf" <<EOF

# ---- gen_durable $BENCH_NAME ----
listen_addresses = ''
unix_socket_directories = '$DIR'
port = $PORT
log_line_prefix = '%m [%p] %b '
max_worker_processes = 16
shared_buffers = 256MB
EOF
    gd_as_pg pg_ctl -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null
    gd_as_pg createdb -h "$DIR" -p "$PORT" bench
    gd_as_pg pg_ctl -D "$DATA" -m fast -w stop >/dev/null
}

bench_cluster_start() {
    {
        echo "shared_preload_libraries = 'gen_durable'"
        echo "gen_durable.database = 'bench'"
        echo "gen_durable.queues = 'default:2'"
        local line
        for line in "$@"; do echo "$line"; done
    } >>"$DATA/postgresql.conf"

    gd_log "starting PostgreSQL 15 (socket $DIR, port $PORT): gen_durable.queues='default:2'${*:+, $*}, fsync and synchronous_commit on"
    local loaded_sum
    loaded_sum=$(bench_installed_sum)
    gd_as_pg pg_ctl -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null
    bench_psql -f "$BENCH_SETUP_SQL" >/dev/null
    [[ $(bench_installed_sum) == "$loaded_sum" ]] || loaded_sum=changed

    BENCH_DATA_FS="$(df -T "$DATA" | awk 'NR==2 {print $2 " (" $1 ")"}')"
    if [[ -z ${BENCH_ENGINE_COMMIT:-} ]]; then # preset when benchmarking an exported tree
        BENCH_ENGINE_COMMIT="$(git -C "$GD_ROOT" log -1 --format='%h %s' 2>/dev/null || echo '?')"
        if [[ -n "$(git -C "$GD_ROOT" status --porcelain -- src sql 2>/dev/null)" ]]; then
            BENCH_ENGINE_COMMIT+=" (+ uncommitted changes in src/ or sql/)"
        fi
    fi
    if [[ $loaded_sum != "$BENCH_BUILT_SUM" ]]; then
        BENCH_ENGINE_COMMIT+=" (WARNING: the installed gen_durable.so or install script was replaced by another build meanwhile: these figures may not be this tree's)"
    fi
    export BENCH_DATA_FS BENCH_ENGINE_COMMIT
}

# Stop the cluster and remove its dir (kept with BENCH_KEEP=1), so that another can start.
bench_cluster_stop() {
    gd_as_pg pg_ctl -D "$DATA" -m fast -w stop >/dev/null 2>&1 ||
        gd_as_pg pg_ctl -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
    if [[ -n ${BENCH_KEEP:-} ]]; then
        echo "($BENCH_NAME cluster dir kept: $DIR)"
    else
        rm -rf "$DIR"
    fi
    DIR= DATA= LOG=
}

bench_psql() {
    gd_as_pg psql -X -q -h "$DIR" -p "$PORT" -d bench -v ON_ERROR_STOP=1 "$@"
}

bench_log_errors() {
    local errors
    errors=$(grep -cE ' (ERROR|FATAL|PANIC): ' "$LOG" || true)
    if [[ $errors -gt 0 ]]; then
        echo
        echo "server log: $errors ERROR/FATAL/PANIC lines; the first ones:"
        grep -m 5 -E ' (ERROR|FATAL|PANIC): ' "$LOG" # (not | head: pipefail would fail the run on grep's SIGPIPE)
    fi
}
