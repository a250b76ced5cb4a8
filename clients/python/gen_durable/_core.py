"""What the blocking and the asyncio clients and workers share: the SQL they
send, the shapes of what comes back, handler look-up, reconnect backoff,
and how a pooler between the client and the server is recognised."""

import dataclasses
import functools
import logging
import os
import random
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import psycopg
from psycopg.types.json import Jsonb

from .outcomes import Outcome, interval, retry

log = logging.getLogger("gen_durable")

# -- statements ---------------------------------------------------------------
# Every name is qualified with its schema: on the session's search_path
# ("$user", public) a role that may create schemas could make one named after
# ours and put its own gd_claim, or a to_jsonb(gd.context) (an exact type
# match beats pg_catalog's polymorphic one), in our way.  Built-ins are
# pg_catalog's; the API's functions are in the schema the extension was
# created in, looked up once per connection (API_SCHEMA, remember_statements),
# or in the one given (api_schema: a PL/Proxy router's, sharding/README.md).

# The schema of the API functions, quoted as an identifier.
API_SCHEMA = ("SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e"
              "  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
              " WHERE e.extname OPERATOR(pg_catalog.=) 'gen_durable'")


class Statements:
    """The statements that call the API, its functions in schema `api` (quoted)."""

    def __init__(self, api: str):
        self.insert = (
            f"SELECT {api}.gd_insert(%(fsm)s, %(state)s, step => %(step)s, queue => %(queue)s,"
            " priority => %(priority)s, concurrency_key => %(concurrency_key)s,"
            " correlation_key => %(correlation_key)s, correlation_scope => %(correlation_scope)s,"
            " rate_limit => %(rate_limit)s, weight => %(weight)s, eligible_at => %(eligible_at)s,"
            " schedule_in => %(schedule_in)s::interval, on_duplicate => %(on_duplicate)s,"
            " trace_context => %(trace_context)s, debounce => %(debounce)s::interval,"
            " throttle => %(throttle)s::interval, on_throttle => %(on_throttle)s,"
            " fairness_key => %(fairness_key)s)")
        self.insert_all = f"SELECT {api}.gd_insert_all(%s, %s)"
        self.signal = f"SELECT {api}.gd_signal(%s, %s, %s, dedup_key => %s, missing_ok => %s, expires => %s::interval)"
        self.wait = f"SELECT status, step, attempt, result, error FROM {api}.gd_await(%s, %s::interval, %s)"
        self.cancel = f"SELECT {api}.gd_cancel(%s, %s)"
        self.retry = f"SELECT {api}.gd_retry(%s::bigint)"   # not gd_retry(error jsonb), the outcome
        self.rewind = f"SELECT {api}.gd_rewind(%s::bigint, %s, %s)"
        self.fork = f"SELECT {api}.gd_fork(%s::bigint, %s, %s)"
        self.migrate = f"SELECT {api}.gd_migrate(%s, %s, %s, %s)"
        self.drain = f"SELECT {api}.gd_drain(%s, with_scheduled => %s, max_steps => %s)"
        # Only steps of the FSMs the worker has handlers for (fsms).
        # The last column: seconds until the step's deadline (NULL: none), by the server's clock.
        self.claim = ("SELECT c.id, c.fsm, c.version, c.step, c.state, pg_catalog.to_jsonb(c.ctx), c.lease_token,"
                      " pg_catalog.date_part('epoch', (pg_catalog.to_jsonb(c.ctx) OPERATOR(pg_catalog.->>) 'deadline')"
                      "::pg_catalog.timestamptz OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp())"
                      f"  FROM {api}.gd_claim(%s, %s, %s, %s::interval, fsms => %s::text[], wait => %s::interval) c")
        # One completion statement for a batch: gd_outcome turns each JSON outcome into a gd.outcome.
        self.complete_all = (
            f"SELECT id, completed FROM {api}.gd_complete_all(%s::bigint[], %s::bigint[],"
            f" ARRAY(SELECT {api}.gd_outcome(o) FROM pg_catalog.unnest(%s::jsonb[]) WITH ORDINALITY AS u(o, n)"
            " ORDER BY n))")
        self.complete = f"SELECT {api}.gd_complete(%s, %s, {api}.gd_outcome(%s))"
        self.release = f"SELECT {api}.gd_release(%s, %s)"
        self.heartbeat = f"SELECT {api}.gd_heartbeat(%s, %s, %s::interval)"


_statements: "weakref.WeakKeyDictionary[Any, Statements]" = weakref.WeakKeyDictionary()


