"""The hyperparameters of one LoRA training run (`TrainConfig`) and what of them identifies a run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from spogw_dagster.core.hyperparams import ConfigError, ObjectiveConfig


@dataclass(frozen=True)
class TrainConfig(ObjectiveConfig):
    """Hyperparameters of one LoRA training run. Validated on construction (`ConfigError`).

    LoRA:       lora_r, lora_alpha, lora_dropout, target_modules.
    Optimizer:  AdamW(learning_rate, weight_decay, adam_betas, adam_eps); lr_scheduler "constant" |
                "linear" | "cosine" with warmup_steps; max_grad_norm (clip; None = no clipping, the norm is
                still logged).
    Schedule:   epochs over the dataset; batch_size rows per micro-batch; grad_accum micro-batches per
                optimizer step (a smaller last step at the end of an epoch is still taken); anchor_stop ends
                the run early once the anchors' verdict is taken (`core.training.anchor_choice`).
    Objective:  objective (spogw | grpo | grpo_nokl | score_dpo | rwr), beta, clip_eps, the score_dpo / rwr
                knobs and seed are inherited from `core.hyperparams.ObjectiveConfig` (declared and validated there).
    Policies:   ref_mode "base" | "previous"; init "continue" | "restart"; old_logprobs "recompute" | "data";
                temperature (must equal the sampling temperature; 1.0 for greedy data). Log-probs are taken at
                `logprob_temperature` (the objective's: 1.0 for score_dpo / rwr, `temperature` otherwise).
    Misc:       seed; eval_after (one more no-grad pass: per-example mean log-prob before/after training in
                the stats, and its change for positive- and negative-advantage rows); max_completion_tokens (truncate longer completions; None = keep all);
                dtype ("float32"; "auto": bfloat16 where the device computes it natively and it was measured
                faster, core/device_paths.py); device ("auto" = cuda when available).
    Forward:    shared_prompt (default None: the path measured faster on the device, `core.device_paths`:
                shared on the CPU, per-row on CUDA): True runs every distinct prompt of a micro-batch once, with
                gradients, and indexes its KV cache out to the rows that share it, so only the completion
                tokens run per row; False runs every row's prompt again (the reference path). Not part of the
                run hash (the same run either way). Same loss,
                gradients and log-probs up to float rounding; it also applies to the π_old/π_ref and after-
                training passes. Micro-batches keep the rows of one prompt together in both modes (see
                `micro_batches`), so a micro-batch of batch_size rows usually holds one or two prompts. With
                lora_dropout > 0 the rows of one prompt share the prompt's dropout mask.
    Unique rows: aggregate_unique (default True; objectives trained on groups only: spogw / grpo / grpo_nokl).
                With overlapping groups (the paper's C(16, 14) = 120 groups per query sharpened to 2t = 8
                rows) the data repeat each of ~12 distinct workflows 10-105 times (~960 rows per query).
                True trains on one row per distinct (prompt tokens, completion tokens, recorded π_old)
                carrying A⁺ = Σ of its positive Â, A⁻ = Σ of its negative Â, n⁺ = #groups with Â > 0 (the
                mKL weight; grpo: all its groups) and count = #rows it stands for; the loss divides by Σ
                count, i.e. by the number of per-group rows (`core.training.objectives`, module doc). Proven equal
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
    # Stop once the anchors' verdict is taken: after the first optimizer step at which, on at least this share
    # of the groups whose anchors score differently, the best anchor's token beats each lower anchor's at the
    # first token where they part (`core.training.anchor_choice`); `epochs` is then the most it trains. None: off.
    anchor_stop: float | None = None
    anchor_stop_margin: float = 0.0  # nats by which the best anchor's token must lead (anchor_stop only)

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
        if self.anchor_stop is not None:
            req_real("anchor_stop", 0.0, 1.0, lo_open=True)
        req_real("anchor_stop_margin", 0.0, math.inf)
        if self.dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ConfigError(f"{c}.dtype={self.dtype!r}: choose 'float32', 'bfloat16', 'float16' or 'auto' "
                              "(bfloat16 where the device computes it natively and it was measured faster).")

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
        drop_inactive_anchor_fields(d)  # runs from before the option keep their run hash
        return d

    def identity(self) -> dict[str, Any]:
        """What makes two runs the same run: `to_dict` without the forward path (`shared_prompt`), which changes
        how a batch is computed, not what is trained."""
        return config_identity(self.to_dict())


def drop_inactive_anchor_fields(d: dict[str, Any]) -> None:
    """Leave the anchors' fields out of a config dict where they change nothing: the off-policy loss at its
    default, γ unless the loss is "shaped", the anchors' stop and its margin while the stop is off."""
    if d.get("off_policy_loss", "clipped") == "clipped":
        d.pop("off_policy_loss", None)
    if d.get("off_policy_loss") != "shaped":
        d.pop("off_policy_gamma", None)
    if "anchor_stop" in d and d["anchor_stop"] is None:  # off: runs from before the option keep their run hash
        d.pop("anchor_stop")
        d.pop("anchor_stop_margin", None)


def config_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """A TrainConfig dict (a run's stats keep one) without what does not change the run: `shared_prompt`."""
    return {k: v for k, v in config.items() if k != "shared_prompt"}

