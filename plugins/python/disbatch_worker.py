"""The worker side of the Disbatch persistent-worker protocol (plugins/PROTOCOL.md), in one
file and the standard library only.

A plugin started with DISBATCH_WORKER_PROTOCOL=1 serves one task at a time over JSON lines
on descriptor 3; what it prints to stdout and stderr is the task's output:

    import disbatch_worker

    def handle(task):
        print("hello", task.params)
        return {"output": {"seen": True}}   # what a process plugin writes to DISBATCH_RESULT

    disbatch_worker.run(handle)

The handler returns None (succeeded), a dict (the result object: status, retry/delay,
output for chaining, ...) or a Done(exit, result); an exception fails the task (exit 1, the
traceback on the task's stderr) and the worker goes on. While a task runs, its DISBATCH_*
facts are also in os.environ, as a process plugin has them.
"""

import json
import os
import socket
import sys
import traceback

PROTOCOL = 1
PROTOCOL_ENV = "DISBATCH_WORKER_PROTOCOL"
CHANNEL_FD = 3
MAX_LINE = 32 << 20
PROTOCOL_ERROR_EXIT = 2


def requested():
    """Whether the supervisor asked for worker mode."""
    return PROTOCOL_ENV in os.environ


class ProtocolError(Exception):
    """The supervisor sent something this version does not understand."""


class Task:
    """One task: `doc` is the task document a process plugin reads on stdin, `env` its
    DISBATCH_* facts, `attempt` this run's id (the fencing token)."""

    def __init__(self, doc, env, attempt):
        self.doc = doc
        self.env = env
        self.attempt = attempt

    @property
    def params(self):
        return self.doc.get("params")

    @property
    def attempts(self):
        n = self.doc.get("attempts")
        return n if isinstance(n, int) else 0


class Done:
    """An explicit ending: `exit` as a process plugin's exit code, `result` its result file."""

    def __init__(self, exit=0, result=None):
        self.exit = exit
        self.result = result


def _parse(line):
    """One line from the supervisor: a Task, or None for stop."""
    if not line.endswith(b"\n"):
        if len(line) >= MAX_LINE:
            raise ProtocolError("a line is longer than %d bytes" % MAX_LINE)
        raise ProtocolError("the channel closed in the middle of a line")
    try:
        msg = json.loads(line)
    except ValueError as e:
        raise ProtocolError("a message is not valid JSON (%s)" % e)
    if not isinstance(msg, dict):
        raise ProtocolError("a message must be a JSON object")
    kind = msg.get("type")
    if kind == "stop":
        return None
    if kind != "task":
        if isinstance(kind, str):
            raise ProtocolError("unknown message type %r" % kind)
        raise ProtocolError("a message needs a string `type`")
    doc, env, attempt = msg.get("task"), msg.get("env"), msg.get("attempt")
    if not isinstance(doc, dict):
        raise ProtocolError("`task` must be the task document, an object")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ProtocolError("`env` must be an object of strings")
    if not isinstance(attempt, str):
        raise ProtocolError("`attempt` must be a string")
    return Task(doc, env, attempt)


def _send(writer, msg):
    writer.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
    writer.flush()


def _call(handler, task):
    """Runs one task with its facts in os.environ; returns (exit, result)."""
    saved = {k: os.environ.get(k) for k in task.env}
    os.environ.update(task.env)
    try:
        got = handler(task)
    except Exception:
        traceback.print_exc()
        return 1, None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if isinstance(got, Done):
        return got.exit, got.result
    return 0, got


def serve(reader, writer, handler):
    """The protocol loop on binary file objects (in-memory in tests). Returns on stop or end
    of input; raises ProtocolError after reporting it on the channel."""
    _send(writer, {"type": "ready", "protocol": PROTOCOL, "pid": os.getpid()})
    while True:
        line = reader.readline(MAX_LINE)
        if not line:
            return
        try:
            task = _parse(line)
        except ProtocolError as e:
            try:
                _send(writer, {"type": "error", "message": str(e)})
            except OSError:
                pass
            raise
        if task is None:
            return
        exit_code, result = _call(handler, task)
        # What the task printed is in its output before the supervisor learns it is done.
        sys.stdout.flush()
        sys.stderr.flush()
        _send(writer, {"type": "done", "attempt": task.attempt, "exit": exit_code, "result": result})


def run(handler):
    """Runs as a persistent worker on descriptor 3 until told to stop, then exits: 0 on stop
    or end of input, 2 on a protocol error (the reason on stderr)."""
    asked = os.environ.get(PROTOCOL_ENV, "")
    try:
        if asked.strip() != str(PROTOCOL):
            raise ProtocolError("%s=%r is not a version this worker speaks (%d)" % (PROTOCOL_ENV, asked, PROTOCOL))
        try:
            os.set_inheritable(CHANNEL_FD, False)
        except OSError:
            raise ProtocolError("%s is set but descriptor %d is not open" % (PROTOCOL_ENV, CHANNEL_FD))
        channel = socket.socket(fileno=CHANNEL_FD)
        reader = channel.makefile("rb")
        writer = channel.makefile("wb")
        serve(reader, writer, handler)
    except (ProtocolError, OSError) as e:
        sys.stderr.write("disbatch worker: %s\n" % e)
        sys.exit(PROTOCOL_ERROR_EXIT)
    sys.exit(0)