def api_schema_option(api_schema: Optional[str]) -> Optional[str]:
    """The api_schema a client or a worker is given: None (look it up), or a schema's name as it is."""
    if api_schema is not None and (not isinstance(api_schema, str) or not api_schema or "\0" in api_schema):
        raise ValueError(f"api_schema must be a schema's name, not {api_schema!r}")
    return api_schema


@functools.lru_cache(maxsize=32)
def _named_statements(api_schema: str) -> Statements:
    return Statements('"' + api_schema.replace('"', '""') + '"')


def known_statements(connection, api_schema: Optional[str] = None) -> Optional[Statements]:
    """The statements of the API schema given (nothing looked up), else the
    connection's, if its API schema was looked up already."""
    if api_schema is not None:
        return _named_statements(api_schema)
    return _statements.get(connection)


def remember_statements(connection, row: Optional[Tuple[str]]) -> Statements:
    """The connection's statements, from API_SCHEMA's row."""
    if row is None:
        raise psycopg.errors.UndefinedObject(
            f"gen_durable: extension gen_durable is not installed in database {connection.info.dbname!r}"
            " (CREATE EXTENSION gen_durable)")
    statements = _statements[connection] = Statements(row[0])
    return statements


GET = ("SELECT id, fsm, version, step, status, state, attempt, result, error, correlation_key, queue, parent_id,"
       "       created_at, updated_at, finished_at FROM gd.instances WHERE id OPERATOR(pg_catalog.=) %s::bigint")
# The queues steps run on, as defined (a step's own, else its FSM's).
QUEUES_OF_STEPS = ("SELECT DISTINCT coalesce(s.queue, f.queue) FROM gd.steps s"
                   "  JOIN gd.fsms f ON f.name OPERATOR(pg_catalog.=) s.fsm"
                   "   AND f.version OPERATOR(pg_catalog.=) s.version"
                   "  JOIN ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::text[])) AS h(fsm, step)"
                   "    ON h.fsm OPERATOR(pg_catalog.=) s.fsm AND h.step OPERATOR(pg_catalog.=) s.step"
                   " ORDER BY 1")
# The port the server listens on, to compare with the one the client reached.
SERVER_PORT = "SELECT pg_catalog.current_setting('port')"


def only_row(row: Optional[Sequence[Any]]) -> Sequence[Any]:
    """The row of a statement that always returns one (an API call, SERVER_PORT)."""
    if row is None:
        raise psycopg.InterfaceError("gen_durable: the statement returned no row")
    return row

CHANNEL = "gd_work"
INVALID_PARAMETER_VALUE = "22023"


def jsonb(value):
    return None if value is None else Jsonb(value)


def insert_parameters(fsm: str, state: Optional[Mapping], options: Mapping[str, Any]) -> Dict[str, Any]:
    """gd_insert's arguments by name, the defaults where `options` says nothing."""
    unknown = set(options) - {"step", "queue", "priority", "concurrency_key", "correlation_key", "correlation_scope",
                              "rate_limit", "weight", "eligible_at", "schedule_in", "on_duplicate", "trace_context",
                              "debounce", "throttle", "on_throttle", "fairness_key"}
    if unknown:
        raise TypeError(f"unknown insert options: {', '.join(sorted(unknown))}")
    parameters: Dict[str, Any] = dict(step=None, queue=None, priority=0, concurrency_key=None, correlation_key=None,
                      correlation_scope=None, rate_limit=None, weight=1, eligible_at=None, schedule_in=None,
                      on_duplicate="error", trace_context=None, debounce=None, throttle=None, on_throttle="drop",
                      fairness_key=None)
    parameters.update(options)
    parameters.update(fsm=fsm, state=jsonb(state if state is not None else {}),
                      schedule_in=interval(parameters["schedule_in"]), debounce=interval(parameters["debounce"]),
                      throttle=interval(parameters["throttle"]))
    if parameters["correlation_scope"] is not None:
        parameters["correlation_scope"] = list(parameters["correlation_scope"])
    return parameters


# -- what comes back ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Settled:
    """What gd_await returns: where the instance is now."""
    status: str
    step: Optional[str]
    attempt: Optional[int]
    result: Any
    error: Any


@dataclasses.dataclass(frozen=True)
class Instance:
    """A row of gd.instances."""
    id: int
    fsm: str
    version: int
    step: str
    status: str
    state: Dict[str, Any]
    attempt: int
    result: Any
    error: Any
    correlation_key: Optional[str]
    queue: str
    parent_id: Optional[int]
    created_at: Any
    updated_at: Any
    finished_at: Any


