"""Curation: expected values are worked out by hand from the specification in README/ARCHITECTURE.md (and the choices documented in
spogw_dagster/core/curation.py); the comments show the arithmetic."""

from __future__ import annotations

import itertools
import math
import random

import polars as pl
import pytest

from spogw_dagster.core import curation as C
from spogw_dagster.core.hyperparams import ConfigError, CurationConfig
from spogw_dagster.contracts import Status


def distinct_code(i: int) -> str:
    # Workflows that share little: different operator names, instructions and return expressions.
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
             "kilo", "lima"]
    w = words[i % len(words)]
    return f"class Workflow:\n    async def run(self, q):\n        {w}_{i} = await self.{w}(q, '{w} {i}')\n        return {w}_{i}\n"


def frame(rows, iteration: int = 0) -> pl.DataFrame:
    """rows: (query_id, sample_idx, score, status[, workflow])."""
    recs = []
    for r in rows:
        q, idx, score, status = r[:4]
        code = r[4] if len(r) > 4 else distinct_code(idx)
        recs.append(
            {"iteration": iteration, "query_id": q, "sample_idx": idx, "workflow": code, "score": score,
             "status": status}
        )
    return pl.DataFrame(
        recs,
        schema={"iteration": pl.Int64, "query_id": pl.String, "sample_idx": pl.Int64, "workflow": pl.String,
                "score": pl.Float64, "status": pl.String},
    )


def groups_frame(groups) -> pl.DataFrame:
    """groups: list of (group_id, members, scores), all in query 'q', iteration 0."""
    return pl.DataFrame(
        {
            "iteration": [0] * len(groups),
            "query_id": ["q"] * len(groups),
            "group_id": [g[0] for g in groups],
            "members": [list(g[1]) for g in groups],
            "scores": [[float(s) for s in g[2]] for g in groups],
        },
        schema=C.GROUPS_SCHEMA,
    )


