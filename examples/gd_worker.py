#!/usr/bin/env python3
"""A reference external worker for gen_durable.

Runs the external steps (handler => NULL) of one queue, in Python, with
psycopg 3 (Debian: apt-get install python3-psycopg).

    python3 gd_worker.py --dsn 'dbname=app' --queue default --handlers shop_handlers.py

The handlers file defines HANDLERS, a dict {(fsm, step): function}.  A
handler is called as function(state, ctx) with the instance's state and
context as dicts, and returns an outcome built with the functions below
(next_step, retry, wait_signal, spawn, done, stop) — the same outcomes an
in-database handler returns.  A handler that raises counts as a failed
attempt (gd_retry with the step's backoff).

The worker
  - LISTENs on gd_work and claims as soon as its queue is notified; without
    notifications it polls every --poll seconds (a safety net only);
  - claims up to --batch steps at a time with a lease of --lease seconds and
    heartbeats every step in flight at a third of the lease, so a long step
    keeps its claim and a dead worker's claims expire quickly;
  - completes each step with gd_complete; a false result means the lease was
    lost (the step was reclaimed and runs elsewhere): the outcome is dropped;
  - on SIGTERM or SIGINT finishes the step in hand, hands the rest of its
    batch back with gd_release (no lease is waited out), and exits;
  - exits with an error when its connection to the server is lost: run it
    under a supervisor (systemd, a container runtime) that restarts it; its
    claims come back when their leases expire.

Side effects outside the database are at-least-once: a worker that dies
mid-step leaves the step to be run again after its lease expires.  Make
external effects idempotent (the instance id and ctx.attempt are good keys).
"""

import argparse
import importlib.util
import logging
import os
import select
import signal
import socket
import sys
import threading
import time

import psycopg
from psycopg.types.json import Jsonb

log = logging.getLogger("gd_worker")


# ---------------------------------------------------------------------------
# Outcomes: the SQL constructors, called inside gd_complete
# ---------------------------------------------------------------------------

class Outcome:
    """A gd.outcome constructor call: SQL text with placeholders, and its parameters."""

    def __init__(self, sql, params):
        self.sql = sql
        self.params = params

    def __repr__(self):
        return f"Outcome({self.sql}, {self.params!r})"


def _json(value):
    return None if value is None else Jsonb(value)


def _interval(seconds):
    return None if seconds is None else f"{float(seconds)} seconds"


def next_step(step, state=None, delay=None):
    """Go to `step` (state None keeps the state), now or after `delay` seconds."""
    return Outcome("gd_next(%s, %s::jsonb, %s::interval)", [step, _json(state), _interval(delay)])


def retry(error, backoff=None):
    """Count an attempt and run this step again after `backoff` seconds (default: the step's)."""
    return Outcome("gd_retry(%s::jsonb, %s::interval)", [_json(error or {}), _interval(backoff)])


def wait_signal(names, timeout=None, then_step=None, state=None):
    """Park until a signal of one of `names` arrives, or `timeout` seconds pass."""
    return Outcome("gd_wait_signal(%s::text[], %s::interval, %s, %s::jsonb)",
                   [list(names), _interval(timeout), then_step, _json(state)])


def spawn(children, then_step, state=None):
    """Insert child instances and park until every one has ended."""
    return Outcome("gd_spawn(%s::jsonb, %s, %s::jsonb)", [_json(children), then_step, _json(state)])


def done(result=None):
    """Finish the instance with `result`."""
    return Outcome("gd_done(%s::jsonb)", [_json(result if result is not None else {})])


def stop(error):
    """Fail the instance at once, without retrying."""
    return Outcome("gd_stop(%s::jsonb)", [_json(error or {})])


# ---------------------------------------------------------------------------
# The worker
# ---------------------------------------------------------------------------

