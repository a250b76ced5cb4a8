"""Name squatting: a role that may create schemas makes one named after the
worker's role, with functions named as the API's, a to_jsonb(gd.context) and
an unnest(jsonb[]) (exact type matches beat pg_catalog's polymorphic ones).
On the default search_path ("$user", public) they come first; the clients
name every function with its schema, so none of them ever runs."""

import asyncio
import time

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from gen_durable import AsyncClient, AsyncWorker, Client, Worker, done, next_step, wait_signal
from support import DSN, ServerTest, running

# Run by the squatter in the schema it made (VICTIM): a copy of every API
# function and of the built-ins the clients call, each recording that it ran.
SQUAT = """
GRANT USAGE ON SCHEMA VICTIM TO VICTIM;
CREATE TABLE VICTIM.ran (function text);
GRANT INSERT ON VICTIM.ran TO VICTIM;
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT p.proname AS name, pg_get_function_arguments(p.oid) AS arguments,
                    pg_get_function_result(p.oid) AS result, p.proretset AS set
               FROM pg_proc p JOIN pg_extension e ON e.extnamespace = p.pronamespace
              WHERE e.extname = 'gen_durable' AND p.proname LIKE 'gd\\_%'
             UNION ALL VALUES ('to_jsonb', 'gd.context', 'jsonb', false), ('unnest', 'jsonb[]', 'SETOF jsonb', true),
                              ('unnest', 'text[]', 'SETOF text', true)
    LOOP
        EXECUTE format('CREATE FUNCTION VICTIM.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L', f.name, f.arguments,
                       f.result, format('BEGIN INSERT INTO VICTIM.ran VALUES (%L); RETURN%s; END', f.name,
                                        CASE WHEN f.set OR f.result = 'void' THEN '' ELSE ' NULL' END));
    END LOOP;
END $$"""


class SquatTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.victim, squatter = self.name("alice"), self.name("mallory")
        self.dsn = make_conninfo(DSN, user=self.victim)
        for role in (self.victim, squatter):
            self.db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            self.db.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(self.db.info.dbname), sql.Identifier(role)))
        self.addCleanup(self.db.execute, f"DROP ROLE {self.victim}, {squatter}")
        self.addCleanup(self.db.execute, f"DROP OWNED BY {self.victim}, {squatter}")
        with psycopg.connect(make_conninfo(DSN, user=squatter), autocommit=True) as connection:
            connection.execute(f"CREATE SCHEMA {self.victim}")
            connection.execute(SQUAT.replace("VICTIM", self.victim))
        # The squat works on what names no schema.
        with psycopg.connect(self.dsn, autocommit=True) as connection:
            connection.execute("SELECT gd_heartbeat(0, 0), to_jsonb(NULL::gd.context)")
        self.assertEqual(self.squatted(), ["gd_heartbeat", "to_jsonb"])
        self.db.execute(f"TRUNCATE {self.victim}.ran")
        # An FSM of the superuser's, granted to the victim: a (external) -> b (external).
        self.fsm = self.name("sq")
        self.define(self.fsm, "a", {"a": None, "b": {"max_attempts": 1}})
        self.db.execute("SELECT gd_grant(%s, %s)", [self.fsm, self.victim])
        self.addCleanup(self.db.execute, "SELECT gd_revoke(%s, %s)", [self.fsm, self.victim])

    def squatted(self):
        return [r[0] for r in self.db.execute(f"SELECT function FROM {self.victim}.ran ORDER BY 1")]

    def test_the_client_and_the_worker_call_none_of_them(self):
        def a(state, ctx):
            return wait_signal(["go"], then_step="b") if state.get("wait") else next_step("b")

        def b(state, ctx):
            time.sleep(0.4)   # past a heartbeat
            # A step to nowhere: gd_complete_all refuses the batch, gd_complete each claim.
            return next_step("nowhere") if state.get("bad") else done()

        key = self.name("key")
        worker = Worker(self.dsn, {(self.fsm, "a"): a, (self.fsm, "b"): b}, name=self.name("w"), lease=1, wait=0.5)
        with Client(self.dsn) as client:
            waiting = client.insert(self.fsm, {"wait": True}, correlation_key=key)
            ids = client.insert_all(self.fsm, [{}, {"state": {"bad": True}}])
            later = client.insert(self.fsm, schedule_in=3600)
            with running(worker):
                self.assertEqual(client.wait(waiting, timeout=10).status, "awaiting")
                self.assertTrue(client.signal(key, "go"))
                ends = [client.wait(i, timeout=10, until="terminal").status for i in [waiting, *ids]]
            self.assertEqual(ends, ["done", "done", "failed"])
            self.assertTrue(client.retry(ids[1]))
            self.assertTrue(client.cancel(later))
            self.assertEqual(client.drain(self.queue), 0)
            self.assertEqual(client.get(later).status, "cancelled")
        self.assertEqual(worker.queues, [self.queue])
        self.assertEqual(self.squatted(), [])

    def test_the_asyncio_client_and_worker_call_none_of_them(self):
        asyncio.run(self.asyncio_client_and_worker())

    async def asyncio_client_and_worker(self):
        async def step(state, ctx):
            await asyncio.sleep(0.4)   # past a heartbeat
            return next_step("b") if ctx.step == "a" else done()

        worker = AsyncWorker(self.dsn, {(self.fsm, "a"): step, (self.fsm, "b"): step}, name=self.name("w"),
                             lease=1, wait=0.5)
        async with await AsyncClient.connect(self.dsn) as client:
            ids = [await client.insert(self.fsm), *await client.insert_all(self.fsm, [{}, {}])]
            task = asyncio.create_task(worker.run(install_signal_handlers=False))
            ends = [(await client.wait(i, timeout=10, until="terminal")).status for i in ids]
            worker.stop()
            await asyncio.wait_for(task, 30)
            self.assertEqual(ends, ["done"] * 3)
            self.assertFalse(await client.signal(ids[0], "late", missing_ok=True))
        self.assertEqual(self.squatted(), [])
