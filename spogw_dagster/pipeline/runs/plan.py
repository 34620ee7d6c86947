"""`spogw plan`: the work one iteration implies, computed from the config before anything runs.

Pure arithmetic (`plan_iteration`, `format_plan`) over the config's sizes and limits, optionally with averages
measured in an assets directory (`measure_assets`: executor calls per workflow and tokens per call from
`execution_scores`, generated tokens per sample from `sampled_workflows`) and backend speeds (tokens/s; the
defaults were measured on this project's 2-core CPU machine with SmolLM2-135M).

Counts per iteration k (d training queries, m samples each, groups of n, top/bottom t, at most g_max groups):

- generator: d·m samples of at most `max_new_tokens` each;
- anchors (`generator.anchors`): a more workflows per query, executed and grouped, not sampled (m + a below);
- executor: d·(m + a) workflows × R runs × calls per workflow (measured average, else the `max_llm_calls` cap: an
  upper bound), each call at most `executor.max_tokens` completion tokens;
- training rows (the paper's grouping): with m' ≤ m usable workflows of a query, min(C(m', n), g_max) groups,
  each sharpened to 2t rows: groups × 2t rows per query before aggregation; after unique-workflow aggregation
  (one row per distinct workflow; see core/training/objectives.py) at most min(m', groups × 2t) per query. Screening can only
  lower both (upper bounds at m' = m);
- the report: h held-out queries × (greedy + k samples) workflows for π_k (and for the base model at k = 0);
- W4S's turns (`w4s_plan`: the loop's `refinement` when on, and the comparison's `w4s`): d queries × T turns ×
  m candidates sampled (plus up to `repairs` repairs of each that does not parse: an upper bound), each run
  on the training query and on F feedback queries: d·T·m·(1 + F) workflow runs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from spogw_dagster import bundled_models as bm
from spogw_dagster.core.methods.catalog import METHODS
from spogw_dagster.models import DEFAULT_MODEL
from spogw_dagster.pipeline.domain.anchors import ANCHOR_FINISH, anchors_per_query

__all__ = ["Speeds", "speeds_for_config", "Measured", "IterationPlan", "groups_per_query", "training_rows_per_query", "plan_iteration",
           "plan_from_config", "measure_assets", "format_plan", "W4SPlan", "w4s_plan", "w4s_plans_from_config",
           "format_w4s_plan"]


# Measured on this project's 2-core CPU machine (x86-64, no GPU). Generator and training: transformers on CPU,
# fp32; executor: the embedded llama.cpp workers. GPU targets and endpoints have no entry on purpose: their
# speed depends on hardware nobody measured here; `bench/gpu_check.py` prints gen_tps and train_tps on a GPU.
CPU_GENERATOR_TPS = {
    "smollm2": (65.0, "SmolLM2-135M, batch 8-16"),
    # answers run of 2026-12-02: 4,021 tokens sampled in 454 s (model load included), batch 8
    "qwen2.5-coder-0.5b": (9.1, "Qwen2.5-Coder-0.5B, the answers run: 4,021 tokens in 454 s"),
}
CPU_TRAIN_TPS = {
    "smollm2": (80.0, "SmolLM2-135M LoRA r=8"),
    # the same run: 72 rows x 2 epochs of ~31 tokens (4,464) in 376 s of optimizer steps
    "qwen2.5-coder-0.5b": (12.0, "Qwen2.5-Coder-0.5B LoRA r=8, the answers run: 4,464 tokens in 376 s"),
}
CPU_EXECUTOR_TPS = {
    "smollm2": (77.0, "SmolLM2-135M, one llama.cpp stream"),
    # the answers run: ~12,500 completion tokens of 92 new calls in 617 s on 2 single-thread workers
    "qwen2.5-coder-0.5b": (20.0, "Qwen2.5-Coder-0.5B, 2 workers, the answers run: ~12,500 tokens in 617 s"),
    # bench/bundled_models_speed.py, one single-thread worker, 96 tokens
    "qwen2.5-coder-1.5b": (8.4, "Qwen2.5-Coder-1.5B, one worker, bench/bundled_models_speed.py"),
}


@dataclass(frozen=True)
class Speeds:
    """Backend throughputs in tokens per second (generated tokens for sampling and the executor, trained
    completion tokens for training); None where nothing was measured for the target (no time is guessed).
    The defaults: SmolLM2 on 2 CPU cores (the tables above)."""

    generator_tps: float | None = CPU_GENERATOR_TPS["smollm2"][0]
    executor_tps: float | None = CPU_EXECUTOR_TPS["smollm2"][0]
    train_tps: float | None = CPU_TRAIN_TPS["smollm2"][0]
    source: str = "measured on 2 CPU cores with SmolLM2-135M"
    unknown: tuple[tuple[str, str], ...] = ()  # (speed field, why it is unknown) for each None


def speeds_for_config(cfg: Any, gpu: bool | None = None, placeholders: frozenset[str] = frozenset()) -> Speeds:
    """The measured speeds of the config's targets: a bundled generator on the CPU path (transformers, or
    `auto` where this machine has no GPU) and the embedded executor on a bundled model. Anything else (a GPU,
    a model folder, an endpoint, a field whose ${VAR} is unset) is None with the reason: the plan then gives
    counts, not a time."""

    g, e = cfg.generator, cfg.executor
    if gpu is None and g.backend == "auto":
        try:
            import torch  # heavy: this module loads at every `spogw` start-up

            gpu = bool(torch.cuda.is_available())
        except ImportError:  # pragma: no cover - torch is a dependency
            gpu = False
    on_gpu = g.backend == "vllm" or (g.backend == "auto" and bool(gpu))
    gen = bm.find(g.model)
    unknown: list[tuple[str, str]] = []
    sources: list[str] = []
    gen_tps = train_tps = exec_tps = None
    if on_gpu:
        why = ("generator and training on a GPU: not measured here (bench/gpu_check.py prints gen_tps and "
               "train_tps; pass them as --generator-tps/--train-tps)")
    elif "generator.model" in placeholders:
        why = "generator: generator.model is unset (pass --generator-tps/--train-tps)"
    elif gen is None or gen.alias not in CPU_GENERATOR_TPS:
        why = f"generator {g.model!r} on CPU: no measurement for this model (pass --generator-tps/--train-tps)"
    else:
        why = ""
        (gen_tps, gs), (train_tps, ts) = CPU_GENERATOR_TPS[gen.alias], CPU_TRAIN_TPS[gen.alias]
        sources += [f"generator {gs}", f"training {ts}"]
    if why:
        unknown += [("generator_tps", why), ("train_tps", why)]
    ex = None if e.endpoints() else bm.find(e.model or DEFAULT_MODEL)
    if e.endpoints():
        unknown.append(("executor_tps", "executor endpoint: its speed depends on its hardware and load "
                                        "(pass --executor-tps)"))
    elif ex is None or ex.alias not in CPU_EXECUTOR_TPS:
        unknown.append(("executor_tps", f"executor {e.model!r}: no measurement for this model (pass --executor-tps)"))
    else:
        exec_tps, xs = CPU_EXECUTOR_TPS[ex.alias]
        sources.append(f"executor {xs}")
    return Speeds(gen_tps, exec_tps, train_tps, "measured on 2 CPU cores: " + "; ".join(sources) if sources
                  else "nothing measured for these targets", tuple(unknown))


@dataclass(frozen=True)
class Measured:
    """Averages measured in stored assets (None: not available)."""

    calls_per_workflow: float | None = None
    prompt_tokens_per_call: float | None = None
    completion_tokens_per_call: float | None = None
    tokens_per_sample: float | None = None
    workflows: int = 0
    samples: int = 0
    source: str = ""


def groups_per_query(m_usable: int, n: int, g_max: int) -> int:
    """All C(m', n) groups when that is at most g_max, else g_max (core/curation.py::form_groups); 0 when m' < n."""
    if m_usable < n:
        return 0
    return min(math.comb(m_usable, n), g_max)


def training_rows_per_query(m_usable: int, n: int, t: int, g_max: int) -> tuple[int, int, int]:
    """(groups, rows before aggregation = groups × 2t, unique workflows after aggregation <= min(m', rows))."""
    g = groups_per_query(m_usable, n, g_max)
    rows = g * 2 * t
    return g, rows, min(m_usable, rows)


@dataclass(frozen=True)
class IterationPlan:
    d: int
    m: int
    n: int
    t: int
    g_max: int
    runs: int
    # generator
    samples: int
    tokens_per_sample: float
    tokens_per_sample_is_measured: bool
    generator_tokens: float
    # executor
    workflows: int
    calls_per_workflow: float
    calls_are_measured: bool
    executor_calls: float
    completion_tokens_per_call: float
    completion_tokens_are_measured: bool
    prompt_tokens_per_call: float | None
    executor_completion_tokens: float
    executor_prompt_tokens: float | None
    # training
    groups_per_query: int
    rows_per_query: int
    unique_per_query: int
    training_rows: int
    training_rows_unique: int
    steps: int
    steps_unique: int
    epochs: int
    # report (held-out)
    report_workflows: int
    report_executor_calls: float
    # time
    speeds: Speeds = field(default_factory=Speeds)
    generator_s: float | None = 0.0  # None: no speed for that target (Speeds.unknown says why)
    executor_s: float | None = 0.0
    train_s: float | None = 0.0
    train_unique_s: float | None = 0.0
    report_s: float | None = 0.0
    processes: int = 1  # training.processes: a step's micro-batches dealt to this many processes
    anchors: int = 0  # generator.anchors: the prompt's workflows added to each query's samples (executed, grouped)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _steps(rows: int, batch_size: int, grad_accum: int, epochs: int) -> int:
    return math.ceil(rows / (batch_size * grad_accum)) * epochs if rows else 0


def plan_iteration(*, d: int, m: int, n: int, t: int, g_max: int, runs: int = 1, max_new_tokens: int,
                   max_llm_calls: int, executor_max_tokens: int, batch_size: int, grad_accum: int = 1,
                   epochs: int = 1, heldout: int = 0, report_greedy: bool = True, report_samples: int = 0,
                   first_iteration: bool = False, measured: Measured | None = None,
                   speeds: Speeds | None = None, processes: int = 1, report_runs: int | None = None,
                   anchors: int = 0) -> IterationPlan:
    """The work of one iteration (module docstring). Measured averages replace the caps where given.
    `report_runs`: executor runs per held-out workflow (`report.runs`; None = `runs`). `anchors`: workflows
    added to each query's m samples (`generator.anchors`), executed and grouped, not generated."""
    ms = measured or Measured()
    sp = speeds or Speeds()
    samples = d * m
    tps_measured = ms.tokens_per_sample is not None
    tok_sample = float(ms.tokens_per_sample) if tps_measured else float(max_new_tokens)
    calls_measured = ms.calls_per_workflow is not None
    cpw = float(ms.calls_per_workflow) if calls_measured else float(max_llm_calls)
    ct_measured = ms.completion_tokens_per_call is not None
    ct_call = float(ms.completion_tokens_per_call) if ct_measured else float(executor_max_tokens)
    workflows = samples + d * anchors
    calls = workflows * runs * cpw
    g, rows_q, uniq_q = training_rows_per_query(m + anchors, n, t, g_max)
    rows, uniq = d * rows_q, d * uniq_q
    policies = 2 if first_iteration else 1  # the base model's report rows at k = 0
    report_wf = heldout * (int(report_greedy) + report_samples) * policies
    report_calls = report_wf * (runs if report_runs is None else report_runs) * cpw
    gen_tokens = samples * tok_sample
    exec_ct = calls * ct_call
    pt = ms.prompt_tokens_per_call
    return IterationPlan(
        d=d, m=m, n=n, t=t, g_max=g_max, runs=runs,
        samples=samples, tokens_per_sample=tok_sample, tokens_per_sample_is_measured=tps_measured,
        generator_tokens=gen_tokens,
        workflows=workflows, calls_per_workflow=cpw, calls_are_measured=calls_measured, executor_calls=calls,
        completion_tokens_per_call=ct_call, completion_tokens_are_measured=ct_measured,
        prompt_tokens_per_call=pt, executor_completion_tokens=exec_ct,
        executor_prompt_tokens=None if pt is None else calls * pt,
        groups_per_query=g, rows_per_query=rows_q, unique_per_query=uniq_q, training_rows=rows,
        training_rows_unique=uniq, steps=_steps(rows, batch_size, grad_accum, epochs),
        steps_unique=_steps(uniq, batch_size, grad_accum, epochs), epochs=epochs, processes=processes, anchors=anchors,
        report_workflows=report_wf, report_executor_calls=report_calls,
        speeds=sp,
        generator_s=_per(gen_tokens, sp.generator_tps),
        executor_s=_per(exec_ct, sp.executor_tps),
        train_s=_per(rows * tok_sample * epochs, sp.train_tps),
        train_unique_s=_per(uniq * tok_sample * epochs, sp.train_tps),
        report_s=(None if sp.generator_tps is None or sp.executor_tps is None else
                  report_wf * tok_sample / sp.generator_tps + report_calls * ct_call / sp.executor_tps),
    )


def _per(tokens: float, tps: float | None) -> float | None:
    return None if tps is None else tokens / tps


def plan_from_config(cfg: Any, measured: Measured | None = None, speeds: Speeds | None = None,
                     first_iteration: bool = False) -> IterationPlan:
    """`plan_iteration` with a `SpogwConfig`'s sizes and limits."""
    tr = cfg.training
    return plan_iteration(
        d=cfg.benchmark.train_queries, m=cfg.curation.m, n=cfg.curation.n, t=cfg.curation.t,
        g_max=cfg.curation.g_max, runs=cfg.execution.runs, max_new_tokens=cfg.generator.max_new_tokens,
        max_llm_calls=cfg.executor.max_llm_calls, executor_max_tokens=cfg.executor.max_tokens,
        batch_size=tr.batch_size, grad_accum=getattr(tr, "grad_accum", 1), epochs=tr.epochs,
        heldout=cfg.benchmark.heldout_queries, report_greedy=cfg.report.greedy, report_samples=cfg.report.samples,
        first_iteration=first_iteration, measured=measured, speeds=speeds,
        processes=getattr(tr, "processes", 1), report_runs=getattr(cfg.report, "runs", None),
        anchors=anchors_per_query(cfg))


@dataclass(frozen=True)
class W4SPlan:
    """The work of W4S's turns over one iteration's d training queries (module docstring)."""

    who: str  # "the loop (refinement)" or "the comparison's w4s"
    d: int
    turns: int
    m: int
    feedback_queries: int
    repairs: int
    samples: int  # candidates sampled
    repair_samples_max: int  # at most this many more (every candidate repaired `repairs` times)
    workflow_runs: int  # on the training query and on the feedback queries
    executor_calls: float
    seconds: float | None  # token throughput only, repairs not counted; None when a speed is unknown


def w4s_plan(who: str, *, d: int, turns: int, m: int, feedback_queries: int, repairs: int, runs: int,
             tokens_per_sample: float, calls_per_workflow: float, tokens_per_call: float,
             speeds: Speeds) -> W4SPlan:
    samples = d * turns * m
    wf_runs = samples * (1 + feedback_queries) * runs
    calls = wf_runs * calls_per_workflow
    gen_s, exe_s = _per(samples * tokens_per_sample, speeds.generator_tps), _per(calls * tokens_per_call,
                                                                                    speeds.executor_tps)
    return W4SPlan(who, d, turns, m, feedback_queries, repairs, samples, samples * repairs, wf_runs, calls,
                   None if gen_s is None or exe_s is None else gen_s + exe_s)


def w4s_plans_from_config(cfg: Any, p: IterationPlan) -> list[W4SPlan]:
    """W4S's turns this config runs: the loop's own (`refinement.turns` > 1) and the comparison's `w4s`
    (its settings `comparison.w4s_turns`, `w4s_feedback_queries`; 5 candidates a turn), priced with the
    per-sample and per-call figures of `p` (measured where it had them)."""

    common = dict(d=cfg.benchmark.train_queries, repairs=cfg.refinement.repairs, runs=cfg.execution.runs,
                  tokens_per_sample=p.tokens_per_sample, calls_per_workflow=p.calls_per_workflow,
                  tokens_per_call=p.completion_tokens_per_call, speeds=p.speeds)
    out = []
    if cfg.refinement.enabled:
        out.append(w4s_plan("the loop (refinement)", turns=cfg.refinement.turns, m=cfg.curation.m,
                            feedback_queries=cfg.refinement.feedback_queries, **common))
    if "w4s" in cfg.comparison.methods:
        c = cfg.comparison
        out.append(w4s_plan("the comparison's w4s", turns=c.w4s_turns, m=METHODS["w4s"]["curation"]["m"],
                            feedback_queries=c.w4s_feedback_queries, **common))
    return out


def format_w4s_plan(w: W4SPlan) -> str:
    time = "not estimated" if w.seconds is None else f"≈ {_hm(w.seconds)} (token throughput, repairs not counted)"
    return (f"  W4S turns : {w.who}: d = {w.d} queries x {w.turns} turns x {w.m} candidates = {_n(w.samples)} "
            f"samples (+ <= {_n(w.repair_samples_max)} repairs), each run on its query and {w.feedback_queries} "
            f"feedback queries: {_n(w.workflow_runs)} workflow runs, {_n(w.executor_calls)} executor calls; {time}")


def measure_assets(root: str | Path) -> Measured | None:
    """Averages over every stored partition of `execution_scores` (executor calls per workflow, tokens per
    call) and `sampled_workflows` (generated tokens per sample); None when neither exists."""
    root = Path(root)
    ex_files = sorted((root / "execution_scores").glob("*.parquet"))
    sw_files = sorted((root / "sampled_workflows").glob("*.parquet"))
    if not ex_files and not sw_files:
        return None
    kw: dict[str, Any] = {}
    parts = []
    if ex_files:
        ex = pl.concat([pl.read_parquet(f, columns=["llm_calls", "prompt_tokens", "completion_tokens"])
                        for f in ex_files], how="vertical_relaxed")
        calls = int(ex["llm_calls"].sum() or 0)
        kw.update(workflows=ex.height, calls_per_workflow=calls / ex.height if ex.height else None)
        if calls:
            kw.update(prompt_tokens_per_call=float(ex["prompt_tokens"].sum()) / calls,
                      completion_tokens_per_call=float(ex["completion_tokens"].sum()) / calls)
        parts.append(f"execution_scores ({ex.height} workflows, {len(ex_files)} partitions)")
    if sw_files:
        sw = pl.concat([pl.read_parquet(f, columns=["n_tokens", "finish_reason"]) for f in sw_files],
                       how="vertical_relaxed").filter(pl.col("finish_reason").ne_missing(ANCHOR_FINISH))  # sampled only
        if sw.height:
            kw.update(samples=sw.height, tokens_per_sample=float(sw["n_tokens"].mean()))
        parts.append(f"sampled_workflows ({sw.height} samples)")
    return Measured(source=f"{root}: " + ", ".join(parts), **kw)


def _hm(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def _n(x: float) -> str:
    return f"{x:,.0f}" if abs(x - round(x)) < 1e-9 or abs(x) >= 100 else f"{x:,.1f}"


def format_plan(p: IterationPlan, title: str = "") -> str:
    """The plan as text, one fact a line, each saying whether it is a measured average or an upper bound."""
    def how(measured: bool, cap: str) -> str:
        return "measured average" if measured else f"upper bound: {cap}"

    lines = [f"plan of one iteration{(' — ' + title) if title else ''}"]
    lines.append(f"  generator : {_n(p.samples)} samples (d = {p.d} queries x m = {p.m}), "
                 f"{_n(p.generator_tokens)} generated tokens ({_n(p.tokens_per_sample)} per sample, "
                 f"{how(p.tokens_per_sample_is_measured, 'generator.max_new_tokens')})")
    pt = "" if p.executor_prompt_tokens is None else f" + {_n(p.executor_prompt_tokens)} prompt tokens"
    if p.anchors:
        lines.append(f"  anchors   : + {p.anchors} of the prompt's workflows per query (generator.anchors), executed "
                     "and grouped with the samples")
    lines.append(f"  executor  : {_n(p.workflows)} workflows x R = {p.runs} run(s) x {_n(p.calls_per_workflow)} "
                 f"calls ({how(p.calls_are_measured, 'executor.max_llm_calls')}) = {_n(p.executor_calls)} calls; "
                 f"{_n(p.executor_completion_tokens)} completion tokens ({_n(p.completion_tokens_per_call)} per call, "
                 f"{how(p.completion_tokens_are_measured, 'executor.max_tokens')}){pt}")
    lines.append(f"  groups    : min(C({p.m + p.anchors}, {p.n}) = {math.comb(p.m + p.anchors, p.n):,}, g_max = {p.g_max}) = "
                 f"{p.groups_per_query} per query (at m' = m{' + anchors' if p.anchors else ''}; near-duplicates lower m', "
                 "screening drops groups)")
    lines.append(f"  training  : {_n(p.rows_per_query)} rows per query ({p.groups_per_query} groups x 2t = {2 * p.t}),"
                 f" {_n(p.training_rows)} rows, {_n(p.steps)} optimizer steps over {p.epochs} epoch(s); after "
                 f"unique-workflow aggregation <= {p.unique_per_query} per query (<= m{' + anchors' if p.anchors else ''}), {_n(p.training_rows_unique)} "
                 f"rows, {_n(p.steps_unique)} steps"
                 + (f"; on {p.processes} processes (accelerate launch; a training speed is the whole job's)"
                    if p.processes > 1 else ""))
    lines.append(f"  report    : {_n(p.report_workflows)} held-out workflows, {_n(p.report_executor_calls)} executor "
                 f"calls (same per-workflow calls)")
    sp = p.speeds

    def at(seconds: float | None, tps: float | None) -> str:
        return "not estimated" if seconds is None else f"{_hm(seconds)} at {tps:g} tok/s"

    times = (p.generator_s, p.executor_s, p.train_s, p.report_s)
    if all(t is not None for t in times):
        total = p.generator_s + p.executor_s + p.train_s + p.report_s
        total_u = p.generator_s + p.executor_s + p.train_unique_s + p.report_s
        tail = (f"total ≈ {_hm(total)} ({_hm(total_u)} with aggregation); token throughput only (model loads, "
                "sandbox starts and scoring not counted)")
    else:
        tail = "no total: a speed is unknown (below)"
    train = at(p.train_s, sp.train_tps) + ("" if p.train_unique_s is None else f" ({_hm(p.train_unique_s)} aggregated)")
    report = "not estimated" if p.report_s is None else _hm(p.report_s)
    lines.append(f"  wall time : sampling {at(p.generator_s, sp.generator_tps)}, executor "
                 f"{at(p.executor_s, sp.executor_tps)}, training {train}, report {report}; {tail}")
    lines.append(f"  speeds    : {sp.source}")
    for why in dict.fromkeys(why for _, why in sp.unknown):  # one line per reason, in order
        lines.append(f"  unknown   : {why}")
    return "\n".join(lines)
