"""Checkpoint selection on the validation split (`selection`): the rule, the config it runs under, its hash
contract, `spogw gc`, and (with the bundled model) the lora_checkpoint asset keeping or refusing a trained
adapter through a real Dagster run."""

from __future__ import annotations

import dataclasses
import json


import dagster as dg
import pytest

from spogw_dagster.contracts import Status
from spogw_dagster.evaluation import EvalResult
from spogw_dagster.core.rewards import Ladder
from spogw_dagster.pipeline.data import report_stats, tables
from spogw_dagster.pipeline.data.checkpoints import TRAINED_SUFFIX
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.domain import selection
from spogw_dagster.pipeline.domain.heldout import heldout_runs
from spogw_dagster.pipeline.domain.errors import DomainError
from spogw_dagster.pipeline.runs.cleanup import find_garbage
from spogw_dagster.pipeline.defs.versions import section_hash
from spogw_dagster.pipeline.settings import load_config

LADDER = Ladder(format=0.1, valid=0.2, executes=0.2, answer=0.5)
WF = "class Workflow:\n    async def run(self):\n        return await self.code_generate(instruction='x')\n"


def test_the_rule_keeps_a_tie_and_a_gain_and_refuses_a_loss():
    assert selection.decide(0.0, 0.0)
    assert selection.decide(1 / 16, 0.0)
    assert not selection.decide(-1 / 16, 0.0)
    assert not selection.decide(1 / 16, 0.1)  # 0.0625 is below a required gain of 0.1
    assert selection.decide(0.3 - 0.2, 0.1)  # 0.09999999999999998: a float tie still counts as reaching it


def _row(system, kind, q, status, score):
    hs = tables.HeldoutSample(system, kind, "greedy", q, 0, 5, 0, 0.0, "ok", WF, "stop", 12, None, None)
    res = EvalResult("humaneval", q, status, score, run_statuses=[status.value], run_scores=[score],
                     error="" if status == Status.OK else "why")
    return tables.heldout_row(0, "validation", hs, res, LADDER)


def _report(rows):
    return report_stats.summarize_heldout(tables.heldout_frame(rows), iteration=0, config_hash="h",
                                          split_ids_sha256="s", resamples=200, seed=0)


def test_the_verdict_pairs_queries_and_leaves_executor_errors_out():
    cand, prev = ("trained@0000", "checkpoint"), ("base", "previous")
    rows = [_row(*cand, "a", Status.OK, 1.0), _row(*prev, "a", Status.OK, 0.0),
            _row(*cand, "b", Status.OK, 0.0), _row(*prev, "b", Status.OK, 0.0),
            _row(*cand, "c", Status.OK, 0.0), _row(*prev, "c", Status.OK, 1.0),
            _row(*cand, "d", Status.OK, 1.0), _row(*prev, "d", Status.OK, 0.0),
            # the executor failed on the parent's run of e: not a pair, not a score
            _row(*cand, "e", Status.OK, 0.0), _row(*prev, "e", Status.EXECUTOR_ERROR, 0.0)]
    v = selection.verdict_of(_report(rows), 0.0, 5)
    # pairs a..d: candidate 2/4 against the parent's 1/4, Δ = (1 + 0 - 1 + 1) / 4
    assert v.delta == pytest.approx(0.25) and v.keep
    assert v.parent == pytest.approx(0.25)
    assert not selection.verdict_of(_report(rows), 0.3, 5).keep
    worse = [_row(*cand, "a", Status.OK, 0.0), _row(*prev, "a", Status.OK, 1.0),
             _row(*cand, "b", Status.OK, 1.0), _row(*prev, "b", Status.OK, 1.0)]
    v = selection.verdict_of(_report(worse), 0.0, 2)
    assert v.delta == pytest.approx(-0.5) and not v.keep
    assert "carried forward" in v.sentence("base")


def test_the_length_with_the_largest_paired_gain_wins_and_a_tie_goes_to_the_first_listed():
    # (epochs, validation answer, paired Δ vs π_{k-1}): the gain decides, not the raw answer
    assert selection.best_length([(2, 0.5, 0.0625), (3, 0.625, 0.1875)]) == 1
    assert selection.best_length([(2, 0.5625, 0.125), (3, 0.5, 0.0625)]) == 0
    assert selection.best_length([(2, 0.6, 0.0), (3, 0.5, 0.05)]) == 1  # 2 epochs met fewer executor errors
    assert selection.best_length([(3, 0.5, 0.0), (2, 0.5, 0.0)]) == 0  # listed first, not fewer epochs
    assert selection.best_length([(2, 0.1, 0.3 - 0.2), (3, 0.1, 0.1)]) == 0  # a float tie is a tie
    assert selection.best_length([(1, 0.0, -0.25), (2, 0.25, 0.0), (3, 0.25, 0.0)]) == 1
    with pytest.raises(DomainError, match="selection.epochs"):
        selection.best_length([])


