"""What the tests share: the server (GD_TEST_DSN, a superuser's connection
string to a database with gen_durable), and FSMs of their own per test, on
queues no executor serves, so each test decides when steps run."""

import contextlib
import logging
import os
import threading
import time
import unittest
import uuid

import psycopg

DSN = os.environ.get("GD_TEST_DSN", "")


def admin():
    return psycopg.connect(DSN, autocommit=True)


class ServerTest(unittest.TestCase):
    def setUp(self):
        self.db = admin()
        self.addCleanup(self.db.close)
        self.tag = uuid.uuid4().hex[:8]
        self.queue = f"q_{self.tag}"

    def name(self, what):
        return f"{what}_{self.tag}"

    def define(self, fsm, initial, steps, queue=None):
        """gd_define_fsm with steps: {step: handler signature or None (external), or an options dict}."""
        options = {step: ({"handler": spec} if isinstance(spec, str) else (spec or {})) for step, spec in steps.items()}
        self.db.execute("SELECT gd_define_fsm(%s, %s, %s, steps => %s)",
                        [fsm, initial, queue or self.queue, psycopg.types.json.Jsonb(options)])

    def status(self, instance_id):
        return self.db.execute("SELECT status, step, attempt FROM gd.instances WHERE id = %s",
                               [instance_id]).fetchone()

    def until(self, predicate, timeout=20.0, message="condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        self.fail(f"timed out waiting for {message}")


@contextlib.contextmanager
def running(worker):
    """Run a blocking Worker in a thread for the block, then stop it and wait for its drain."""
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
        if thread.is_alive():
            raise AssertionError("the worker did not stop within 30 s")


class LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("gen_durable").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("gen_durable").removeHandler(self)