def members_frame(group_id, idxs, scores) -> pl.DataFrame:
    n = len(idxs)
    return pl.DataFrame(
        {
            "iteration": [0] * n,
            "query_id": ["q"] * n,
            "group_id": [group_id] * n,
            "sample_idx": list(idxs),
            "score": [float(s) for s in scores],
            "role": ["top"] * (n // 2) + ["bottom"] * (n - n // 2),
            "rank": list(range(n)),
        },
        schema=C.MEMBERS_SCHEMA,
    )


# ----------------------------------------------------------------------------------------------------------------
# Advantages
# ----------------------------------------------------------------------------------------------------------------


def test_advantages_population_std_by_hand():
    # scores 1, .5, .5, 0: mean .5; deviations .5, 0, 0, -.5; population var = (.25+.25)/4 = .125,
    # std = sqrt(.125) = 0.35355; with eps = 0: Â = ±.5/.35355 = ±sqrt(2), 0, 0.
    out = C.compute_advantages(members_frame("g", [0, 1, 2, 3], [1, 0.5, 0.5, 0]), eps=0.0, ddof=0)
    adv = out["advantage"].to_list()
    assert adv == pytest.approx([math.sqrt(2), 0.0, 0.0, -math.sqrt(2)], abs=1e-12)
    assert out["group_mean"].to_list() == pytest.approx([0.5] * 4)
    assert out["group_std"].to_list() == pytest.approx([math.sqrt(0.125)] * 4)


def test_advantages_sample_std_and_eps_by_hand():
    # sample var = .5/3, std = 0.408248; Â = ±.5/(0.408248 + 1e-4)
    out = C.compute_advantages(members_frame("g", [0, 1, 2, 3], [1, 0.5, 0.5, 0]), eps=1e-4, ddof=1)
    a = 0.5 / (math.sqrt(0.5 / 3) + 1e-4)
    assert out["advantage"].to_list() == pytest.approx([a, 0.0, 0.0, -a], abs=1e-12)


def test_advantages_per_group_and_zero_std_group():
    # group a: scores 1, 0 -> mean .5, std .5 -> Â = ±.5/.5 = ±1 (eps 0)
    # group b: all .7 -> std 0 -> every Â = 0 (not NaN), even with eps = 0
    m = pl.concat([members_frame("a", [0, 1], [1, 0]), members_frame("b", [2, 3, 4, 5], [0.7] * 4)])
    out = C.compute_advantages(m, eps=0.0)
    assert out["advantage"].to_list() == [1.0, -1.0, 0.0, 0.0, 0.0, 0.0]


def test_group_std_of_equal_scores_is_exactly_zero():
    # 0.1 * 3 has a rounding residue in floating point; equal scores must still give exactly 0
    assert C.group_std([0.1, 0.1, 0.1]) == 0.0
    assert C.group_std([1.0, 0.0]) == 0.5  # population: sqrt(.25)
    assert C.group_std([1.0, 0.0], ddof=1) == pytest.approx(math.sqrt(0.5))


# ----------------------------------------------------------------------------------------------------------------
# Screening
# ----------------------------------------------------------------------------------------------------------------


def test_screening_by_hand():
    g = groups_frame(
        [
            ("g0", [0, 1, 2, 3], [1, 0, 0, 0]),  # p = 1/4: std = sqrt(p(1-p)) = sqrt(3/16) = 0.4330
            ("g1", [0, 1, 2, 4], [0, 0, 0, 0]),  # std 0
            ("g2", [0, 1, 3, 4], [0.1, 0.1, 0.1, 0.1]),  # equal: std exactly 0
            ("g3", [0, 2, 3, 4], [0.5, 0.5, 0.5, 0.6]),  # mean .525, var (3*.025^2 + .075^2)/4 = .001875, std .0433
            ("g4", [1, 2, 3, 4], [1, 1, 0, 0]),  # std .5 exactly
        ]
    )
    kept, dropped = C.screen_groups(g, tau_std=0.05)
    assert kept["group_id"].to_list() == ["g0", "g4"]
    assert kept["score_std"].to_list() == pytest.approx([math.sqrt(3 / 16), 0.5])
    assert kept["score_mean"].to_list() == pytest.approx([0.25, 0.5])
    assert dropped["group_id"].to_list() == ["g1", "g2", "g3"]
    assert set(dropped["reason"].to_list()) == {"low_score_std"}
    assert dropped["score_std"].to_list() == pytest.approx([0.0, 0.0, math.sqrt(0.001875)])

    kept, _ = C.screen_groups(g, tau_std=0.04)  # .0433 >= .04 now passes
    assert kept["group_id"].to_list() == ["g0", "g3", "g4"]
    kept, _ = C.screen_groups(g, tau_std=0.5)  # boundary: std == tau is kept
    assert kept["group_id"].to_list() == ["g4"]
    kept, dropped = C.screen_groups(g, tau_std=0.0)  # 0 keeps everything
    assert kept.height == 5 and dropped.height == 0


def test_screening_sample_std():
    # [1, 0]: sample std = sqrt(.5/1) = .7071 >= .6; population .5 < .6
    g = groups_frame([("g", [0, 1], [1, 0])])
    assert C.screen_groups(g, 0.6, ddof=1)[0].height == 1
    assert C.screen_groups(g, 0.6, ddof=0)[0].height == 0


# ----------------------------------------------------------------------------------------------------------------
# Sharpening
# ----------------------------------------------------------------------------------------------------------------


def test_sharpening_with_ties_by_hand():
    # members 10..15, scores 1, 0, 1, .5, 1, 0; t = 2
    # order (score desc, idx asc): 10, 12, 14 (all 1), 13 (.5), 11, 15 (0) -> top = [10, 12]
    # bottom from the rest {11, 13, 14, 15} by (score asc, idx asc): 11, 15 -> bottom = [11, 15]
    g = groups_frame([("g", [10, 11, 12, 13, 14, 15], [1, 0, 1, 0.5, 1, 0])])
    m, dropped = C.sharpen_groups(g, t=2)
    assert dropped.height == 0
    assert m["sample_idx"].to_list() == [10, 12, 11, 15]
    assert m["role"].to_list() == ["top", "top", "bottom", "bottom"]
    assert m["rank"].to_list() == [0, 1, 2, 3]
    assert m["score"].to_list() == [1.0, 1.0, 0.0, 0.0]


def test_sharpening_ties_across_the_boundary_do_not_overlap():
    # scores 1, 1, 1, 0 (idx 0..3), t = 2: top = [0, 1]; bottom from {2, 3} by score asc: 3 (0), then 2 (1)
    # sharpened scores 1, 1, 0, 1: mean .75, population std sqrt(3/16) = .4330;
    # Â(1) = .25/.4330 = 1/sqrt(3), Â(0) = -.75/.4330 = -sqrt(3)   (eps = 0)
    g = groups_frame([("g", [0, 1, 2, 3], [1, 1, 1, 0])])
    m, _ = C.sharpen_groups(g, t=2)
    assert m["sample_idx"].to_list() == [0, 1, 3, 2]
    assert m["role"].to_list() == ["top", "top", "bottom", "bottom"]
    adv = C.compute_advantages(m, eps=0.0)["advantage"].to_list()
    assert adv == pytest.approx([1 / math.sqrt(3), 1 / math.sqrt(3), -math.sqrt(3), 1 / math.sqrt(3)])


def test_sharpening_equal_scores_lowest_indices_first_and_disjoint():
    # all scores equal, members listed out of order: top = two lowest idx [0, 1]; bottom = next two [2, 3]
    g = groups_frame([("g", [3, 1, 2, 0, 5], [0.5] * 5)])
    m, _ = C.sharpen_groups(g, t=2)
    assert m["sample_idx"].to_list() == [0, 1, 2, 3]
    assert len(set(m["sample_idx"].to_list())) == 4
    assert C.compute_advantages(m, eps=0.0)["advantage"].to_list() == [0.0] * 4


def test_sharpening_group_smaller_than_2t_is_an_error():
    g = groups_frame([("g", [0, 1, 2], [1, 0, 0])])
    with pytest.raises(ValueError, match="n >= 2t"):
        C.sharpen_groups(g, t=2)


def test_sharpening_dedup_of_identical_sharpened_groups():
    # g0 and g1 differ only in a middle member (.5 vs .4): both sharpen (t=1) to {top 0, bottom 3}
    g = groups_frame([("g0", [0, 1, 3], [1, 0.5, 0]), ("g1", [0, 2, 3], [1, 0.4, 0]), ("g2", [1, 2, 3], [0.5, 0.4, 0])])
    m, dropped = C.sharpen_groups(g, t=1, dedup=True)
    assert m["group_id"].unique(maintain_order=True).to_list() == ["g0", "g2"]
    assert dropped["group_id"].to_list() == ["g1"]
    assert dropped["reason"].to_list() == ["duplicate_of_group:g0"]
    m, dropped = C.sharpen_groups(g, t=1, dedup=False)
    assert m["group_id"].n_unique() == 3 and dropped.height == 0


# ----------------------------------------------------------------------------------------------------------------
# Executor errors and zero-score statuses
# ----------------------------------------------------------------------------------------------------------------


def test_executor_errors_are_dropped_and_other_failures_count_as_zero():
    df = frame(
        [
            ("q", 0, 1.0, "ok"),
            ("q", 1, None, "executor_error"),
            ("q", 2, None, "format_error"),  # missing score on a failure status -> 0
            ("q", 3, 0.0, "timeout"),
            ("q", 4, None, "sandbox_violation"),
            ("q", 5, 0.5, "ok"),
            ("q", 6, 0.0, "runtime_error"),
            ("q", 7, 0.0, "invalid"),
        ]
    )
    cfg = CurationConfig(m=8, n=7, t=1, g_max=10, tau_std=0.0)
    r = C.curate(df, cfg)
    assert r.dropped_rows.select("sample_idx", "reason").rows() == [(1, "executor_error")]
    # the 7 usable rows make exactly C(7, 7) = 1 group, executor_error row not in it
    assert r.groups.height == 1
    assert r.groups["members"].to_list() == [[0, 2, 3, 4, 5, 6, 7]]
    assert r.groups["scores"].to_list() == [[1.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0]]
    # sharpened t=1: top 0 (1.0), bottom 2 (lowest idx among the zeros): mean .5, std .5,
    # Â = ±.5/(.5 + 1e-4) = ±1/(1 + 2e-4)
    assert r.members["sample_idx"].to_list() == [0, 2]
    assert r.members["advantage"].to_list() == pytest.approx([1 / (1 + 2e-4), -1 / (1 + 2e-4)], abs=1e-12)
    assert r.summary["dropped_rows"] == {"executor_error": 1}


def test_executor_errors_can_leave_too_few_workflows():
    df = frame([("q", 0, 1.0, "ok"), ("q", 1, None, "executor_error"), ("q", 2, 0.0, "ok"),
                ("p", 0, 1.0, "ok"), ("p", 1, 0.0, "ok"), ("p", 2, 0.0, "ok")])
    r = C.curate(df, CurationConfig(m=3, n=3, t=1))
    assert r.groups["query_id"].to_list() == ["p"]
    few = r.dropped_groups.filter(pl.col("reason") == "too_few_workflows")
    assert few.select("query_id", "group_id", "members").rows() == [("q", None, [0, 2])]
    assert r.summary["dropped_groups"] == {"too_few_workflows": 1}


# ----------------------------------------------------------------------------------------------------------------
# Near-duplicates
# ----------------------------------------------------------------------------------------------------------------

CODE_A = 'class Workflow:\n    async def run(self, q):\n        a = await self.custom(q, "solve it")\n        return a\n'
CODE_A_COSMETIC = (
    "class Workflow:\n"
    '    """A docstring that says nothing."""\n'
    "    async def run(self,q) :   # comment\n"
    "        # another comment\n"
    "        a = await self.custom( q , 'solve it' )\n\n"
    "        return (a)\n"
)
CODE_B = 'class Workflow:\n    async def run(self, q):\n        s = [await self.generate(q) for _ in range(3)]\n        return await self.sc_ensemble(s)\n'


def test_normalize_code_removes_cosmetics_but_keeps_instructions():
    assert C.normalize_code(CODE_A) == C.normalize_code(CODE_A_COSMETIC)
    # a different instruction string is a different workflow
    assert C.normalize_code(CODE_A) != C.normalize_code(CODE_A.replace("solve it", "solve it carefully"))
    # indented snippets parse after dedent
    assert C.normalize_code("    x = 1  # c\n    y = 'a'\n") == "x = 1\ny = 'a'"
    # unparsable code: comments cut, double quotes -> single, whitespace collapsed
    assert C.normalize_code('def f(:\n    return "a"   # c\n') == "def f(: return 'a'"
    assert C.normalize_code("") == "" and C.normalize_code("  \n ") == ""


def test_code_similarity_by_hand():
    # tokens [x, =, f, (, 1, )] vs [x, =, f, (, 2, )]: 5 matching of 6 + 6 -> 2*5/12 = 0.8333
    assert C.code_similarity("x = f(1)", "x = f(2)") == pytest.approx(10 / 12)
    assert C.code_similarity(CODE_A, CODE_A_COSMETIC) == 1.0
    assert C.code_similarity("", "") == 0.0  # empty code is never a duplicate


def test_near_duplicates_keep_lowest_sample_idx_with_reason():
    rows = [
        ("q", 0, 1.0, "ok", CODE_B),
        ("q", 1, 0.0, "ok", "x = f(1)"),
        ("q", 2, 1.0, "ok", CODE_A_COSMETIC),
        ("q", 3, 0.0, "ok", CODE_A),  # identical to 2 after normalisation -> near_duplicate_of:2
        ("q", 4, 0.0, "ok", "x = f(2)"),  # 0.8333 to row 1
        ("q", 5, 0.0, "format_error", ""),  # empty code: never a duplicate
        ("q", 6, 0.0, "format_error", ""),
        ("p", 0, 0.0, "ok", CODE_A),  # other query: no comparison across queries
    ]
    df = C.validate_samples(frame(rows))
    kept, dropped = C.filter_near_duplicates(df, tau_sim=0.9)
    assert dropped.select("query_id", "sample_idx", "reason").rows() == [("q", 3, "near_duplicate_of:2")]
    assert kept.height == 7
    kept, dropped = C.filter_near_duplicates(df, tau_sim=0.8)  # now .8333 >= .8
    assert dropped.select("sample_idx", "reason").rows() == [(3, "near_duplicate_of:2"), (4, "near_duplicate_of:1")]
    kept, dropped = C.filter_near_duplicates(df, tau_sim=1.0)  # only identical normalised code
    assert dropped["sample_idx"].to_list() == [3]
    # row order does not matter
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=3)
    _, dropped2 = C.filter_near_duplicates(shuffled, tau_sim=0.8)
    assert dropped2.rows() == C.filter_near_duplicates(df, tau_sim=0.8)[1].rows()


