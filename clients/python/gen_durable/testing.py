"""Testing FSMs: one transaction, rolled back at the end, in which a test runs
in-database steps (gd_drain), claims and runs external steps with their
handlers, ends waits and joins, and moves its clock (gen_durable.now).
Put the FSM on a queue no executor serves and nothing happens behind the
test's back.

    from gen_durable.testing import TestTransaction

    class CheckoutTest(unittest.TestCase):
        def test_a_parcel_never_shipped(self):
            with TestTransaction("dbname=app_test") as t:
                order = t.client.insert("checkout", {"sku": "tea"})   # defined on queue checkout_test
                t.drain("checkout_test")                                  # reserve
                t.run_external("checkout_test", {("checkout", "charge"): charge})
                t.drain("checkout_test")                                  # ship: waits a day for 'shipped'
                t.advance(days=1, seconds=1)
                t.drain("checkout_test")                                  # the wait timed out
                self.assertEqual(t.client.get(order).status, "done")
"""

import datetime
import logging
from typing import Any, List, Mapping, Optional, Tuple, Union

import psycopg

from . import _core
from ._core import Handler
from .client import Client, connect
from .outcomes import Outcome, interval

log = logging.getLogger("gen_durable")

Handlers = Union[Mapping[Tuple[str, str], Handler], _core.WorkerSettings]


class TestTransaction:
    """A transaction on a connection of its own (or yours, in autocommit), rolled back when the block ends.
    `client` calls the API in it; `now` is its clock (the transaction's start, until advance() moves it)."""

    __test__ = False   # not a test case, for runners that collect classes named Test*

    def __init__(self, conninfo: str = "", *, connection: Optional[psycopg.Connection] = None,
                 api_schema: Optional[str] = None):
        self._own = connection is None
        self.connection: psycopg.Connection = connection if connection is not None else connect(conninfo)[0]
        self.client = Client(connection=self.connection, api_schema=api_schema)
        self.now = datetime.datetime.now(datetime.timezone.utc)

    def __enter__(self) -> "TestTransaction":
        self.connection.execute("BEGIN")
        self.now = _core.only_row(self.connection.execute("SELECT pg_catalog.now()").fetchone())[0]
        return self

    def __exit__(self, *exc):
        self.connection.execute("ROLLBACK")
        if self._own:
            self.connection.close()

    def drain(self, queue: str, with_scheduled: bool = False, max_steps: int = 1000) -> int:
        """gd_drain: the queue's in-database steps due by the test's clock, and the waits and joins due."""
        return self.client.drain(queue, with_scheduled=with_scheduled, max_steps=max_steps)

    def advance(self, **delta: float) -> datetime.datetime:
        """Move the test's clock forward (datetime.timedelta's arguments: days=1, seconds=1, ...)."""
        return self.set_clock(self.now + datetime.timedelta(**delta))

    def set_clock(self, now: datetime.datetime) -> datetime.datetime:
        self.connection.execute("SELECT pg_catalog.set_config('gen_durable.now', %s, true)", [now.isoformat()])
        self.now = now
        return now

    def run_external(self, queue: str, handlers: Handlers, batch: int = 100) -> int:
        """Claim the external steps of `queue` due by the test's clock, of the FSMs `handlers` has handlers for
        (a mapping {(fsm, step): handler}, or a Worker, whose batch handlers are called once for their
        step's claims), run each handler as a worker would (its writes through ctx.connection in the test's
        transaction; one that raises is a failed attempt, its writes undone) and complete it.  Returns how
        many ran."""
        known = handlers.handlers if isinstance(handlers, _core.WorkerSettings) else _core.Handlers(handlers)
        sql = self.client._sql()
        rows = self.connection.execute(sql.claim, [queue, "test", batch, interval(60), known.fsms(), None]).fetchall()
        claims = []
        for claim in _core.claims_from(rows, self.connection):
            if known.handles(claim):
                claims.append(claim)
            else:
                self.connection.execute(sql.release, [claim.id, claim.token])
        ran = 0
        for group in known.groups(claims):
            for claim, outcome in zip(group, self._call(known, group)):
                _core.only_row(self.connection.execute(sql.complete, [claim.id, claim.token,
                                                                      _core.jsonb(outcome)]).fetchone())
                ran += 1
        return ran

    def _call(self, known: _core.Handlers, group: List[_core.Claim]) -> List[Outcome]:
        """The group's outcomes (a batch handler's claims of one step, or one claim), as a worker gets them;
        the writes of a handler that raises, or returns no outcome, undone."""
        for claim in group:
            claim.context.connection = self.connection
        try:
            with self.connection.transaction():   # a savepoint: a failed call's writes are undone
                outcomes, valid = known.checked(known.call(group), group, "test")
                if not valid:
                    raise psycopg.Rollback()
        except Exception as e:
            log.info("instances %s step %s raised %r", [c.id for c in group], group[0].step, e)
            return [_core.failed_attempt(e, "test")] * len(group)
        return outcomes
