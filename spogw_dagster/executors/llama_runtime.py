"""The llama.cpp runtime of the embedded executor: a `llama-server` binary we build ourselves, for any x86-64 CPU.

Why not the `llama-cpp-python` wheel pip builds: pip compiles llama.cpp with `GGML_NATIVE=ON` (`-march=native`)
and caches the wheel by version, whatever flags built it. A wheel built on a CPU with AMX crashes (SIGSEGV in
the AMX buffer type) on any decode of two or more tokens; one built on an AVX-512 machine dies of SIGILL on a
CPU without AVX-512; and a machine that once cached such a wheel keeps getting it. So we build llama.cpp's own
server from a pinned, hash-checked source (the llama.cpp tree vendored in the `llama-cpp-python` 0.3.36 sdist
on PyPI) with an explicit CPU baseline (`GGML_NATIVE=OFF`: SSE4.2, AVX, AVX2, FMA, F16C, BMI2; no AVX-512, no
AMX: every x86-64 server CPU of the last decade runs it), into our own cache directory under a tag that hashes
the source and the flags. pip's cache is not involved. The server also gives us continuous batching over
parallel slots (`--parallel`), which the Python bindings do not.

    spogw runtime install            # build once (about 10 minutes on 2 cores), then reused
    spogw runtime info               # where it is, its flags and the CPU features it uses

Variants: `portable` (the baseline above, what every call runs by default: a seeded call gives the same text on
any x86-64 CPU) and `avx512` (AVX-512 F/BW/DQ/VL with VNNI, VBMI and BF16, as Zen 4 and Ice Lake or later Xeons
have; AMX stays off). `spogw runtime install --variant host` also builds the best variant this CPU runs; the
executor's faster mode (`executor.reproducible: false`) picks, at run time, the best built variant whose CPU
flags `/proc/cpuinfo` lists, so a variant is never started on a CPU that lacks them, and the self-check runs on
whatever starts.

`SPOGW_LLAMA_SERVER=/path/to/llama-server` uses a binary of your own (a CUDA build, say) instead; its CPU
features are still read and recorded. `SPOGW_LLAMA_CMAKE_ARGS` adds cmake flags (e.g. `-DGGML_AVX512=ON` for a
fleet of AVX-512 machines); they are part of the tag, so a changed flag is a new build, never a stale one.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..fsutil import file_sha256
from ..paths import cache_dir

# The pinned source: llama-cpp-python's sdist vendors llama.cpp at the commit its 0.3.36 release was made from.
SOURCE_PACKAGE = "llama-cpp-python"
SOURCE_VERSION = "0.3.36"
SOURCE_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SOURCE_FILE = f"llama_cpp_python-{SOURCE_VERSION}.tar.gz"

# Portable CPU baseline (see the module docstring). Static libraries: one self-contained binary (plus libgomp),
# which the step image can copy. No curl/OpenSSL/UI: nothing is fetched at build or run time.
BASE_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX512=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
)



@dataclass(frozen=True)
class Variant:
    """A build for a class of CPU: its extra cmake flags, and the /proc/cpuinfo flags a CPU needs to run it."""

    name: str
    cmake_args: tuple[str, ...]
    cpu_flags: frozenset[str]


PORTABLE = Variant("portable", (), frozenset())
# Later flags win in cmake, so these override the baseline's AVX512=OFF; AMX stays off (the crash above).
AVX512 = Variant("avx512", ("-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON",
                            "-DGGML_AVX512_BF16=ON"),
                 frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512vbmi",
                            "avx512_bf16"}))
VARIANTS = {v.name: v for v in (PORTABLE, AVX512)}  # worst to best


def host_variants(flags: set[str] | None = None) -> list[Variant]:
    """The variants this CPU can run, best first (only x86-64 has variants beyond the portable build)."""
    flags = host_cpu_flags() if flags is None else flags
    if platform.machine() not in ("x86_64", "AMD64"):
        return [PORTABLE]
    return [v for v in reversed(VARIANTS.values()) if v.cpu_flags <= flags]


ENV_BINARY = "SPOGW_LLAMA_SERVER"
ENV_EXTRA_ARGS = "SPOGW_LLAMA_CMAKE_ARGS"
INSTALL_HINT = "spogw runtime install"


class RuntimeMissingError(RuntimeError):
    """No llama.cpp server binary: names the command that builds one."""


@dataclass(frozen=True)
class Runtime:
    binary: Path
    tag: str            # "own" for SPOGW_LLAMA_SERVER, else our build tag
    cmake_args: tuple[str, ...]
    variant: str = "portable"  # "own" for SPOGW_LLAMA_SERVER

    def describe(self) -> dict:
        info = {"binary": str(self.binary), "tag": self.tag, "variant": self.variant,
                "cmake_args": list(self.cmake_args)}
        meta = self.binary.parent.parent / "build-info.json"
        if meta.is_file():
            try:
                info["build"] = json.loads(meta.read_text())
            except ValueError:
                pass
        return info


def cmake_args(variant: Variant = PORTABLE) -> tuple[str, ...]:
    return BASE_CMAKE_ARGS + variant.cmake_args + tuple(shlex.split(os.environ.get(ENV_EXTRA_ARGS, "")))


def build_tag(args: tuple[str, ...] | None = None) -> str:
    """Names one build: the source's hash, the flags and the machine type (never the CPU's own features)."""
    args = cmake_args() if args is None else args
    h = hashlib.sha256(json.dumps([SOURCE_SHA256, list(args), platform.machine()]).encode()).hexdigest()[:12]
    return f"{SOURCE_VERSION}-{h}"


def runtime_root() -> Path:
    """Where `install` builds: $SPOGW_RUNTIME_DIR, else `llama.cpp/` in our cache directory."""
    given = os.environ.get("SPOGW_RUNTIME_DIR")
    return Path(given) if given else cache_dir() / "llama.cpp"


def _search_roots() -> list[Path]:
    # A test or a user that points SPOGW_CACHE_DIR elsewhere (for the call cache) still finds the runtime
    # built at the default location.
    default = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "spogw" / "llama.cpp"
    roots = [runtime_root()]
    if not os.environ.get("SPOGW_RUNTIME_DIR") and default not in roots:
        roots.append(default)
    return roots


def _built(variant: Variant) -> Runtime | None:
    args = cmake_args(variant)
    tag = build_tag(args)
    for root in _search_roots():
        p = root / tag / "bin" / "llama-server"
        if p.is_file():
            return Runtime(p, tag, args, variant.name)
    return None


def find_runtime(fastest: bool = False) -> Runtime:
    """The binary to run: $SPOGW_LLAMA_SERVER, else our portable build for the current flags (with `fastest`,
    the best variant built that this CPU runs, else the portable one); raises when none is built."""
    own = os.environ.get(ENV_BINARY)
    if own:
        p = Path(own)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise RuntimeMissingError(f"${ENV_BINARY}={own} is not an executable file; fix: point it at a "
                                      f"llama-server binary, or unset it and run `{INSTALL_HINT}`")
        return Runtime(p, "own", (), "own")
    for variant in host_variants() if fastest else [PORTABLE]:
        rt = _built(variant)
        if rt is not None:
            return rt
    args = cmake_args()
    tag = build_tag(args)
    raise RuntimeMissingError(
        f"the embedded executor's llama.cpp server is not built ({runtime_root() / tag / 'bin' / 'llama-server'} is "
        f"missing); fix: run `{INSTALL_HINT}` once (about 10 minutes on 2 cores), or set ${ENV_BINARY} to a "
        "llama-server binary")


def _log(msg: str) -> None:
    print(f"spogw runtime: {msg}", file=sys.stderr, flush=True)


def _fetch_source(dest: Path) -> Path:
    """The pinned sdist, from $SPOGW_LLAMA_SOURCE or PyPI via pip (pip's index settings apply), hash-checked."""
    given = os.environ.get("SPOGW_LLAMA_SOURCE")
    if given:
        src = Path(given)
    else:
        cached = runtime_root() / "src" / SOURCE_FILE
        if not (cached.is_file() and file_sha256(cached) == SOURCE_SHA256):
            cached.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
                _log(f"downloading the {SOURCE_PACKAGE} {SOURCE_VERSION} sdist (llama.cpp's source) from the package index")
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SOURCE_PACKAGE,
                                f"{SOURCE_PACKAGE}=={SOURCE_VERSION}", "-d", tmp],
                               check=True, stdout=subprocess.DEVNULL)
                os.replace(Path(tmp) / SOURCE_FILE, cached)
        src = cached
    got = file_sha256(src)
    if got != SOURCE_SHA256:
        raise RuntimeError(f"{src}: sha256 {got} is not the pinned {SOURCE_SHA256} of {SOURCE_FILE}; fix: delete it "
                           "and rerun (or point SPOGW_LLAMA_SOURCE at the genuine file)")
    with tarfile.open(src) as tf:
        tf.extractall(dest, filter="data")
    return dest / f"llama_cpp_python-{SOURCE_VERSION}" / "vendor" / "llama.cpp"