@dataclasses.dataclass
class Context:
    """What a step is told (gd.context), and, in a worker, the connection whose
    transaction commits the step's completion: writes made through it happen
    exactly once, with the step's outcome."""
    id: int
    fsm: str
    version: int
    step: str
    attempt: int
    correlation_key: Optional[str]
    signals: List[Any]
    children: List[Any]
    timed_out: bool
    queue: str
    # The same for every attempt of this visit of the step (retries, reclaims,
    # other workers), another for a later visit: key external effects by it.
    idempotency_key: str
    trace_context: Optional[str] = None  # the W3C traceparent the instance was inserted with
    deadline: Optional[str] = None       # when the step's timeout ends it (ISO 8601, the server's clock); None: never
    # ctx.cancelled, set while the instance runs its FSM's on_cancel step: why a
    # gd_cancel sent it there and where it was ({reason, step, attempt, status,
    # at, ...}).  (`cancelled` is the handler's stop event below.)
    cancellation: Optional[Dict[str, Any]] = None
    connection: Any = None
    # Set when the step ended without the handler (its deadline passed, or the
    # worker's drain reached its limit): the handler should stop; its
    # connection is no longer its own.
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)


@dataclasses.dataclass
class Claim:
    id: int
    fsm: str
    version: int
    step: str
    state: Dict[str, Any]
    context: Context
    token: int
    expires: Optional[float] = None   # the step's deadline by time.monotonic(); None: none

    def seconds_left(self) -> Optional[float]:
        return None if self.expires is None else self.expires - time.monotonic()


def claims_from(rows, connection) -> List[Claim]:
    claims = []
    for id_, fsm, version, step, state, ctx, token, seconds_left in rows:
        context = Context(id=ctx["id"], fsm=ctx["fsm"], version=ctx["version"], step=ctx["step"],
                          attempt=ctx["attempt"], correlation_key=ctx.get("correlation_key"),
                          signals=ctx.get("signals") or [], children=ctx.get("children") or [],
                          timed_out=bool(ctx.get("timed_out")), queue=ctx["queue"],
                          trace_context=ctx.get("trace_context"), idempotency_key=ctx["idempotency_key"],
                          deadline=ctx.get("deadline"), cancellation=ctx.get("cancelled"), connection=connection)
        expires = None if seconds_left is None else time.monotonic() + seconds_left
        claims.append(Claim(id_, fsm, version, step, state, context, token, expires))
    return claims


def completion_parameters(claims: Sequence[Claim], outcomes: Sequence[Outcome]):
    return [[c.id for c in claims], [c.token for c in claims], [Jsonb(o) for o in outcomes]]


# -- handlers ----------------------------------------------------------------------

Handler = Callable[[Dict[str, Any], Context], Outcome]


class Handlers:
    """The steps a worker runs: {(fsm, step): handler}."""

    def __init__(self, handlers: Optional[Mapping[Tuple[str, str], Handler]] = None):
        self._by_step: Dict[Tuple[str, str], Handler] = dict(handlers or {})
        self._batched: set = set()   # the steps whose handler takes a batch: (states, ctxs) -> outcomes

    def register(self, fsm: str, step: str, batch: bool = False) -> Callable[[Handler], Handler]:
        def decorate(handler: Handler) -> Handler:
            self._by_step[(fsm, step)] = handler
            if batch:
                self._batched.add((fsm, step))
            else:
                self._batched.discard((fsm, step))
            return handler
        return decorate

    def batched(self, claim: Claim) -> bool:
        """Does the claim's handler take a batch (a list of states and one of contexts)?"""
        return (claim.fsm, claim.step) in self._batched

    def find(self, claim: Claim) -> Handler:
        """The claim's handler (split keeps the claims that have one)."""
        return self._by_step[(claim.fsm, claim.step)]

    def groups(self, claims: List[Claim]) -> List[List[Claim]]:
        """The claims as their handlers are called, in their order: each alone, but those of a step whose
        handler takes a batch together, where the first of them is (one call for them)."""
        grouped: List[List[Claim]] = []
        batches: Dict[Tuple[str, str], List[Claim]] = {}
        for claim in claims:
            key = (claim.fsm, claim.step)
            if not self.batched(claim):
                grouped.append([claim])
            elif key in batches:
                batches[key].append(claim)
            else:
                batches[key] = [claim]
                grouped.append(batches[key])
        return grouped

    def call(self, group: List[Claim]) -> Any:
        """Call the handler of a group of claims of one step (one, or a batch handler's): what it returned, as
        a list for one claim."""
        handler: Any = self.find(group[0])
        if self.batched(group[0]):
            return handler([c.state for c in group], [c.context for c in group])
        return [handler(group[0].state, group[0].context)]

    def checked(self, returned: Any, group: List[Claim], worker: str) -> Tuple[List[Outcome], bool]:
        """call's result and True when it is one outcome per claim; else a failed attempt of each, and False."""
        if isinstance(returned, (list, tuple)) and len(returned) == len(group) \
                and all(isinstance(o, Outcome) for o in returned):
            return list(returned), True
        return [not_an_outcome(returned if self.batched(group[0]) else returned[0], worker)] * len(group), False

    def handles(self, claim: Claim) -> bool:
        return (claim.fsm, claim.step) in self._by_step

    def steps(self):
        return sorted(self._by_step)

    def fsms(self):
        """The FSMs it has handlers for: the only ones a worker claims steps of."""
        return sorted({fsm for fsm, _ in self._by_step})

    def queues_query(self):
        """QUEUES_OF_STEPS and its parameters, for these steps."""
        steps = self.steps()
        return QUEUES_OF_STEPS, [[fsm for fsm, _ in steps], [step for _, step in steps]]

    def split(self, claims: Sequence["Claim"]):
        """The claims this worker has handlers for, and the others."""
        return [c for c in claims if self.handles(c)], [c for c in claims if not self.handles(c)]

    def no_queues(self):
        return ValueError(f"none of the steps {self.steps()} is defined: give the worker its queues")

    def __bool__(self):
        return bool(self._by_step)


