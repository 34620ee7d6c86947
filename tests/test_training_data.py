"""The baselines' data paths, as their papers feed them (issues 9 and 38): ScoreFlow's Score-DPO pairs over each
query's workflows that ran, compared on the answer; W4S's RWR on each candidate that ran and scored above 0.05, once; log-probs at T = 1 for both (the GRPO family keeps
the sampling temperature), and the training_rows side table in the DuckDB catalog. Values by hand."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see spogw_dagster/models.py

import math
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import torch

from spogw_dagster.core import curation as C
from spogw_dagster.core.hyperparams import ObjectiveConfig
from spogw_dagster.core.training import TrainConfig, TrainExample, train_lora
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.data import training_inputs
from tiny_llama import save_tiny_llama, tiny_llama

# ----------------------------------------------------------------------------------------------------------------
# a fixed candidate set: query "a" scores 1, 0.5, 0 (+ one executor error, which is no candidate), query "b" has
# two equal scores (no pair) and a duplicate workflow text (near-duplicates stay: ScoreFlow pairs every workflow)

ROWS = [  # query, sample_idx, score, status, workflow
    ("a", 0, 1.0, "ok", "return await self.code_generate(instruction='x')"),
    ("a", 1, 0.5, "ok", "s = await self.code_generate(instruction='y')\nreturn s"),
    ("a", 2, 0.0, "ok", "return await self.custom(input='x', instruction='y')"),
    ("a", 3, None, "executor_error", "return await self.code_generate(instruction='z')"),
    ("b", 0, 0.3, "ok", "return await self.code_generate(instruction='x')"),
    ("b", 1, 0.3, "ok", "return await self.code_generate(instruction='x')"),
]
# ScoreFlow weights (s_w − s_l)^3 of query a's pairs: (0,1) 0.5^3 = 0.125, (0,2) 1^3 = 1, (1,2) 0.5^3 = 0.125;
# total 1.25, so probabilities 0.125/1.25 = 0.1, 1/1.25 = 0.8, 0.1. Query b: a tie, no pair.
PAIR_P = {(0, 1): 0.1, (0, 2): 0.8, (1, 2): 0.1}
PAIR_W = {(0, 1): 0.125, (0, 2): 1.0, (1, 2): 0.125}
# RWR weights exp(r / 0.4) of the five usable rows (the executor error is out); rwr_candidates weighs what it is
# given, W4S's own data are fewer (w4s_kept_candidates: ran, answer > 0.05; below)
RWR_W = {("a", 0): math.exp(2.5), ("a", 1): math.exp(1.25), ("a", 2): 1.0,
         ("b", 0): math.exp(0.75), ("b", 1): math.exp(0.75)}  # 12.182494, 3.490343, 1, 2.117000, 2.117000


def _samples() -> pl.DataFrame:
    return pl.DataFrame({"iteration": [0] * len(ROWS), "query_id": [r[0] for r in ROWS],
                         "sample_idx": [r[1] for r in ROWS], "workflow": [r[4] for r in ROWS],
                         "score": [r[2] for r in ROWS], "status": [r[3] for r in ROWS]},
                        schema_overrides={"score": pl.Float64()})


# Only in the pipeline's frames: a workflow that did not run, whose ladder score (0.3: format, valid) would beat
# a2's; neither paper trains on it
NOT_RUN = ("a", 4, 0.3, "runtime_error", "return foo()")


def _ladder(answer: float, status: str) -> float:
    """The pipeline frames' training reward: a ladder 0.25 + 0.75 · answer for a run, so ladder and answer differ."""
    return 0.25 + 0.75 * answer if status == "ok" else answer


def _pipeline_frames() -> tuple[pl.DataFrame, pl.DataFrame]:
    """sampled_workflows and execution_scores rows of the same candidates (what lora_checkpoint reads): the
    ROWS' scores as answer_score, a ladder score as score, and NOT_RUN."""
    sampled, scores = [], []
    for q, i, s, st, wf in ROWS + [NOT_RUN]:
        sampled.append({"iteration": 0, "query_id": q, "sample_idx": i, "prompt": f"prompt {q}",
                        "completion": f"completion {q}{i}", "workflow": wf, "parse_status": "ok",
                        "completion_token_ids": [100 + i, 200 + i], "logprobs": [-1.0, -2.0], "n_tokens": 2})
        a = 0.0 if s is None or st != "ok" else s
        scores.append({"iteration": 0, "query_id": q, "sample_idx": i, "status": st,
                       "score": s if st != "ok" else _ladder(a, st), "answer_score": a})
    return tables.typed_frame(sampled, tables.SAMPLED_SCHEMA), tables.execution_frame(scores)


