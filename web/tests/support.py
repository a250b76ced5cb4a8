"""What the dashboard's tests share: the server (GD_TEST_DSN, a superuser's
connection string to a database with gen_durable and an executor on queue
'default'), a shop FSM owned by role web_shop, a role web_stranger with no
grant, and the dashboard app connected as either."""

import os
import re
import time
import unittest
import uuid

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

DSN = os.environ.get("GD_TEST_DSN", "")
ROLES = """
CREATE ROLE web_shop LOGIN;
CREATE ROLE web_stranger LOGIN;
"""
SHOP = """
GRANT CREATE ON DATABASE {db} TO web_shop;
SET ROLE web_shop;
CREATE SCHEMA web_shop;
CREATE FUNCTION web_shop.step(state jsonb, ctx gd.context) RETURNS gd.outcome LANGUAGE plpgsql AS $$
BEGIN
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
RESET ROLE;
"""


def admin():
    return psycopg.connect(DSN, autocommit=True)


def dsn_as(role):
    return make_conninfo(DSN, user=role)


def prepare_shop():
    """The roles, once per cluster, and the FSM, once per database."""
    with admin() as db:
        if db.execute("SELECT FROM pg_roles WHERE rolname = 'web_shop'").fetchone() is None:
            db.execute(ROLES)
        if db.execute("SELECT FROM gd.fsms WHERE name = 'web_order'").fetchone() is None:
            database = psycopg.sql.Identifier(conninfo_to_dict(DSN).get("dbname", "postgres")).as_string(db)
            db.execute(SHOP.replace("{db}", database))


def csrf_of(html):
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


class DashboardTest(unittest.TestCase):
    def setUp(self):
        prepare_shop()
        self.db = admin()
        self.addCleanup(self.db.close)
        self.tag = uuid.uuid4().hex[:8]

    def insert(self, state=None, **options):
        """An instance of web_order inserted as its owner."""
        with psycopg.connect(dsn_as("web_shop"), autocommit=True) as shop:
            names = "".join(f", {k} => %({k})s" for k in options)
            return shop.execute(f"SELECT gd_insert('web_order', %(state)s{names})",
                                {"state": psycopg.types.json.Jsonb(state or {}), **options}).fetchone()[0]

    def status(self, instance_id):
        return self.db.execute("SELECT status FROM gd.instances WHERE id = %s", [instance_id]).fetchone()[0]

    def until(self, predicate, timeout=20.0, message="condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        self.fail(f"timed out waiting for {message}")
