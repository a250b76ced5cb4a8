"""python3 -m gd_web --dsn 'dbname=app user=gd_dashboard': serve the dashboard."""

import argparse
import logging
import os

import uvicorn

from .app import create_app


def main():
    parser = argparse.ArgumentParser(prog="gd_web", description="gen_durable's web dashboard")
    parser.add_argument("--dsn", default=os.environ.get("GD_WEB_DSN", ""),
                        help="PostgreSQL connection string of the dashboard's role (or $GD_WEB_DSN)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8321)
    options = parser.parse_args()
    if not options.dsn:
        parser.error("give --dsn (or set GD_WEB_DSN)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    uvicorn.run(create_app(options.dsn), host=options.host, port=options.port, log_config=None)


if __name__ == "__main__":
    main()
