"""`training.anchor_stop`: the deciding tokens of the anchors (by hand), and a real LoRA run on a tiny model that
stops at the first step where the best anchor's token wins, and not before."""

from __future__ import annotations

import os
from dataclasses import replace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see spogw_dagster/models.py

import pytest
import torch

from spogw_dagster.core.training import TrainConfig, TrainExample, train_lora
from spogw_dagster.core.training.anchor_choice import Decision, decided_groups, deciding_tokens, group_gaps
from spogw_dagster.core.training.batching import Item
from tiny_llama import save_tiny_llama, tiny_llama


def _item(i, completion, adv, group="q", off=True, prompt=(1, 2)):
    return Item(idx=i, prompt_ids=list(prompt), completion_ids=list(completion), advantage=adv, score=None,
                group=group, off_policy=off)


def test_deciding_tokens_are_the_first_token_where_the_best_anchor_parts():
    items = [
        _item(0, [5, 6, 7], 1.0),     # the best anchor of q
        _item(1, [5, 9], -0.5),       # parts from it at position 1: after prompt + [5], 6 against 9
        _item(2, [8, 6, 7], -0.5),    # parts at position 0: after the prompt, 5 against 8
        _item(3, [4], 3.0, off=False),  # a sample: not an anchor, whatever its advantage
        _item(4, [5, 6, 7, 1], -1.0, group="r"),  # r: the lower anchor extends the best one (no deciding token)
        _item(5, [5, 6, 7], 0.5, group="r"),
        _item(6, [3], 0.0, group="s"),  # s: all anchors equal, nothing to decide
        _item(7, [4], 0.0, group="s"),
    ]
    assert deciding_tokens(items) == [Decision("q", (1, 2, 5), 6, 9), Decision("q", (1, 2), 5, 8)]


def test_a_group_is_decided_only_when_every_decision_holds():
    ds = [Decision("q", (1,), 6, 9), Decision("q", (2,), 5, 8), Decision("r", (1,), 9, 6)]
    logits = {(1,): torch.zeros(10), (2,): torch.zeros(10)}
    logits[(1,)][6] = 1.0   # 6 beats 9 after (1,): q's first decision holds, r's fails
    logits[(2,)][8] = 0.5   # 8 beats 5 after (2,): q's second fails
    assert decided_groups(ds, logits) == {"q": False, "r": False}
    logits[(2,)][5] = 0.7
    assert decided_groups(ds, logits) == {"q": True, "r": False}
    assert group_gaps(ds, logits) == pytest.approx({"q": 0.2, "r": -1.0})  # q: min(1 - 0, 0.7 - 0.5)
    assert decided_groups(ds, logits, margin=0.2) == {"q": False, "r": False}  # by more than the margin
    assert decided_groups(ds, logits, margin=0.19) == {"q": True, "r": False}
    logits[(1,)][9] = 1.0   # a tie is not decided: greedy would not reliably open the best anchor
    assert decided_groups(ds, logits) == {"q": False, "r": False}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", *tiny_llama(initializer_range=0.2))


def _next_logits(model_dir, prompt, adapter=None):
    from spogw_dagster.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(str(model_dir), adapter_path=adapter)
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt])).logits[0, -1].float()