def test_each_training_length_gets_its_own_verdict_from_one_report():
    two, three, prev = ("trained@0000", "checkpoint"), ("trained@0000.e3", "checkpoint"), ("base", "previous")
    rows = []
    # by hand over queries a..d: the parent 1/4; 2 epochs 2/4 (Δ +0.25); 3 epochs 3/4 (Δ +0.5)
    for q, p, a2, a3 in (("a", 1.0, 1.0, 1.0), ("b", 0.0, 1.0, 1.0), ("c", 0.0, 0.0, 1.0), ("d", 0.0, 0.0, 0.0)):
        rows += [_row(*prev, q, Status.OK, p), _row(*two, q, Status.OK, a2), _row(*three, q, Status.OK, a3)]
    report = _report(rows)
    v2 = selection.verdict_of(report, 0.0, 4, system="trained@0000")
    v3 = selection.verdict_of(report, 0.0, 4, system="trained@0000.e3")
    assert (v2.candidate, v2.delta) == (pytest.approx(0.5), pytest.approx(0.25))
    assert (v3.candidate, v3.delta) == (pytest.approx(0.75), pytest.approx(0.5))
    tried = ((2, v2.candidate, v2.delta), (3, v3.candidate, v3.delta))
    assert selection.best_length(tried) == 1
    said = dataclasses.replace(v3, epochs=3, tried=tried).sentence("base")
    assert said.startswith("training lengths 2 epochs 0.500 (Δ +0.250), 3 epochs 0.750 (Δ +0.500): 3 epochs is "
                           "the candidate")
    with pytest.raises(DomainError, match="trained@0000.e4"):
        selection.verdict_of(report, 0.0, 4, system="trained@0000.e4")
    # a length with no paired answer is left out, with why; with none paired, the first error is raised
    got, unpaired = selection.length_verdicts(report, 0.0, 4, [(2, "trained@0000"), (4, "trained@0000.e4"),
                                                              (3, "trained@0000.e3")])
    assert [e for e, _ in got] == [2, 3] and [e for e, _ in unpaired] == [4]
    assert got[1][1].delta == pytest.approx(0.5) and "trained@0000.e4" in unpaired[0][1]
    with pytest.raises(DomainError, match="trained@0000.e4"):
        selection.length_verdicts(report, 0.0, 4, [(4, "trained@0000.e4"), (5, "trained@0000.e5")])


def test_no_pair_is_an_error_that_says_so_not_a_verdict():
    rows = [_row("trained@0000", "checkpoint", "a", Status.OK, 1.0),
            _row("base", "previous", "a", Status.EXECUTOR_ERROR, 0.0)]
    with pytest.raises(DomainError, match="executor error"):
        selection.verdict_of(_report(rows), 0.0, 1)


def test_the_gate_measures_greedy_validation_with_its_own_seed_and_runs():
    cfg = load_config("answers", overrides={"selection": {"enabled": True, "seed": 7, "runs": 3},
                                            "report": {"samples": 4, "baselines": ["io", "cot"]}})
    v = selection.validation_config(cfg)
    assert (v.report.split, v.report.greedy, v.report.samples, v.report.baselines) == ("validation", True, 0, [])
    assert (v.report.seed, v.report.runs) == (7, 3)
    assert cfg.report.split == "test" and cfg.report.samples == 4  # the report itself is untouched
    # unset: execution.runs, never report.runs (not a section the checkpoint's code version covers)
    unset = load_config("answers", overrides={"selection": {"enabled": True}, "report": {"runs": 2},
                                              "execution": {"runs": 4}})
    assert heldout_runs(selection.validation_config(unset)) == 4


