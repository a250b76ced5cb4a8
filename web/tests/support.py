"""What the dashboard's tests share: the server (GD_TEST_DSN, a superuser's
connection string to a database with gen_durable and an executor on queue
'default'), a shop FSM owned by role web_shop, a role web_stranger with no
grant, the dashboard app connected as either, and a squatter's schema named
after a third dashboard role, web_board."""

import os
import re
import socket
import time
import unittest
import uuid

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.testclient import TestClient

from gd_web import create_app

DSN = os.environ.get("GD_TEST_DSN", "")
ROLES = """
CREATE ROLE web_shop LOGIN;
CREATE ROLE web_stranger LOGIN;
CREATE ROLE web_board LOGIN IN ROLE web_shop;
ALTER ROLE web_board SET search_path = "$user", pg_catalog, public;
CREATE ROLE web_squatter LOGIN;
"""
SHOP = """
GRANT CREATE ON DATABASE {db} TO web_shop;
SET ROLE web_shop;
CREATE SCHEMA web_shop;
CREATE FUNCTION web_shop.step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'refund' THEN
        RETURN gd_done(jsonb_build_object('refunded', true, 'cancelled_at', ctx.cancelled->>'step'));
    END IF;
    IF ctx.step = 'pack' THEN
        IF state ? 'fail' THEN RETURN gd_stop('{"reason": "out of stock"}'); END IF;
        IF state ? 'spawn' THEN RETURN gd_spawn('[{"fsm": "web_order", "state": {"child": true}}]', then_step => 'ship'); END IF;
        IF state ? 'child' THEN RETURN gd_done('{"child": true}'); END IF;
        RETURN gd_wait_signal(ARRAY['paid'], then_step => 'ship');
    END IF;
    RETURN gd_done(jsonb_build_object('shipped', true, 'paid', ctx.signals));
END $$;
SELECT gd_define_fsm('web_order', initial => 'pack', history => true,
                     steps => '{"pack": {"handler": "web_shop.step(jsonb, gd.context)"},
                                "ship": {"handler": "web_shop.step(jsonb, gd.context)"}}');
-- The same order, refunded when cancelled (its compensation step).
SELECT gd_define_fsm('web_refunded', initial => 'pack', on_cancel => 'refund',
                     steps => '{"pack": {"handler": "web_shop.step(jsonb, gd.context)"},
                                "ship": {"handler": "web_shop.step(jsonb, gd.context)"},
                                "refund": {"handler": "web_shop.step(jsonb, gd.context)"}}');
RESET ROLE;
"""


# For web_board, a dashboard role (a member of web_shop) whose search_path looks in the schema named after it
# before pg_catalog, a schema of that name made by web_squatter, a role with CREATE on the database, holding
# functions, operators, aggregates and types named as the API's and the built-ins the dashboard uses (or that an
# unqualified query of it would find instead of them): each records its calls in web_board.calls.
SQUATTED_FUNCTIONS = (
    "gd_cancel(id bigint, reason text DEFAULT NULL) RETURNS boolean",
    "gd_retry(id bigint) RETURNS boolean",
    "gd_rewind(id bigint, step text, state jsonb DEFAULT NULL) RETURNS boolean",
    "gd_fork(id bigint, entry int, state jsonb DEFAULT NULL) RETURNS bigint",
    "gd_signal(target bigint, name text, payload jsonb DEFAULT NULL, dedup_key text DEFAULT NULL,"
    " missing_ok boolean DEFAULT false) RETURNS boolean",
    "gd_pause(queue text) RETURNS boolean",
    "gd_resume(queue text) RETURNS boolean",
    "current_database() RETURNS name",
    "current_setting(text) RETURNS text",
    "starts_with(text, text) RETURNS boolean",
    "format(text, name, name, text) RETURNS text",
    "pg_get_function_identity_arguments(oid) RETURNS text",
    "count_step(bigint) RETURNS bigint",
    "min_step(timestamptz, timestamptz) RETURNS timestamptz",
)
SQUATTED_OPERATORS = ("= text text", "= name name", "= name text", "= oid oid", "= bigint bigint", "= bigint smallint",
                      "= bigint integer", "= integer smallint", "= gd.status gd.status", "> bigint integer",
                      "|| text text")
SQUATTED_TYPES = ("timestamptz", "jsonb", "int8", "text")


