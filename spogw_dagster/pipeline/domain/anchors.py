"""Anchor rows (`generator.anchors`): the workflows the generator prompt shows, added to every training query's
samples, so that each group holds the structures the prompt offers beside what the policy sampled.

Why: a policy rarely samples a structure the prompt ranks low (the three-draft ensemble was 7 of 256 samples in
run H), so one iteration cannot tell it apart from the mode even where it is clearly better on the training
queries. An anchor is an off-policy row (LUFFY-style guidance in a GRPO group): it is executed and scored like
any sample and gets its group's advantage; its π_old is its teacher-forced log-prob under π_{k-1} at the
generator's temperature (no top-p, so every token has a finite log-prob). Anchors take the sample indices after
the m sampled ones, so a sampled copy of an anchor (a lower index) is the one near-duplicate filtering keeps.
They are marked by `finish_reason` "anchor".

An anchor's tokens end as a sampled workflow's do: the body, a blank line, then the `#` that starts the next
example (the generator's stop, `GENERATOR_STOP`). Without that end, run I's first try trained `)\n` as the last
token of a well-rewarded workflow, a token that in the generator's own samples is always followed by another
line: the checkpoint then wrote `return` lines after `return` on 32 of 40 held-out queries (invalid, dead code).
"""

from __future__ import annotations

from typing import Sequence

import polars as pl

from spogw_dagster.benchmarks.registry import get_spec
from spogw_dagster.contracts import Problem
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.data.tables import ANCHOR_FINISH
from spogw_dagster.workflow.template import as_completion, generator_prompt, shown_workflows

__all__ = ["ANCHOR_FINISH", "anchor_completions", "anchor_rows", "anchors_per_query"]

END = "\n#"  # after the body's last newline: the blank line and the next example's comment, where sampling stops


def anchor_completions(family: str, style: str) -> tuple[str, ...]:
    """The prompt's shown workflows as completions; a style that shows no fixed workflows has none to anchor on."""
    shown = shown_workflows(family, style)
    if not shown:
        raise ValueError(f"generator.anchors needs a prompt that shows fixed workflows; {style!r} shows none per "
                         "query alike; fix: set generator.prompt to 'anchored' or 'examples', or anchors to false")
    return tuple(as_completion(b) for b in shown)


def anchors_per_query(cfg) -> int:
    """How many anchor rows each training query gets under `cfg` (0 with `generator.anchors` off)."""
    g = cfg.generator
    return len(anchor_completions(get_spec(cfg.benchmark.name).family, g.prompt)) if g.anchors else 0


def anchor_rows(cfg, k: int, parent, problems: Sequence[Problem], first_idx: int, score=None) -> pl.DataFrame:
    """sampled_workflows rows of the anchors of each problem, sample indices from `first_idx`. `score(prompts,
    completions) -> (token ids, log-probs)` per pair (default: teacher-forced under base + the parent's adapter)."""
    g = cfg.generator
    family = problems[0].family
    completions = anchor_completions(family, g.prompt)
    prompts = [generator_prompt(p.family, p.question, g.prompt) for p in problems]
    pairs = [(p, c + END) for p in prompts for c in completions]
    ids, lps = (score or _teacher_forced(g, parent))([p for p, _ in pairs], [c for _, c in pairs])
    a = len(completions)
    _fits(max(len(i) for i in ids), g.max_new_tokens, cfg.training.max_completion_tokens)
    samples = [[tables.Sample(completions[j], ids[i * a + j], lps[i * a + j], ANCHOR_FINISH) for j in range(a)]
               for i in range(len(prompts))]
    return tables.sampled_frame(
        k, [p.id for p in problems], prompts, samples, family,
        parent_iteration=parent.iteration if parent else None, parent_sha256=parent.sha256 if parent else None,
        generator=g.model, sample_idx=[[first_idx + j for j in range(a)] for _ in prompts])


def _fits(longest: int, max_new_tokens: int, max_completion_tokens: int | None) -> None:
    """An anchor the policy could not write within its token budget is no structure it can learn, and one the
    trainer cuts loses its end (the failure the module docstring names): refuse both."""
    if longest > max_new_tokens:
        raise ValueError(f"an anchor workflow is {longest} tokens, above generator.max_new_tokens={max_new_tokens}: "
                         "the generator could never write it; raise max_new_tokens or set generator.anchors: false")
    if max_completion_tokens is not None and longest > max_completion_tokens:
        raise ValueError(f"an anchor workflow is {longest} tokens, above training.max_completion_tokens="
                         f"{max_completion_tokens}, so training would cut its end; raise it or set anchors: false")


def _teacher_forced(g, parent):
    def score(prompts: list[str], completions: list[str]) -> tuple[list[list[int]], list[list[float]]]:
        # lazy: both import torch, which loading the definitions must not
        from spogw_dagster.core.training import TrainExample, score_examples
        from spogw_dagster.models import load_model_and_tokenizer

        model, tok = load_model_and_tokenizer(g.model, dtype=g.dtype, adapter_path=parent.path if parent else None)
        try:
            # the trainer's own tokenization (the completion on its own, no special tokens)
            ids = [list(tok(c, add_special_tokens=False)["input_ids"]) for c in completions]
            lps = score_examples([TrainExample(prompt=p, completion=c, completion_token_ids=i)
                                  for p, c, i in zip(prompts, completions, ids)],
                                 model=model, tokenizer=tok, temperature=g.temperature, batch_size=4)
        finally:
            del model
        return ids, [[float(v) for v in lp] for lp in lps]

    return score
