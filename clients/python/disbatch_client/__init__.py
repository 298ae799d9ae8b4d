"""Enqueue Disbatch tasks from Python: over the REST API, or inside the app's MongoDB transaction."""

from .errors import ApiError, DisbatchError, DuplicateTask, QueueNotFound, TimedOut
from .rest import Batch, Client, Duplicate, EnqueueResult, Graph, GraphTask, NewTask, Task
from .status import FINAL, is_final

__all__ = [
    "ApiError",
    "Batch",
    "Client",
    "DisbatchError",
    "Duplicate",
    "DuplicateTask",
    "EnqueueResult",
    "FINAL",
    "Graph",
    "GraphTask",
    "NewTask",
    "QueueNotFound",
    "Task",
    "TimedOut",
    "enqueue_in",
    "is_final",
]


def enqueue_in(*args, **kwargs):  # type: ignore[no-untyped-def]
    """`disbatch_client.direct.enqueue_in`, imported on first use so the REST client needs no pymongo."""
    from .direct import enqueue_in as direct

    return direct(*args, **kwargs)