# What became of a step whose handler did not end in time (the workers' _call).
OVERRAN = "overran"       # its deadline passed: not completed, the engine ends the claim and retries the step
ABANDONED = "abandoned"   # the drain's limit passed: handed back


class StepEnded(Exception):
    """A handler used its connection after its step ended without it."""


class StepConnectionBase:
    """ctx.connection in a worker: the lane's connection, the handler's while
    its step runs.  The handler runs outside any transaction: the step's
    transaction begins at its first statement through ctx.connection
    (execute, cursor, transaction), and the lane ends it with the step's
    outcome (gd_complete, then COMMIT), so what the handler wrote commits
    with its outcome, once, and a handler that only calls the network holds
    no transaction.  Committing, rolling back and closing are the lane's.
    Once the step has ended without its handler (past its deadline, or the
    drain's limit) the lane has moved on, and it refuses to be used."""

    def __init__(self, connection):
        self._connection = connection
        self._ended = False
        self.began = False   # the step's transaction (the lane commits or rolls it back)

    def __getattr__(self, name):
        connection = self._usable()
        if name in _THE_LANES:
            raise psycopg.ProgrammingError(f"gen_durable: {name}() is the worker's: the step's writes commit "
                                           "with its outcome")
        return getattr(connection, name)

    def _usable(self):
        if self._ended:
            raise StepEnded("gen_durable: this step has ended (past its deadline, or its worker stopped): "
                            "its connection is no longer the handler's")
        return self._connection


class StepConnection(StepConnectionBase):
    """StepConnectionBase for the blocking worker, whose handlers run in threads of their own."""

    def __init__(self, connection):
        super().__init__(connection)
        self._lock = threading.Lock()

    def end(self):
        """The step ended without its handler: refuse it the connection from now on, and cancel a statement
        of its still running (the lane rolls the step's transaction back next, once that has returned)."""
        self._ended = True
        while not self._lock.acquire(timeout=0.1):   # a statement of the handler's is in flight
            cancel_running_query(self._connection)
        self._lock.release()

    # Each holds the lock while it runs: end() waits for it, so no statement of the handler's runs after.
    def execute(self, *args, **kwargs):
        with self._lock:
            return self._begun().execute(*args, **kwargs)

    def cursor(self, *args, **kwargs):
        with self._lock:
            return self._begun().cursor(*args, **kwargs)

    def transaction(self, *args, **kwargs):
        """A savepoint in the step's transaction."""
        with self._lock:
            return self._begun().transaction(*args, **kwargs)

    def _begun(self):
        connection = self._usable()
        if not self.began:
            connection.execute("BEGIN")
            self.began = True
        return connection


_THE_LANES = frozenset({"commit", "rollback", "close", "set_autocommit"})


def cancel_running_query(connection):
    """Cancel what a handler left running on the lane's connection, so that the lane can roll it back."""
    if connection.info.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
        connection.cancel()