# ----------------------------------------------------------------------------------------------------------------
# ScoreFlow pairs


def test_candidates_exclude_executor_errors_and_keep_near_duplicates():
    usable, dropped = C.scored_candidates(_samples())
    assert usable.select("query_id", "sample_idx").rows() == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    assert dropped.select("sample_idx", "reason").rows() == [(3, "executor_error")]


def test_pair_probabilities_by_hand():
    usable, _ = C.scored_candidates(_samples())
    cand = C.preference_pair_candidates(usable, power=3.0)
    got = {(r["chosen_idx"], r["rejected_idx"]): r for r in cand.iter_rows(named=True)}
    assert set(got) == set(PAIR_P) and set(cand["query_id"]) == {"a"}  # b's tie makes no pair
    for k in PAIR_P:
        assert got[k]["weight"] == pytest.approx(PAIR_W[k], abs=1e-12)
        assert got[k]["probability"] == pytest.approx(PAIR_P[k], abs=1e-12)
        assert got[k]["chosen_score"] > got[k]["rejected_score"]
    # power 1: weights 0.5, 1, 0.5 -> 0.25, 0.5, 0.25
    lin = {(r["chosen_idx"], r["rejected_idx"]): r["probability"]
           for r in C.preference_pair_candidates(usable, power=1.0).iter_rows(named=True)}
    assert lin == pytest.approx({(0, 1): 0.25, (0, 2): 0.5, (1, 2): 0.25})
    # pooled over queries: a second query with scores 0.75 / 0.25 adds weight 0.125; total 1.375
    extra = pl.concat([_samples(), pl.DataFrame({"iteration": [0, 0], "query_id": ["c", "c"], "sample_idx": [0, 1],
                                                 "workflow": ["p", "q"], "score": [0.75, 0.25],
                                                 "status": ["ok", "ok"]})])
    pooled = C.preference_pair_candidates(C.scored_candidates(extra)[0])
    by = {(r["query_id"], r["chosen_idx"], r["rejected_idx"]): r["probability"] for r in pooled.iter_rows(named=True)}
    assert by == pytest.approx({("a", 0, 1): 0.125 / 1.375, ("a", 0, 2): 1 / 1.375, ("a", 1, 2): 0.125 / 1.375,
                                ("c", 0, 1): 0.125 / 1.375})


def test_pair_budget_and_empirical_frequencies():
    usable, _ = C.scored_candidates(_samples())
    assert C.sample_preference_pairs(usable, None).height == 3  # None: one draw per candidate pair
    assert C.sample_preference_pairs(usable, 7).height == 7  # a fixed budget, with replacement
    n = 20000
    draws = C.sample_preference_pairs(usable, n, power=3.0, seed=0)
    assert draws["draw"].to_list() == list(range(n))
    freq = {(a, b): k / n for a, b, k in draws.group_by("chosen_idx", "rejected_idx").len().rows()}
    for k, p in PAIR_P.items():  # binomial sd <= sqrt(.8 * .2 / 20000) = 0.0028
        assert freq[k] == pytest.approx(p, abs=0.012)
    assert C.sample_preference_pairs(usable, 50, seed=1).equals(C.sample_preference_pairs(usable, 50, seed=1))


