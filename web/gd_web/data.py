"""What the dashboard reads and does: every statement, each run on a
connection of the dashboard's role, so the views show that role's rows and
the API decides what it may do.  Reads go through the views of schema gd;
actions through the API functions, qualified with the extension's schema.
Every name is qualified (built-ins with pg_catalog, operators written
OPERATOR(pg_catalog.x)): a role with CREATE on the database could make a
schema named after the dashboard's role ("$user" of the default search_path)
holding functions and operators of the same names, or of closer argument
types than the built-ins'.  What a request gives is checked here before it
reaches PostgreSQL, and refused with BadInput."""

import dataclasses
import datetime
import math
import re
from typing import Any, Dict, List, Optional, Sequence

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

STATUSES = ("runnable", "executing", "awaiting_signal", "awaiting_children", "done", "failed", "cancelled")
LIVE_STATUSES = STATUSES[:4]
PAGE_SIZE = 50
BULK_LIMIT = 1000  # instances one bulk action changes at most
SORTS = ("newest", "oldest", "priority")
INT4, INT8 = 2 ** 31 - 1, 2 ** 63 - 1


class BadInput(ValueError):
    """A request's parameter the dashboard will not send: answered 400 with this message."""


def text(source, name: str) -> str:
    """A text parameter of a query string or form, stripped (PostgreSQL's text holds no NUL byte)."""
    value = source.get(name) or ""
    if not isinstance(value, str):
        raise BadInput(f"{name} must be text, not a file")
    if "\x00" in value:
        raise BadInput(f"{name} contains a NUL byte")
    return value.strip()


def integer(value: str, low: int, high: int, what: str) -> int:
    """value as an integer from low to high (the range of the PostgreSQL type it goes to)."""
    if not re.fullmatch(r"-?[0-9]{1,20}", value) or not low <= int(value) <= high:
        raise BadInput(f"{what} must be an integer from {low} to {high}, got {value[:40]!r}")
    return int(value)


