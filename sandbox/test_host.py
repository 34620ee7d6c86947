"""Child side of a code verdict: the sandboxed process that runs the tests (and decides pass or fail).

Runs as `python -I -S -c <sandbox/plaindata.py + this file>` (spogw_dagster/benchmarks/verdict.py builds
the text), so the codec's `encode`, `decode`, `NotPlainData` and the wire's `dumps`, `loads` are globals
here. Standard library only; no `json` or `traceback` import (each costs more than the interpreter's start).

No solution code ever runs here. The names the tests call for the solution (the entry point, e.g. the
`candidate` of HumanEval's `check`) are proxies: a call encodes its arguments as plain data, the parent
relays it to the solution's process and brings back plain data, decoded here into fresh builtin objects
(or an exception, raised here, when the solution raised one). So the solution cannot reach this process's
frames, builtins, exit code or output, and the parent takes the verdict from this process alone.

Protocol (JSON lines on private copies of stdin/stdout; prints of the tests go to stderr):
  child -> parent  {"type": "ready"}
  parent -> child  {"setup": str, "tests": [str], "names": [str], "stop_at_first_failure": bool}
  child -> parent  {"type": "call", "id": int, "name": str, "args": [node], "kwargs": {str: node}}
  parent -> child  {"type": "reply", "id": int, "ok": true, "value": node, "after": [[index or name, node]]}
                or {"type": "reply", "id": int, "ok": false, "exc_type": str, "error": str}
  child -> parent  {"type": "verdict", "records": [{"index", "test", "passed", "error"}]}
                or {"type": "host_error", "error": str}   (this machinery failed: never a score)
`setup` runs first (the prompt's imports and helpers, the `check` definition), then the proxies are bound,
then each test in turn; with stop_at_first_failure the first failing test ends the run.
"""

import builtins
import os
import sys


class SolutionError(RuntimeError):
    """The solution raised an exception that is not re-raised as its own type here."""


class HostError(Exception):
    """This host or its channel failed: reported as host_error, never as a test result."""


# Exceptions raised by the solution come back as the same builtin type, so that tests expecting one
# still work; StopIteration would silently end a loop of the tests (map(candidate, ...)), so it is not.
_NOT_RERAISED = (StopIteration, StopAsyncIteration)
MUTABLE_TYPES = (list, dict, set)


class Channel:
    def __init__(self, proto_in, proto_out):
        self._in, self._out = proto_in, proto_out
        self._next_id = 0

    def send(self, obj):
        self._out.write((dumps(obj) + "\n").encode())

    def call(self, name, args, kwargs):
        self._next_id += 1
        self.send({"type": "call", "id": self._next_id, "name": name, "args": args, "kwargs": kwargs})
        line = self._in.readline()
        if not line:
            raise HostError("the parent closed the channel during a call of %s" % name)
        reply = loads(line)
        if reply.get("type") != "reply" or reply.get("id") != self._next_id:
            raise HostError("unexpected reply %r" % (line[:200],))
        return reply


def _exception(exc_type, message):
    cls = getattr(builtins, exc_type, None) if type(exc_type) is str else None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, _NOT_RERAISED):
        try:
            return cls(message)
        except Exception:  # e.g. UnicodeDecodeError needs five arguments
            pass
    return SolutionError("%s: %s" % (exc_type, message))


def _encode_argument(value, where, name):
    try:
        return encode(value)
    except NotPlainData as e:
        raise TypeError("%s of %s: %s (only plain data crosses to the solution's process)" % (where, name, e)) from None


def _update_in_place(original, new):
    """Give an argument the contents it has after the call in the solution's process."""
    if original == new:
        return
    if type(original) is list:
        original[:] = new
    else:
        original.clear()
        original.update(new)


def make_proxy(channel, name):
    def proxy(*args, **kwargs):
        encoded = [_encode_argument(a, "argument %d" % (i + 1), name) for i, a in enumerate(args)]
        encoded_kw = {k: _encode_argument(v, "argument %r" % k, name) for k, v in kwargs.items()}
        reply = channel.call(name, encoded, encoded_kw)
        try:
            if not reply["ok"]:
                error = _exception(reply["exc_type"], reply["error"])
            else:
                value = decode(reply["value"])
                for key, node in reply["after"]:
                    original = args[key] if type(key) is int else kwargs[key]
                    new = decode(node)
                    if type(original) in MUTABLE_TYPES and type(new) is type(original):
                        _update_in_place(original, new)
                return value
        except (KeyError, IndexError, TypeError, NotPlainData) as e:
            raise HostError("malformed reply from the parent for %s: %r" % (name, e)) from None
        raise error

    proxy.__name__ = proxy.__qualname__ = name
    return proxy


def _where(exc):
    """'line N of <test i>' for the innermost frame of the test code, else ''."""
    where, tb = "", exc.__traceback__
    while tb is not None:  # walked by hand: importing traceback costs more than the interpreter's start
        name = tb.tb_frame.f_code.co_filename
        if name.startswith("<test"):
            where = " (line %d of %s)" % (tb.tb_lineno, name)
        tb = tb.tb_next
    return where


def _error_text(exc):
    message = str(exc)
    text = type(exc).__name__ + (": " + message if message else "")
    return (text[:300] + _where(exc))[:400]


def run_tests(init, channel):
    namespace = {"__name__": "__spogw_tests__", "__builtins__": builtins}
    try:
        exec(compile(init["setup"], "<test setup>", "exec"), namespace)
    except BaseException as e:
        raise HostError("the test setup failed: %s" % _error_text(e)) from None
    for name in init["names"]:
        namespace[name] = make_proxy(channel, name)
    records = []
    for i, test in enumerate(init["tests"]):
        try:
            exec(compile(test, "<test %d>" % i, "exec"), namespace)
            records.append({"index": i, "test": test, "passed": True, "error": ""})
        except HostError:
            raise
        except BaseException as e:  # SystemExit too: a test that does not finish does not pass
            records.append({"index": i, "test": test, "passed": False, "error": _error_text(e)})
            if init["stop_at_first_failure"]:
                break
    return records


def main():
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    proto_in = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    channel = Channel(proto_in, proto_out)
    channel.send({"type": "ready"})
    try:
        records = run_tests(loads(proto_in.readline()), channel)
        channel.send({"type": "verdict", "records": records})
    except BaseException as e:
        channel.send({"type": "host_error", "error": "%s: %s" % (type(e).__name__, e)})
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