def test_near_duplicate_points_to_the_lowest_kept_match():
    # rows 0 and 2 are .8333 similar (kept apart at tau .9); 4 normalises to row 0's code, 5 to row 2's.
    # Greedy in sample_idx order: each later copy names the first kept row it matches.
    rows = [("q", 0, 0.0, "ok", "x = f(1)"), ("q", 2, 0.0, "ok", "x = f(2)"), ("q", 4, 0.0, "ok", "x = f( 1 )"),
            ("q", 5, 0.0, "ok", "x = f(2)  # same")]
    _, dropped = C.filter_near_duplicates(C.validate_samples(frame(rows)), tau_sim=0.9)
    assert dropped.select("sample_idx", "reason").rows() == [(4, "near_duplicate_of:0"), (5, "near_duplicate_of:2")]
    # with tau .8 row 2 is itself a duplicate of 0, so 4 and 5 both point at 0 (dropped rows are not targets)
    _, dropped = C.filter_near_duplicates(C.validate_samples(frame(rows)), tau_sim=0.8)
    assert dropped["reason"].to_list() == ["near_duplicate_of:0"] * 3


# ----------------------------------------------------------------------------------------------------------------
# Group formation
# ----------------------------------------------------------------------------------------------------------------


def test_unrank_matches_lexicographic_enumeration():
    combos = list(itertools.combinations(range(7), 3))
    assert [C._unrank_combination(r, 7, 3) for r in range(len(combos))] == combos