def test_score_dpo_training_data_is_explicit_pairs_of_workflows_that_ran_on_the_answer():
    sampled, scores = _pipeline_frames()
    ocfg = ObjectiveConfig(objective="score_dpo", dpo_num_pairs=40)
    examples, rows = training_inputs.score_dpo_training_data(sampled, scores, ocfg, iteration=0)
    assert len(examples) == rows.height == 80  # the budget: 40 draws, two rows each
    assert rows["role"].to_list() == ["chosen", "rejected"] * 40
    assert rows["draw"].to_list() == [d for d in range(40) for _ in (0, 1)]
    assert rows["example_idx"].to_list() == list(range(80))
    for k in range(40):
        w, l = examples[2 * k], examples[2 * k + 1]
        assert (w.role, l.role) == ("chosen", "rejected") and w.group_id == l.group_id == f"pair:{k}"
        assert w.score > l.score and w.prompt == l.prompt == "prompt a"
    # the executor error and the workflow that did not run (ladder 0.3 > a2's 0.25) never pair
    assert not {3, 4} & set(rows["sample_idx"].to_list()) and set(rows["query_id"]) == {"a"}
    # compared on the answer (1, 0.5, 0), not on the ladder (1, 0.625, 0.25)
    assert {e.score for e in examples} <= {1.0, 0.5, 0.0} and set(rows["score"].to_list()) <= {1.0, 0.5, 0.0}
    for r in rows.iter_rows(named=True):
        pair = (r["sample_idx"], rows["sample_idx"][r["example_idx"] + 1]) if r["role"] == "chosen" else None
        if pair:
            assert r["probability"] == pytest.approx(PAIR_P[pair]) and r["weight"] == pytest.approx(PAIR_W[pair])
    # the same draw on a rerun, another one in the next iteration; None: as many draws as candidate pairs
    assert training_inputs.score_dpo_training_data(sampled, scores, ocfg, iteration=0)[1].equals(rows)
    assert not training_inputs.score_dpo_training_data(sampled, scores, ocfg, iteration=1)[1]["sample_idx"].equals(
        rows["sample_idx"])
    assert training_inputs.score_dpo_training_data(sampled, scores, ObjectiveConfig(objective="score_dpo"), 0)[1].height == 6


# ----------------------------------------------------------------------------------------------------------------
# W4S RWR


def test_rwr_weights_by_hand():
    usable, _ = C.scored_candidates(_samples())
    w = C.rwr_candidates(usable, 0.4)
    got = {(q, i): x for q, i, x in w.select("query_id", "sample_idx", "weight").rows()}
    assert got == pytest.approx(RWR_W, abs=1e-9)
    assert got[("a", 0)] == pytest.approx(12.182494, abs=1e-6) and got[("a", 1)] == pytest.approx(3.490343, abs=1e-6)


def test_rwr_training_data_uses_each_kept_candidate_once():
    sampled, scores = _pipeline_frames()
    ocfg = ObjectiveConfig(objective="rwr", rwr_reward="score")  # the absolute ladder score as r
    examples, rows = training_inputs.rwr_training_data(sampled, scores, ocfg, iteration=0)
    keys = rows.select("query_id", "sample_idx").rows()
    # W4S keeps what ran with an answer above 0.05: not a2 (answer 0), a3 (executor error), a4 (did not run)
    assert keys == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert len(set(keys)) == len(keys) == len(examples) == 4
    assert set(rows["role"]) == {"candidate"} and rows["group_id"].null_count() == 4
    # r = the ladder 0.25 + 0.75 · answer: 1, 0.625, 0.475, 0.475; weight exp(r / 0.4)
    assert rows["weight"].to_list() == pytest.approx([math.exp(2.5), math.exp(1.5625)] + [math.exp(1.1875)] * 2)
    assert [e.score for e in examples] == pytest.approx([1.0, 0.625, 0.475, 0.475])
    assert [e.completion for e in examples] == ["completion a0", "completion a1", "completion b0", "completion b1"]


def test_the_papers_filters_by_hand():
    sampled, scores = _pipeline_frames()
    cands = training_inputs.training_candidates(sampled, scores)
    assert cands.select("sample_idx", "status").rows() == [(0, "ok"), (1, "ok"), (2, "ok"), (4, "runtime_error"),
                                                            (0, "ok"), (1, "ok")]
    # ScoreFlow: the four that ran (a0-a2, b0-b1 minus nothing), score = the answer, the ladder kept beside
    dpo = C.score_dpo_candidates(cands)
    assert dpo.select("query_id", "sample_idx", "score", "ladder_score").rows() == [
        ("a", 0, 1.0, 1.0), ("a", 1, 0.5, 0.625), ("a", 2, 0.0, 0.25), ("b", 0, 0.3, 0.475), ("b", 1, 0.3, 0.475)]
    # W4S: ran and answer > 0.05 (0.05 itself is dropped: "accuracy <= 0.05")
    assert C.w4s_kept_candidates(cands).select("query_id", "sample_idx").rows() == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    edge = cands.with_columns(pl.when(pl.col("sample_idx") == 1).then(0.05).otherwise(pl.col("answer_score"))
                              .alias("answer_score"))
    assert (("a", 1) not in C.w4s_kept_candidates(edge).select("query_id", "sample_idx").rows())
    with pytest.raises(ValueError, match="answer_score"):
        C.score_dpo_candidates(cands.drop("answer_score"))
    with pytest.raises(ValueError, match="answer_score"):
        C.w4s_kept_candidates(cands.drop("answer_score"))


