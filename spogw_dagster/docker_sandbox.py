"""The Docker variant of the sandbox: its image, the `docker run` command line and the seccomp profile.

Design, from measurements on this machine (Docker 20.10 with the vfs storage driver, the only one that
works here): vfs copies the whole image into every new container, so the cost of a start grows with the
image. A Debian root made by debootstrap with python3.11 (252 MB) took 1.3-4.4 s per `docker run --rm`;
an image holding nothing but the top-level layout takes 0.3-0.4 s. Every workflow run and every scoring
run starts a container, so the image is that empty skeleton, and the container sees exactly what the
bwrap sandbox sees: /usr and the prefix of the interpreter behind sys.executable (sandbox_env.sandbox_python),
bound read-only at their own paths, plus the child-side scripts (sandbox/*.py) read-only at /sandbox, so
a change to them needs no rebuild. The price: the engine must run on this host (it bind-mounts host
paths), which is also what `--network none` plus our own interpreter assume.

No registry is needed: `build_image` imports the skeleton as a local base image (`docker import`, cached
by a tag that hashes the skeleton) and builds sandbox/Dockerfile FROM it. `spogw sandbox build-image`
runs it; it is idempotent: a few seconds the first time (5 s under load here), 0.25 s when up to date.
Measured start cost under load (load average ~10 on 2 cores): run_code('pass') median 0.5 s in docker
against 0.08 s under bwrap, most of it runc starting the container (create ~0.05 s, start ~0.5 s).

Every container runs with --network none, a read-only root, all capabilities dropped, no-new-privileges,
a non-root uid, pids/memory/cpu limits, rlimits, a size-capped tmpfs at /tmp, no log driver (output goes
only to the parent), and a seccomp profile generated from spogw_dagster/seccomp.py: the same deny list
as the bwrap filter. Docker's own default profile is replaced by it, not combined with it (an engine takes
one profile); ours denies what no test needs, among it io_uring, which Docker 20.10's default allows.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from .fsutil import pid_alive

IMAGE = "spogw-sandbox:latest"
BASE_REPO = "spogw-sandbox-base"
SKELETON_LABEL = "org.spogw.skeleton"  # on the image: which host layout it was built for
CONTAINER_LABEL = "org.spogw.sandbox"  # on every container we start, to find leftovers
PARENT_LABEL = "org.spogw.parent"  # the pid of the process that started it, to sweep orphans
DEFAULT_HOST = "unix:///var/run/docker.sock"
SANDBOX_DIR_INSIDE = "/sandbox"
DEFAULT_UID = 65534  # nobody; spawn may pass a fresh one instead

# Top-level entries that are symlinks into /usr on a merged-/usr system, real directories elsewhere.
_TOP_LEVEL_MAYBE_LINKS = ("bin", "lib", "lib32", "lib64", "libx32")
# Empty directories the skeleton needs: mount points and the cwd. /sbin is always a plain empty directory:
# the engine mounts its init (--init) at /sbin/docker-init, which must not land in a bind of the host's /usr.
_SKELETON_DIRS = ("usr", "sbin", "tmp", "proc", "dev", "sys", "etc", SANDBOX_DIR_INSIDE.strip("/"))
_ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/nonexistent:/nonexistent\nnobody:x:65534:65534:nobody:/nonexistent:/nonexistent\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}


class DockerUnavailableError(RuntimeError):
    """No usable Docker engine, client or image; the message names the fix."""


# ---------------------------------------------------------------- the client and the engine

def client() -> str:
    """Absolute path of the docker client: sandboxed starts run with a scrubbed PATH (/usr/bin:/bin)."""
    path = shutil.which("docker")
    if not path:
        raise DockerUnavailableError("no docker client on PATH. Fix: `apt-get install docker.io`")
    return path


def host() -> str:
    """The engine to talk to, passed as -H on every call (the scrubbed environment drops DOCKER_HOST)."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def docker(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run one docker client command against our engine; never raises for a non-zero exit."""
    try:
        return subprocess.run([client(), "-H", host(), *args], input=stdin, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, 124, b"", f"timed out after {timeout}s".encode())


