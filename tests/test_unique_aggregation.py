"""Training on unique workflows (TrainConfig.aggregate_unique) equals training on the per-group rows.

A workflow in several sharpened groups is one row per group in the data; the GRPO-family loss summed over
those rows is one term with A⁺ = Σ positive Â (paired with min(ρ, clip ρ)), A⁻ = Σ negative Â (paired with
max(ρ, clip ρ)) and the KL weight n⁺ = #groups with Â > 0 (grpo: all groups), normalised by the number of
per-group rows. Proven here in float64 to <= 1e-10 (loss, gradients, metrics) on the objective; to <= 1e-6
relative (the model's own float noise across batchings) on one float64 optimizer step of the trainer across
several micro-batches; and in float32 on train_lora's first step.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see spogw_dagster/models.py

import math
from pathlib import Path

import polars as pl
import pytest
import torch

from spogw_dagster.core.curation import curate
from spogw_dagster.core.hyperparams import ConfigError, CurationConfig, ObjectiveConfig
from spogw_dagster.core.training.objectives import (
    LossBatch,
    compute_loss,
    unique_advantage_weights,
)
from spogw_dagster.core.training import TrainConfig, TrainExample, train_lora
from tiny_llama import save_tiny_llama, tiny_llama

GRPO_FAMILY = ("spogw", "grpo", "grpo_nokl")
TOL = 1e-10  # float64
STEP_METRICS = ("loss", "policy_loss", "kl_loss", "kl", "kl_mask_frac", "advantage_mean", "grad_norm")
METRICS = ("loss", "policy_loss", "kl_loss", "kl", "clip_frac", "kl_mask_frac", "ratio_mean", "advantage_mean")


# --------------------------------------------------------------------------------------------------------------
# objective level


def _unique_data(U: int, T: int, seed: int):
    """U workflows of different lengths: logp (a float64 leaf), π_old away from it (clipping active), π_ref."""
    g = torch.Generator().manual_seed(seed)
    lengths = [max(1, T - (i % 4)) for i in range(U)]
    mask = torch.zeros(U, T, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    logp = (-torch.rand(U, T, generator=g, dtype=torch.float64) * 3 - 0.05).requires_grad_(True)
    old = logp.detach() + torch.randn(U, T, generator=g, dtype=torch.float64) * 0.4  # ρ = e^{±0.4·z}
    ref = logp.detach() + torch.randn(U, T, generator=g, dtype=torch.float64) * 0.3
    pad = mask == 0
    old = old.masked_fill(pad, float("nan"))  # padding may hold anything
    ref = ref.masked_fill(pad, float("inf"))
    return logp, old, ref, mask


def _losses(objective: str, groups: list[list[tuple[int, float]]], logp, old, ref, mask, beta: float):
    """(per-group output, its d loss/d logp; aggregated output, its gradient) for groups of (workflow, Â)."""
    cfg = ObjectiveConfig(objective=objective, beta=beta, clip_eps=0.2)
    rows = [(w, a) for grp in groups for (w, a) in grp]
    idx = torch.tensor([w for w, _ in rows])
    per = LossBatch(logp=logp[idx], mask=mask[idx], old_logp=old[idx], ref_logp=ref[idx],
                    advantages=torch.tensor([a for _, a in rows], dtype=torch.float64))
    out_rows = compute_loss(objective, per, cfg)
    g_rows, = torch.autograd.grad(out_rows.loss, logp)

    uniq = sorted({w for w, _ in rows})
    weights = [unique_advantage_weights([a for w2, a in rows if w2 == w]) for w in uniq]
    u = torch.tensor(uniq)
    col = lambda k: torch.tensor([wt[k] for wt in weights], dtype=torch.float64)
    agg = LossBatch(logp=logp[u], mask=mask[u], old_logp=old[u], ref_logp=ref[u],
                    adv_pos=col(0), adv_neg=col(1), n_pos=col(2), n_neg=col(3), count=col(4))
    out_agg = compute_loss(objective, agg, cfg)
    g_agg, = torch.autograd.grad(out_agg.loss, logp)
    return out_rows, g_rows, out_agg, g_agg, len(rows), len(uniq)


def _close(a, b, abs_tol: float, rel_tol: float) -> bool:
    """Both absent (e.g. no `kl` without a reference), or equal within the tolerances."""
    return (a is None and b is None) or (a is not None and b is not None and a == pytest.approx(b, abs=abs_tol, rel=rel_tol))


def _assert_equal(out_rows, g_rows, out_agg, g_agg, tol=TOL):
    a, b = out_rows.metrics(), out_agg.metrics()
    for k in METRICS:
        if k in a or k in b:
            t = 1e-6 if k == "clip_frac" else tol  # the per-group loss counts clipped tokens in float32
            assert b[k] == pytest.approx(a[k], abs=t, rel=t), k
    assert torch.allclose(g_agg, g_rows, atol=tol, rtol=0), float((g_agg - g_rows).abs().max())
    assert float(g_rows.abs().max()) > 1e-4  # a gradient worth comparing


# Hand-built overlapping groups over 6 workflows: workflow 0 has Â > 0 in some groups and Â < 0 in another,
# workflow 3 has an Â = 0 row (no loss, no mKL weight, but it counts in the mean), workflow 5 is in one group.
HAND_GROUPS = [
    [(0, 1.2), (1, 0.4), (2, -0.6), (3, -1.0)],
    [(0, 0.9), (2, 0.3), (3, 0.0), (4, -1.2)],
    [(1, 1.1), (4, 0.2), (0, -0.5), (2, -0.8)],
    [(0, 1.0), (1, 1.0), (4, -1.0), (5, -1.0)],
    [(2, 1.3), (0, 0.7), (3, -0.9), (1, -1.1)],
]


@pytest.mark.parametrize("objective", GRPO_FAMILY)
@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5])
def test_objective_equal_on_hand_built_groups(objective, beta):
    logp, old, ref, mask = _unique_data(6, 7, seed=1)
    out_rows, g_rows, out_agg, g_agg, R, U = _losses(objective, HAND_GROUPS, logp, old, ref, mask, beta)
    assert (R, U) == (20, 6)
    assert out_rows.clip_frac > 0.05  # clipping is active on both signs of Â
    if objective != "grpo_nokl" and beta > 0:
        assert out_rows.kl_loss.item() > 1e-4  # the KL term contributes
        if objective == "spogw":
            assert out_rows.metrics()["kl_mask_frac"] == pytest.approx(10 / 20)  # 10 of 20 rows have Â > 0
    _assert_equal(out_rows, g_rows, out_agg, g_agg)


def test_mixed_sign_workflow_is_not_the_net_advantage():
    """A⁺ and A⁻ must stay apart: one row with the net Â = A⁺ + A⁻ is a different loss when the clip is active."""
    logp, old, ref, mask = _unique_data(2, 5, seed=3)
    groups = [[(0, 1.0), (1, -1.0)], [(0, -1.0), (1, 1.0)]]  # workflow 0: net Â = 0, but two clipped terms
    out_rows, g_rows, out_agg, g_agg, _, _ = _losses("spogw", groups, logp, old, ref, mask, 0.1)
    _assert_equal(out_rows, g_rows, out_agg, g_agg)
    net = LossBatch(logp=logp, mask=mask, old_logp=old, ref_logp=ref,
                    advantages=torch.zeros(2, dtype=torch.float64))
    assert abs(compute_loss("spogw", net).loss.item() * 2 / 4 - out_rows.loss.item()) > 1e-3


def _paper_groups(m: int, n: int, t: int, seed: int) -> list[list[tuple[int, float]]]:
    """The real curation on synthetic scores: all C(m, n) groups, sharpened to top-t/bottom-t, with Â."""
    g = torch.Generator().manual_seed(seed)
    scores = (torch.randint(0, 4, (m,), generator=g).double() / 3).tolist()
    df = pl.DataFrame({"iteration": [0] * m, "query_id": ["q"] * m, "sample_idx": list(range(m)),
                       "workflow": [f"def run():\n    return {i} * x + {i * i}\n" for i in range(m)],
                       "score": scores, "status": ["ok"] * m})
    members = curate(df, CurationConfig(m=m, n=n, t=t, g_max=math.comb(m, n), tau_sim=1.0)).members
    out: dict[str, list[tuple[int, float]]] = {}
    for r in members.sort(["group_id", "rank"]).iter_rows(named=True):
        out.setdefault(r["group_id"], []).append((int(r["sample_idx"]), float(r["advantage"])))
    return list(out.values())


@pytest.mark.parametrize("objective", GRPO_FAMILY)
def test_objective_equal_on_paper_style_grouping(objective):
    """All C(10, 8) = 45 groups of a query, sharpened to 2t = 6 (270 rows of 9 workflows); the seed gives
    workflows above their group's mean in some groups and below it in others."""
    groups = _paper_groups(10, 8, 3, seed=3)
    assert len(groups) == 45
    logp, old, ref, mask = _unique_data(10, 9, seed=2)
    out_rows, g_rows, out_agg, g_agg, R, U = _losses(objective, groups, logp, old, ref, mask, 0.1)
    assert R == 6 * len(groups) and U <= 10
    both = {w for grp in groups for w, a in grp if a > 0} & {w for grp in groups for w, a in grp if a < 0}
    assert both  # some workflow is on top in one group and at the bottom in another
    _assert_equal(out_rows, g_rows, out_agg, g_agg)


