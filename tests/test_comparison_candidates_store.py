"""A method's own sampled and scored candidates (ScoreFlow's, W4S's turns) are kept beside its adapter and
reused only when made with the same config, parent and iteration: sampling and scoring them takes hours on CPU,
and a failure in training or held-out scoring after must not cost them again."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl

from spogw_dagster.pipeline.data import comparison_store as cs
from spogw_dagster.pipeline.defs.assets import objective_comparison as oc
from spogw_dagster.pipeline.settings import load_config


def _frames():
    return pl.DataFrame({"query_id": ["q1", "q2"], "sample_idx": [0, 1]}), pl.DataFrame({"score": [0.5]})


def test_stored_candidates_come_back_only_under_their_fingerprint(tmp_path):
    folder = tmp_path / "comparison" / "0001" / "w4s.candidates"
    sampled, scores = _frames()
    assert cs.stored_own_data(folder, "fp-a") is None  # nothing stored yet
    cs.store_own_data(folder, "fp-a", sampled, scores)
    got = cs.stored_own_data(folder, "fp-a")
    assert got is not None and got[0].equals(sampled) and got[1].equals(scores)
    assert cs.stored_own_data(folder, "fp-b") is None  # another config or parent: made again
    cs.store_own_data(folder, "fp-b", scores, sampled)  # replaced whole
    assert cs.stored_own_data(folder, "fp-b")[0].equals(scores) and cs.stored_own_data(folder, "fp-a") is None
    assert sorted(p.name for p in folder.parent.iterdir()) == ["w4s.candidates"]  # no temp folder left


def test_a_folder_without_its_fingerprint_or_with_a_broken_file_is_not_reused(tmp_path):
    folder = tmp_path / "w4s.candidates"
    cs.store_own_data(folder, "fp", *_frames())
    (folder / "scores.parquet").write_bytes(b"not parquet")
    assert cs.stored_own_data(folder, "fp") is None
    (folder / "fingerprint.json").unlink()
    assert cs.stored_own_data(folder, "fp") is None


def test_the_fingerprint_names_the_config_the_parent_and_the_iteration():
    cfg = load_config(profile="tiny")
    other = load_config(profile="tiny", overrides={"generator": {"temperature": 0.3}})
    parent = SimpleNamespace(sha256="ab" * 32)
    fp = oc.own_data_fingerprint(cfg, parent, 1)
    assert fp == oc.own_data_fingerprint(cfg, SimpleNamespace(sha256="ab" * 32), 1)
    assert fp != oc.own_data_fingerprint(other, parent, 1)
    assert fp != oc.own_data_fingerprint(cfg, SimpleNamespace(sha256="cd" * 32), 1)
    assert fp != oc.own_data_fingerprint(cfg, parent, 2)
    assert oc.own_data_fingerprint(cfg, None, 0) != oc.own_data_fingerprint(cfg, parent, 0)  # the base model
    # what only training reads does not make the candidates again; what the executor reads does
    lr = load_config(profile="tiny", overrides={"training": {"learning_rate": 1e-5, "epochs": 3}})
    assert oc.own_data_fingerprint(lr, parent, 1) == fp
    assert oc.own_data_fingerprint(load_config(profile="tiny", overrides={"execution": {"runs": 2}}), parent, 1) != fp


def test_the_candidates_live_beside_the_methods_adapter(tmp_path):
    store = SimpleNamespace(root=tmp_path)
    assert cs.own_data_dir(store, "0003", "score_dpo") == tmp_path / "comparison" / "0003" / "score_dpo.candidates"
