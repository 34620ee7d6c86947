"""Model resolution: the bundled GGUF converted once and cached, local folders, and every bad spec."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see spogw_dagster/models.py

import hashlib
import json
import threading
import time
from pathlib import Path

import pytest

from spogw_dagster import models, paths
from spogw_dagster.models import ModelSpecError, convert_gguf_cached, resolve_model


def _fake_converter(calls: list, delay: float = 0.0):
    def convert(gguf: Path, out: Path) -> None:
        calls.append(gguf)
        time.sleep(delay)
        (out / "config.json").write_text(json.dumps({"model_type": "fake", "src": gguf.read_text()}))

    return convert


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOGW_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fake_gguf(tmp_path):
    p = tmp_path / "Tiny.gguf"
    p.write_text("weights v1")
    return p


# ---------------------------------------------------------------------------------------------------
# the real bundled model


@pytest.mark.model
def test_bundled_gguf_converts_once_then_is_fast(tmp_cache):
    gguf = paths.smollm2_gguf()
    t0 = time.perf_counter()
    folder = resolve_model("smollm2")
    first = time.perf_counter() - t0
    assert folder.parent == tmp_cache / "models"
    for f in ("config.json", "model.safetensors", "tokenizer.json", models.MARKER):
        assert (folder / f).is_file(), f
    marker = json.loads((folder / models.MARKER).read_text())
    assert marker["gguf_size"] == gguf.stat().st_size
    assert marker["gguf_sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert not list((tmp_cache / "models").glob(".tmp-*")), "temporary folder left behind"

    t0 = time.perf_counter()
    assert resolve_model("SmolLM2") == folder  # aliases are case-insensitive
    second = time.perf_counter() - t0
    assert second < 0.5 and second < first / 10, (first, second)

    t0 = time.perf_counter()
    model, tok = models.load_model_and_tokenizer("smollm2")
    load_s = time.perf_counter() - t0
    print(f"\nconversion {first:.1f}s, cached resolve {second * 1000:.1f}ms, load from cache {load_s:.2f}s")
    assert load_s < 10
    n = sum(p.numel() for p in model.parameters())
    assert 130e6 < n < 140e6
    assert tok.pad_token_id is not None
    assert tok.decode(tok("def f(x):")["input_ids"]) == "def f(x):"


# ---------------------------------------------------------------------------------------------------
# specs and errors


def test_missing_path_names_the_fix(tmp_path):
    with pytest.raises(ModelSpecError, match="never downloaded.*fix"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ModelSpecError, match="never downloaded"):
        resolve_model("HuggingFaceTB/SmolLM2-360M")  # a hub id is not fetched


def test_folder_without_config_names_the_fix(tmp_path):
    d = tmp_path / "empty_model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelSpecError, match="no config.json.*fix"):
        resolve_model(str(d))


def test_other_bad_specs(tmp_path):
    with pytest.raises(ModelSpecError, match="empty"):
        resolve_model("  ")
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelSpecError, match="not a .gguf"):
        resolve_model(str(f))


def test_local_folder_is_used_as_is(tmp_path):
    d = tmp_path / "my_model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert resolve_model(str(d)) == d.resolve()


def test_adapter_folder_check(tmp_path):
    with pytest.raises(ModelSpecError, match="does not exist"):
        models.check_adapter_folder(tmp_path / "missing")
    (tmp_path / "a").mkdir()
    with pytest.raises(ModelSpecError, match="adapter_config.json"):
        models.check_adapter_folder(tmp_path / "a")


# ---------------------------------------------------------------------------------------------------
# conversion mechanics (a fake converter: fast, and we can make it crash)


def test_conversion_cached_by_content(tmp_cache, fake_gguf, monkeypatch):
    calls: list = []
    monkeypatch.setattr(models, "_convert", _fake_converter(calls))
    a = resolve_model(str(fake_gguf))
    assert resolve_model(str(fake_gguf)) == a and len(calls) == 1
    assert json.loads((a / "config.json").read_text())["src"] == "weights v1"
    # same bytes, new mtime: found again by content hash, not converted again
    fake_gguf.write_text("weights v1")
    assert convert_gguf_cached(fake_gguf) == a and len(calls) == 1
    # new content: a new folder
    fake_gguf.write_text("weights v2")
    b = convert_gguf_cached(fake_gguf)
    assert b != a and len(calls) == 2
    assert json.loads((b / "config.json").read_text())["src"] == "weights v2"


def test_crash_mid_conversion_leaves_nothing(tmp_cache, fake_gguf, monkeypatch):
    def crash(gguf: Path, out: Path) -> None:
        (out / "config.json").write_text("{half")
        raise RuntimeError("killed mid-way")

    monkeypatch.setattr(models, "_convert", crash)
    with pytest.raises(RuntimeError, match="killed"):
        resolve_model(str(fake_gguf))
    root = tmp_cache / "models"
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []

    # a hard crash (no cleanup) leaves a .tmp- folder: the next converter removes it and succeeds
    stale = root / f".tmp-Tiny-{hashlib.sha256(b'weights v1').hexdigest()[:16]}-999-dead"
    stale.mkdir()
    (stale / "config.json").write_text("{half")
    calls: list = []
    monkeypatch.setattr(models, "_convert", _fake_converter(calls))
    folder = resolve_model(str(fake_gguf))
    assert (folder / models.MARKER).is_file()
    assert not stale.exists()


def test_concurrent_converters_do_not_clash(tmp_cache, fake_gguf, monkeypatch):
    calls: list = []
    monkeypatch.setattr(models, "_convert", _fake_converter(calls, delay=0.3))
    results: list = []
    errors: list = []

    def worker():
        try:
            results.append(convert_gguf_cached(fake_gguf))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1 and len(calls) == 1
    assert not list((tmp_cache / "models").glob(".tmp-*"))