def test_groups_enumerated_when_few():
    # 5 usable rows (idx 10..14), n = 3: C(5,3) = 10 <= g_max = 10 -> all, lexicographic
    df = C.validate_samples(frame([("q", 10 + i, i / 4, "ok") for i in range(5)]))
    g, dropped = C.form_groups(df, n=3, g_max=10, seed=0)
    assert dropped.height == 0
    assert g["members"].to_list() == [[10 + a, 10 + b, 10 + c] for a, b, c in itertools.combinations(range(5), 3)]
    assert g["group_id"].to_list() == [f"0:q#{k}" for k in range(10)]
    assert g["scores"].to_list()[0] == [0.0, 0.25, 0.5]


def test_group_sampling_is_seeded_and_order_independent():
    # 8 usable rows, n = 4: C(8,4) = 70 > g_max = 10 -> 10 distinct sampled groups
    df = C.validate_samples(frame([("HumanEval/3", i, (i % 3) / 2, "ok") for i in range(8)]))
    g1, _ = C.form_groups(df, n=4, g_max=10, seed=7)
    g2, _ = C.form_groups(df.sample(fraction=1.0, shuffle=True, seed=1), n=4, g_max=10, seed=7)
    g3, _ = C.form_groups(df, n=4, g_max=10, seed=8)
    m1 = g1["members"].to_list()
    assert len(m1) == 10 and len({tuple(x) for x in m1}) == 10
    assert all(len(x) == 4 and x == sorted(x) for x in m1)
    assert m1 == sorted(m1)  # listed in lexicographic order
    assert m1 == g2["members"].to_list()
    assert m1 != g3["members"].to_list()
    # the rng depends on (seed, iteration, query_id) only, not on other queries in the frame
    other = C.validate_samples(frame([("other", i, 0.5, "ok") for i in range(8)]))
    g4, _ = C.form_groups(pl.concat([other, df]), n=4, g_max=10, seed=7)
    assert g4.filter(pl.col("query_id") == "HumanEval/3")["members"].to_list() == m1


