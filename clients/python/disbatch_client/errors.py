"""The errors the client raises."""

from __future__ import annotations

from typing import Optional


class DisbatchError(Exception):
    """Any error of this package."""


class ApiError(DisbatchError):
    """The DCI answered with an error status; `message` is its `error` text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class DuplicateTask(DisbatchError):
    """The queue has `unique` and a task holding the same key exists (`matched`, when known)."""

    def __init__(self, queue: str, matched: Optional[str], detail: str = "") -> None:
        what = f"task {matched}" if matched else "another task"
        super().__init__(
            f"queue {queue!r} is unique and {what} already holds this key"
            + (f" ({detail})" if detail else "")
        )
        self.queue = queue
        self.matched = matched


class QueueNotFound(DisbatchError):
    """No queue has the name (or id) given."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"no queue named {queue!r}")
        self.queue = queue


class TimedOut(DisbatchError):
    """`wait` gave up before the task ended; `task` is the last state read."""

    def __init__(self, task_id: str, status: Optional[int]) -> None:
        super().__init__(f"task {task_id} did not end in time (status {status})")
        self.task_id = task_id
        self.status = status
