"""Train one iteration of a finished run again at other training settings, on the same data: no sampling and no
executor call, so a learning rate or an epoch count is compared on identical groups.

It reads the iteration's stored sharpened_groups, sampled_workflows and execution_scores, builds the training
examples the loop builds (`training_inputs.training_data`, `training.min_queries` applied) and trains them from
the run's parent adapter with the changed `training:` fields. `--curation FIELD=VALUE` sharpens the stored
screened_groups again with changed `curation:` fields first (e.g. anchor_weight=3), as the sharpened_groups asset
does: the groups stay the same, their members' advantages change. `--check` trains nothing: it says whether the run's
own checkpoint is exactly what these examples and the unchanged settings train (the trainer's run hash), which
proves the data path before a retrained adapter is compared with it. Score the adapter with
`bench/structure_margin.py --adapter NAME=OUT` (no executor) or `spogw evaluate --adapter OUT`.

    python bench/retrain.py --config run.yaml --assets-dir ~/runs/i37b --seed 1 --check
    python bench/retrain.py --config run.yaml --assets-dir ~/runs/i37b --seed 1 --set epochs=3 --out ~/runs/s1-e3
    python bench/retrain.py --config run.yaml --assets-dir ~/runs/r57 --seed 0 --curation anchor_weight=3 --out ~/runs/w3

`--assets-dir` is a `spogw run --seeds` root (its `seed-<s>` folders share one call cache) or, without `--seed`,
one run's own assets directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the run's YAML config (or a profile name)")
    ap.add_argument("--assets-dir", required=True, type=Path, help="a --seeds root, or a run's assets directory")
    ap.add_argument("--seed", type=int, default=None, help="the training seed (its seed-<s> folder, as --seeds)")
    ap.add_argument("--iteration", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a training field to change, e.g. epochs=3 or learning_rate=2e-3 (YAML value; repeatable)")
    ap.add_argument("--curation", action="append", default=[], metavar="FIELD=VALUE",
                    help="a curation field to change before training, e.g. anchor_weight=3 (re-sharpens; repeatable)")
    ap.add_argument("--out", type=Path, default=None, help="where the new adapter goes")
    ap.add_argument("--snapshots", default="", metavar="E1,E2",
                    help="also save the shorter runs of these epochs on the way, as OUT-e<E> (constant LR only)")
    ap.add_argument("--check", action="store_true", help="train nothing: does the run's checkpoint match?")
    return ap.parse_args(argv)


def field_overrides(pairs: list[str], flag: str = "--set") -> dict:
    """FIELD=VALUE pairs as a section's overrides: numbers as numbers (YAML reads 2e-3 as text), else YAML."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"{flag} {pair!r}: give FIELD=VALUE, e.g. epochs=3")
        for number in (int, float):
            try:
                out[name] = number(value)
                break
            except ValueError:
                continue
        else:
            out[name] = yaml.safe_load(value)
    return out


def _print_anchor_check(step: dict) -> None:
    print(f"  step {step['step'] + 1}: anchor groups decided {step.get('anchor_decided')}, mean smallest gap "
          f"{step.get('anchor_gap')}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.check and args.out is None:
        raise SystemExit("give --out (where the adapter goes) or --check")
    from spogw_dagster.core import curation
    from spogw_dagster.core.training import finished_run
    from spogw_dagster.core.training.launch import fit_adapter
    from spogw_dagster.pipeline.data import tables, training_inputs
    from spogw_dagster.pipeline.data.checkpoints import trained_dir
    from spogw_dagster.pipeline.data.iteration_keys import iteration_key, previous_key
    from spogw_dagster.pipeline.data.storage import AssetStore
    from spogw_dagster.pipeline.domain.headline import seed_overrides
    from spogw_dagster.pipeline.settings import deep_merge, load_config

    over = seed_overrides(args.seed, args.assets_dir / "call_cache.sqlite") if args.seed is not None else {}
    over = deep_merge(over, {"training": field_overrides(args.set),
                             "curation": field_overrides(args.curation, "--curation")})
    is_file = Path(args.config).is_file()
    cfg = load_config(None if is_file else args.config, args.config if is_file else None, over)
    store = AssetStore(args.assets_dir / f"seed-{args.seed}" if args.seed is not None else args.assets_dir)
    key, k = iteration_key(args.iteration), args.iteration
    sampled, scores = (store.read_parquet(n, key) for n in ("sampled_workflows", "execution_scores"))
    if args.curation:  # the same groups, sharpened and weighed as the changed curation fields say
        sharpened = curation.sharpen(tables.kept_groups(store.read_parquet("screened_groups", key)),
                                     cfg.curation_config()).members
    else:
        sharpened = store.read_parquet("sharpened_groups", key)
    tcfg = cfg.train_config()
    examples, rows, narrow = training_inputs.iteration_training_data(tcfg, cfg.training.min_queries, sharpened,
                                                                     sampled, scores, k)
    if narrow or not examples:
        raise SystemExit(f"iteration {key} has nothing to train: {narrow or tcfg.spec.no_data}")
    parent = store.adapter_dir(previous_key(key)) if k > 0 else None
    off = sum(e.off_policy for e in examples)
    print(f"{len(examples)} examples ({off} off-policy) on {rows['query_id'].n_unique()} queries; {tcfg.objective}, lr "
          f"{tcfg.learning_rate}, {tcfg.epochs} epochs, seed {tcfg.seed}", flush=True)
    if args.check:  # with selection on, a trained adapter the gate refused is in <k>.trained
        folders = (store.adapter_dir(key), trained_dir(store, key))
        same = any(finished_run(examples, tcfg, f, cfg.generator.model, parent) is not None for f in folders)
        print(f"the run's lora_checkpoint[{key}] is {'exactly' if same else 'NOT'} this training run")
        return 0 if same else 1
    snaps = {int(e): args.out.with_name(f"{args.out.name}-e{int(e)}") for e in args.snapshots.split(",") if e}
    res = fit_adapter(examples, tcfg, args.out, base_model=cfg.generator.model, previous_adapter=parent,
                      processes=cfg.training.processes, progress=lambda m: print(m, flush=True), snapshots=snaps,
                      log=_print_anchor_check if tcfg.anchor_stop is not None else None)
    s = res.stats.get("summary", {})
    print(f"adapter: {args.out} ({s.get('optimizer_steps')} steps, last loss {s.get('last_loss')}, "
          f"{s.get('total_seconds')} s)")
    if tcfg.anchor_stop is not None:  # each step's check was printed as it ran (_print_anchor_check)
        print("stopped early: the anchors' verdict was taken" if s.get("stopped_early") else "ran every epoch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
