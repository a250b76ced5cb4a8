"""api_schema: the API's functions in the schema given, nothing looked up, as
on a PL/Proxy router (sharding/README.md), which has no extension.  Here a
database without gen_durable, with stubs of gd_insert (the extension's
signature, returning 42) and gd_claim (recording its calls) in a schema
whose name needs quoting."""

import asyncio
import time
import unittest
import uuid

import psycopg
from psycopg.conninfo import make_conninfo

from gen_durable import AsyncClient, Client, Worker, done
from support import DSN, admin, running

SCHEMA = "Router API"
STUBS = """
CREATE SCHEMA "Router API";
CREATE TABLE "Router API".claims (queue text, fsms text[]);
CREATE FUNCTION "Router API".gd_insert({arguments}) RETURNS {result} LANGUAGE sql AS 'SELECT 42';
CREATE FUNCTION "Router API".gd_claim(queue text, worker text, max int, lease interval, fsms text[], wait interval)
RETURNS TABLE (id bigint, fsm text, version int, step text, state jsonb, ctx jsonb, lease_token bigint)
LANGUAGE plpgsql AS 'BEGIN INSERT INTO "Router API".claims VALUES (queue, fsms); END';
"""


class ApiSchemaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.database = f"router_{uuid.uuid4().hex[:8]}"
        cls.dsn = make_conninfo(DSN, dbname=cls.database)
        with admin() as db:
            signature = db.execute("SELECT pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)"
                                   "  FROM pg_proc p JOIN pg_extension e ON e.extnamespace = p.pronamespace"
                                   " WHERE e.extname = 'gen_durable' AND p.proname = 'gd_insert'").fetchone()
            db.execute(f"CREATE DATABASE {cls.database}")
        with psycopg.connect(cls.dsn, autocommit=True) as router:
            router.execute(STUBS.format(arguments=signature[0], result=signature[1]))

    @classmethod
    def tearDownClass(cls):
        with admin() as db:
            db.execute(f"DROP DATABASE {cls.database} WITH (FORCE)")

    def test_the_clients_call_the_schema_given_and_look_up_nothing(self):
        with Client(self.dsn, api_schema=SCHEMA) as client:
            self.assertEqual(client.insert("order", {"sku": "tea"}, correlation_key="k"), 42)
        with Client(self.dsn) as client, self.assertRaises(psycopg.errors.UndefinedObject) as raised:
            client.insert("order")
        self.assertIn("extension gen_durable is not installed", str(raised.exception))
        with self.assertRaises(ValueError):
            Client(self.dsn, api_schema="")

        async def asyncio_clients():
            async with await AsyncClient.connect(self.dsn, api_schema=SCHEMA) as client:
                self.assertEqual(await client.insert("order"), 42)
            async with await AsyncClient.connect(self.dsn) as client:
                with self.assertRaises(psycopg.errors.UndefinedObject):
                    await client.insert("order")
        asyncio.run(asyncio_clients())

    def test_the_worker_claims_in_the_schema_given(self):
        worker = Worker(self.dsn, {("order", "pack"): lambda state, ctx: done()}, queues=["shop"],
                        api_schema=SCHEMA, wait=0.1, name="stub")
        with running(worker), psycopg.connect(self.dsn, autocommit=True) as router:
            for _ in range(200):
                claims = router.execute('SELECT queue, fsms FROM "Router API".claims').fetchall()
                if claims:
                    break
                time.sleep(0.05)
        self.assertEqual(claims[0], ("shop", ["order"]))


if __name__ == "__main__":
    unittest.main()
