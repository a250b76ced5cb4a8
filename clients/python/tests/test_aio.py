"""AsyncClient and AsyncWorker: the same calls and behaviour, on asyncio."""

import asyncio
import unittest

import psycopg

from gen_durable import AsyncClient, AsyncWorker, done, next_step
from support import DSN, ServerTest


class AsyncTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.fsm = self.name("async")
        self.define(self.fsm, "fetch", {"fetch": None, "store": {"max_attempts": 2}})
        self.db.execute(f"CREATE TABLE stored_{self.tag} (instance bigint, attempt int)")
        self.addCleanup(self.db.execute, f"DROP TABLE stored_{self.tag}")

    def test_client_and_worker(self):
        asyncio.run(self.client_and_worker())

    async def client_and_worker(self):
        async with await AsyncClient.connect(DSN) as client:
            ids = await client.insert_all(self.fsm, [{"state": {"n": n}} for n in range(10)])
            worker = AsyncWorker(DSN, name=self.name("w"), concurrency=2, batch=3, wait=0.5)
            in_transaction = []

            @worker.step(self.fsm, "fetch")
            async def fetch(state, ctx):
                await asyncio.sleep(0.01)   # a call over the network, in no transaction
                in_transaction.append(self.db.execute(   # the lane's session, as the server sees it
                    "SELECT state LIKE 'idle in transaction%%' OR backend_xid IS NOT NULL FROM pg_stat_activity"
                    " WHERE pid = %s", [ctx.connection.info.backend_pid]).fetchone()[0])
                return next_step("store", {**state, "fetched": True})

            @worker.step(self.fsm, "store")
            async def store(state, ctx):
                insert = f"INSERT INTO stored_{self.tag} VALUES (%s, %s)"
                if state["n"] % 2:   # the step's transaction begun by a cursor's statement, or a savepoint
                    async with ctx.connection.cursor() as cursor:
                        await cursor.execute(insert, [ctx.id, ctx.attempt])
                else:
                    async with ctx.connection.transaction():
                        await ctx.connection.execute(insert, [ctx.id, ctx.attempt])
                if state["n"] == 0 and ctx.attempt == 1:
                    raise RuntimeError("a transient failure")
                return done({"n": state["n"]})

            task = asyncio.create_task(worker.run(install_signal_handlers=False))
            settled = [await client.wait(i, timeout=20, until="terminal") for i in ids]
            worker.stop()
            await asyncio.wait_for(task, 30)
            self.assertEqual([s.status for s in settled], ["done"] * 10)
            self.assertEqual(sorted(s.result["n"] for s in settled), list(range(10)))
            self.assertEqual(worker.queues, [self.queue])   # found from the definitions
            self.assertEqual(in_transaction, [False] * 10)
            # The failed attempt's write was undone with its transaction.
            rows = self.db.execute(f"SELECT count(*), count(*) FILTER (WHERE attempt = 2) FROM stored_{self.tag}"
                                   ).fetchone()
            self.assertEqual(rows, (10, 1))
            self.assertIsNone(await client.signal(ids[0], "late", missing_ok=True))
            with self.assertRaises(psycopg.errors.UndefinedObject):
                await client.insert(self.name("nope"))


if __name__ == "__main__":
    unittest.main()
