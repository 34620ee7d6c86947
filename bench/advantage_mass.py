"""Where a curation setting would push the generator: the advantage mass per workflow structure, from a run's
sampled and scored workflows, without training anything.

A group's advantages say which of its workflows training makes more likely (Â > 0) and which less. Summed per
structure (the sequence of operator calls; an invalid or failed workflow is its status), they show what the
data teaches: whether the structure that answers better gets the positive mass, or the one that merely
parses. Each `--variant` re-curates the same rows with some `curation` fields changed (`core.curation.curate`,
the loop's own code) and prints groups, rows and (rows, Σ Â) per structure; `answer_only` scores every
workflow by its answer alone (0 unless it ran), the reward a pure-answer ladder gives; `valid_only` groups only
the workflows that ran (`curation.valid_only`).

    python bench/advantage_mass.py --config run.yaml --assets-dir ~/runs/a37/seed-0 [--iteration 0] \\
        --variant "" --variant "n=4,g_max=4,adv_std_floor=0.25" --variant "answer_only,n=4"

This is how the `answers` profile's curation was chosen (docs/methods.md): from the training data, never
from held-out scores.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEY = ["iteration", "query_id", "sample_idx"]


def structure(workflow: str | None, status: str) -> str:
    """The operator calls in order (`code_generate->test`), or `<status>` for a workflow that did not run."""
    if status != "ok":
        return f"<{status}>"
    return "->".join(re.findall(r"self\.(\w+)\(", workflow or "")) or "<no call>"


def parse_variant(text: str) -> tuple[bool, dict[str, float | int | bool]]:
    """"answer_only,n=4,adv_std_floor=0.25" -> (True, {"n": 4, "adv_std_floor": 0.25}); a bare `valid_only` sets
    that curation field."""
    answer_only, fields = False, {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part == "answer_only":
            answer_only = True
            continue
        if part == "valid_only":
            fields["valid_only"] = True
            continue
        name, _, value = part.partition("=")
        if not value:
            raise SystemExit(f"--variant {text!r}: {part!r} is not name=value (or answer_only, valid_only)")
        try:
            fields[name] = float(value) if "." in value else int(value)
        except ValueError:
            raise SystemExit(f"--variant {text!r}: {value!r} is not a number (a flag is written bare: "
                             "answer_only, valid_only)") from None
    return answer_only, fields


def advantage_mass(rows, cfg, answer_only: bool):
    """(curation summary, {structure: (rows, Σ advantage)}) of `rows` (the curation input plus answer_score)."""
    import polars as pl

    from spogw_dagster.core import curation

    inp = rows.drop("answer_score")
    if answer_only:
        inp = inp.with_columns(pl.when(pl.col("status") == "ok").then(rows["answer_score"].fill_null(0.0))
                               .otherwise(0.0).alias("score"))
    res = curation.curate(inp, cfg)
    members = res.members.join(rows.select(KEY + ["workflow", "status"]), on=KEY)
    count: Counter[str] = Counter()
    mass: defaultdict[str, float] = defaultdict(float)
    for r in members.iter_rows(named=True):
        s = structure(r["workflow"], r["status"])
        count[s] += 1
        mass[s] += r["advantage"]
    return res.summary, {s: (count[s], mass[s]) for s in sorted(count, key=lambda s: -abs(mass[s]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the run's YAML config (or a profile name)")
    ap.add_argument("--assets-dir", required=True, type=Path, help="the run's seed folder")
    ap.add_argument("--seed", type=int, default=None,
                    help="the training seed the run used (`spogw run --seeds`: it seeds group sampling); default: "
                         "N when the folder is named seed-N, else the config's")
    ap.add_argument("--iteration", type=int, default=None,
                    help="only this iteration's partition (default: every iteration in the folder)")
    ap.add_argument("--variant", action="append", default=None,
                    help='curation fields to change, "name=value,..." (and/or answer_only, valid_only); "" = as run')
    args = ap.parse_args(argv)
    import polars as pl

    from spogw_dagster.pipeline.data import tables
    from spogw_dagster.pipeline.settings import load_config

    seed = args.seed
    if seed is None and (m := re.fullmatch(r"seed-(\d+)", args.assets_dir.resolve().name)):
        seed = int(m.group(1))
    # a --seeds run overrides the seeds per seed folder; without them group sampling draws other groups
    over = {"curation": {"seed": seed}} if seed is not None else None
    cfg = (load_config(config_file=args.config, overrides=over) if Path(args.config).is_file()
           else load_config(args.config, overrides=over))
    pattern = "*.parquet" if args.iteration is None else f"{args.iteration:04d}.parquet"
    files = {t: sorted((args.assets_dir / t).glob(pattern)) for t in ("sampled_workflows", "execution_scores")}
    if not all(files.values()):
        raise SystemExit(f"no {pattern} in {args.assets_dir}/sampled_workflows and execution_scores")
    sampled = pl.read_parquet(files["sampled_workflows"])
    scores = pl.read_parquet(files["execution_scores"])
    rows = tables.curation_input(sampled, scores).join(scores.select(KEY + ["answer_score"]), on=KEY)
    print(f"{sampled.height} sampled workflows of {sampled['query_id'].n_unique()} queries in {args.assets_dir}, "
          f"curation seed {cfg.curation.seed}")
    for text in args.variant or [""]:
        answer_only, fields = parse_variant(text)
        try:
            ccfg = replace(cfg.curation_config(), **fields)
        except (TypeError, ValueError) as e:  # not a curation field, or a value the field refuses (ConfigError)
            raise SystemExit(f"--variant {text!r}: {e}; the fields are those of `curation:`") from None
        summary, by = advantage_mass(rows, ccfg, answer_only)
        cells = ", ".join(f"{s} {n} rows {m:+.2f}" for s, (n, m) in by.items())
        print(f"[{text or 'as run'}] {summary['groups_kept']} groups, {summary['member_rows']} rows, "
              f"{summary['queries_with_groups']} queries: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
