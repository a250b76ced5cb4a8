"""gd-web: the HTTP side.  Server-rendered pages (Jinja2, every value
escaped), refreshed in place every 2 s by static/live.js; each action is a
POST from a confirmation page, carrying the CSRF token of its browser (a
random cookie repeated in the form), run as the dashboard's role through the
API, whose refusal is shown as it is.  It answers only to its own host
names (DNS rebinding), refuses to run as a superuser unless told to, and
answers a parameter it will not send to PostgreSQL with 400."""

import contextlib
import datetime
import hmac
import ipaddress
import json
import os
import secrets
import time
from typing import Any, Iterable, List
from urllib.parse import urlencode

import psycopg
from markupsafe import Markup
from psycopg_pool import ConnectionPool
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from . import charts, data

HERE = os.path.dirname(__file__)
CSRF_COOKIE = "gd_web_csrf"
LIVE_HEADER = "x-gd-live"  # static/live.js asks for the page's live part only
QUEUE_STATS_SECONDS = 5.0
CONNECTION = {"application_name": "gd-web"}
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


class Refusal(RuntimeError):
    """The database or the role the dashboard was given is not one it runs on."""


class Session(psycopg.Connection):
    """A connection that knows the schema of the API functions, looked up when it was opened."""
    api_schema = ""


def default_hosts(host: str, port: int) -> List[str]:
    """The Host headers of the address the dashboard listens on, with its port and without (behind a proxy on
    port 80), and those of localhost's other names when it is a loopback address."""
    names = [f"[{host}]" if ":" in host else host]
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            names += LOOPBACK_NAMES
    return [name for base in dict.fromkeys(names) for name in (f"{base}:{port}", base)]


