#!/usr/bin/env python3
"""hello: a Disbatch plugin in Python, standard library only.

The task document arrives on stdin as JSON; params.name is the name to greet.
"""

import json
import os
import re
import sys

task = json.load(sys.stdin)
name = task["params"].get("name")

if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9 ._-]{1,64}", name):
    print("hello: params.name must be 1 to 64 letters, digits, spaces, '.', '_' or '-'",
          file=sys.stderr)
    sys.exit(3)

print(f"Hello, {name}!")
print(f"warning: an example greeting for task {os.environ['DISBATCH_TASK_ID']}",
      file=sys.stderr)

# Optional: a result for the attempt record (and for chaining, when the queue has `then`).
with open(os.environ["DISBATCH_RESULT"], "w") as result:
    json.dump({"output": {"greeted": name}}, result)