def test_rwr_default_is_the_w4s_reward():
    # one turn: no history, so best so far = previous = 0. Answers a: 1, 0.5 -> 1, 1 (a2's 0 would get 0 - 0.1,
    # but W4S drops it: accuracy <= 0.05); b: 0.3, 0.3 -> 1, 1 (0.3 is not below 0.3). The executor error (a, 3)
    # has no reward, and the workflow that did not run (a, 4) is dropped: neither trains.
    sampled, scores = _pipeline_frames()
    examples, rows = training_inputs.rwr_training_data(sampled, scores, ObjectiveConfig(objective="rwr"), iteration=0)
    assert rows.select("query_id", "sample_idx").rows() == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert rows["score"].to_list() == pytest.approx([1.0] * 4)
    assert [e.score for e in examples] == pytest.approx([1.0] * 4)
    assert rows["weight"].to_list() == pytest.approx([math.exp(2.5)] * 4)
    with pytest.raises(Exception, match="rwr_reward"):
        ObjectiveConfig(objective="rwr", rwr_reward="ladder")


def test_spogw_keeps_the_sharpened_path_and_training_rows_reach_the_catalog(tmp_path):
    from spogw_dagster.pipeline.defs.assets.lora_checkpoint import write_training_rows
    from spogw_dagster.pipeline.data.catalog import query
    from spogw_dagster.pipeline.data.storage import AssetStore

    sampled, scores = _pipeline_frames()
    sharpened = pl.DataFrame({"iteration": [0, 0], "query_id": ["a", "a"], "group_id": ["g0", "g0"],
                              "sample_idx": [0, 2], "score": [1.0, 0.0], "role": ["top", "bottom"],
                              "rank": [0, 1], "group_mean": [0.5, 0.5], "group_std": [0.5, 0.5],
                              "advantage": [1.0, -1.0]})
    ex, rows = training_inputs.training_data("spogw", sharpened, sampled, scores, ObjectiveConfig(), 0)
    assert [e.canonical() for e in ex] == [e.canonical() for e in training_inputs.training_examples(sharpened, sampled)]
    assert all(e.role is None for e in ex) and rows["advantage"].to_list() == [1.0, -1.0]
    store = AssetStore(tmp_path)
    write_training_rows(store, "0000", rows)
    write_training_rows(store, "0001", training_inputs.rwr_training_data(sampled, scores, ObjectiveConfig(), 1)[1])
    write_training_rows(store, "0002", training_inputs.score_dpo_training_data(
        sampled, scores, ObjectiveConfig(dpo_num_pairs=4), 2)[1])
    assert query(store, "select objective, count(*) from training_rows group by 1 order by 1") == [
        ("rwr", 4), ("score_dpo", 8), ("spogw", 2)]  # rwr: the four W4S keeps


# ----------------------------------------------------------------------------------------------------------------
# log-probs at T = 1 for score_dpo and rwr, at the sampling temperature for spogw / grpo (tiny random model)

PROMPT_IDS = [11, 12, 13, 14, 15]
COMPLETIONS = [[21, 22, 23], [31, 32, 33, 34], [41, 42], [51, 52, 53, 54, 55]]
SCORES = [1.0, 0.75, 0.25, 0.0]
ADV = [1.5, 0.5, -0.25, -1.0]
T_SAMPLE = 0.25


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny random Llama of tests/tiny_llama.py with a larger init scale, so that the temperature visibly
    changes the log-probs."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", *tiny_llama(initializer_range=0.2))