class Worker:
    def __init__(self, dsn, queue, handlers, name=None, batch=10, lease=30.0, poll=10.0):
        self.dsn = dsn
        self.queue = queue
        self.handlers = handlers
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.batch = batch
        self.lease = lease
        self.poll = poll
        self.stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._in_flight = {}          # id -> lease token, for the heartbeat
        self._lost = set()            # ids whose lease was lost
        self._lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------

    def request_stop(self, *_):
        """Signal handler: finish the step in hand, release the rest, exit."""
        self.stopping = True
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def _connect(self):
        return psycopg.connect(self.dsn, autocommit=True, application_name=f"gd_worker {self.name}")

    def run(self):
        with self._connect() as listen, self._connect() as work:
            listen.execute("LISTEN gd_work")
            beat = threading.Thread(target=self._heartbeat_loop, daemon=True)
            beat.start()
            log.info("worker %s serving queue %s", self.name, self.queue)
            while not self.stopping:
                claims = self._claim(work)
                if claims:
                    self._run_batch(work, claims)
                else:
                    self._wait_for_work(listen)
            log.info("worker %s stopped", self.name)

    # -- claiming and running -------------------------------------------------

    def _claim(self, work):
        rows = work.execute(
            "SELECT c.id, c.fsm, c.step, c.state, to_jsonb(c.ctx), c.lease_token"
            "  FROM gd_claim(%s, %s, %s, %s::interval) c",
            [self.queue, self.name, self.batch, _interval(self.lease)]).fetchall()
        return [dict(id=r[0], fsm=r[1], step=r[2], state=r[3], ctx=r[4], token=r[5]) for r in rows]

    def _run_batch(self, work, claims):
        # Every claim of the batch is heartbeated from now on, running or waiting its turn.
        with self._lock:
            self._in_flight.update((c["id"], c["token"]) for c in claims)
        for index, claim in enumerate(claims):
            if self.stopping:
                for unstarted in claims[index:]:
                    work.execute("SELECT gd_release(%s, %s)", [unstarted["id"], unstarted["token"]])
                    self._forget(unstarted)
                log.info("released %d unstarted claims", len(claims) - index)
                return
            self._run_one(work, claim)

    def _forget(self, claim):
        """Stop heartbeating a claim; true if its lease was lost meanwhile."""
        with self._lock:
            self._in_flight.pop(claim["id"], None)
            lost = claim["id"] in self._lost
            self._lost.discard(claim["id"])
        return lost

    def _run_one(self, work, claim):
        with self._lock:
            lost = claim["id"] in self._lost
        if lost:
            self._forget(claim)
            log.warning("instance %s: lease lost before its turn; not run", claim["id"])
            return
        try:
            outcome = self._call_handler(claim)
        finally:
            lost = self._forget(claim)
        if lost:
            log.warning("instance %s: lease lost while running; outcome dropped", claim["id"])
            return
        try:
            applied = self._complete(work, claim, outcome)
        except psycopg.errors.InvalidParameterValue as e:
            # A bad outcome (say, gd_next to an unknown step) changed nothing: count it as a failed attempt.
            applied = self._complete(work, claim, retry({"message": str(e).strip(), "worker": self.name}))
        if not applied:
            log.warning("instance %s: lease lost; outcome dropped", claim["id"])

    def _call_handler(self, claim):
        handler = self.handlers.get((claim["fsm"], claim["step"]))
        if handler is None:
            return retry({"message": f"worker {self.name} has no handler for step "
                                     f"{claim['step']!r} of FSM {claim['fsm']!r}"})
        try:
            outcome = handler(claim["state"], claim["ctx"])
        except Exception as e:  # the step failed: retried with backoff, like a raising SQL handler
            log.info("instance %s step %s raised %r", claim["id"], claim["step"], e)
            return retry({"message": str(e), "type": type(e).__name__, "worker": self.name})
        if not isinstance(outcome, Outcome):
            return retry({"message": f"handler returned {outcome!r}, not an outcome", "worker": self.name})
        return outcome

    def _complete(self, work, claim, outcome):
        row = work.execute(f"SELECT gd_complete(%s, %s, {outcome.sql})",
                           [claim["id"], claim["token"], *outcome.params]).fetchone()
        return row[0]

    # -- waiting and heartbeats -----------------------------------------------

    def _wait_for_work(self, listen):
        """Sleep until our queue is notified, a stop is requested, or the poll interval passes."""
        deadline = time.monotonic() + self.poll
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            ready, _, _ = select.select([listen.fileno(), self._wake_r], [], [], remaining)
            if self._wake_r in ready:
                os.read(self._wake_r, 64)
            if listen.fileno() in ready:
                listen.pgconn.consume_input()
                ours = False
                while (n := listen.pgconn.notifies()) is not None:
                    ours = ours or n.extra.decode() == self.queue
                if ours:
                    return

    def _heartbeat_loop(self):
        """Extend the lease of every step in flight, at a third of the lease; note lost leases."""
        interval = max(self.lease / 3.0, 0.05)
        while True:
            try:
                with self._connect() as conn:
                    while True:
                        time.sleep(interval)
                        with self._lock:
                            in_flight = list(self._in_flight.items())
                        for instance_id, token in in_flight:
                            kept = conn.execute("SELECT gd_heartbeat(%s, %s)", [instance_id, token]).fetchone()[0]
                            if not kept:
                                with self._lock:
                                    if instance_id in self._in_flight:
                                        self._lost.add(instance_id)
            except psycopg.Error as e:
                log.warning("heartbeat connection failed (%s); reconnecting", e)
                time.sleep(interval)


def load_handlers(path):
    """HANDLERS of a Python file, which may `from gd_worker import next_step, done, ...`."""
    sys.modules.setdefault("gd_worker", sys.modules[__name__])
    spec = importlib.util.spec_from_file_location("gd_handlers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HANDLERS


def main():
    parser = argparse.ArgumentParser(description="gen_durable external worker")
    parser.add_argument("--dsn", default="", help="libpq connection string (default: the PG* environment)")
    parser.add_argument("--queue", default="default")
    parser.add_argument("--handlers", required=True, help="Python file defining HANDLERS = {(fsm, step): fn}")
    parser.add_argument("--name", help="worker name recorded as lease_owner (default host:pid)")
    parser.add_argument("--batch", type=int, default=10, help="steps claimed at once")
    parser.add_argument("--lease", type=float, default=30.0, help="lease in seconds")
    parser.add_argument("--poll", type=float, default=10.0, help="seconds between polls without notifications")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s[%(process)d] %(message)s")
    worker = Worker(args.dsn, args.queue, load_handlers(args.handlers), name=args.name,
                    batch=args.batch, lease=args.lease, poll=args.poll)
    signal.signal(signal.SIGTERM, worker.request_stop)
    signal.signal(signal.SIGINT, worker.request_stop)
    worker.run()


if __name__ == "__main__":
    main()