def test_unique_weights_and_validation():
    assert unique_advantage_weights([1.0, -0.5, 0.0, 2.0]) == (3.0, -0.5, 2, 1, 4)
    logp, old, ref, mask = _unique_data(2, 3, seed=0)
    one = torch.ones(2, dtype=torch.float64)
    with pytest.raises(ValueError, match="missing"):
        compute_loss("spogw", LossBatch(logp=logp, mask=mask, old_logp=old, ref_logp=ref, adv_pos=one))
    with pytest.raises(ValueError, match="adv_pos must be"):
        compute_loss("spogw", LossBatch(logp=logp, mask=mask, old_logp=old, ref_logp=ref, adv_pos=-one,
                                        adv_neg=-one, n_pos=one, n_neg=one, count=one * 2))
    with pytest.raises(ValueError, match="count"):
        compute_loss("spogw", LossBatch(logp=logp, mask=mask, old_logp=old, ref_logp=ref, adv_pos=one,
                                        adv_neg=-one, n_pos=one, n_neg=one, count=one))
    with pytest.raises(ConfigError):
        TrainConfig(aggregate_unique=1)  # type: ignore[arg-type]
    assert TrainConfig().aggregates and TrainConfig(objective="grpo_nokl").aggregates
    assert not TrainConfig(aggregate_unique=False).aggregates
    assert not TrainConfig(objective="rwr").aggregates and not TrainConfig(objective="score_dpo").aggregates


