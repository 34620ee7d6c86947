"""LoRA trainer: config validation, batch mechanics on a tiny random model, and the learning test on SmolLM2."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see spogw_dagster/models.py

import json
from pathlib import Path
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from spogw_dagster.core.hyperparams import ConfigError
from spogw_dagster.core.training.logprobs import (
    build_completion_batch,
    build_shared_prompt_batch,
    completion_logprobs,
    score_completions,
)
from spogw_dagster.adapter_files import ADAPTER_FILES, STATS_FILE
from spogw_dagster.core.training import (
    TrainConfig,
    TrainExample,
    score_examples,
    train_lora,
)
from tiny_llama import save_tiny_llama, tiny_llama

PROMPT = "Write the body of a workflow for the task.\nTask: add two numbers.\n"
# A sharpened group of 4 short workflows: two above the group mean, two below.
GROUP = [
    ("    a = generate(q)\n    return a\n", 1.0),
    ("    s = ensemble(q, 3)\n    return s\n", 1.0),
    ("    pass\n", -1.0),
    ("    x = review(q)\n", -1.0),
]


def _examples(scores=(1.0, 0.9, 0.1, 0.0)) -> list[TrainExample]:
    return [
        TrainExample(PROMPT, c, advantage=a, score=s, group_id="q1")
        for (c, a), s in zip(GROUP, scores)
    ]


def _as_pairs(examples: list[TrainExample], pairs: list[tuple[int, int]]) -> list[TrainExample]:
    """score_dpo trains on explicit pairs: (chosen, rejected) example indices -> two rows sharing a group_id."""
    from dataclasses import replace

    return [replace(examples[i], group_id=f"pair:{k}", role=role)
            for k, (w, l) in enumerate(pairs) for i, role in ((w, "chosen"), (l, "rejected"))]


def _tensors(adapter_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(adapter_dir / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer: fast, for mechanics (not quality)."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", *tiny_llama())


# ---------------------------------------------------------------------------------------------------
# config


def test_config_validation():
    TrainConfig()  # defaults are valid
    bad = [
        dict(lora_r=0),
        dict(lora_dropout=1.0),
        dict(target_modules=()),
        dict(learning_rate=0),
        dict(epochs=0),
        dict(batch_size=0),
        dict(grad_accum=0),
        dict(max_grad_norm=-1.0),
        dict(clip_eps=1.5),
        dict(beta=-0.1),
        dict(objective="ppo"),
        dict(ref_mode="sft"),
        dict(init="resume"),
        dict(old_logprobs="sampler"),
        dict(lr_scheduler="step"),
        dict(temperature=0.0),
        dict(seed=1.5),
        dict(dtype="int8"),
    ]
    for kw in bad:
        with pytest.raises(ConfigError):
            TrainConfig(**kw)
    with pytest.raises(ConfigError, match="unknown field"):
        TrainConfig.from_dict({"lr": 1e-4})
    c = TrainConfig.from_dict({"learning_rate": 3e-4, "target_modules": ["q_proj"]})
    assert c.target_modules == ("q_proj",)
    assert TrainConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert TrainConfig(objective="grpo_nokl").needs_ref is False
    assert TrainConfig(objective="spogw", beta=0.0).needs_ref is False
    assert TrainConfig(objective="score_dpo").needs_old is False


# ---------------------------------------------------------------------------------------------------
# batch mechanics


def test_completion_batch_layout():
    b = build_completion_batch([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], pad_id=0)
    assert b.prompt_len == 3 and b.completion_len == 3
    assert b.input_ids.tolist() == [[5, 6, 7, 1, 2, 0], [0, 0, 8, 3, 4, 9]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert b.position_ids[1, 2:].tolist() == [0, 1, 2, 3]
    assert b.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert b.completion_ids.tolist() == [[1, 2, 0], [3, 4, 9]]
    with pytest.raises(ValueError, match="prompt"):
        build_completion_batch([[]], [[1]], 0)
    with pytest.raises(ValueError, match="completion"):
        build_completion_batch([[1]], [[]], 0)


def test_logprobs_do_not_depend_on_padding(tiny_model):
    """A row's completion log-probs are the same alone and in a padded batch; padding gets 0."""
    from spogw_dagster.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(tiny_model)
    prompts, comps = [[11, 12, 13, 14], [21]], [[31, 32], [41, 42, 43, 44]]
    with torch.no_grad():
        both = completion_logprobs(model, build_completion_batch(prompts, comps, 0))
        for i in range(2):
            alone = completion_logprobs(model, build_completion_batch([prompts[i]], [comps[i]], 0))
            n = len(comps[i])
            assert torch.allclose(both[i, :n], alone[0, :n], atol=1e-5)
            assert torch.all(both[i, n:] == 0)
        # reference: plain forward of the unpadded sequence, log-softmax of the next-token logits
        seq = torch.tensor([prompts[1] + comps[1]])
        ref = torch.log_softmax(model(seq).logits[0, :-1].float(), -1)
        ref = ref[torch.arange(len(seq[0]) - 1), seq[0, 1:]][-len(comps[1]) :]
        assert torch.allclose(both[1], ref, atol=1e-5)


