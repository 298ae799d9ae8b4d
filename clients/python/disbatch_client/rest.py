"""The REST client: tasks, graphs and batches through the DCI's API, with the standard library's urllib."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import ApiError, DisbatchError, DuplicateTask, TimedOut
from .status import is_final

Params = Mapping[str, Any]


@dataclass
class NewTask:
    """One task of `enqueue_many`: its params and, optionally, when and in which rank it may run."""

    params: Params = field(default_factory=dict)
    delay_s: Optional[float] = None
    not_before: Optional[datetime] = None
    priority: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"params": dict(self.params)}
        out.update(_timing(self.delay_s, self.not_before, self.priority))
        return out


@dataclass
class Duplicate:
    """Input `index` of a unique queue duplicates the live task `matched`."""

    index: int
    matched: str


@dataclass
class EnqueueResult:
    """Per input its task's id (the matched task's for a duplicate), and which inputs were duplicates."""

    ids: List[str]
    created: int
    duplicates: List[Duplicate]


@dataclass
class GraphTask:
    """A task of a graph: named, so others can depend on it."""

    name: str
    queue: str
    params: Params = field(default_factory=dict)
    depends_on: Sequence[str] = ()
    on_dependency_failure: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"name": self.name, "queue": self.queue, "params": dict(self.params)}
        if self.depends_on:
            out["depends_on"] = list(self.depends_on)
        if self.on_dependency_failure is not None:
            out["on_dependency_failure"] = self.on_dependency_failure
        return out


@dataclass
class Graph:
    id: str
    ids: Dict[str, str]


@dataclass
class Batch:
    id: str
    ids: List[str]
    callback: Optional[str]


@dataclass
class Task:
    """A task as `GET /tasks/:id` answers it; `raw` is the whole answer."""

    id: str
    status: Optional[int]
    raw: Dict[str, Any]

    @property
    def final(self) -> bool:
        return is_final(self.status)

    @property
    def succeeded(self) -> bool:
        return self.status == 1

    @property
    def discarded(self) -> bool:
        return self.raw.get("discarded_at") is not None


def _timing(
    delay_s: Optional[float], not_before: Optional[datetime], priority: Optional[int]
) -> Dict[str, Any]:
    if delay_s is not None and not_before is not None:
        raise ValueError("give delay_s or not_before, not both: each says when the task may first run")
    out: Dict[str, Any] = {}
    if delay_s is not None:
        out["delay_s"] = delay_s
    if not_before is not None:
        out["not_before"] = iso_utc(not_before)
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an integer, not {priority!r}")
        out["priority"] = priority
    return out


def iso_utc(t: datetime) -> str:
    """A time as the API reads it; a naive datetime is taken as UTC, as the API does."""
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc).replace(tzinfo=None)
    return t.isoformat(timespec="milliseconds") + "Z"


def _oid(v: Any) -> Optional[str]:
    """An id as hex, from `"hex"` or extended JSON `{"$oid": "hex"}`."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("$oid"), str):
        return v["$oid"]
    return None


def _int(v: Any) -> Optional[int]:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        for k in ("$numberInt", "$numberLong"):
            if isinstance(v.get(k), str):
                try:
                    return int(v[k])
                except ValueError:
                    return None
    return None