# --------------------------------------------------------------------------------------------------------------
# trainer level (the tiny random Llama of tests/test_trainer.py)


@pytest.fixture(scope="module")
def tiny():
    """(model config, tokenizer) of a tiny random Llama with SmolLM2's tokenizer."""
    return tiny_llama(initializer_range=0.2)


@pytest.fixture(scope="module")
def tiny_folder(tiny, tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", *tiny)


PROMPTS = ["Write a workflow.\nTask: add two numbers.\n", "Write a workflow.\nTask: sort a list of words.\n"]
BODIES = ["    a = generate(q)\n    return a\n", "    s = ensemble(q, 3)\n    return s\n", "    pass\n",
          "    x = review(q)\n    return x\n", "    return await self.test(solution=False)\n", "    y = 1\n"]


def _group_examples(tok, score, seed: int = 0) -> list[TrainExample]:
    """Per-group rows for two prompts: the hand-built groups over each prompt's workflows, with recorded π_old =
    the model's log-probs (`score(prompt_ids, completion_ids)`) + N(0, 0.3²) noise, the same numbers for every
    copy of a workflow: ρ is e^{±0.3·z} at the start, so the clip is active on both sides."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p, prompt in enumerate(PROMPTS):
        pids = list(tok(prompt)["input_ids"])
        cids = [list(tok(b, add_special_tokens=False)["input_ids"]) for b in BODIES]
        lps = score([pids] * len(cids), cids)
        old = [(torch.tensor(lp, dtype=torch.float64) + torch.randn(len(lp), generator=g, dtype=torch.float64) * 0.3)
               .tolist() for lp in lps]
        for k, grp in enumerate(HAND_GROUPS):
            for w, a in grp:
                out.append(TrainExample(prompt, BODIES[w], advantage=a, score=0.5 + a / 4, group_id=f"{p}:{k}",
                                        old_logprobs=old[w], prompt_token_ids=pids, completion_token_ids=cids[w]))
    return out


@pytest.mark.parametrize("objective", GRPO_FAMILY)
def test_optimizer_step_gradient_equal_float64(tiny, objective):
    """One optimizer step over all the data, cut into several micro-batches of different sizes and prompts
    (batch_size 3): the accumulated LoRA gradients of the per-group rows and of the unique rows agree."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from spogw_dagster.core.training.batching import aggregate, micro_batches, tokenize
    from spogw_dagster.core.training.optimize import optimizer_step

    mcfg, tok = tiny
    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(mcfg).double(),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():  # LoRA B = 0 at init: give both factors a value so every LoRA weight has a gradient
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.2)
    model.train()
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    cfg = TrainConfig(objective=objective, beta=0.2, temperature=0.7, old_logprobs="data", batch_size=3,
                      max_grad_norm=None, lora_r=4, lora_alpha=8)
    from spogw_dagster.core.training.logprobs import score_completions

    def score(prompts, completions):
        return score_completions(model, prompts, completions, tok.pad_token_id, temperature=cfg.temperature)

    items = tokenize(_group_examples(tok, score), tok, cfg)
    g = torch.Generator().manual_seed(5)
    ref_by_workflow: dict[tuple, list[float]] = {}
    for it in items:
        it.ref = ref_by_workflow.setdefault(tuple(it.prompt_ids + [-1] + it.completion_ids),
                                            (torch.tensor(it.old) + torch.randn(len(it.old), generator=g) * 0.3).tolist())
    rows = aggregate(items)
    assert len(items) == 40 and len(rows) == 12 and sum(r.count for r in rows) == 40
    opt = torch.optim.SGD(params, lr=0.0)

    def step(data):
        batches = micro_batches(data, cfg, 0)
        st = optimizer_step(model, params, opt, batches, cfg, tok.pad_token_id,
                             torch.device("cpu"))
        return st, [p.grad.detach().clone() for p in params], len(batches)

    st_rows, g_rows, nb_rows = step(items)
    st_agg, g_agg, nb_agg = step(rows)
    assert (nb_rows, nb_agg) == (14, 4)  # 40 rows vs 12 unique rows in micro-batches of 3
    assert st_rows["group_rows"] == st_agg["group_rows"] == 40 and st_agg["rows"] == 12
    # step metrics are micro-batch metrics averaged by row share: the row means (loss, kl, ...) are invariant to
    # the batching; the token fractions (clip_frac, ratio_mean) are not (equal on one batch: objective tests)
    for k in STEP_METRICS:
        assert _close(st_agg.get(k), st_rows.get(k), 1e-8, 1e-8), k  # the step rounds metrics to 1e-8
    assert st_rows["clip_frac"] > 0.05
    diff = max(float((a - b).abs().max()) for a, b in zip(g_agg, g_rows))
    scale = max(float(b.abs().max()) for b in g_rows)
    # the model's backward is not bit-stable across batchings (~1e-7 relative even in float64: two batchings
    # of the per-group rows differ as much); the objective tests above prove the algebra to 1e-10
    assert scale > 1e-2 and diff <= 1e-6 * scale, (diff, scale)