def test_group_sampling_is_uniform_enough():
    # over many seeds every one of the C(6,3) = 20 subsets shows up (g_max = 5 < 20)
    df = C.validate_samples(frame([("q", i, 0.0, "ok") for i in range(6)]))
    seen = set()
    for s in range(60):
        g, _ = C.form_groups(df, n=3, g_max=5, seed=s)
        seen |= {tuple(x) for x in g["members"].to_list()}
    assert len(seen) == 20


def test_too_few_workflows():
    df = C.validate_samples(frame([("q", 0, 1.0, "ok"), ("q", 1, 0.0, "ok")]))
    g, dropped = C.form_groups(df, n=3, g_max=5)
    assert g.height == 0
    assert dropped.rows() == [(0, "q", None, [0, 1], None, "too_few_workflows")]


# ----------------------------------------------------------------------------------------------------------------
# Whole pipeline, input validation, summary
# ----------------------------------------------------------------------------------------------------------------


def test_curate_end_to_end_accounts_for_every_row_and_group():
    rows = []
    # q1: 6 workflows, scores 1,1,0,0,.5,0 ; sample 5 is a duplicate of sample 0
    for i, s in enumerate([1, 1, 0, 0, 0.5]):
        rows.append(("q1", i, float(s), "ok"))
    rows.append(("q1", 5, 0.0, "ok", distinct_code(0) + "# same\n"))
    # q2: 4 workflows, all score 0 -> every group has std 0 -> low_score_std
    rows += [("q2", i, 0.0, "timeout") for i in range(4)]
    # q3: 3 workflows + 1 executor error -> too few for n = 4
    rows += [("q3", i, 1.0, "ok") for i in range(3)] + [("q3", 3, None, "executor_error")]
    cfg = CurationConfig(m=6, n=4, t=1, g_max=100, tau_std=0.05, adv_eps=0.0)
    r = C.curate(frame(rows), cfg)

    assert r.dropped_rows.select("query_id", "sample_idx", "reason").rows() == [
        ("q1", 5, "near_duplicate_of:0"),
        ("q3", 3, "executor_error"),
    ]
    # q1 has 5 usable rows -> C(5,4) = 5 groups; q2 -> C(4,4) = 1 group (std 0); q3 -> too few
    # q1 groups (members: scores) and their population std:
    #   [0,1,2,3]: 1,1,0,0 -> .5      [0,1,2,4]: 1,1,0,.5 -> mean .625, std .4146
    #   [0,1,3,4]: same as above      [0,2,3,4]: 1,0,0,.5 -> mean .375, std .4146
    #   [1,2,3,4]: same as above                         -> all >= .05, all kept
    assert r.summary == {
        "rows_in": 14,
        "rows_usable": 12,
        "queries_in": 3,
        "queries_with_groups": 1,
        "groups_formed": 6,
        "groups_kept": 5,
        "member_rows": 10,
        "dropped_rows": {"executor_error": 1, "near_duplicate_of": 1},
        "dropped_groups": {"low_score_std": 1, "too_few_workflows": 1},
    }
    assert r.groups["group_id"].to_list() == [f"0:q1#{k}" for k in range(5)]
    # t = 1: top is the lowest-idx 1.0, bottom the lowest-idx 0.0 of each group; Â = ±1 (eps 0)
    assert r.groups["top"].to_list() == [[0], [0], [0], [0], [1]]
    assert r.groups["bottom"].to_list() == [[2], [2], [3], [2], [2]]
    assert r.members["advantage"].to_list() == [1.0, -1.0] * 5
    assert set(r.dropped_groups["reason"].to_list()) == {"low_score_std", "too_few_workflows"}
    assert r.dropped_groups["reason"].null_count() == 0 and r.dropped_rows["reason"].null_count() == 0


def test_curate_empty_frame_keeps_schemas():
    r = C.curate(frame([]), CurationConfig())
    assert r.members.schema == pl.Schema(C.ADVANTAGE_SCHEMA)
    assert r.dropped_rows.schema == pl.Schema(C.DROPPED_ROWS_SCHEMA)
    assert r.dropped_groups.schema == pl.Schema(C.DROPPED_GROUPS_SCHEMA)
    assert r.summary["rows_in"] == 0 and r.summary["groups_kept"] == 0


def test_curate_is_deterministic_under_row_shuffles():
    rng = random.Random(0)
    rows = [("q", i, rng.choice([0.0, 1 / 3, 2 / 3, 1.0]), "ok") for i in range(10)]
    cfg = CurationConfig(m=10, n=6, t=2, g_max=20, seed=3)
    a = C.curate(frame(rows), cfg)
    b = C.curate(frame(rows).sample(fraction=1.0, shuffle=True, seed=5), cfg)
    assert a.members.equals(b.members) and a.groups.equals(b.groups) and a.summary == b.summary


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda df: df.drop("status"), "lacks column"),
        (lambda df: df.with_columns(pl.lit("exploded").alias("status")), "unknown status"),
        (lambda df: pl.concat([df, df.head(1)]), "duplicate"),
        (lambda df: df.with_columns(pl.lit(1.5).alias("score")), r"outside \[0, 1\]"),
        (lambda df: df.with_columns(pl.lit(None, pl.Float64).alias("score")), "status 'ok' have no score"),
        (lambda df: df.with_columns(pl.lit("abc").alias("sample_idx")), "wrong type"),
        (lambda df: df.with_columns(pl.lit(None, pl.String).alias("query_id")), "null"),
    ],
)
def test_validate_rejects_bad_input(mutate, message):
    df = frame([("q", 0, 1.0, "ok"), ("q", 1, 0.0, "ok")])
    with pytest.raises(ValueError, match=message):
        C.validate_samples(mutate(df))