def test_training_stops_at_the_first_step_where_the_best_anchor_wins(tiny_model, tmp_path):
    prompt = [10, 11, 12, 13]
    base = _next_logits(tiny_model, prompt)
    lose, win = int(base.argmax()), int(base.argmin())  # the base opens the worse anchor: not decided at start
    anchors = [TrainExample("", "", advantage=1.0, group_id="q", off_policy=True, prompt_token_ids=prompt,
                            completion_token_ids=[win, 20, 21]),
               TrainExample("", "", advantage=-1.0, group_id="q", off_policy=True, prompt_token_ids=prompt,
                            completion_token_ids=[lose, 20, 21])]
    cfg = TrainConfig(objective="spogw", beta=0.0, learning_rate=5e-2, epochs=60, batch_size=2, seed=0,
                      off_policy_loss="log_prob", eval_after=False, anchor_stop=1.0, lora_dropout=0.1)
    res = train_lora(anchors, cfg, tmp_path / "a", base_model=tiny_model)
    steps = res.stats["steps"]
    shares = [s["anchor_decided"] for s in steps]
    assert res.stats["summary"]["stopped_early"] is True
    assert 1 <= len(steps) < 60 and res.stats["summary"]["optimizer_steps"] == len(steps)
    assert shares[-1] == 1.0 and all(x == 0.0 for x in shares[:-1]) and {s["anchor_groups"] for s in steps} == {1}
    # the saved adapter, loaded on its own, opens the best anchor
    after = _next_logits(tiny_model, prompt, adapter=res.adapter_dir)
    assert after[win] > after[lose]
    gaps = [s["anchor_gap"] for s in steps]
    assert gaps[-1] > 0 and all(g <= 0 for g in gaps[:-1])
    # a margin: the same steps (the check draws nothing), further, until the gap passes it
    wide = train_lora(anchors, TrainConfig(**{**cfg.to_dict(), "anchor_stop_margin": gaps[-1] + 1.0}),
                      tmp_path / "m", base_model=tiny_model)
    wsteps = wide.stats["steps"]
    assert len(wsteps) > len(steps) and wsteps[-1]["anchor_gap"] > gaps[-1] + 1.0
    assert [s["anchor_gap"] for s in wsteps[:len(steps)]] == pytest.approx(gaps)
    # without the stop the same run takes every epoch, through the same steps (the check draws no dropout mask)
    full = train_lora(anchors, TrainConfig(**{**cfg.to_dict(), "anchor_stop": None, "epochs": len(steps) + 2}),
                      tmp_path / "b", base_model=tiny_model)
    assert full.stats["summary"]["optimizer_steps"] == len(steps) + 2 and "stopped_early" not in full.stats["summary"]
    fsteps = full.stats["steps"][:len(steps)]
    assert [s["loss"] for s in fsteps] == [s["loss"] for s in steps]
    assert [s["grad_norm"] for s in fsteps] == [s["grad_norm"] for s in steps]


def test_the_default_loss_trains_the_same_rows_with_the_stop(tiny_model, tmp_path):
    """With the `clipped` loss the anchors are marked only to be found: an anchor equal to a sample still merges
    with it (aggregate_unique), so the steps are those of the run without the stop."""
    prompt = [10, 11, 12, 13]
    rows = [TrainExample("", "", advantage=a, group_id=g, off_policy=off, prompt_token_ids=prompt,
                         completion_token_ids=c)
            for a, g, off, c in ((1.0, "q", True, [30, 31]), (-1.0, "q", True, [32, 31]),
                                 (0.5, "s", False, [30, 31]), (-0.5, "s", False, [33]))]
    cfg = TrainConfig(objective="spogw", beta=0.1, learning_rate=1e-2, epochs=2, batch_size=4, seed=0,
                      eval_after=False, aggregate_unique=True, anchor_stop=1.0, anchor_stop_margin=1e6)
    a = train_lora(rows, cfg, tmp_path / "a", base_model=tiny_model)
    unmarked = [replace(r, off_policy=False) for r in rows]  # as the pipeline gives them without the stop
    b = train_lora(unmarked, TrainConfig(**{**cfg.to_dict(), "anchor_stop": None}), tmp_path / "b",
                   base_model=tiny_model)
    assert a.stats["n_train_rows"] == b.stats["n_train_rows"] == 3  # the anchor [30, 31] merged with the sample
    assert [s["loss"] for s in a.stats["steps"]] == [s["loss"] for s in b.stats["steps"]]
    assert a.stats["steps"][-1]["anchor_groups"] == 1 and "stopped_early" not in a.stats["summary"]
