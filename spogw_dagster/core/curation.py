"""SPOGW data curation: sampled workflows → screened groups → sharpened groups with advantages (the algorithm as docs/algorithm.md specifies it).

Pure functions over Polars frames; no Dagster, no model. The stages, in order, each usable on its own so that an
asset can store its own stage:

1. `validate_samples`         check and canonicalise the input (one row per sampled workflow).
2. `exclude_executor_errors`  rows with status `executor_error` leave with reason "executor_error": a failure of
                              our infrastructure says nothing about the workflow. Every other non-ok status
                              (format_error, invalid, runtime_error, timeout, sandbox_violation) is a real,
                              low score and stays, unless `valid_only` is set: then `exclude_not_valid` also
                              sends format_error and invalid rows away with reason "not_valid", so groups
                              compare what valid workflows do, not whether they parse.
3. `filter_near_duplicates`   within a query, a workflow whose normalised code is at least `tau_sim` similar to
                              a kept workflow with a lower sample_idx leaves with "near_duplicate_of:<idx>".
4. `form_groups`              groups of n from the m' usable workflows of a query: all C(m', n) when that is
                              <= g_max, else g_max distinct groups drawn uniformly with a seeded RNG. A query
                              with m' < n yields one dropped-group row with reason "too_few_workflows".
5. `screen_groups`            keep groups whose score std >= tau_std, else "low_score_std".
6. `sharpen_groups`           top-t and bottom-t of each kept group (2t members per group).
7. `compute_advantages`       Â_i = (s_i − mean_g) / (std_g + ε) over the sharpened group.

With `anchor_groups: contrast`, rows marked `anchor` skip steps 3–4 and 6: each query's anchors form one group of
their own (`form_anchor_groups`), screened as any group and kept whole, so their advantages are zero-sum among
the prompt's own workflows (times `anchor_weight`); the samples are filtered and grouped among themselves.

`screen` runs steps 1–5 (the `screened_groups` asset) and `sharpen` steps 6–7 (`sharpened_groups`); both count
their drop reasons (`count_reasons`). `curate` runs both and returns a `CurationResult`.

The baselines are fed as their papers feed them, from the full scored candidate set (`scored_candidates`: steps
1–2 only) instead of steps 3–7, and only from the workflows that **ran** (`ran_mask`: status ok, so it parsed,
passed the validator and finished without error or timeout; no run a sandbox violation; not trivial, i.e. its
answer is some solution-writing operator's output). `sample_preference_pairs` is ScoreFlow's Score-DPO data
(pairs over each query's workflows that ran, compared on the benchmark answer, never on the ladder:
`score_dpo_candidates`; drawn ∝ (s_w − s_l)^power, a fixed budget per iteration; `preference_pair_candidates`
gives the probability of each candidate pair). `rwr_candidates` weighs W4S's candidates: W4S stores only a
candidate whose code ran (after up to 3 self-check repairs; one whose error persists is skipped) and whose
accuracy is above 0.05 (`src/agent/meta_agent.py`), so `w4s_kept_candidates` keeps the workflows that ran with
an answer score above 0.05, each once with weight exp(r/T). (Until issue 38 our RWR weighed every candidate, broken and trivial ones
too, e.g. a broken one at e^-0.25 ≈ 0.78: that was ours, not W4S's.)

Choices where the specification is silent (each is documented again at its function):

* Rows are keyed by (iteration, query_id, sample_idx); a duplicate key is an error. A query is
  (iteration, query_id): frames holding several iterations are curated per iteration.
* A group compares completions of **one prompt**: with the optional column `prompt_group` (null = the query's
  first prompt; W4S refinement turns give other prompts for the same query), near-duplicates, groups, pairs
  and their std are formed per (iteration, query_id, prompt_group), never across prompts. A group of another
  prompt than the first has group_id "<iteration>:<query_id>@<prompt_group>#<k>".
* Scores must lie in [0, 1]. A missing (null/NaN) score counts as 0 for the failure statuses; it is an error
  for `ok` (a successful run must have been scored); it is ignored for `executor_error` (dropped anyway).
  The given score of a failure status is used as is (a reward ladder may give partial credit to, e.g.,
  an invalid workflow); it is not forced to 0.
* Std: population std (ddof 0) by default, sample std with `std_ddof=1`; the same std is used for screening
  and for the advantage. A set of equal scores has std exactly 0 (no rounding residue).
* Sharpening tie-break: among equal scores the lower sample_idx is preferred, in both halves: the top half
  is the first t of the order (score desc, sample_idx asc); the bottom half is the first t of the order
  (score asc, sample_idx asc) among the workflows not already in the top half. So the halves never overlap
  (n >= 2t leaves n − t >= t candidates), even when all scores are equal.
"""

from __future__ import annotations

import ast
import difflib
import itertools
import math
import random
import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import polars as pl

from spogw_dagster.contracts import Status
from spogw_dagster.seeds import derive_seed

from .hyperparams import CurationConfig
from .pairs import draw, ordered_pairs, pair_weight

__all__ = [
    "CurationResult",
    "REQUIRED_COLUMNS",
    "validate_samples",
    "exclude_executor_errors",
    "exclude_not_valid",
    "normalize_code",
    "code_similarity",
    "filter_near_duplicates",
    "form_groups",
    "form_anchor_groups",
    "is_anchor_group",
    "screen_groups",
    "sharpen_groups",
    "compute_advantages",
    "group_std",
    "curate",
    "screen",
    "sharpen",
    "Screening",
    "Sharpening",
    "count_reasons",
    "sample_preference_pairs",
    "preference_pair_candidates",
    "scored_candidates",
    "rwr_candidates",
    "ran_mask",
    "score_dpo_candidates",
    "w4s_kept_candidates",
    "W4S_MIN_ACCURACY",
]

# --------------------------------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------------------------------