def test_shared_prompt_batch_layout():
    """Rows of two interleaved prompts: each distinct prompt once, left-padded; rows point at their prompt."""
    b = build_shared_prompt_batch([[5, 6, 7], [8], [5, 6, 7]], [[1, 2], [3, 4, 9], [7]], pad_id=0)
    assert b.prompt_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert b.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert b.prompt_positions[1, 2] == 0
    assert b.row_prompt.tolist() == [0, 1, 0]
    assert b.completion_ids.tolist() == [[1, 2, 0], [3, 4, 9], [7, 0, 0]]
    assert b.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert b.num_prompts == 2 and b.num_tokens == 4 + 6
    with pytest.raises(ValueError, match="prompt"):
        build_shared_prompt_batch([[]], [[1]], 0)


def test_shared_prompt_scoring_matches_per_row(tiny_model):
    """No-grad scoring: same numbers as the per-row path, in input order, also when every completion is one
    token long (no completion forward at all) and when prompts repeat far apart in the input."""
    from spogw_dagster.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(tiny_model)
    prompts = [[11, 12, 13, 14], [21], [11, 12, 13, 14], [31, 32], [21]]
    for comps in ([[31, 32], [41, 42, 43, 44], [5], [6, 7, 8], [9, 9]], [[1], [2], [3], [4], [5]]):
        rows = score_completions(model, prompts, comps, 0, temperature=0.7, batch_size=3, shared_prompt=False)
        shared = score_completions(model, prompts, comps, 0, temperature=0.7, batch_size=3)
        assert [len(x) for x in shared] == [len(c) for c in comps]
        for a, b in zip(rows, shared):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


def test_batches_keep_each_prompt_together():
    """Each prompt's rows are contiguous, every row is used once, batches hold at most batch_size rows, and
    the order is a seeded shuffle (over prompts and within them) that changes with the epoch and the seed."""
    from spogw_dagster.core.training.batching import Item, micro_batches

    sizes = {(1, 2): 5, (3,): 3, (4, 4, 4): 4, (5,): 1}
    items = []
    for k in range(max(sizes.values())):  # rows of different prompts interleaved in the input
        for p, n in sizes.items():
            if k < n:
                items.append(Item(len(items), list(p), [k + 1], 0.0, None, group=p))

    def order(cfg, epoch):
        mbs = micro_batches(items, cfg, epoch)
        assert all(1 <= len(mb) <= cfg.batch_size for mb in mbs)
        return [x.idx for mb in mbs for x in mb], mbs

    cfg = TrainConfig(batch_size=4, seed=0)
    flat, mbs = order(cfg, 0)
    assert sorted(flat) == list(range(len(items))) and len(mbs) == 4  # ceil(13 / 4): steps per epoch unchanged
    runs = [tuple(items[i].prompt_ids) for i in flat]
    assert len([k for j, k in enumerate(runs) if j == 0 or runs[j - 1] != k]) == len(sizes)  # one run per prompt
    assert order(cfg, 0)[0] == flat
    assert order(cfg, 1)[0] != flat and order(TrainConfig(batch_size=4, seed=1), 0)[0] != flat
    # score_dpo: whole groups, prompts together; a group larger than batch_size is a batch of its own
    dpo = TrainConfig(objective="score_dpo", batch_size=4, seed=0)
    for epoch in range(3):
        _, mbs = order(TrainConfig(objective="score_dpo", batch_size=5, seed=epoch), 0)
        assert all(len({x.group for x in mb}) == len({tuple(x.prompt_ids) for x in mb}) for mb in mbs)
        assert sum(len(mb) for mb in mbs) == len(items)
    big = [mb for mb in micro_batches(items, dpo, 0) if len(mb) > 4]
    assert [len(mb) for mb in big] == [5] and len({x.group for x in big[0]}) == 1


