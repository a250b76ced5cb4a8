"""The client and the worker for asyncio: the same calls and the same
behaviour as gen_durable.client and gen_durable.worker (read those for what
they do), on psycopg's AsyncConnection.  Handlers of an AsyncWorker are
coroutine functions (`async def`), given ctx.connection, the lane's
AsyncConnection whose first statement begins the step's transaction (see
StepConnectionBase); a plain function is called as it is, blocking the loop
while it runs.

    async with await AsyncClient.connect("dbname=app") as client:
        order_id = await client.insert("checkout", {"sku": "tea"})
        settled = await client.wait(order_id, timeout=10)
"""

import asyncio
import contextlib
import inspect
import logging
import signal
from typing import Any, Iterable, List, Mapping, Optional, Union

import psycopg

from . import _core
from ._core import Claim, Instance, Settled, jsonb
from .outcomes import Outcome, Seconds, interval

log = logging.getLogger("gen_durable")


async def connect(conninfo: str = "", pooler: Optional[bool] = None,
                  **options) -> "tuple[psycopg.AsyncConnection, bool]":
    """As gen_durable.client.connect, for asyncio."""
    connection = await psycopg.AsyncConnection.connect(conninfo, **_core.connection_options(bool(pooler)), **options)
    if pooler is None:
        cursor = await connection.execute(_core.SERVER_PORT)
        pooler = _core.behind_pooler(connection.info.port, _core.only_row(await cursor.fetchone())[0])
        if pooler:
            connection.prepare_threshold = None
    return connection, pooler


async def statements(connection: psycopg.AsyncConnection, api_schema: Optional[str] = None) -> _core.Statements:
    """As gen_durable.client.statements, for asyncio."""
    known = _core.known_statements(connection, api_schema)
    if known is None:
        cursor = await connection.execute(_core.API_SCHEMA)
        known = _core.remember_statements(connection, await cursor.fetchone())
    return known


class AsyncClient:
    """gen_durable.client.Client for asyncio: `await AsyncClient.connect(conninfo)`, or AsyncClient(connection)."""

    def __init__(self, connection: psycopg.AsyncConnection, *, own: bool = False, api_schema: Optional[str] = None):
        self.connection = connection
        self._own = own
        self.api_schema = _core.api_schema_option(api_schema)

    @classmethod
    async def connect(cls, conninfo: str = "", *, pooler: Optional[bool] = None,
                      api_schema: Optional[str] = None) -> "AsyncClient":
        _core.api_schema_option(api_schema)   # a bad one fails before a connection is opened
        return cls((await connect(conninfo, pooler))[0], own=True, api_schema=api_schema)

    async def close(self):
        if self._own:
            await self.connection.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def transaction(self):
        return self.connection.transaction()

    async def _sql(self) -> _core.Statements:
        return await statements(self.connection, self.api_schema)

    async def _one(self, sql: str, parameters) -> Any:
        cursor = await self.connection.execute(sql, parameters)
        return _core.only_row(await cursor.fetchone())[0]

    async def insert(self, fsm: str, state: Optional[Mapping] = None, **options) -> Optional[int]:
        return await self._one((await self._sql()).insert, _core.insert_parameters(fsm, state, options))

    async def insert_all(self, fsm: str, entries: Iterable[Mapping]) -> List[int]:
        cursor = await self.connection.execute((await self._sql()).insert_all, [fsm, jsonb(list(entries))])
        return [row[0] for row in await cursor.fetchall()]

    async def signal(self, target: Union[int, str], name: str, payload: Any = None, *,
                     dedup_key: Optional[str] = None, missing_ok: bool = False,
                     expires: Optional[Seconds] = None) -> Optional[bool]:
        return await self._one((await self._sql()).signal,
                               [target, name, jsonb(payload if payload is not None else {}), dedup_key, missing_ok,
                                interval(expires)])

    async def wait(self, instance_id: int, timeout: Seconds = 5, until: str = "settled") -> Settled:
        cursor = await self.connection.execute((await self._sql()).wait, [instance_id, interval(timeout), until])
        return Settled(*_core.only_row(await cursor.fetchone()))

    async def cancel(self, instance_id: int, reason: Optional[str] = None) -> bool:
        return await self._one((await self._sql()).cancel, [instance_id, reason])

    async def retry(self, instance_id: int) -> bool:
        return await self._one((await self._sql()).retry, [instance_id])

    async def rewind(self, instance_id: int, step: str, state: Optional[Mapping] = None) -> bool:
        return await self._one((await self._sql()).rewind, [instance_id, step, jsonb(state)])

    async def fork(self, instance_id: int, entry: int, state: Optional[Mapping] = None) -> int:
        return await self._one((await self._sql()).fork, [instance_id, entry, jsonb(state)])

    async def migrate(self, fsm: str, from_version: int, to_version: int,
                      step_map: Optional[Mapping[str, str]] = None) -> int:
        return await self._one((await self._sql()).migrate,
                               [fsm, from_version, to_version, jsonb(dict(step_map or {}))])

    async def get(self, instance_id: int) -> Optional[Instance]:
        cursor = await self.connection.execute(_core.GET, [instance_id])
        row = await cursor.fetchone()
        return None if row is None else Instance(*row)

    async def drain(self, queue: str, with_scheduled: bool = False, max_steps: int = 1000) -> int:
        return await self._one((await self._sql()).drain, [queue, with_scheduled, max_steps])


