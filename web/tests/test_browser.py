"""The dashboard in a real browser (Debian's chromium, driven by Selenium
through chromium-driver): the overview, a filter, an instance signalled and
seen to finish through the live refresh, a cancel, an XSS payload that stays
text, a failed instance rewound and forked through their confirmations, and
a role without grants that sees nothing and is refused.  With
GD_WEB_SCREENSHOTS=dir it saves the main pages there."""

import os
import threading
import time
import unittest

import uvicorn
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from gd_web import create_app
from gd_web.app import default_hosts
from support import DashboardTest, dsn_as, free_port

SCREENSHOTS = os.environ.get("GD_WEB_SCREENSHOTS", "")


def gone(element):
    """Has the page holding `element` been left?  Chromium may say so with another error than
    selenium's stale element (its node no longer belongs to the document)."""
    try:
        element.is_enabled()
        return False
    except WebDriverException:
        return True


class Served:
    """The dashboard as `role`, served by uvicorn on a free port in a thread."""

    def __init__(self, role):
        self.port = free_port()
        config = uvicorn.Config(create_app(dsn_as(role), default_hosts("127.0.0.1", self.port), sample_seconds=0.5),
                                host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
                     "--disable-gpu"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


class InABrowser(DashboardTest):
    def setUp(self):
        super().setUp()
        self.served = Served("web_shop")
        self.addCleanup(self.served.stop)
        self.browser = browser()
        self.addCleanup(self.browser.quit)
        self.wait = WebDriverWait(self.browser, 20)

    def open(self, path):
        self.browser.get(self.served.url + path)

    def shot(self, name):
        if SCREENSHOTS:
            os.makedirs(SCREENSHOTS, exist_ok=True)
            self.browser.save_screenshot(os.path.join(SCREENSHOTS, f"web-{name}.png"))

    def no_alert(self):
        try:
            self.browser.switch_to.alert
        except NoAlertPresentException:
            return True
        return False

    def test_overview_filter_signal_cancel_and_xss(self):
        xss = "<img src=x onerror=alert(1)><script>alert(2)</script>"
        paid = self.insert({"n": 1, "note": xss}, correlation_key=f"browser-{self.tag}-paid")
        dropped = self.insert({"n": 2}, correlation_key=f"browser-{self.tag}-dropped")
        self.until(lambda: {self.status(paid), self.status(dropped)} == {"awaiting_signal"}, message="the waits")

        self.open("/")
        self.wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, '#queues tr[data-queue="default"]')))
        self.wait.until(lambda b: b.find_element(By.ID, "live").get_attribute("data-refreshed"))  # live refresh ran
        self.shot("overview")

        self.open("/instances")
        Select(self.browser.find_element(By.NAME, "status")).select_by_visible_text("awaiting_signal")
        key = self.browser.find_element(By.NAME, "key")
        key.send_keys(f"browser-{self.tag}-")
        unfiltered = self.browser.find_element(By.ID, "instances")
        self.browser.find_element(By.CSS_SELECTOR, "#filter button[type=submit]").click()
        self.wait.until(lambda b: gone(unfiltered))  # (its two rows are these two too)
        self.wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#instances tr[data-id]")) == 2)
        self.shot("instances")

        self.browser.find_element(By.LINK_TEXT, str(paid)).click()
        self.wait.until(expected_conditions.text_to_be_present_in_element((By.ID, "status"), "awaiting_signal"))
        self.assertIn(xss, self.browser.find_element(By.CSS_SELECTOR, "#state pre").text, "the payload is shown as text")
        self.assertTrue(self.no_alert(), "and never runs")
        self.browser.find_element(By.LINK_TEXT, "Signal…").click()
        self.browser.find_element(By.NAME, "name").send_keys("paid")
        payload = self.browser.find_element(By.NAME, "payload")
        payload.clear()
        payload.send_keys('{"amount": 42}')
        self.browser.find_element(By.ID, "do").click()
        self.wait.until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, ".notice"), "delivered"))
        self.wait.until(expected_conditions.text_to_be_present_in_element((By.ID, "status"), "done"))  # live refresh
        self.assertIn('"amount": 42', self.browser.find_element(By.CSS_SELECTOR, "#result pre").text)
        self.shot("instance")

        self.open(f"/instances/{dropped}")
        self.browser.find_element(By.LINK_TEXT, "Cancel…").click()
        self.assertIn("ends cancelled now; no step runs", self.browser.find_element(By.ID, "plan").text)
        self.browser.find_element(By.NAME, "reason").send_keys("changed my mind")
        self.browser.find_element(By.ID, "do").click()
        self.wait.until(expected_conditions.text_to_be_present_in_element((By.ID, "status"), "cancelled"))
        self.assertEqual(self.status(dropped), "cancelled")
        self.assertTrue(self.no_alert())

        # An FSM with a compensation step: the confirmation names it; the instance runs it, then ends cancelled.
        refunded = self.insert({"n": 3}, fsm="web_refunded", correlation_key=f"browser-{self.tag}-refunded")
        self.until(lambda: self.status(refunded) == "awaiting_signal", message="the refunded order's wait")
        self.open(f"/instances/{refunded}")
        self.assertIn("compensates a cancel with step refund", self.browser.find_element(By.TAG_NAME, "main").text)
        self.browser.find_element(By.LINK_TEXT, "Cancel…").click()
        subject = self.browser.find_element(By.ID, "subject").text  # what is cancelled, before what runs
        self.assertIn(f"Instance {refunded}: web_refunded v1, step pack, awaiting_signal, attempt 1, key browser-{self.tag}-refunded",
                      subject)
        plan = self.browser.find_element(By.ID, "plan").text
        self.assertIn("Step refund (its FSM's compensation) will run, then the instance ends cancelled", plan)
        self.browser.find_element(By.NAME, "reason").send_keys("out of stock")
        self.browser.find_element(By.ID, "do").click()
        self.wait.until(expected_conditions.text_to_be_present_in_element((By.ID, "status"), "cancelled"))
        result = self.db.execute("SELECT result, error->>'reason' FROM gd.instances WHERE id = %s", [refunded]).fetchone()
        self.assertEqual(result, ({"refunded": True, "cancelled_at": "pack"}, "out of stock"))
        self.open(f"/confirm/cancel?target={refunded}")
        self.assertIn("is cancelled: nothing will be cancelled", self.browser.find_element(By.ID, "plan").text)

        self.open("/schedules")
        self.wait.until(expected_conditions.presence_of_element_located((By.ID, "concurrency-limits")))
        self.shot("schedules")


    def test_rewind_through_the_confirmation(self):
        failed = self.insert({"fail": True}, correlation_key=f"browser-{self.tag}-rewound")
        self.until(lambda: self.status(failed) == "failed", message="the stop")
        self.open(f"/instances/{failed}")
        self.browser.find_element(By.LINK_TEXT, "Rewind…").click()
        plan = self.browser.find_element(By.ID, "plan").text
        self.assertIn("(failed at step pack, attempt 1) goes back to the step chosen below", plan)
        self.assertIn("Only the FSM's owner may rewind its instances", plan)
        Select(self.browser.find_element(By.NAME, "step")).select_by_visible_text("ship")
        self.browser.find_element(By.NAME, "state").send_keys('{"fixed": true}')
        self.shot("rewind")
        self.browser.find_element(By.ID, "do").click()
        self.wait.until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, ".notice"),
                                                                           "rewound to step ship"))
        self.wait.until(expected_conditions.text_to_be_present_in_element((By.ID, "status"), "done"))  # live refresh
        self.wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#history tr.kind-rewind")))
        rewind = self.browser.find_element(By.CSS_SELECTOR, "#history tr.kind-rewind").text
        self.assertIn("rewound by web_shop from step pack (failed, attempt 1)", rewind)
        self.assertIn('"fixed": true', self.browser.find_element(By.CSS_SELECTOR, "#state pre").text)

        # Forked from the rewind's entry, which kept the state it set: a new instance, shipped too.
        self.browser.find_element(By.CSS_SELECTOR, "#history tr.kind-rewind").find_element(
            By.LINK_TEXT, "Fork from here…").click()
        self.assertIn("starts at step ship", self.browser.find_element(By.ID, "plan").text)
        self.browser.find_element(By.ID, "do").click()
        self.wait.until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, ".notice"),
                                                                           f"of instance {failed}"))
        self.wait.until(expected_conditions.text_to_be_present_in_element((By.ID, "status"), "done"))
        self.assertIn(f"forked by web_shop from instance {failed}",
                      self.browser.find_element(By.CSS_SELECTOR, "#history tr.kind-fork").text)
        self.assertTrue(self.no_alert())


class StrangerInABrowser(DashboardTest):
    def setUp(self):
        super().setUp()
        self.served = Served("web_stranger")
        self.addCleanup(self.served.stop)
        self.browser = browser()
        self.addCleanup(self.browser.quit)

    def test_sees_nothing_and_is_refused(self):
        order = self.insert({"n": 1}, correlation_key=f"hidden-{self.tag}")
        self.browser.get(self.served.url + "/instances")
        self.assertIn("No instances this role can see match.", self.browser.find_element(By.ID, "instances").text)
        self.browser.get(self.served.url + f"/confirm/cancel?target={order}")
        self.browser.find_element(By.ID, "do").click()
        WebDriverWait(self.browser, 20).until(
            expected_conditions.text_to_be_present_in_element((By.ID, "refusal"), "does not exist"))
        self.assertNotEqual(self.status(order), "cancelled")
        self.browser.get(self.served.url + "/confirm/pause?target=default")
        self.browser.find_element(By.ID, "do").click()
        WebDriverWait(self.browser, 20).until(
            expected_conditions.text_to_be_present_in_element((By.ID, "refusal"), "permission denied"))


if __name__ == "__main__":
    unittest.main()
