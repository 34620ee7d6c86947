"""How far training moved the generator between workflow structures, measured on the prompts it is judged on.

Greedy decoding picks the argmax; a checkpoint whose samples shifted toward a better structure can still
write the base's greedy workflow on every held-out query. This script shows how far the argmax is from
flipping: for each held-out query it scores, teacher-forced at T = 1, the structures the anchored prompt shows
(IO, `code_generate -> test`, `3 x code_generate -> sc_ensemble -> test`) as completions of that query's
generator prompt, under the base model and under each checkpoint of a run, and prints per policy

- the mean total log-prob of each structure, and the mean margin of each against the one the base prefers;
- on how many queries each structure is the most likely of the three (a proxy for what greedy writes);
- the first-token probabilities that decide the structure (" solution" vs " solutions"), and on how many queries
  " solutions" is the likelier of the two: the sequences' log-probs rank whole workflows, greedy decoding picks
  token by token, so a structure most likely as a whole can still lose the first token.

Nothing is executed and nothing is written. The completions are written the way the generator writes them
(a leading space after the prompt's prefilled indentation, then 9-space lines), so that the tokens match.

    python bench/structure_margin.py --config run.yaml --assets-dir ~/runs/a37/seed-0 [--limit 40]

`--split validation` reads the validation prompts instead (where training settings are chosen: no answer is
used here, but a choice made on test prompts is still a choice made on test), and `--adapter NAME=PATH` adds an
adapter trained outside the run (e.g. the same data at another learning rate) beside the run's checkpoints.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The anchored prompt's three structures, as completions of its last example slot (what `generator.anchors` adds).
from spogw_dagster.pipeline.domain.anchors import anchor_completions  # noqa: E402

STRUCTURES = dict(zip(("io", "gen_test", "sc3_test"), anchor_completions("code", "anchored")))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the run's YAML config (or a profile name)")
    ap.add_argument("--assets-dir", required=True, type=Path, help="the run's seed folder (holds lora_checkpoint/)")
    ap.add_argument("--limit", type=int, default=None, help="first N held-out queries (default: the config's)")
    ap.add_argument("--split", choices=("test", "validation"), default="test",
                    help="whose prompts: the report's held-out test queries, or the validation split")
    ap.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                    help="another adapter to score beside the run's checkpoints (repeatable)")
    ap.add_argument("--json", type=Path, default=None, help="also write the per-query numbers here")
    return ap.parse_args(argv)


def structure_logprobs(model, tok, prompts: list[str]) -> dict[str, list[float]]:
    """Total log-prob (T = 1) of each structure as the completion of each prompt."""
    from spogw_dagster.core.training import TrainExample, score_examples

    out: dict[str, list[float]] = {}
    for name, body in STRUCTURES.items():
        lps = score_examples([TrainExample(prompt=p, completion=body) for p in prompts], model=model, tokenizer=tok,
                             temperature=1.0, batch_size=4)
        out[name] = [float(sum(lp)) for lp in lps]
    return out


def first_token_probs(model, tok, prompts: list[str], words=(" solution", " solutions")) -> dict[str, list[float]]:
    """p(first completion token = w) for each word (its first token), per prompt."""
    import torch

    ids = {w: tok(w, add_special_tokens=False)["input_ids"][0] for w in words}
    out: dict[str, list[float]] = {w: [] for w in words}
    with torch.no_grad():
        for p in prompts:
            x = torch.tensor([tok(p)["input_ids"]])
            probs = torch.softmax(model(input_ids=x).logits[0, -1].float(), -1)
            for w, i in ids.items():
                out[w].append(float(probs[i]))
    return out


def summarize(name: str, lp: dict[str, list[float]], ft: dict[str, list[float]]) -> dict:
    n = len(next(iter(lp.values())))
    best = [max(lp, key=lambda s: lp[s][i]) for i in range(n)]
    mean = {s: sum(v) / n for s, v in lp.items()}
    margin = {s: sum(lp[s][i] - lp["gen_test"][i] for i in range(n)) / n for s in lp}
    # greedy decodes token by token: where " solutions" beats " solution" as the first token is where greedy can
    # open the ensemble, whatever the whole sequences' log-probs say
    opens = sum(b > a for a, b in zip(ft[" solution"], ft[" solutions"]))
    return {"policy": name, "queries": n, "mean_logprob": mean, "mean_margin_vs_gen_test": margin,
            "most_likely": {s: best.count(s) for s in lp},
            "first_token_mean_p": {w: sum(v) / n for w, v in ft.items()}, "solutions_first": opens}


def prompt_problems(cfg, split: str) -> list:
    """The queries a report on `split` scores: the held-out test queries, or the validation split's (those the
    validation gate scores)."""
    from spogw_dagster.pipeline.domain.heldout import heldout_problems

    report = cfg.report.model_copy(update={"split": split})
    return heldout_problems(cfg.model_copy(update={"report": report}))[0]


def _named_adapter(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    folder = Path(path).expanduser()  # `~` after `=` is not expanded by every shell
    if not sep or not name or not folder.is_dir():
        raise SystemExit(f"--adapter {text!r}: give NAME=PATH with PATH an adapter folder")
    return name, str(folder)


def main(argv=None) -> int:
    args = parse_args(argv)
    import polars as pl

    from spogw_dagster.models import load_model_and_tokenizer
    from spogw_dagster.pipeline.settings import load_config
    from spogw_dagster.workflow.template import generator_prompt

    cfg = load_config(config_file=args.config) if Path(args.config).is_file() else load_config(args.config)
    problems = prompt_problems(cfg, args.split)[: args.limit]
    prompts = [generator_prompt(p.family, p.question, cfg.generator.prompt) for p in problems]
    # a run stopped before training (only its data, for adapters trained by bench/retrain.py) has no checkpoint
    files = sorted((args.assets_dir / "lora_checkpoint").glob("*.parquet"))
    ckpts = pl.read_parquet(files).sort("iteration").iter_rows(named=True) if files else []
    policies = [("base", None)] + [(f"checkpoint {r['iteration']:04d}", r["adapter_path"]) for r in ckpts]
    policies += [_named_adapter(a) for a in args.adapter]
    rows, per_query = [], {}
    for name, adapter in policies:
        model, tok = load_model_and_tokenizer(cfg.generator.model, adapter_path=adapter)
        model.eval()
        lp, ft = structure_logprobs(model, tok, prompts), first_token_probs(model, tok, prompts)
        rows.append(summarize(name, lp, ft))
        per_query[name] = {"query_ids": [p.id for p in problems], "logprob": lp, "first_token_p": ft}
        del model
    print(f"structure log-probs on {len(prompts)} {args.split} prompts ({cfg.benchmark.name}, prompt "
          f"{cfg.generator.prompt!r}); margin = log p(structure) - log p(gen_test), mean over queries")
    print(f"{'policy':<16}" + "".join(f"{s:>24}" for s in STRUCTURES) + f"{'p( solution)':>14}{'p( solutions)':>15}"
          f"{'solutions first':>17}")
    for r in rows:
        cells = "".join(f"{r['mean_margin_vs_gen_test'][s]:>+10.2f} (top {r['most_likely'][s]:>2}/{r['queries']})    "
                        for s in STRUCTURES)
        ft = r["first_token_mean_p"]
        print(f"{r['policy']:<16}{cells}{ft[' solution']:>14.3f}{ft[' solutions']:>15.3f}"
              f"{r['solutions_first']:>11}/{r['queries']}")
    if args.json:
        args.json.write_text(json.dumps({"summary": rows, "per_query": per_query}, indent=1))
    return 0 if all(math.isfinite(v) for r in rows for v in r["mean_logprob"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
