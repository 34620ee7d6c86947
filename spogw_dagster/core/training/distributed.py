"""Data-parallel training across processes: what `train_lora` does when `accelerate launch` starts it N times.

Every process holds the whole model and the same seeded LoRA; the data are sharded by micro-batch: an optimizer
step's micro-batches (`grad_accum` of them, the global batch) are dealt round-robin to the ranks, each rank
back-propagates its share weighted by its rows' share of the whole step, and the LoRA gradients are summed
across ranks (one flat all-reduce, as DDP's bucketed all-reduce does) before clipping and the AdamW step. So
the step's gradient is the 1-process gradient up to the order of a float sum, every rank applies the same
update, and the adapter is the 1-process adapter within float rounding. The no-grad passes (π_old, π_ref,
the after-training log-probs) are sharded by batch and gathered, so each rank ends with every row's numbers.

Why gradients are all-reduced by hand instead of wrapping the model in `DistributedDataParallel`: the shared-
prompt forward runs the model twice per micro-batch (prompt, then completions from its KV cache), which DDP's
one-forward-one-backward bookkeeping rejects; only the LoRA tensors (a few MB) need the reduce.

The process group comes from accelerate (`PartialState`): gloo on the CPU, NCCL on CUDA devices. A single
process (no launcher) is `SINGLE`: every function here is then the identity. A rank that fails mid-run leaves
the others in a collective: the launcher (torch's elastic agent) stops them all, and the run fails as a whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["Dist", "SINGLE", "from_environment", "launched", "shutdown"]


def launched() -> bool:
    """Whether this process was started by a multi-process launcher (accelerate launch / torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@dataclass(frozen=True)
class Dist:
    """This process's place among the training processes."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = ""  # the launcher's device for this process (accelerate: cuda:<local rank % GPUs>, or cpu)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, seq: Sequence[Any]) -> list[Any]:
        """This rank's share of `seq`: every world-th element from position rank (round-robin)."""
        return list(seq[self.rank :: self.world])

    def sum_gradients(self, params) -> None:
        """Sum each parameter's gradient over the ranks in place (a rank with no micro-batch adds zeros)."""
        if self.world == 1:
            return
        import torch  # heavy: only a run of several processes needs it
        import torch.distributed as dist  # heavy: only a run of several processes needs it

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        at = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[at : at + n].view_as(p.grad))
            at += n

    def sum_numbers(self, d: dict[str, float]) -> dict[str, float]:
        """The sum over ranks of each value of `d` (keys: the union over ranks; absent counts as 0)."""
        if self.world == 1:
            return d
        merged: dict[str, float] = {}
        for part in self.gather(d):
            for k, v in part.items():
                merged[k] = merged.get(k, 0.0) + v
        return merged

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (picklable objects: a few rows of floats per call)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist  # heavy: only a run of several processes needs it

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist  # heavy: only a run of several processes needs it

            dist.barrier()



SINGLE = Dist()


def from_environment(cpu: bool) -> Dist:
    """The process group of a launched run (initialized once, by accelerate), or SINGLE without a launcher."""
    if not launched():
        return SINGLE
    from accelerate import PartialState  # heavy: only a launched run needs it

    state = PartialState(cpu=cpu)  # cpu=True: gloo; otherwise the accelerator's backend (NCCL on CUDA)
    return Dist(rank=state.process_index, world=state.num_processes, local_rank=state.local_process_index,
                device=str(state.device))


def shutdown() -> None:
    """Leave the process group (a launched process's last step; NCCL warns about a group never destroyed)."""
    import torch.distributed as dist  # heavy: keeps torch out of this module's import

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