def rows(conn, query, params: Sequence[Any] = ()) -> List[Dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def session(conn) -> Dict[str, Any]:
    """The schema of the API functions (CREATE EXTENSION's; None without the extension), the session's role and
    whether it is a superuser now (is_superuser follows SET ROLE, and a role set by the connection string)."""
    return rows(conn, "SELECT (SELECT n.nspname FROM pg_catalog.pg_extension e"
                      "          JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
                      "         WHERE e.extname OPERATOR(pg_catalog.=) 'gen_durable') AS api_schema,"
                      "       current_user AS role,"
                      "       pg_catalog.current_setting('is_superuser') OPERATOR(pg_catalog.=) 'on' AS superuser")[0]


def api(schema: str, function: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(function))


# -- overview -----------------------------------------------------------------

def queues(conn) -> List[Dict[str, Any]]:
    return rows(conn, "SELECT * FROM gd.queue_stats ORDER BY queue")


def workers(conn) -> List[Dict[str, Any]]:
    return rows(conn, "SELECT pid, kind, database, queue, instance_id, since FROM gd.workers"
                      " ORDER BY kind, database NULLS FIRST, queue NULLS FIRST, pid")


def external_workers(conn) -> List[Dict[str, Any]]:
    """The external workers holding claims now (of instances the role sees), with how many and their oldest."""
    return rows(conn, "SELECT lease_owner AS worker, queue, pg_catalog.count(*) AS claims,"
                      "       pg_catalog.min(updated_at) AS since"
                      "  FROM gd.instances WHERE status OPERATOR(pg_catalog.=) 'executing' AND lease_owner IS NOT NULL"
                      " GROUP BY lease_owner, queue ORDER BY lease_owner, queue")


def counters(conn) -> List[Dict[str, Any]]:
    return rows(conn, "SELECT event, count, total_ms, since FROM gd.stats WHERE count OPERATOR(pg_catalog.>) 0"
                      " ORDER BY event")


def step_stats(conn) -> List[Dict[str, Any]]:
    return rows(conn, "SELECT database, fsm, version, step, kind, count, total_ms, max_ms, p50_ms, p95_ms, p99_ms,"
                      "       latency_histogram FROM gd.step_stats"
                      " WHERE database OPERATOR(pg_catalog.=) pg_catalog.current_database() OR database IS NULL"
                      " ORDER BY fsm, version, step, kind")


# -- the latency histogram (src/labelled_stats.cpp's buckets) ------------------

BUCKETS_PER_DOUBLING = 4


def _bucket_lower_us(bucket: int) -> float:
    return 0.0 if bucket == 0 else 2.0 ** (bucket / BUCKETS_PER_DOUBLING)


def quantile_ms(histogram: Sequence[int], q: float) -> Optional[float]:
    """The q-quantile of bucket counts, read as the engine reads it (within 9%)."""
    total = sum(histogram)
    if total == 0:
        return None
    rank, below = max(q * total, 1.0), 0
    for bucket, count in enumerate(histogram):
        if count and below + count >= rank:
            fraction = (rank - below) / count
            lower, upper = _bucket_lower_us(bucket), _bucket_lower_us(bucket + 1)
            value = upper * fraction if bucket == 0 else lower * math.pow(upper / lower, fraction)
            return value / 1000.0
        below += count
    return None


# -- instances ----------------------------------------------------------------

@dataclasses.dataclass
class InstanceFilter:
    queue: str = ""
    fsm: str = ""
    status: str = ""
    step: str = ""
    key: str = ""            # correlation key prefix
    since: str = ""          # created at or after (any time PostgreSQL reads)
    until: str = ""          # created before
    sort: str = "newest"     # newest | oldest | priority

    @classmethod
    def from_query(cls, query) -> "InstanceFilter":
        """The filter of a query string or form.  A status or order it does not know is refused, not dropped:
        a bulk action would otherwise apply to more than was asked."""
        found = cls(**{f.name: text(query, f.name) or f.default for f in dataclasses.fields(cls)})
        if found.sort not in SORTS:
            raise BadInput(f"the order is one of {', '.join(SORTS)}, got {found.sort[:40]!r}")
        if found.status and found.status not in STATUSES:
            raise BadInput(f"the status is one of {', '.join(STATUSES)}, got {found.status[:40]!r}")
        return found

    def params(self) -> Dict[str, str]:
        """The non-empty fields, for links that keep the filter."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v and not (k == "sort" and v == "newest")}

    def arguments(self) -> Dict[str, Any]:
        """gd.read_instances' filter arguments (NULL: any)."""
        return {"queue": self.queue or None, "fsm": self.fsm or None, "status": self.status or None,
                "step": self.step or None, "key_prefix": self.key or None,
                "created_from": self.since or None, "created_to": self.until or None}


def _cursor(flt: InstanceFilter, after: str) -> Dict[str, Optional[int]]:
    """Keyset: the page starts after this id (and priority, in priority order)."""
    if not after:
        return {"after_id": None, "after_priority": None}
    if flt.sort != "priority":
        return {"after_id": integer(after, -INT8 - 1, INT8, "the page cursor (after)"), "after_priority": None}
    priority, _, last_id = after.partition(":")
    return {"after_id": integer(last_id, -INT8 - 1, INT8, "the page cursor's id (after)"),
            "after_priority": integer(priority, -INT4 - 1, INT4, "the page cursor's priority (after)")}


READ_INSTANCES = ("SELECT * FROM gd.read_instances(queue => %(queue)s, fsm => %(fsm)s, status => %(status)s,"
                  " step => %(step)s, key_prefix => %(key_prefix)s,"
                  " created_from => %(created_from)s::pg_catalog.timestamptz,"
                  " created_to => %(created_to)s::pg_catalog.timestamptz, sort => %(sort)s, after_id => %(after_id)s,"
                  " after_priority => %(after_priority)s, page_size => %(page_size)s, parent_id => %(parent_id)s)")


def _read(conn, flt: InstanceFilter, **page) -> List[Dict[str, Any]]:
    """gd.read_instances with the filter and these page arguments.  Its times are left to PostgreSQL to read
    (its formats, its time zone names): one it cannot read is the request's fault."""
    try:
        return rows(conn, READ_INSTANCES, {**flt.arguments(), "sort": flt.sort, "after_id": None,
                                           "after_priority": None, "parent_id": None, **page})
    except psycopg.errors.DataError as error:  # SQLSTATE class 22: the other arguments are checked above
        raise BadInput(f"bad time in the filter: {error.diag.message_primary}") from None


def instances(conn, flt: InstanceFilter, after: str = "") -> (List[Dict[str, Any]], Optional[str]):
    """One page of instances and the cursor of the next (None on the last page)."""
    found = _read(conn, flt, **_cursor(flt, after), page_size=PAGE_SIZE + 1)
    page, more = found[:PAGE_SIZE], len(found) > PAGE_SIZE
    if not more:
        return page, None
    last = page[-1]
    return page, (f"{last['priority']}:{last['id']}" if flt.sort == "priority" else str(last["id"]))


def matching_ids(conn, flt: InstanceFilter, statuses: Sequence[str]) -> List[int]:
    """The ids a bulk action applies to: the filter's, in these statuses, at most BULK_LIMIT."""
    ids = []
    for status in statuses:
        if flt.status and flt.status != status:
            continue
        ids += [r["id"] for r in _read(conn, flt, status=status, sort="oldest", page_size=BULK_LIMIT)]
    return sorted(ids)[:BULK_LIMIT]


def choices(conn) -> Dict[str, List[str]]:
    """What the filter's lists offer: the queues and FSMs the role sees."""
    return {"queues": [r["name"] for r in rows(conn, "SELECT name FROM gd.queues ORDER BY name")],
            "fsms": [r["name"] for r in rows(conn, "SELECT DISTINCT name FROM gd.fsms ORDER BY name")]}


def instance(conn, instance_id: int) -> Optional[Dict[str, Any]]:
    """The instance, and whether this role may repair it (rewind, fork, migrate: a member of its owner)."""
    found = rows(conn, "SELECT i.*, pg_catalog.pg_has_role(i.owner, 'MEMBER') AS may_repair"
                       "  FROM gd.instances i WHERE i.id OPERATOR(pg_catalog.=) %s", [instance_id])
    return found[0] if found else None


def signals(conn, instance_id: int) -> List[Dict[str, Any]]:
    return rows(conn, "SELECT id, name, payload, dedup_key, delivered_at, consumed_at FROM gd.signals"
                      " WHERE instance_id OPERATOR(pg_catalog.=) %s ORDER BY id", [instance_id])


def family(conn, instance_id: int, limit: int = 500) -> List[Dict[str, Any]]:
    """The instance's descendants, depth first, each with its depth (from 1), at most `limit`."""
    found: List[Dict[str, Any]] = []

    def children_of(parent: int, depth: int):
        if depth > 20:
            return
        for child in _read(conn, InstanceFilter(), sort="oldest", page_size=limit, parent_id=parent):
            if len(found) >= limit:
                return
            found.append({"id": child["id"], "fsm": child["fsm"], "step": child["step"],
                          "status": child["status"], "depth": depth})
            children_of(child["id"], depth + 1)

    children_of(instance_id, 1)
    return found


def history(conn, schema: str, instance_id: int) -> List[Dict[str, Any]]:
    """The instance's step history through gd_history, whose entry numbers are the ones gd_fork takes."""
    return rows(conn, sql.SQL("SELECT entry, attempt, step, kind, started_at, ended_at, duration, error, worker,"
                              "       state, detail FROM {}(%s) ORDER BY entry").format(api(schema, "gd_history")),
                [instance_id])


def history_entry(conn, schema: str, instance_id: int, entry: int) -> Optional[Dict[str, Any]]:
    """One entry of the instance's step history; None when there is none, or this role cannot see the instance."""
    if instance(conn, instance_id) is None:
        return None
    found = [h for h in history(conn, schema, instance_id) if h["entry"] == entry]
    return found[0] if found else None


def definition(conn, fsm: str, version: int) -> Dict[str, Any]:
    found = rows(conn, "SELECT * FROM gd.fsms WHERE name OPERATOR(pg_catalog.=) %s"
                       "   AND version OPERATOR(pg_catalog.=) %s", [fsm, version])
    steps = rows(conn, "SELECT s.step, s.handler,"
                       "       s.max_attempts, s.backoff, s.max_backoff, s.timeout, s.rate_limit, s.queue,"
                       "       s.batch, s.batch_wait, s.chain"
                       "  FROM gd.steps s WHERE s.fsm OPERATOR(pg_catalog.=) %s"
                       "   AND s.version OPERATOR(pg_catalog.=) %s ORDER BY s.step",
                 [fsm, version])
    return {"fsm": found[0] if found else None, "steps": steps}


# -- schedules and limits -----------------------------------------------------

def schedules(conn) -> List[Dict[str, Any]]:
    return rows(conn, "SELECT * FROM gd.schedules ORDER BY name")


def rate_limits(conn) -> List[Dict[str, Any]]:
    return rows(conn, """
        SELECT l.name, l.rate, l.per, l.burst, l.shared, s.wanted, s.granted, s.throttled
          FROM gd.rate_limits l
          LEFT JOIN gd.limit_stats s ON s.kind OPERATOR(pg_catalog.=) 'rate_limit'
                                    AND s.name OPERATOR(pg_catalog.=) l.name AND s.partition IS NULL
                                    AND s.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
         ORDER BY l.name""")


def owner_weights(conn) -> List[Dict[str, Any]]:
    return rows(conn, "SELECT w.owner::text AS owner, w.weight FROM gd.owner_weights w ORDER BY 1")


# The statuses in which an instance holds a key, by the limit's scope (docs/reference.md, Flow control).
HOLDING_STATUSES = {"step": ["runnable", "executing"],
                    "run": ["runnable", "executing", "awaiting_signal", "awaiting_children"]}


def concurrency_limits(conn) -> List[Dict[str, Any]]:
    """Each limit with the instances the role sees holding it now (running, or live for a limit of the run scope),
    and waiting (one count each, by the engine's key indexes: the name is a constant, so the view can hand the
    condition down)."""
    limits = rows(conn, """
        SELECT l.name, l.max, l.shared, l.scope, s.throttled
          FROM gd.concurrency_limits l
          LEFT JOIN gd.limit_stats s ON s.kind OPERATOR(pg_catalog.=) 'concurrency'
                                    AND s.name OPERATOR(pg_catalog.=) l.name AND s.partition IS NULL
                                    AND s.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
         ORDER BY l.name""")
    for limit in limits:
        limit.update(rows(conn, """
            SELECT (SELECT pg_catalog.count(*) FROM gd.instances i
                     WHERE (i.concurrency_key OPERATOR(pg_catalog.=) %(name)s
                            OR pg_catalog.starts_with(i.concurrency_key, %(prefix)s))
                       AND NOT i.gated AND i.status OPERATOR(pg_catalog.=) ANY (%(holding)s)) AS holding,
                   (SELECT pg_catalog.count(*) FROM gd.instances i
                     WHERE (i.concurrency_key OPERATOR(pg_catalog.=) %(name)s
                            OR pg_catalog.starts_with(i.concurrency_key, %(prefix)s))
                       AND i.gated AND i.status OPERATOR(pg_catalog.=) 'runnable') AS waiting""",
                          {"name": limit["name"], "prefix": limit["name"] + ":",
                           "holding": HOLDING_STATUSES[limit["scope"]]})[0])
    return limits


# -- actions ------------------------------------------------------------------

def cancel_plan(conn, instance_id: int) -> Optional[Dict[str, Any]]:
    """What a gd_cancel of the instance would do, and to what: the instance (FSM, version, step, status,
    attempt, correlation key, when it was created), whether it is compensating already, the compensation step
    its FSM version names (on_cancel; None: it just ends), and how many of its children are live (each is
    cancelled too).  None when this role cannot see it."""
    found = rows(conn, "SELECT i.fsm, i.version, i.step, i.status, i.attempt, i.correlation_key, i.created_at,"
                       "       i.cancelled IS NOT NULL AS compensating, f.on_cancel,"
                       "       (SELECT pg_catalog.count(*) FROM gd.instances c"
                       "         WHERE c.parent_id OPERATOR(pg_catalog.=) i.id"
                       "           AND c.status OPERATOR(pg_catalog.<>) ALL ('{done,failed,cancelled}')) AS live_children"
                       "  FROM gd.instances i LEFT JOIN gd.fsms f ON f.name OPERATOR(pg_catalog.=) i.fsm"
                       "                                       AND f.version OPERATOR(pg_catalog.=) i.version"
                       " WHERE i.id OPERATOR(pg_catalog.=) %s", [instance_id])
    return found[0] if found else None


def cancel(conn, schema: str, instance_id: int, reason: str) -> bool:
    return conn.execute(sql.SQL("SELECT {}(%s, %s)").format(api(schema, "gd_cancel")),
                        [instance_id, reason or None]).fetchone()[0]


def retry(conn, schema: str, instance_id: int) -> bool:
    return conn.execute(sql.SQL("SELECT {}(%s)").format(api(schema, "gd_retry")), [instance_id]).fetchone()[0]


def rewind(conn, schema: str, instance_id: int, step: str, state: str) -> bool:
    """state: JSON text read by PostgreSQL, or '' to keep the instance's own."""
    query = sql.SQL("SELECT {}(%s::pg_catalog.int8, %s, %s::pg_catalog.jsonb)")
    return conn.execute(query.format(api(schema, "gd_rewind")), [instance_id, step, state or None]).fetchone()[0]


def fork(conn, schema: str, instance_id: int, entry: int, state: str) -> int:
    """state: JSON text read by PostgreSQL, or '' for the one the entry kept."""
    query = sql.SQL("SELECT {}(%s::pg_catalog.int8, %s::pg_catalog.int4, %s::pg_catalog.jsonb)")
    return conn.execute(query.format(api(schema, "gd_fork")), [instance_id, entry, state or None]).fetchone()[0]


def fsm_versions(conn, fsm: str) -> List[Dict[str, Any]]:
    """The FSM's versions with how many live instances each has (those this role sees): what gd_migrate moves."""
    return rows(conn, "SELECT f.version, (SELECT pg_catalog.count(*) FROM gd.instances i"
                      "                   WHERE i.fsm OPERATOR(pg_catalog.=) f.name"
                      "                     AND i.version OPERATOR(pg_catalog.=) f.version"
                      "                     AND i.status OPERATOR(pg_catalog.=) ANY (%s)) AS live"
                      "  FROM gd.fsms f WHERE f.name OPERATOR(pg_catalog.=) %s ORDER BY f.version",
                [list(LIVE_STATUSES), fsm])


def migrate(conn, schema: str, fsm: str, from_version: int, to_version: int, step_map: str) -> int:
    """step_map: JSON text read by PostgreSQL, or '' for none."""
    query = sql.SQL("SELECT {}(%s, %s::pg_catalog.int4, %s::pg_catalog.int4, %s::pg_catalog.jsonb)")
    return conn.execute(query.format(api(schema, "gd_migrate")),
                        [fsm, from_version, to_version, step_map or "{}"]).fetchone()[0]


def signal(conn, schema: str, instance_id: int, name: str, payload: str, dedup_key: str) -> Optional[bool]:
    """payload: JSON text, read by PostgreSQL (as jsonb holds it: no NUL, no lone surrogate)."""
    query = sql.SQL("SELECT {}(%s::pg_catalog.int8, %s, %s::pg_catalog.jsonb, dedup_key => %s)")
    return conn.execute(query.format(api(schema, "gd_signal")),
                        [instance_id, name, payload, dedup_key or None]).fetchone()[0]


def pause(conn, schema: str, queue: str, paused: bool) -> bool:
    function = "gd_pause" if paused else "gd_resume"
    return conn.execute(sql.SQL("SELECT {}(%s)").format(api(schema, function)), [queue]).fetchone()[0]


def age(moment: Optional[datetime.datetime], now: datetime.datetime) -> str:
    """How long ago, shortly: '3 s', '5 min', '2 h', '4 d'."""
    if moment is None:
        return ""
    seconds = max((now - moment).total_seconds(), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"
