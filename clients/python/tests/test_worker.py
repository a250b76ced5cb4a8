"""Worker: external steps on several queues, the step's transaction, failed
attempts, lost leases, unhandled steps, draining, reconnecting, poolers."""

import threading
import time
import unittest

import psycopg

from gen_durable import Client, Worker, done, next_step, retry, spawn, stop, wait_signal
from support import DSN, LogCapture, ServerTest, running


class WorkerTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.other_queue = f"{self.queue}_b"
        self.fsm = self.name("ship")
        # pack (external, the FSM's queue) -> label (external, a queue of its own) -> end
        self.define(self.fsm, "pack", {"pack": None, "label": {"queue": self.other_queue, "max_attempts": 2},
                                       "end": None})
        self.db.execute(f"CREATE TABLE effects_{self.tag} (instance bigint, step text, attempt int)")
        self.addCleanup(self.db.execute, f"DROP TABLE effects_{self.tag}")
        self.client = Client(DSN)
        self.addCleanup(self.client.close)

    def effects(self):
        return self.db.execute(f"SELECT instance, step, attempt FROM effects_{self.tag} ORDER BY 1, 2, 3").fetchall()

    def record(self, ctx):
        ctx.connection.execute(f"INSERT INTO effects_{self.tag} VALUES (%s, %s, %s)", [ctx.id, ctx.step, ctx.attempt])

    def worker(self, handlers, **options):
        options.setdefault("queues", [self.queue, self.other_queue])
        options.setdefault("wait", 0.5)
        options.setdefault("lease", 5)
        return Worker(DSN, handlers, name=self.name("w"), **options)

    def handlers(self, label=None):
        def pack(state, ctx):
            self.record(ctx)
            return next_step("label", {**state, "packed": True})

        def label_(state, ctx):
            self.record(ctx)
            return next_step("end")

        def end(state, ctx):
            self.record(ctx)
            return done({"n": state["n"], "packed": state["packed"]})
        return {(self.fsm, "pack"): pack, (self.fsm, "label"): label or label_, (self.fsm, "end"): end}

    def wait_all(self, ids, status="done", timeout=20.0):
        self.until(lambda: self.db.execute("SELECT count(*) FROM gd.instances WHERE id = ANY(%s) AND status = %s",
                                           [ids, status]).fetchone()[0] == len(ids), timeout,
                   f"{len(ids)} {status}")

    def test_a_batch_handler_takes_the_claims_of_its_step_at_once(self):
        fsm = self.name("batched")
        self.db.execute("SELECT gd_define_fsm(%s, 'pack', %s, steps => %s)",
                        [fsm, self.queue, psycopg.types.json.Jsonb({"pack": {"batch": 10, "max_attempts": 2,
                                                                                "backoff": "0s"}})])
        calls = []

        def pack(states, ctxs):
            calls.append([ctx.id for ctx in ctxs])
            if any(s.get("fail") and ctx.attempt == 1 for s, ctx in zip(states, ctxs)):
                for ctx in ctxs:   # rolled back with the failed attempt
                    self.record(ctx)
                raise RuntimeError("one of the batch failed")
            for ctx in ctxs:       # one transaction for the batch: committed with its outcomes
                self.record(ctx)
            return [done({"n": s["n"], "size": len(states)}) for s in states]
        ids = [self.client.insert(fsm, {"n": n, "fail": n == 3}) for n in range(5)]
        worker = self.worker({}, queues=[self.queue], batch=10)
        worker.step(fsm, "pack", batch=True)(pack)
        with running(worker):
            self.wait_all(ids)
        self.assertEqual(calls[0], ids)   # one call for the five, in the claim's order
        self.assertEqual(calls[1], ids)   # each had a failed attempt: again, together
        self.assertEqual(len(calls), 2)
        self.assertEqual([self.client.get(i).result for i in ids], [{"n": n, "size": 5} for n in range(5)])
        self.assertEqual(self.effects(), [(i, "pack", 2) for i in ids])

    def test_a_batch_handler_returning_too_few_outcomes_fails_each(self):
        fsm = self.name("short")
        self.db.execute("SELECT gd_define_fsm(%s, 'pack', %s, steps => %s)",
                        [fsm, self.queue, psycopg.types.json.Jsonb({"pack": {"batch": 10, "max_attempts": 1}})])

        def pack(states, ctxs):
            return [done() for _ in states[1:]]
        ids = [self.client.insert(fsm, {"n": n}) for n in range(3)]
        worker = self.worker({}, queues=[self.queue], batch=10)
        worker.step(fsm, "pack", batch=True)(pack)
        with running(worker):
            self.wait_all(ids, "failed")
        self.assertIn("not an outcome", self.client.get(ids[0]).error["message"])

    def test_a_compensation_is_told_why_it_runs(self):
        fsm = self.name("refunded")
        self.db.execute("SELECT gd_define_fsm(%s, 'pack', %s, on_cancel => 'refund', steps => %s)",
                        [fsm, self.queue, psycopg.types.json.Jsonb({"pack": {}, "refund": {}})])
        told = []

        def pack(state, ctx):
            told.append(ctx.cancellation)
            return wait_signal(["paid"])

        def refund(state, ctx):
            told.append(ctx.cancellation)
            return done({"refunded": state["n"]})
        instance = self.client.insert(fsm, {"n": 7})
        with running(self.worker({(fsm, "pack"): pack, (fsm, "refund"): refund})):
            self.until(lambda: self.status(instance)[0] == "awaiting_signal", message="the wait")
            self.assertTrue(self.client.cancel(instance, "out of stock"))
            self.wait_all([instance], "cancelled")
        self.assertIsNone(told[0])
        self.assertEqual({k: told[1][k] for k in ("reason", "step", "attempt", "status")},
                         {"reason": "out of stock", "step": "pack", "attempt": 1, "status": "awaiting_signal"})
        self.assertEqual(self.client.get(instance).result, {"refunded": 7})

    def test_several_queues_concurrency_and_exactly_once_effects(self):
        ids = self.client.insert_all(self.fsm, [{"state": {"n": n}} for n in range(30)])
        with running(self.worker(self.handlers(), concurrency=3, batch=4)):
            self.wait_all(ids)
        results = {r[0] for r in self.db.execute("SELECT result->>'n' FROM gd.instances WHERE id = ANY(%s)", [ids])}
        self.assertEqual(results, {str(n) for n in range(30)})
        self.assertEqual(len(self.effects()), 90, "each step's write exactly once")
        self.assertEqual(len(set(self.effects())), 90)
        queues = self.db.execute("SELECT DISTINCT queue FROM gd.instances WHERE id = ANY(%s)", [ids]).fetchall()
        self.assertEqual(queues, [(self.queue,)])   # back on the FSM's queue after label's own

    def test_a_raising_handler_is_a_failed_attempt_and_its_writes_are_undone(self):
        calls = []

        def label(state, ctx):
            self.record(ctx)
            calls.append(ctx.attempt)
            if ctx.attempt == 1:
                raise ValueError("the label printer jammed")
            return next_step("end")
        order = self.client.insert(self.fsm, {"n": 1})
        with running(self.worker(self.handlers(label=label))):
            self.wait_all([order])
        self.assertEqual(calls, [1, 2])
        self.assertEqual([e[1:] for e in self.effects()], [("end", 1), ("label", 2), ("pack", 1)])

    def test_bad_outcomes_fail_their_attempt_alone(self):
        def label(state, ctx):
            if state["n"] == 0:
                return next_step("no_such_step")
            if state["n"] == 1:
                return "not an outcome"
            return next_step("end")
        ids = self.client.insert_all(self.fsm, [{"state": {"n": n}} for n in range(4)])
        with running(self.worker(self.handlers(label=label), batch=10)):
            self.wait_all(ids[2:])
            self.wait_all(ids[:2], status="failed")
        errors = self.db.execute("SELECT error->>'kind', error->>'message' FROM gd.instances WHERE id = ANY(%s)"
                                 " ORDER BY id", [ids[:2]]).fetchall()
        self.assertEqual(errors[0][0], "retry")
        self.assertIn("no_such_step", errors[0][1])
        self.assertIn("not an outcome", errors[1][1])

    def test_handlers_run_outside_any_transaction_and_their_writes_commit_with_the_outcome(self):
        seen = []

        def in_transaction(ctx):   # the lane's session, as the server sees it
            return self.db.execute("SELECT state LIKE 'idle in transaction%%' OR backend_xid IS NOT NULL"
                                   "  FROM pg_stat_activity WHERE pid = %s",
                                   [ctx.connection.info.backend_pid]).fetchone()[0]

        def label(state, ctx):
            time.sleep(0.2)   # a call over the network
            seen.append(("calling", in_transaction(ctx)))
            self.record(ctx)
            seen.append(("written", in_transaction(ctx)))
            return next_step("end")
        ids = self.client.insert_all(self.fsm, [{"state": {"n": n}} for n in range(3)])
        with running(self.worker(self.handlers(label=label))):
            self.wait_all(ids)
        self.assertEqual(seen, [("calling", False), ("written", True)] * 3)
        self.assertEqual(sorted(e[1:] for e in self.effects()), [("end", 1)] * 3 + [("label", 1)] * 3 + [("pack", 1)] * 3)

    def test_the_steps_transaction_is_the_workers_to_end_and_a_failed_statement_fails_the_attempt(self):
        def label(state, ctx):
            self.record(ctx)
            if state["n"] == 0:
                ctx.connection.commit()
            try:
                ctx.connection.execute("SELECT 1 / 0")
            except psycopg.errors.DivisionByZero:
                pass   # swallowed: the transaction stays aborted
            return next_step("end")
        ids = self.client.insert_all(self.fsm, [{"state": {"n": n, "packed": True}, "step": "label"}
                                                for n in range(2)])
        with running(self.worker(self.handlers(label=label))):
            self.wait_all(ids, status="failed")
        errors = [r[0] for r in self.db.execute("SELECT error->>'message' FROM gd.instances WHERE id = ANY(%s)"
                                                " ORDER BY id", [ids]).fetchall()]
        self.assertIn("commit() is the worker's", errors[0])
        self.assertIn("its transaction was aborted", errors[1])
        self.assertEqual(self.effects(), [], "their writes were rolled back")

    def test_every_outcome(self):
        fsm = self.name("all")
        child = self.name("child")
        self.define(child, "work", {"work": None})
        self.define(fsm, "a", {s: None for s in ("a", "b", "c", "d", "e")})
        handlers = {
            (fsm, "a"): lambda state, ctx: wait_signal(["go"], timeout=60, then_step="b"),
            (fsm, "b"): lambda state, ctx: spawn([{"fsm": child}, {"fsm": child}], then_step="c",
                                                 state={"signal": ctx.signals[0]["payload"]}),
            (fsm, "c"): lambda state, ctx: next_step("d", {**state, "children": len(ctx.children)}, delay=0.1),
            (fsm, "d"): lambda state, ctx: retry({"why": "once more"}, backoff=0) if ctx.attempt == 1
            else next_step("e", state),
            (fsm, "e"): lambda state, ctx: done(state),
            (child, "work"): lambda state, ctx: done({"child": True}),
        }
        stopped = self.client.insert(fsm, step="e", queue=self.queue)
        order = self.client.insert(fsm)
        with running(self.worker({**handlers, (fsm, "e"): lambda state, ctx: done(state) if state else stop(
                {"empty": True})})):
            self.until(lambda: self.status(order)[0] == "awaiting_signal", message="the wait")
            self.client.signal(order, "go", {"paid": 3})
            self.wait_all([order])
            self.wait_all([stopped], status="failed")
        self.assertEqual(self.client.get(order).result, {"signal": {"paid": 3}, "children": 2})
        self.assertEqual(self.client.get(stopped).error["kind"], "stop")

    def test_the_trace_context_reaches_the_handlers_and_the_children_inherit_it(self):
        fsm, child = self.name("traced"), self.name("traced_child")
        traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        self.define(child, "work", {"work": None})
        self.define(fsm, "a", {"a": None, "b": None})
        handlers = {
            (fsm, "a"): lambda state, ctx: spawn([{"fsm": child}], then_step="b", state={"seen": ctx.trace_context}),
            (fsm, "b"): lambda state, ctx: done({**state, "children": [c["result"] for c in ctx.children]}),
            (child, "work"): lambda state, ctx: done({"seen": ctx.trace_context}),
        }
        traced = self.client.insert(fsm, trace_context=traceparent)
        with running(self.worker(handlers)):
            self.wait_all([traced])
        self.assertEqual(self.client.get(traced).result, {"seen": traceparent, "children": [{"seen": traceparent}]})

    def test_steps_without_a_handler_are_released_not_counted(self):
        order = self.client.insert(self.fsm, {"n": 1})
        handlers = self.handlers()
        del handlers[(self.fsm, "pack")]
        with LogCapture() as log, running(self.worker(handlers, wait=0.2)):
            self.until(lambda: any("no handler" in m for m in log.messages), message="the release")
        self.assertEqual(self.status(order), ("runnable", "pack", 1))

    def test_claims_only_steps_of_the_fsms_it_has_handlers_for(self):
        # Another FSM's steps on the same queue, ahead of these: a claim of any FSM's steps (a superuser's
        # without fsms) would get them, hand them back and pause for `wait`, again and again.
        other = self.name("other")
        self.define(other, "pack", {"pack": None})
        others = self.client.insert_all(other, [{"priority": 10}] * 20)
        ids = self.client.insert_all(self.fsm, [{"state": {"n": n}} for n in range(20)])
        with LogCapture() as log, running(self.worker(self.handlers(), batch=5, wait=30)):
            self.wait_all(ids, timeout=10)
        self.assertEqual([m for m in log.messages if "released" in m], [])
        self.assertEqual(self.db.execute("SELECT drained FROM gd.queue_stats WHERE queue = %s", [self.queue]
                                         ).fetchone()[0], 0)
        self.assertEqual({self.status(i) for i in others}, {("runnable", "pack", 1)})

    def test_a_handler_for_an_fsm_not_defined_yet_holds_nothing_back(self):
        later = self.name("later")
        order = self.client.insert(self.fsm, {"n": 1})
        handlers = {**self.handlers(), (later, "work"): lambda state, ctx: done()}
        with running(self.worker(handlers, wait=0.2)):
            self.wait_all([order])
            self.define(later, "work", {"work": None})
            self.wait_all([self.client.insert(later)])

    def test_a_lost_lease_rolls_the_steps_writes_back(self):
        entered, go_on = threading.Event(), threading.Event()

        def label(state, ctx):
            self.record(ctx)
            entered.set()
            go_on.wait(10)
            return next_step("end")
        order = self.client.insert(self.fsm, {"n": 1, "packed": True}, step="label")
        with LogCapture() as log, running(self.worker(self.handlers(label=label), lease=60)):
            entered.wait(10)
            # The lease runs out (as if the worker had hung) and the reaper hands the step back.
            self.db.execute("UPDATE gd._instances SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
                            [order])
            self.db.execute("SELECT gd._reclaim_leases(10)")
            go_on.set()
            self.until(lambda: any("were lost" in m for m in log.messages), message="the lost lease")
            self.wait_all([order])
        # The first run's write was rolled back with its transaction; the rerun's stands.
        self.assertEqual([e[1:] for e in self.effects()], [("end", 1), ("label", 2)])

    def test_stop_drains_the_batch_in_hand(self):
        entered = threading.Event()

        def label(state, ctx):
            self.record(ctx)
            entered.set()
            time.sleep(0.5)
            return next_step("end")
        ids = self.client.insert_all(self.fsm, [{"step": "label", "state": {"n": n, "packed": True}} for n in range(5)])
        worker = self.worker(self.handlers(label=label), queues=[self.other_queue], batch=5)
        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
        thread.start()
        entered.wait(10)
        worker.stop()
        thread.join(10)
        self.assertFalse(thread.is_alive())
        rows = self.db.execute("SELECT step, status, attempt, lease_owner FROM gd.instances WHERE id = ANY(%s)"
                               " ORDER BY id", [ids]).fetchall()
        self.assertEqual(rows[0], ("end", "runnable", 1, None), "the step in hand completed")
        self.assertEqual(rows[1:], [("label", "runnable", 1, None)] * 4, "the rest handed back, no attempt counted")

    def test_reconnects_after_its_connections_are_killed(self):
        ids = self.client.insert_all(self.fsm, [{"state": {"n": n}} for n in range(3)])
        with LogCapture() as log, running(self.worker(self.handlers())):
            self.wait_all(ids)
            self.db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                            [f"gd worker {self.name('w')}"])
            more = self.client.insert_all(self.fsm, [{"state": {"n": n}} for n in range(3, 6)])
            self.wait_all(more)
        self.assertTrue(any("reconnecting" in m for m in log.messages))

    def test_a_claim_waits_in_the_server_until_work_commits_and_stop_cancels_it(self):
        worker = self.worker(self.handlers(), wait=30)
        with running(worker):
            self.until(lambda: self.db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state = 'active'"
                " AND query LIKE %s", [f"gd worker {self.name('w')}", "%gd_claim%"]).fetchone()[0] == 1,
                message="the lane's claim waiting")
            inserted = time.monotonic()
            ids = self.client.insert_all(self.fsm, [{"state": {"n": n}} for n in range(3)])
            self.wait_all(ids)
            self.assertLess(time.monotonic() - inserted, 15, "woken by the commit, not at the end of its 30 s wait")
            stopping = time.monotonic()
        self.assertLess(time.monotonic() - stopping, 10, "stop() cancelled the waiting claim")

    def test_queues_default_to_those_the_steps_are_defined_on(self):
        worker = Worker(DSN, self.handlers(), name=self.name("w"))
        worker._resolve_queues()
        self.assertEqual(sorted(worker.queues), sorted([self.queue, self.other_queue]))


if __name__ == "__main__":
    unittest.main()
