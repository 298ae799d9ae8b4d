#!/usr/bin/env python3
"""An example Disbatch plugin that runs both ways: as a process plugin (the task on stdin,
the result in $DISBATCH_RESULT) and, started with DISBATCH_WORKER_PROTOCOL=1, as a
persistent worker (plugins/PROTOCOL.md).

It prints the task id and params; `params.fail` fails the task (exit 3), `params.retry`
asks for another attempt after that many seconds, `params.raise` raises (a failed task, the
worker lives on); a succeeded task hands {"echo": params} to the next queue.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import disbatch_worker  # noqa: E402


def handle(task):
    params = task.params or {}
    print(os.environ.get("DISBATCH_TASK_ID"), json.dumps(params, sort_keys=True))
    if params.get("raise"):
        raise RuntimeError("asked to raise")
    if params.get("fail"):
        print("asked to fail", file=sys.stderr)
        return disbatch_worker.Done(exit=3)
    if params.get("retry") is not None:
        return {"retry": True, "delay": params["retry"]}
    return {"output": {"echo": params}}


def main():
    if disbatch_worker.requested():
        disbatch_worker.run(handle)
    doc = json.load(sys.stdin)
    task = disbatch_worker.Task(doc, {}, os.environ.get("DISBATCH_ATTEMPT", ""))
    got = handle(task)
    exit_code, result = (got.exit, got.result) if isinstance(got, disbatch_worker.Done) else (0, got)
    if result is not None and os.environ.get("DISBATCH_RESULT"):
        with open(os.environ["DISBATCH_RESULT"], "w") as f:
            json.dump(result, f)
    sys.exit(exit_code)


if __name__ == "__main__":
    main()
