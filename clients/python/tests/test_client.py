"""The Python client against a real DCI, DEN and database, set up by tests/tests/api/clients.rs.

The Rust test starts the fleet (queues `work`, which runs and writes `{"task": id}` as its
output; `hold` and `uq`, unique on `params.id`, with no threads) and passes it in
DISBATCH_TEST_DCI, DISBATCH_TEST_MONGODB_URI and DISBATCH_TEST_DATABASE.
"""

import os
import unittest
from datetime import timedelta

from pymongo import MongoClient

from disbatch_client import ApiError, Client, DuplicateTask, GraphTask, NewTask, enqueue_in
from disbatch_client.direct import server_now

WAIT_S = 90.0 * float(os.environ.get("DISBATCH_TEST_SLOWDOWN", "1"))


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run this suite through tests/tests/api/clients.rs")
    return value


class Fleet(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.client = Client(env("DISBATCH_TEST_DCI"))
        cls.mongo = MongoClient(env("DISBATCH_TEST_MONGODB_URI"))
        cls.db = cls.mongo[env("DISBATCH_TEST_DATABASE")]

    @classmethod
    def tearDownClass(cls) -> None:
        cls.mongo.close()


class Rest(Fleet):
    def test_enqueue_wait_and_result(self) -> None:
        task_id = self.client.enqueue("work", {"n": 1})
        task = self.client.wait(task_id, WAIT_S, poll_s=0.1)
        self.assertTrue(task.succeeded, task.raw)
        self.assertEqual(self.client.result(task_id), {"task": task_id})

    def test_delay_and_priority_are_stored_on_the_servers_clock(self) -> None:
        before = server_now(self.db)
        task_id = self.client.enqueue("hold", {"n": 2}, delay_s=3600, priority=7)
        from bson import ObjectId

        stored = self.db.tasks.find_one({"_id": ObjectId(task_id)})
        self.assertEqual(stored["priority"], 7)
        # The DCI reads the fleet's clock as an estimate of the server's: a second's leeway.
        self.assertGreaterEqual(stored["not_before"], before + timedelta(seconds=3599))

    def test_unique_duplicates(self) -> None:
        made = self.client.enqueue_many("uq", [{"id": "r1"}, NewTask({"id": "r1"}), {"id": "r2"}])
        self.assertEqual(made.created, 2)
        self.assertEqual(len(made.duplicates), 1)
        self.assertEqual(made.duplicates[0].index, 1)
        self.assertEqual(made.duplicates[0].matched, made.ids[0])
        with self.assertRaises(DuplicateTask) as caught:
            self.client.enqueue("uq", {"id": "r1"})
        self.assertEqual(caught.exception.matched, made.ids[0])

    def test_refusals_are_errors(self) -> None:
        with self.assertRaises(ApiError) as caught:
            self.client.enqueue("nope", {})
        self.assertEqual(caught.exception.status, 400)
        self.assertIn("queue", caught.exception.message)
        with self.assertRaises(ValueError):
            self.client.enqueue("work", {}, delay_s=1, not_before=server_now(self.db))

    def test_graph_and_batch(self) -> None:
        graph = self.client.create_graph(
            [GraphTask("a", "work"), GraphTask("b", "work", depends_on=["a"])]
        )
        self.assertTrue(self.client.wait(graph.ids["b"], WAIT_S, poll_s=0.1).succeeded)
        self.assertTrue(self.client.task(graph.ids["a"]).succeeded)
        batch = self.client.create_batch([("work", {"m": 1}), ("work", {"m": 2})], callback=("work", {}))
        self.assertEqual(len(batch.ids), 2)
        self.assertIsNotNone(batch.callback)
        self.assertTrue(self.client.wait(batch.callback or "", WAIT_S, poll_s=0.1).succeeded)


class Direct(Fleet):
    def test_a_transaction_that_aborts_leaves_no_task(self) -> None:
        with self.mongo.start_session() as s:
            s.start_transaction()
            task_id = enqueue_in(self.db, "work", {"tx": "abort"}, session=s)
            s.abort_transaction()
        self.assertIsNone(self.db.tasks.find_one({"_id": task_id}))

    def test_a_transaction_that_commits_runs(self) -> None:
        with self.mongo.start_session() as s:
            s.start_transaction()
            task_id = enqueue_in(self.db, "work", {"tx": "commit"}, session=s)
            self.assertIsNone(self.db.tasks.find_one({"_id": task_id}), "not seen before the commit")
            s.commit_transaction()
        task = self.client.wait(str(task_id), WAIT_S, poll_s=0.1)
        self.assertTrue(task.succeeded, task.raw)
        self.assertEqual(self.client.result(str(task_id)), {"task": str(task_id)})

    def test_a_unique_duplicate_raises_and_the_caller_aborts(self) -> None:
        held = self.client.enqueue("uq", {"id": "d1"})
        with self.mongo.start_session() as s:
            s.start_transaction()
            with self.assertRaises(DuplicateTask) as caught:
                enqueue_in(self.db, "uq", {"id": "d1"}, session=s)
            s.abort_transaction()
        self.assertEqual(caught.exception.matched, held)
        self.assertEqual(self.db.tasks.count_documents({"params.id": "d1"}), 1)
        # A directly inserted unique task holds its key for the API too.
        with self.mongo.start_session() as s:
            s.start_transaction()
            direct = enqueue_in(self.db, "uq", {"id": "d2"}, session=s)
            s.commit_transaction()
        with self.assertRaises(DuplicateTask) as caught:
            self.client.enqueue("uq", {"id": "d2"})
        self.assertEqual(caught.exception.matched, str(direct))

    def test_a_direct_task_is_the_apis_field_by_field(self) -> None:
        from bson import ObjectId

        for queue, params in (("hold", {"same": 1}), ("uq", {"id": "c1"})):
            api_id = self.client.enqueue(queue, params, delay_s=60, priority=3)
            api = self.db.tasks.find_one({"_id": ObjectId(api_id)})
            self.db.tasks.delete_one({"_id": api["_id"]})
            with self.mongo.start_session() as s:
                s.start_transaction()
                direct_id = enqueue_in(self.db, queue, params, session=s, delay_s=60, priority=3)
                s.commit_transaction()
            direct = self.db.tasks.find_one({"_id": direct_id})
            self.assertEqual(list(direct.keys()), list(api.keys()))
            for field in ("_id", "ctime", "mtime", "not_before"):
                api.pop(field)
                direct.pop(field)
            self.assertEqual(direct, api)
            # The same BSON types, not only equal values (Int64 priority, Int32 status).
            self.assertEqual(
                {k: type(v) for k, v in direct.items()}, {k: type(v) for k, v in api.items()}
            )

    def test_an_unknown_queue_is_refused(self) -> None:
        from disbatch_client import QueueNotFound

        with self.assertRaises(QueueNotFound):
            enqueue_in(self.db, "nope", {})
        with self.assertRaises(TypeError):
            enqueue_in(self.db, "work", [1])  # type: ignore[arg-type]


if __name__ == "__main__":
    unittest.main()
