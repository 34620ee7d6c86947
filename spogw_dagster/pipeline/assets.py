"""The six software-defined assets, all partitioned by iteration. Each is thin: read inputs, call the core,
return a Polars frame (stored by the Parquet IO manager) and attach the metadata a user wants to see.

    sampled_workflows(k)  m workflows per training query from π_{k-1} (base model at k = 0), with token
                          log-probs; fails fast when lora_checkpoint(k-1) is missing
    execution_scores(k)   every workflow executed R times in the sandbox against the executor, scored
    screened_groups(k)    executor errors and near-duplicates out, groups of n formed and screened by score std
    sharpened_groups(k)   top-t and bottom-t of each kept group with group-normalised advantages
    lora_checkpoint(k)    LoRA adapter trained with the configured objective (ioGRPO + mKL by default)
    benchmark_report(k)   held-out valid / executes / trivial rates, mean reward and answer score of checkpoint k
                          beside π_{k-1} and static baselines, greedy and k samples per query, with 95%
                          intervals and the paired difference to π_{k-1} (see heldout.py for the seeds)
"""

import asyncio
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from ..seeds import derive_seed
from . import tables
from .config import SpogwConfig, section_hash
from .lineage import MissingCheckpointError, adapter_sha256, parent_checkpoint
from .partitions import iterations, key_to_int
from .resources import EvalJob, SpogwResource, evaluate_jobs
from .rewards import Ladder
from .versions import code_version

GROUP = "spogw"
# Progress lines for terminals (`spogw run` prints this logger); the same text goes to the Dagster event log.
PROGRESS = logging.getLogger("spogw.progress")


def _say(context, msg: str) -> None:
    context.log.info(msg)
    asset = context.assets_def.key.to_user_string()
    PROGRESS.info("[%s] %-17s %s", context.partition_key, asset, msg)


def _common_metadata(cfg: SpogwConfig, asset: str, t0: float) -> dict[str, Any]:
    return {
        "config_hash": dg.MetadataValue.text(cfg.hash),
        "config_section_hash": dg.MetadataValue.text(section_hash(cfg, asset)[:16]),
        "profile": dg.MetadataValue.text(cfg.profile),
        "wall_s": dg.MetadataValue.float(round(time.monotonic() - t0, 2)),
    }


