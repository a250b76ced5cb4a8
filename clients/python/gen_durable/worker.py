"""An external worker, blocking: threads run the external steps (handler =>
NULL) of one or more queues.

    worker = Worker("dbname=app", queues=["payments"], concurrency=4)

    @worker.step("checkout", "charge")
    def charge(state, ctx):
        ctx.connection.execute("INSERT INTO shop.charges VALUES (%s)", [ctx.id])  # commits with the outcome
        return next_step("receipt", {**state, "charged": True})

    worker.run()        # until SIGTERM or SIGINT (or worker.stop()): then it drains

A batch step's handler, registered with @worker.step(fsm, step, batch=True),
is f(states, ctxs) -> [outcome, ...]: called once for the claims of its step
that one claim brought (up to the worker's `batch`), one outcome per claim
in their order; the contexts share one ctx.connection, whose transaction
commits with every outcome of the batch.  A raise or another number of
outcomes is a failed attempt of each.

Each of `concurrency` lanes has its own connection.  It claims up to `batch`
steps of the FSMs it has handlers for (gd_claim(fsms => ...), its own
transaction: another FSM's steps on its queues, or a grant to its role,
never come its way), runs their handlers one after another, each outside
any transaction: a step's transaction begins at its handler's first
statement through ctx.connection and commits with its outcome (gd_complete
in it): a step's writes happen exactly once, with its outcome, and a call
over the network holds no transaction.  The steps that wrote nothing are
completed together (gd_complete_all).  A handler that raises is a failed
attempt, its writes undone; a lost lease (the step was reclaimed and runs
elsewhere) rolls that step's writes back.  Effects outside the database
are at least once: key them by ctx.idempotency_key (the same on every
attempt of a visit of the step).  Each handler runs in a thread of its own, which the lane stops waiting for
at the step's deadline (its timeout: the engine ends the claim there) or at
the drain's limit: ctx.cancelled is set, its writes are rolled back and its
connection closed to it.

A lane with no work waits for it in the server: its claim of its home queue
(lane i: queues[i % len(queues)]) waits up to `wait` seconds for work of
that queue to commit (gd_claim(wait => ...)), one statement, so it works
through a transaction pooler; no LISTEN, no poll.  stop() cancels the
waiting claims.  A heartbeat thread extends the leases of every claim in
hand.  A lost connection is re-opened with backoff; its claims come back
when their leases expire.  stop() (SIGTERM, SIGINT) drains: no new claims,
the batches in hand finish (each handler within drain_timeout seconds) and
commit, and run() returns.  The API's
functions are called in the extension's schema, looked up once per
connection, or in api_schema if given.
"""

import logging
import signal
import threading
from typing import Any, List, Optional, Sequence

import psycopg

from . import _core
from ._core import Claim
from .client import connect, statements
from .outcomes import Outcome, interval

log = logging.getLogger("gen_durable")


