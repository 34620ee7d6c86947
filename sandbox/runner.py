"""Child side of the workflow sandbox. Standard library only: it runs as `python -I -S runner.py` inside
the isolation (bubblewrap namespaces or a Docker container) with no network, no secrets and no writable
path but its private /tmp.

Protocol: one JSON object per line.
  parent -> child, first line:  {"type": "init", "code": str, "operators": [str], "builtins": [str],
                                  "imports": [str], "max_print_bytes": int}
  child -> parent:               {"type": "call", "id": int, "op": str, "args": [...], "kwargs": {...}}
  parent -> child:               {"type": "reply", "id": int, "ok": bool, "value": str | "error": str}
  child -> parent, right after init: {"type": "ready"}  (tells a sandbox that failed to start apart)
  child -> parent, last line:    {"type": "result", "answer": str}
                              or {"type": "error", "status": "runtime_error" | "sandbox_violation", "message": str}

The workflow code was validated by the parent (AST allow-list) before it got here; this side adds a
second wall: the code runs with a builtins dict holding only the allow-listed names, and the protocol
file descriptor is not reachable from the workflow (fd 1 is pointed at /dev/null, prints go to a capped
buffer), and an audit hook refuses process creation (os.fork/exec/spawn/posix_spawn, subprocess.Popen,
and _posixsubprocess.fork_exec, which has no audit event and is swapped for a tripwire), sockets, ctypes,
file opens and any import that is not already loaded once the workflow starts: a tripwire that turns an
escape attempt into `sandbox_violation` (the OS isolation and its seccomp filter are what actually hold; see
spogw_dagster/sandboxing/).
"""

import asyncio
import builtins
import io
import json
import os
import sys
import threading
import traceback


_BLOCKED_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "subprocess.Popen", "open", "os.putenv", "os.unsetenv", "os.chdir", "os.remove", "os.rename", "os.rmdir",
    "os.mkdir", "os.symlink", "os.link", "os.truncate", "shutil.rmtree", "sys._getframe",
    "sys._current_frames", "code.__new__", "function.__new__", "object.__setattr__", "object.__delattr__",
    "sys.setrecursionlimit", "sys.settrace", "sys.setprofile", "resource.setrlimit", "mmap.__new__", "pty.spawn",
})
_violation = []  # the first blocked event, reported at the end even if the workflow swallowed the error


def _trip(event):
    if not _violation:
        _violation.append(event)
    raise PermissionError(f"sandbox: {event} is not allowed in a workflow")


def _disarm_fork_exec():
    """_posixsubprocess.fork_exec starts a process without any audit event (subprocess.Popen raises its event
    before calling it), and it stays reachable as Popen.__init__.__globals__['_fork_exec']: swap it, in both
    places, for a tripwire. A fresh copy of the module would need an import, which the hook refuses."""
    def fork_exec(*args, **kwargs):
        _trip("_posixsubprocess.fork_exec")

    for module, name in (("_posixsubprocess", "fork_exec"), ("subprocess", "_fork_exec")):
        if module in sys.modules and hasattr(sys.modules[module], name):
            setattr(sys.modules[module], name, fork_exec)


def _install_tripwire():
    _disarm_fork_exec()

    def hook(event, args):
        # "import" fires only when a module is not in sys.modules (a cache miss): everything the workflow may
        # import (math) is loaded already, so a miss is a new module, or a loaded one removed from sys.modules
        # or re-created by _imp.create_dynamic to get a fresh, unpatched copy.
        if event in _BLOCKED_EVENTS or event.startswith(("socket.", "ctypes.", "os.set", "signal.")) \
                or event == "import":
            _trip(f"import of {args[0]!r}" if event == "import" and args else event)

    sys.addaudithook(hook)


class OperatorError(Exception):
    """Raised inside the workflow when the parent reports that an operator call failed."""


class _CappedWriter(io.TextIOBase):
    def __init__(self, cap):
        self.cap = cap
        self.size = 0

    def writable(self):
        return True

    def write(self, s):
        self.size += len(s)  # the text itself is dropped: nobody reads workflow prints
        return len(s)