def test_status_enum_values_are_accepted():
    df = frame([("q", i, 0.0, s.value) for i, s in enumerate(Status)])
    assert C.validate_samples(df).height == len(Status)


# ----------------------------------------------------------------------------------------------------------------
# ScoreFlow pair sampling
# ----------------------------------------------------------------------------------------------------------------


def test_preference_pairs_by_hand():
    # scores 1, .5, 0, 0 (idx 0..3): candidates with different scores, chosen = higher:
    #   (0,1) d=.5 w=.125; (0,2) d=1 w=1; (0,3) d=1 w=1; (1,2) d=.5 w=.125; (1,3) d=.5 w=.125; (2,3) tie -> none
    #   total 2.375 -> p = .0526, .421, .421, .0526, .0526
    df = C.validate_samples(frame([("q", 0, 1.0, "ok"), ("q", 1, 0.5, "ok"), ("q", 2, 0.0, "ok"), ("q", 3, 0.0, "ok")]))
    pairs = C.sample_preference_pairs(df, n_pairs=40000, power=3.0, seed=0)
    assert pairs.height == 40000 and pairs["draw"].to_list() == list(range(40000))
    assert (pairs["chosen_score"] > pairs["rejected_score"]).all()
    freq = pairs.group_by("chosen_idx", "rejected_idx").len().sort("chosen_idx", "rejected_idx")
    got = {(a, b): n / 40000 for a, b, n in freq.rows()}
    expect = {(0, 1): 0.125 / 2.375, (0, 2): 1 / 2.375, (0, 3): 1 / 2.375, (1, 2): 0.125 / 2.375, (1, 3): 0.125 / 2.375}
    assert set(got) == set(expect)
    for k in expect:
        assert got[k] == pytest.approx(expect[k], abs=0.01)
    # seeded
    assert C.sample_preference_pairs(df, 50, seed=1).equals(C.sample_preference_pairs(df, 50, seed=1))
    # None = one draw per candidate; all-equal scores give no pairs
    assert C.sample_preference_pairs(df, None).height == 5
    same = C.validate_samples(frame([("q", 0, 1.0, "ok"), ("q", 1, 1.0, "ok")]))
    assert C.sample_preference_pairs(same, 10).height == 0


# ----------------------------------------------------------------------------------------------------------------
# Config validation
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"m": 10, "n": 12}, r"m=10 < n=12.*set m >= n"),
        ({"n": 6, "t": 4}, r"n=6 < 2t=8.*set n >= 2t"),
        ({"t": 0}, r"t must be >= 1; set t >= 1"),
        ({"tau_sim": 0.0}, r"0 < tau_sim <= 1"),
        ({"tau_sim": 1.5}, r"0 < tau_sim <= 1"),
        ({"tau_std": -0.1}, r"set tau_std >= 0"),
        ({"g_max": 0}, r"set g_max >= 1"),
        ({"adv_eps": -1e-3}, r"set adv_eps >= 0"),
        ({"std_ddof": 2}, r"0 \(population std\) or 1"),
        ({"n": 3.5}, r"n must be an integer"),
        ({"t": True}, r"t must be an integer"),
        ({"tau_std": float("nan")}, r"finite number"),
    ],
)
def test_curation_config_errors_name_the_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CurationConfig(**kwargs)


def test_curation_config_defaults_and_from_dict():
    cfg = CurationConfig()
    assert (cfg.m, cfg.n, cfg.t, cfg.g_max) == (16, 14, 4, 120) and cfg.sharpened_size == 8
    assert CurationConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown field"):
        CurationConfig.from_dict({"tau_simm": 0.9})
    CurationConfig(m=2, n=2, t=1, tau_std=0.0, tau_sim=1.0)  # the smallest valid setting


def _with_prompt_groups(df: pl.DataFrame, groups: list) -> pl.DataFrame:
    return df.with_columns(pl.Series("prompt_group", groups, dtype=pl.String))


