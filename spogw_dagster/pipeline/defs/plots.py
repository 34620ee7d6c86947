"""Plots for Dagster metadata: PNG images embedded in markdown (Dagster has no plot metadata type)."""

from __future__ import annotations

import base64
import io
from typing import Mapping, Sequence


def _png_markdown(fig, title: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    import matplotlib.pyplot as plt  # heavy: matplotlib loads only when a plot is drawn

    plt.close(fig)
    return f"![{title}](data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()})"


def _figure(w: float = 4.5, h: float = 2.8):
    import matplotlib  # heavy: matplotlib loads only when a plot is drawn

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt  # heavy: matplotlib loads only when a plot is drawn

    return plt.subplots(figsize=(w, h))


def score_histogram(scores_by_status: Mapping[str, Sequence[float]], title: str = "scores by status") -> str:
    fig, ax = _figure()
    data = [list(v) for v in scores_by_status.values() if len(v)]
    labels = [k for k, v in scores_by_status.items() if len(v)]
    if data:
        ax.hist(data, bins=[i / 10 for i in range(11)], stacked=True, label=labels)
        ax.legend(fontsize=7)
    ax.set_xlabel("score")
    ax.set_ylabel("workflows")
    ax.set_title(title, fontsize=9)
    return _png_markdown(fig, title)


def curve(values: Sequence[float], title: str, ylabel: str, extra: Mapping[str, Sequence[float]] | None = None) -> str:
    fig, ax = _figure()
    ax.plot(range(len(values)), list(values), marker="o", ms=3, label=ylabel)
    for name, ys in (extra or {}).items():
        if len(ys):
            ax.plot(range(len(ys)), list(ys), marker=".", ms=3, label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if extra:
        ax.legend(fontsize=7)
    return _png_markdown(fig, title)


def solve_rate_bars(systems: Sequence[str], rates: Sequence[float], lows: Sequence[float], highs: Sequence[float],
                    title: str = "held-out solve rate (95% CI)") -> str:
    fig, ax = _figure(5, 2.8)
    err = [[max(0.0, r - lo) for r, lo in zip(rates, lows)], [max(0.0, hi - r) for r, hi in zip(rates, highs)]]
    ax.bar(range(len(systems)), rates, yerr=err, capsize=4, color="#4c72b0")
    ax.set_xticks(range(len(systems)))
    ax.set_xticklabels(systems, rotation=20, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("solve rate")
    ax.set_title(title, fontsize=9)
    return _png_markdown(fig, title)


CURVE_PANELS = (("valid_rate", "valid rate"), ("executes_rate", "executes rate"), ("mean_reward", "mean reward"),
                ("answer_score", "answer score (solve rate)"))


def learning_curve_plot(curve, title: str = "held-out metrics per iteration (95% CI)",
                        baselines: Mapping[str, Mapping[str, float]] | None = None) -> str:
    """Four panels (valid, executes, mean reward, answer score) over iterations: the checkpoint of each
    iteration (step -1 = the base model) in the sampled and greedy modes, with 95% intervals; static
    baselines (`baselines[metric][name]`) as dotted horizontal lines.

    `curve` is `report_stats.learning_curve(...)` (columns step, mode, metric, value, ci_low, ci_high)."""
    fig, axes = _figure(8, 5.2)
    fig.clf()
    axes = fig.subplots(2, 2, sharex=True)
    steps = sorted(set(curve["step"].to_list())) if curve.height else []
    labels = ["base" if s == -1 else str(s) for s in steps]
    for ax, (metric, name) in zip(axes.flat, CURVE_PANELS):
        for mode, style in (("sampled", "-o"), ("greedy", "--s")):
            d = curve.filter((curve["metric"] == metric) & (curve["mode"] == mode)).sort("step")
            if d.height == 0:
                continue
            x = [steps.index(s) for s in d["step"].to_list()]
            v, lo, hi = d["value"].to_list(), d["ci_low"].to_list(), d["ci_high"].to_list()
            err = [[max(0.0, a - b) for a, b in zip(v, lo)], [max(0.0, b - a) for a, b in zip(v, hi)]]
            ax.errorbar(x, v, yerr=err, fmt=style, ms=4, capsize=3, label=mode)
        for i, (system, val) in enumerate(sorted((baselines or {}).get(metric, {}).items())):
            ax.axhline(val, ls=":", lw=1, color=f"C{i + 2}", label=system)
        ax.set_title(name, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xticks(range(len(steps)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("iteration (checkpoint)")
    fig.suptitle(title, fontsize=10)
    return _png_markdown(fig, title)


def method_bars(table, reference: str, metrics: Sequence[str] = ("valid_rate", "mean_reward", "answer_score"),
                title: str = "held-out metrics per method (95% CI)") -> str:
    """One panel per metric: each method's value with its 95% interval, per mode (greedy, sampled); the
    reference method's value as a dotted line. `table` is an objective_comparison frame."""
    fig, _ = _figure(3.2 * len(metrics), 3.2)
    fig.clf()
    axes = fig.subplots(1, len(metrics), sharey=True)
    methods = sorted(set(table["method"].to_list()), key=lambda m: (m != reference, m))
    for ax, metric in zip(axes, metrics):
        for i, mode in enumerate(sorted(set(table["mode"].to_list()))):
            d = {r["method"]: r for r in table.iter_rows(named=True) if r["metric"] == metric and r["mode"] == mode}
            xs = [j + 0.35 * i for j, m in enumerate(methods) if m in d]
            v = [d[m]["value"] for m in methods if m in d]
            err = [[max(0.0, d[m]["value"] - d[m]["ci_low"]) for m in methods if m in d],
                   [max(0.0, d[m]["ci_high"] - d[m]["value"]) for m in methods if m in d]]
            ax.bar(xs, v, width=0.35, yerr=err, capsize=3, label=mode, color=f"C{i}")
            if reference in d:
                ax.axhline(d[reference]["value"], ls=":", lw=1, color=f"C{i}")
        ax.set_xticks([j + 0.175 for j in range(len(methods))])
        ax.set_xticklabels(methods, rotation=35, ha="right", fontsize=7)
        ax.set_title(metric, fontsize=9)
        ax.set_ylim(0, 1.02)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _png_markdown(fig, title)


def pareto_plot(systems: Sequence[str], answers: Sequence[float], calls: Sequence[float], frontier: Sequence[bool],
                title: str = "answer score vs executor calls per query") -> str:
    fig, ax = _figure(5, 3)
    ax.scatter(list(calls), list(answers), color=["#c44e52" if f else "#4c72b0" for f in frontier], zorder=3)
    for s, x, y in zip(systems, calls, answers):
        ax.annotate(s, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    fx = [(x, y) for x, y, f in sorted(zip(calls, answers, frontier)) if f]
    if len(fx) > 1:
        ax.step([x for x, _ in fx], [y for _, y in fx], where="post", color="#c44e52", lw=1)
    ax.set_xlabel("executor calls per query")
    ax.set_ylabel("answer score")
    ax.set_title(title, fontsize=9)
    return _png_markdown(fig, title)
