"""python3 -m gd_web --dsn 'dbname=app user=gd_dashboard': serve the dashboard."""

import argparse
import logging
import os

import psycopg
import uvicorn

from .app import Refusal, create_app, default_hosts


def main():
    parser = argparse.ArgumentParser(prog="gd_web", description="gen_durable's web dashboard")
    parser.add_argument("--dsn", default=os.environ.get("GD_WEB_DSN", ""),
                        help="PostgreSQL connection string of the dashboard's role (or $GD_WEB_DSN)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--allowed-hosts", default=os.environ.get("GD_WEB_ALLOWED_HOSTS", ""),
                        help="comma-separated Host headers to answer, as browsers send them (name, or name:port); "
                             "any other gets 400 (or $GD_WEB_ALLOWED_HOSTS; default: the address listened on, "
                             "with its port and without, and localhost's names when it is a loopback address)")
    parser.add_argument("--allow-superuser", action="store_true",
                        help="run even when the DSN's role is a superuser, who sees and may act on every tenant's "
                             "instances (refused otherwise)")
    options = parser.parse_args()
    if not options.dsn:
        parser.error("give --dsn (or set GD_WEB_DSN)")
    hosts = [host.strip() for host in options.allowed_hosts.split(",") if host.strip()]
    if not hosts and options.host in ("0.0.0.0", "::"):
        parser.error(f"listening on every address ({options.host}): give --allowed-hosts, the names browsers "
                     f"reach the dashboard by")
    hosts = hosts or default_hosts(options.host, options.port)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        app = create_app(options.dsn, hosts, allow_superuser=options.allow_superuser)
    except (Refusal, psycopg.OperationalError) as error:
        parser.exit(1, f"{error}\n")
    uvicorn.run(app, host=options.host, port=options.port, log_config=None)


if __name__ == "__main__":
    main()