class AllowedHosts:
    """Answers only requests for one of the dashboard's own host names.  A page elsewhere can rebind its own name
    to this address (DNS rebinding) and then read and post as if it were the dashboard's, same origin, CSRF
    cookie included: its requests carry that foreign name as Host, and get 400 before anything is read or done."""

    def __init__(self, app, hosts: Iterable[str]):
        self.app, self.hosts = app, {host.lower() for host in hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host", "")
            if host.lower() not in self.hosts:
                response = PlainTextResponse(f"gd-web: this dashboard does not answer to the host {host!r} "
                                             f"(see --allowed-hosts)\n", 400,
                                             headers={"X-Content-Type-Options": "nosniff"})
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class Dashboard:
    def __init__(self, dsn: str, sample_seconds: float = charts.SAMPLE_SECONDS, allow_superuser: bool = False):
        self.dsn, self.allow_superuser = dsn, allow_superuser
        self.pool = ConnectionPool(dsn, min_size=1, max_size=4, open=False, kwargs=CONNECTION,
                                   connection_class=Session, configure=self.prepare)
        self.sampler = charts.Sampler(self.pool, self.queues, sample_seconds)
        self.templates = Jinja2Templates(directory=os.path.join(HERE, "templates"), autoescape=True)
        self.templates.env.filters["json"] = pretty_json
        self.templates.env.globals["sparkline"] = lambda points: Markup(charts.sparkline(points))
        # gd.queue_stats and the claims count every instance: read at most every few seconds
        self.queue_cache = (0.0, [], [])

    # -- life ---------------------------------------------------------------

    def prepare(self, conn: Session):
        """Each new connection: the API's schema, or a refusal of a database without it or of a superuser (who
        would see and may act on every tenant's instances)."""
        found = data.session(conn)
        conn.commit()
        if found["api_schema"] is None:
            raise Refusal("gd-web: gen_durable is not installed in this database")
        if found["superuser"] and not self.allow_superuser:
            raise Refusal(f"gd-web: role {found['role']} is a superuser: it sees and may act on every tenant's "
                          f"instances.  Connect as a role granted what the dashboard needs (web/README.md, "
                          f"\"Whose rights\"), or give --allow-superuser to run as it anyway")
        conn.api_schema = found["api_schema"]

    def check(self):
        """A refusal said at once, rather than by the pool retrying its connections."""
        with Session.connect(self.dsn, **CONNECTION) as conn:
            self.prepare(conn)

    def startup(self):
        self.pool.open(wait=True, timeout=30)
        self.sampler.start()

    def shutdown(self):
        self.sampler.stop()
        self.pool.close()

    # -- rendering -----------------------------------------------------------

    def render(self, request: Request, template: str, status_code: int = 200, **context) -> Response:
        token = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
        live_only = request.headers.get(LIVE_HEADER) == "1"
        context.update(request=request, csrf=token, layout="live.html" if live_only else "base.html",
                       now=datetime.datetime.now(datetime.timezone.utc), age=data.age,
                       notice=request.query_params.get("notice", ""))
        response = self.templates.TemplateResponse(template, context, status_code=status_code)
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path="/")
        response.headers["Content-Security-Policy"] = "default-src 'self'; style-src 'self'; img-src 'self' data:"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        return response

    def refused(self, request: Request, message: str, status_code: int) -> Response:
        return self.render(request, "refused.html", status_code=status_code, message=message)

    def bad_input(self, request: Request, error: data.BadInput) -> Response:
        return self.refused(request, f"gd-web: {error}", 400)

    # -- pages ---------------------------------------------------------------

    def queues(self, conn):
        return self.totals(conn)[0]

    def totals(self, conn):
        """(queue stats, external workers), at most QUEUE_STATS_SECONDS old."""
        taken, queues, external = self.queue_cache
        if time.monotonic() - taken > QUEUE_STATS_SECONDS:
            queues, external = data.queues(conn), data.external_workers(conn)
            self.queue_cache = (time.monotonic(), queues, external)
        return queues, external

    def overview(self, request: Request) -> Response:
        with self.pool.connection() as conn:
            (queues, external), workers = self.totals(conn), data.workers(conn)
            counters, steps = data.counters(conn), data.step_stats(conn)
        series = self.sampler.series()
        backlogs = {q["queue"]: self.sampler.backlog(q["queue"]) for q in queues}
        return self.render(request, "overview.html", queues=queues, workers=workers, external=external,
                           counters=counters,
                           steps=steps, series=series, backlogs=backlogs)

    def instance_list(self, request: Request) -> Response:
        flt = data.InstanceFilter.from_query(request.query_params)
        after = data.text(request.query_params, "after")
        with self.pool.connection() as conn:
            page, next_cursor = data.instances(conn, flt, after)
            options = data.choices(conn)
        return self.render(request, "instances.html", flt=flt, page=page, next_cursor=next_cursor,
                           options=options, statuses=data.STATUSES, first_page=not after)

    def instance_page(self, request: Request) -> Response:
        instance_id = _instance_id(request.path_params["id"])
        with self.pool.connection() as conn:
            found = data.instance(conn, instance_id)
            if found is None:
                return self.refused(request, f"gd-web: instance {instance_id} does not exist, or this role may "
                                             f"not see it", 404)
            return self.render(request, "instance.html", i=found, signals=data.signals(conn, instance_id),
                               family=data.family(conn, instance_id),
                               history=data.history(conn, conn.api_schema, instance_id),
                               definition=data.definition(conn, found["fsm"], found["version"]),
                               parent=data.instance(conn, found["parent_id"]) if found["parent_id"] else None)

    def schedules_page(self, request: Request) -> Response:
        with self.pool.connection() as conn:
            return self.render(request, "schedules.html", schedules=data.schedules(conn),
                               rate_limits=data.rate_limits(conn), concurrency_limits=data.concurrency_limits(conn),
                               owner_weights=data.owner_weights(conn))

    # -- actions -------------------------------------------------------------

    def confirm(self, request: Request) -> Response:
        """The confirmation page of an action: what it will do, and the form that does it."""
        action = request.path_params["action"]
        if action not in ACTIONS:
            return self.refused(request, f"gd-web: no action {action!r}", 404)
        flt = data.InstanceFilter.from_query(request.query_params)
        target = _target(action, request.query_params)
        count = plan = entry = None
        steps: List[dict] = []
        with self.pool.connection() as conn:
            if action in ("bulk_cancel", "bulk_retry"):
                count = len(data.matching_ids(conn, flt, BULK_STATUSES[action]))
            elif action == "cancel":
                plan = data.cancel_plan(conn, target)
            elif action == "rewind":
                plan = data.instance(conn, target)
                if plan is not None:
                    steps = data.definition(conn, plan["fsm"], plan["version"])["steps"]
            elif action == "fork":
                entry = _entry(request.query_params)
                plan = data.history_entry(conn, conn.api_schema, target, entry)
            elif action == "migrate":
                plan = data.fsm_versions(conn, target)
        return self.render(request, "confirm.html", action=action, title=ACTIONS[action], target=target, flt=flt,
                           count=count, bulk_limit=data.BULK_LIMIT, plan=plan, steps=steps, entry=entry,
                           live_statuses=BULK_STATUSES["bulk_cancel"])

    async def act(self, request: Request) -> Response:
        async with request.form() as form:  # closes the files a form may carry
            cookie, csrf = request.cookies.get(CSRF_COOKIE, ""), str(form.get("csrf", ""))
            # as bytes: compare_digest refuses str beyond ASCII
            if not cookie or not hmac.compare_digest(cookie.encode(), csrf.encode()):
                return self.refused(request, "gd-web: this form's CSRF token is missing or wrong: open the page "
                                             "again", 403)
            action = request.path_params["action"]
            if action not in ACTIONS:
                return self.refused(request, f"gd-web: no action {action!r}", 404)
            return await run_in_threadpool(self._act, request, action, form)

    def _act(self, request: Request, action: str, form) -> Response:
        target = _target(action, form)
        flt = data.InstanceFilter.from_query(form)
        try:
            with self.pool.connection() as conn:
                notice, back = ACTION_RUNNERS[action](conn, conn.api_schema, target, form, flt)
        except psycopg.Error as error:
            status = 403 if error.sqlstate == "42501" else 400
            return self.refused(request, f"{error.diag.message_primary} (SQLSTATE {error.sqlstate})", status)
        return RedirectResponse(f"{back}{'&' if '?' in back else '?'}{urlencode({'notice': notice})}", status_code=303)