class Client:
    """A DCI's REST API at `url` (e.g. `http://127.0.0.1:8080`), with a bearer `token` when `web.tokens` is set."""

    def __init__(self, url: str, token: Optional[str] = None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: Any = None) -> Tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                status, text = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            raise DisbatchError(f"{method} {self.url}{path}: {e}") from e
        try:
            answer = json.loads(text) if text else None
        except ValueError:
            answer = text.decode(errors="replace")
        if status >= 400:
            message = answer.get("error") if isinstance(answer, dict) else None
            raise ApiError(status, str(message if message is not None else answer))
        return status, answer

    def enqueue(
        self,
        queue: str,
        params: Params,
        *,
        delay_s: Optional[float] = None,
        not_before: Optional[datetime] = None,
        priority: Optional[int] = None,
    ) -> str:
        """Creates one task and returns its id; raises DuplicateTask when a unique queue has a live task with its key."""
        made = self.enqueue_many(
            queue, [NewTask(params, delay_s=delay_s, not_before=not_before, priority=priority)]
        )
        if made.duplicates:
            raise DuplicateTask(queue, made.duplicates[0].matched)
        return made.ids[0]

    def enqueue_many(
        self, queue: str, tasks: Sequence[Union[NewTask, Params]]
    ) -> EnqueueResult:
        """Creates tasks in one request; duplicates of a unique queue are reported, not raised."""
        items = [t.to_json() if isinstance(t, NewTask) else NewTask(t).to_json() for t in tasks]
        if not items:
            raise ValueError("enqueue_many needs at least one task")
        _, answer = self._request(
            "POST", "/tasks", {"queue": queue, "tasks": items, "answer": "ids"}
        )
        if not isinstance(answer, dict) or not isinstance(answer.get("ids"), list):
            raise DisbatchError(f"unexpected answer to POST /tasks: {answer!r}")
        ids = [_oid(i) or "" for i in answer["ids"]]
        dups = [
            Duplicate(int(d.get("index", -1)), _oid(d.get("matched")) or "")
            for d in answer.get("duplicates") or []
            if isinstance(d, dict)
        ]
        created = _int(answer.get("created"))
        return EnqueueResult(ids, created if created is not None else len(ids) - len(dups), dups)

    def create_graph(self, tasks: Sequence[Union[GraphTask, Mapping[str, Any]]]) -> Graph:
        """Stores a graph all or nothing; its tasks start as their dependencies end."""
        body = {"tasks": [t.to_json() if isinstance(t, GraphTask) else dict(t) for t in tasks]}
        _, answer = self._request("POST", "/graphs", body)
        if not isinstance(answer, dict):
            raise DisbatchError(f"unexpected answer to POST /graphs: {answer!r}")
        ids = {str(k): _oid(v) or "" for k, v in (answer.get("ids") or {}).items()}
        return Graph(_oid(answer.get("graph")) or "", ids)

    def create_batch(
        self,
        tasks: Sequence[Tuple[str, Params]],
        callback: Optional[Tuple[str, Params]] = None,
    ) -> Batch:
        """Stores a batch of (queue, params) members and an optional callback run once they all end."""
        body: Dict[str, Any] = {"tasks": [{"queue": q, "params": dict(p)} for q, p in tasks]}
        if callback is not None:
            body["callback"] = {"queue": callback[0], "params": dict(callback[1])}
        _, answer = self._request("POST", "/batches", body)
        if not isinstance(answer, dict):
            raise DisbatchError(f"unexpected answer to POST /batches: {answer!r}")
        return Batch(
            _oid(answer.get("batch")) or "",
            [_oid(i) or "" for i in answer.get("ids") or []],
            _oid(answer.get("callback")),
        )

    def task(self, task_id: str) -> Task:
        """The task as stored now."""
        _, answer = self._request("GET", f"/tasks/{urllib.parse.quote(task_id)}")
        if not isinstance(answer, dict):
            raise DisbatchError(f"unexpected answer to GET /tasks/{task_id}: {answer!r}")
        return Task(_oid(answer.get("_id")) or task_id, _int(answer.get("status")), answer)

    def wait(self, task_id: str, timeout: float, poll_s: float = 0.5) -> Task:
        """Polls until the task has ended and returns it; raises TimedOut after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            t = self.task(task_id)
            if t.final:
                return t
            if time.monotonic() >= deadline:
                raise TimedOut(task_id, t.status)
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    def result(self, task_id: str) -> Any:
        """The output of the task's last successful attempt (ApiError 404 when there is none)."""
        _, answer = self._request("GET", f"/tasks/{urllib.parse.quote(task_id)}/result")
        return answer