def test_groups_and_std_never_mix_prompts():
    # query q: sample 0-2 from its first prompt (scores 1, 0, 0), 3-5 from a refinement prompt "p1" (all 0.5).
    # Pooled, 0-5 would form C(6,3) = 20 groups; per prompt, each prompt has exactly C(3,3) = 1 group.
    scores = [1.0, 0.0, 0.0, 0.5, 0.5, 0.5]
    df = _with_prompt_groups(frame([("q", i, s, "ok") for i, s in enumerate(scores)]),
                             [None, None, None, "p1", "p1", "p1"])
    cfg = CurationConfig(m=6, n=3, t=1, g_max=100, tau_sim=1.0, tau_std=0.0)
    sc = C.screen(df, cfg)
    assert sc.groups_formed == 2
    by_id = {r["group_id"]: r for r in sc.groups.iter_rows(named=True)}
    assert set(by_id) == {"0:q#0", "0:q@p1#0"}
    assert by_id["0:q#0"]["members"] == [0, 1, 2] and by_id["0:q@p1#0"]["members"] == [3, 4, 5]
    # population std of (1, 0, 0) = sqrt(2/9); of (0.5, 0.5, 0.5) = 0
    assert by_id["0:q#0"]["score_std"] == pytest.approx(math.sqrt(2 / 9))
    assert by_id["0:q@p1#0"]["score_std"] == 0.0
    # the same workflow text under two prompts is no near-duplicate across them
    same = _with_prompt_groups(frame([("q", 0, 1.0, "ok", distinct_code(0)), ("q", 1, 0.0, "ok", distinct_code(0))]),
                               [None, "p1"])
    kept, dropped = C.filter_near_duplicates(same, 0.9)
    assert kept.height == 2 and dropped.height == 0


def test_preference_pairs_never_join_two_prompts():
    # first prompt: scores 1, 0 -> one pair (0 > 1), weight 1; prompt p1: scores 0.5, 0 -> one pair (2 > 3),
    # weight 0.5^3 = 0.125. Across prompts (e.g. 0 vs 3) there is no pair. Probabilities 1/1.125, 0.125/1.125.
    df = _with_prompt_groups(frame([("q", 0, 1.0, "ok"), ("q", 1, 0.0, "ok"), ("q", 2, 0.5, "ok"),
                                    ("q", 3, 0.0, "ok")]), [None, None, "p1", "p1"])
    usable, _ = C.scored_candidates(df)
    cand = C.preference_pair_candidates(usable, power=3.0)
    assert sorted(zip(cand["chosen_idx"], cand["rejected_idx"])) == [(0, 1), (2, 3)]
    probs = dict(zip(zip(cand["chosen_idx"], cand["rejected_idx"]), cand["probability"]))
    assert probs[(0, 1)] == pytest.approx(1 / 1.125) and probs[(2, 3)] == pytest.approx(0.125 / 1.125)


def test_a_std_floor_keeps_small_contrasts_small_and_answer_contrasts_whole():
    compute_advantages = C.compute_advantages
    # group a: valid 0.15 vs 0.05 (std 0.05); group b: an answer 0.9 vs 0.15 (std 0.375); eps 0
    members = pl.concat([members_frame("a", [0, 1], [0.15, 0.05]), members_frame("b", [2, 3], [0.9, 0.15])])
    plain = compute_advantages(members, eps=0.0)["advantage"].to_list()
    assert plain == pytest.approx([1.0, -1.0, 1.0, -1.0])  # σ-normalised: the same weight for both
    floored = compute_advantages(members, eps=0.0, std_floor=0.25)["advantage"].to_list()
    # a: ±0.05 / max(0.05, 0.25) = ±0.2; b: ±0.375 / max(0.375, 0.25) = ±1
    assert floored == pytest.approx([0.2, -0.2, 1.0, -1.0])


def test_the_std_floor_must_lie_in_the_unit_interval():
    with pytest.raises(ConfigError, match="adv_std_floor"):
        CurationConfig(adv_std_floor=1.5)


def test_valid_only_groups_compare_what_valid_workflows_do():
    # scores as a ladder gives them (right 1.0, ran but wrong 0.25, raised 0.15, never ran 0; their values do not
    # matter to the rows that leave)
    rows = [("q", 0, 1.0, "ok"), ("q", 1, 0.25, "ok"), ("q", 2, 0.0, "invalid"), ("q", 3, 0.0, "format_error"),
            ("q", 4, 0.15, "runtime_error"), ("q", 5, 0.25, "ok")]
    cfg = CurationConfig(m=6, n=4, t=2, g_max=1, tau_sim=1.0, tau_std=0.01, valid_only=True)
    r = C.curate(frame(rows), cfg)
    assert r.dropped_rows.select("sample_idx", "reason").rows() == [(2, "not_valid"), (3, "not_valid")]
    assert r.summary["dropped_rows"] == {"not_valid": 2}
    # the 4 rows that ran make exactly C(4, 4) = 1 group; t = 2 keeps all four
    assert r.groups["members"].to_list() == [[0, 1, 4, 5]]
    # mean (1 + .25 + .15 + .25) / 4 = .4125; deviations .5875, -.1625, -.2625, -.1625;
    # variance (.34515625 + .02640625 + .06890625 + .02640625) / 4 = .11671875, std .3416405...
    std = 0.11671875 ** 0.5
    adv = dict(zip(r.members["sample_idx"].to_list(), r.members["advantage"].to_list()))
    assert adv == pytest.approx({0: 0.5875 / (std + 1e-4), 1: -0.1625 / (std + 1e-4),
                                 4: -0.2625 / (std + 1e-4), 5: -0.1625 / (std + 1e-4)}, abs=1e-12)
    # off (the default), the invalid rows stay: six usable rows, none dropped
    off = C.curate(frame(rows), CurationConfig(m=6, n=4, t=2, g_max=1, tau_sim=1.0, tau_std=0.01))
    assert off.dropped_rows.height == 0 and off.summary["rows_usable"] == 6