class Worker(_core.WorkerSettings):
    def __init__(self, *args, **settings):
        super().__init__(*args, **settings)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._waiting_claims: set = set()              # the lanes' claims waiting in the server (_WaitingClaim)
        self._drain_expired = threading.Event()        # the drain's limit has passed
        self._handlers_running: set = set()            # their done events, set at the drain's limit too

    # -- lifecycle -------------------------------------------------------------

    def stop(self, *_):
        """Drain and stop: no new claims; the batches in hand finish, their handlers within drain_timeout
        seconds.  Safe from signal handlers and threads."""
        if not self._stopping.is_set():
            timer = threading.Timer(self.drain_timeout, self._expire_drain)
            timer.daemon = True
            timer.start()
        self._stopping.set()
        with self._lock:   # (marked under the lock: a lane that ends its claim meanwhile waits for the cancel)
            waiting = list(self._waiting_claims)
            for claim in waiting:
                claim.cancelling.set()
        for claim in waiting:   # (in threads: a cancel is a round trip, and stop() may run in a signal handler)
            threading.Thread(target=claim.cancel, name="gd-cancel", daemon=True).start()

    def run(self, install_signal_handlers: bool = True):
        """Serve until stop(); returns once every lane has finished its batch."""
        if not self.handlers:
            raise ValueError("the worker has no handlers")
        if install_signal_handlers:
            _stop_on_signals([self])
        self._resolve_queues()
        heartbeat = threading.Thread(target=self._heartbeat, name="gd-heartbeat", daemon=True)
        lanes = [threading.Thread(target=self._lane, args=(i,), name=f"gd-lane-{i}") for i in range(self.concurrency)]
        for thread in [heartbeat] + lanes:
            thread.start()
        log.info("worker %s serving queues %s with %d lanes", self.name, ", ".join(self.queues), self.concurrency)
        _join(lanes)
        log.info("worker %s stopped", self.name)

    def _connect(self) -> "tuple[psycopg.Connection, bool]":
        return connect(self.conninfo, self.pooler, application_name=f"gd worker {self.name}")

    def _sql(self, connection: psycopg.Connection) -> _core.Statements:
        return statements(connection, self.api_schema)

    def _resolve_queues(self):
        """Without queues given, the queues the handled steps run on, as defined."""
        if self.queues:
            return
        connection, _ = self._connect()
        with connection:
            self.queues = [row[0] for row in connection.execute(*self.handlers.queues_query()).fetchall()]
        if not self.queues:
            raise self.handlers.no_queues()

    def _sleep(self, seconds: float):
        self._stopping.wait(seconds)

    # -- lanes -----------------------------------------------------------------

    def _lane(self, index: int):
        home = self.queues[index % len(self.queues)]
        backoff = _core.Backoff()
        while not self._stopping.is_set():
            try:
                connection, _ = self._connect()
                with connection:
                    backoff.reset()
                    while not self._stopping.is_set():
                        self._claim_and_run(connection, home)
            except psycopg.OperationalError as e:
                delay = backoff.delay()
                log.warning("worker %s lane %d: connection lost (%s); reconnecting in %.1f s", self.name, index,
                            str(e).strip(), delay)
                self._sleep(delay)

    def _claim_and_run(self, connection: psycopg.Connection, home: str):
        """Claim a batch from the first of the queues that has work, the lane's home queue last, its claim
        waiting in the server for work there; run it."""
        claim, fsms = self._sql(connection).claim, self.handlers.fsms()
        start = self.queues.index(home)
        for offset in range(1, len(self.queues) + 1):
            queue = self.queues[(start + offset) % len(self.queues)]
            parameters = [queue, self.name, self.batch, interval(self.lease), fsms]
            if queue == home:
                rows = self._waiting_claim(connection, claim, parameters)
            else:
                rows = connection.execute(claim, parameters + [None]).fetchall()
            if rows:
                self._run_batch(connection, _core.claims_from(rows, connection))
                return

    def _waiting_claim(self, connection: psycopg.Connection, claim: str, parameters) -> list:
        """gd_claim, waiting up to `wait` seconds in the server for work; stop() cancels it (no rows then)."""
        waiting = _WaitingClaim(connection)
        with self._lock:
            self._waiting_claims.add(waiting)
        try:
            if self._stopping.is_set():
                return []
            return connection.execute(claim, parameters + [interval(self.wait)]).fetchall()
        except psycopg.errors.QueryCanceled:
            if waiting.cancelling.is_set():
                return []
            raise
        finally:
            with self._lock:
                self._waiting_claims.discard(waiting)
            if waiting.cancelling.is_set():
                waiting.cancelled.wait(30)   # the server has it before the lane's next statement

    def _run_batch(self, connection: psycopg.Connection, claims: List[Claim]):
        with self._lock:
            self._in_hand.update((c.id, c.token) for c in claims)
        handled, unhandled = self.handlers.split(claims)
        try:
            if handled:
                self._run_and_complete(connection, handled)
            if unhandled:
                self._release(connection, unhandled, "this worker has no handler for them")
                self._sleep(self.wait)   # not at once again: a worker that has the handlers may take them
        finally:
            with self._lock:
                for c in claims:
                    self._in_hand.pop(c.id, None)

    def _expire_drain(self):
        self._drain_expired.set()
        with self._lock:
            running = list(self._handlers_running)
        for done in running:
            done.set()

    def _run_and_complete(self, connection: psycopg.Connection, claims: List[Claim]):
        """Run the batch's handlers one after another, outside any transaction.  A step whose handler began
        its transaction is completed in it at once; the others together at the end, in one statement.
        Draining: the claims not run yet go back."""
        groups = self.handlers.groups(claims)
        ran, outcomes = [], []
        next_ = 0
        while next_ < len(groups) and not self._stopping.is_set():
            group = groups[next_]
            step_connection = _core.StepConnection(connection)
            group_outcomes = self._call(connection, group, step_connection)
            if group_outcomes == _core.ABANDONED:
                break   # goes back with the rest
            next_ += 1
            if group_outcomes == _core.OVERRAN:
                continue
            if step_connection.began:
                self._complete_in_step_transaction(connection, group, group_outcomes)
            else:
                ran.extend(group)
                outcomes.extend(group_outcomes)
        if ran:
            _core.note_lost_leases(ran, self._complete(connection, ran, outcomes), self.name)
        self._release(connection, [c for group in groups[next_:] for c in group], "the worker is stopping")

    def _call(self, connection: psycopg.Connection, group: List[Claim], step_connection: _core.StepConnection):
        """Run the handler of a group of claims of one step — one claim, or the claims of a step whose handler
        takes a batch, called once with their states and contexts: their outcomes, in order (when it raises,
        returns something else than one outcome per claim, or its transaction failed: a failed attempt of
        each, its transaction rolled back), or OVERRAN when the step's deadline (the group's earliest) passed
        first, ABANDONED when the drain's limit did (its transaction rolled back, ctx.cancelled set,
        ctx.connection closed to it).  The handler runs in a thread of its own, which the lane stops waiting
        for then."""
        first = min(group, key=lambda c: float("inf") if c.expires is None else c.expires)
        left = first.seconds_left()
        if left is not None and left <= 0:
            for claim in group:
                _core.ended_early(claim, _core.OVERRAN, self.name)
            return _core.OVERRAN
        for claim in group:
            claim.context.connection = step_connection
        call = _HandlerCall(lambda: self.handlers.call(group), first)
        ended = self._wait_for(call, first)
        if ended is not None:
            step_connection.end()
            self._roll_back(connection, step_connection)
            for claim in group:
                _core.ended_early(claim, ended, self.name)
            return ended
        try:
            returned = call.result()
        except Exception as e:
            self._roll_back(connection, step_connection)
            log.info("instances %s step %s raised %r", [c.id for c in group], first.step, e)
            return [_core.failed_attempt(e, self.name)] * len(group)
        outcomes, valid = self.handlers.checked(returned, group, self.name)
        if not valid:
            self._roll_back(connection, step_connection)
        return outcomes

    @staticmethod
    def _roll_back(connection: psycopg.Connection, step_connection: _core.StepConnection):
        if step_connection.began:
            connection.execute("ROLLBACK")

    def _wait_for(self, call: "_HandlerCall", claim: Claim) -> Optional[str]:
        """Wait for the handler to end: None when it did, else how the step ended without it."""
        with self._lock:
            self._handlers_running.add(call.done)
        try:
            while not call.finished:
                if self._drain_expired.is_set():
                    return _core.ABANDONED
                left = claim.seconds_left()
                if left is not None and left <= 0:
                    return _core.OVERRAN
                call.done.wait(left)
            return None
        finally:
            with self._lock:
                self._handlers_running.discard(call.done)

    def _complete_in_step_transaction(self, connection: psycopg.Connection, group: List[Claim],
                                      outcomes: List[Outcome]):
        """Complete a group in the transaction its handler began, and commit: its writes with every outcome
        of the group, or none (a lost lease, a refused outcome: rolled back; a refused one, or a transaction
        a failed statement of the handler's aborted: a failed attempt of each)."""
        failure = _core.aborted_step(self.name) if _core.aborted(connection) else None
        completed = []
        if failure is None:
            try:
                completed = [self._complete_one(connection, c, o) for c, o in zip(group, outcomes)]
                connection.execute("COMMIT" if all(completed) else "ROLLBACK")
            except psycopg.errors.InvalidParameterValue as e:
                failure = _core.bad_outcome(e, self.name)
        if failure is not None:
            connection.execute("ROLLBACK")
            completed = self._complete(connection, group, [failure] * len(group))
        elif not all(completed):
            completed = [False] * len(group)
        _core.note_lost_leases(group, completed, self.name)

    def _complete(self, connection: psycopg.Connection, claims: List[Claim], outcomes: List[Outcome]) -> List[bool]:
        """All in one statement; when an outcome is refused, one by one, a refused one as a failed attempt."""
        try:
            rows = connection.execute(self._sql(connection).complete_all,
                                      _core.completion_parameters(claims, outcomes)).fetchall()
            return [completed for _, completed in rows]
        except psycopg.errors.InvalidParameterValue:
            pass
        completed = []
        for claim, outcome in zip(claims, outcomes):
            try:
                completed.append(self._complete_one(connection, claim, outcome))
            except psycopg.errors.InvalidParameterValue as e:
                completed.append(self._complete_one(connection, claim, _core.bad_outcome(e, self.name)))
        return completed

    def _complete_one(self, connection: psycopg.Connection, claim: Claim, outcome: Outcome) -> bool:
        return _core.only_row(connection.execute(self._sql(connection).complete,
                                                 [claim.id, claim.token, _core.jsonb(outcome)]).fetchone())[0]

    def _release(self, connection: psycopg.Connection, claims: List[Claim], why: str):
        for claim in claims:
            connection.execute(self._sql(connection).release, [claim.id, claim.token])
        if claims:
            log.warning("worker %s released %d claims (%s): %s", self.name, len(claims), why,
                        ", ".join(f"{c.fsm}/{c.step} #{c.id}" for c in claims))

    # -- heartbeats ------------------------------------------------------------------

    def _heartbeat(self):
        """Extend the lease of every claim in hand every third of the lease; note the leases lost."""
        every = max(self.lease / 3.0, 0.05)
        backoff = _core.Backoff()
        while not self._stopping.is_set():
            try:
                connection, _ = self._connect()
                with connection:
                    backoff.reset()
                    while not self._stopping.wait(every):
                        with self._lock:
                            in_hand = list(self._in_hand.items())
                        for claim_id, token in in_hand:
                            kept = _core.only_row(connection.execute(self._sql(connection).heartbeat,
                                                                     [claim_id, token, interval(self.lease)]).fetchone())[0]
                            if not kept:   # lost: its completion will be refused too
                                with self._lock:
                                    self._in_hand.pop(claim_id, None)
            except psycopg.OperationalError as e:
                delay = backoff.delay()
                log.warning("worker %s: heartbeat connection lost (%s); reconnecting in %.1f s", self.name,
                            str(e).strip(), delay)
                self._sleep(delay)