class Channel:
    def __init__(self, out_fd, in_stream):
        self._out = os.fdopen(out_fd, "wb", buffering=0)
        self._in = in_stream
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending = {}
        self._loop = None

    def send(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        with self._lock:
            self._out.write(data)

    def start_reader(self, loop):
        self._loop = loop
        t = threading.Thread(target=self._read_loop, daemon=True)
        t.start()

    def _read_loop(self):
        for raw in self._in:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if msg.get("type") != "reply":
                continue
            fut = self._pending.pop(msg.get("id"), None)
            if fut is not None:
                self._loop.call_soon_threadsafe(_resolve, fut, msg)
        # stdin closed: the parent is gone or has given up on us; fail whatever is still waiting
        for fut in list(self._pending.values()):
            self._loop.call_soon_threadsafe(_resolve, fut, {"ok": False, "error": "parent closed the channel"})

    async def call(self, op, args, kwargs):
        self._next_id += 1
        call_id = self._next_id
        fut = self._loop.create_future()
        self._pending[call_id] = fut
        self.send({"type": "call", "id": call_id, "op": op, "args": args, "kwargs": kwargs})
        msg = await fut
        if not msg.get("ok"):
            raise OperatorError(str(msg.get("error", "operator failed")))
        return msg.get("value")


def _resolve(fut, msg):
    if not fut.done():
        fut.set_result(msg)


def _jsonable(value):
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (int, float, bool)):
        return value
    return str(value)


def _make_operator(channel, name):
    async def operator(*args, **kwargs):
        return await channel.call(name, [_jsonable(a) for a in args], {k: _jsonable(v) for k, v in kwargs.items()})

    operator.__name__ = name
    return operator


def _restricted_builtins(names, imports):
    allowed = {n: getattr(builtins, n) for n in names if hasattr(builtins, n)}
    allowed["__build_class__"] = builtins.__build_class__  # needed to define the Workflow class itself
    allowed["OperatorError"] = OperatorError
    allowed_imports = frozenset(imports)

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level != 0 or name not in allowed_imports:
            raise ImportError(f"import of {name!r} is not allowed in a workflow")
        return builtins.__import__(name, globals, locals, fromlist, level)

    allowed["__import__"] = guarded_import
    return allowed


async def _run(channel, init, code):
    ns = {"__builtins__": _restricted_builtins(init["builtins"], init.get("imports", [])), "__name__": "workflow"}
    exec(code, ns)
    cls = ns.get("Workflow")
    if cls is None:
        raise NameError("the code defines no class Workflow")
    wf = cls()
    for name in init["operators"]:
        setattr(wf, name, _make_operator(channel, name))
    answer = await wf.run()
    if answer is None:
        raise ValueError("the workflow returned None (it must return the final solution)")
    return answer if isinstance(answer, str) else str(answer)


def main():
    # Keep the real stdout for the protocol on a private fd, then point fd 1 and sys.stdout away from it so
    # nothing the workflow prints can forge protocol messages.
    proto_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    line = sys.stdin.buffer.readline()
    init = json.loads(line)
    sys.stdout = _CappedWriter(int(init.get("max_print_bytes", 65536)))
    channel = Channel(proto_fd, sys.stdin.buffer)
    channel.send({"type": "ready"})
    import math  # noqa: F401  (the one module a workflow may import; loaded before the tripwire)

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    channel.start_reader(loop)
    try:
        # Compiled before the tripwire: a SyntaxError makes CPython open the "file" for its source line, an
        # `open` event the hook would report as an escape attempt.
        code = compile(init["code"], "<workflow>", "exec")
    except (SyntaxError, ValueError) as exc:
        channel.send({"type": "error", "status": "runtime_error", "exc_type": type(exc).__name__,
                      "message": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]})
        os._exit(0)
    _install_tripwire()
    try:
        answer = loop.run_until_complete(_run(channel, init, code))
        if _violation:
            raise PermissionError(f"sandbox: {_violation[0]} was attempted")
        channel.send({"type": "result", "answer": answer})
    except BaseException as exc:  # report everything; the parent decides the status
        tb = traceback.format_exception_only(type(exc), exc)
        channel.send({"type": "error", "status": "sandbox_violation" if _violation else "runtime_error",
                      "exc_type": type(exc).__name__, "message": "".join(tb).strip()[-2000:]})
    finally:
        sys.stdout = sys.__stdout__
    os._exit(0)  # skip interpreter teardown: daemon reader thread may still block on stdin


if __name__ == "__main__":
    main()