def _cmake() -> str:
    found = shutil.which("cmake")
    if found:
        return found
    try:  # the PyPI `cmake` package (a dependency) puts its binary beside the interpreter
        import cmake  # type: ignore  # lazy: only a runtime build needs it

        return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        raise RuntimeError("cmake is not installed; fix: pip install cmake (or apt-get install cmake)") from None


def install(force: bool = False, jobs: int | None = None, variant: Variant = PORTABLE) -> Runtime:
    """Build llama-server for the current flags unless it is already there. Atomic: a killed build leaves only
    a temporary directory, which the next build removes; a lock keeps two builds from racing."""
    args = cmake_args(variant)
    tag = build_tag(args)
    root = runtime_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / tag
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.joinpath("bin", "llama-server").is_file() and not force:
            _log(f"llama-server {tag} ({variant.name}) already built: {final}")
            return Runtime(final / "bin" / "llama-server", tag, args, variant.name)
        for stale in root.glob(f".tmp-{tag}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".tmp-{tag}-", dir=root))
        try:
            t0 = time.monotonic()
            source = _fetch_source(work / "src")
            build = work / "build"
            cmake = _cmake()
            _log(f"configuring llama.cpp ({' '.join(args)})")
            subprocess.run([cmake, "-S", str(source), "-B", str(build), *args], check=True,
                           stdout=subprocess.DEVNULL)
            n = jobs or max(1, os.cpu_count() or 1)
            _log(f"building llama-server with {n} jobs (about 10 minutes on 2 cores)")
            subprocess.run([cmake, "--build", str(build), "--target", "llama-server", "-j", str(n)], check=True,
                           stdout=subprocess.DEVNULL)
            staged = work / "out"
            (staged / "bin").mkdir(parents=True)
            shutil.copy2(build / "bin" / "llama-server", staged / "bin" / "llama-server")
            lic = source / "LICENSE"
            if lic.is_file():
                shutil.copy2(lic, staged / "LICENSE.llama.cpp")
            info = {"tag": tag, "variant": variant.name, "source": SOURCE_FILE, "source_sha256": SOURCE_SHA256, "cmake_args": list(args),
                    "compiler": _compiler_version(), "machine": platform.machine(),
                    "build_seconds": round(time.monotonic() - t0, 1)}
            (staged / "build-info.json").write_text(json.dumps(info, indent=2))
            if final.exists():
                shutil.rmtree(final)
            os.replace(staged, final)
            _log(f"built {final / 'bin' / 'llama-server'} in {info['build_seconds']:.0f} s")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return Runtime(final / "bin" / "llama-server", tag, args, variant.name)


def _compiler_version() -> str:
    try:
        out = subprocess.run(["c++", "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.splitlines()[0] if out else ""
    except (OSError, subprocess.SubprocessError):
        return ""


# llama.cpp prints e.g. "system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | AVX2 = 1 | ..."
_FEATURE_RE = re.compile(r"\b([A-Z][A-Z0-9_]+) = 1\b")


def cpu_features(system_info: str) -> list[str]:
    """The CPU features a llama.cpp build uses, from its `system_info` line (only those reported as 1)."""
    line = next((ln for ln in system_info.splitlines() if "system_info" in ln), system_info)
    cpu = line.split("CPU :", 1)[1] if "CPU :" in line else line
    return sorted(set(_FEATURE_RE.findall(cpu)))


def host_cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spogw runtime", description="the embedded executor's llama.cpp server")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_install = sub.add_parser("install", help="build llama-server (portable CPU baseline) into the cache")
    p_install.add_argument("--force", action="store_true", help="rebuild even if this tag is built")
    p_install.add_argument("--jobs", type=int, default=None)
    p_install.add_argument("--variant", choices=["portable", "host", *VARIANTS], default="portable",
                           help="portable (default: any x86-64 CPU); host: also the best variant this CPU runs, "
                                "which `executor.reproducible: false` uses; or a variant by name")
    sub.add_parser("info", help="print where the runtime is and how it was built (JSON)")
    a = ap.parse_args(argv)
    if a.cmd == "install":
        if a.variant == "host":
            wanted = [PORTABLE] + [v for v in host_variants()[:1] if v is not PORTABLE]
        else:
            wanted = [VARIANTS[a.variant]]
        for variant in wanted:
            if variant.cpu_flags - host_cpu_flags():
                print(f"spogw runtime install: this CPU lacks {' '.join(sorted(variant.cpu_flags - host_cpu_flags()))} "
                      f"for the {variant.name} variant; it is built, but runs only on a CPU that has them",
                      file=sys.stderr)
            try:
                rt = install(force=a.force, jobs=a.jobs, variant=variant)
            except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
                print(f"spogw runtime install failed: {e}", file=sys.stderr)
                return 1
            print(rt.binary)
        return 0
    try:
        rt = find_runtime()
    except RuntimeMissingError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(json.dumps(rt.describe(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