def squatter_sql(database):
    made = [f"""
GRANT EXECUTE ON FUNCTION gd_pause(text), gd_resume(text) TO web_board;
GRANT CREATE ON DATABASE {database} TO web_squatter;
SET ROLE web_squatter;
CREATE SCHEMA web_board;
GRANT USAGE ON SCHEMA web_board TO PUBLIC;
CREATE TABLE web_board.calls (name text);
GRANT INSERT ON web_board.calls TO PUBLIC;
CREATE FUNCTION web_board.called(name text) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN INSERT INTO web_board.calls VALUES ($1); RETURN NULL; END $$;"""]
    for signature in SQUATTED_FUNCTIONS:
        name = signature.split("(")[0]
        made.append(f"CREATE FUNCTION web_board.{signature} LANGUAGE plpgsql"
                    f" AS $$ BEGIN PERFORM web_board.called('{name}'); RETURN NULL; END $$;")
    made.append("CREATE AGGREGATE web_board.count(*) (SFUNC = web_board.count_step, STYPE = bigint);")
    made.append("CREATE AGGREGATE web_board.min(timestamptz) (SFUNC = web_board.min_step, STYPE = timestamptz);")
    for n, operator in enumerate(SQUATTED_OPERATORS):
        name, left, right = operator.split()
        made.append(f"CREATE FUNCTION web_board.operator_{n}(a {left}, b {right}) RETURNS"
                    f" {'text' if name == '||' else 'boolean'} LANGUAGE plpgsql"
                    f" AS $$ BEGIN PERFORM web_board.called('{operator}'); RETURN NULL; END $$;"
                    f"CREATE OPERATOR web_board.{name} (LEFTARG = {left}, RIGHTARG = {right},"
                    f" FUNCTION = web_board.operator_{n});")
    for name in SQUATTED_TYPES:
        made.append(f"CREATE DOMAIN web_board.{name} AS pg_catalog.{name} CHECK (web_board.called('{name}'));")
    return "\n".join(made + ["RESET ROLE;"])


def admin():
    return psycopg.connect(DSN, autocommit=True)


def dsn_as(role):
    return make_conninfo(DSN, user=role)


def prepare_shop():
    """The roles, once per cluster, and the FSM and the squatter, once per database."""
    with admin() as db:
        if db.execute("SELECT FROM pg_roles WHERE rolname = 'web_shop'").fetchone() is None:
            db.execute(ROLES)
        database = psycopg.sql.Identifier(conninfo_to_dict(DSN).get("dbname", "postgres")).as_string(db)
        if db.execute("SELECT FROM gd.fsms WHERE name = 'web_order'").fetchone() is None:
            db.execute(SHOP.replace("{db}", database))
        if db.execute("SELECT FROM pg_namespace WHERE nspname = 'web_board'").fetchone() is None:
            db.execute(squatter_sql(database))


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def csrf_of(html):
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


class DashboardTest(unittest.TestCase):
    def setUp(self):
        prepare_shop()
        self.db = admin()
        self.addCleanup(self.db.close)
        self.tag = uuid.uuid4().hex[:8]

    def insert(self, state=None, fsm="web_order", **options):
        """An instance of `fsm` (web_order, or web_refunded) inserted as its owner."""
        with psycopg.connect(dsn_as("web_shop"), autocommit=True) as shop:
            names = "".join(f", {k} => %({k})s" for k in options)
            return shop.execute(f"SELECT gd_insert(%(fsm)s, %(state)s{names})",
                                {"fsm": fsm, "state": psycopg.types.json.Jsonb(state or {}), **options}).fetchone()[0]

    def status(self, instance_id):
        return self.db.execute("SELECT status FROM gd.instances WHERE id = %s", [instance_id]).fetchone()[0]

    def until(self, predicate, timeout=20.0, message="condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        self.fail(f"timed out waiting for {message}")


class AsRole(DashboardTest):
    """The dashboard as `role`, through Starlette's test client (whose requests say Host: testserver)."""
    role = "web_shop"

    def setUp(self):
        super().setUp()
        self.client = TestClient(create_app(dsn_as(self.role), ["testserver"], sample_seconds=0.2))
        self.client.__enter__()
        self.addCleanup(self.client.__exit__, None, None, None)

    def act(self, action, **form):
        """The action's confirmation page, then its form posted (not followed)."""
        page = self.client.get(f"/confirm/{action}", params={"target": form.get("target", "")})
        self.assertEqual(page.status_code, 200)
        return self.client.post(f"/act/{action}", data={"csrf": csrf_of(page.text), **form}, follow_redirects=False)
