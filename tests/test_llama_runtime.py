"""The llama.cpp runtime: which binary the embedded executor runs, its build tag, and the CPU features it reports.

No model here: the supervision of a real server is in tests/test_executor_embedded.py."""

from __future__ import annotations

import os
import stat

import pytest

from spogw_dagster.executors import llama_runtime as lr


def test_cpu_features_are_the_ones_reported_as_1():
    line = ("system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | "
            "AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 0 | AMX_INT8 = 0 | LLAMAFILE = 1 | OPENMP = 1 | "
            "REPACK = 1 |")
    assert lr.cpu_features("noise\n" + line + "\nmore") == ["AVX", "AVX2", "BMI2", "F16C", "FMA", "LLAMAFILE",
                                                             "OPENMP", "REPACK", "SSE3", "SSSE3"]
    assert lr.cpu_features("") == []


def test_portable_flags_never_native_never_amx():
    args = lr.cmake_args()
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AMX_INT8=OFF" in args and "-DGGML_AVX512=OFF" in args
    assert not any(a.startswith("-DGGML_NATIVE=ON") for a in args)


def test_build_tag_changes_with_the_flags_and_not_with_the_cpu(monkeypatch):
    base = lr.build_tag()
    monkeypatch.setenv(lr.ENV_EXTRA_ARGS, "-DGGML_AVX512=ON")
    other = lr.build_tag()
    assert other != base and other.startswith(lr.SOURCE_VERSION + "-")
    monkeypatch.delenv(lr.ENV_EXTRA_ARGS)
    assert lr.build_tag() == base
    # the tag hashes the source, the flags and the machine type only: nothing read from /proc/cpuinfo
    monkeypatch.setattr(lr, "host_cpu_flags", lambda: {"amx_tile", "amx_int8"})
    assert lr.build_tag() == base


ZEN4 = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl",
        "avx512_vnni", "avx512vbmi", "avx512_bf16"}


def test_the_avx512_variant_runs_only_where_the_cpu_lists_every_flag_it_needs(monkeypatch):
    monkeypatch.setattr(lr.platform, "machine", lambda: "x86_64")
    assert [v.name for v in lr.host_variants(ZEN4)] == ["avx512", "portable"]
    assert [v.name for v in lr.host_variants(ZEN4 - {"avx512_bf16"})] == ["portable"]  # Skylake-X, Cascade Lake
    assert [v.name for v in lr.host_variants({"avx2", "fma"})] == ["portable"]
    monkeypatch.setattr(lr.platform, "machine", lambda: "aarch64")
    assert [v.name for v in lr.host_variants(ZEN4)] == ["portable"]


def test_the_avx512_variant_turns_avx512_on_after_the_baseline_and_never_amx():
    args = lr.cmake_args(lr.AVX512)
    # cmake keeps the last -D of a name: the variant's ON comes after the baseline's OFF
    assert args.index("-DGGML_AVX512=ON") > args.index("-DGGML_AVX512=OFF")
    assert "-DGGML_AVX512_BF16=ON" in args and "-DGGML_AMX_INT8=OFF" in args
    assert not any(a.startswith("-DGGML_AMX") and a.endswith("=ON") for a in args)
    assert lr.build_tag(args) != lr.build_tag() and lr.build_tag(lr.cmake_args(lr.PORTABLE)) == lr.build_tag()


def _fake_build(root, variant):
    b = root / lr.build_tag(lr.cmake_args(variant)) / "bin" / "llama-server"
    b.parent.mkdir(parents=True)
    b.write_text("#!/bin/sh\n")
    b.chmod(0o755)
    return b


def test_the_fastest_runtime_is_the_best_built_variant_this_cpu_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOGW_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv(lr.ENV_BINARY, raising=False)
    monkeypatch.delenv(lr.ENV_EXTRA_ARGS, raising=False)
    monkeypatch.setattr(lr.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(lr, "host_cpu_flags", lambda: set(ZEN4))
    portable = _fake_build(tmp_path, lr.PORTABLE)
    assert lr.find_runtime(fastest=True).binary == portable  # the variant is not built: the portable one
    fast = _fake_build(tmp_path, lr.AVX512)
    rt = lr.find_runtime(fastest=True)
    assert (rt.binary, rt.variant) == (fast, "avx512")
    assert lr.find_runtime().binary == portable  # the reproducible mode never takes a variant
    monkeypatch.setattr(lr, "host_cpu_flags", lambda: ZEN4 - {"avx512vbmi"})  # built, but this CPU lacks a flag
    assert lr.find_runtime(fastest=True).binary == portable


def test_missing_runtime_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOGW_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv(lr.ENV_BINARY, raising=False)
    with pytest.raises(lr.RuntimeMissingError, match="spogw runtime install"):
        lr.find_runtime()


def test_own_binary_must_be_executable(tmp_path, monkeypatch):
    f = tmp_path / "llama-server"
    f.write_text("#!/bin/sh\n")
    monkeypatch.setenv(lr.ENV_BINARY, str(f))
    with pytest.raises(lr.RuntimeMissingError, match="not an executable file"):
        lr.find_runtime()
    f.chmod(f.stat().st_mode | stat.S_IXUSR)
    rt = lr.find_runtime()
    assert rt.binary == f and rt.tag == "own"


def test_installed_runtime_is_the_portable_build():
    """What `spogw runtime install` (the README's first command and .ci/run) left: our tag, our flags."""
    if os.environ.get(lr.ENV_BINARY):
        pytest.skip("SPOGW_LLAMA_SERVER names a binary of the user's own")
    rt = lr.find_runtime()
    info = rt.describe()
    assert info["tag"] == lr.build_tag()
    assert info["build"]["source_sha256"] == lr.SOURCE_SHA256
    assert "-DGGML_NATIVE=OFF" in info["build"]["cmake_args"]


class _Worker:
    """Stands in for a LlamaServer in the router's bookkeeping (no process)."""

    slots = 1

    def __init__(self, given_up: bool = False):
        self.given_up = given_up

    def start(self) -> None:
        pass


def test_router_picks_the_least_loaded_worker_and_skips_one_that_gave_up(tmp_path):
    from spogw_dagster.executors.embedded import EmbeddedExecutor

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    ex = EmbeddedExecutor(gguf, servers=[_Worker(), _Worker(), _Worker()])
    assert [ex._pick() for _ in range(3)] == [0, 1, 2]  # idle: round robin by picks
    ex._in_flight = [1, 0, 1]
    assert ex._pick() == 1
    ex.workers[1].given_up = True  # crashed past its restart limit: fails at once, so it must not draw calls
    ex._in_flight = [1, 0, 1]
    assert ex._pick() == 0
    for w in ex.workers:
        w.given_up = True
    assert ex._pick() in (0, 1, 2)  # all gave up: one of them fails the call with the message