def test_selection_off_keeps_every_hash_and_on_reaches_only_the_checkpoint():
    off, on = load_config("answers"), load_config("answers", overrides={"selection": {"enabled": True}})
    explicit_off = load_config("answers", overrides={"selection": {"enabled": False, "min_delta": 0.5}})
    assert explicit_off.hash == off.hash  # off: the section is not hashed, so older assets stay valid
    assert on.hash != off.hash
    assert section_hash(on, "lora_checkpoint") != section_hash(off, "lora_checkpoint")
    for asset in ("sampled_workflows", "execution_scores", "screened_groups", "benchmark_report"):
        assert section_hash(on, asset) == section_hash(off, asset)
    assert on.train_config().identity() == off.train_config().identity()  # the trainer never sees it: no retraining
    # W4S's feedback queries can come off the validation split the gate scores
    w4s = load_config("answers", overrides={"selection": {"enabled": True}, "generator": {"anchors": False},
                                            "refinement": {"turns": 2, "feedback_split": "validation"}})
    assert section_hash(w4s, "lora_checkpoint") != section_hash(on, "lora_checkpoint")
    # ... and so can the comparison's W4S, with the loop's refinement off (a section not hashed then)
    fb = {"selection": {"enabled": True}, "refinement": {"feedback_split": "validation"}}
    plain = load_config("answers", overrides={**fb, "comparison": {"methods": ["spogw"]}})
    reserving = load_config("answers", overrides={**fb, "comparison": {"methods": ["spogw", "w4s"]}})
    assert (plain.reserved_validation(), reserving.reserved_validation()) == (0, reserving.feedback_queries())
    assert reserving.feedback_queries() > 0
    assert section_hash(reserving, "lora_checkpoint") != section_hash(plain, "lora_checkpoint")
    # a validation report scores the same reduced split, with the gate off too; reserving nothing adds no key
    rep = {"refinement": {"feedback_split": "validation"}, "report": {"split": "validation"}}
    plain_r = load_config("answers", overrides={**rep, "comparison": {"methods": ["spogw"]}})
    reserving_r = load_config("answers", overrides={**rep, "comparison": {"methods": ["spogw", "w4s"]}})
    assert section_hash(reserving_r, "benchmark_report") != section_hash(plain_r, "benchmark_report")
    assert reserving_r.hash != plain_r.hash  # the loop's "already reported" test goes by it
    assert plain_r.hash == load_config("answers", overrides={"report": {"split": "validation"}}).hash


def test_training_lengths_need_the_gate_reach_only_the_checkpoint_and_are_checked():
    on = load_config("answers", overrides={"selection": {"enabled": True}})
    unset = load_config("answers", overrides={"selection": {"enabled": True, "epochs": None}})
    lengths = load_config("answers", overrides={"selection": {"enabled": True, "epochs": [2, 3]}})
    assert unset.hash == on.hash and "epochs" not in on.canonical()["selection"]  # gated configs keep their hashes
    assert section_hash(lengths, "lora_checkpoint") != section_hash(on, "lora_checkpoint")
    for asset in ("sampled_workflows", "execution_scores", "screened_groups", "benchmark_report"):
        assert section_hash(lengths, asset) == section_hash(on, asset)
    assert lengths.selection.lengths(2) == (2, 3) and on.selection.lengths(2) == (2,)
    for bad, said in (({"enabled": False, "epochs": [2, 3]}, "selection is off"),
                      ({"enabled": True, "epochs": [2, 2]}, "repeats"), ({"enabled": True, "epochs": []}, "one or more"),
                      ({"enabled": True, "epochs": [0, 2]}, "between 1 and 100")):
        with pytest.raises(ValueError, match=said):
            load_config("answers", overrides={"selection": bad})


def test_gc_keeps_the_trained_folders_of_a_live_partition_only(tmp_path):
    store = AssetStore(tmp_path)
    ck = store.table_dir("lora_checkpoint")
    for name in ("0000", "0000" + TRAINED_SUFFIX, "0000" + TRAINED_SUFFIX + ".e3", "0001" + TRAINED_SUFFIX,
                 "0001" + TRAINED_SUFFIX + ".e3", "0000.other"):
        (ck / name).mkdir(parents=True)
    store.write_parquet("lora_checkpoint", "0000", tables.checkpoint_frame({"iteration": 0}))
    assert [p.name for p in find_garbage(store).adapters] == ["0000.other", "0001" + TRAINED_SUFFIX, "0001.trained.e3"]