def test_valid_only_must_be_a_bool():
    with pytest.raises(ConfigError, match="valid_only"):
        CurationConfig(valid_only="yes")


def _with_anchors(df: pl.DataFrame, anchors: set) -> pl.DataFrame:
    return df.with_columns(pl.Series("anchor", [i in anchors for i in df["sample_idx"].to_list()]))


def test_anchor_contrast_groups_the_prompts_workflows_on_their_own_and_zero_sum():
    # samples 0-3 (0 right, 1-3 ran but wrong) and the prompt's three workflows 4-6 (IO and code_generate -> test
    # wrong, the ensemble right); the ensemble's code is sample 0's, which in "mixed" makes it a near-duplicate
    rows = [("q", 0, 1.0, "ok", distinct_code(0)), ("q", 1, 0.25, "ok"), ("q", 2, 0.25, "ok"), ("q", 3, 0.25, "ok"),
            ("q", 4, 0.25, "ok"), ("q", 5, 0.25, "ok"), ("q", 6, 1.0, "ok", distinct_code(0))]
    df = _with_anchors(frame(rows), {4, 5, 6})
    cfg = dict(m=4, n=4, t=2, g_max=1, tau_sim=0.95, tau_std=0.01, adv_std_floor=0.25)
    r = C.curate(df, CurationConfig(**cfg, anchor_groups="contrast"))
    assert r.dropped_rows.height == 0  # an anchor is never a near-duplicate of a sample
    assert sorted(r.groups["group_id"].to_list()) == ["0:q#0", "0:q#anchors"]
    adv = dict(zip(r.members["sample_idx"].to_list(), r.members["advantage"].to_list()))
    # samples: mean .4375, deviations +.5625, -.1875 x 3; variance (.31640625 + 3 x .03515625) / 4 = .10546875
    s_std = 0.10546875 ** 0.5
    # anchors: mean .5, deviations -.25, -.25, +.5; variance (.0625 + .0625 + .25) / 3 = .125 (std .3536 > floor)
    a_std = 0.125 ** 0.5
    assert adv == pytest.approx({0: 0.5625 / (s_std + 1e-4), 1: -0.1875 / (s_std + 1e-4), 2: -0.1875 / (s_std + 1e-4),
                                 3: -0.1875 / (s_std + 1e-4), 4: -0.25 / (a_std + 1e-4), 5: -0.25 / (a_std + 1e-4),
                                 6: 0.5 / (a_std + 1e-4)}, abs=1e-12)
    anchors = r.members.filter(pl.col("group_id") == "0:q#anchors").sort("rank")
    # kept whole (t = 2 does not apply): the one above the mean is the top half, the rest the bottom, worst first
    assert anchors.select("sample_idx", "role").rows() == [(6, "top"), (4, "bottom"), (5, "bottom")]
    assert sum(anchors["advantage"].to_list()) == pytest.approx(0.0, abs=1e-12)
    # anchor_weight 3 multiplies the anchors' advantages only: -0.75, -0.75, +1.5 (over the same std)
    heavy = C.curate(df, CurationConfig(**cfg, anchor_groups="contrast", anchor_weight=3.0))
    adv3 = dict(zip(heavy.members["sample_idx"].to_list(), heavy.members["advantage"].to_list()))
    assert adv3 == pytest.approx({**adv, 4: -0.75 / (a_std + 1e-4), 5: -0.75 / (a_std + 1e-4),
                                  6: 1.5 / (a_std + 1e-4)}, abs=1e-12)
    with pytest.raises(ConfigError, match="anchor_weight=3.0 weighs the anchors' own groups"):
        CurationConfig(**cfg, anchor_weight=3.0)
    with pytest.raises(ConfigError, match="must be > 0"):
        CurationConfig(**cfg, anchor_groups="contrast", anchor_weight=0.0)
    # "mixed" (the default) ignores the flag: the ensemble leaves as sample 0's near-duplicate, no anchor group
    mixed = C.curate(df, CurationConfig(**cfg))
    assert mixed.dropped_rows.select("sample_idx", "reason").rows() == [(6, "near_duplicate_of:0")]
    assert not any(g.endswith("#anchors") for g in mixed.groups["group_id"].to_list())


def test_anchor_groups_that_cannot_contrast_are_dropped_with_their_reason():
    # query a: its anchors all score alike (std 0 < tau_std); query b: one anchor ran, the other never parsed
    rows = [("a", 0, 0.25, "ok"), ("a", 1, 0.25, "ok"), ("b", 0, 1.0, "ok"), ("b", 1, 0.0, "format_error")]
    df = _with_anchors(frame(rows), {0, 1})
    r = C.curate(df, CurationConfig(m=4, n=4, t=2, g_max=1, tau_std=0.01, valid_only=True, anchor_groups="contrast"))
    assert r.members.height == 0
    got = sorted(r.dropped_groups.select("query_id", "reason").rows())
    assert got == [("a", "low_score_std"), ("b", "too_few_workflows")]


def test_anchor_groups_must_be_a_known_choice():
    with pytest.raises(ConfigError, match="anchor_groups='together'.*mixed, contrast"):
        CurationConfig(anchor_groups="together")
