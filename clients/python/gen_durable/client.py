"""The API from Python, blocking: one statement per call (so it goes through
a transaction pooler), on a connection of its own or on yours, inside your
transaction (`with client.transaction(): ...`: an insert commits with your
writes, or not at all)."""

from typing import Any, Iterable, List, Mapping, Optional, Union

import psycopg

from . import _core
from ._core import Instance, Settled, jsonb
from .outcomes import Seconds, interval


def connect(conninfo: str = "", pooler: Optional[bool] = None, **options) -> "tuple[psycopg.Connection, bool]":
    """A connection in autocommit, and whether a pooler is in between (asked,
    or seen: the server does not listen on the port reached)."""
    connection = psycopg.connect(conninfo, **_core.connection_options(bool(pooler)), **options)
    if pooler is None:
        server_port = _core.only_row(connection.execute(_core.SERVER_PORT).fetchone())[0]
        pooler = _core.behind_pooler(connection.info.port, server_port)
        if pooler:
            connection.prepare_threshold = None
    return connection, pooler


def statements(connection: psycopg.Connection, api_schema: Optional[str] = None) -> _core.Statements:
    """The statements that call the API in the connection's database: in schema
    api_schema if given, else in the extension's (looked up once)."""
    return (_core.known_statements(connection, api_schema)
            or _core.remember_statements(connection, connection.execute(_core.API_SCHEMA).fetchone()))


class Client:
    """gd_insert, gd_signal, gd_await, ... as methods.

    Client(conninfo) opens a connection (autocommit; no server-side prepared
    statements behind a pooler); Client(connection=conn) uses yours as it is.
    api_schema names the schema of the API's functions (a PL/Proxy router's,
    which has no extension); by default it is the extension's, looked up.
    """

    def __init__(self, conninfo: str = "", *, connection: Optional[psycopg.Connection] = None,
                 pooler: Optional[bool] = None, api_schema: Optional[str] = None):
        self.api_schema = _core.api_schema_option(api_schema)
        self._own = connection is None
        self.connection: psycopg.Connection = connection if connection is not None else connect(conninfo, pooler)[0]

    def close(self):
        if self._own:
            self.connection.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def transaction(self):
        """A transaction (or a savepoint inside one) on the client's connection."""
        return self.connection.transaction()

    def _sql(self) -> _core.Statements:
        return statements(self.connection, self.api_schema)

    def _one(self, sql: str, parameters) -> Any:
        return _core.only_row(self.connection.execute(sql, parameters).fetchone())[0]

    def insert(self, fsm: str, state: Optional[Mapping] = None, **options) -> Optional[int]:
        """gd_insert: the new instance's id (options by name: step, queue, priority, concurrency_key,
        correlation_key, correlation_scope, rate_limit, weight, eligible_at, schedule_in (seconds),
        on_duplicate, trace_context: a W3C traceparent, debounce and throttle (seconds), on_throttle, fairness_key);
        the pending instance a debounced insert joined; None when on_duplicate='skip' skipped it or on_throttle='drop' dropped
        it."""
        return self._one(self._sql().insert, _core.insert_parameters(fsm, state, options))

    def insert_all(self, fsm: str, entries: Iterable[Mapping]) -> List[int]:
        """gd_insert_all: one instance per insert option object, in one statement."""
        rows = self.connection.execute(self._sql().insert_all, [fsm, jsonb(list(entries))]).fetchall()
        return [row[0] for row in rows]

    def signal(self, target: Union[int, str], name: str, payload: Any = None, *, dedup_key: Optional[str] = None,
               missing_ok: bool = False, expires: Optional[Seconds] = None) -> Optional[bool]:
        """gd_signal to an instance id or correlation key: False for a duplicate dedup_key; None, with
        missing_ok, when the target is not live (else psycopg.errors.NoDataFound, P0002); not consumed
        after `expires` seconds."""
        return self._one(self._sql().signal,
                         [target, name, jsonb(payload if payload is not None else {}), dedup_key, missing_ok,
                          interval(expires)])

    def wait(self, instance_id: int, timeout: Seconds = 5, until: str = "settled") -> Settled:
        """gd_await: where the instance is once it settles (until='settled': parked, ended) or ends
        (until='terminal'), or at the timeout."""
        row = self.connection.execute(self._sql().wait, [instance_id, interval(timeout), until]).fetchone()
        return Settled(*_core.only_row(row))

    def cancel(self, instance_id: int, reason: Optional[str] = None) -> bool:
        return self._one(self._sql().cancel, [instance_id, reason])

    def retry(self, instance_id: int) -> bool:
        return self._one(self._sql().retry, [instance_id])

    def rewind(self, instance_id: int, step: str, state: Optional[Mapping] = None) -> bool:
        """gd_rewind: a failed or stuck live instance back to `step` of its version, with `state` (else its own);
        False when it is done or cancelled (fork it), or not one you may use.  Needs the FSM owner's rights."""
        return self._one(self._sql().rewind, [instance_id, step, jsonb(state)])

    def fork(self, instance_id: int, entry: int, state: Optional[Mapping] = None) -> int:
        """gd_fork: the id of a new instance started at the step of entry `entry` (its number in gd_history) of
        the instance's step history, with the state that step started with, or `state`."""
        return self._one(self._sql().fork, [instance_id, entry, jsonb(state)])

    def migrate(self, fsm: str, from_version: int, to_version: int,
                step_map: Optional[Mapping[str, str]] = None) -> int:
        """gd_migrate: how many live instances of `fsm` moved from one version to another, each to the step
        `step_map` ({old: new}) names for its step (else one of the same name); all or none."""
        return self._one(self._sql().migrate, [fsm, from_version, to_version, jsonb(dict(step_map or {}))])

    def get(self, instance_id: int) -> Optional[Instance]:
        """The instance's row of gd.instances, or None (no such instance, or not one you may use)."""
        row = self.connection.execute(_core.GET, [instance_id]).fetchone()
        return None if row is None else Instance(*row)

    def drain(self, queue: str, with_scheduled: bool = False, max_steps: int = 1000) -> int:
        """gd_drain, for tests: run your FSMs' runnable in-database steps of `queue` here, until none is left."""
        return self._one(self._sql().drain, [queue, with_scheduled, max_steps])
