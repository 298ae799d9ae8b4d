"""The direct path: a task inserted into Disbatch's database by the app, inside its own MongoDB session."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from bson import ObjectId
from bson.int64 import Int64
from pymongo import ASCENDING, DESCENDING
from pymongo.client_session import ClientSession
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError

from .errors import DisbatchError, DuplicateTask, QueueNotFound
from .status import QUEUED, STATE_NAMES

# Names as in core/store/src/schema.rs; the document is the one core/store/src/tasks.rs
# (create_labelled) writes for a new task, which tests compare field by field.
QUEUES = "queues"
TASKS = "tasks"
UNIQUE_INDEX = "queue_1_unique_key_1_unique_gen_1"


def enqueue_in(
    db: Database,
    queue: Union[str, ObjectId],
    params: Mapping[str, Any],
    *,
    session: Optional[ClientSession] = None,
    delay_s: Optional[float] = None,
    not_before: Optional[datetime] = None,
    priority: Optional[int] = None,
) -> ObjectId:
    """Inserts one queued task into `db` (Disbatch's database) within `session`, and returns its id.

    Inside a transaction the task exists only once it commits, and not at all if it aborts.
    A unique queue's duplicate raises DuplicateTask (a duplicate-key error aborts the
    server's transaction, so the caller's transaction must then be aborted too).
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping (a task's params object), not {type(params).__name__}")
    if delay_s is not None and not_before is not None:
        raise ValueError("give delay_s or not_before, not both: each says when the task may first run")
    if delay_s is not None and (isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) or not 0 <= delay_s <= 100 * 365 * 86400):
        raise ValueError(f"delay_s must be a number of seconds from 0 to a century, not {delay_s!r}")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ValueError(f"priority must be an integer, not {priority!r}")

    queue_doc = _queue(db, queue, session)
    unique = _unique(queue_doc)
    if unique is not None:
        # Before the insert and outside the session: an index can't be built inside a
        # transaction, and without it two unique creators could both insert one key.
        _ensure_unique_index(db)
    now = server_now(db)
    doc: Dict[str, Any] = {
        "_id": ObjectId(),
        "queue": queue_doc["_id"],
        "status": QUEUED,
        "node": None,
        "params": dict(params),
        "ctime": now,
        "mtime": now,
        "stdout": None,
        "stderr": None,
    }
    if delay_s is not None:
        doc["not_before"] = now + timedelta(seconds=delay_s)
    elif not_before is not None:
        doc["not_before"] = not_before
    if priority is not None:
        doc["priority"] = Int64(priority)
    name = str(queue_doc.get("name", queue))
    if unique is not None:
        _place_unique(db, session, name, doc, unique, now)
    try:
        db[TASKS].insert_one(doc, session=session)
    except DuplicateKeyError as e:
        # Another creator wrote this key's generation since it was read: it holds the key.
        raise DuplicateTask(name, None, "the unique index refused the task") from e
    return doc["_id"]


def server_now(db: Database) -> datetime:
    """The database server's clock (`hello`'s `localTime`): the fleet's time, not this host's."""
    reply = db.command("hello")
    t = reply.get("localTime")
    if not isinstance(t, datetime):
        raise DisbatchError("the server's hello answer has no localTime")
    # Millisecond precision, as BSON stores it, so what is stored is what was computed.
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def _queue(db: Database, queue: Union[str, ObjectId], session: Optional[ClientSession]) -> Dict[str, Any]:
    key = {"_id": queue} if isinstance(queue, ObjectId) else {"name": queue}
    found = db[QUEUES].find_one(key, {"_id": 1, "name": 1, "unique": 1}, session=session)
    if found is None:
        raise QueueNotFound(str(queue))
    return found


Unique = Tuple[str, Tuple[int, ...], float]


def _unique(queue_doc: Mapping[str, Any]) -> Optional[Unique]:
    """The queue's `unique` as (key path, holding statuses, for_s), as core/src/limits.rs reads it."""
    u = queue_doc.get("unique")
    if u is None:
        return None
    if not isinstance(u, Mapping) or not isinstance(u.get("key"), str) or not u["key"]:
        raise DisbatchError(f"queue {queue_doc.get('name')!r} has a unique setting this client cannot read: {u!r}")
    names = u.get("states")
    if names is None:
        names = ["queued", "running"]
    states: Tuple[int, ...] = ()
    for n in names:
        if n not in STATE_NAMES:
            raise DisbatchError(f"queue {queue_doc.get('name')!r}: unknown unique state {n!r}")
        states += STATE_NAMES[n]
    for_s = u.get("for_s") or 0
    if isinstance(for_s, bool) or not isinstance(for_s, (int, float)):
        raise DisbatchError(f"queue {queue_doc.get('name')!r}: unique.for_s must be seconds, not {for_s!r}")
    return u["key"], states, float(for_s)


def _key_value(task: Mapping[str, Any], path: str) -> Any:
    at: Any = task
    for name in path.split("."):
        if not isinstance(at, Mapping):
            return None
        at = at.get(name)
        if isinstance(at, list):
            raise ValueError(f"the task's {path} is a list, not one key (the queue's unique.key names it)")
    return at


def _ensure_unique_index(db: Database) -> None:
    if UNIQUE_INDEX in db[TASKS].index_information():
        return
    db[TASKS].create_index(
        [("queue", ASCENDING), ("unique_key", ASCENDING), ("unique_gen", ASCENDING)],
        name=UNIQUE_INDEX,
        unique=True,
        partialFilterExpression={"unique_key": {"$exists": True}},
    )


def _place_unique(
    db: Database,
    session: Optional[ClientSession],
    queue: str,
    doc: Dict[str, Any],
    unique: Unique,
    now: datetime,
) -> None:
    """Stamps `unique_key` and the key's next `unique_gen`, or raises DuplicateTask if the newest holds."""
    path, states, for_s = unique
    value = _key_value(doc, path)
    if value is None:
        return
    doc["unique_key"] = value
    newest = db[TASKS].find_one(
        {"queue": doc["queue"], "unique_key": value},
        {"_id": 1, "status": 1, "ctime": 1, "unique_gen": 1},
        sort=[("unique_gen", DESCENDING)],
        session=session,
    )
    if newest is None:
        doc["unique_gen"] = Int64(0)
        return
    status = newest.get("status")
    held = isinstance(status, (int, float)) and not isinstance(status, bool) and int(status) in states
    ctime = newest.get("ctime")
    if not held and for_s > 0 and isinstance(ctime, datetime):
        ctime = ctime.replace(tzinfo=None) if ctime.tzinfo is None else ctime.astimezone(timezone.utc).replace(tzinfo=None)
        held = (now.replace(tzinfo=None) - ctime).total_seconds() < for_s
    if held:
        raise DuplicateTask(queue, str(newest["_id"]))
    gen = newest.get("unique_gen")
    doc["unique_gen"] = Int64((gen if isinstance(gen, int) and not isinstance(gen, bool) else 0) + 1)