def test_shared_and_per_row_training_give_the_same_adapter(tiny_model, tmp_path):
    """The same run with shared_prompt on and off: same batches, same losses, same adapter (up to rounding)."""
    examples = _examples() + [
        TrainExample("Task: reverse a string.\n", c, advantage=-a, score=1.0 - s, group_id="q2")
        for (c, a), s in zip(GROUP, (1.0, 0.9, 0.1, 0.0))
    ]
    runs = {}
    for shared in (True, False, None):
        cfg = TrainConfig(epochs=2, batch_size=3, learning_rate=1e-2, seed=5, shared_prompt=shared, beta=0.1,
                          old_logprobs="recompute", target_modules=("q_proj", "k_proj", "v_proj"))
        runs[shared] = train_lora(examples, cfg, tmp_path / str(shared), base_model=tiny_model)
    a, b = runs[True].stats, runs[False].stats
    # None takes the path measured faster on the device: on the CPU the shared one (core/device_paths.py), so
    # the same numbers bit for bit, and the stats say which path ran; the path is not part of the run's hash
    auto = runs[None].stats
    assert auto["config"]["shared_prompt"] is True and a["config"]["shared_prompt"] is True
    # (equal up to the float rounding of threaded reductions, which can differ between two runs on a busy machine)
    assert [s["loss"] for s in auto["steps"]] == pytest.approx([s["loss"] for s in a["steps"]], rel=1e-5, abs=1e-7)
    assert auto["run_hash"] == a["run_hash"] == b["run_hash"]
    assert [s["rows"] for s in a["steps"]] == [s["rows"] for s in b["steps"]] and len(a["steps"]) == 6
    for sa, sb in zip(a["steps"], b["steps"]):
        assert sa["loss"] == pytest.approx(sb["loss"], rel=1e-4, abs=1e-6)
    ta, tb = _tensors(runs[True].adapter_dir), _tensors(runs[False].adapter_dir)
    assert ta.keys() == tb.keys()
    scale = max(float(t.abs().max()) for k, t in ta.items() if "lora_B" in k)
    assert scale > 1e-3  # it did learn; Adam turns float32 rounding of the gradients into ~1e-4 of that
    assert max(float((ta[k] - tb[k]).abs().max()) for k in ta) < 1e-3 * scale
    for ea, eb in zip(a["examples"], b["examples"]):  # π_old before, and the after-training pass
        assert ea["mean_logp_before"] == pytest.approx(eb["mean_logp_before"], abs=1e-5)
        assert ea["mean_logp_after"] == pytest.approx(eb["mean_logp_after"], abs=1e-5)


# ---------------------------------------------------------------------------------------------------
# trainer mechanics on the tiny model


@pytest.mark.parametrize("objective", ["spogw", "grpo", "grpo_nokl", "score_dpo", "rwr"])
def test_each_objective_trains_and_saves(tiny_model, tmp_path, objective):
    cfg = TrainConfig(objective=objective, epochs=2, batch_size=2, grad_accum=2, learning_rate=1e-2,
                      lr_scheduler="linear", warmup_steps=1, seed=3)
    ex = _as_pairs(_examples(), [(0, 2), (1, 3)]) if objective == "score_dpo" else _examples()
    res = train_lora(ex, cfg, tmp_path / "out", base_model=tiny_model)
    d = res.adapter_dir
    assert d == (tmp_path / "out").resolve() and not res.reused
    for f in (*ADAPTER_FILES, STATS_FILE):
        assert (d / f).is_file(), f
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    acfg = json.loads((d / "adapter_config.json").read_text())
    assert acfg["r"] == 8 and sorted(acfg["target_modules"]) == ["q_proj", "v_proj"]
    stats = json.loads((d / STATS_FILE).read_text())
    assert stats["config"]["objective"] == objective and len(stats["run_hash"]) == 64
    assert len(stats["steps"]) == 2  # 2 epochs x (4 rows / (2 per batch x 2 accum))
    for st in stats["steps"]:
        for k in ("loss", "policy_loss", "kl_loss", "clip_frac", "grad_norm", "lr", "tokens"):
            assert k in st and st[k] == st[k], k  # present and not NaN
    assert stats["steps"][0]["lr"] < cfg.learning_rate  # warmup
    tensors = _tensors(d)
    assert tensors and all("lora_" in k for k in tensors)
    assert any(float(t.abs().sum()) > 0 for k, t in tensors.items() if "lora_B" in k)  # B moved from 0


