#!/bin/sh
# hello: a Disbatch plugin in POSIX shell.
# The task document arrives on stdin as JSON; params.name is the name to greet.

task=$(cat)

# Plain sh has no JSON parser: this reads one plain string (no escapes) and is enough for
# this example. With jq installed, use `jq -r '.params.name // empty'` instead.
name=$(printf '%s\n' "$task" |
    sed -n 's/.*"name"[[:space:]]*:[[:space:]]*"\([^"\\]*\)".*/\1/p')

# Refuse anything but 1 to 64 letters, digits, spaces, '.', '_' or '-'.
case $name in
'' | *[!A-Za-z0-9' '._-]*)
    echo "hello: params.name must be 1 to 64 letters, digits, spaces, '.', '_' or '-'" >&2
    exit 3
    ;;
esac
if [ ${#name} -gt 64 ]; then
    echo "hello: params.name must be 1 to 64 letters, digits, spaces, '.', '_' or '-'" >&2
    exit 3
fi

echo "Hello, $name!"
echo "warning: an example greeting for task $DISBATCH_TASK_ID" >&2

# Optional: a result for the attempt record (and for chaining, when the queue has `then`).
# The name holds no character that JSON must escape.
printf '{"output": {"greeted": "%s"}}\n' "$name" >"$DISBATCH_RESULT"
