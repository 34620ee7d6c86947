"""Offline LoRA trainer for the generator (ioGRPO + mKL and the baseline objectives), transformers + peft.

One call trains one iteration: ``train_lora(examples, cfg, output_dir, base_model, previous_adapter)``.

Policies (the algorithm as docs/algorithm.md specifies it), with π_{k−1} = base + previous adapter (the base model when there is none):

* **π_old** is the policy that produced the data, π_{k−1}. ``cfg.old_logprobs="recompute"`` (default)
  computes it before training, under ``no_grad`` and in eval mode, with the previous adapter loaded as a
  second, frozen adapter — so it is right even when ``init="restart"`` starts the trainable adapter from
  scratch. ``"data"`` takes the per-token log-probs recorded by the sampler (`TrainExample.old_logprobs`,
  which then need `completion_token_ids` so that tokens line up); they follow the same convention (see
  `core.logprobs`), provided the sampler's temperature equals ``cfg.temperature``.
* **π_ref** is ``"base"`` (adapters disabled) or ``"previous"`` (π_{k−1}). Both are precomputed before the
  first step in the same pass as π_old (for "previous" it *is* π_old's numbers when those are recomputed),
  so a training step is one forward + backward of the trainable policy and no second model or adapter is
  kept in memory. The reference is only computed when the objective needs it (β > 0, or score_dpo).
* **π_θ** is the trainable adapter: ``init="continue"`` starts from a copy of the previous adapter (its
  rank, alpha and target modules must match the config), ``"restart"`` from a fresh LoRA (B = 0, so the
  start equals the base model).

All log-probs are ``log softmax(logits / T)`` of the completion tokens with
``T = cfg.logprob_temperature(cfg.temperature)``: the sampling temperature for spogw / grpo / grpo_nokl
(π_old is the sampler's distribution), 1 for score_dpo and rwr (ScoreFlow's TRL DPO and W4S score at
T = 1); prompt tokens are context only. score_dpo trains on explicit pairs: each example carries
``role`` "chosen" or "rejected" and its pair's ``group_id``; a pair's two rows share a micro-batch. With ``cfg.shared_prompt`` (None, the default: the device's faster path, shared on the CPU) every pass runs each distinct prompt of a batch once and
only the completions per row (`core.logprobs.SharedPromptBatch`); micro-batches keep a prompt's rows together. The loss is `core.objectives.compute_loss(cfg.objective, ...)`.

Output: a standard PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``, loadable by
``peft`` and by vLLM ``--enable-lora``) plus ``training_stats.json`` (config, hashes, per-step stats,
summary). It is written into a temporary sibling folder and renamed into place, so a crash never leaves a
half-written adapter. If `output_dir` already holds a finished run with the same ``run_hash`` (config,
data, base model, previous adapter) that run is returned instead of training again.

Determinism: the fresh LoRA initialisation, the data order (per epoch) and dropout are seeded from
``cfg.seed``; on the CPU the same seed and data give bit-identical adapter tensors.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import uuid
import warnings
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from spogw_dagster.adapter_files import ADAPTER_CONFIG, ADAPTER_FILES, ADAPTER_WEIGHTS, STATS_FILE
from spogw_dagster.core.device_paths import shared_prompt_for
from spogw_dagster.core.distributed import SINGLE, Dist, from_environment
from spogw_dagster.core.hyperparams import ConfigError, ObjectiveConfig
from spogw_dagster.fsutil import file_sha256 as _file_sha
from spogw_dagster.fsutil import replace_dir
from spogw_dagster.seeds import offset_seed

# peft asks transformers for a deprecated attribute on every step; the warning says nothing about our run.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

__all__ = [
    "TrainConfig",
    "TrainExample",
    "TrainResult",
    "train_lora",
    "score_examples",
    "ADAPTER_FILES",
    "STATS_FILE",
]



# --------------------------------------------------------------------------------------------------
# config and data


@dataclass(frozen=True)
class TrainConfig(ObjectiveConfig):
    """Hyperparameters of one LoRA training run. Validated on construction (`ConfigError`).

    LoRA:       lora_r, lora_alpha, lora_dropout, target_modules.
    Optimizer:  AdamW(learning_rate, weight_decay, adam_betas, adam_eps); lr_scheduler "constant" |
                "linear" | "cosine" with warmup_steps; max_grad_norm (clip; None = no clipping, the norm is
                still logged).
    Schedule:   epochs over the dataset; batch_size rows per micro-batch; grad_accum micro-batches per
                optimizer step (a smaller last step at the end of an epoch is still taken).
    Objective:  objective (spogw | grpo | grpo_nokl | score_dpo | rwr), beta, clip_eps, the score_dpo / rwr
                knobs and seed are inherited from `core.hyperparams.ObjectiveConfig` (declared and validated there).
    Policies:   ref_mode "base" | "previous"; init "continue" | "restart"; old_logprobs "recompute" | "data";
                temperature (must equal the sampling temperature; 1.0 for greedy data). Log-probs are taken at
                `logprob_temperature` (the objective's: 1.0 for score_dpo / rwr, `temperature` otherwise).
    Misc:       seed; eval_after (one more no-grad pass: per-example mean log-prob before/after training in
                the stats, and its change for positive- and negative-advantage rows); max_completion_tokens (truncate longer completions; None = keep all);
                dtype ("float32" on the CPU); device ("auto" = cuda when available).
    Forward:    shared_prompt (default None: the path measured faster on the device, `core.device_paths`:
                shared on the CPU, per-row on CUDA): True runs every distinct prompt of a micro-batch once, with
                gradients, and indexes its KV cache out to the rows that share it, so only the completion
                tokens run per row; False runs every row's prompt again (the reference path). Not part of the
                run hash (the same run either way). Same loss,
                gradients and log-probs up to float rounding; it also applies to the π_old/π_ref and after-
                training passes. Micro-batches keep the rows of one prompt together in both modes (see
                `_batches`), so a micro-batch of batch_size rows usually holds one or two prompts. With
                lora_dropout > 0 the rows of one prompt share the prompt's dropout mask.
    Unique rows: aggregate_unique (default True; objectives trained on groups only: spogw / grpo / grpo_nokl).
                With overlapping groups (the paper's C(16, 14) = 120 groups per query sharpened to 2t = 8
                rows) the data repeat each of ~12 distinct workflows 10-105 times (~960 rows per query).
                True trains on one row per distinct (prompt tokens, completion tokens, recorded π_old)
                carrying A⁺ = Σ of its positive Â, A⁻ = Σ of its negative Â, n⁺ = #groups with Â > 0 (the
                mKL weight; grpo: all its groups) and count = #rows it stands for; the loss divides by Σ
                count, i.e. by the number of per-group rows (`core.objectives`, module doc). Proven equal
                (tests/test_unique_aggregation.py, float64, <= 1e-10): the loss, its gradients and the logged
                metrics of any set of per-group rows and of its unique rows, and the gradient of an optimizer
                step (micro-batch losses are weighted by their share of Σ count, not of rows). So the
                full-data objective (one step over all the data) and the π_old/π_ref numbers are the same;
                what differs is the batching: an epoch is U unique rows instead of R per-group rows
                (~R/U = 80x fewer at the paper's setting), so there are fewer optimizer steps per epoch, each
                micro-batch of batch_size unique rows covers more of the data, and the per-step minibatch
                noise (which rows share a step) is not the same; lr/epochs tuned for per-group rows may want
                retuning. π_old, π_ref, the forward and the backward run once per distinct workflow. False
                trains on the rows as given (the reference path). The stats keep one `examples` entry per
                input example (each copy reports its workflow's numbers).

    Peak memory of one micro-batch (forward + backward) of 1 prompt x m completions, frozen base + LoRA:

        ≈ L·(Lp + m·C)·(8h + 5i)·bytes          activations (per-row path: L·m·(Lp + C)·(8h + 5i)·bytes)
        + 2·L·m·Lp·H·d·bytes                     the prompt's K/V expanded to m rows (H query heads: SDPA repeats GQA heads)
        + 3·m·C·V·4                              completion logits, their float32 log-softmax and its gradient

    (L layers, hidden h, MLP width i, vocabulary V, Lp prompt and C completion tokens). The formula is up to
    15% below these measurements (`python bench/train_throughput.py --case memory`, peak RSS over the loaded model):
      tiny  (SmolLM2-135M fp32, Lp = 490, m = 8, C = 96):  shared 3.1 GiB, per-row 7.4 GiB (the tiny
            profile's batch_size = 4 rows: about 60% of that).
      paper (m = 16, C <= 512, Lp ≈ 600, bf16): not measured; the formula for an 8B Llama-3.1 shape (L = 32,
            h = 4096, i = 14336, H·d = 4096, V = 128256) gives ≈ 59 + 5 + 13 ≈ 77 GB for all 16 completions
            at 512 tokens (per-row: ≈ 132 GB), ≈ 40 GB for the profile's batch_size = 8 rows. Completions
            shorter than 512 tokens scale the first and last terms down.
    """

    # LoRA
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    # optimizer
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    lr_scheduler: str = "constant"
    warmup_steps: int = 0
    max_grad_norm: float | None = 1.0
    # schedule
    epochs: int = 1
    batch_size: int = 4
    grad_accum: int = 1
    # policies
    ref_mode: str = "base"
    init: str = "continue"
    old_logprobs: str = "recompute"
    temperature: float = 1.0
    # misc
    eval_after: bool = True
    max_completion_tokens: int | None = None
    dtype: str = "float32"
    device: str = "auto"
    shared_prompt: bool | None = None  # None: the device's faster path (core/device_paths.py)
    aggregate_unique: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()  # the objective's fields and seed
        c = "TrainConfig"
        # lists from YAML/JSON become tuples (frozen: set through object.__setattr__)
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        object.__setattr__(self, "adam_betas", tuple(float(b) for b in self.adam_betas))

        def req_int(name: str, lo: int) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ConfigError(f"{c}.{name}={v!r}: must be an integer >= {lo}.")

        def req_real(name: str, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
            if ok:
                ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
            if not ok:
                lb = "(" if lo_open else "["
                rb = ")" if hi_open else "]"
                raise ConfigError(f"{c}.{name}={v!r}: must be a number in {lb}{lo}, {hi}{rb}.")

        req_int("lora_r", 1)
        req_real("lora_alpha", 0, math.inf, lo_open=True)
        req_real("lora_dropout", 0.0, 1.0, hi_open=True)
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ConfigError(f"{c}.target_modules={self.target_modules!r}: give at least one module name, e.g. ('q_proj', 'v_proj').")
        req_real("learning_rate", 0.0, 1.0, lo_open=True)
        req_real("weight_decay", 0.0, 1.0)
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ConfigError(f"{c}.adam_betas={self.adam_betas!r}: two numbers in [0, 1).")
        req_real("adam_eps", 0.0, 1.0, lo_open=True)
        if self.lr_scheduler not in ("constant", "linear", "cosine"):
            raise ConfigError(f"{c}.lr_scheduler={self.lr_scheduler!r}: choose 'constant', 'linear' or 'cosine'.")
        req_int("warmup_steps", 0)
        if self.max_grad_norm is not None:
            req_real("max_grad_norm", 0.0, math.inf, lo_open=True)
        req_int("epochs", 1)
        req_int("batch_size", 1)
        req_int("grad_accum", 1)
        if self.ref_mode not in ("base", "previous"):
            raise ConfigError(f"{c}.ref_mode={self.ref_mode!r}: choose 'base' (adapter disabled) or 'previous' (π_k−1).")
        if self.init not in ("continue", "restart"):
            raise ConfigError(f"{c}.init={self.init!r}: choose 'continue' (from the previous adapter) or 'restart' (fresh LoRA).")
        if self.old_logprobs not in ("recompute", "data"):
            raise ConfigError(f"{c}.old_logprobs={self.old_logprobs!r}: choose 'recompute' or 'data'.")
        req_real("temperature", 0.0, math.inf, lo_open=True)
        if not isinstance(self.eval_after, bool):
            raise ConfigError(f"{c}.eval_after={self.eval_after!r}: must be True or False.")
        if self.shared_prompt is not None and not isinstance(self.shared_prompt, bool):
            raise ConfigError(f"{c}.shared_prompt={self.shared_prompt!r}: must be True, False or None (the "
                              "device's faster path).")
        if not isinstance(self.aggregate_unique, bool):
            raise ConfigError(f"{c}.aggregate_unique={self.aggregate_unique!r}: must be True or False.")
        if self.max_completion_tokens is not None:
            req_int("max_completion_tokens", 1)
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"{c}.dtype={self.dtype!r}: choose 'float32', 'bfloat16' or 'float16'.")

    @property
    def aggregates(self) -> bool:
        """Whether this run trains on unique workflows (aggregate_unique, for the GRPO family)."""
        return self.aggregate_unique and self.spec.aggregates

    @property
    def logprob_T(self) -> float:
        """The temperature of every log-prob this run computes (π_θ, π_old, π_ref, the after-training pass):
        `ObjectiveConfig.logprob_temperature` of the sampling temperature."""
        return self.logprob_temperature(self.temperature)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_modules"] = list(self.target_modules)
        d["adam_betas"] = list(self.adam_betas)
        if self.spec.data != "candidates":  # only W4S's candidates read it: every other run keeps its run hash
            d.pop("rwr_reward", None)
        return d

    def identity(self) -> dict[str, Any]:
        """What makes two runs the same run: `to_dict` without the forward path (`shared_prompt`), which changes
        how a batch is computed, not what is trained."""
        return config_identity(self.to_dict())


def config_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """A TrainConfig dict (a run's stats keep one) without what does not change the run: `shared_prompt`."""
    return {k: v for k, v in config.items() if k != "shared_prompt"}


@dataclass
class TrainExample:
    """One training response. Token ids, when given, are used as is (exactly what was sampled); otherwise
    the prompt is tokenized like the sampler does and the completion without special tokens."""

    prompt: str
    completion: str
    advantage: float = 0.0
    score: float | None = None
    old_logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    group_id: str | int | None = None
    role: str | None = None  # score_dpo: "chosen" | "rejected" (the pair is the rows sharing group_id)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrainExample":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def canonical(self) -> dict[str, Any]:
        def lst(x):
            return None if x is None else [float(v) if isinstance(v, float) else v for v in list(x)]

        role = {} if self.role is None else {"role": self.role}  # absent when unset: older data hashes hold
        return {
            **role,
            "prompt": self.prompt,
            "completion": self.completion,
            "advantage": float(self.advantage),
            "score": None if self.score is None else float(self.score),
            "old_logprobs": lst(self.old_logprobs),
            "prompt_token_ids": lst(self.prompt_token_ids),
            "completion_token_ids": lst(self.completion_token_ids),
            "group_id": self.group_id,
        }


@dataclass
class TrainResult:
    adapter_dir: Path
    stats: dict[str, Any]
    reused: bool = False

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.stats.get("steps", [])


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()




def data_hash(examples: Sequence[TrainExample]) -> str:
    return _sha([e.canonical() for e in examples])


def _model_identity(folder: Path) -> dict[str, Any]:
    """What identifies the base model in the run hash: the GGUF's sha256 for a converted model, else the
    folder's config.json and its weight files' names and sizes (hashing GBs of weights every run is not worth it)."""
    marker = folder / "spogw_conversion.json"
    if marker.is_file():
        m = json.loads(marker.read_text())
        return {"gguf_sha256": m.get("gguf_sha256")}
    weights = sorted((p.name, p.stat().st_size) for p in folder.glob("*.safetensors"))
    return {"config_sha256": _file_sha(folder / "config.json"), "weights": weights}


# --------------------------------------------------------------------------------------------------
# helpers


@dataclass
class _Item:
    idx: int
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    score: float | None
    group: Any
    old: list[float] | None = None
    ref: list[float] | None = None
    final: list[float] | None = None
    role: str | None = None
    # a unique-workflow row (`_aggregate`): the indices of the items it stands for and its weights
    members: list[int] | None = None
    adv_pos: float = 0.0
    adv_neg: float = 0.0
    n_pos: int = 0
    n_neg: int = 0
    count: int = 1


def _aggregate(items: list[_Item]) -> list[_Item]:
    """One row per distinct (prompt tokens, completion tokens, recorded π_old) in first-seen order, carrying
    (A⁺, A⁻, n⁺, n⁻, count) of the rows it stands for (`objectives.unique_advantage_weights`); its `advantage`
    is A⁺ + A⁻ (the sum, for display). π_old from data is part of the key, so rows are merged only when their
    loss terms are the same function of the policy."""

    from spogw_dagster.core.objectives import unique_advantage_weights

    by_key: dict[tuple, list[_Item]] = {}
    for it in items:
        key = (tuple(it.prompt_ids), tuple(it.completion_ids), None if it.old is None else tuple(it.old))
        by_key.setdefault(key, []).append(it)
    out = []
    for rows in by_key.values():
        a_pos, a_neg, n_pos, n_neg, count = unique_advantage_weights([r.advantage for r in rows])
        out.append(replace(rows[0], advantage=a_pos + a_neg, members=[r.idx for r in rows], adv_pos=a_pos,
                           adv_neg=a_neg, n_pos=n_pos, n_neg=n_neg, count=count))
    return out


def _tokenize(examples: Sequence[TrainExample], tok, cfg: TrainConfig) -> list[_Item]:
    items = []
    for i, e in enumerate(examples):
        if e.prompt_token_ids is not None:
            p = [int(t) for t in e.prompt_token_ids]
        else:
            p = list(tok(e.prompt)["input_ids"])
        if e.completion_token_ids is not None:
            c = [int(t) for t in e.completion_token_ids]
        else:
            c = list(tok(e.completion, add_special_tokens=False)["input_ids"])
        if not p:
            raise ValueError(f"example {i}: the prompt has no tokens; every response needs a non-empty prompt")
        if not c:
            raise ValueError(f"example {i}: the completion has no tokens; drop empty responses before training")
        if not math.isfinite(float(e.advantage)):
            raise ValueError(f"example {i}: advantage {e.advantage!r} is not finite")
        old = None
        if cfg.needs_old and cfg.old_logprobs == "data":
            if e.old_logprobs is None:
                raise ValueError(
                    f"example {i} has no old_logprobs but TrainConfig.old_logprobs='data'; fix: record the "
                    "sampler's logprobs, or set old_logprobs='recompute'"
                )
            if e.completion_token_ids is None:
                raise ValueError(
                    f"example {i}: old_logprobs from data need completion_token_ids (re-tokenizing the text "
                    "may not give the sampled tokens); fix: pass the sampler's token_ids, or recompute"
                )
            if len(e.old_logprobs) != len(c):
                raise ValueError(
                    f"example {i}: {len(e.old_logprobs)} old_logprobs for {len(c)} completion tokens"
                )
            old = [float(v) for v in e.old_logprobs]
        if cfg.spec.uses_scores:
            if e.score is None or not math.isfinite(float(e.score)):
                raise ValueError(f"example {i}: objective {cfg.objective!r} needs a finite score")
        if cfg.max_completion_tokens is not None and len(c) > cfg.max_completion_tokens:
            c = c[: cfg.max_completion_tokens]
            old = old[: cfg.max_completion_tokens] if old is not None else None
        items.append(
            _Item(i, p, c, float(e.advantage), None if e.score is None else float(e.score), e.group_id, old,
                  role=e.role)
        )
    if cfg.spec.data == "pairs":
        _check_pairs(items)
    return items


def _check_pairs(items: Sequence[_Item]) -> None:
    """score_dpo trains on explicit pairs: every row is "chosen" or "rejected", and each group_id holds one
    of each (the pair), chosen with the higher score."""
    pairs: dict[Any, dict[str, _Item]] = {}
    for it in items:
        if it.role not in ("chosen", "rejected") or it.group is None:
            raise ValueError(
                f"example {it.idx}: score_dpo trains on explicit (chosen, rejected) pairs; every example needs "
                f"role 'chosen' or 'rejected' and a group_id shared with its pair (got role={it.role!r}, "
                f"group_id={it.group!r}); fix: build them with pipeline.data.training_inputs.score_dpo_training_data "
                "(ScoreFlow's pairs from core.curation.sample_preference_pairs)"
            )
        if it.role in pairs.setdefault(it.group, {}):
            raise ValueError(f"pair {it.group!r} has two {it.role!r} rows; a pair is one chosen and one rejected row")
        pairs[it.group][it.role] = it
    for gid, p in pairs.items():
        if len(p) != 2:
            raise ValueError(f"pair {gid!r} has only a {next(iter(p))!r} row; a pair is one chosen and one rejected row")
        if not p["chosen"].score > p["rejected"].score:  # type: ignore[operator]
            raise ValueError(f"pair {gid!r}: the chosen score {p['chosen'].score} must exceed the rejected "
                             f"{p['rejected'].score} (ScoreFlow drops ties)")


def _batches(items: list[_Item], cfg: TrainConfig, epoch: int) -> list[list[_Item]]:
    """Micro-batches for one epoch, in a seeded order, with the rows of one prompt next to each other.

    The prompts are shuffled (seeded by cfg.seed and the epoch), then the rows of each prompt; the sequence is
    cut into micro-batches of batch_size rows. A micro-batch thus holds one prompt's rows, or the tail of one
    prompt and the head of the next, never more than batch_size rows (bounded memory), and the shared-prompt
    forward runs each prompt once per micro-batch. The same batches feed both forward paths, so
    ``shared_prompt`` changes only how a batch is computed. An objective trained on pairs (score_dpo) shuffles
    whole groups (a pair is the two rows of one group_id) and keeps each group in one micro-batch; a group larger than batch_size is a
    micro-batch of its own."""
    import torch

    g = torch.Generator().manual_seed(offset_seed(cfg.seed, epoch))
    if cfg.spec.data != "pairs":
        units = [[it] for it in items]
    else:
        groups: dict[Any, list[_Item]] = {}
        for it in items:
            groups.setdefault(it.group if it.group is not None else "__all__", []).append(it)
        units = list(groups.values())
    by_prompt: dict[tuple[int, ...], list[list[_Item]]] = {}
    for u in units:
        by_prompt.setdefault(tuple(u[0].prompt_ids), []).append(u)
    prompts = list(by_prompt.values())
    ordered: list[list[_Item]] = []
    for i in torch.randperm(len(prompts), generator=g).tolist():
        ordered += [prompts[i][j] for j in torch.randperm(len(prompts[i]), generator=g).tolist()]
    if cfg.spec.data != "pairs":
        rows = [u[0] for u in ordered]
        return [rows[s : s + cfg.batch_size] for s in range(0, len(rows), cfg.batch_size)]
    out: list[list[_Item]] = []
    cur: list[_Item] = []
    for grp in ordered:
        if cur and len(cur) + len(grp) > cfg.batch_size:
            out.append(cur)
            cur = []
        cur = cur + grp
    if cur:
        out.append(cur)
    return out


def _explicit_pairs(mb: Sequence[_Item]):
    """[P, 2] (chosen row, rejected row) of the micro-batch's pairs (rows with a role, paired by group_id), in
    order of first appearance; None when the rows carry no roles (the loss then draws pairs in the batch)."""
    import torch

    if all(x.role is None for x in mb):
        return None
    by_pair: dict[str, dict[str, int]] = {}
    for j, x in enumerate(mb):
        if x.role not in ("chosen", "rejected"):
            raise ValueError(f"row {x.idx}: role {x.role!r}; score_dpo rows are 'chosen' or 'rejected'")
        by_pair.setdefault(repr(x.group), {})[x.role] = j
    bad = [g for g, p in by_pair.items() if len(p) != 2]
    if bad:  # pragma: no cover - _batches keeps a group in one micro-batch, _check_pairs checks the groups
        raise RuntimeError(f"pair(s) {bad} split across micro-batches")
    return torch.tensor([[p["chosen"], p["rejected"]] for p in by_pair.values()], dtype=torch.long)


def _group_ids(mb: Sequence[_Item]):
    """Stable small ints for the batch's group ids (Python's str hash is salted per process)."""
    import torch

    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(repr(x.group), len(seen)) for x in mb], dtype=torch.long)


def _pad_lists(rows: Sequence[Sequence[float]], width: int, dtype=None):
    import torch

    dtype = dtype or torch.float32
    t = torch.zeros((len(rows), width), dtype=dtype)
    for i, r in enumerate(rows):
        t[i, : len(r)] = torch.as_tensor(list(r), dtype=dtype)
    return t


def _lr_lambda(cfg: TrainConfig, total_steps: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.lr_scheduler == "constant":
            return 1.0
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        if cfg.lr_scheduler == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def _precompute(model, items: list[_Item], pad_id: int, cfg: TrainConfig, device, attr: str, disable_adapter: bool,
                dist: Dist = SINGLE) -> None:
    """No-grad per-token log-probs of every item into `item.<attr>`, batch_size rows at a time (rows of one
    prompt together when shared_prompt, else rows of similar length together). Across processes each rank
    runs its share of the batches and every rank gets all rows' numbers."""
    import contextlib

    import torch

    from spogw_dagster.core.logprobs import build_batch, completion_logprobs, rows_by_prompt

    ctx = model.disable_adapter() if disable_adapter else contextlib.nullcontext()
    bs = max(cfg.batch_size, 1)
    shared = _shared_path(cfg, device)
    if shared:
        by_length = sorted(items, key=lambda x: len(x.prompt_ids))  # similar prompt lengths pad less
        order = [by_length[i] for i in rows_by_prompt([x.prompt_ids for x in by_length])]
    else:
        order = sorted(items, key=lambda x: len(x.prompt_ids) + len(x.completion_ids))
    chunks = [order[s : s + bs] for s in range(0, len(order), bs)]
    mine: dict[int, list[float]] = {}
    with torch.no_grad(), ctx:
        for chunk in dist.shard(chunks):
            b = build_batch([x.prompt_ids for x in chunk], [x.completion_ids for x in chunk], pad_id, shared)
            lp = completion_logprobs(model, b.to(device), cfg.logprob_T).cpu()
            for j, x in enumerate(chunk):
                mine[x.idx] = lp[j, : len(x.completion_ids)].tolist()
    got = {i: v for part in dist.gather(mine) for i, v in part.items()}
    for x in items:
        setattr(x, attr, got[x.idx])


def _shared_path(cfg: TrainConfig, device) -> bool:
    """`cfg.shared_prompt`, or where it is None the path measured faster on `device` (core/device_paths.py)."""
    return shared_prompt_for(str(getattr(device, "type", device)), cfg.shared_prompt)  # "cuda:1" reads as cuda


def _micro_batch_logprobs(model, mb: Sequence[_Item], cfg: TrainConfig, pad_id: int, device):
    """Per-token log-probs [B, C] of the micro-batch's completions under `model`, and the batch.

    `cfg.shared_prompt` picks the forward (each distinct prompt once, or every row's prompt again); both give
    the same log-probs, loss and gradients up to float rounding (tests/test_trainer_shared_prompt.py)."""
    from spogw_dagster.core.logprobs import build_batch, completion_logprobs

    b = build_batch([x.prompt_ids for x in mb], [x.completion_ids for x in mb], pad_id, _shared_path(cfg, device))
    b = b.to(device)
    return completion_logprobs(model, b, cfg.logprob_T), b


def _micro_batch_objective(mb: Sequence[_Item], cfg: TrainConfig, logp, mask, device, ocfg=None):
    """The objective on one micro-batch, given its policy log-probs and completion mask."""
    import torch

    from spogw_dagster.core.objectives import LossBatch, compute_loss

    C = logp.shape[1]
    dt = torch.promote_types(logp.dtype, torch.float32)  # float32 (float64 in the exactness tests)

    def col(vals):
        return torch.tensor(vals, dtype=dt, device=device)

    lb = LossBatch(
        logp=logp,
        mask=mask,
        old_logp=_pad_lists([x.old for x in mb], C, dt).to(device) if cfg.needs_old else None,
        ref_logp=_pad_lists([x.ref for x in mb], C, dt).to(device) if cfg.needs_ref else None,
        advantages=col([x.advantage for x in mb]),
        scores=col([x.score if x.score is not None else 0.0 for x in mb]),
        group_ids=_group_ids(mb),
        pairs=_explicit_pairs(mb) if cfg.spec.data == "pairs" else None,
    )
    if any(x.members is not None for x in mb):  # unique-workflow rows (`_aggregate`)
        lb.adv_pos, lb.adv_neg = col([x.adv_pos for x in mb]), col([x.adv_neg for x in mb])
        lb.n_pos, lb.n_neg, lb.count = col([x.n_pos for x in mb]), col([x.n_neg for x in mb]), col([x.count for x in mb])
    return compute_loss(cfg.objective, lb, ocfg or cfg.objective_config())


def lora_config(cfg: TrainConfig):
    """The peft LoraConfig of `cfg` (what every fresh adapter starts from: the trainer's and a carried one)."""
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def _check_previous_matches(prev: Path, cfg: TrainConfig) -> None:
    pc = json.loads((prev / ADAPTER_CONFIG).read_text())
    theirs = (int(pc.get("r", -1)), float(pc.get("lora_alpha", -1)), sorted(pc.get("target_modules") or []))
    ours = (cfg.lora_r, float(cfg.lora_alpha), sorted(cfg.target_modules))
    if theirs != ours:
        raise ConfigError(
            f"init='continue' needs the previous adapter's LoRA shape; it has (r, alpha, target_modules)={theirs}, "
            f"the config {ours}; fix: set the config to match, or init='restart'"
        )


# --------------------------------------------------------------------------------------------------
# training


def train_lora(
    examples: Sequence[TrainExample | Mapping[str, Any]],
    cfg: TrainConfig | None = None,
    output_dir: str | os.PathLike[str] = "adapter",
    base_model: str | os.PathLike[str] = "smollm2",
    previous_adapter: str | os.PathLike[str] | None = None,
    reuse_existing: bool = True,
    log: Callable[[dict[str, Any]], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train one LoRA adapter on an offline dataset and save it atomically to `output_dir`.

    Stages: identify the run (and reuse an identical finished one) → tokenize → π_old / π_ref → the trainable
    adapter → optimize → (optionally) how the log-probs moved → save.

    Started N times by `accelerate launch` (`core.train_launch`), the processes train one adapter together
    (`core.distributed`: micro-batches sharded, gradients summed); rank 0 alone logs and writes the folder,
    and the run hash is the 1-process run's (the number of processes is not part of what is trained)."""
    import torch

    from spogw_dagster.models import load_model_and_tokenizer

    cfg = cfg or TrainConfig()
    exs, out, folder, prev, hashes = identify_run(examples, cfg, output_dir, base_model, previous_adapter)
    run_hash = _sha(hashes)
    if reuse_existing and (done := _finished_run(out, run_hash)) is not None:
        return TrainResult(out, done, reused=True)

    t_start = time.perf_counter()
    dist = from_environment(cpu=_device(cfg).type == "cpu")
    device = _device(cfg, dist)
    cfg = replace(cfg, shared_prompt=_shared_path(cfg, device))  # the stats record the path taken
    if not dist.main:  # one voice: rank 0 reports for all
        log = progress = None
    torch.manual_seed(cfg.seed)
    model, tok = load_model_and_tokenizer(folder, dtype=cfg.dtype)
    model.to(device)
    items = _tokenize(exs, tok, cfg)
    rows = _aggregate(items) if cfg.aggregates else items  # what the passes and the optimizer run on
    t0 = time.perf_counter()
    model = _reference_passes(model, rows, prev, cfg, tok.pad_token_id, device, dist)
    precompute_s = time.perf_counter() - t0
    model, params = _trainable_adapter(model, prev, cfg, device)
    run = _optimize(model, params, rows, cfg, tok.pad_token_id, device, log, progress, dist)
    per_example, moved = (_log_prob_shift(model, rows, cfg, tok.pad_token_id, device, items, dist)
                          if cfg.eval_after else ([], {}))
    stats = {
        "run_hash": run_hash,
        "hashes": hashes,
        "config": cfg.to_dict(),
        "base_model": str(folder),
        "previous_adapter": str(prev) if prev is not None else None,
        "n_examples": len(items),
        "n_train_rows": len(rows),  # unique workflows with aggregate_unique (GRPO family), else n_examples
        "n_trainable_params": sum(p.numel() for p in params),
        "steps": run.steps,
        "summary": {
            **run.summary(),
            "precompute_seconds": round(precompute_s, 3),
            "logprob_temperature": cfg.logprob_T,
            "total_seconds": round(time.perf_counter() - t_start, 3),
            "device": str(device),
            "processes": dist.world,
            **moved,
        },
        "examples": per_example,
    }
    if dist.main:
        save_adapter(model, out, folder, stats)
    dist.barrier()  # the other ranks return once the folder is in place
    if not dist.main:
        stats = json.loads((out / STATS_FILE).read_text())
    return TrainResult(out, stats)


def identify_run(examples, cfg: TrainConfig, output_dir, base_model, previous_adapter):
    """The validated inputs of a run and what identifies it: (examples, output folder, base model folder,
    previous adapter folder or None, run_hashes)."""
    from spogw_dagster.models import check_adapter_folder, resolve_model

    exs = [e if isinstance(e, TrainExample) else TrainExample.from_dict(e) for e in examples]
    if not exs:
        raise ValueError("no training examples; fix: check that curation kept at least one group")
    out = Path(output_dir).expanduser().resolve()
    folder = resolve_model(base_model)
    prev = check_adapter_folder(previous_adapter) if previous_adapter is not None else None
    if prev is not None and cfg.init == "continue":
        _check_previous_matches(prev, cfg)
    return exs, out, folder, prev, run_hashes(cfg, exs, folder, prev)


def finished_run(examples, cfg: TrainConfig, output_dir, base_model, previous_adapter) -> dict[str, Any] | None:
    """The stats of the identical finished run in `output_dir` (what `train_lora` would reuse), else None."""
    _, out, _, _, hashes = identify_run(examples, cfg, output_dir, base_model, previous_adapter)
    return _finished_run(out, _sha(hashes))


def run_hashes(cfg: TrainConfig, exs: Sequence[TrainExample], folder: Path, prev: Path | None) -> dict[str, Any]:
    """What identifies a training run: config, data, base model and previous adapter (each hashed). The forward
    path (`shared_prompt`) is not: both compute the same run."""
    return {
        "config": _sha(cfg.identity()),
        "data": data_hash(exs),
        "base_model": _sha(_model_identity(folder)),
        "previous_adapter": _file_sha(prev / ADAPTER_WEIGHTS) if prev is not None else None,
    }


def _finished_run(out: Path, run_hash: str) -> dict[str, Any] | None:
    """The stats of a finished run with this hash in `out`, else None."""
    if not ((out / STATS_FILE).is_file() and all((out / f).is_file() for f in ADAPTER_FILES)):
        return None
    try:
        old_stats = json.loads((out / STATS_FILE).read_text())
    except ValueError:
        return None
    if old_stats.get("run_hash") != run_hash or old_stats.get("weights_sha256") != _file_sha(out / ADAPTER_WEIGHTS):
        return None  # another run, or damaged weights: train again
    return old_stats


def _device(cfg: TrainConfig, dist: Dist = SINGLE):
    """The configured device; with several processes on CUDA, the GPU the launcher gave this process."""
    import torch

    dev = torch.device(cfg.device if cfg.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and dist.world > 1:
        return torch.device(dist.device)  # the GPU accelerate set for this process (NCCL uses the same)
    return dev


def _reference_passes(model, items: list[_Item], prev: Path | None, cfg: TrainConfig, pad_id: int, device,
                      dist: Dist = SINGLE):
    """π_old and π_ref under no_grad, with the policy that produced the data (the previous adapter loaded as a
    frozen adapter named "previous"). Fills each item's `old` / `ref`; returns the (possibly wrapped) model."""
    from peft import PeftModel

    if prev is not None:
        model = PeftModel.from_pretrained(model, str(prev), adapter_name="previous", is_trainable=False)
        model.to(device)
    model.eval()
    need_old = cfg.needs_old and cfg.old_logprobs == "recompute"
    if need_old:  # π_old = π_k−1: the previous adapter active (or the plain base model)
        _precompute(model, items, pad_id, cfg, device, "old", disable_adapter=False, dist=dist)
    if cfg.needs_ref:
        if cfg.ref_mode == "previous" or prev is None:  # π_ref = π_k−1 (without a previous adapter: the base)
            if need_old:
                for it in items:
                    it.ref = it.old
            else:
                _precompute(model, items, pad_id, cfg, device, "ref", disable_adapter=False, dist=dist)
        else:  # π_ref = base: the previous adapter disabled
            _precompute(model, items, pad_id, cfg, device, "ref", disable_adapter=True, dist=dist)
    if cfg.needs_ref and any(it.ref is None for it in items):  # pragma: no cover - internal consistency
        raise RuntimeError("reference log-probs missing after precompute")
    return model


def _trainable_adapter(model, prev: Path | None, cfg: TrainConfig, device):
    """π_θ: a copy of the previous adapter (init "continue") or a fresh seeded LoRA; only LoRA weights train.
    Returns (model, trainable parameters)."""
    import torch
    from peft import get_peft_model

    if prev is not None:
        if cfg.init == "continue":
            model.load_adapter(str(prev), adapter_name="default", is_trainable=True)
        else:
            torch.manual_seed(cfg.seed)
            model.add_adapter("default", lora_config(cfg))
        model.set_adapter("default")
        model.delete_adapter("previous")
    else:
        torch.manual_seed(cfg.seed)
        model = get_peft_model(model, lora_config(cfg))
    model.to(device)
    params = []
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
        if p.requires_grad:
            params.append(p)
    if not params:  # pragma: no cover
        raise RuntimeError("no trainable LoRA parameters; check target_modules against the model's module names")
    return model, params


@dataclass
class _Run:
    steps: list[dict[str, Any]]
    tokens: int
    seconds: float

    def summary(self) -> dict[str, Any]:
        return {
            "optimizer_steps": len(self.steps),
            "completion_tokens_trained": self.tokens,
            "train_seconds": round(self.seconds, 3),
            "train_tokens_per_second": round(self.tokens / self.seconds, 2) if self.seconds > 0 else None,
            "first_loss": self.steps[0].get("loss") if self.steps else None,
            "last_loss": self.steps[-1].get("loss") if self.steps else None,
        }


def _optimize(model, params, items: list[_Item], cfg: TrainConfig, pad_id: int, device,
              log: Callable[[dict[str, Any]], None] | None,
              progress: Callable[[str], None] | None = None, dist: Dist = SINGLE) -> _Run:
    """AdamW over `epochs` of seeded batches; each optimizer step averages grad_accum micro-batches by rows.
    `progress` gets a line as each step starts and ends (what a watcher, or the fault suite, waits on)."""
    import torch

    opt = torch.optim.AdamW(
        params, lr=cfg.learning_rate, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps, weight_decay=cfg.weight_decay
    )
    epoch_batches = [_batches(items, cfg, e) for e in range(cfg.epochs)]
    total_steps = sum(math.ceil(len(b) / cfg.grad_accum) for b in epoch_batches)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg, total_steps))
    ocfg = cfg.objective_config()
    torch.manual_seed(cfg.seed)
    model.train()
    run = _Run([], 0, 0.0)
    t_train = time.perf_counter()
    for epoch, batches in enumerate(epoch_batches):
        for s in range(0, len(batches), cfg.grad_accum):
            where = f"optimizer step {len(run.steps) + 1}/{total_steps} (epoch {epoch + 1}/{cfg.epochs})"
            if progress is not None:
                progress(f"{where} started")
            st = _optimizer_step(model, params, opt, batches[s : s + cfg.grad_accum], cfg, ocfg, pad_id, device,
                                 dist)
            st = {"step": len(run.steps), "epoch": epoch, "lr": sched.get_last_lr()[0], **st}
            opt.step()
            sched.step()
            run.tokens += st["tokens"]
            run.steps.append(st)
            if log is not None:
                log(st)
            if progress is not None:
                progress(f"{where} done: loss {st.get('loss', float('nan')):.4g}")
    run.seconds = time.perf_counter() - t_train
    return run


def _optimizer_step(model, params, opt, group: list[list[_Item]], cfg: TrainConfig, ocfg: ObjectiveConfig,
                    pad_id: int, device, dist: Dist = SINGLE) -> dict[str, Any]:
    """Gradients of one optimizer step (each micro-batch's loss weighted by its share of the rows), clipped.

    A row's share is its `count` (the per-group rows a unique-workflow row stands for; 1 otherwise), so the step
    averages over the per-group rows it represents, as the loss does within a micro-batch. Across processes
    each rank runs its share of the step's micro-batches (weighted by their share of the whole step) and the
    gradients, metrics and token counts are summed over the ranks before clipping (`core.distributed`)."""
    import torch

    rows_in_step = sum(x.count for b in group for x in b)
    ts = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    acc: dict[str, float] = {}
    tokens = 0
    for mb in dist.shard(group):
        logp, cb = _micro_batch_logprobs(model, mb, cfg, pad_id, device)
        res = _micro_batch_objective(mb, cfg, logp, cb.completion_mask, device, ocfg)
        w = sum(x.count for x in mb) / rows_in_step
        (res.loss * w).backward()
        for k, v in res.metrics().items():
            acc[k] = acc.get(k, 0.0) + w * float(v)
        tokens += int(cb.completion_mask.sum())
    dist.sum_gradients(params)
    acc = dist.sum_numbers({**acc, "__tokens": float(tokens)})  # over the ranks (one process: as is)
    tokens = int(acc.pop("__tokens"))
    grad_norm = torch.nn.utils.clip_grad_norm_(
        params, cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
    )
    return {
        "rows": sum(len(b) for b in group),  # rows run (unique workflows when aggregated)
        "group_rows": rows_in_step,  # per-group rows they stand for (= rows without aggregation)
        "tokens": tokens,
        "grad_norm": float(grad_norm),
        **{k: round(v, 8) for k, v in acc.items()},
        "seconds": round(time.perf_counter() - ts, 4),
    }


def _log_prob_shift(model, items: list[_Item], cfg: TrainConfig, pad_id: int, device,
                    all_items: list[_Item] | None = None, dist: Dist = SINGLE):
    """One more no-grad pass: each example's mean log-prob before and after training, and the mean change for
    positive- and negative-advantage rows. Returns (per-example rows, summary entries). `items` are the rows
    trained on; with unique-workflow rows, `all_items` are the examples they stand for (one entry each)."""
    model.eval()
    _precompute(model, items, pad_id, cfg, device, "final", disable_adapter=False, dist=dist)
    if all_items is not None and all_items is not items:
        by_idx = {it.idx: it for it in all_items}
        for u in items:
            for i in u.members or [u.idx]:
                by_idx[i].old, by_idx[i].ref, by_idx[i].final = u.old, u.ref, u.final
        items = all_items
    per_example: list[dict[str, Any]] = []
    for it in items:
        start = it.old if it.old is not None else it.ref
        per_example.append({
            "index": it.idx,
            "advantage": it.advantage,
            "tokens": len(it.completion_ids),
            "mean_logp_before": (sum(start) / len(start)) if start is not None else None,
            "mean_logp_after": sum(it.final) / len(it.final),
        })
    moved: dict[str, Any] = {}
    for name, sel in (("positive", lambda a: a > 0), ("negative", lambda a: a < 0)):
        rows = [r for r in per_example if sel(r["advantage"]) and r["mean_logp_before"] is not None]
        if rows:
            moved[f"delta_mean_logp_{name}"] = round(
                sum(r["mean_logp_after"] - r["mean_logp_before"] for r in rows) / len(rows), 6
            )
    return per_example, moved


def save_adapter(model, out: Path, folder: Path, stats: dict[str, Any]) -> None:
    """Write the PEFT folder and the stats into a temporary sibling, then rename it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        cfg_path = tmp / ADAPTER_CONFIG
        acfg = json.loads(cfg_path.read_text())
        acfg["base_model_name_or_path"] = str(folder)
        cfg_path.write_text(json.dumps(acfg, indent=2, sort_keys=True))
        missing = [f for f in ADAPTER_FILES if not (tmp / f).is_file()]
        if missing:  # pragma: no cover
            raise RuntimeError(f"peft did not write {missing}")
        # the weights' hash: an identical later run reuses this folder only while its bytes are intact
        stats["weights_sha256"] = _file_sha(tmp / ADAPTER_WEIGHTS)
        (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2))
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def score_examples(
    examples: Sequence[TrainExample | Mapping[str, Any]],
    base_model: str | os.PathLike[str] = "smollm2",
    adapter_path: str | os.PathLike[str] | None = None,
    temperature: float = 1.0,
    batch_size: int = 8,
    model=None,
    tokenizer=None,
    shared_prompt: bool | None = None,
) -> list[list[float]]:
    """Teacher-forced per-token log-probs of each example's completion under base (+ adapter).

    Tokenizes exactly like the trainer. Pass a preloaded `model`/`tokenizer` to avoid reloading. With
    `shared_prompt`, examples with the same prompt are batched together and the prompt runs once per batch
    (None: the path measured faster on the model's device, `core.device_paths`).
    """
    from spogw_dagster.core.logprobs import score_completions
    from spogw_dagster.models import load_model_and_tokenizer

    if model is None:
        model, tokenizer = load_model_and_tokenizer(base_model, adapter_path=adapter_path)
    exs = [e if isinstance(e, TrainExample) else TrainExample.from_dict(e) for e in examples]
    items = _tokenize(exs, tokenizer, TrainConfig(objective="grpo_nokl"))
    return score_completions(
        model,
        [x.prompt_ids for x in items],
        [x.completion_ids for x in items],
        tokenizer.pad_token_id,
        temperature=temperature,
        batch_size=batch_size,
        shared_prompt=shared_prompt_for(next(model.parameters()).device.type, shared_prompt),
    )