class _WaitingClaim:
    """A lane's claim waiting in the server, which stop() cancels.  The lane's next statement waits until
    the cancel request has reached the server (it would cancel that statement instead)."""

    def __init__(self, connection: psycopg.Connection):
        self.connection = connection
        self.cancelling = threading.Event()   # set by stop(), under the worker's lock
        self.cancelled = threading.Event()

    def cancel(self):
        try:
            self.connection.cancel()   # returns once the server has the request
        finally:
            self.cancelled.set()


class _HandlerCall:
    """A handler running in a daemon thread of its own: a lane can stop waiting for it, and a process can
    exit while it still runs."""

    def __init__(self, call, claim: Claim):
        self.done = threading.Event()   # set when it ends (and at the drain's limit, to wake the lane)
        self.finished = False
        self._outcome = None
        self._error: Optional[BaseException] = None
        threading.Thread(target=self._run, args=(call,), name=f"gd-step-{claim.id}", daemon=True).start()

    def _run(self, call):
        try:
            self._outcome = call()
        except BaseException as e:   # handed to the lane, which makes it a failed attempt
            self._error = e
        self.finished = True
        self.done.set()

    def result(self):
        if self._error is not None:
            raise self._error
        return self._outcome


def run_workers(workers: Sequence[Worker]):
    """Serve several databases from one process, a Worker for each, until
    SIGTERM or SIGINT drains them all.  The partitions of a sharded engine
    (sharding/README.md) need one each: a claim waits for the work of its
    own database."""
    _stop_on_signals(workers)
    threads = [threading.Thread(target=worker.run, args=(False,), name=f"gd-worker-{n}")
               for n, worker in enumerate(workers)]
    for thread in threads:
        thread.start()
    _join(threads)


def _stop_on_signals(workers: Sequence[Worker]):
    if threading.current_thread() is threading.main_thread():
        def stop(*_):
            for worker in workers:
                worker.stop()
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)


def _join(threads: Sequence[threading.Thread]):
    while any(thread.is_alive() for thread in threads):
        for thread in threads:
            thread.join(timeout=0.2)   # short joins: signal handlers run in this thread