def _tail(res: subprocess.CompletedProcess) -> str:
    text = (res.stderr or res.stdout or b"").decode(errors="replace").strip()
    return text.splitlines()[-1] if text else f"exit code {res.returncode}"


def engine_answers(timeout: float = 10) -> tuple[bool, str]:
    res = docker("version", "--format", "{{.Server.Version}}", timeout=timeout)
    if res.returncode != 0:
        return False, f"no Docker engine answers at {host()} ({_tail(res)})"
    return True, res.stdout.decode().strip()


# ---------------------------------------------------------------- the image

def skeleton_entries() -> list[tuple[str, str, str]]:
    """(kind, path, payload) of the image's root: this host's top-level symlinks, empty mount points, and an
    /etc/passwd that names the sandbox's uid. Real top-level directories (a non-merged /usr) stay empty
    here and are bound read-only at run time (host_mounts)."""
    entries = []
    for name in _TOP_LEVEL_MAYBE_LINKS:
        top = os.path.join("/", name)
        if os.path.islink(top):
            entries.append(("link", name, os.readlink(top)))
        elif os.path.isdir(top):
            entries.append(("dir", name, ""))
    entries += [("dir", d, "") for d in _SKELETON_DIRS]
    entries += [("file", path, text) for path, text in sorted(_ETC_FILES.items())]
    return entries


def skeleton_digest() -> str:
    return hashlib.sha256(json.dumps(skeleton_entries()).encode()).hexdigest()[:16]


def skeleton_tar() -> bytes:
    return tar_of(skeleton_entries())


def tar_of(entries) -> bytes:
    """An uncompressed tar of (kind, path, payload) entries: "dir", "link" (payload: the target) or "file"
    (payload: its text); `docker import` turns it into an image with no registry."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, path, payload in entries:
            info = tarfile.TarInfo(path)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, payload
                tar.addfile(info)
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if path == "tmp" else 0o755
                tar.addfile(info)
            else:
                data = payload.encode()
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def dockerfile_dir() -> Path:
    """sandbox/ (the installed `spogw_sandbox` package): the Dockerfile and the child-side scripts."""
    from .sandbox_env import runner_path

    return runner_path().parent


def image_status() -> tuple[bool, str]:
    """Whether IMAGE exists and was built for this host's layout."""
    res = docker("image", "inspect", "--format", "{{index .Config.Labels \"%s\"}}" % SKELETON_LABEL, IMAGE)
    if res.returncode != 0:
        return False, f"image {IMAGE} is missing ({_tail(res)})"
    built_for = res.stdout.decode().strip()
    if built_for != skeleton_digest():
        return False, f"image {IMAGE} was built for another host layout ({built_for or 'unlabelled'})"
    return True, "up to date"


def build_image(force: bool = False, log=print) -> str:
    """Make IMAGE with no registry: import the skeleton as BASE_REPO:<digest> (once per layout), then
    `docker build` sandbox/Dockerfile FROM it. Idempotent; returns what it did."""
    ok, why = engine_answers()
    if not ok:
        raise DockerUnavailableError(f"{why}. Fix: start one as root: `dockerd --storage-driver=vfs &`")
    if not force and image_status()[0]:
        return f"{IMAGE} is up to date"
    digest = skeleton_digest()
    base = f"{BASE_REPO}:{digest}"
    if force or docker("image", "inspect", base).returncode != 0:
        log(f"importing the skeleton base image {base}")
        res = docker("import", "--message", "spogw sandbox skeleton (top-level layout only)", "-", base,
                     stdin=skeleton_tar())
        if res.returncode != 0:
            raise DockerUnavailableError(f"docker import of {base} failed: {_tail(res)}")
    context = dockerfile_dir()
    if not (context / "Dockerfile").is_file():
        raise DockerUnavailableError(f"no Dockerfile in {context}; reinstall spogw-dagster")
    log(f"building {IMAGE} from {context / 'Dockerfile'}")
    res = docker("build", "--quiet", "--build-arg", f"BASE={base}", "--label", f"{SKELETON_LABEL}={digest}",
                 "-t", IMAGE, str(context), timeout=300)
    if res.returncode != 0:
        raise DockerUnavailableError(f"docker build of {IMAGE} failed: {_tail(res)}")
    return f"built {IMAGE} from {base}"