class AsyncWorker(_core.WorkerSettings):
    """gen_durable.worker.Worker for asyncio: lanes are tasks, each with its own connection."""

    # made by run(), in its event loop (an Event made earlier would belong to another loop on Python 3.9)
    _stopping: asyncio.Event
    _drain_expired: asyncio.Event

    def __init__(self, *args, **settings):
        super().__init__(*args, **settings)
        self._running = False
        self._waiting_claims: set = set()   # the lanes' claims waiting in the server (_WaitingClaim)

    def stop(self):
        """Drain and stop (call it in the worker's event loop, or via its signal handlers): no new claims; the
        batches in hand finish, their handlers within drain_timeout seconds."""
        if self._running:
            if not self._stopping.is_set():
                asyncio.get_running_loop().call_later(self.drain_timeout, self._drain_expired.set)
            self._stopping.set()
            for waiting in self._waiting_claims:
                waiting.cancel()

    async def run(self, install_signal_handlers: bool = True):
        if not self.handlers:
            raise ValueError("the worker has no handlers")
        self._stopping = asyncio.Event()
        self._drain_expired = asyncio.Event()
        self._running = True
        if not self.queues:
            connection, _ = await self._connect()
            async with connection:
                cursor = await connection.execute(*self.handlers.queues_query())
                self.queues = [row[0] for row in await cursor.fetchall()]
            if not self.queues:
                raise self.handlers.no_queues()
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
        heartbeat = asyncio.create_task(self._heartbeat())
        log.info("worker %s serving queues %s with %d lanes", self.name, ", ".join(self.queues), self.concurrency)
        try:
            await asyncio.gather(*(self._lane(i) for i in range(self.concurrency)))
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
            if install_signal_handlers:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
        log.info("worker %s stopped", self.name)

    async def _connect(self):
        return await connect(self.conninfo, self.pooler, application_name=f"gd worker {self.name}")

    async def _sql(self, connection) -> _core.Statements:
        return await statements(connection, self.api_schema)

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; true when the sleep was cut short by a stop."""
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    async def _lane(self, index: int):
        home = self.queues[index % len(self.queues)]
        backoff = _core.Backoff()
        while not self._stopping.is_set():
            try:
                connection, _ = await self._connect()
                async with connection:
                    backoff.reset()
                    while not self._stopping.is_set():
                        await self._claim_and_run(connection, home)
            except psycopg.OperationalError as e:
                delay = backoff.delay()
                log.warning("worker %s lane %d: connection lost (%s); reconnecting in %.1f s", self.name, index,
                            str(e).strip(), delay)
                await self._sleep(delay)

    async def _claim_and_run(self, connection, home: str):
        claim, fsms = (await self._sql(connection)).claim, self.handlers.fsms()
        start = self.queues.index(home)
        for offset in range(1, len(self.queues) + 1):
            queue = self.queues[(start + offset) % len(self.queues)]
            parameters = [queue, self.name, self.batch, interval(self.lease), fsms]
            if queue == home:
                rows = await self._waiting_claim(connection, claim, parameters)
            else:
                rows = await (await connection.execute(claim, parameters + [None])).fetchall()
            if rows:
                await self._run_batch(connection, _core.claims_from(rows, connection))
                return

    async def _waiting_claim(self, connection, claim: str, parameters) -> list:
        """As Worker._waiting_claim."""
        waiting = _WaitingClaim(connection)
        self._waiting_claims.add(waiting)
        try:
            if self._stopping.is_set():
                return []
            return await (await connection.execute(claim, parameters + [interval(self.wait)])).fetchall()
        except psycopg.errors.QueryCanceled:
            if waiting.cancelled is not None:
                return []
            raise
        finally:
            self._waiting_claims.discard(waiting)
            if waiting.cancelled is not None:
                await waiting.cancelled   # the server has it before the lane's next statement

    async def _run_batch(self, connection, claims: List[Claim]):
        self._in_hand.update((c.id, c.token) for c in claims)
        handled, unhandled = self.handlers.split(claims)
        try:
            if handled:
                await self._run_and_complete(connection, handled)
            if unhandled:
                await self._release(connection, unhandled, "this worker has no handler for them")
                await self._sleep(self.wait)
        finally:
            for c in claims:
                self._in_hand.pop(c.id, None)

    async def _run_and_complete(self, connection, claims: List[Claim]):
        """As Worker._run_and_complete."""
        ran, outcomes = [], []
        next_ = 0
        while next_ < len(claims) and not self._stopping.is_set():
            claim = claims[next_]
            step_connection = AsyncStepConnection(connection)
            outcome = await self._call(connection, claim, step_connection)
            if outcome == _core.ABANDONED:
                break   # goes back with the rest
            next_ += 1
            if outcome == _core.OVERRAN:
                continue
            if step_connection.began:
                await self._complete_in_step_transaction(connection, claim, outcome)
            else:
                ran.append(claim)
                outcomes.append(outcome)
        if ran:
            _core.note_lost_leases(ran, await self._complete(connection, ran, outcomes), self.name)
        await self._release(connection, claims[next_:], "the worker is stopping")

    async def _call(self, connection, claim: Claim, step_connection: "AsyncStepConnection"):
        """As Worker._call for one claim: its outcome, or OVERRAN / ABANDONED, when the handler's task is cancelled."""
        left = claim.seconds_left()
        if left is not None and left <= 0:
            _core.ended_early(claim, _core.OVERRAN, self.name)
            return _core.OVERRAN
        handler = self.handlers.find(claim)
        claim.context.connection = step_connection

        async def handle():
            outcome = handler(claim.state, claim.context)
            return await outcome if inspect.isawaitable(outcome) else outcome

        task = asyncio.ensure_future(handle())
        drained = asyncio.ensure_future(self._drain_expired.wait())
        try:
            await asyncio.wait({task, drained}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            drained.cancel()
        if not task.done():
            step_connection.end()
            task.cancel()   # not awaited: a handler that ignores it is left behind
            how = _core.ABANDONED if self._drain_expired.is_set() else _core.OVERRAN
            if connection.info.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
                # Its query still runs on the lane's connection: nothing can be rolled back there until it
                # ends.  The connection is closed (the batch's other outcomes are lost with it: their claims
                # run again after their leases), the lane reconnects.
                await connection.close()
                raise psycopg.OperationalError(f"instance {claim.id} step {claim.step} {how} while its query ran")
            await self._roll_back(connection, step_connection)
            _core.ended_early(claim, how, self.name)
            return how
        try:
            outcome = task.result()
        except Exception as e:
            await self._roll_back(connection, step_connection)
            log.info("instance %s step %s raised %r", claim.id, claim.step, e)
            return _core.failed_attempt(e, self.name)
        if not isinstance(outcome, Outcome):
            await self._roll_back(connection, step_connection)
            return _core.not_an_outcome(outcome, self.name)
        return outcome

    @staticmethod
    async def _roll_back(connection, step_connection: "AsyncStepConnection"):
        if step_connection.began:
            await connection.execute("ROLLBACK")

    async def _complete_in_step_transaction(self, connection, claim: Claim, outcome: Outcome):
        """As Worker._complete_in_step_transaction, for one claim."""
        failure = _core.aborted_step(self.name) if _core.aborted(connection) else None
        if failure is None:
            try:
                completed = await self._complete_one(connection, claim, outcome)
                await connection.execute("COMMIT" if completed else "ROLLBACK")
            except psycopg.errors.InvalidParameterValue as e:
                failure = _core.bad_outcome(e, self.name)
        if failure is not None:
            await connection.execute("ROLLBACK")
            completed = await self._complete_one(connection, claim, failure)
        _core.note_lost_leases([claim], [completed], self.name)

    async def _complete(self, connection, claims: List[Claim], outcomes: List[Outcome]) -> List[bool]:
        try:
            cursor = await connection.execute((await self._sql(connection)).complete_all,
                                              _core.completion_parameters(claims, outcomes))
            return [completed for _, completed in await cursor.fetchall()]
        except psycopg.errors.InvalidParameterValue:
            pass
        completed = []
        for claim, outcome in zip(claims, outcomes):
            try:
                completed.append(await self._complete_one(connection, claim, outcome))
            except psycopg.errors.InvalidParameterValue as e:
                completed.append(await self._complete_one(connection, claim, _core.bad_outcome(e, self.name)))
        return completed

    async def _complete_one(self, connection, claim: Claim, outcome: Outcome) -> bool:
        cursor = await connection.execute((await self._sql(connection)).complete,
                                          [claim.id, claim.token, jsonb(outcome)])
        return _core.only_row(await cursor.fetchone())[0]

    async def _release(self, connection, claims: List[Claim], why: str):
        for claim in claims:
            await connection.execute((await self._sql(connection)).release, [claim.id, claim.token])
        if claims:
            log.warning("worker %s released %d claims (%s): %s", self.name, len(claims), why,
                        ", ".join(f"{c.fsm}/{c.step} #{c.id}" for c in claims))

    async def _heartbeat(self):
        every = max(self.lease / 3.0, 0.05)
        backoff = _core.Backoff()
        while not self._stopping.is_set():
            try:
                connection, _ = await self._connect()
                async with connection:
                    backoff.reset()
                    while not await self._sleep(every):
                        for claim_id, token in list(self._in_hand.items()):
                            cursor = await connection.execute((await self._sql(connection)).heartbeat,
                                                              [claim_id, token, interval(self.lease)])
                            if not _core.only_row(await cursor.fetchone())[0]:   # lost: so will its completion be
                                self._in_hand.pop(claim_id, None)
            except psycopg.OperationalError as e:
                delay = backoff.delay()
                log.warning("worker %s: heartbeat connection lost (%s); reconnecting in %.1f s", self.name,
                            str(e).strip(), delay)
                await self._sleep(delay)


class _WaitingClaim:
    """A lane's claim waiting in the server, which stop() cancels (in the loop's executor: libpq's cancel
    blocks until the server has the request)."""

    def __init__(self, connection):
        self.connection = connection
        self.cancelled: Optional[asyncio.Future] = None

    def cancel(self):
        if self.cancelled is None:
            self.cancelled = asyncio.get_running_loop().run_in_executor(None, self.connection.cancel)


class AsyncStepConnection(_core.StepConnectionBase):
    """StepConnectionBase for the asyncio worker: its statements are awaited (the handler's task is
    cancelled when its step ends without it)."""

    async def execute(self, *args, **kwargs):
        return await (await self._begun()).execute(*args, **kwargs)

    def cursor(self, *args, **kwargs) -> "_StepCursor":
        return _StepCursor(self, self._usable().cursor(*args, **kwargs))

    @contextlib.asynccontextmanager
    async def transaction(self, *args, **kwargs):
        """A savepoint in the step's transaction."""
        async with (await self._begun()).transaction(*args, **kwargs) as transaction:
            yield transaction

    def end(self):
        self._ended = True

    async def _begun(self):
        connection = self._usable()
        if not self.began:
            self.began = True   # (before the await: a statement the handler sends meanwhile queues after BEGIN)
            await connection.execute("BEGIN")
        return connection


class _StepCursor:
    """A cursor of ctx.connection (asyncio): its statements begin the step's transaction too."""

    def __init__(self, step_connection: AsyncStepConnection, cursor):
        self._step_connection = step_connection
        self._cursor = cursor

    async def execute(self, *args, **kwargs) -> "_StepCursor":
        await self._step_connection._begun()
        await self._cursor.execute(*args, **kwargs)
        return self

    async def executemany(self, *args, **kwargs):
        await self._step_connection._begun()
        await self._cursor.executemany(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._cursor, name)

    async def __aenter__(self) -> "_StepCursor":
        return self

    async def __aexit__(self, *exc):
        await self._cursor.close()
