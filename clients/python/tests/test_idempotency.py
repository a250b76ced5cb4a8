"""ctx.idempotency_key against a payment service that charges, then answers
after the worker gave up: every retry, and the step run again after its lease
was reclaimed, sends the same key, so nothing is charged twice."""

import http.server
import json
import threading
import urllib.request

from gen_durable import Client, Worker, done, next_step
from support import DSN, ServerTest, running


class PaymentService(http.server.ThreadingHTTPServer):
    """Charges once per Idempotency-Key, before answering; the first answer
    for a key comes `delay` seconds later."""

    def __init__(self, delay):
        self.delay = delay
        self.charges = {}    # key -> (order, charge)
        self.calls = []      # (order, key)
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), PaymentHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/charges"

    def charge(self, order, key):
        with self.lock:
            self.calls.append((order, key))
            first = key not in self.charges
            if first:
                self.charges[key] = (order, f"ch_{len(self.charges) + 1}")
            return self.charges[key][1], first


class PaymentHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        order = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["order"]
        charge, first = self.server.charge(order, self.headers["Idempotency-Key"])
        if first:
            threading.Event().wait(self.server.delay)
        body = json.dumps({"charge": charge}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass   # the caller gave up

    def log_message(self, *args):
        pass


def call(url, order, key, timeout=None):
    request = urllib.request.Request(url, data=json.dumps({"order": order}).encode(),
                                     headers={"Idempotency-Key": key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())["charge"]


class IdempotencyTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.fsm = self.name("order")
        self.define(self.fsm, "pay", {"pay": {"max_attempts": 5, "backoff": "10 milliseconds"}, "ship": None})
        self.client = Client(DSN)
        self.addCleanup(self.client.close)
        self.psp = PaymentService(delay=0.3)
        threading.Thread(target=self.psp.serve_forever, daemon=True).start()
        self.addCleanup(self.psp.server_close)
        self.addCleanup(self.psp.shutdown)

    def wait_all(self, ids):
        self.until(lambda: self.db.execute("SELECT count(*) FROM gd.instances WHERE id = ANY(%s) AND status = 'done'",
                                           [ids]).fetchone()[0] == len(ids), 30, f"{len(ids)} done")

    def handlers(self, pay):
        return {(self.fsm, "pay"): pay, (self.fsm, "ship"): lambda state, ctx: done(state)}

    def test_retries_and_a_reclaimed_lease_charge_once(self):
        def pay(state, ctx):
            # The first answer comes after this 0.1 s timeout: charged, yet a failed attempt.
            charge = call(self.psp.url, state["order"], ctx.idempotency_key, timeout=0.1)
            return next_step("ship", {**state, "charge": charge})

        ids = self.client.insert_all(self.fsm, [{"state": {"order": n}} for n in range(20)])
        with running(Worker(DSN, self.handlers(pay), queues=[self.queue], concurrency=2, wait=0.2,
                            name=self.name("w"))):
            self.wait_all(ids)

        # One more order whose worker charges, then hangs until its lease was
        # reclaimed: the step runs again on another worker, with the same key.
        charged, reclaimed = threading.Event(), threading.Event()

        def pay_and_hang(state, ctx):
            call(self.psp.url, state["order"], ctx.idempotency_key)
            charged.set()
            reclaimed.wait(30)
            return next_step("ship", {**state, "charge": "from the hung worker"})   # too late: dropped

        with running(Worker(DSN, self.handlers(pay_and_hang), queues=[self.queue], lease=60, wait=0.2,
                            name=self.name("hangs"))):
            late = self.client.insert(self.fsm, {"order": 20})
            self.assertTrue(charged.wait(30))
            self.db.execute("UPDATE gd._instances SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
                            [late])
            self.db.execute("SELECT gd._reclaim_leases(10)")
            with running(Worker(DSN, self.handlers(pay), queues=[self.queue], wait=0.2, name=self.name("w2"))):
                self.wait_all([late])
            reclaimed.set()

        keys_of = {}
        for order, key in self.psp.calls:
            keys_of.setdefault(order, []).append(key)
        self.assertEqual(sorted(keys_of), list(range(21)))
        for order, keys in keys_of.items():
            self.assertGreaterEqual(len(keys), 2, f"order {order} was sent again")
            self.assertEqual(len(set(keys)), 1, f"order {order} sent one key")
        charges = sorted(order for order, _ in self.psp.charges.values())
        self.assertEqual(charges, list(range(21)), "one charge per order")
        charge_of = dict(self.psp.charges.values())
        done_rows = self.db.execute("SELECT (result->>'order')::int, result->>'charge' FROM gd.instances"
                                    " WHERE id = ANY(%s) AND status = 'done'", [ids + [late]]).fetchall()
        self.assertEqual(len(done_rows), 21)
        for order, charge in done_rows:
            self.assertEqual(charge, charge_of[order], f"order {order} kept its charge")