#: Optional input column: which prompt of its query a row was sampled from (null: the first one).
PROMPT_GROUP = "prompt_group"
#: Optional input column: the row is one of the prompt's own workflows (`generator.anchors`), not a sample.
ANCHOR = "anchor"
#: A query's anchor group (`anchor_groups: contrast`) is "<iteration>:<query_id>#anchors".
ANCHOR_GROUP_SUFFIX = "#anchors"

#: Columns every input row must have, with the dtype they are cast to.
REQUIRED_COLUMNS: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "query_id": pl.String(),
    "sample_idx": pl.Int64(),
    "workflow": pl.String(),
    "score": pl.Float64(),
    "status": pl.String(),
}

_IntList = pl.List(pl.Int64())
_FloatList = pl.List(pl.Float64())

DROPPED_ROWS_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "query_id": pl.String(),
    "sample_idx": pl.Int64(),
    "status": pl.String(),
    "score": pl.Float64(),
    "reason": pl.String(),
}

GROUPS_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "query_id": pl.String(),
    "group_id": pl.String(),
    "members": _IntList,  # sample_idx of the n members, ascending
    "scores": _FloatList,  # their scores, same order
}

SCREENED_SCHEMA: dict[str, pl.DataType] = {
    **GROUPS_SCHEMA,
    "score_mean": pl.Float64(),
    "score_std": pl.Float64(),
}

DROPPED_GROUPS_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "query_id": pl.String(),
    "group_id": pl.String(),  # null for "too_few_workflows" (no group was formed)
    "members": _IntList,  # the group's members, or the query's usable rows for "too_few_workflows"
    "score_std": pl.Float64(),  # null where no std was computed
    "reason": pl.String(),
}

MEMBERS_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "query_id": pl.String(),
    "group_id": pl.String(),
    "sample_idx": pl.Int64(),
    "score": pl.Float64(),
    "role": pl.String(),  # "top" | "bottom"
    "rank": pl.Int64(),  # 0..2t-1: top half by score desc, then bottom half by score asc
}

ADVANTAGE_SCHEMA: dict[str, pl.DataType] = {
    **MEMBERS_SCHEMA,
    "group_mean": pl.Float64(),
    "group_std": pl.Float64(),
    "advantage": pl.Float64(),
}

PAIR_CANDIDATES_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "query_id": pl.String(),
    "chosen_idx": pl.Int64(),
    "rejected_idx": pl.Int64(),
    "chosen_score": pl.Float64(),
    "rejected_score": pl.Float64(),
    "weight": pl.Float64(),  # (s_w − s_l)^power
    "probability": pl.Float64(),  # weight / Σ weight over every candidate pair of the frame
}

PAIRS_SCHEMA: dict[str, pl.DataType] = {"draw": pl.Int64(), **PAIR_CANDIDATES_SCHEMA}

RWR_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "query_id": pl.String(),
    "sample_idx": pl.Int64(),
    "score": pl.Float64(),  # the reward r
    "status": pl.String(),
    "weight": pl.Float64(),  # exp(r / T)
}

_STATUS_VALUES = tuple(s.value for s in Status)
_ZERO_STATUSES = frozenset(s.value for s in Status if s not in (Status.OK, Status.EXECUTOR_ERROR))

REASON_EXECUTOR_ERROR = "executor_error"
REASON_NOT_VALID = "not_valid"  # valid_only: no workflow was extracted, or the validator refused it
NOT_VALID_STATUSES = (Status.FORMAT_ERROR.value, Status.INVALID.value)
REASON_NEAR_DUPLICATE = "near_duplicate_of"  # + ":<sample_idx>"
REASON_TOO_FEW = "too_few_workflows"
REASON_LOW_STD = "low_score_std"
REASON_DUPLICATE_GROUP = "duplicate_of_group"  # + ":<group_id>"


