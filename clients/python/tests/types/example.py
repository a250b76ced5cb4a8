"""The README's client and worker, typed: 047 checks it with mypy against the
installed package (py.typed), as an application's type checker would."""

import asyncio
from typing import Any, Dict, List, Optional

from gen_durable import (AsyncClient, AsyncWorker, Client, Context, Instance, Outcome, Settled, Worker, done,
                         next_step, retry, wait_signal)


def place_order(client: Client) -> Optional[str]:
    order: Optional[int] = client.insert("checkout", {"sku": "tea"}, correlation_key="order-1001")
    assert order is not None
    delivered: Optional[bool] = client.signal("order-1001", "payment_confirmed", {"amount": 12.5},
                                              dedup_key="psp-evt-981")
    settled: Settled = client.wait(order, timeout=10, until="terminal")
    row: Optional[Instance] = client.get(order)
    ids: List[int] = client.insert_all("checkout", [{"state": {"sku": "tea"}}])
    # Repairs, as the FSM's owner: back to a step, a new instance from a history entry, another version.
    rewound: bool = client.rewind(order, "charge", {"sku": "tea", "amount": 12.5})
    copy: int = client.fork(order, 2)
    moved: int = client.migrate("checkout", 1, 2, {"receipt": "invoice"})
    print(delivered, row, ids, rewound, copy, moved)
    return settled.status


def charge(state: Dict[str, Any], ctx: Context) -> Outcome:
    if ctx.cancelled.is_set():
        return retry("cancelled")
    key: str = ctx.idempotency_key
    ctx.connection.execute("INSERT INTO shop.payments VALUES (%s, %s)", [ctx.id, key])
    if state.get("wait"):
        return wait_signal(["payment_confirmed"], timeout=60, then_step="receipt")
    return next_step("receipt", {**state, "payment_ref": key}) if ctx.attempt < 5 else done({"paid": False})


def serve() -> None:
    worker = Worker("dbname=app", queues=["payments"], concurrency=4, wait=5)
    worker.step("checkout", "charge")(charge)
    worker.run()


async def serve_async() -> Optional[str]:
    client = await AsyncClient.connect("dbname=app")
    order = await client.insert("checkout", {"sku": "tea"})
    assert order is not None
    settled: Settled = await client.wait(order)
    worker = AsyncWorker("dbname=app", {("checkout", "charge"): charge})
    await asyncio.wait_for(worker.run(), 1)
    return settled.status