def aborted(connection) -> bool:
    """A statement of the handler's failed in the step's transaction (and it went on)."""
    return connection.info.transaction_status == psycopg.pq.TransactionStatus.INERROR


def aborted_step(worker: str) -> Outcome:
    return retry({"message": "a statement of the handler failed and its transaction was aborted", "worker": worker})


def note_lost_leases(claims: Sequence[Claim], completed: Sequence[bool], worker: str):
    lost = [c.id for c, ok in zip(claims, completed) if not ok]
    if lost:
        log.warning("worker %s: the leases of instances %s were lost (reclaimed: the steps run again); their "
                    "outcomes and writes were not kept", worker, lost)


def ended_early(claim: Claim, ended: str, worker: str):
    """Say why a step ended without its handler; the handler is told through ctx.cancelled."""
    claim.context.cancelled.set()
    if ended == OVERRAN:
        log.warning("worker %s: instance %s step %s ran past its deadline; the engine retries it", worker, claim.id,
                    claim.step)
    else:
        log.warning("worker %s: instance %s step %s was still running at the drain's limit; it is handed back", worker,
                    claim.id, claim.step)


def failed_attempt(error: BaseException, worker: str) -> Outcome:
    """A handler raised: the attempt failed, as when an in-database handler raises."""
    return retry({"message": str(error), "type": type(error).__name__, "worker": worker})


def not_an_outcome(value: Any, worker: str) -> Outcome:
    return retry({"message": f"the handler returned {value!r}, not an outcome", "worker": worker})


def bad_outcome(error: BaseException, worker: str) -> Outcome:
    """gd_complete refused the outcome (say, gd_next to an unknown step): a failed attempt."""
    return retry({"message": str(error).strip(), "worker": worker})


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# -- reconnecting ---------------------------------------------------------------------

class Backoff:
    """Waits between reconnect attempts: doubling from `first` up to `most`, with jitter."""

    def __init__(self, first: float = 0.5, most: float = 30.0):
        self.first = first
        self.most = most
        self.next = first

    def delay(self) -> float:
        delay = self.next * random.uniform(0.5, 1.0)
        self.next = min(self.next * 2, self.most)
        return delay

    def reset(self):
        self.next = self.first


# -- poolers ---------------------------------------------------------------------------

def behind_pooler(reached_port: Optional[int], server_port: str) -> bool:
    """A pooler (or another proxy) sits between us when the server does not
    listen on the port the client reached.  Only a heuristic: a port mapped
    by a container says the same, and costs nothing but prepared statements."""
    return reached_port is not None and str(reached_port) != str(server_port)


def connection_options(pooler: bool) -> Dict[str, Any]:
    """psycopg.connect's options: no server-side prepared statements through
    a pooler (a transaction pool hands each transaction another server
    connection, which does not have them)."""
    return {"autocommit": True, "prepare_threshold": None if pooler else 5}


class WorkerSettings:
    """What Worker and AsyncWorker are given (see worker.py for each setting)."""

    def __init__(self, conninfo: str = "", handlers: Optional[Mapping[Tuple[str, str], Handler]] = None, *,
                 queues: Optional[Sequence[str]] = None, concurrency: int = 1, batch: int = 10,
                 lease: float = 30.0, wait: float = 5.0, name: Optional[str] = None,
                 pooler: Optional[bool] = None, api_schema: Optional[str] = None, drain_timeout: float = 30.0):
        if concurrency < 1 or batch < 1:
            raise ValueError("concurrency and batch must be at least 1")
        if not 0 < wait <= 3600:
            raise ValueError("wait must be between 0 and 3600 seconds")
        self.conninfo = conninfo
        self.handlers = Handlers(handlers)
        self.queues: List[str] = list(queues) if queues else []   # empty: the queues of the steps, found at run
        self.concurrency = concurrency
        self.batch = batch
        self.lease = lease
        self.wait = wait
        self.name = name or default_worker_name()
        self.pooler = pooler
        self.api_schema = api_schema_option(api_schema)
        self.drain_timeout = drain_timeout
        self._in_hand: Dict[int, int] = {}       # claim id -> lease token, for the heartbeat

    def step(self, fsm: str, step: str, batch: bool = False):
        """Decorator: run this function for `step` of `fsm`: f(state, ctx) -> outcome, or, with batch=True,
        f(states, ctxs) -> [outcome, ...], called once for the claims of the step a claim brought."""
        return self.handlers.register(fsm, step, batch)

