"""Where the time of a `spogw run` goes: per stage, and inside each, from the run's own records.

Reads finished runs' assets directories (the Dagster instance under `<assets>/.dagster` and the asset tables)
and prints, per run, side by side:

  - each asset's wall seconds (its materialization's `wall_s`) and the run's wall clock (Dagster's run records);
  - sampling: generated tokens and tokens/s, the generator's dtype, and (runs from 2026-12-07 on) the sampler's
    model load, prefill and decode seconds;
  - executing (execution_scores) and the report: executor calls, prompt and completion tokens, and (runs from
    2026-12-07 on) the executor's own split: seconds served vs queued for a worker, llama.cpp's prefill and
    decode seconds; the report's generation seconds (writing the held-out workflows);
  - training: the π_old / π_ref pass (`precompute_seconds`) against the optimizer steps (`train_seconds`).

With two runs it prints, per stage and in all,

    RATIO answers-loop before/after = X     (the first run's wall over the second's)

    python bench/loop_profile.py before=/root/runs/before/assets after=/root/runs/after/assets [--iteration 0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import polars as pl  # noqa: E402

STAGES = ("sampled_workflows", "execution_scores", "screened_groups", "sharpened_groups", "lora_checkpoint",
          "benchmark_report")


def _value(v: Any) -> Any:
    """A Dagster metadata value as plain data."""
    for attr in ("value", "data", "text", "path"):
        if hasattr(v, attr):
            return getattr(v, attr)
    return v


def read_run(assets: Path, iteration: int) -> dict[str, Any]:
    import dagster as dg

    home = assets / ".dagster"
    if not home.is_dir():
        sys.exit(f"{assets}: no Dagster instance at {home}; fix: pass the --assets-dir of a finished `spogw run`")
    os.environ["DAGSTER_HOME"] = str(home)
    key = f"{iteration:04d}"
    out: dict[str, Any] = {"stages": {}, "meta": {}}
    with dg.DagsterInstance.get() as instance:
        for name in STAGES:
            recs = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(name), asset_partitions=[key]), limit=1).records
            if not recs:
                continue
            md = {k: _value(v) for k, v in recs[0].asset_materialization.metadata.items()}
            out["meta"][name] = md
            out["stages"][name] = float(md.get("wall_s") or 0)
        runs = [r for r in instance.get_run_records() if r.start_time and r.end_time]
        if runs:
            out["run_wall_s"] = max(r.end_time for r in runs) - min(r.start_time for r in runs)
    tables = {}
    for name in ("sampled_workflows", "execution_scores", "heldout_results"):
        p = assets / name / f"{key}.parquet"
        if p.is_file():
            tables[name] = pl.read_parquet(p)
    out["tables"] = tables
    return out


def inner(run: dict[str, Any]) -> dict[str, str]:
    """One line of detail per stage."""
    meta, tables = run["meta"], run["tables"]
    lines: dict[str, str] = {}
    sw = meta.get("sampled_workflows", {})
    if "sampled_workflows" in tables:
        toks = int(tables["sampled_workflows"]["n_tokens"].sum())
        timing = sw.get("sampling_time") or {}
        split = (f"; load {timing.get('load_s', 0):.0f} s, prefill {timing.get('prefill_s', 0):.0f} s, decode "
                 f"{timing.get('decode_s', 0):.0f} s" if timing else "")
        lines["sampled_workflows"] = (f"{toks} tokens at {sw.get('generation_tokens_per_s', 0):.1f} tok/s, "
                                      f"{sw.get('generator_dtype', 'float32')}{split}")
    for name, table in (("execution_scores", "execution_scores"), ("benchmark_report", "heldout_results")):
        if table not in tables:
            continue
        t = tables[table]
        calls, cached = int(t["llm_calls"].sum()), int(t["cached_calls"].sum())
        pt, ct = int(t["prompt_tokens"].sum()), int(t["completion_tokens"].sum())
        s = f"{calls} executor calls ({cached} cached), {pt} prompt + {ct} completion tokens"
        ts = meta.get(name, {}).get("executor_time") or {}
        if ts.get("calls"):
            s += (f"; served {ts['served_s']:.0f} s (prefill {ts['prefill_s']:.0f}, decode {ts['decode_s']:.0f}), "
                  f"queued {ts['queued_s']:.0f} s")
        gen = meta.get(name, {}).get("generation_s")
        if gen:
            s += f"; generating the workflows {gen:.0f} s"
        lines[name] = s
    lc = meta.get("lora_checkpoint", {})
    summ = lc.get("training_summary") or {}
    if isinstance(summ, str):
        summ = json.loads(summ)
    if summ:
        lines["lora_checkpoint"] = (f"{summ.get('optimizer_steps', '?')} optimizer steps {summ.get('train_seconds', 0):.0f} s, "
                                    f"π_old/π_ref pass {summ.get('precompute_seconds', 0):.0f} s, in all "
                                    f"{summ.get('total_seconds', 0):.0f} s")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="label=ASSETS_DIR (one or two)")
    ap.add_argument("--iteration", type=int, default=0)
    a = ap.parse_args()
    runs = []
    for spec in a.runs:
        label, _, path = spec.partition("=")
        if not path:
            label, path = Path(spec).parent.name or spec, spec
        runs.append((label, read_run(Path(path).expanduser(), a.iteration)))
    width = 12
    print(f"{'stage':<20}" + "".join(f"{label:>{width}}" for label, _ in runs)
          + ("  ratio" if len(runs) == 2 else ""))
    for name in STAGES:
        vals = [r["stages"].get(name) for _, r in runs]
        row = f"{name:<20}" + "".join(f"{(v / 60 if v else 0):>{width - 4}.1f} min" for v in vals)
        if len(runs) == 2 and vals[0] and vals[1]:
            row += f"  {vals[0] / vals[1]:.2f}"
        print(row)
    totals = [r.get("run_wall_s") or sum(r["stages"].values()) for _, r in runs]
    print(f"{'run (wall clock)':<20}" + "".join(f"{t / 60:>{width - 4}.1f} min" for t in totals))
    for label, r in runs:
        print(f"\n{label}:")
        for name, line in inner(r).items():
            print(f"  {name}: {line}")
    if len(runs) == 2:
        print(f"\nRATIO answers-loop {runs[0][0]}/{runs[1][0]} = {totals[0] / totals[1]:.2f}")


if __name__ == "__main__":
    main()