@pytest.mark.parametrize("objective", ["spogw", "grpo_nokl"])
def test_train_lora_first_step_equal(tiny_folder, tiny, tmp_path, objective):
    """End to end (float32): train_lora with aggregate_unique True vs False, one optimizer step over all the
    data (grad_accum covers every micro-batch): the same first-step loss, gradient norm and metrics, π_ref
    computed once per unique workflow; 12 rows trained instead of 40."""
    from spogw_dagster.core.training import score_examples

    _, tok = tiny

    def score(prompts, completions):
        ex = [TrainExample("", "", prompt_token_ids=p, completion_token_ids=c) for p, c in zip(prompts, completions)]
        return score_examples(ex, tiny_folder, temperature=0.7)

    ex = _group_examples(tok, score)
    base = dict(objective=objective, beta=0.2, temperature=0.7, old_logprobs="data", batch_size=4, grad_accum=64,  # noqa: C408
                epochs=1, learning_rate=1e-3, eval_after=True, lora_r=4, lora_alpha=8)
    res = {agg: train_lora(ex, TrainConfig(**base, aggregate_unique=agg), tmp_path / f"{objective}-{agg}",
                           base_model=tiny_folder) for agg in (False, True)}
    s_rows, s_agg = res[False].stats["steps"], res[True].stats["steps"]
    assert len(s_rows) == len(s_agg) == 1
    assert (res[False].stats["n_train_rows"], res[True].stats["n_train_rows"]) == (40, 12)
    assert s_rows[0]["rows"] == 40 and s_agg[0]["rows"] == 12 and s_agg[0]["group_rows"] == 40
    assert s_rows[0]["clip_frac"] > 0.05
    for k in STEP_METRICS:
        assert _close(s_agg[0].get(k), s_rows[0].get(k), 2e-6, 2e-5), k
    # one entry per input example either way, each copy reporting its workflow's numbers
    e_rows, e_agg = res[False].stats["examples"], res[True].stats["examples"]
    assert [e["index"] for e in e_agg] == list(range(40))
    for a, b in zip(e_rows, e_agg):
        assert b["mean_logp_before"] == pytest.approx(a["mean_logp_before"], abs=1e-6)
        assert b["mean_logp_after"] == pytest.approx(a["mean_logp_after"], abs=1e-4)


def test_aggregate_keeps_an_off_policy_row_apart_from_an_identical_sample():
    from dataclasses import replace

    from spogw_dagster.core.training.batching import Item, aggregate

    a = Item(0, [1], [2, 3], 1.0, None, "g0", old=[-1.0, -1.0])
    b = Item(1, [1], [2, 3], 0.5, None, "g1", old=[-1.0, -1.0])
    out = aggregate([a, b, replace(b, idx=2, off_policy=True)])
    assert [x.members for x in out] == [[0, 1], [2]] and [x.off_policy for x in out] == [False, True]
    assert out[0].adv_pos == 1.5 and out[1].adv_pos == 0.5