def _md_table(rows: dict[str, Any], head: tuple[str, str] = ("", "count")) -> dg.MetadataValue:
    lines = [f"| {head[0]} | {head[1]} |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows.items()]
    return dg.MetadataValue.md("\n".join(lines))


def _generate(spogw: SpogwResource, adapter: Path | None, problems, *, n: int, temperature: float, seed: int):
    """Sample `n` workflows per problem from base (+ adapter); returns (prompts, samples, tokens/s)."""
    from .heldout import generate_samples

    return generate_samples(spogw, adapter, problems, n=n, temperature=temperature, seed=seed)


def _report_metadata(store, key: str, report: pl.DataFrame, split_info: dict[str, Any], prev_system: str,
                     prev_reused: bool) -> dict[str, Any]:
    """The report table, headline numbers, the split used and the learning curve over every stored report."""
    from .plots import learning_curve_plot

    md: dict[str, Any] = {
        "report": dg.MetadataValue.md(tables.report_table_text(report)),
        "split": dg.MetadataValue.json(split_info),
        "split_ids_sha256": dg.MetadataValue.text(split_info["ids_sha256"]),
        "previous_system": dg.MetadataValue.text(prev_system),
        "previous_reused_from_report": dg.MetadataValue.bool(prev_reused),
        "heldout_queries": dg.MetadataValue.int(split_info["queries"]),
    }
    for metric in ("valid_rate", "executes_rate", "mean_reward", "answer_score", "trivial_rate"):
        r = tables.metric_row(report, "checkpoint", metric)
        if r is None:
            continue
        md[metric] = dg.MetadataValue.float(round(r["value"], 4))
        md[f"{metric}_ci95"] = dg.MetadataValue.json([round(r["ci_low"], 4), round(r["ci_high"], 4)])
        if r["diff_vs_prev"] is not None:
            md[f"{metric}_diff_vs_previous"] = dg.MetadataValue.json(
                [round(r["diff_vs_prev"], 4), round(r["diff_ci_low"], 4), round(r["diff_ci_high"], 4)])
    # the curve over all materialized iterations: stored reports of other partitions plus this one
    others = [store.read_parquet("benchmark_report", p) for p in store.partitions("benchmark_report") if p != key]
    # reports written before the long format, or on another split, are not on this curve
    others = [o for o in others if "metric" in o.columns and set(o["split"].to_list()) == {split_info["split"]}]
    allrep = pl.concat([*others, report], how="diagonal_relaxed")
    base = report.filter((pl.col("kind") == "baseline") & (pl.col("mode") == "greedy"))
    lines: dict[str, dict[str, float]] = {}
    for r in base.iter_rows(named=True):
        lines.setdefault(r["metric"], {})[r["system"]] = r["value"]
    md["learning_curve"] = dg.MetadataValue.md(learning_curve_plot(tables.learning_curve(allrep), baselines=lines))
    md["iterations_in_curve"] = dg.MetadataValue.int(allrep["iteration"].n_unique())
    return md


def build_assets(cfg: SpogwConfig) -> list[dg.AssetsDefinition]:
    """The six assets; `cfg` sets their code versions (the resource supplies the same config at run time)."""

    def spec(name: str, description: str, kinds: set[str]) -> dict[str, Any]:
        return dict(name=name, partitions_def=iterations, group_name=GROUP, code_version=code_version(name, cfg),
                    description=description, kinds=kinds, io_manager_key="io_manager")

    @dg.asset(**spec("sampled_workflows", "m workflows per training query sampled from π_{k-1} (the base model at "
                     "k = 0) with per-token log-probs; fails fast when lora_checkpoint(k-1) is missing.",
                     {"python", "parquet"}))
    def sampled_workflows(context: dg.AssetExecutionContext, spogw: SpogwResource) -> pl.DataFrame:
        t0 = time.monotonic()
        cfg = spogw.config()
        key = context.partition_key
        k = key_to_int(key)
        try:
            parent = parent_checkpoint(spogw.store(), key)
        except MissingCheckpointError as e:
            raise dg.Failure(description=str(e), allow_retries=False) from None
        problems = spogw.train_queries()
        family = problems[0].family
        seed = derive_seed(cfg.generator.seed, "sample", k)
        _say(context, f"iteration {key}: sampling {cfg.curation.m} workflows for each of {len(problems)} "
                         f"queries from {'lora_checkpoint[' + parent.partition + ']' if parent else 'the base model'}")
        prompts, samples, tps = _generate(spogw, parent.path if parent else None, problems, n=cfg.curation.m,
                                          temperature=cfg.generator.temperature, seed=seed)
        df = tables.sampled_frame(
            k, [p.id for p in problems], prompts, samples, family,
            parent_iteration=parent.iteration if parent else None, parent_sha256=parent.sha256 if parent else None,
            generator=cfg.generator.model,
        )
        parse = dict(Counter(df["parse_status"].to_list()))
        context.add_output_metadata({
            **_common_metadata(cfg, "sampled_workflows", t0),
            "parent_checkpoint": dg.MetadataValue.json(
                parent.as_metadata() if parent else {"partition": None, "path": None, "adapter_sha256": None,
                                                     "note": "iteration 0 samples from the base model"}),
            "parent_partition": dg.MetadataValue.text(parent.partition if parent else "base"),
            "queries": dg.MetadataValue.int(len(problems)),
            "workflows": dg.MetadataValue.int(df.height),
            "parse_status": _md_table(parse, ("parse status", "workflows")),
            "valid_rate": dg.MetadataValue.float(round(parse.get("ok", 0) / max(1, df.height), 4)),
            "mean_tokens": dg.MetadataValue.float(round(float(df["n_tokens"].mean() or 0), 2)),
            "generation_tokens_per_s": dg.MetadataValue.float(round(tps, 2)),
            "seed": dg.MetadataValue.int(seed),
        })
        _say(context, f"{df.height} workflows, parse status {parse}, {tps:.1f} tokens/s, {time.monotonic() - t0:.1f} s")
        return df

    @dg.asset(**spec("execution_scores", "Every sampled workflow executed R times in the sandbox against the "
                     "executor and scored (reward ladder + benchmark metric); executor calls go through the call "
                     "cache.", {"python", "parquet"}))
    def execution_scores(context: dg.AssetExecutionContext, spogw: SpogwResource,
                         sampled_workflows: pl.DataFrame) -> pl.DataFrame:
        t0 = time.monotonic()
        cfg = spogw.config()
        k = key_to_int(context.partition_key)
        problems = {p.id: p for p in spogw.train_queries()}
        unknown = sorted(set(sampled_workflows["query_id"].to_list()) - set(problems))
        if unknown:
            raise dg.Failure(f"sampled_workflows[{context.partition_key}] has queries not in the configured training "
                             f"set ({unknown[:3]}); the config changed since sampling: rematerialize sampled_workflows")
        jobs = []
        for r in sampled_workflows.iter_rows(named=True):
            ok = r["parse_status"] == "ok"
            jobs.append(EvalJob(problems[r["query_id"]], r["workflow"] if ok else None,
                                "" if ok else r["parse_status"], "" if ok else r["parse_error"],
                                tag=(r["query_id"], r["sample_idx"], r["parse_status"])))
        iso = spogw.isolation()

        async def run():
            async with spogw.executor() as ex:
                res = await evaluate_jobs(jobs, ex.executor, iso, cfg, seed=cfg.execution.seed)
                return res, ex.counters(), ex.model

        _say(context, f"executing {len(jobs)} workflows ({sum(j.code is not None for j in jobs)} valid), "
                         f"isolation={iso.kind}")
        results, counters, executor_model = asyncio.run(run())
        ladder = Ladder(**cfg.reward.model_dump())
        df = tables.execution_frame(
            tables.execution_row(k, j.tag[0], j.tag[1], j.tag[2], r, ladder, workflow=j.code) for j, r in zip(jobs, results))
        statuses = dict(Counter(df["status"].to_list()))
        by_status = {s: df.filter(pl.col("status") == s)["score"].to_list() for s in statuses}
        from .plots import score_histogram

        context.add_output_metadata({
            **_common_metadata(cfg, "execution_scores", t0),
            "status": _md_table(statuses, ("status", "workflows")),
            "mean_score": dg.MetadataValue.float(round(float(df["score"].mean() or 0.0), 4)),
            "mean_answer_score": dg.MetadataValue.float(round(float(df["answer_score"].mean() or 0.0), 4)),
            "score_distribution": dg.MetadataValue.json(tables.score_distribution(df["score"].to_list())),
            "score_histogram": dg.MetadataValue.md(score_histogram(by_status, f"iteration {k}: rewards by status")),
            "executor": dg.MetadataValue.text(executor_model),
            "executor_calls": dg.MetadataValue.int(int(df["llm_calls"].sum())),
            "executor_new_calls": dg.MetadataValue.int(counters["new_calls"]),
            "executor_cache_hits": dg.MetadataValue.int(counters["cache_hits"]),
            "executor_uncacheable_calls": dg.MetadataValue.int(counters["uncacheable_calls"]),
            "completion_tokens": dg.MetadataValue.int(int(df["completion_tokens"].sum())),
            "isolation": dg.MetadataValue.text(iso.kind),
            "reward_ladder": dg.MetadataValue.json(cfg.reward.model_dump()),
        })
        _say(context, f"status {statuses}, mean reward {float(df['score'].mean() or 0):.3f}, executor calls "
                      f"{counters['new_calls']} new / {counters['cache_hits']} cached, {time.monotonic() - t0:.1f} s")
        return df

    @dg.asset(**spec("screened_groups", "Executor errors and near-duplicate workflows removed, groups of n formed "
                     "per query and screened by score std (kept flag + reason for every group).",
                     {"python", "parquet"}))
    def screened_groups(context: dg.AssetExecutionContext, spogw: SpogwResource, sampled_workflows: pl.DataFrame,
                        execution_scores: pl.DataFrame) -> pl.DataFrame:
        from spogw_dagster.core import curation as cur

        t0 = time.monotonic()
        cfg = spogw.config()
        cc = cfg.curation_config()
        try:
            df = cur.validate_samples(tables.curation_input(sampled_workflows, execution_scores))
        except ValueError as e:
            raise dg.Failure(description=str(e)) from None
        kept_rows, dropped_exec = cur.exclude_executor_errors(df)
        kept_rows, dropped_dup = cur.filter_near_duplicates(kept_rows, cc.tau_sim)
        groups, dropped_few = cur.form_groups(kept_rows, cc.n, cc.g_max, cc.seed)
        screened, dropped_std = cur.screen_groups(groups, cc.tau_std, cc.std_ddof)
        out = tables.screened_frame(screened, pl.concat([dropped_few, dropped_std]))
        dropped_rows = pl.concat([dropped_exec, dropped_dup])
        row_reasons = dict(Counter(r.split(":", 1)[0] for r in dropped_rows["reason"].to_list()))
        group_reasons = dict(Counter(out.filter(~pl.col("kept"))["reason"].to_list()))
        context.add_output_metadata({
            **_common_metadata(cfg, "screened_groups", t0),
            "rows_in": dg.MetadataValue.int(df.height),
            "rows_usable": dg.MetadataValue.int(kept_rows.height),
            "rows_dropped": _md_table(row_reasons or {"(none)": 0}, ("reason", "workflows")),
            "groups_formed": dg.MetadataValue.int(groups.height),
            "groups_kept": dg.MetadataValue.int(screened.height),
            "groups_dropped": _md_table(group_reasons or {"(none)": 0}, ("reason", "groups")),
            "queries_with_groups": dg.MetadataValue.int(screened["query_id"].n_unique() if screened.height else 0),
            "mean_group_std": dg.MetadataValue.float(round(float(screened["score_std"].mean() or 0.0), 4)
                                                     if screened.height else 0.0),
        })
        _say(context, f"{screened.height} groups kept of {groups.height} formed; dropped rows {row_reasons or {}}, "
                      f"dropped or unformed groups {group_reasons or {}}")
        return out

    @dg.asset(**spec("sharpened_groups", "Top-t and bottom-t workflows of each kept group, with group-normalised "
                     "advantages (one row per member).", {"python", "parquet"}))
    def sharpened_groups(context: dg.AssetExecutionContext, spogw: SpogwResource,
                         screened_groups: pl.DataFrame) -> pl.DataFrame:
        from spogw_dagster.core import curation as cur

        t0 = time.monotonic()
        cfg = spogw.config()
        cc = cfg.curation_config()
        members, dropped = cur.sharpen_groups(tables.kept_groups(screened_groups), cc.t,
                                              dedup=cc.dedup_sharpened_groups)
        members = cur.compute_advantages(members, cc.adv_eps, cc.std_ddof)
        adv = members["advantage"].to_list()
        context.add_output_metadata({
            **_common_metadata(cfg, "sharpened_groups", t0),
            "groups": dg.MetadataValue.int(members["group_id"].n_unique() if members.height else 0),
            "members": dg.MetadataValue.int(members.height),
            "positive_advantage": dg.MetadataValue.int(sum(a > 0 for a in adv)),
            "negative_advantage": dg.MetadataValue.int(sum(a < 0 for a in adv)),
            "zero_advantage": dg.MetadataValue.int(sum(a == 0 for a in adv)),
            "duplicate_groups_dropped": dg.MetadataValue.int(dropped.height),
            "group_size": dg.MetadataValue.int(2 * cc.t),
        })
        _say(context, f"{members.height} sharpened members in {members['group_id'].n_unique() if members.height else 0} groups")
        return members

    @dg.asset(**spec("lora_checkpoint", "LoRA adapter of iteration k trained on the sharpened groups (objective "
                     "from the config; ioGRPO + mKL by default), continuing from lora_checkpoint(k-1).",
                     {"pytorch", "parquet"}))
    def lora_checkpoint(context: dg.AssetExecutionContext, spogw: SpogwResource, sharpened_groups: pl.DataFrame,
                        sampled_workflows: pl.DataFrame) -> pl.DataFrame:
        from spogw_dagster.core.trainer import train_lora

        from .adapters import carry_forward

        t0 = time.monotonic()
        cfg = spogw.config()
        key = context.partition_key
        k = key_to_int(key)
        store = spogw.store()
        try:
            parent = parent_checkpoint(store, key)
        except MissingCheckpointError as e:
            raise dg.Failure(description=str(e), allow_retries=False) from None
        examples = tables.training_examples(sharpened_groups, sampled_workflows)
        out = store.adapter_dir(key)
        tcfg = cfg.train_config()
        steps: list[dict[str, Any]] = []
        if examples:
            _say(context, f"training {tcfg.objective} on {len(examples)} examples "
                             f"(previous adapter: {parent.partition if parent else 'none'})")
            res = train_lora(examples, tcfg, out, base_model=cfg.generator.model,
                             previous_adapter=parent.path if parent else None,
                             log=lambda st: context.log.debug(f"step {st['step']}: loss {st.get('loss')}"))
            stats, reused, trained = res.stats, res.reused, True
            steps = stats.get("steps", [])
        else:
            context.log.warning("no training examples (no group survived screening): the parent policy is carried "
                                "forward unchanged as this iteration's checkpoint")
            stats = carry_forward(out, parent.path if parent else None, tcfg, cfg.generator.model,
                                  reason="no training examples: every group was screened out")
            reused, trained = False, False
        summary = stats.get("summary", {})
        sha = adapter_sha256(out)
        losses = tables.step_curve(steps, "loss")
        kls = tables.step_curve(steps, "kl")
        row = {
            "iteration": k, "adapter_path": str(out), "adapter_sha256": sha,
            "parent_iteration": parent.iteration if parent else None,
            "parent_adapter_sha256": parent.sha256 if parent else None,
            "trained": trained, "reused": reused, "n_examples": len(examples),
            "optimizer_steps": int(summary.get("optimizer_steps") or 0),
            "first_loss": summary.get("first_loss"), "last_loss": summary.get("last_loss"),
            "loss_curve": losses, "kl_curve": kls, "train_seconds": summary.get("train_seconds"),
            "run_hash": stats.get("run_hash"), "objective": tcfg.objective,
        }
        md: dict[str, Any] = {
            **_common_metadata(cfg, "lora_checkpoint", t0),
            "adapter_path": dg.MetadataValue.path(str(out)),
            "adapter_sha256": dg.MetadataValue.text(sha),
            "parent_checkpoint": dg.MetadataValue.json(parent.as_metadata() if parent else {"partition": None}),
            "trained": dg.MetadataValue.bool(trained),
            "reused_identical_run": dg.MetadataValue.bool(reused),
            "examples": dg.MetadataValue.int(len(examples)),
            "optimizer_steps": dg.MetadataValue.int(row["optimizer_steps"]),
            "objective": dg.MetadataValue.text(tcfg.objective),
            "training_summary": dg.MetadataValue.json({k2: v for k2, v in summary.items() if v is not None}),
        }
        if losses:
            from .plots import curve

            md["loss_curve"] = dg.MetadataValue.md(curve(losses, f"iteration {k}: training loss", "loss",
                                                         {"kl": kls} if kls else None))
            md["last_loss"] = dg.MetadataValue.float(float(losses[-1]))
        context.add_output_metadata(md)
        _say(context, ("trained" if trained else "carried forward (no data)") + f" on {len(examples)} examples, "
                      f"{row['optimizer_steps']} steps, last loss {row['last_loss']}"
                      + (" (identical earlier run reused)" if reused else "") + f", {time.monotonic() - t0:.1f} s")
        return tables.checkpoint_frame(row)

    @dg.asset(**spec("benchmark_report", "Held-out metrics of checkpoint k beside π_{k-1} (base at k = 0) and "
                     "static baselines (IO, CoT, CoT-SC): valid, executes and trivial rates, mean ladder reward and "
                     "answer score with 95% intervals, greedy and over k samples per query, and the paired "
                     "difference to π_{k-1} on the same queries and seeds (long format: one row per system, mode "
                     "and metric; per-sample rows in heldout_results).", {"python", "parquet"}))
    def benchmark_report(context: dg.AssetExecutionContext, spogw: SpogwResource,
                         lora_checkpoint: pl.DataFrame) -> pl.DataFrame:
        from spogw_dagster.evaluation import split_problems

        from . import heldout as ho
        from .catalog import refresh_catalog

        t0 = time.monotonic()
        cfg = spogw.config()
        key = context.partition_key
        k = key_to_int(key)
        store = spogw.store()
        ckpt = lora_checkpoint.row(0, named=True)
        adapter = Path(ckpt["adapter_path"])
        if not (adapter / "adapter_model.safetensors").is_file():
            raise dg.Failure(f"lora_checkpoint[{key}] points at {adapter}, which holds no adapter; "
                             f"rematerialize lora_checkpoint for {key}")
        try:
            parent = parent_checkpoint(store, key)
        except MissingCheckpointError as e:
            raise dg.Failure(description=str(e), allow_retries=False) from None
        rep, b = cfg.report, cfg.benchmark
        limit = b.heldout_queries if rep.split == "test" else b.validation_queries
        try:
            problems, split_info = split_problems(b.name, rep.split, limit=limit, seed=b.split_seed,
                                                  path=b.data_path)
        except ValueError as e:
            raise dg.Failure(description=f"report.split={rep.split}: {e}", allow_retries=False) from None
        this = ho.Policy(f"spogw@{key}", "checkpoint", adapter, k, adapter_sha256(adapter))
        prev = ho.Policy(f"spogw@{parent.partition}", "previous", parent.path, parent.iteration, parent.sha256) \
            if parent else ho.Policy("base", "previous")
        per_policy = len(problems) * sum(n for _, n, _ in ho.modes(cfg))

        reused_prev = None
        if parent is not None and store.exists("benchmark_report", parent.partition) \
                and store.exists("heldout_results", parent.partition):
            reused_prev = tables.reusable_previous(
                store.read_parquet("benchmark_report", parent.partition),
                store.read_parquet("heldout_results", parent.partition), prev.system, parent.sha256, cfg.hash, k,
                per_policy)
        policies = [this] if reused_prev is not None else [this, prev]
        if reused_prev is not None:
            _say(context, f"{prev.system} reused from benchmark_report[{parent.partition}] (same adapter and config)")
        scored = ho.score(spogw, policies, problems, cfg, iteration=k, split=rep.split,
                          reused=[reused_prev] if reused_prev is not None else [], say=lambda m: _say(context, m))
        heldout, counters = scored.heldout, scored.counters
        store.write_parquet("heldout_results", key, heldout)
        refresh_catalog(store)
        report = tables.summarize_heldout(heldout, iteration=k, config_hash=cfg.hash,
                                          split_ids_sha256=split_info["ids_sha256"],
                                          resamples=rep.bootstrap_resamples, seed=rep.seed)
        context.add_output_metadata({
            **_common_metadata(cfg, "benchmark_report", t0),
            **_report_metadata(store, key, report, split_info, prev.system, reused_prev is not None),
            "executor_new_calls": dg.MetadataValue.int(counters["new_calls"]),
            "executor_cache_hits": dg.MetadataValue.int(counters["cache_hits"]),
            "baselines_from_cache": dg.MetadataValue.json(scored.baselines_cached),
            "heldout_results": dg.MetadataValue.path(str(store.parquet_path("heldout_results", key))),
            "isolation": dg.MetadataValue.text(spogw.isolation().kind),
        })
        ans = tables.metric_row(report, "checkpoint", "answer_score")
        val = tables.metric_row(report, "checkpoint", "valid_rate")
        _say(context, f"{this.system} ({val['mode']}): valid {val['value']:.3f}, answer {ans['value']:.3f}"
             + (f", Δ answer vs {prev.system} {ans['diff_vs_prev']:+.3f} [{ans['diff_ci_low']:+.3f}, "
                f"{ans['diff_ci_high']:+.3f}]" if ans["diff_vs_prev"] is not None else "")
             + f"; {time.monotonic() - t0:.1f} s")
        return report

    return [sampled_workflows, execution_scores, screened_groups, sharpened_groups, lora_checkpoint, benchmark_report]