def test_same_seed_same_adapter_and_reuse(tiny_model, tmp_path):
    cfg = TrainConfig(epochs=2, batch_size=2, learning_rate=1e-2, lora_dropout=0.1, seed=11)
    a = train_lora(_examples(), cfg, tmp_path / "a", base_model=tiny_model)
    b = train_lora(_examples(), cfg, tmp_path / "b", base_model=tiny_model)
    ta, tb = _tensors(a.adapter_dir), _tensors(b.adapter_dir)
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert a.stats["run_hash"] == b.stats["run_hash"]
    c = train_lora(_examples(), TrainConfig(epochs=2, batch_size=2, learning_rate=1e-2, lora_dropout=0.1, seed=12),
                   tmp_path / "c", base_model=tiny_model)
    assert any(not torch.equal(ta[k], _tensors(c.adapter_dir)[k]) for k in ta)
    # same config and data into the same folder: the finished run is reused, not retrained
    again = train_lora(_examples(), cfg, tmp_path / "a", base_model=tiny_model)
    assert again.reused and again.stats["run_hash"] == a.stats["run_hash"]
    # other data into the same folder: retrained and replaced atomically
    other = train_lora(_examples(scores=(1.0, 1.0, 0.0, 0.0))[:3], cfg, tmp_path / "a", base_model=tiny_model)
    assert not other.reused and other.stats["n_examples"] == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


def test_an_epoch_snapshot_is_the_shorter_run_itself(tiny_model, tmp_path):
    """Constant LR with warmup and dropout: the adapter after epoch 2 of a 3-epoch run is saved as the 2-epoch
    run (the same tensors, hash, steps and after pass), saving it changes nothing of the 3-epoch run, and
    training 2 epochs into it reuses it."""
    cfg = TrainConfig(epochs=3, batch_size=2, learning_rate=1e-2, lora_dropout=0.1, warmup_steps=3, seed=5)
    two_cfg = replace(cfg, epochs=2)
    long = train_lora(_examples(), cfg, tmp_path / "e3", base_model=tiny_model,
                      snapshots={2: tmp_path / "e2", 3: tmp_path / "ignored", 0: tmp_path / "ignored"})
    alone = train_lora(_examples(), two_cfg, tmp_path / "alone", base_model=tiny_model)
    snap = json.loads((tmp_path / "e2" / "training_stats.json").read_text())
    t_snap, t_alone = _tensors(tmp_path / "e2"), _tensors(alone.adapter_dir)
    assert t_snap.keys() == t_alone.keys() and all(torch.equal(t_snap[k], t_alone[k]) for k in t_snap)
    assert snap["run_hash"] == alone.stats["run_hash"] != long.stats["run_hash"]
    assert snap["config"]["epochs"] == 2 and snap["snapshot_of_epochs"] == 3
    assert [x["loss"] for x in snap["steps"]] == [x["loss"] for x in alone.stats["steps"]]
    # its own after pass (eval_after), and the pass left the longer run training as it would have
    assert [x["mean_logp_after"] for x in snap["examples"]] == [x["mean_logp_after"] for x in alone.stats["examples"]]
    plain = train_lora(_examples(), cfg, tmp_path / "plain3", base_model=tiny_model)
    t_long, t_plain = _tensors(long.adapter_dir), _tensors(plain.adapter_dir)
    assert all(torch.equal(t_long[k], t_plain[k]) for k in t_long)
    assert len(long.stats["steps"]) == 3 * len(snap["steps"]) // 2
    assert not (tmp_path / "ignored").exists()  # only lengths shorter than the run
    assert train_lora(_examples(), two_cfg, tmp_path / "e2", base_model=tiny_model).reused
    # a decaying schedule: the state after epoch 2 is not the 2-epoch run, so no snapshot is saved
    train_lora(_examples(), replace(cfg, lr_scheduler="linear"), tmp_path / "lin3", base_model=tiny_model,
               snapshots={2: tmp_path / "lin2"})
    assert not (tmp_path / "lin2").exists()