@pytest.fixture(scope="module")
def plain(tiny_model):
    """T -> per-row token log-probs log softmax(logits / T) from one plain, unpadded forward per row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    out = {}
    with torch.no_grad():
        for T in (1.0, T_SAMPLE):
            rows = []
            for comp in COMPLETIONS:
                seq = torch.tensor([PROMPT_IDS + comp])
                lp = torch.log_softmax(model(seq).logits[0, :-1].double() / T, -1)
                pos = torch.arange(len(PROMPT_IDS) - 1, seq.shape[1] - 1)
                rows.append(lp[pos, seq[0, pos + 1]].tolist())
            out[T] = rows
    return out


def _examples() -> list[TrainExample]:
    return [TrainExample(f"p{i}", f"c{i}", advantage=ADV[i], score=SCORES[i], group_id="g",
                         prompt_token_ids=list(PROMPT_IDS), completion_token_ids=list(COMPLETIONS[i]))
            for i in range(4)]


def _cfg(objective: str, **kw) -> TrainConfig:
    base = dict(objective=objective, temperature=T_SAMPLE, beta=0.1, epochs=1, batch_size=4, learning_rate=1e-3,
                eval_after=True, seed=0)
    return TrainConfig(**{**base, **kw})


def _means(rows) -> list[float]:
    return [sum(r) / len(r) for r in rows]


def test_logprob_temperature_property():
    for name in ("score_dpo", "rwr"):
        assert ObjectiveConfig(objective=name).logprob_temperature(0.5) == 1.0
        assert TrainConfig(objective=name, temperature=0.5).logprob_T == 1.0
    for name in ("spogw", "grpo", "grpo_nokl"):
        assert ObjectiveConfig(objective=name).logprob_temperature(0.5) == 0.5
        assert TrainConfig(objective=name, temperature=0.5).logprob_T == 0.5


def test_the_temperature_matters_on_this_model(plain):
    """Otherwise the tests below could not tell T = 1 from T = 0.25."""
    gap = max(abs(a - b) for a, b in zip(_means(plain[1.0]), _means(plain[T_SAMPLE])))
    assert gap > 0.05


def test_rwr_first_step_uses_t1_logprobs(tiny_model, tmp_path, plain):
    """Step 0 (π_θ = base): loss = mean_i exp(s_i/0.4) · (−mean_t log π(o_{i,t})) with T = 1 log-probs, although
    the data were sampled at T = 0.25."""
    def want(T):
        return sum(math.exp(s / 0.4) * -m for s, m in zip(SCORES, _means(plain[T]))) / 4

    res = train_lora(_examples(), _cfg("rwr"), tmp_path / "rwr", base_model=tiny_model)
    s0 = res.stats["steps"][0]
    assert res.stats["summary"]["logprob_temperature"] == 1.0
    assert s0["loss"] == pytest.approx(want(1.0), rel=1e-5)
    assert abs(want(T_SAMPLE) - want(1.0)) > 1e-3 * abs(want(1.0))  # what the old code computed differs


def test_score_dpo_reference_logprobs_at_t1(tiny_model, tmp_path, plain):
    """score_dpo: π_ref (recorded as each example's log-prob before training) at T = 1; explicit pairs."""
    ex = _examples()
    pairs = [replace(ex[i], group_id=f"pair:{k}", role=r)
             for k, (w, l) in enumerate([(0, 2), (1, 3)]) for i, r in ((w, "chosen"), (l, "rejected"))]
    res = train_lora(pairs, _cfg("score_dpo"), tmp_path / "dpo", base_model=tiny_model)
    assert res.stats["summary"]["logprob_temperature"] == 1.0
    before = [e["mean_logp_before"] for e in res.stats["examples"]]
    order = [0, 2, 1, 3]
    assert before == pytest.approx([_means(plain[1.0])[i] for i in order], abs=1e-5)
    assert res.stats["steps"][0]["n_pairs"] == 2 and res.stats["steps"][0]["loss"] == pytest.approx(math.log(2))


@pytest.mark.parametrize("objective", ["spogw", "grpo"])
def test_grpo_family_keeps_the_sampling_temperature(tiny_model, tmp_path, plain, objective):
    """spogw / grpo: π_old (each example's log-prob before training) at the sampling temperature."""
    res = train_lora(_examples(), _cfg(objective), tmp_path / objective, base_model=tiny_model)
    assert res.stats["summary"]["logprob_temperature"] == T_SAMPLE
    before = [e["mean_logp_before"] for e in res.stats["examples"]]
    assert before == pytest.approx(_means(plain[T_SAMPLE]), abs=1e-5)
    assert before != pytest.approx(_means(plain[1.0]), abs=1e-3)


def test_score_dpo_needs_explicit_pairs_and_keeps_each_pair_in_one_micro_batch(tiny_model, tmp_path):
    ex = _examples()
    with pytest.raises(ValueError, match="explicit"):  # the old in-group draw is no training path any more
        train_lora(ex, _cfg("score_dpo"), tmp_path / "x", base_model=tiny_model)
    pairs = [replace(ex[i], group_id=f"pair:{k}", role=r)
             for k, (w, l) in enumerate([(0, 2), (1, 3), (0, 3)]) for i, r in ((w, "chosen"), (l, "rejected"))]
    res = train_lora(pairs, _cfg("score_dpo", batch_size=3, eval_after=False), tmp_path / "b3",
                     base_model=tiny_model)
    # batch_size 3 fits one pair (two rows) per micro-batch: three steps of one pair each
    assert [s["rows"] for s in res.stats["steps"]] == [2, 2, 2]
    assert [s["n_pairs"] for s in res.stats["steps"]] == [1, 1, 1]
    with pytest.raises(ValueError, match="must exceed"):
        bad = [replace(p, role="rejected" if p.role == "chosen" else "chosen") for p in pairs[:2]]
        train_lora(bad, _cfg("score_dpo"), tmp_path / "bad", base_model=tiny_model)


# ----------------------------------------------------------------------------------------------------------------
# training.min_queries: too narrow a training set is not trained on


def test_require_queries_drops_data_on_too_few_queries_and_says_why():
    sampled, scores = _pipeline_frames()
    sharpened = pl.DataFrame({"iteration": [0] * 4, "query_id": ["a", "a", "b", "b"], "group_id": ["g0", "g0", "g1", "g1"],
                              "sample_idx": [0, 2, 0, 1], "score": [1.0, 0.0, 0.6, 0.3], "role": ["top", "bottom"] * 2,
                              "rank": [0, 1, 0, 1], "group_mean": [0.5, 0.5, 0.45, 0.45],
                              "group_std": [0.5, 0.5, 0.15, 0.15], "advantage": [1.0, -1.0, 1.0, -1.0]})
    ex, rows = training_inputs.training_data("spogw", sharpened, sampled, scores, ObjectiveConfig(), 0)
    assert len(ex) == 4 and rows["query_id"].n_unique() == 2
    # two queries meet a minimum of 2 (and the default 1): the data passes unchanged
    for k in (1, 2):
        kept, kept_rows, why = training_inputs.require_queries(ex, rows, k)
        assert why is None and kept is ex and kept_rows.equals(rows)
    # a minimum of 3: nothing is trained on, the rows table is empty with its schema, and the reason names the knob
    kept, kept_rows, why = training_inputs.require_queries(ex, rows, 3)
    assert kept == [] and kept_rows.height == 0 and kept_rows.schema == rows.schema
    assert why == "training data on 2 queries only, fewer than training.min_queries = 3"
    one = rows.filter(pl.col("query_id") == "a")
    assert training_inputs.require_queries(ex[:2], one, 2)[2] == \
        "training data on 1 query only, fewer than training.min_queries = 2"
    # no rows at all is the objective's own no-data case: passed through without a reason of this check
    assert training_inputs.require_queries([], rows.clear(), 5)[2] is None


def test_anchor_examples_are_marked_off_policy_only_with_their_own_loss():
    # (a, 2) is an anchor (finish_reason "anchor"); an off_policy_loss other than "clipped" marks its example off-policy and changes the data
    # hash; unset, the examples (and their hash) are what they were before the option
    from spogw_dagster.core.training.identity import data_hash
    from spogw_dagster.pipeline.data.tables import ANCHOR_FINISH

    sampled, scores = _pipeline_frames()
    sampled = sampled.with_columns(pl.when((pl.col("query_id") == "a") & (pl.col("sample_idx") == 2))
                                   .then(pl.lit(ANCHOR_FINISH)).otherwise(pl.lit("stop")).alias("finish_reason"))
    sharpened = pl.DataFrame({"iteration": [0, 0], "query_id": ["a", "a"], "group_id": ["g0", "g0"],
                              "sample_idx": [0, 2], "score": [1.0, 0.0], "role": ["top", "bottom"],
                              "rank": [0, 1], "group_mean": [0.5, 0.5], "group_std": [0.5, 0.5],
                              "advantage": [1.0, -1.0]})
    plain, _ = training_inputs.training_data("spogw", sharpened, sampled, scores, ObjectiveConfig(), 0)
    shaped, _ = training_inputs.training_data("spogw", sharpened, sampled, scores,
                                              ObjectiveConfig(off_policy_loss="log_prob"), 0)
    assert [e.off_policy for e in plain] == [False, False]
    assert [e.off_policy for e in shaped] == [False, True]
    assert "off_policy" not in plain[1].canonical() and shaped[1].canonical()["off_policy"] is True
    assert data_hash(plain) == data_hash(training_inputs.training_examples(sharpened, sampled))
    assert data_hash(shaped) != data_hash(plain)


def test_an_off_policy_example_reaches_the_loss_as_an_off_policy_row():
    """TrainExample.off_policy -> Item -> LossBatch: with log_prob, the marked row's first token (ρ = 10, beyond the
    clip) keeps its gradient −Â/|o|/B = −1/2/2; unmarked, the clip cuts it (gradient 0). Token ids given, so no
    tokenizer is read."""
    import torch

    from spogw_dagster.core.training import TrainConfig, TrainExample
    from spogw_dagster.core.training.batching import tokenize
    from spogw_dagster.core.training.passes import micro_batch_objective

    cfg = TrainConfig(objective="grpo_nokl", off_policy_loss="log_prob", old_logprobs="data")
    lp = [[math.log(0.1), math.log(0.5)], [math.log(0.5), math.log(0.5)]]
    for off, first in ((True, -0.25), (False, 0.0)):
        exs = [TrainExample("p", "c", advantage=1.0, old_logprobs=[math.log(0.01), math.log(0.5)],
                            prompt_token_ids=[1], completion_token_ids=[5, 6], off_policy=off),
               TrainExample("p", "d", advantage=-1.0, old_logprobs=[math.log(0.5), math.log(0.5)],
                            prompt_token_ids=[1], completion_token_ids=[7, 8])]
        items = tokenize(exs, None, cfg)
        assert [it.off_policy for it in items] == [off, False]
        logp = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
        out = micro_batch_objective(items, cfg, logp, torch.ones(2, 2), "cpu")
        (g,) = torch.autograd.grad(out.loss, logp)
        assert g[0, 0].item() == pytest.approx(first, abs=1e-12)


@pytest.mark.parametrize("objective,beta", [("spogw", 0.3), ("spogw", 0.05), ("grpo", 0.3), ("grpo_nokl", 0.3)])
def test_the_configs_beta_is_the_beta_the_loss_applies(objective, beta):
    """β from the pipeline's `training:` section to the KL term, through the trainer's own path (train_config ->
    micro_batch_objective -> the loss): one-token rows, π_θ = 0.5 and π_ref = 0.25 on both, so each row's k3 is
    e^d − d − 1 with d = log 0.5: 0.5 + log 2 − 1 = 0.1931471806. spogw keeps the KL of the Â > 0 row only:
    β·(0.19315 + 0)/2; grpo both rows: β·0.19315; grpo_nokl none, whatever β says."""
    import torch

    from spogw_dagster.core.training import TrainExample
    from spogw_dagster.core.training.batching import tokenize
    from spogw_dagster.core.training.passes import micro_batch_objective
    from spogw_dagster.pipeline.settings import load_config

    cfg = load_config("ci", overrides={"training": {"objective": objective, "beta": beta}}).train_config()
    exs = [TrainExample("p", "c", advantage=a, old_logprobs=[math.log(0.5)], prompt_token_ids=[1],
                        completion_token_ids=[5 + i]) for i, a in enumerate((1.0, -1.0))]
    items = tokenize(exs, None, cfg)
    for it in items:
        it.ref = [math.log(0.25)]
    logp = torch.full((2, 1), math.log(0.5), dtype=torch.float64)
    out = micro_batch_objective(items, cfg, logp, torch.ones(2, 1), "cpu")
    k3 = 0.5 + math.log(2) - 1
    expected = {"spogw": beta * k3 / 2, "grpo": beta * k3, "grpo_nokl": 0.0}[objective]
    assert out.kl_loss.item() == pytest.approx(expected, abs=1e-12)
