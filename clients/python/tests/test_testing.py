"""gen_durable.testing: an order FSM (reserve in SQL -> charge, external ->
ship in SQL, which waits a day for 'shipped') taken through every path in
one transaction, its clock moved a day, nothing left behind."""

import unittest

from psycopg.types.json import Jsonb

from gen_durable import Worker, next_step
from gen_durable.testing import TestTransaction
from support import DSN, ServerTest


class TestingTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.fsm = self.name("order")
        self.attempts = []

    def define_order(self, t):
        """The FSM, its handler and the charges' table, in the test's transaction: rolled back with it."""
        t.connection.execute(f"""CREATE FUNCTION public.order_step_{self.tag}(state jsonb, ctx gd.context)
            RETURNS gd.outcome LANGUAGE plpgsql AS $$
            BEGIN
                RETURN CASE
                    WHEN ctx.step = 'reserve' THEN gd_next('charge', state || '{{"reserved": true}}')
                    WHEN ctx.timed_out THEN gd_done(state || '{{"shipped": false}}')
                    WHEN jsonb_array_length(ctx.signals) > 0 THEN gd_done(state || '{{"shipped": true}}')
                    ELSE gd_wait_signal(ARRAY['shipped'], timeout => '1 day') END;
            END $$""")
        handler = f"public.order_step_{self.tag}(jsonb, gd.context)"
        t.connection.execute("SELECT gd_define_fsm(%s, 'reserve', %s, steps => %s)", [self.fsm, self.queue, Jsonb({
            "reserve": {"handler": handler}, "charge": {"backoff": "10 minutes"}, "ship": {"handler": handler}})])
        t.connection.execute(f"CREATE TABLE charges_{self.tag} (instance bigint, key uuid)")

    def charge(self, state, ctx):
        self.attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("the payment service timed out")
        ctx.connection.execute(f"INSERT INTO charges_{self.tag} VALUES (%s, %s)", [ctx.id, ctx.idempotency_key])
        return next_step("ship", {**state, "charged": True})

    def test_an_order_through_every_step_in_one_transaction(self):
        handlers = {(self.fsm, "charge"): self.charge}
        with TestTransaction(DSN) as t:
            self.define_order(t)
            shipped = t.client.insert(self.fsm, {"sku": "tea"})
            lost = t.client.insert(self.fsm, {"sku": "mate"})
            self.assertEqual(t.drain(self.queue), 2)                      # reserve, both
            self.assertEqual(t.run_external(self.queue, handlers), 2)     # charge: the service timed out
            self.assertEqual(t.run_external(self.queue, handlers), 0)     # retried in 10 minutes, not before
            t.advance(minutes=11)
            self.assertEqual(t.run_external(self.queue, handlers), 2)     # charged
            self.assertEqual(self.attempts, [1, 1, 2, 2])
            self.assertEqual(t.drain(self.queue), 2)                      # ship: each waits for 'shipped'
            t.client.signal(shipped, "shipped")
            t.advance(days=1, seconds=1)
            t.drain(self.queue)                                           # one shipped, one timed out
            results = {i: t.client.get(i) for i in (shipped, lost)}
            self.assertEqual([r.status for r in results.values()], ["done", "done"])
            self.assertEqual(results[shipped].result, {"sku": "tea", "reserved": True, "charged": True, "shipped": True})
            self.assertEqual(results[lost].result["shipped"], False)
            charged = t.connection.execute(f"SELECT count(*) FROM charges_{self.tag}").fetchone()[0]
            self.assertEqual(charged, 2)
        left = self.db.execute("SELECT count(*) FROM gd.fsms WHERE name = %s", [self.fsm]).fetchone()[0]
        self.assertEqual(left, 0, "rolled back: the FSM, its instances and its table")

    def test_a_batch_handler_runs_once_for_its_claims(self):
        worker = Worker(DSN)
        calls = []

        @worker.step(self.fsm, "charge", batch=True)
        def charge_all(states, ctxs):
            calls.append(len(ctxs))
            if len(calls) == 1:   # the first call: one outcome short, a failed attempt of each
                ctxs[0].connection.execute(f"INSERT INTO charges_{self.tag} VALUES (%s, %s)", [ctxs[0].id, None])
                return [next_step("ship", s) for s in states[1:]]
            return [next_step("ship", {**s, "charged": True}) for s in states]

        with TestTransaction(DSN) as t:
            self.define_order(t)
            orders = [t.client.insert(self.fsm, {"n": n}) for n in range(3)]
            self.assertEqual(t.drain(self.queue), 3)                      # reserve
            self.assertEqual(t.run_external(self.queue, worker), 3)       # one call, one outcome short
            charged = t.connection.execute(f"SELECT count(*) FROM charges_{self.tag}").fetchone()[0]
            self.assertEqual(charged, 0, "the failed call's writes are undone")
            t.advance(minutes=11)
            self.assertEqual(t.run_external(self.queue, worker), 3)       # one call, an outcome each
            self.assertEqual(calls, [3, 3])
            self.assertEqual({t.client.get(i).step for i in orders}, {"ship"})
            self.assertEqual({t.client.get(i).attempt for i in orders}, {1})


if __name__ == "__main__":
    unittest.main()