@pytest.mark.model
def test_lora_checkpoint_refuses_then_keeps_the_trained_adapter(tmp_path):
    """ci profile, iteration 0, through the Dagster job: without selection, then with min_delta 1 (a gain no
    policy can show unless the parent scores 0 and the adapter 1 on every query: π_{k-1} goes on), then with
    min_delta -1 (any adapter: the same trained adapter becomes the checkpoint); training runs once."""
    from spogw_dagster.pipeline.data.catalog import query
    from spogw_dagster.pipeline.data.checkpoints import adapter_sha256
    from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME
    from spogw_dagster.pipeline.defs.sensors import JOB_NAME
    from spogw_dagster.pipeline.defs.wiring import build_definitions

    store = AssetStore(tmp_path / "assets")
    trained = store.adapter_dir("0000").with_name("0000" + TRAINED_SUFFIX)
    home = tmp_path / "home"
    home.mkdir()

    def run(inst, min_delta, only=None, epochs=None):
        over = {"benchmark": {"validation_queries": 2},
                "selection": {"enabled": min_delta is not None, "min_delta": min_delta or 0.0, "epochs": epochs}}
        job = build_definitions("ci", assets_dir=store.root, overrides=over).resolve_job_def(JOB_NAME)
        res = job.execute_in_process(partition_key="0000", instance=inst, asset_selection=only, raise_on_error=False)
        assert res.success, [e.message for e in res.all_events if e.is_failure]
        return store.read_parquet("lora_checkpoint", "0000").row(0, named=True)

    with dg.instance_for_test(temp_dir=str(home)) as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, ["0000"])
        ungated = run(inst, None)
        refused = run(inst, 1.0, only=[dg.AssetKey("lora_checkpoint")])
        stats = json.loads((store.adapter_dir("0000") / "training_stats.json").read_text())
        kept = run(inst, -1.0, only=[dg.AssetKey("lora_checkpoint")])
        after_kept = adapter_sha256(store.adapter_dir("0000"))
        rows = query(store, "select system, split, count(*) from selection_results group by all order by 1")
        lengths = run(inst, -1.0, only=[dg.AssetKey("lora_checkpoint")], epochs=[1, 3, 2])
        # each length's paired gain over the parent, by hand: the queries where both have a non-error answer
        gains = dict(query(store, """select c.system, avg(c.answer_score - p.answer_score) from selection_results c
            join selection_results p on c.query_id = p.query_id and p.system = 'base'
            where c.system <> 'base' and c.status <> 'executor_error' and p.status <> 'executor_error'
            group by all"""))
        (store.adapter_dir("0000") / "training_stats.json").unlink()  # <k> no longer a finished run: only .trained is
        off_again = run(inst, None, only=[dg.AssetKey("lora_checkpoint")])

    assert ungated["selected"] is None and not ungated["reused"]
    # turning selection on adopts the finished run from <k> instead of training again
    assert refused["trained"] and refused["selected"] is False and refused["reused"]
    assert refused["run_hash"] == ungated["run_hash"]
    assert stats["trained"] is False and "carried forward" in stats["reason"]
    assert refused["validation_answer"] - refused["validation_parent_answer"] < 1.0
    # the refused run's checkpoint was the carried-forward parent (at k = 0 a zero-B LoRA), not the trained adapter
    assert refused["adapter_sha256"] != adapter_sha256(trained)
    assert rows == [("base", "validation", 2), ("trained@0000", "validation", 2)]

    assert kept["selected"] is True and kept["reused"]  # the refused adapter is the one kept: no retraining
    assert kept["adapter_sha256"] == adapter_sha256(trained) == after_kept
    assert (kept["validation_answer"], kept["validation_parent_answer"]) == \
        (refused["validation_answer"], refused["validation_parent_answer"])  # the same draws (the call cache)
    # three training lengths (ci trains 1 epoch): the 1-epoch run is reused, 3 epochs trains and saves the 2-epoch
    # run on the way, all three write validation workflows, the best (a tie: the first listed) is judged, and at
    # min_delta -1 kept
    folder = {1: trained, **{e: trained.with_name(f"0000{TRAINED_SUFFIX}.e{e}") for e in (2, 3)}}
    st = {e: json.loads((folder[e] / "training_stats.json").read_text()) for e in (2, 3)}
    assert [st[e]["config"]["epochs"] for e in (2, 3)] == [2, 3]
    assert st[2]["snapshot_of_epochs"] == 3 and "snapshot_of_epochs" not in st[3]
    assert st[2]["steps"] == st[3]["steps"][:2 * kept["optimizer_steps"]]
    assert len(st[3]["steps"]) == 3 * kept["optimizer_steps"]
    assert len({ungated["run_hash"], st[2]["run_hash"], st[3]["run_hash"]}) == 3
    assert adapter_sha256(trained) == after_kept  # the 1-epoch adapter untouched
    system = {1: "trained@0000", 2: "trained@0000.e2", 3: "trained@0000.e3"}
    assert set(gains) == set(system.values())
    best = max(gains[system[e]] for e in (1, 3, 2))
    pick = next(e for e in (1, 3, 2) if gains[system[e]] >= best - 1e-12)  # listed order breaks a tie
    assert lengths["selected"] is True and lengths["selected_epochs"] == pick
    assert lengths["adapter_sha256"] == adapter_sha256(folder[pick])
    assert lengths["validation_answer"] - lengths["validation_parent_answer"] == pytest.approx(gains[system[pick]])
    assert lengths["reused"] == (pick == 1)
    assert refused["selected_epochs"] == kept["selected_epochs"] == 1  # no lengths listed: training.epochs
    # selection off again: the finished run is copied back from .trained (no training), and the gate's rows,
    # which no longer describe this checkpoint, are gone
    assert off_again["reused"] and off_again["selected"] is None and off_again["adapter_sha256"] == after_kept
    assert not store.parquet_path("selection_results", "0000").exists()