def test_continue_and_restart_from_previous_adapter(tiny_model, tmp_path):
    cfg = TrainConfig(epochs=3, batch_size=4, learning_rate=5e-2, seed=1)
    first = train_lora(_examples(), cfg, tmp_path / "it1", base_model=tiny_model)
    cont = train_lora(
        _examples(), TrainConfig(epochs=1, batch_size=4, learning_rate=1e-2, seed=1, ref_mode="previous"),
        tmp_path / "it2", base_model=tiny_model, previous_adapter=first.adapter_dir,
    )
    # π_old and π_ref are the previous policy and training continues from it: step 0 has ρ = 1 and KL = 0
    s0 = cont.stats["steps"][0]
    assert s0["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and s0["kl"] == pytest.approx(0.0, abs=1e-6)
    restart = train_lora(
        _examples(), TrainConfig(epochs=1, batch_size=4, learning_rate=1e-2, seed=1, init="restart"),
        tmp_path / "it2r", base_model=tiny_model, previous_adapter=first.adapter_dir,
    )
    # a fresh adapter starts at the base model, while π_old is still the previous adapter: ρ != 1
    assert abs(restart.stats["steps"][0]["ratio_mean"] - 1.0) > 1e-4
    assert cont.stats["previous_adapter"] == str(first.adapter_dir)
    assert cont.stats["hashes"]["previous_adapter"] is not None
    with pytest.raises(ConfigError, match="init='restart'"):
        train_lora(_examples(), TrainConfig(lora_r=4), tmp_path / "bad", base_model=tiny_model,
                   previous_adapter=first.adapter_dir)


def test_bad_training_inputs(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="no training examples"):
        train_lora([], TrainConfig(), tmp_path / "x", base_model=tiny_model)
    with pytest.raises(ValueError, match="old_logprobs"):
        train_lora(_examples(), TrainConfig(old_logprobs="data"), tmp_path / "x", base_model=tiny_model)
    ex = _examples()
    ex[0].old_logprobs = [-1.0, -2.0]
    ex[0].completion_token_ids = [1, 2, 3]
    for e in ex[1:]:
        e.old_logprobs, e.completion_token_ids = [-1.0], [5]
    with pytest.raises(ValueError, match="2 old_logprobs for 3"):
        train_lora(ex, TrainConfig(old_logprobs="data"), tmp_path / "x", base_model=tiny_model)
    with pytest.raises(ValueError, match="needs a finite score"):
        train_lora([TrainExample(PROMPT, "x", 1.0)], TrainConfig(objective="rwr"), tmp_path / "x",
                   base_model=tiny_model)
    with pytest.raises(ValueError, match="completion has no tokens"):
        train_lora([TrainExample(PROMPT, "", 1.0)], TrainConfig(), tmp_path / "x", base_model=tiny_model)
    assert not (tmp_path / "x").exists()


def test_crash_while_saving_leaves_no_adapter(tiny_model, tmp_path, monkeypatch):
    from peft import PeftModel

    def broken_save(self, path, **kw):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_config.json").write_text("{half")
        raise OSError("disk full")

    monkeypatch.setattr(PeftModel, "save_pretrained", broken_save)
    with pytest.raises(OSError, match="disk full"):
        train_lora(_examples(), TrainConfig(), tmp_path / "out", base_model=tiny_model)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------
# THE LEARNING TEST: the real bundled SmolLM2


@pytest.mark.model
def test_learning_raises_positive_and_lowers_negative_workflows(tmp_path):
    """ioGRPO + mKL on a sharpened group (+, +, −, −): a few optimizer steps raise the log-prob of the
    positive-advantage workflows and lower the others; the saved adapter reloads with peft and gives
    the trained log-probs. (Bit-for-bit determinism is checked on the tiny model above.)"""
    ex = _examples()
    cfg = TrainConfig(objective="spogw", beta=0.1, learning_rate=2e-3, epochs=3, batch_size=4, seed=0)
    res = train_lora(ex, cfg, tmp_path / "adapter", base_model="smollm2")
    stats = res.stats
    assert stats["summary"]["optimizer_steps"] == 3
    before = [r["mean_logp_before"] for r in stats["examples"]]
    after = [r["mean_logp_after"] for r in stats["examples"]]
    for (_, adv), b, a in zip(GROUP, before, after):
        if adv > 0:
            assert a > b + 0.05, (adv, b, a)
        else:
            assert a < b - 0.05, (adv, b, a)
    assert stats["summary"]["delta_mean_logp_positive"] > 0 > stats["summary"]["delta_mean_logp_negative"]

    # "before" really is the base model (no previous adapter): recompute it independently
    base_lp = score_examples(ex, "smollm2")
    assert [sum(x) / len(x) for x in base_lp] == pytest.approx(before, abs=1e-4)
    # the saved adapter, loaded by peft, reproduces the trained log-probs
    from peft import PeftConfig

    assert PeftConfig.from_pretrained(str(res.adapter_dir)).r == cfg.lora_r
    reloaded = score_examples(ex, "smollm2", adapter_path=res.adapter_dir)
    assert [sum(x) / len(x) for x in reloaded] == pytest.approx(after, abs=1e-4)



@pytest.mark.model
def test_sampler_logprobs_serve_as_pi_old(tmp_path):
    """Sampler log-probs (data) and the trainer's recomputation agree: with old_logprobs='data' at the
    sampling temperature, the first step's ratio is 1 and nothing is clipped."""
    from spogw_dagster.core.inference.sampling import SamplingParams, TransformersSampler

    s = TransformersSampler("smollm2", batch_size=4, seed=0)
    out = s.generate([PROMPT], SamplingParams(temperature=0.8, max_tokens=8), n=4)[0]
    ex = [
        TrainExample(PROMPT, r.text, advantage=adv, old_logprobs=r.logprobs,
                     prompt_token_ids=r.prompt_token_ids, completion_token_ids=r.token_ids)
        for r, adv in zip(out, (1.0, 0.5, -0.5, -1.0))
    ]
    cfg = TrainConfig(old_logprobs="data", temperature=0.8, epochs=1, batch_size=4, learning_rate=1e-4)
    res = train_lora(ex, cfg, tmp_path / "a", base_model="smollm2")
    s0 = res.stats["steps"][0]
    assert s0["ratio_mean"] == pytest.approx(1.0, abs=2e-3) and s0["clip_frac"] == 0.0


# ---------------------------------------------------------------------------------------------------
# hand-computed first steps (core/training/objectives.py: L_i is the per-token *mean* over row i's
# workflow tokens, the loss the mean of L_i over rows; a micro-batch's loss is weighted by its share of rows)

HAND_PROMPT = [11, 12, 13, 14, 15]
HAND_COMPLETIONS = [[21, 22, 23], [31, 32, 33, 34, 35, 36, 37], [41, 42], [51, 52, 53, 54, 55]]  # 3, 7, 2, 5 tokens
HAND_ADV = [1.5, 0.5, -0.25, -1.0]


def _hand_examples(old_logprobs=None, n=4) -> list[TrainExample]:
    return [
        TrainExample(f"prompt {i}", f"completion {i}", advantage=HAND_ADV[i], score=0.5, group_id="g",
                     prompt_token_ids=list(HAND_PROMPT), completion_token_ids=list(HAND_COMPLETIONS[i]),
                     old_logprobs=None if old_logprobs is None else list(old_logprobs[i]))
        for i in range(n)
    ]


def _plain_logprobs(model, rows: int = 4) -> list[list[float]]:
    """log softmax(logits) of each completion token from one plain, unpadded forward per row (T = 1)."""
    out = []
    with torch.no_grad():
        for comp in HAND_COMPLETIONS[:rows]:
            seq = torch.tensor([HAND_PROMPT + comp])
            lp = torch.log_softmax(model(seq).logits[0, :-1].double(), -1)
            pos = torch.arange(len(HAND_PROMPT) - 1, seq.shape[1] - 1)
            out.append(lp[pos, seq[0, pos + 1]].tolist())
    return out


@pytest.fixture(scope="module")
def base_logprobs(tiny_model) -> list[list[float]]:
    from transformers import AutoModelForCausalLM

    return _plain_logprobs(AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval())


def _hand_cfg(**kw) -> TrainConfig:
    base = dict(objective="spogw", beta=0.1, clip_eps=0.2, epochs=1, batch_size=4, learning_rate=1e-3,
                eval_after=False, seed=0)
    base.update(kw)
    return TrainConfig(**base)


def test_first_step_loss_is_minus_the_mean_advantage(tiny_model, tmp_path):
    """Step 0 with no previous adapter: π_θ = π_old = π_ref (fresh LoRA, B = 0), so ρ = 1, D = 0 and
    L_i = −(1/|o_i|) Σ_t Â_i = −Â_i: loss = −mean_i Â_i = −(1.5 + 0.5 − 0.25 − 1.0)/4 = −0.1875.
    (A token-weighted mean would give −(1.5·3 + 0.5·7 − 0.25·2 − 1.0·5)/17 = −0.147.)"""
    res = train_lora(_hand_examples(), _hand_cfg(), tmp_path / "a", base_model=tiny_model)
    s0 = res.stats["steps"][0]
    assert len(res.stats["steps"]) == 1 and s0["rows"] == 4 and s0["tokens"] == 3 + 7 + 2 + 5
    assert s0["loss"] == pytest.approx(-0.1875, abs=1e-6)
    assert s0["policy_loss"] == pytest.approx(-0.1875, abs=1e-6)
    assert s0["kl_loss"] == pytest.approx(0.0, abs=1e-9) and s0["kl"] == pytest.approx(0.0, abs=1e-9)
    assert s0["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and s0["clip_frac"] == 0.0



def test_first_step_of_the_baseline_objectives_by_hand(tiny_model, tmp_path, base_logprobs):
    """Step 0 (π_θ = π_ref = base), scores s = (1, 0.75, 0.25, 0) in one group:
    rwr        loss = mean_i exp(s_i / 0.4) · (−mean_t log π(o_{i,t})), log-probs from plain forwards;
    score_dpo  explicit pairs (0, 2) and (1, 3): Δ_w = Δ_l = 0 for every pair, so each pair's loss is
               −log σ(0) = ln 2 (the trainer no longer draws pairs inside a group: n_pairs is the 2 given)."""
    import math

    scores = [1.0, 0.75, 0.25, 0.0]
    ex = _hand_examples()
    for e, sc in zip(ex, scores):
        e.score = sc
    nll = [-sum(row) / len(row) for row in base_logprobs]
    want = sum(math.exp(sc / 0.4) * x for sc, x in zip(scores, nll)) / 4
    s0 = train_lora(ex, _hand_cfg(objective="rwr"), tmp_path / "rwr", base_model=tiny_model).stats["steps"][0]
    assert s0["loss"] == pytest.approx(want, rel=1e-5)
    dpo = train_lora(_as_pairs(ex, [(0, 2), (1, 3)]), _hand_cfg(objective="score_dpo"), tmp_path / "dpo",
                     base_model=tiny_model).stats["steps"]
    assert len(dpo) == 1 and dpo[0]["rows"] == 4
    assert dpo[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert dpo[0]["n_pairs"] == 2  # the explicit pairs, nothing drawn in the batch


# ρ_i = exp(logp − old) set per row through the recorded π_old; Â = (1.5, 0.5, −0.25, −1.0), ε_c = 0.2:
#   row 0: ρ 1.5, Â > 0: min(1.5·1.5, 1.2·1.5)   =  1.8    (clipped)
#   row 1: ρ 0.5, Â > 0: min(0.5·0.5, 0.8·0.5)   =  0.25
#   row 2: ρ 1.5, Â < 0: min(−0.375, −0.3)       = −0.375
#   row 3: ρ 0.5, Â < 0: min(−0.5, −0.8)         = −0.8    (clipped)
HAND_RATIO = [1.5, 0.5, 1.5, 0.5]
HAND_CLIPPED_LOSS = {4: -(1.8 + 0.25 - 0.375 - 0.8) / 4, 3: -(1.8 + 0.25 - 0.375) / 3}  # -0.21875, -0.558333


def _shifted_examples(base_logprobs, n=4) -> list[TrainExample]:
    import math

    old = [[lp - math.log(r) for lp in row] for row, r in zip(base_logprobs, HAND_RATIO)]
    return _hand_examples(old_logprobs=old, n=n)


def test_first_step_loss_with_recorded_pi_old_is_the_clipped_surrogate(tiny_model, tmp_path, base_logprobs):
    """π_old from data, shifted by hand so ρ is 1.5 or 0.5 per row; π_θ = π_ref = base at step 0 (D = 0).
    loss = −(1.8 + 0.25 − 0.375 − 0.8)/4 = −0.21875; the clip cuts rows 0 and 3: (3 + 5)/17 of the tokens;
    ratio_mean (over tokens) = (1.5·3 + 0.5·7 + 1.5·2 + 0.5·5)/17 = 13.5/17."""
    res = train_lora(_shifted_examples(base_logprobs), _hand_cfg(old_logprobs="data"), tmp_path / "a",
                     base_model=tiny_model)
    s0 = res.stats["steps"][0]
    assert s0["loss"] == pytest.approx(-0.21875, abs=1e-5)
    assert s0["kl"] == pytest.approx(0.0, abs=1e-9) and s0["kl_loss"] == pytest.approx(0.0, abs=1e-9)
    assert s0["clip_frac"] == pytest.approx(8 / 17, abs=1e-6)
    assert s0["ratio_mean"] == pytest.approx(13.5 / 17, abs=1e-5)


@pytest.fixture(scope="module")
def previous_adapter(tiny_model, tmp_path_factory) -> Path:
    """An iteration-0 adapter that moved the tiny model well away from the base."""
    cfg = TrainConfig(epochs=3, batch_size=4, learning_rate=5e-2, seed=1, eval_after=False)
    return train_lora(_examples(), cfg, tmp_path_factory.mktemp("prev") / "it0", base_model=tiny_model).adapter_dir


def test_ref_base_with_previous_adapter_uses_the_base_models_logprobs(tiny_model, tmp_path, previous_adapter,
                                                                       base_logprobs):
    """Continuing from a previous adapter: π_θ = π_old = π_prev at step 0. With ref_mode="base" the KL is
    k3 between π_prev and the *base* model, recomputed here from plain forwards:
        D_{i,t} = exp(b − p) − (b − p) − 1,  kl = mean_i mean_t D,  kl_loss = β · mean_i 1[Â_i > 0] mean_t D,
        loss = −mean_i Â_i + kl_loss.
    With ref_mode="previous" the same step has KL exactly 0."""
    import math

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    prev_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model)),
                                           str(previous_adapter)).eval()
    prev_lp = _plain_logprobs(prev_model)
    kl_rows = [sum(math.exp(b - p) - (b - p) - 1 for b, p in zip(br, pr)) / len(br)
               for br, pr in zip(base_logprobs, prev_lp)]
    kl = sum(kl_rows) / 4
    kl_loss = 0.1 * sum(k for k, a in zip(kl_rows, HAND_ADV) if a > 0) / 4
    assert kl > 1e-3  # the previous adapter really differs from the base

    runs = {}
    for mode in ("base", "previous"):
        runs[mode] = train_lora(_hand_examples(), _hand_cfg(ref_mode=mode), tmp_path / mode, base_model=tiny_model,
                                previous_adapter=previous_adapter).stats["steps"][0]
    s0 = runs["base"]
    assert s0["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert s0["kl"] == pytest.approx(kl, rel=1e-3, abs=1e-7)
    assert s0["kl_loss"] == pytest.approx(kl_loss, rel=1e-3, abs=1e-7)
    assert s0["loss"] == pytest.approx(-0.1875 + kl_loss, rel=1e-4, abs=1e-6)
    p0 = runs["previous"]
    assert p0["kl"] == pytest.approx(0.0, abs=1e-7) and p0["kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert p0["loss"] == pytest.approx(-0.1875, abs=1e-5)


@pytest.mark.parametrize("rows,splits", [(4, [(4, 1), (2, 2), (1, 4)]), (3, [(3, 1), (2, 2)])])
def test_gradient_accumulation_equals_the_full_batch_mean(tiny_model, tmp_path, base_logprobs, rows, splits):
    """One optimizer step on the same rows as one batch or as micro-batches (batch_size x grad_accum, also
    the unequal split 2 + 1 of 3 rows): the loss is the mean over rows either way, so the logged loss (the
    hand value above), the gradient norm and the adapter after the step agree. adam_eps = 1 and lr = 1 make
    Adam's first step g / (|g| + 1) ≈ g, so the tensors show the gradient's scale (Adam's usual first step
    lr·sign(g) would hide a wrong normalisation); no gradient clipping."""
    out = {}
    for bs, ga in splits:
        cfg = _hand_cfg(old_logprobs="data", batch_size=bs, grad_accum=ga, learning_rate=1.0, adam_eps=1.0,
                        max_grad_norm=None)
        res = train_lora(_shifted_examples(base_logprobs, rows), cfg, tmp_path / f"b{bs}x{ga}", base_model=tiny_model)
        assert len(res.stats["steps"]) == 1 and res.stats["steps"][0]["rows"] == rows
        out[(bs, ga)] = (res.stats["steps"][0], _tensors(res.adapter_dir))
    (s_ref, t_ref) = out[splits[0]]
    assert s_ref["loss"] == pytest.approx(HAND_CLIPPED_LOSS[rows], abs=1e-5)
    scale = max(float(t.abs().max()) for k, t in t_ref.items() if "lora_B" in k)
    assert scale > 1e-6  # the step moved B
    for key in splits[1:]:
        s, t = out[key]
        assert s["loss"] == pytest.approx(s_ref["loss"], abs=1e-6), key
        assert s["grad_norm"] == pytest.approx(s_ref["grad_norm"], rel=1e-4), key
        assert t.keys() == t_ref.keys()
        assert max(float((t[k] - t_ref[k]).abs().max()) for k in t) <= 1e-4 * scale, key