def _frame(rows: dict[str, list[Any]] | None, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    if rows is None:
        rows = {k: [] for k in schema}
    return pl.DataFrame(rows, schema=schema)


def _columns(records: Sequence[dict[str, Any]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return _frame({k: [r[k] for r in records] for k in schema}, schema)


# --------------------------------------------------------------------------------------------------------------
# 1. Validation
# --------------------------------------------------------------------------------------------------------------


def validate_samples(df: pl.DataFrame) -> pl.DataFrame:
    """Check the input contract and return the required columns with canonical dtypes, sorted by key.

    Raises ValueError on: a missing column; a value that does not cast; a null key or status; an unknown
    status; a duplicate (iteration, query_id, sample_idx); a score outside [0, 1]; a missing score on an
    `ok` row. A missing score on a failure status becomes 0.0; a missing workflow becomes "".
    """
    if not isinstance(df, pl.DataFrame):
        raise TypeError(f"expected a polars DataFrame, got {type(df).__name__}")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"sampled-workflow frame lacks column(s) {missing}; required: {list(REQUIRED_COLUMNS)}"
        )
    try:
        out = df.select([pl.col(c).cast(t, strict=True) for c, t in REQUIRED_COLUMNS.items()]
                        + [pl.col(PROMPT_GROUP).cast(pl.String(), strict=True) if PROMPT_GROUP in df.columns
                           else pl.lit(None, dtype=pl.String()).alias(PROMPT_GROUP)]
                        + [pl.col(ANCHOR).cast(pl.Boolean(), strict=True).fill_null(False) if ANCHOR in df.columns
                           else pl.lit(False).alias(ANCHOR)])
    except pl.exceptions.PolarsError as e:  # InvalidOperationError, ComputeError, ...
        raise ValueError(f"sampled-workflow frame has a column of the wrong type: {e}") from e

    for c in ("iteration", "query_id", "sample_idx", "status"):
        n_null = out[c].null_count()
        if n_null:
            raise ValueError(f"column {c!r} has {n_null} null value(s); every row needs {c}")

    bad_status = sorted(set(out["status"].unique().to_list()) - set(_STATUS_VALUES))
    if bad_status:
        raise ValueError(f"unknown status value(s) {bad_status}; allowed: {list(_STATUS_VALUES)}")

    dup = out.group_by(["iteration", "query_id", "sample_idx"]).len().filter(pl.col("len") > 1)
    if dup.height:
        first = dup.sort(["iteration", "query_id", "sample_idx"]).row(0, named=True)
        raise ValueError(
            f"{dup.height} duplicate (iteration, query_id, sample_idx) key(s), e.g. "
            f"({first['iteration']}, {first['query_id']!r}, {first['sample_idx']}) appears {first['len']} times"
        )

    score_missing = pl.col("score").is_null() | pl.col("score").is_nan()
    ok_missing = out.filter(score_missing & (pl.col("status") == Status.OK.value))
    if ok_missing.height:
        r = ok_missing.row(0, named=True)
        raise ValueError(
            f"{ok_missing.height} row(s) with status 'ok' have no score, e.g. "
            f"(iteration={r['iteration']}, query_id={r['query_id']!r}, sample_idx={r['sample_idx']})"
        )
    out = out.with_columns(
        pl.when(score_missing & pl.col("status").is_in(list(_ZERO_STATUSES)))
        .then(pl.lit(0.0))
        .otherwise(pl.col("score"))
        .alias("score"),
        pl.col("workflow").fill_null(""),
    )
    scored = out.filter(pl.col("status") != Status.EXECUTOR_ERROR.value)
    bad = scored.filter((pl.col("score") < 0.0) | (pl.col("score") > 1.0))
    if bad.height:
        r = bad.row(0, named=True)
        raise ValueError(
            f"{bad.height} score(s) outside [0, 1], e.g. {r['score']} at "
            f"(iteration={r['iteration']}, query_id={r['query_id']!r}, sample_idx={r['sample_idx']})"
        )
    return out.sort(["iteration", "query_id", "sample_idx"])


def _by_query(df: pl.DataFrame) -> Iterable[tuple[tuple[int, str, str | None], list[dict[str, Any]]]]:
    """Rows per (iteration, query_id, prompt_group), in sample_idx order: the unit every comparison is made in
    (a frame without `prompt_group` has one prompt per query)."""
    if PROMPT_GROUP not in df.columns:
        df = df.with_columns(pl.lit(None, dtype=pl.String()).alias(PROMPT_GROUP))
    rows = df.sort(["iteration", "query_id", PROMPT_GROUP, "sample_idx"], nulls_last=False).iter_rows(named=True)
    for key, grp in itertools.groupby(rows, key=lambda r: (r["iteration"], r["query_id"], r[PROMPT_GROUP])):
        yield key, list(grp)


def _group_prefix(it: int, qid: str, pg: str | None) -> str:
    return f"{it}:{qid}" if pg is None else f"{it}:{qid}@{pg}"


# --------------------------------------------------------------------------------------------------------------
# 2. Executor errors
# --------------------------------------------------------------------------------------------------------------


def _split_off(df: pl.DataFrame, leaves: pl.Expr, reason: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(rows that stay, rows where `leaves` holds with `reason`, in DROPPED_ROWS_SCHEMA)."""
    dropped = (
        df.filter(leaves)
        .select(["iteration", "query_id", "sample_idx", "status", "score"])
        .with_columns(pl.lit(reason).alias("reason"))
    )
    return df.filter(~leaves), dropped.cast(DROPPED_ROWS_SCHEMA)  # type: ignore[arg-type]


def exclude_executor_errors(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split off rows with status `executor_error`. Returns (kept rows, dropped rows with reason)."""
    return _split_off(df, pl.col("status") == Status.EXECUTOR_ERROR.value, REASON_EXECUTOR_ERROR)


def exclude_not_valid(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split off rows whose workflow never ran because none was extracted (`format_error`) or the validator
    refused it (`invalid`); a workflow that ran and failed (runtime_error, timeout, sandbox_violation) stays.
    Returns (kept rows, dropped rows with reason "not_valid")."""
    return _split_off(df, pl.col("status").is_in(NOT_VALID_STATUSES), REASON_NOT_VALID)


# --------------------------------------------------------------------------------------------------------------
# 3. Near-duplicates
# --------------------------------------------------------------------------------------------------------------


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                body.pop(0)
                if not body and not isinstance(node, ast.Module):
                    body.append(ast.Pass())


_WS = re.compile(r"\s+")
_COMMENT = re.compile(r"#[^\n]*")


def normalize_code(code: str) -> str:
    """Canonical text of a workflow, so that cosmetic differences do not make two workflows look different.

    Code that parses (after dedenting) is round-tripped through the AST: comments and docstrings (a string
    literal that is the first statement of a module, class or function) disappear, whitespace and layout become
    canonical, every string literal is written with `repr` quoting (so "x" and 'x' are equal) and redundant
    parentheses vanish. String literals that are not docstrings (operator instructions, prompts) are kept: they
    are part of what a workflow does.

    Code that does not parse (format_error / invalid rows) gets a crude fallback: everything from '#' to the end
    of a line is removed (also inside strings), double quotes become single quotes, and whitespace runs collapse
    to one space.
    """
    if not code or not code.strip():
        return ""
    try:
        tree = ast.parse(textwrap.dedent(code))
    except (SyntaxError, ValueError):  # ValueError: source with NUL bytes
        text = _COMMENT.sub("", code).replace('"', "'")
        return _WS.sub(" ", text).strip()
    _strip_docstrings(tree)
    return ast.unparse(tree)


_TOKEN = re.compile(r"\w+|[^\w\s]")


def _tokens(normalised: str) -> list[str]:
    return _TOKEN.findall(normalised)


def code_similarity(a: str, b: str, *, normalized: bool = False) -> float:
    """Similarity in [0, 1] of two workflows: difflib's ratio 2·M/(|A|+|B|) over token sequences.

    Tokens are identifier/number runs (`\\w+`) and single punctuation characters of the normalised code
    (`normalize_code`, skipped when `normalized=True`); `SequenceMatcher` runs with `autojunk=False` (its junk
    heuristic would ignore the most common tokens of any code longer than 200 tokens). Token level rather than
    character level: faster, and a renamed variable counts as one change, not as many. Two empty codes score 0
    (nothing to compare: a format error with no code is not a duplicate of another).
    """
    na = a if normalized else normalize_code(a)
    nb = b if normalized else normalize_code(b)
    return _token_similarity(_tokens(na), _tokens(nb))


def _token_similarity(ta: list[str], tb: list[str], threshold: float | None = None) -> float:
    if not ta or not tb:
        return 0.0
    sm = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
    if threshold is not None:
        # cheap upper bounds first; a pair that cannot reach the threshold is not worth the full ratio
        if sm.real_quick_ratio() < threshold or sm.quick_ratio() < threshold:
            return 0.0
    return sm.ratio()


def filter_near_duplicates(df: pl.DataFrame, tau_sim: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Drop near-duplicate workflows within each query (and prompt group). Returns (kept rows, dropped rows with reason).

    Greedy in ascending sample_idx: a row is compared with the rows already kept for its query (lowest
    sample_idx first) and is dropped with reason "near_duplicate_of:<idx>" for the first kept row whose
    similarity (`code_similarity`) is >= tau_sim; it is never compared with dropped rows. So the lowest
    sample_idx of a cluster survives, whatever the row order of the input. Rows with empty code are never
    duplicates. Run it after `exclude_executor_errors`, so an infrastructure failure cannot shadow a workflow.
    """
    if not (0.0 < tau_sim <= 1.0):
        raise ValueError(f"tau_sim={tau_sim} must satisfy 0 < tau_sim <= 1")
    drop: list[dict[str, Any]] = []
    drop_keys: set[tuple[int, str, int]] = set()
    for (it, qid, _pg), rows in _by_query(df):
        kept: list[tuple[int, list[str]]] = []
        for r in rows:
            toks = _tokens(normalize_code(r["workflow"]))
            dup_of = None
            if toks:
                for idx, ktoks in kept:
                    if _token_similarity(toks, ktoks, threshold=tau_sim) >= tau_sim:
                        dup_of = idx
                        break
            if dup_of is None:
                kept.append((r["sample_idx"], toks))
            else:
                drop_keys.add((it, qid, r["sample_idx"]))
                drop.append(
                    {
                        "iteration": it,
                        "query_id": qid,
                        "sample_idx": r["sample_idx"],
                        "status": r["status"],
                        "score": r["score"],
                        "reason": f"{REASON_NEAR_DUPLICATE}:{dup_of}",
                    }
                )
    dropped = _columns(drop, DROPPED_ROWS_SCHEMA)
    if not drop:
        return df, dropped
    keys = dropped.select(["iteration", "query_id", "sample_idx"])
    return df.join(keys, on=["iteration", "query_id", "sample_idx"], how="anti", maintain_order="left"), dropped


# --------------------------------------------------------------------------------------------------------------
# 4. Groups
# --------------------------------------------------------------------------------------------------------------


def _unrank_combination(rank: int, m: int, n: int) -> tuple[int, ...]:
    """The rank-th (0-based) n-subset of range(m) in lexicographic order."""
    out: list[int] = []
    x = 0
    for k in range(n, 0, -1):
        while True:
            c = math.comb(m - x - 1, k - 1)  # subsets whose next element is x
            if rank < c:
                break
            rank -= c
            x += 1
        out.append(x)
        x += 1
    return tuple(out)


def _choose_groups(m: int, n: int, g_max: int, rng_seed: int) -> list[tuple[int, ...]]:
    total = math.comb(m, n)
    if total <= g_max:
        return list(itertools.combinations(range(m), n))
    ranks = sorted(random.Random(rng_seed).sample(range(total), g_max))  # distinct, uniform; works for huge totals
    return [_unrank_combination(r, m, n) for r in ranks]


def form_groups(
    df: pl.DataFrame, n: int, g_max: int, seed: int = 0
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Groups of n workflows per query (per prompt group, see the module docstring). Returns (groups, dropped
    groups).

    The m' usable rows of a query are ordered by sample_idx. When C(m', n) <= g_max every n-subset becomes a
    group (lexicographic order); otherwise g_max distinct subsets are drawn uniformly without replacement by
    `random.Random` seeded from sha256(seed, iteration, query_id), so the same seed gives the same groups,
    independent of row order and of the other queries. group_id is "<iteration>:<query_id>#<k>", k = position
    of the group in that (lexicographic) list. A query with m' < n gives one dropped-group row with reason
    "too_few_workflows" (group_id null, members = its usable rows).
    """
    if n < 1 or g_max < 1:
        raise ValueError(f"n={n} and g_max={g_max} must be >= 1")
    groups: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for (it, qid, pg), rows in _by_query(df):
        idxs = [r["sample_idx"] for r in rows]
        scores = [float(r["score"]) for r in rows]
        if len(rows) < n:
            dropped.append(
                {
                    "iteration": it,
                    "query_id": qid,
                    "group_id": None,
                    "members": idxs,
                    "score_std": None,
                    "reason": REASON_TOO_FEW,
                }
            )
            continue
        rng_seed = derive_seed(seed, it, qid if pg is None else f"{qid}@{pg}", bits=64)
        for k, combo in enumerate(_choose_groups(len(rows), n, g_max, rng_seed)):
            groups.append(
                {
                    "iteration": it,
                    "query_id": qid,
                    "group_id": f"{_group_prefix(it, qid, pg)}#{k}",
                    "members": [idxs[j] for j in combo],
                    "scores": [scores[j] for j in combo],
                }
            )
    return _columns(groups, GROUPS_SCHEMA), _columns(dropped, DROPPED_GROUPS_SCHEMA)


def form_anchor_groups(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`anchor_groups: contrast`: one group per query (and prompt group) of all its usable anchor rows, group_id
    "<iteration>:<query_id>#anchors", members in sample_idx order. A query with fewer than 2 usable anchors
    gives a dropped-group row "too_few_workflows" (one workflow has nothing to be contrasted with)."""
    groups: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for (it, qid, pg), rows in _by_query(df):
        idxs = [r["sample_idx"] for r in rows]
        if len(rows) < 2:
            dropped.append({"iteration": it, "query_id": qid, "group_id": None, "members": idxs, "score_std": None,
                            "reason": REASON_TOO_FEW})
            continue
        groups.append({"iteration": it, "query_id": qid, "group_id": _group_prefix(it, qid, pg) + ANCHOR_GROUP_SUFFIX,
                       "members": idxs, "scores": [float(r["score"]) for r in rows]})
    return _columns(groups, GROUPS_SCHEMA), _columns(dropped, DROPPED_GROUPS_SCHEMA)


def is_anchor_group(group_id: str) -> bool:
    return group_id.endswith(ANCHOR_GROUP_SUFFIX)


# --------------------------------------------------------------------------------------------------------------
# 5. Screening
# --------------------------------------------------------------------------------------------------------------


def group_std(scores: Sequence[float], ddof: int = 0) -> float:
    """Std of a group's scores: sqrt(Σ(s − mean)² / (k − ddof)); exactly 0.0 when all scores are equal."""
    k = len(scores)
    if k == 0:
        raise ValueError("std of an empty group")
    if min(scores) == max(scores):
        return 0.0
    if k - ddof <= 0:
        raise ValueError(f"std with ddof={ddof} needs more than {ddof} score(s)")
    mean = math.fsum(scores) / k
    return math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / (k - ddof))


def screen_groups(
    groups: pl.DataFrame, tau_std: float, ddof: int = 0
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Keep groups whose score std (`group_std`, population by default) is >= tau_std.

    Returns (kept groups with score_mean and score_std, dropped groups with reason "low_score_std").
    """
    if tau_std < 0:
        raise ValueError(f"tau_std={tau_std} must be >= 0")
    means = [math.fsum(s) / len(s) for s in groups["scores"].to_list()]
    stds = [group_std(s, ddof) for s in groups["scores"].to_list()]
    scored = groups.with_columns(
        pl.Series("score_mean", means, dtype=pl.Float64()),
        pl.Series("score_std", stds, dtype=pl.Float64()),
    )
    keep = pl.col("score_std") >= tau_std
    dropped = (
        scored.filter(~keep)
        .select(["iteration", "query_id", "group_id", "members", "score_std"])
        .with_columns(pl.lit(REASON_LOW_STD).alias("reason"))
    )
    return scored.filter(keep).cast(SCREENED_SCHEMA), dropped.cast(DROPPED_GROUPS_SCHEMA)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------------
# 6. Sharpening
# --------------------------------------------------------------------------------------------------------------


def _sharpen(members: Sequence[int], scores: Sequence[float], t: int, keep_all: bool = False
             ) -> tuple[list[int], list[int]]:
    pairs = list(zip(members, scores))
    if keep_all:  # an anchor group keeps every member: those above the mean are the top half
        mean = math.fsum(scores) / len(scores)
        top = sorted((p for p in pairs if p[1] > mean), key=lambda p: (-p[1], p[0]))
        bottom = sorted((p for p in pairs if p[1] <= mean), key=lambda p: (p[1], p[0]))
        return [p[0] for p in top], [p[0] for p in bottom]
    top = sorted(pairs, key=lambda p: (-p[1], p[0]))[:t]
    top_set = {p[0] for p in top}
    bottom = sorted((p for p in pairs if p[0] not in top_set), key=lambda p: (p[1], p[0]))[:t]
    return [p[0] for p in top], [p[0] for p in bottom]


def sharpen_groups(
    groups: pl.DataFrame, t: int, *, dedup: bool = False
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Top-t and bottom-t of each group. Returns (one row per member, dropped groups).

    Order and ties: the top half is the first t of (score desc, sample_idx asc); the bottom half is the first t
    of (score asc, sample_idx asc) among the remaining members, so the halves are disjoint. `rank` numbers the
    members 0..2t−1: top half best first, then bottom half worst first.
    With `dedup=True`, a group whose set of 2t members equals that of an earlier group (by group order) of the
    same query is dropped with reason "duplicate_of_group:<group_id>".
    """
    if t < 1:
        raise ValueError(f"t={t} must be >= 1")
    rows: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    seen: dict[tuple[int, str, frozenset[int]], str] = {}
    for g in groups.iter_rows(named=True):
        members, scores = g["members"], g["scores"]
        anchors = is_anchor_group(g["group_id"])
        if len(members) < 2 * t and not anchors:
            raise ValueError(
                f"group {g['group_id']} has {len(members)} members, fewer than 2t={2 * t}; set n >= 2t"
            )
        top, bottom = _sharpen(members, scores, t, keep_all=anchors)
        if dedup:
            key = (g["iteration"], g["query_id"], frozenset(top + bottom))
            if key in seen:
                dropped.append(
                    {
                        "iteration": g["iteration"],
                        "query_id": g["query_id"],
                        "group_id": g["group_id"],
                        "members": members,
                        "score_std": g.get("score_std"),
                        "reason": f"{REASON_DUPLICATE_GROUP}:{seen[key]}",
                    }
                )
                continue
            seen[key] = g["group_id"]
        score_of = dict(zip(members, scores))
        for rank, (idx, role) in enumerate([(i, "top") for i in top] + [(i, "bottom") for i in bottom]):
            rows.append(
                {
                    "iteration": g["iteration"],
                    "query_id": g["query_id"],
                    "group_id": g["group_id"],
                    "sample_idx": idx,
                    "score": score_of[idx],
                    "role": role,
                    "rank": rank,
                }
            )
    return _columns(rows, MEMBERS_SCHEMA), _columns(dropped, DROPPED_GROUPS_SCHEMA)


# --------------------------------------------------------------------------------------------------------------
# 7. Advantages
# --------------------------------------------------------------------------------------------------------------


def compute_advantages(members: pl.DataFrame, eps: float = 1e-4, ddof: int = 0, std_floor: float = 0.0) -> pl.DataFrame:
    """Add group_mean, group_std and advantage Â = (s − mean_g)/(max(std_g, std_floor) + ε), per group_id.

    A group whose std is 0 (possible only with tau_std = 0) gets advantage 0 for every member, also when ε = 0.
    """
    if eps < 0:
        raise ValueError(f"eps={eps} must be >= 0")
    if members.height == 0:
        return _frame(None, ADVANTAGE_SCHEMA)
    stats: dict[str, tuple[float, float]] = {}
    for gid, scores in (
        members.group_by("group_id", maintain_order=True).agg(pl.col("score")).iter_rows()
    ):
        stats[gid] = (math.fsum(scores) / len(scores), group_std(scores, ddof))
    gids = members["group_id"].to_list()
    mean = [stats[g][0] for g in gids]
    std = [stats[g][1] for g in gids]
    adv = [
        0.0 if sd == 0.0 else (s - mu) / (max(sd, std_floor) + eps)
        for s, mu, sd in zip(members["score"].to_list(), mean, std)
    ]
    return members.with_columns(
        pl.Series("group_mean", mean, dtype=pl.Float64()),
        pl.Series("group_std", std, dtype=pl.Float64()),
        pl.Series("advantage", adv, dtype=pl.Float64()),
    ).cast(ADVANTAGE_SCHEMA)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------------
# Whole pipeline
# --------------------------------------------------------------------------------------------------------------


def _reason_kind(reason: str) -> str:
    return reason.split(":", 1)[0]


def count_reasons(dropped: pl.DataFrame) -> dict[str, int]:
    """Drop reasons counted by kind (the part before ':', e.g. "near_duplicate_of"), sorted by kind."""
    return dict(sorted(Counter(_reason_kind(r) for r in dropped["reason"].to_list()).items()))


@dataclass
class Screening:
    """Steps 1–5 (the `screened_groups` asset): what was usable, the groups kept and what was dropped, and why.

    usable          rows after executor errors (with `valid_only`, unvalidated rows) and near-duplicates left
                    (the candidates groups are drawn from).
    groups          kept groups (SCREENED_SCHEMA: members, scores, score_mean, score_std).
    dropped_rows    iteration, query_id, sample_idx, status, score, reason (executor errors, not valid,
                    near-duplicates).
    dropped_groups  queries with too few workflows and groups below tau_std, with their reason.
    """

    rows_in: int
    queries_in: int
    usable: pl.DataFrame
    groups_formed: int
    groups: pl.DataFrame
    dropped_rows: pl.DataFrame
    dropped_groups: pl.DataFrame

    def summary(self) -> dict[str, Any]:
        q = ["iteration", "query_id"]
        return {
            "rows_in": self.rows_in,
            "queries_in": self.queries_in,
            "rows_usable": self.usable.height,
            "groups_formed": self.groups_formed,
            "groups_kept": self.groups.height,
            "queries_with_groups": self.groups.select(q).unique().height,
            "dropped_rows": count_reasons(self.dropped_rows),
            "dropped_groups": count_reasons(self.dropped_groups),
        }


def screen(samples: pl.DataFrame, cfg: CurationConfig) -> Screening:
    """Validate → exclude executor errors → drop near-duplicates → form groups → screen by score std."""
    df = validate_samples(samples)
    usable, dropped_exec = exclude_executor_errors(df)
    if cfg.valid_only:
        usable, dropped_invalid = exclude_not_valid(usable)
        dropped_exec = pl.concat([dropped_exec, dropped_invalid])
    # with contrast, the anchors bypass near-duplicate filtering and the n-groups: one group of their own a query
    anchors = usable.filter(pl.col(ANCHOR)) if cfg.anchor_groups == "contrast" else usable.clear()
    usable, dropped_dup = filter_near_duplicates(usable.filter(~pl.col(ANCHOR)) if anchors.height else usable,
                                                 cfg.tau_sim)
    groups, dropped_few = form_groups(usable, cfg.n, cfg.g_max, cfg.seed)
    if anchors.height:
        a_groups, a_few = form_anchor_groups(anchors)
        groups, dropped_few = pl.concat([groups, a_groups]), pl.concat([dropped_few, a_few])
        usable = pl.concat([usable, anchors]).sort(["iteration", "query_id", "sample_idx"])
    kept, dropped_std = screen_groups(groups, cfg.tau_std, cfg.std_ddof)
    return Screening(
        rows_in=df.height, queries_in=df.select(["iteration", "query_id"]).unique().height, usable=usable, groups_formed=groups.height, groups=kept,
        dropped_rows=pl.concat([dropped_exec, dropped_dup]).sort(["iteration", "query_id", "sample_idx"]),
        dropped_groups=pl.concat([dropped_few, dropped_std]),
    )


@dataclass
class Sharpening:
    """Steps 6–7 (the `sharpened_groups` asset): one row per sharpened member with its advantage, and the
    groups dropped as duplicates of an earlier group (only with `dedup_sharpened_groups`)."""

    members: pl.DataFrame
    dropped_groups: pl.DataFrame

    def summary(self) -> dict[str, Any]:
        adv = self.members["advantage"].to_list()
        return {
            "groups": self.members["group_id"].n_unique() if self.members.height else 0,
            "members": self.members.height,
            "positive_advantage": sum(a > 0 for a in adv),
            "negative_advantage": sum(a < 0 for a in adv),
            "zero_advantage": sum(a == 0 for a in adv),
            "duplicate_groups_dropped": self.dropped_groups.height,
        }


def sharpen(groups: pl.DataFrame, cfg: CurationConfig) -> Sharpening:
    """Top-t and bottom-t of each kept group, then the group-normalised advantages."""
    members, dropped = sharpen_groups(groups, cfg.t, dedup=cfg.dedup_sharpened_groups)
    adv = compute_advantages(members, cfg.adv_eps, cfg.std_ddof, cfg.adv_std_floor)
    if cfg.anchor_weight != 1.0 and adv.height:
        adv = adv.with_columns(pl.when(pl.col("group_id").str.ends_with(ANCHOR_GROUP_SUFFIX))
                               .then(pl.col("advantage") * cfg.anchor_weight).otherwise(pl.col("advantage"))
                               .alias("advantage"))
    return Sharpening(adv, dropped)


@dataclass
class CurationResult:
    """What `curate` returns; every frame has a fixed schema, also when empty.

    members         one row per sharpened member (the training rows): iteration, query_id, group_id, sample_idx,
                    score, role, rank, group_mean, group_std, advantage. Join with the input on
                    (iteration, query_id, sample_idx) for the workflow text.
    groups          one row per kept group: iteration, query_id, group_id, members (n sample_idx), scores,
                    score_mean, score_std (of the n-group, as screened), top and bottom (sample_idx lists).
    dropped_rows    iteration, query_id, sample_idx, status, score, reason.
    dropped_groups  iteration, query_id, group_id, members, score_std, reason.
    summary         counts: rows in and usable, queries in and with groups, groups formed and kept, member rows,
                    drop reasons of rows and of groups (both stages) by kind.
    """

    members: pl.DataFrame
    groups: pl.DataFrame
    dropped_rows: pl.DataFrame
    dropped_groups: pl.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)


def curate(samples: pl.DataFrame, cfg: CurationConfig) -> CurationResult:
    """Both stages in one call: `screen` then `sharpen` (the assets run them as two partitions' worth of work)."""
    sc = screen(samples, cfg)
    sh = sharpen(sc.groups, cfg)
    screened = sc.groups
    if sh.dropped_groups.height:
        screened = screened.join(sh.dropped_groups.select("group_id"), on="group_id", how="anti",
                                 maintain_order="left")
    halves = sh.members.group_by("group_id", maintain_order=True).agg(
        pl.col("sample_idx").filter(pl.col("role") == "top").alias("top"),
        pl.col("sample_idx").filter(pl.col("role") == "bottom").alias("bottom"),
    )
    kept_groups = screened.join(halves, on="group_id", how="left", maintain_order="left")
    dropped_groups = pl.concat([sc.dropped_groups, sh.dropped_groups])
    first = sc.summary()
    summary = {"rows_in": first["rows_in"], "rows_usable": first["rows_usable"],
               "queries_in": first["queries_in"],
               "queries_with_groups": kept_groups.select(["iteration", "query_id"]).unique().height,
               "groups_formed": first["groups_formed"], "groups_kept": kept_groups.height,
               "member_rows": sh.members.height, "dropped_rows": first["dropped_rows"],
               "dropped_groups": count_reasons(dropped_groups)}
    return CurationResult(members=sh.members, groups=kept_groups, dropped_rows=sc.dropped_rows,
                          dropped_groups=dropped_groups, summary=summary)


# --------------------------------------------------------------------------------------------------------------
# ScoreFlow preference pairs (the `score_dpo` variant's data)
# --------------------------------------------------------------------------------------------------------------


def scored_candidates(samples: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The full scored candidate set of the baselines' data paths: every sampled workflow with a score, i.e.
    `validate_samples` then `exclude_executor_errors` (an infrastructure failure says nothing about the
    workflow). Returns (usable rows, dropped rows with reason).

    Near-duplicates are **not** excluded, following ScoreFlow: its pair builder (`evaluate.py`) forms all pairs
    among a query's workflows; its only similarity check compares each workflow with the *template* (novelty,
    `sim_threshold`, 1.1 = off for HumanEval/MBPP), never two workflows with each other; W4S neither. So the
    same workflow sampled twice counts twice, as in both papers. Each paper then keeps only some candidates:
    `score_dpo_candidates` (ScoreFlow) and `w4s_kept_candidates` (W4S).
    """
    return exclude_executor_errors(validate_samples(samples))


def ran_mask(df: pl.DataFrame) -> pl.Series:
    """Which rows are workflows that **ran**, the one definition both baselines' data paths use: status `ok` (it
    parsed, the validator accepted it and at least one run finished without error or timeout, as
    `evaluation.aggregate_status` sets it), no run a `sandbox_violation` (`run_statuses`: a workflow that tried
    to leave the sandbox is never training data, even if another run finished), and not `trivial` (its answer
    is no solution-writing operator's output, `core.rewards.is_trivial`: nothing ran that could have answered;
    the ladder withholds its executes rung for the same reason). Needs the `trivial` and `run_statuses` columns
    (execution_scores has both: a frame without one cannot say the workflow ran, so it is refused rather than
    let a sandbox violation through); a null there (an unknown) counts as not trivial / no violation."""
    missing = [c for c in ("trivial", "run_statuses") if c not in df.columns]
    if missing:
        raise ValueError(f"ran_mask needs the column(s) {', '.join(missing)} (execution_scores has them): "
                         "rematerialize execution_scores")
    ok = pl.col("status") == Status.OK.value
    not_trivial = ~pl.col("trivial").cast(pl.Boolean()).fill_null(False)
    violated = pl.col("run_statuses").list.contains(Status.SANDBOX_VIOLATION.value).fill_null(False)
    return df.select((ok & not_trivial & ~violated).alias("ran"))["ran"]


def score_dpo_candidates(df: pl.DataFrame) -> pl.DataFrame:
    """What ScoreFlow forms its pairs from: workflows that ran (`ran_mask`), scored on the benchmark's answer.

    ScoreFlow regenerates a workflow until it runs on a smoke input, so every candidate it pairs runs, and its
    score is the answer (the mean of 3 executor runs); a ladder score (format, valid, executes) never enters
    its pairs. We cannot regenerate inside one iteration's data, so a workflow that did not run (invalid,
    runtime error, timeout, sandbox violation, trivial) is left out instead: a query keeps fewer candidates.
    Needs the `answer_score` and `trivial` columns; `score` becomes the answer score, the ladder score is kept
    as `ladder_score`, so the pairs (`preference_pair_candidates`) are ordered and weighted by the answer."""
    if "answer_score" not in df.columns:
        raise ValueError("score_dpo_candidates needs an answer_score column (execution_scores has one)")
    ran = df.filter(ran_mask(df))
    bad = ran.filter(pl.col("answer_score").is_null() | pl.col("answer_score").is_nan())
    if bad.height:
        r = bad.row(0, named=True)
        raise ValueError(f"{bad.height} workflow(s) ran but have no answer score, e.g. {r['query_id']!r}/"
                         f"{r['sample_idx']}: rematerialize execution_scores")
    return ran.rename({"score": "ladder_score"}).with_columns(pl.col("answer_score").alias("score"))


# W4S drops a candidate whose validation accuracy is at most this (src/agent/meta_agent.py), and one whose code
# still fails after its self-check repairs: only candidates that ran and reached some accuracy are stored
W4S_MIN_ACCURACY = 0.05


def w4s_kept_candidates(df: pl.DataFrame, min_accuracy: float = W4S_MIN_ACCURACY) -> pl.DataFrame:
    """The candidates W4S keeps as training data: workflows that ran (`ran_mask`: status ok, so a candidate
    whose error persisted after its repairs is out; no sandbox violation; not trivial) with an answer score
    above `min_accuracy` (W4S: accuracy > 0.05; 0.05 itself is dropped). On a 0/1 metric with one executor run
    this keeps the correct answers only. Needs the `answer_score` and `trivial` columns."""
    if "answer_score" not in df.columns:
        raise ValueError("w4s_kept_candidates needs an answer_score column (execution_scores has one)")
    return df.filter(ran_mask(df) & (df["answer_score"].fill_nan(None) > min_accuracy).fill_null(False))


def preference_pair_candidates(df: pl.DataFrame, power: float = 3.0) -> pl.DataFrame:
    """Every ScoreFlow candidate pair: per query (and prompt group), each pair of rows with different scores (chosen = higher
    score; ties give no pair), with weight (s_w − s_l)^power and its probability weight / Σ weight over **all**
    candidate pairs of the frame (pooled over queries, as ScoreFlow's `np.random.choice` over its whole list).
    Enumerated in key order (iteration, query_id, then sample_idx pairs i < j), so independent of row order.

    Scores 1, 0.5, 0 of one query, power 3: pairs (1, 0.5), (1, 0), (0.5, 0) with weights 0.125, 1, 0.125,
    probabilities 0.1, 0.8, 0.1."""
    pair_weight(1.0, 0.0, power)  # refuses a negative power even for a frame without pairs
    cand: list[dict[str, Any]] = []
    for (it, qid, _pg), rows in _by_query(df):  # pairs never join completions of two prompts
        scores = [float(r["score"]) for r in rows]
        for w, l in ordered_pairs(scores):
            cand.append({"iteration": it, "query_id": qid, "chosen_idx": rows[w]["sample_idx"],
                         "rejected_idx": rows[l]["sample_idx"], "chosen_score": scores[w],
                         "rejected_score": scores[l], "weight": pair_weight(scores[w], scores[l], power)})
    total = math.fsum(c["weight"] for c in cand)
    for c in cand:
        c["probability"] = c["weight"] / total
    return _columns(cand, PAIR_CANDIDATES_SCHEMA)


def sample_preference_pairs(
    df: pl.DataFrame, n_pairs: int | None = None, power: float = 3.0, seed: int = 0
) -> pl.DataFrame:
    """ScoreFlow's pair data: per query, every pair of workflows with different scores (chosen = higher score);
    then `n_pairs` draws **with replacement**, pooled over all queries, with probability ∝ (s_w − s_l)^power
    (`preference_pair_candidates`; its weight and probability columns come along).

    Input: the workflows that ran, scored on the answer (`score_dpo_candidates`). n_pairs None = as many draws as candidate pairs (ScoreFlow fixes
    2000, or 600 for HumanEval). Seeded (`numpy.random.default_rng(seed)`, ScoreFlow sets no seed); candidates
    are enumerated in key order, so the draws do not depend on row order. Output rows are in draw order.
    """
    if n_pairs is not None and n_pairs < 1:
        raise ValueError(f"n_pairs={n_pairs} must be >= 1 or None")
    cand = preference_pair_candidates(df, power)
    if cand.height == 0:
        return _frame(None, PAIRS_SCHEMA)
    k = cand.height if n_pairs is None else n_pairs
    picks = draw(cand["probability"].to_list(), k, seed)
    out = cand.select(pl.all().gather(picks)).with_columns(pl.Series("draw", list(range(k)), dtype=pl.Int64()))
    return out.select(list(PAIRS_SCHEMA)).cast(PAIRS_SCHEMA)  # type: ignore[arg-type]


def rwr_candidates(df: pl.DataFrame, temperature: float = 0.4) -> pl.DataFrame:
    """RWR's weights of the rows it is given: each once, in key order, with weight exp(r / T) (W4S: T = 0.4;
    r = the row's score). No grouping, no repetition. Scores 1, 0.5, 0 → weights e^2.5 ≈ 12.1825,
    e^1.25 ≈ 3.4903, 1. It filters nothing: W4S's data are the candidates `w4s_kept_candidates` keeps (they
    ran and scored above 0.05), which is what the pipeline gives it (`training_inputs.rwr_training_data`);
    every usable row would include broken and trivial workflows, which W4S never trains on."""
    if not (temperature > 0):
        raise ValueError(f"temperature={temperature} must be > 0")
    rows = df.sort(["iteration", "query_id", "sample_idx"])
    out = rows.select(["iteration", "query_id", "sample_idx", "score", "status"]).with_columns(
        pl.Series("weight", [math.exp(float(r) / temperature) for r in rows["score"].to_list()],
                  dtype=pl.Float64()))
    return out.cast(RWR_SCHEMA)  # type: ignore[arg-type]