def _instance_id(value: str) -> int:
    return data.integer(value, 1, data.INT8, "an instance id")


def _entry(source) -> int:
    """The number of a step history's entry, as gd_history numbers them."""
    return data.integer(data.text(source, "entry"), 1, data.INT4, "a history entry")


def _target(action: str, source):
    """What the action applies to: an instance id, a queue's or an FSM's name, or nothing (a bulk action's
    filter)."""
    target = data.text(source, "target")
    return _instance_id(target) if action in INSTANCE_ACTIONS else target


def _run_cancel(conn, schema, instance_id, form, flt):
    done = data.cancel(conn, schema, instance_id, data.text(form, "reason"))
    return (f"instance {instance_id} cancelled" if done else
            f"instance {instance_id} was not cancelled: it is not live, it is compensating already, or this role "
            f"may not use it",
            f"/instances/{instance_id}")


def _run_retry(conn, schema, instance_id, form, flt):
    done = data.retry(conn, schema, instance_id)
    return (f"instance {instance_id} retried" if done else
            f"instance {instance_id} was not retried: it is not failed, or this role may not use it",
            f"/instances/{instance_id}")


def _run_rewind(conn, schema, instance_id, form, flt):
    step = data.text(form, "step")
    if not step:
        raise data.BadInput("a rewind needs the step to go back to")
    done = data.rewind(conn, schema, instance_id, step, data.text(form, "state"))
    return (f"instance {instance_id} rewound to step {step}" if done else
            f"instance {instance_id} was not rewound: it is done or cancelled (fork it from its step history), or "
            f"this role may not use it",
            f"/instances/{instance_id}")


def _run_fork(conn, schema, instance_id, form, flt):
    entry = _entry(form)
    forked = data.fork(conn, schema, instance_id, entry, data.text(form, "state"))
    return f"instance {forked} forked from entry {entry} of instance {instance_id}", f"/instances/{forked}"


