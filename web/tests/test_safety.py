"""What the dashboard refuses: a request for another host name (DNS
rebinding), a superuser's connection (unless told), a parameter it will not
send to PostgreSQL (400 with a message, never 500), and the names of a
squatter's schema (every name it sends is qualified)."""

import contextlib
import http.client
import os
import subprocess
import sys
import time

import psycopg

from gd_web.app import default_hosts
from support import DSN, AsRole, DashboardTest, csrf_of, dsn_as, free_port

LIVE = "awaiting_signal"


class Rebinding(AsRole):
    def test_a_foreign_host_is_refused_and_changes_nothing(self):
        order = self.insert({"n": 1})
        self.until(lambda: self.status(order) == LIVE, message="the wait")
        page = self.client.get("/confirm/cancel", params={"target": str(order)})
        form = {"csrf": csrf_of(page.text), "target": str(order)}   # its cookie is in the client
        for host in ("rebound.example", "rebound.example:8321", "testserver.rebound.example", "testserver:80", ""):
            for answer in (self.client.get("/", headers={"Host": host}),
                           self.client.get(f"/instances/{order}", headers={"Host": host}),
                           self.client.get("/static/live.js", headers={"Host": host}),
                           self.client.post("/act/cancel", data=form, headers={"Host": host}, follow_redirects=False)):
                self.assertEqual(answer.status_code, 400, host)
                self.assertIn("does not answer to the host", answer.text)
                self.assertNotIn("web_order", answer.text)
        self.assertEqual(self.status(order), LIVE)
        # the same form from the dashboard's own name is done: the Host alone made the difference
        self.assertEqual(self.client.post("/act/cancel", data=form, follow_redirects=False).status_code, 303)
        self.assertEqual(self.status(order), "cancelled")

    def test_default_hosts(self):
        loopback = ["127.0.0.1:8321", "127.0.0.1", "localhost:8321", "localhost", "[::1]:8321", "[::1]"]
        self.assertEqual(default_hosts("127.0.0.1", 8321), loopback)
        self.assertEqual(sorted(default_hosts("::1", 8321)), sorted(loopback))
        self.assertEqual(default_hosts("192.0.2.7", 80), ["192.0.2.7:80", "192.0.2.7"])
        self.assertEqual(default_hosts("dash.example", 8443), ["dash.example:8443", "dash.example"])


