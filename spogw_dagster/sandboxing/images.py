"""The one place images are made: with no registry, from a skeleton of this host's top-level layout.

Why a skeleton: Docker's vfs storage driver (the only one that works on our machines) copies the whole image
into every new container, so a start costs in proportion to the image. A Debian root made by debootstrap
with python3.11 (252 MB) took 1.3-4.4 s per `docker run --rm`; an image holding only the top-level layout
takes 0.3-0.4 s. Each container then binds what it needs from the host read-only (/usr, the interpreter's
prefix; see backend_docker.host_mounts), so the engine must run on this host.

An image is an `ImageSpec`: its tag, the label recording which skeleton it was built for (so a change of
the host's layout rebuilds it), the skeleton's entries, and either `docker import` changes (the image is
the skeleton) or a Dockerfile built FROM the imported skeleton. Two specs exist: the workflow sandbox's
(`SANDBOX_IMAGE`, sandbox/Dockerfile) and the container step executor's (pipeline/runs/container_steps).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .engine import DockerUnavailableError, docker, last_line, require_engine
from .environment import SANDBOX_DIR_INSIDE, runner_path

# The files of sandbox/ this module runs without importing them (the sandbox image is built from
# sandbox/Dockerfile); the code versions of the assets that import it cover them (pipeline/defs/versions.py).
SANDBOX_FILES = "*"

Entry = tuple[str, str, str]  # (kind, path, payload): "dir", "link" (payload: target) or "file" (its text)

# Top-level entries that are symlinks into /usr on a merged-/usr system, real directories elsewhere.
TOP_LEVEL_MAYBE_LINKS = ("bin", "lib", "lib32", "lib64", "libx32")
_MOUNT_POINTS = ("usr", "tmp", "proc", "dev", "sys", "etc")
_ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/nonexistent:/nonexistent\nnobody:x:65534:65534:nobody:/nonexistent:/nonexistent\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}


def host_skeleton(extra_dirs: tuple[str, ...] = (), host_sbin: bool = False) -> list[Entry]:
    """This host's top-level symlinks, empty mount points (plus `extra_dirs`), and an /etc/passwd naming the
    sandbox's uid. Real top-level directories (a non-merged /usr) stay empty and are bound at run time.
    host_sbin: /sbin as on the host (ctypes finds libseccomp through /sbin/ldconfig) rather than an empty
    directory (where the engine mounts docker-init, which must not land in a bind of the host's /usr)."""
    entries: list[Entry] = []
    for name in TOP_LEVEL_MAYBE_LINKS:
        top = os.path.join("/", name)
        if os.path.islink(top):
            entries.append(("link", name, os.readlink(top)))
        elif os.path.isdir(top):
            entries.append(("dir", name, ""))
    if host_sbin and os.path.islink("/sbin"):
        entries.append(("link", "sbin", os.readlink("/sbin")))
    else:
        entries.append(("dir", "sbin", ""))
    entries += [("dir", d, "") for d in (*_MOUNT_POINTS, *extra_dirs)]
    entries += [("file", path, text) for path, text in sorted(_ETC_FILES.items())]
    return entries


def tar_of(entries: list[Entry]) -> bytes:
    """An uncompressed tar of the entries; `docker import` turns it into an image with no registry."""
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


@dataclass(frozen=True)
class ImageSpec:
    tag: str
    label: str  # image label holding the digest of the skeleton it was built for
    entries: Callable[[], list[Entry]]
    message: str  # what `docker import` records, and what the build log says it makes
    changes: tuple[str, ...] = ()  # `docker import --change` lines, when the skeleton is the image
    dockerfile_dir: Callable[[], Path] | None = field(default=None)  # else built FROM the imported skeleton

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(sorted(self.entries())).encode()).hexdigest()[:16]

    def base_tag(self) -> str:
        return f"{self.tag.partition(':')[0]}-base:{self.digest()}"


def image_status(spec: ImageSpec) -> tuple[bool, str]:
    """Whether the image exists and was built for this host's layout."""
    res = docker("image", "inspect", "--format", '{{index .Config.Labels "%s"}}' % spec.label, spec.tag)
    if res.returncode != 0:
        return False, f"image {spec.tag} is missing ({last_line(res)})"
    built_for = res.stdout.decode().strip()
    if built_for != spec.digest():
        return False, f"image {spec.tag} was built for another host layout ({built_for or 'unlabelled'})"
    return True, "up to date"


def build_image(spec: ImageSpec, force: bool = False, log=print) -> str:
    """Make the image with no registry; idempotent (a few seconds the first time, a quarter second when up to
    date). Returns what it did."""
    require_engine()
    if not force and image_status(spec)[0]:
        return f"{spec.tag} is up to date"
    digest = spec.digest()
    if spec.dockerfile_dir is None:
        log(f"importing {spec.tag}: {spec.message}")
        changes = [a for c in (f"LABEL {spec.label}={digest}", *spec.changes) for a in ("--change", c)]
        _import(spec.tag, spec.message, spec.entries(), changes)
        return f"built {spec.tag}"
    base = spec.base_tag()
    if force or docker("image", "inspect", base).returncode != 0:
        log(f"importing the skeleton base image {base}")
        _import(base, spec.message, spec.entries(), [])
    context = spec.dockerfile_dir()
    if not (context / "Dockerfile").is_file():
        raise DockerUnavailableError(f"no Dockerfile in {context}; reinstall spogw-dagster")
    log(f"building {spec.tag} from {context / 'Dockerfile'}")
    res = docker("build", "--quiet", "--build-arg", f"BASE={base}", "--label", f"{spec.label}={digest}",
                 "-t", spec.tag, str(context), timeout=300)
    if res.returncode != 0:
        raise DockerUnavailableError(f"docker build of {spec.tag} failed: {last_line(res)}")
    return f"built {spec.tag} from {base}"


def _import(tag: str, message: str, entries: list[Entry], changes: list[str]) -> None:
    res = docker("import", "--message", message, *changes, "-", tag, stdin=tar_of(entries))
    if res.returncode != 0:
        raise DockerUnavailableError(f"docker import of {tag} failed: {last_line(res)}")


def sandbox_dir() -> Path:
    """sandbox/ (the installed `spogw_sandbox` package): the Dockerfile and the child-side scripts."""
    return runner_path().parent


SANDBOX_IMAGE = ImageSpec(
    tag="spogw-sandbox:latest", label="org.spogw.skeleton",
    entries=lambda: host_skeleton(extra_dirs=(SANDBOX_DIR_INSIDE.strip("/"),)),
    message="spogw sandbox skeleton (top-level layout only)", dockerfile_dir=sandbox_dir)
