"""The optimisation loop: AdamW over seeded micro-batches, the LR schedule, one optimizer step's gradients."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from spogw_dagster.core.training.batching import Item, micro_batches
from spogw_dagster.core.training.config import TrainConfig
from spogw_dagster.core.training.distributed import SINGLE, Dist
from spogw_dagster.core.training.passes import micro_batch_logprobs, micro_batch_objective


def lr_lambda(cfg: TrainConfig, total_steps: int) -> Callable[[int], float]:
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


@dataclass
class OptimizeRun:
    steps: list[dict[str, Any]]
    tokens: int
    seconds: float
    stopped_early: bool = False

    def summary(self) -> dict[str, Any]:
        return {
            "optimizer_steps": len(self.steps),
            "completion_tokens_trained": self.tokens,
            "train_seconds": round(self.seconds, 3),
            "train_tokens_per_second": round(self.tokens / self.seconds, 2) if self.seconds > 0 else None,
            "first_loss": self.steps[0].get("loss") if self.steps else None,
            "last_loss": self.steps[-1].get("loss") if self.steps else None,
            **({"stopped_early": True} if self.stopped_early else {}),  # by `stop` (anchor_stop)
        }


def optimize(model, params, items: list[Item], cfg: TrainConfig, pad_id: int, device,
              log: Callable[[dict[str, Any]], None] | None,
              progress: Callable[[str], None] | None = None, dist: Dist = SINGLE,
              epoch_end: Callable[[int, OptimizeRun], None] | None = None,
              stop: Callable[[dict[str, Any]], bool] | None = None) -> OptimizeRun:
    """AdamW over `epochs` of seeded batches; each optimizer step averages grad_accum micro-batches by rows.
    `progress` gets a line as each step starts and ends (what a watcher, or the fault suite, waits on);
    `epoch_end(epochs done, run so far)` is called after each epoch (`core.training.snapshots`); `stop(step's
    record)`, after each step, ends the run when it returns True (it may add to the record: the log gets it)."""

    opt = torch.optim.AdamW(
        params, lr=cfg.learning_rate, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps, weight_decay=cfg.weight_decay
    )
    epoch_batches = [micro_batches(items, cfg, e) for e in range(cfg.epochs)]
    total_steps = sum(math.ceil(len(b) / cfg.grad_accum) for b in epoch_batches)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg, total_steps))
    torch.manual_seed(cfg.seed)
    model.train()
    run = OptimizeRun([], 0, 0.0)
    t_train = time.perf_counter()
    for epoch, batches in enumerate(epoch_batches):
        for s in range(0, len(batches), cfg.grad_accum):
            where = f"optimizer step {len(run.steps) + 1}/{total_steps} (epoch {epoch + 1}/{cfg.epochs})"
            if progress is not None:
                progress(f"{where} started")
            st = optimizer_step(model, params, opt, batches[s : s + cfg.grad_accum], cfg, pad_id, device,
                                 dist)
            st = {"step": len(run.steps), "epoch": epoch, "lr": sched.get_last_lr()[0], **st}
            opt.step()
            sched.step()
            run.tokens += st["tokens"]
            run.steps.append(st)
            t_pause = time.perf_counter()
            last = len(run.steps) == total_steps
            # at the run's last step there is nothing left to stop (the check still records where it stands)
            run.stopped_early = stop is not None and stop(st) and not last
            t_train += time.perf_counter() - t_pause  # the check is not training time
            if log is not None:
                log(st)
            if progress is not None:
                progress(f"{where} done: loss {st.get('loss', float('nan')):.4g}")
            if run.stopped_early:
                break
        epoch_done = not run.stopped_early or s + cfg.grad_accum >= len(batches)
        run.seconds = time.perf_counter() - t_train
        if epoch_end is not None and epoch_done:  # a stop on an epoch's last step still ends that epoch
            t_pause = time.perf_counter()
            epoch_end(epoch + 1, run)
            t_train += time.perf_counter() - t_pause  # a snapshot's pass and save are not training time
        if run.stopped_early:
            break
    run.seconds = time.perf_counter() - t_train
    return run


def optimizer_step(model, params, opt, group: list[list[Item]], cfg: TrainConfig,
                    pad_id: int, device, dist: Dist = SINGLE) -> dict[str, Any]:
    """Gradients of one optimizer step (each micro-batch's loss weighted by its share of the rows), clipped.

    A row's share is its `count` (the per-group rows a unique-workflow row stands for; 1 otherwise), so the step
    averages over the per-group rows it represents, as the loss does within a micro-batch. Across processes
    each rank runs its share of the step's micro-batches (weighted by their share of the whole step) and the
    gradients, metrics and token counts are summed over the ranks before clipping (`core.training.distributed`)."""

    rows_in_step = sum(x.count for b in group for x in b)
    ts = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    acc: dict[str, float] = {}
    tokens = 0
    for mb in dist.shard(group):
        logp, cb = micro_batch_logprobs(model, mb, cfg, pad_id, device)
        res = micro_batch_objective(mb, cfg, logp, cb.completion_mask, device)
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

