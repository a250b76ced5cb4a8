"""A step's timeout holds for external steps: at the deadline the engine ends
the claim whatever the heartbeats say, the handler is told (ctx.cancelled; a
task is cancelled), its connection is no longer its own, and the lane goes
on.  A drain has a limit."""

import asyncio
import threading
import time
import unittest

from gen_durable import AsyncWorker, Client, Worker, done
from gen_durable._core import StepEnded
from support import DSN, LogCapture, ServerTest, running


class TimeoutTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.fsm = self.name("slow")
        self.define(self.fsm, "call", {"call": {"timeout": "1 second", "max_attempts": 2, "backoff": "500 milliseconds"}})
        self.client = Client(DSN)
        self.addCleanup(self.client.close)
        # n = 0 never ends; n = 1, behind it on the one lane, does at once.
        self.slow, self.quick = self.client.insert_all(self.fsm, [{"state": {"n": 0}, "priority": -1},
                                                                  {"state": {"n": 1}}])

    def wait_for(self, instance_id, status):
        self.until(lambda: self.status(instance_id)[0] == status, 20, f"{instance_id} {status}")

    def settled(self):
        self.wait_for(self.quick, "done")
        self.wait_for(self.slow, "failed")
        row = self.db.execute("SELECT attempt, error->>'kind' FROM gd.instances WHERE id = %s", [self.slow]).fetchone()
        self.assertEqual(row, (2, "timeout"))

    def test_a_handler_past_its_deadline_is_told_and_the_lane_moves_on(self):
        seen, late_queries = [], []

        def call(state, ctx):
            seen.append((state["n"], ctx.attempt, ctx.deadline is not None))
            if state["n"] == 0:
                self.assertTrue(ctx.cancelled.wait(10))
                try:
                    ctx.connection.execute("SELECT 1")
                    late_queries.append("ran")
                except StepEnded as e:
                    late_queries.append(str(e))
                threading.Event().wait()   # and never returns
            return done({"n": state["n"]})

        with LogCapture() as logged:
            # One lane, one claim at a time (a deadline counts from the claim), a lease far longer
            # than the timeout: only the deadline can end an attempt.
            with running(Worker(DSN, {(self.fsm, "call"): call}, queues=[self.queue], batch=1, lease=60, wait=0.2,
                                name=self.name("w"))):
                self.settled()
        self.assertEqual(seen, [(0, 1, True), (1, 1, True), (0, 2, True)])
        self.assertEqual(len(late_queries), 2)
        self.assertTrue(all("gen_durable: this step has ended" in q for q in late_queries))
        self.assertTrue(any("ran past its deadline" in m for m in logged.messages))

    def test_asyncio_cancels_the_task_past_its_deadline(self):
        cancelled = []

        async def call(state, ctx):
            if state["n"] == 0:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    cancelled.append(ctx.attempt)
                    raise
            return done({"n": state["n"]})

        async def serve():
            worker = AsyncWorker(DSN, {(self.fsm, "call"): call}, queues=[self.queue], batch=1, lease=60, wait=0.2,
                                 name=self.name("w"))
            task = asyncio.create_task(worker.run(install_signal_handlers=False))
            await asyncio.get_running_loop().run_in_executor(None, self.settled)
            worker.stop()
            await asyncio.wait_for(task, 30)

        asyncio.run(serve())
        self.assertEqual(cancelled, [1, 2])

    def test_a_drain_waits_drain_timeout_then_hands_the_step_back(self):
        stuck = self.name("stuck")
        self.define(stuck, "call", {"call": None})
        entered = threading.Event()

        def call(state, ctx):
            entered.set()
            ctx.cancelled.wait()
            threading.Event().wait()   # ignores it

        worker = Worker(DSN, {(stuck, "call"): call}, queues=[self.queue], wait=0.2, drain_timeout=0.5,
                        name=self.name("w"))
        instance = self.client.insert(stuck, {})
        with LogCapture() as logged:
            thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
            thread.start()
            self.assertTrue(entered.wait(20))
            worker.stop()
            thread.join(10)
            self.assertFalse(thread.is_alive())
        self.assertEqual(self.status(instance), ("runnable", "call", 1))
        self.assertTrue(any("drain's limit" in m for m in logged.messages))


if __name__ == "__main__":
    unittest.main()
