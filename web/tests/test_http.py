"""Every page and action over HTTP (Starlette's test client), as the FSM's
owner and as a role without grants: what each sees, what each may do, CSRF,
escaping, keyset paging and filters."""

import json
import re
from datetime import timedelta

import psycopg

from support import AsRole, csrf_of, dsn_as


class AsOwner(AsRole):
    def test_overview_shows_queues_steps_workers_and_counters(self):
        waiting = self.insert({"n": 1})
        self.until(lambda: self.status(waiting) == "awaiting_signal", message="the wait")
        page = self.client.get("/")
        self.assertEqual(page.status_code, 200)
        self.assertIn('data-queue="default"', page.text)
        self.assertIn("<th>scheduled</th><th>held</th>", page.text, "held back by a concurrency key, apart from runnable")
        self.assertRegex(page.text, r'<td>web_order <small>v1</small></td><td>pack</td><td>await</td><td>\d+</td>')
        self.assertIn("<td>launcher</td>", page.text)

        self.assertIn("default-src 'self'", page.headers["content-security-policy"])

    def test_live_part_alone(self):
        page = self.client.get("/", headers={"X-GD-Live": "1"})
        self.assertEqual(page.status_code, 200)
        self.assertNotIn("<html", page.text)
        self.assertIn('id="queues"', page.text)

    def test_filters_and_keyset_pages(self):
        ids = [self.insert({"n": n}, correlation_key=f"page-{self.tag}-{n:03}", priority=n % 3) for n in range(120)]
        seen, cursor_url = [], f"/instances?key=page-{self.tag}-"
        while cursor_url:
            page = self.client.get(cursor_url)
            self.assertEqual(page.status_code, 200)
            seen += [int(i) for i in re.findall(r'<tr data-id="(\d+)"', page.text)]
            found = re.search(r'id="next" href="([^"]+)"', page.text)
            cursor_url = found.group(1).replace("&amp;", "&") if found else None
        self.assertEqual(seen, sorted(ids, reverse=True), "newest first, every one once, 50 a page")
        by_priority = self.client.get(f"/instances?key=page-{self.tag}-&sort=priority")
        shown = [int(i) for i in re.findall(r'<tr data-id="(\d+)"', by_priority.text)]
        self.assertEqual(shown, [i for n, i in sorted((n % 3, i) for n, i in enumerate(ids))][:50])
        narrowed = self.client.get(f"/instances?key=page-{self.tag}-00&fsm=web_order&status=awaiting_signal&step=pack")
        self.assertEqual(len(re.findall(r'<tr data-id="', narrowed.text)), 10)
        self.assertIn("No instances", self.client.get("/instances?key=page-&status=failed&since=2100-01-01").text)
        bad = self.client.get("/instances?since=yesterday-ish")
        self.assertEqual(bad.status_code, 400)
        self.assertIn("bad time in the filter", bad.text)

    def test_instance_page_escapes_what_it_shows(self):
        parent = self.insert({"spawn": True, "note": "<script>alert('x')</script>"})
        self.until(lambda: self.status(parent) == "done", message="the spawn and its child")
        page = self.client.get(f"/instances/{parent}")
        self.assertEqual(page.status_code, 200)
        self.assertNotIn("<script>alert", page.text)
        self.assertIn("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;", page.text)
        self.assertRegex(page.text, r'id="children"[^<]*<li class="depth-1"><a href="/instances/\d+">')
        self.assertIn('id="history"', page.text)
        self.assertIn("<code>web_shop.step(jsonb,gd.context)</code>", page.text)
        self.assertEqual(self.client.get("/instances/999999999").status_code, 404)

    def test_instance_page_shows_a_pending_debounce(self):
        pending = self.insert({"n": 1}, correlation_key="web-debounced", debounce=timedelta(hours=1))
        self.assertEqual(self.insert({"n": 2}, correlation_key="web-debounced", debounce=timedelta(hours=1)), pending)
        page = self.client.get(f"/instances/{pending}").text
        self.assertIn("pending: debounced inserts of its key join it", page)
        self.assertIn("&#34;n&#34;: 2", page)
        self.assertNotIn("debounced", self.client.get(f"/instances/{self.insert({'n': 3})}").text)

    def test_instance_page_shows_its_fairness_key(self):
        keyed = self.insert({"n": 1}, fairness_key="customer-<7>")
        self.assertIn('<td id="fairness-key">customer-&lt;7&gt;</td>', self.client.get(f"/instances/{keyed}").text)
        self.assertNotIn("fairness key", self.client.get(f"/instances/{self.insert({'n': 2})}").text)

    def test_signal_cancel_retry_and_bulk(self):
        order = self.insert({"n": 1})
        self.until(lambda: self.status(order) == "awaiting_signal", message="the wait")
        done = self.act("signal", target=str(order), name="paid", payload='{"amount": 3}', dedup_key="pay-1")
        self.assertEqual(done.status_code, 303)
        self.assertIn("notice=signal+paid+delivered", done.headers["location"])
        self.until(lambda: self.status(order) == "done", message="the paid order shipped")
        self.assertIn("&#34;amount&#34;: 3", self.client.get(f"/instances/{order}").text)
        self.assertEqual(self.act("signal", target=str(order), name="paid", payload="{not json").status_code, 400)

        other = self.insert({"n": 2})
        self.until(lambda: self.status(other) == "awaiting_signal", message="the wait")
        self.assertIn("cancelled", self.act("cancel", target=str(other), reason="test").headers["location"])
        self.assertEqual(self.status(other), "cancelled")
        self.assertIn("was+not+cancelled", self.act("cancel", target=str(other)).headers["location"])

        failed = self.insert({"fail": True})
        self.until(lambda: self.status(failed) == "failed", message="the failure")
        listing = self.client.get("/instances", params={"status": "failed", "fsm": "web_order"}).text
        row = listing[listing.index(f'data-id="{failed}"'):]
        self.assertRegex(row[:row.index("</tr>")], r'<td class="error" title="[^"]*stopped its instance">[^<]*stopped its instance</td>',
                         "the list shows why an instance failed")
        self.assertIn("retried", self.act("retry", target=str(failed)).headers["location"])

        bulk = [self.insert({"n": n}, correlation_key=f"bulk-{self.tag}-{n}") for n in range(3)]
        self.until(lambda: all(self.status(i) == "awaiting_signal" for i in bulk), message="the waits")
        confirm = self.client.get("/confirm/bulk_cancel", params={"key": f"bulk-{self.tag}-"})
        self.assertIn("3 instances match", confirm.text)
        result = self.client.post("/act/bulk_cancel", data={"csrf": csrf_of(confirm.text), "key": f"bulk-{self.tag}-"},
                                  follow_redirects=False)
        self.assertIn("3+of+3+instances+changed", result.headers["location"])
        self.assertEqual({self.status(i) for i in bulk}, {"cancelled"})

        self.db.execute("UPDATE gd._instances SET status = 'failed', finished_at = now() WHERE id = ANY (%s)", [bulk])
        confirm = self.client.get("/confirm/bulk_retry", params={"key": f"bulk-{self.tag}-"})
        result = self.client.post("/act/bulk_retry", data={"csrf": csrf_of(confirm.text), "key": f"bulk-{self.tag}-"},
                                  follow_redirects=False)
        self.assertIn("3+of+3+instances+changed", result.headers["location"])
        self.until(lambda: all(self.status(i) == "awaiting_signal" for i in bulk), message="the retried waits")


    def test_rewind_and_fork(self):
        failed = self.insert({"fail": True})
        self.until(lambda: self.status(failed) == "failed", message="the stop")
        page = self.client.get(f"/instances/{failed}").text
        self.assertIn(f'href="/confirm/rewind?target={failed}"', page)
        self.assertIn(f'href="/confirm/fork?target={failed}&amp;entry=1"', page, "its first entry kept a state")

        confirm = self.client.get("/confirm/rewind", params={"target": str(failed)})
        self.assertIn("(failed at step <code>pack</code>, attempt 1) goes back to the step chosen below", confirm.text)
        self.assertIn("<option selected>pack</option><option>ship</option>", confirm.text)
        rewound = self.client.post("/act/rewind", data={"csrf": csrf_of(confirm.text), "target": str(failed),
                                                        "step": "ship", "state": '{"fixed": true}'},
                                   follow_redirects=False)
        self.assertEqual(rewound.status_code, 303)
        self.assertIn("rewound+to+step+ship", rewound.headers["location"])
        self.until(lambda: self.status(failed) == "done", message="the rewound order shipped")
        page = self.client.get(f"/instances/{failed}").text
        self.assertRegex(page, r'<tr data-entry="2" class="kind-rewind"><td>2</td><td>1</td><td>ship</td>'
                               r'<td>rewind</td>[^\n]*\n[^\n]*\n<td>rewound by web_shop from step pack \(failed, attempt 1\)</td>')
        self.assertNotIn(f'href="/confirm/rewind?target={failed}"', page, "done: no rewind")
        confirm = self.client.get("/confirm/rewind", params={"target": str(failed)})
        self.assertIn(f"Instance {failed} is done: nothing will be rewound", confirm.text)
        again = self.client.post("/act/rewind", data={"csrf": csrf_of(confirm.text), "target": str(failed),
                                                      "step": "pack"}, follow_redirects=False)
        self.assertIn("was+not+rewound", again.headers["location"])

        # Forked from its first entry (pack, with the state it started with), with a state of our own: it waits.
        confirm = self.client.get("/confirm/fork", params={"target": str(failed), "entry": "1"})
        self.assertIn("starts at step <code>pack</code> (entry 1, stop)", confirm.text)
        self.assertIn("&#34;fail&#34;: true", confirm.text, "the entry's state")
        forked = self.client.post("/act/fork", data={"csrf": csrf_of(confirm.text), "target": str(failed),
                                                     "entry": "1", "state": '{"n": 7}'}, follow_redirects=False)
        self.assertEqual(forked.status_code, 303)
        fork_id = int(re.search(r"^/instances/(\d+)\?notice=instance\+\d+\+forked\+from\+entry\+1",
                                forked.headers["location"]).group(1))
        self.until(lambda: self.status(fork_id) == "awaiting_signal", message="the fork's wait")
        page = self.client.get(f"/instances/{fork_id}").text
        self.assertIn(f'forked by web_shop from <a href="/instances/{failed}">instance {failed}</a> entry 1', page)
        self.assertIn("&#34;n&#34;: 7", page)
        missing = self.client.post("/act/fork", data={"csrf": csrf_of(confirm.text), "target": str(failed),
                                                      "entry": "99"}, follow_redirects=False)
        self.assertEqual(missing.status_code, 400)
        self.assertIn("has no history entry 99 (SQLSTATE P0002)", missing.text)
        self.assertIn("nothing will be forked",
                      self.client.get("/confirm/fork", params={"target": str(failed), "entry": "99"}).text)

    def test_migrate(self):
        fsm = f"web_migrated_{self.tag}"

        def define(version, last):
            with psycopg.connect(dsn_as("web_shop"), autocommit=True) as shop:
                shop.execute("SELECT gd_define_fsm(%s, 'pack', version => %s, history => true, steps => %s)",
                             [fsm, version, json.dumps({"pack": {"handler": "web_shop.step(jsonb, gd.context)"},
                                                        last: {"handler": "web_shop.step(jsonb, gd.context)"}})])

        define(1, "ship")
        parked = self.insert({"n": 1}, fsm=fsm)
        self.until(lambda: self.status(parked) == "awaiting_signal", message="the wait")
        define(2, "deliver")
        page = self.client.get(f"/instances/{parked}").text
        self.assertIn(f'href="/confirm/migrate?target={fsm}"', page)
        confirm = self.client.get("/confirm/migrate", params={"target": fsm})
        self.assertIn("<tr><td>1</td><td>1</td></tr><tr><td>2</td><td>0</td></tr>", confirm.text)
        form = {"csrf": csrf_of(confirm.text), "target": fsm, "from_version": "1", "to_version": "2"}
        refused = self.client.post("/act/migrate", data=form)
        self.assertEqual(refused.status_code, 400)
        self.assertIn("at steps version 2 does not have: &#39;ship&#39; (SQLSTATE 22023)", refused.text)
        moved = self.client.post("/act/migrate", data={**form, "step_map": '{"ship": "deliver"}'},
                                 follow_redirects=False)
        self.assertEqual(moved.status_code, 303)
        self.assertIn(f"notice=1+live+instance+of+{fsm}+moved+from+version+1+to+2", moved.headers["location"])
        self.act("signal", target=str(parked), name="paid")
        self.until(lambda: self.status(parked) == "done", message="the migrated order delivered")
        page = self.client.get(f"/instances/{parked}").text
        self.assertIn("migrated by web_shop from version 1 step pack to version 2", page)
        self.assertEqual(self.db.execute("SELECT version, step FROM gd.instances WHERE id = %s", [parked]).fetchone(),
                         (2, "deliver"))
        self.assertIn("must be an integer", self.client.post("/act/migrate", data={**form, "to_version": "x"}).text)

    def test_external_workers_and_pausing_a_queue(self):
        queue = f"web_ext_{self.tag}"
        with psycopg.connect(dsn_as("web_shop"), autocommit=True) as shop:
            shop.execute("SELECT gd_define_fsm(%s, 'call', %s, steps => %s)",
                         [f"web_ext_{self.tag}", queue, json.dumps({"call": {"batch": 10, "chain": False}})])
            inserted = shop.execute("SELECT gd_insert(%s)", [f"web_ext_{self.tag}"]).fetchone()[0]
            self.assertEqual(shop.execute("SELECT count(*) FROM gd_claim(%s, 'web-worker-1', 1)", [queue]).fetchone()[0], 1)
        # The definition shows the step's batch, and that it never runs in a chain.
        self.assertIn("<td>10</td>\n<td>never chained</td></tr>", self.client.get(f"/instances/{inserted}").text)
        row = f"<td>web-worker-1</td><td>{queue}</td><td>1</td>"
        self.until(lambda: row in self.client.get("/").text, message="the claim on the overview (read every 5 s)")

        # gd_pause is administration: refused to this role until granted, and said so.
        refused = self.act("pause", target=queue)
        self.assertEqual(refused.status_code, 403)
        self.assertIn("permission denied for function gd_pause", refused.text)
        self.db.execute("GRANT EXECUTE ON FUNCTION gd_pause(text), gd_resume(text) TO web_shop")
        self.addCleanup(self.db.execute, "REVOKE EXECUTE ON FUNCTION gd_pause(text), gd_resume(text) FROM web_shop")
        self.assertIn(f"queue+{queue}+paused", self.act("pause", target=queue).headers["location"])
        self.assertTrue(self.db.execute("SELECT paused FROM gd.queues WHERE name = %s", [queue]).fetchone()[0])
        self.assertIn(f"queue+{queue}+resumed", self.act("resume", target=queue).headers["location"])
        self.assertFalse(self.db.execute("SELECT paused FROM gd.queues WHERE name = %s", [queue]).fetchone()[0])

    def test_every_action_needs_the_csrf_token(self):
        order = self.insert({"n": 1})
        self.client.get("/")
        for form in ({}, {"csrf": "guessed"}, {"csrf": "gu\u00e9ssed"}):
            answer = self.client.post("/act/cancel", data={"target": str(order), **form})
            self.assertEqual(answer.status_code, 403)
            self.assertIn("CSRF token", answer.text)
        self.assertNotEqual(self.status(order), "cancelled")

    def test_schedules_and_limits(self):
        self.db.execute("SELECT gd_set_rate_limit(%s, 10, '1 minute')", [f"web_rate_{self.tag}"])
        self.db.execute("SELECT gd_set_concurrency_limit(%s, 2)", [f"web_room_{self.tag}"])
        self.db.execute("SELECT gd_set_concurrency_limit(%s, 1, scope => 'run')", [f"web_order_{self.tag}"])
        with psycopg.connect(dsn_as("web_shop"), autocommit=True) as shop:
            shop.execute("SELECT gd_schedule(%s, '0 3 * * *', 'web_order', time_zone => 'Europe/Berlin')",
                         [f"nightly_{self.tag}"])
        page = self.client.get("/schedules")
        self.assertEqual(page.status_code, 200)
        self.assertIn(f"<td>nightly_{self.tag}</td><td><code>0 3 * * *</code></td><td>Europe/Berlin</td>", page.text)
        self.assertIn(f"<td>web_rate_{self.tag}</td><td>10 per 0:01:00</td>", page.text)
        self.assertIn(f"<td>web_room_{self.tag}</td><td>2</td><td>no</td>\n<td>each step</td>", page.text)
        self.assertIn(f"<td>web_order_{self.tag}</td><td>1</td><td>no</td>\n<td>the whole run</td>", page.text)
        self.db.execute("SELECT gd_set_owner_weight('web_shop', 3)")
        self.addCleanup(self.db.execute, "SELECT gd_set_owner_weight('web_shop', 1)")
        self.assertIn("<tr><td>web_shop</td><td>3</td></tr>", self.client.get("/schedules").text)


