"""Client: each API call, its results and its errors."""

import unittest

import psycopg
from psycopg.types.json import Jsonb

from gen_durable import Client, Settled
from gen_durable._core import behind_pooler
from support import DSN, ServerTest, admin

HANDLER = "public.py_client_step(jsonb, gd.context)"


def setUpModule():
    with admin() as db:
        db.execute("""
CREATE OR REPLACE FUNCTION public.py_client_step(state jsonb, ctx gd.context) RETURNS gd.outcome
LANGUAGE plpgsql AS $$
BEGIN
    IF ctx.step = 'start' AND state ? 'wait' THEN
        RETURN gd_wait_signal(ARRAY['go'], then_step => 'finish');
    ELSIF ctx.step = 'start' THEN
        RETURN gd_next('finish', state || '{"started": true}');
    ELSIF state ? 'fail' THEN
        RAISE EXCEPTION 'asked to fail';
    ELSIF state ? 'stop' THEN
        RETURN gd_stop('{"why": "asked to stop"}');
    END IF;
    RETURN gd_done(jsonb_build_object('state', state, 'signals', jsonb_array_length(coalesce(ctx.signals, '[]'))));
END $$""")


class ClientTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.fsm = self.name("order")
        self.define(self.fsm, "start", {"start": HANDLER, "finish": {"handler": HANDLER, "max_attempts": 1}})
        self.client = Client(DSN)
        self.addCleanup(self.client.close)

    def test_insert_drain_wait_get(self):
        order = self.client.insert(self.fsm, {"sku": "tea"}, correlation_key=self.name("key"), priority=3)
        self.assertIsInstance(order, int)
        self.assertEqual(self.client.drain(self.queue), 2)
        settled = self.client.wait(order, timeout=5, until="terminal")
        self.assertEqual(settled, Settled("done", "finish", 1, {"state": {"sku": "tea", "started": True},
                                                                  "signals": 0}, None))
        row = self.client.get(order)
        self.assertEqual((row.id, row.fsm, row.status, row.queue, row.correlation_key),
                         (order, self.fsm, "done", self.queue, self.name("key")))
        self.assertIsNone(self.client.get(-1))

    def test_insert_options_and_duplicates(self):
        key = self.name("dup")
        first = self.client.insert(self.fsm, correlation_key=key)
        self.assertEqual(self.client.insert(self.fsm, correlation_key=key, on_duplicate="existing"), first)
        self.assertIsNone(self.client.insert(self.fsm, correlation_key=key, on_duplicate="skip"))
        with self.assertRaises(psycopg.errors.UniqueViolation):
            self.client.insert(self.fsm, correlation_key=key)
        later = self.client.insert(self.fsm, schedule_in=3600)
        self.assertEqual(self.client.drain(self.queue), 2)   # the first only: the other is due in an hour
        self.assertEqual(self.status(later)[0], "runnable")
        self.assertEqual(self.client.drain(self.queue, with_scheduled=True), 2)
        self.assertEqual(self.status(later)[0], "done")
        with self.assertRaises(TypeError):
            self.client.insert(self.fsm, colour="red")

    def test_debounce_and_throttle(self):
        key = self.name("debounced")
        first = self.client.insert(self.fsm, {"n": 1}, correlation_key=key, debounce=60)
        self.assertEqual(self.client.insert(self.fsm, {"n": 2}, correlation_key=key, debounce=120), first)
        state, wait = self.client.connection.execute(
            "SELECT state->>'n', extract(epoch FROM eligible_at - now())::int FROM gd.instances WHERE id = %s",
            [first]).fetchone()
        self.assertEqual(state, "2", "the later insert's state")
        self.assertTrue(110 <= wait <= 120, f"runs 120 s after the later insert, not {wait}")
        key = self.name("throttled")
        self.assertIsNotNone(self.client.insert(self.fsm, correlation_key=key, throttle=3600))
        self.assertIsNone(self.client.insert(self.fsm, correlation_key=key, throttle=3600))
        queued = self.client.insert(self.fsm, correlation_key=key, throttle=3600, on_throttle="queue")
        self.assertEqual(self.status(queued)[0], "runnable")
        entries = [{"correlation_key": self.name("bulk"), "throttle": "1 hour"}] * 2
        self.assertEqual(len(self.client.insert_all(self.fsm, entries)), 1, "the second entry dropped")
        fair = self.client.insert(self.fsm, fairness_key="tenant-7")
        [entry] = self.client.insert_all(self.fsm, [{"fairness_key": "tenant-8"}])
        keys = self.db.execute("SELECT fairness_key FROM gd.instances WHERE id = ANY (%s) ORDER BY id",
                                  ([fair, entry],)).fetchall()
        self.assertEqual([k for (k,) in keys], ["tenant-7", "tenant-8"])

    def test_insert_all(self):
        ids = self.client.insert_all(self.fsm, [{"state": {"n": n}} for n in range(5)])
        self.assertEqual(len(ids), 5)
        self.assertEqual(ids, sorted(ids))
        self.assertEqual(self.client.drain(self.queue), 10)

    def test_signal_missing_ok_and_dedup(self):
        key = self.name("parked")
        order = self.client.insert(self.fsm, {"wait": True}, correlation_key=key)
        self.client.drain(self.queue)
        self.assertEqual(self.client.wait(order).status, "awaiting")
        self.assertTrue(self.client.signal(key, "go", {"amount": 5}, dedup_key="evt-1"))
        self.assertFalse(self.client.signal(key, "go", {"amount": 5}, dedup_key="evt-1"))
        self.assertTrue(self.client.signal(order, "note", expires=60))
        lifetime = self.client.connection.execute(
            "SELECT extract(epoch FROM expires_at - delivered_at)::int FROM gd.signals"
            " WHERE instance_id = %s AND name = 'note'", [order]).fetchone()[0]
        self.assertEqual(lifetime, 60, "expires: not consumed after 60 s")
        self.client.drain(self.queue)
        self.assertEqual(self.client.wait(order).result["signals"], 1)
        self.assertIsNone(self.client.signal(key, "go", missing_ok=True))
        with self.assertRaises(psycopg.errors.NoDataFound):
            self.client.signal(key, "go")

    def test_cancel_and_retry(self):
        parked = self.client.insert(self.fsm, {"wait": True})
        self.client.drain(self.queue)
        self.assertTrue(self.client.cancel(parked, "no longer wanted"))
        self.assertFalse(self.client.cancel(parked))
        self.assertEqual(self.client.get(parked).error["kind"], "cancelled")
        failing = self.client.insert(self.fsm, {"fail": True})
        self.client.drain(self.queue)
        self.assertEqual(self.status(failing)[0], "failed")
        self.assertTrue(self.client.retry(failing))
        self.assertEqual(self.status(failing)[:2], ("runnable", "finish"))

    def test_rewind_fork_and_migrate(self):
        fsm = self.name("mended")

        def define(last, version=1):
            steps = {"start": {"handler": HANDLER}, last: {"handler": HANDLER, "max_attempts": 1}}
            self.db.execute("SELECT gd_define_fsm(%s, 'start', %s, history => true, version => %s, steps => %s)",
                            [fsm, self.queue, version, Jsonb(steps)])

        define("finish")
        # A stopped instance, rewound to finish with its state corrected, runs from there to done.
        stopped = self.client.insert(fsm, {"stop": True})
        self.client.drain(self.queue)
        self.assertEqual(self.status(stopped)[0], "failed")
        self.assertTrue(self.client.rewind(stopped, "finish", {"fixed": True}))
        self.assertEqual(self.status(stopped), ("runnable", "finish", 1))
        self.client.drain(self.queue)
        self.assertEqual(self.client.wait(stopped), Settled("done", "finish", 1, {"state": {"fixed": True},
                                                                                  "signals": 0}, None))
        self.assertFalse(self.client.rewind(stopped, "start"), "done: fork it instead")
        history = self.db.execute("SELECT entry, step, kind, detail, detail->>'by' = current_user"
                                  "  FROM gd_history(%s)", [stopped]).fetchall()
        self.assertEqual([h[:3] for h in history],
                         [(1, "start", "next"), (2, "finish", "stop"), (3, "finish", "rewind"), (4, "finish", "done")])
        self.assertEqual(history[2][3]["from_status"], "failed")
        self.assertTrue(history[2][4], "the rewind's row says who did it")

        # A fork from entry 2 (finish, with the state it started with), or with a state of our own.
        forked = self.client.fork(stopped, 2)
        self.assertEqual(self.client.get(forked).state, {"stop": True, "started": True})
        mended = self.client.fork(stopped, 2, {"fixed": "again"})
        self.client.drain(self.queue)
        self.assertEqual(self.status(forked)[0], "failed", "stopped again, as the original was")
        self.assertEqual(self.client.wait(mended).result, {"state": {"fixed": "again"}, "signals": 0})
        with self.assertRaises(psycopg.errors.NoDataFound):
            self.client.fork(stopped, 99)

        # Version 2 renames finish to close: a parked instance migrates, and resumes at close.
        parked = self.client.insert(fsm, {"wait": True})
        self.client.drain(self.queue)
        define("close", version=2)
        with self.assertRaises(psycopg.errors.InvalidParameterValue):   # finish: not a step of version 2
            self.client.migrate(fsm, 1, 2)
        self.assertEqual(self.client.migrate(fsm, 1, 2, {"finish": "close"}), 1)
        self.client.signal(parked, "go")
        self.client.drain(self.queue)
        self.assertEqual(self.status(parked), ("done", "close", 1))
        self.assertEqual(self.client.get(parked).version, 2)

        # A role granted the FSM may use its instances, not repair them: 42501, nothing changed.
        mender = self.name("mender")
        self.db.execute(f"CREATE ROLE {mender}")
        self.addCleanup(self.db.execute, f"DROP ROLE {mender}")
        self.db.execute("SELECT gd_grant(%s, %s)", [fsm, mender])
        self.addCleanup(self.db.execute, "SELECT gd_revoke(%s, %s)", [fsm, mender])
        with Client(DSN) as granted:
            granted.connection.execute(f"SET ROLE {mender}")
            for repair in (lambda: granted.rewind(forked, "start"), lambda: granted.fork(forked, 1),
                           lambda: granted.migrate(fsm, 2, 1)):
                with self.assertRaises(psycopg.errors.InsufficientPrivilege) as refused:
                    repair()
                self.assertEqual(refused.exception.sqlstate, "42501")
                self.assertIn("only the owner of FSM", str(refused.exception))
        self.assertEqual(self.status(forked), ("failed", "finish", 1))

    def test_errors_are_psycopg_errors_with_the_sqlstate(self):
        with self.assertRaises(psycopg.errors.UndefinedObject) as raised:
            self.client.insert(self.name("nope"))
        self.assertTrue(str(raised.exception).startswith("gen_durable:"))
        with self.assertRaises(psycopg.errors.InvalidParameterValue):
            self.client.insert(self.fsm, [1, 2])
        with self.assertRaises(psycopg.errors.InvalidParameterValue):
            self.client.wait(1, until="someday")

    def test_insert_in_your_transaction(self):
        with psycopg.connect(DSN) as connection:
            client = Client(connection=connection)
            with client.transaction():
                kept = client.insert(self.fsm)
            try:
                with client.transaction():
                    dropped = client.insert(self.fsm)
                    raise RuntimeError("roll back")
            except RuntimeError:
                pass
            connection.commit()
        self.assertIsNotNone(self.client.get(kept))
        self.assertIsNone(self.client.get(dropped))


class PoolerHeuristicTest(unittest.TestCase):
    def test_behind_pooler(self):
        self.assertTrue(behind_pooler(6432, "5432"))
        self.assertFalse(behind_pooler(5432, "5432"))
        self.assertFalse(behind_pooler(None, "5432"))


if __name__ == "__main__":
    unittest.main()