def _run_migrate(conn, schema, fsm, form, flt):
    from_version, to_version = (data.integer(data.text(form, name), 1, data.INT4, f"the {name.replace('_', ' ')}")
                                for name in ("from_version", "to_version"))
    moved = data.migrate(conn, schema, fsm, from_version, to_version, data.text(form, "step_map"))
    return (f"{moved} live instance{'' if moved == 1 else 's'} of {fsm} moved from version {from_version} to "
            f"{to_version}", f"/instances?{urlencode({'fsm': fsm})}")


def _run_signal(conn, schema, instance_id, form, flt):
    name = data.text(form, "name")
    if not name:
        raise data.BadInput("a signal needs a name")
    stored = data.signal(conn, schema, instance_id, name, data.text(form, "payload") or "{}",
                         data.text(form, "dedup_key"))
    return (f"signal {name} delivered to instance {instance_id}" if stored else
            f"signal {name} was already delivered to instance {instance_id} (same dedup key)",
            f"/instances/{instance_id}")


def _run_pause(paused):
    def run(conn, schema, target, form, flt):
        changed = data.pause(conn, schema, target, paused)
        word = "paused" if paused else "resumed"
        return (f"queue {target} {word}" if changed else f"queue {target} was already {word}", "/")
    return run


def _run_bulk(statuses, one):
    def run(conn, schema, target, form, flt):
        ids = data.matching_ids(conn, flt, statuses)
        changed = sum(1 for instance_id in ids if one(conn, schema, instance_id))
        return f"{changed} of {len(ids)} instances changed", f"/instances?{urlencode(flt.params())}"
    return run


INSTANCE_ACTIONS = ("cancel", "retry", "signal", "rewind", "fork")
BULK_STATUSES = {"bulk_cancel": data.LIVE_STATUSES,
                 "bulk_retry": ("failed",)}
ACTIONS = {"cancel": "Cancel instance", "retry": "Retry instance", "signal": "Signal instance",
           "rewind": "Rewind instance", "fork": "Fork instance",
           "migrate": "Migrate the live instances of FSM",
           "pause": "Pause queue", "resume": "Resume queue",
           "bulk_cancel": "Cancel the live instances of this filter",
           "bulk_retry": "Retry the failed instances of this filter"}
ACTION_RUNNERS = {
    "cancel": _run_cancel, "retry": _run_retry, "signal": _run_signal, "rewind": _run_rewind, "fork": _run_fork,
    "migrate": _run_migrate,
    "pause": _run_pause(True), "resume": _run_pause(False),
    "bulk_cancel": _run_bulk(BULK_STATUSES["bulk_cancel"], lambda c, s, i: data.cancel(c, s, i, "gd-web bulk cancel")),
    "bulk_retry": _run_bulk(BULK_STATUSES["bulk_retry"], lambda c, s, i: data.retry(c, s, i)),
}


def create_app(dsn: str, allowed_hosts: Iterable[str], sample_seconds: float = charts.SAMPLE_SECONDS,
               allow_superuser: bool = False) -> Starlette:
    """The dashboard as the role of `dsn`, answering to the Host headers `allowed_hosts` (as browsers send them:
    name, or name:port); Refusal (or psycopg's OperationalError) when it may not, or cannot, run on that database."""
    board = Dashboard(dsn, sample_seconds, allow_superuser)
    board.check()
    routes = [
        Route("/", board.overview),
        Route("/instances", board.instance_list),
        Route("/instances/{id}", board.instance_page),
        Route("/schedules", board.schedules_page),
        Route("/confirm/{action}", board.confirm),
        Route("/act/{action}", board.act, methods=["POST"]),
        Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await run_in_threadpool(board.startup)
        try:
            yield
        finally:
            await run_in_threadpool(board.shutdown)

    return Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(AllowedHosts, hosts=allowed_hosts)],
                     exception_handlers={data.BadInput: board.bad_input})