# ---------------------------------------------------------------- the seccomp profile

_SCMP_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}


def seccomp_profile() -> dict:
    """Docker's JSON form of spogw_dagster/seccomp.py's policy: allow by default; deny the listed syscalls
    with EPERM, clone3 with ENOSYS (glibc falls back to clone, whose flags the filter can read), and clone
    with any namespace flag. Only the native architecture is listed: syscalls of another ABI (int 0x80,
    x32) get the bad-architecture action instead of slipping past rules written for native numbers."""
    from . import seccomp

    arch = _SCMP_ARCH.get(platform.machine())
    if arch is None:
        raise DockerUnavailableError(f"no seccomp architecture known for {platform.machine()}")
    rules = [{"names": sorted(seccomp.DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": seccomp.DENY_ERRNO},
             {"names": sorted(seccomp.ENOSYS_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS}]
    for flag, bit in sorted(seccomp.CLONE_NAMESPACE_FLAGS.items()):
        rules.append({"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": seccomp.DENY_ERRNO,
                      "args": [{"index": seccomp.CLONE_FLAGS_ARG, "value": bit, "valueTwo": bit,
                                "op": "SCMP_CMP_MASKED_EQ"}],
                      "comment": f"clone with {flag}"})
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [arch], "syscalls": rules}


def seccomp_profile_path() -> Path:
    """The profile as a file (the client reads it on every `docker run`), written once per content."""
    from .paths import cache_dir

    text = json.dumps(seccomp_profile(), indent=1, sort_keys=True)
    path = cache_dir() / "docker" / f"seccomp-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


# ---------------------------------------------------------------- the command line

def host_mounts() -> list[str]:
    """Host paths bound read-only at the same path: what the interpreter needs, as under bwrap."""
    from .sandbox_env import sandbox_python

    mounts = ["/usr"]
    for name in _TOP_LEVEL_MAYBE_LINKS:  # real directories on a non-merged-/usr host
        top = os.path.join("/", name)
        if os.path.isdir(top) and not os.path.islink(top):
            mounts.append(top)
    return mounts + [m for m in sandbox_python().mounts if m not in mounts]


def _bind(source: str, target: str) -> list[str]:
    """--mount (not -v: it fails on a missing source instead of creating it as root on the host), CSV-quoted
    so that a comma in a path cannot add options."""
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(
        ["type=bind", f"source={source}", f"target={target}", "readonly"])
    return ["--mount", out.getvalue()]


def run_command(argv: list[str], limits, ro_files: list[tuple[str, str]], uid: int | None,
                container: str) -> list[str]:
    """`docker run` for one sandboxed process. argv names sys.executable for Python; it becomes the base
    interpreter, which the container reaches through the read-only binds."""
    from .sandbox_env import sandbox_python

    python = sandbox_python().executable
    argv = [python if a == sys.executable else a for a in argv]
    user = uid if uid is not None else DEFAULT_UID
    cmd = [client(), "-H", host(), "run", "--rm", "-i", "--init", "--name", container,
           "--label", f"{CONTAINER_LABEL}=1", "--label", f"{PARENT_LABEL}={os.getpid()}",
           "--log-driver", "none",
           "--network", "none", "--read-only", "--cap-drop", "ALL",
           "--security-opt", "no-new-privileges", "--security-opt", f"seccomp={seccomp_profile_path()}",
           "--pids-limit", str(limits.nproc), "--memory", f"{limits.memory_mb}m",
           "--memory-swap", f"{limits.memory_mb}m", "--cpus", "1", "--user", f"{user}:{user}",
           "--tmpfs", f"/tmp:rw,size={limits.scratch_mb}m,mode=1777", "--workdir", "/tmp",
           # soft < hard, as under bwrap: the soft limit's SIGXCPU reads as a timeout, not a kill
           "--ulimit", f"cpu={limits.cpu_s}:{limits.cpu_s + 1}",
           "--ulimit", f"fsize={limits.fsize_mb << 20}", "--ulimit", f"nofile={limits.nofile}",
           "--ulimit", "core=0", "--env", "PYTHONDONTWRITEBYTECODE=1", "--env", "PYTHONHASHSEED=0"]
    for path in host_mounts():
        cmd += _bind(path, path)
    from .sandbox_env import package_dirs_to_mask

    for d in package_dirs_to_mask(host_mounts()):  # an empty read-only tmpfs over third-party packages
        cmd += ["--tmpfs", f"{d}:ro,size=64k,mode=0555"]
    cmd += _bind(str(dockerfile_dir()), SANDBOX_DIR_INSIDE)
    for source, target in ro_files:
        cmd += _bind(source, target)
    return cmd + [IMAGE] + argv


def leftover_containers(name_prefix: str = "spogw-") -> list[str]:
    """Names of our sandbox containers that still exist (running or not) whose name starts with the prefix."""
    res = docker("ps", "--all", "--filter", f"label={CONTAINER_LABEL}", "--format", "{{.Names}}")
    if res.returncode != 0:
        raise DockerUnavailableError(f"cannot list containers: {_tail(res)}")
    return [n for n in res.stdout.decode().split() if n.startswith(name_prefix)]


def sweep_orphans() -> list[str]:
    """Remove our containers whose parent process is gone. A container outlives a parent killed with SIGKILL
    (the client runs in its own session, and bwrap's --die-with-parent has no docker equivalent); one that
    had only been created when its client died is never auto-removed. Returns the names removed."""
    res = docker("ps", "--all", "--filter", f"label={CONTAINER_LABEL}",
                 "--format", '{{.Names}} {{.Label "%s"}}' % PARENT_LABEL)
    if res.returncode != 0:
        return []
    orphans = []
    for line in res.stdout.decode().splitlines():
        name, _, parent = line.partition(" ")
        if parent.isdigit() and not pid_alive(int(parent)):
            orphans.append(name)
    if orphans:
        docker("rm", "--force", *orphans)
    return orphans


def detect() -> tuple[str, str]:
    """('', detail) when the docker sandbox can run here, else (why not, ''), with the fix in the text."""
    from .sandbox_env import Limits

    try:
        client()
    except DockerUnavailableError as e:
        return str(e), ""
    ok, version = engine_answers()
    if not ok:
        return f"{version}; fix: start one as root: `dockerd --storage-driver=vfs &`", ""
    ok, why = image_status()
    if not ok:
        return f"{why}; fix: `spogw sandbox build-image`", ""
    sweep_orphans()
    probe = run_command([sys.executable, "-I", "-S", "-c", _PROBE], Limits(), [], None,
                        f"spogw-probe-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        res = subprocess.run(probe, capture_output=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    except subprocess.TimeoutExpired:
        return "a probe container did not finish within 60 s", ""
    if res.returncode != 0:
        return f"a probe container failed: {_tail(res)}", ""
    return "", f"{IMAGE} on engine {version} at {host()}, seccomp profile from seccomp.py"


# Run in the probe container: the interpreter starts and a seccomp filter is in force.
_PROBE = ("import sys\nstatus = open('/proc/self/status').read()\n"
          "sys.exit(0 if '\\nSeccomp:\\t2\\n' in status else 'no seccomp filter in force inside the container')")
