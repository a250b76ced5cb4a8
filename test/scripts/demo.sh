#!/usr/bin/env bash
# `make demo`: bootstrap, build + install gen_durable, then run the checkout
# demo (test/demo/checkout.sql) on a throwaway PostgreSQL 15 cluster that is
# stopped and deleted on exit, whatever happens.
set -euo pipefail

# shellcheck source=bootstrap.sh
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"

gd_bootstrap_deps
gd_build_install

DIR=$(mktemp -d /tmp/gd_demo.XXXXXX)
DATA=$DIR/data
LOG=$DIR/server.log
export GD_PG_HOME=$DIR

cleanup() {
    local rc=$?
    if [[ -f $DATA/postmaster.pid ]]; then
        gd_log "stopping the demo cluster"
        gd_as_pg pg_ctl -D "$DATA" -m fast -w stop >/dev/null 2>&1 ||
            gd_as_pg pg_ctl -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
    fi
    if [[ $rc -ne 0 && -f $LOG ]]; then
        echo "---- demo FAILED; tail of the server log ----" >&2
        tail -n 40 "$LOG" >&2
    fi
    rm -rf "$DIR"
    exit "$rc"
}
trap cleanup EXIT

# initdb refuses root: the cluster belongs to the postgres OS user, and so
# must everything it reads (the checkout may be in a root-only directory).
chmod 755 "$DIR"
cp "$GD_ROOT/test/demo/checkout.sql" "$DIR/checkout.sql"
[[ $EUID -ne 0 ]] || chown -R postgres: "$DIR"
cd "$DIR"

PORT=$(gd_free_port 5480)
gd_log "creating a throwaway cluster in $DATA (initdb as the postgres OS user)"
gd_as_pg initdb -D "$DATA" -A trust --no-sync --no-locale -E UTF8 >"$DIR/initdb.log" 2>&1 ||
    { cat "$DIR/initdb.log" >&2; exit 1; }

# Unix socket only, in our private dir: nothing to clash with, nothing exposed.
cat >>"$DATA/postgresql.conf" <<EOF

# ---- gen_durable demo ----
shared_preload_libraries = 'gen_durable'
gen_durable.database = 'demo'
gen_durable.queues = 'default:2'
listen_addresses = ''
unix_socket_directories = '$DIR'
port = $PORT
fsync = off
log_line_prefix = '%m [%p] %b '
EOF
gd_log "configured: shared_preload_libraries='gen_durable', gen_durable.database='demo', gen_durable.queues='default:2'"

gd_log "starting PostgreSQL 15 (socket $DIR, port $PORT)"
gd_as_pg pg_ctl -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null

gd_log "createdb demo"
gd_as_pg createdb -h "$DIR" -p "$PORT" demo

gd_log "psql -f test/demo/checkout.sql"
echo
gd_as_pg psql -X -h "$DIR" -p "$PORT" -d demo -v ON_ERROR_STOP=1 -f "$DIR/checkout.sql"
echo
gd_log "demo finished"