class CommandLine(DashboardTest):
    """python3 -m gd_web: on a superuser's connection (GD_TEST_DSN's) it will not start without
    --allow-superuser, and it answers to its own address's names only."""

    def run_dashboard(self, *arguments):
        return [sys.executable, "-m", "gd_web", "--dsn", DSN, *arguments]

    @contextlib.contextmanager
    def serving(self, *arguments, env=None):
        """The dashboard started with these arguments, once it answers on its port."""
        port = free_port()
        server = subprocess.Popen(self.run_dashboard("--port", str(port), *arguments), env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while self.get(port, f"127.0.0.1:{port}") is None:
                self.assertIsNone(server.poll(), "the dashboard stopped")
                self.assertLess(time.monotonic(), deadline, "the dashboard did not answer")
                time.sleep(0.1)
            yield port
        finally:
            server.terminate()
            server.communicate(timeout=20)

    @staticmethod
    def get(port, host):
        """(status, body) of GET / sent with this Host header, or None while nothing listens."""
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request("GET", "/", headers={"Host": host})
            response = connection.getresponse()
            return response.status, response.read().decode()
        except ConnectionRefusedError:
            return None
        finally:
            connection.close()

    def test_a_superuser_is_refused_unless_allowed(self):
        refused = subprocess.run(self.run_dashboard("--port", str(free_port())), capture_output=True, text=True,
                                 timeout=60)
        self.assertEqual(refused.returncode, 1, refused.stderr)
        self.assertIn("is a superuser: it sees and may act on every tenant's instances", refused.stderr)
        self.assertIn("--allow-superuser", refused.stderr)
        with self.serving("--allow-superuser") as port:
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
                self.assertEqual(self.get(port, host)[0], 200, host)
            status, body = self.get(port, f"rebound.example:{port}")
            self.assertEqual(status, 400)
            self.assertIn("does not answer to the host 'rebound.example:", body)

    def test_allowed_hosts(self):
        env = dict(os.environ, GD_WEB_ALLOWED_HOSTS="dash.example, dash.example:8443")
        with self.serving("--allow-superuser", env=env) as port:
            self.assertEqual(self.get(port, "dash.example")[0], 200)
            self.assertEqual(self.get(port, "DASH.example:8443")[0], 200)
            self.assertEqual(self.get(port, f"127.0.0.1:{port}")[0], 400, "the list replaces the defaults")
        with self.serving("--allow-superuser", "--allowed-hosts", "other.example", env=env) as port:
            self.assertEqual(self.get(port, "other.example")[0], 200)
            self.assertEqual(self.get(port, "dash.example")[0], 400, "the option wins over the variable")
        everywhere = subprocess.run(self.run_dashboard("--host", "0.0.0.0"), capture_output=True, text=True,
                                    timeout=60)
        self.assertEqual(everywhere.returncode, 2)
        self.assertIn("give --allowed-hosts", everywhere.stderr)


class BadInput(AsRole):
    """Each parameter PostgreSQL would choke on, or read otherwise than meant, gets 400 and a message."""

    def refused(self, answer, message):
        self.assertEqual(answer.status_code, 400, answer.text)
        self.assertIn(message, answer.text)

    def test_pages(self):
        for query, message in (
                ({"since": "2024-01-01 10:00 Mars/Olympus"}, "time zone &#34;mars/olympus&#34; not recognized"),
                ({"until": "yesterday-ish"}, "bad time in the filter: invalid input syntax"),
                ({"since": "294277-01-01"}, "bad time in the filter"),
                ({"after": "99999999999999999999"}, "the page cursor (after) must be an integer"),
                ({"after": "-9223372036854775809"}, "the page cursor (after) must be an integer"),
                ({"after": "12abc"}, "the page cursor (after) must be an integer"),
                ({"after": "\u0661\u0662"}, "the page cursor (after) must be an integer"),   # Arabic-Indic 12
                ({"sort": "priority", "after": "2147483648:5"}, "the page cursor&#39;s priority (after)"),
                ({"sort": "priority", "after": "5"}, "the page cursor&#39;s id (after)"),
                ({"key": "a\x00b"}, "key contains a NUL byte"),
                ({"queue": "\x00"}, "queue contains a NUL byte"),
                ({"fsm": "web\x00order"}, "fsm contains a NUL byte"),
                ({"step": "pack\x00"}, "step contains a NUL byte"),
                ({"since": "2024-01-01\x00"}, "since contains a NUL byte"),
                ({"after": "1\x00"}, "after contains a NUL byte"),
                ({"status": "fialed"}, "the status is one of runnable"),
                ({"sort": "sideways"}, "the order is one of newest, oldest, priority")):
            with self.subTest(query=query):
                self.refused(self.client.get("/instances", params=query), message)
        for path in ("/instances/99999999999999999999", "/instances/0", "/instances/12abc",
                     "/confirm/cancel?target=9223372036854775808", "/confirm/retry?target=1e3"):
            with self.subTest(path=path):
                self.refused(self.client.get(path), "an instance id must be an integer from 1 to 9223372036854775807")
        for action, query, message in (("bulk_cancel", {"since": "next tuesday"}, "bad time in the filter"),
                                       ("bulk_retry", {"key": "\x00"}, "key contains a NUL byte"),
                                       ("signal", {"target": "1\x00"}, "target contains a NUL byte"),
                                       ("pause", {"target": "1\x00"}, "target contains a NUL byte"),
                                       ("fork", {"target": "1"}, "a history entry must be an integer from 1 to"),
                                       ("fork", {"target": "1", "entry": "2147483648"}, "a history entry must be"),
                                       ("rewind", {"target": "1\x00"}, "target contains a NUL byte")):
            with self.subTest(action=action, query=query):
                self.refused(self.client.get(f"/confirm/{action}", params=query), message)

    def test_actions(self):
        order = self.insert({"n": 1}, correlation_key=f"bad-{self.tag}")
        self.until(lambda: self.status(order) == LIVE, message="the wait")
        csrf = csrf_of(self.client.get("/confirm/bulk_cancel").text)
        for action, form, message in (
                ("bulk_cancel", {"key": f"bad-{self.tag}", "since": "2000-13-45"}, "bad time in the filter"),
                ("bulk_cancel", {"key": f"bad-{self.tag}", "until": "2030-01-01 Nowhere/Land"}, "not recognized"),
                ("bulk_cancel", {"key": f"bad-{self.tag}", "status": "awaiting signal"}, "the status is one of"),
                ("bulk_cancel", {"key": f"bad-{self.tag}\x00"}, "key contains a NUL byte"),
                ("cancel", {"target": "99999999999999999999"}, "an instance id must be an integer"),
                ("cancel", {"target": f"{order}\x00"}, "target contains a NUL byte"),
                ("cancel", {"target": str(order), "reason": "why\x00not"}, "reason contains a NUL byte"),
                ("signal", {"target": str(order), "name": "paid\x00"}, "name contains a NUL byte"),
                ("signal", {"target": str(order), "name": "paid", "dedup_key": "\x00"},
                 "dedup_key contains a NUL byte"),
                ("signal", {"target": str(order), "name": "paid", "payload": "{\"a\": \"\x00\"}"},
                 "payload contains a NUL byte"),
                ("signal", {"target": str(order), "name": "paid", "payload": "{\"a\": \"\\u0000\"}"},
                 "unsupported Unicode escape sequence"),
                ("signal", {"target": str(order), "name": "paid", "payload": "[\"\\ud800\"]"}, "(SQLSTATE 22P02)"),
                ("signal", {"target": str(order), "name": "paid", "payload": "{not json"},
                 "invalid input syntax for type json"),
                ("signal", {"target": str(order), "name": " "}, "a signal needs a name"),
                ("pause", {"target": "default\x00"}, "target contains a NUL byte"),
                ("rewind", {"target": str(order), "step": " "}, "a rewind needs the step to go back to"),
                ("rewind", {"target": str(order), "step": "pack\x00"}, "step contains a NUL byte"),
                ("rewind", {"target": str(order), "step": "nowhere"}, "(SQLSTATE 42704)"),
                ("rewind", {"target": str(order), "step": "pack", "state": "{not json"},
                 "invalid input syntax for type json"),
                ("rewind", {"target": str(order), "step": "pack", "state": "[1]"}, "(SQLSTATE 22023)"),
                ("fork", {"target": str(order), "entry": "1e3"}, "a history entry must be an integer"),
                ("fork", {"target": str(order), "entry": "1", "state": "\"x\""}, "(SQLSTATE 22023)")):
            with self.subTest(action=action, form=form):
                self.refused(self.client.post(f"/act/{action}", data={"csrf": csrf, **form}), message)
        for name in ("target", "reason"):   # a file where text is wanted
            with self.subTest(file=name):
                fields = {"csrf": csrf, "target": str(order)}
                fields.pop(name, None)
                self.refused(self.client.post("/act/cancel", data=fields, files={name: ("x.txt", b"1")}),
                             f"{name} must be text, not a file")
        self.assertEqual(self.status(order), LIVE)
        self.assertEqual(self.db.execute("SELECT count(*) FROM gd.signals WHERE instance_id = %s", [order]).fetchone(),
                         (0,))


class Squatter(AsRole):
    """web_board's search_path looks in schema web_board before pg_catalog, and another role made that schema,
    with functions, operators, aggregates and types named as those the dashboard uses (support.py): none of them
    is ever called, since every name the dashboard sends is qualified."""
    role = "web_board"

    def setUp(self):
        super().setUp()
        self.db.execute("DELETE FROM web_board.calls")

    def calls(self):
        return [r[0] for r in self.db.execute("SELECT DISTINCT name FROM web_board.calls ORDER BY 1")]

    def test_the_squatter_is_never_called(self):
        with psycopg.connect(dsn_as("web_board"), autocommit=True) as board:   # the trap is set
            board.execute("SELECT current_database(), 'a' = 'a'")
        self.assertEqual(self.calls(), ["= text text", "current_database"])
        self.db.execute("DELETE FROM web_board.calls")

        self.db.execute("SELECT gd_set_rate_limit(%s, 10, '1 minute')", [f"web_rate_{self.tag}"])
        self.db.execute("SELECT gd_set_concurrency_limit(%s, 2)", [f"web_room_{self.tag}"])
        key, queue = f"squat-{self.tag}-", f"web_board_{self.tag}"
        with psycopg.connect(dsn_as("web_shop"), autocommit=True) as shop:   # a queue of its own, to pause
            shop.execute("SELECT gd_define_fsm(%s, 'call', %s, steps => '{\"call\": {}}')", [queue, queue])
        waiting = [self.insert({"n": n}, correlation_key=f"{key}{n}", concurrency_key=f"web_room_{self.tag}:{n}")
                   for n in range(4)]
        parent = self.insert({"spawn": True}, correlation_key=f"{key}parent")
        failed = self.insert({"fail": True}, correlation_key=f"{key}failed")
        self.until(lambda: [self.status(i) for i in waiting + [parent, failed]] == [LIVE] * 4 + ["done", "failed"],
                   message="the waits, the spawn and the failure")

        for path in ("/", "/schedules", f"/instances/{parent}", f"/instances/{failed}",
                     f"/instances?key={key}&fsm=web_order&queue=default&step=pack&status={LIVE}"
                     f"&since=2000-01-01&until=2100-01-01T00:00:00%2B02",
                     f"/instances?key={key}&sort=priority&after=0:{waiting[-1]}", f"/instances?sort=oldest&after=1",
                     f"/confirm/bulk_cancel?key={key}&status={LIVE}"):
            with self.subTest(path=path):
                self.assertEqual(self.client.get(path).status_code, 200)

        self.assertIn("delivered", self.act("signal", target=str(waiting[0]), name="paid",
                                            payload='{"amount": 1}', dedup_key="d").headers["location"])
        self.assertIn("cancelled", self.act("cancel", target=str(waiting[1]), reason="r").headers["location"])
        self.assertIn("retried", self.act("retry", target=str(failed)).headers["location"])
        self.assertIn("rewound", self.act("rewind", target=str(failed), step="pack").headers["location"])
        confirm = self.client.get("/confirm/fork", params={"target": str(parent), "entry": "1"})
        self.assertEqual(confirm.status_code, 200)
        forked = self.client.post("/act/fork", data={"csrf": csrf_of(confirm.text), "target": str(parent),
                                                     "entry": "1", "state": '{"n": 9}'}, follow_redirects=False)
        self.assertIn("forked+from+entry+1", forked.headers["location"])
        self.assertIn("paused", self.act("pause", target=queue).headers["location"])
        self.assertIn("resumed", self.act("resume", target=queue).headers["location"])
        confirm = self.client.get("/confirm/bulk_cancel", params={"key": key, "status": LIVE})
        bulk = self.client.post("/act/bulk_cancel", data={"csrf": csrf_of(confirm.text), "key": key, "status": LIVE},
                                follow_redirects=False)
        self.assertIn("2+of+2+instances+changed", bulk.headers["location"])
        self.assertEqual(self.calls(), [])
