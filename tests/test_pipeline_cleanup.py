"""`spogw gc` removes exactly what no partition references."""

from __future__ import annotations

import polars as pl

from spogw_dagster.cli import main
from spogw_dagster.pipeline.runs.cleanup import find_garbage
from spogw_dagster.pipeline.data.storage import AssetStore


def _adapter(d, nbytes=1000):
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(b"x" * nbytes)


def test_gc_removes_only_unreferenced_adapters(tmp_path, capsys):
    store = AssetStore(tmp_path)
    for key in ("0000", "0001"):  # two checkpoints with table rows, one orphan folder (its row is gone)
        _adapter(store.adapter_dir(key))
    store.write_parquet("lora_checkpoint", "0000", pl.DataFrame({"iteration": [0]}))
    store.write_parquet("lora_checkpoint", "0001", pl.DataFrame({"iteration": [1]}))
    _adapter(store.adapter_dir("0002"), 3000)
    # comparison of 0001 lists spogw and rwr; grpo's folder is left over, and 0005 has no table at all
    store.write_parquet("objective_comparison", "0001", pl.DataFrame(
        {"iteration": [1, 1, 1], "method": ["spogw", "rwr", "baseline:io"], "kind": ["method", "method", "baseline"]}))
    for m in ("spogw", "rwr", "grpo"):
        _adapter(tmp_path / "comparison" / "0001" / m, 500)
    _adapter(tmp_path / "comparison" / "0005" / "spogw", 700)
    (tmp_path / "execution_scores").mkdir()
    (tmp_path / "execution_scores" / ".tmp-0000.parquet-123-abcdef12").write_bytes(b"half")

    g = find_garbage(store)
    assert g.adapters == [store.adapter_dir("0002")]
    assert g.comparison == [tmp_path / "comparison" / "0001" / "grpo", tmp_path / "comparison" / "0005"]

    assert main(["gc", "--assets-dir", str(tmp_path), "--dry-run"]) == 0
    assert "would remove 3 path(s), 0.0 MB" in capsys.readouterr().out
    assert store.adapter_dir("0002").is_dir()  # a dry run removes nothing

    assert main(["gc", "--assets-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "removed 4 path(s)" in out  # 3 folders + the temp file; 3000 + 500 + 700 bytes
    assert not store.adapter_dir("0002").exists() and not (tmp_path / "comparison" / "0005").exists()
    assert not (tmp_path / "comparison" / "0001" / "grpo").exists()
    for kept in (store.adapter_dir("0000"), store.adapter_dir("0001"), tmp_path / "comparison" / "0001" / "rwr"):
        assert (kept / "adapter_model.safetensors").is_file()
    assert not list((tmp_path / "execution_scores").iterdir())
    assert find_garbage(store).paths == []


def test_gc_keeps_a_listed_methods_own_candidates(tmp_path):
    """`<method>.candidates` (a method's own sampled and scored candidates, kept beside its adapter for a rerun)
    belongs to its method: kept while the method is listed, garbage with it otherwise."""
    store = AssetStore(tmp_path)
    store.write_parquet("objective_comparison", "0001", pl.DataFrame(
        {"iteration": [1], "method": ["score_dpo"], "kind": ["method"]}))
    comp = tmp_path / "comparison" / "0001"
    for name in ("score_dpo", "score_dpo.candidates", "w4s.candidates", "candidates"):
        _adapter(comp / name, 10)
    assert find_garbage(store).comparison == [comp / "candidates", comp / "w4s.candidates"]
