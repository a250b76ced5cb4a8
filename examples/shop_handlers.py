"""Handlers for the external 'charge' step of examples/shop.sql:

    python3 -m gen_durable worker --dsn 'dbname=app' --handlers examples/shop_handlers.py

(with clients/python installed, or on PYTHONPATH).
"""
import time

from gen_durable import next_step, retry, stop


def charge(state, ctx):
    """Charge the card through a payment provider (simulated here).

    Runs outside the database, so it may run more than once (a retry after
    the provider's late answer, a worker that dies mid-step): pass the
    provider the key of this visit of the step, the same on every attempt.
    """
    idempotency_key = ctx.idempotency_key
    amount = state.get("amount", 0)
    if amount <= 0:
        return stop({"reason": "nothing to charge", "amount": amount})
    if state.get("card") == "flaky" and ctx.attempt < 2:
        return retry({"reason": "provider timeout"}, backoff=0.5)
    time.sleep(0.2)  # the provider's round trip
    return next_step("receipt", {**state, "charged": amount, "payment_ref": idempotency_key})


HANDLERS = {("shop_order", "charge"): charge}