class AsStranger(AsRole):
    """A role with no grant sees none of web_order's instances and may act on none."""
    role = "web_stranger"

    def test_sees_nothing_and_is_refused(self):
        order = self.insert({"n": 1}, correlation_key=f"secret-{self.tag}")
        self.until(lambda: self.status(order) == "awaiting_signal", message="the wait")
        listing = self.client.get("/instances")
        self.assertNotIn(f"secret-{self.tag}", listing.text)
        self.assertNotIn("web_order", listing.text)
        self.assertEqual(self.client.get(f"/instances/{order}").status_code, 404)
        self.assertNotIn("<td>web_order</td>", self.client.get("/").text)
        page = self.client.get("/confirm/cancel", params={"target": str(order)})
        self.assertNotIn(f"secret-{self.tag}", page.text)   # the confirmation says nothing of an instance it cannot see
        self.assertNotIn('id="subject"', page.text)
        answer = self.client.post("/act/cancel", data={"csrf": csrf_of(page.text), "target": str(order)},
                                  follow_redirects=False)
        self.assertIn("was+not+cancelled", answer.headers["location"])
        signal = self.client.post("/act/signal", data={"csrf": csrf_of(page.text), "target": str(order),
                                                       "name": "paid", "payload": json.dumps({})})
        self.assertEqual(signal.status_code, 400)
        self.assertIn("P0002", signal.text)
        self.assertEqual(self.status(order), "awaiting_signal")
        rewind = self.client.post("/act/rewind", data={"csrf": csrf_of(page.text), "target": str(order),
                                                       "step": "ship"}, follow_redirects=False)
        self.assertIn("was+not+rewound", rewind.headers["location"])
        fork = self.client.post("/act/fork", data={"csrf": csrf_of(page.text), "target": str(order), "entry": "1"})
        self.assertEqual(fork.status_code, 400)
        self.assertIn("P0002", fork.text)
        self.assertEqual(self.status(order), "awaiting_signal")

    def test_a_role_granted_the_fsm_may_not_repair_it(self):
        order = self.insert({"n": 1})
        self.until(lambda: self.status(order) == "awaiting_signal", message="the wait")
        self.db.execute("SELECT gd_grant('web_order', 'web_stranger')")
        self.addCleanup(self.db.execute, "SELECT gd_revoke('web_order', 'web_stranger')")
        page = self.client.get(f"/instances/{order}").text
        for offered in ("Rewind…", "Fork from here…", "Migrate live instances…"):
            self.assertNotIn(offered, page, "no repair is offered to a role that may not make it")
        self.assertIn("Cancel…", page)
        confirm = self.client.get("/confirm/rewind", params={"target": str(order)})
        self.assertIn("Only the FSM's owner may rewind its instances", confirm.text)
        for action, form in (("rewind", {"step": "ship"}), ("fork", {"entry": "1"})):
            with self.subTest(action=action):
                refused = self.client.post(f"/act/{action}", data={"csrf": csrf_of(confirm.text),
                                                                   "target": str(order), **form})
                self.assertEqual(refused.status_code, 403)
                self.assertIn(f"only the owner of FSM &#39;web_order&#39; (web_shop) may {action} its instances"
                              f" (SQLSTATE 42501)", refused.text)
        self.assertEqual(self.status(order), "awaiting_signal")
