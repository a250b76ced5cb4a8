"""python -m gen_durable worker: run a Python file's handlers as an external worker.

    python -m gen_durable worker --dsn 'dbname=app' --handlers shop_handlers.py --queue shop --concurrency 4

The file defines HANDLERS = {(fsm, step): function}.  Repeat --dsn to serve
several databases (a sharded engine's partitions), each with its own lanes.
"""

import argparse
import importlib.util
import logging

from .worker import Worker, run_workers


def load_handlers(path):
    spec = importlib.util.spec_from_file_location("gd_handlers", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"gen_durable: cannot load handlers from {path} (a Python file defining HANDLERS)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HANDLERS


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m gen_durable", description="gen_durable external worker")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="run the external steps of a handlers file")
    worker.add_argument("--dsn", action="append", dest="dsns",
                        help="libpq connection string (default: the PG* environment); repeat for several databases")
    worker.add_argument("--handlers", required=True, help="Python file defining HANDLERS = {(fsm, step): fn}")
    worker.add_argument("--queue", action="append", dest="queues",
                        help="a queue to serve (repeat; default: the queues the handled steps are defined on)")
    worker.add_argument("--concurrency", type=int, default=1, help="lanes, each with its own connection")
    worker.add_argument("--batch", type=int, default=10, help="steps a lane claims at once")
    worker.add_argument("--lease", type=float, default=30.0, help="lease in seconds")
    worker.add_argument("--wait", type=float, default=5.0,
                        help="seconds a claim waits in the server for work before the lane claims again")
    worker.add_argument("--name", help="worker name recorded as lease_owner (default host:pid)")
    worker.add_argument("--pooler", choices=["auto", "yes", "no"], default="auto",
                        help="a transaction pooler in between (auto: when the server's port is not the one reached)")
    worker.add_argument("--api-schema", help="the schema of the API's functions (default: the extension's, looked up)")
    worker.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s[%(process)d] %(message)s")
    dsns = args.dsns or [""]
    handlers = load_handlers(args.handlers)
    workers = [Worker(dsn, handlers, queues=args.queues, concurrency=args.concurrency, batch=args.batch,
                      lease=args.lease, wait=args.wait, name=args.name,
                      pooler={"auto": None, "yes": True, "no": False}[args.pooler], api_schema=args.api_schema)
               for dsn in dsns]
    run_workers(workers)


if __name__ == "__main__":
    main()
