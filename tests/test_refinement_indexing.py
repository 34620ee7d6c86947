"""W4S's self-check (`domain.iteration_samples._self_check`) numbers and links its repairs right, checked on the CPU
with a scripted sampler in place of the generator (the rest is our own bookkeeping): repairs are numbered
after every turn's candidates (turns · m on), each points at the candidate it repairs and keeps that
candidate's state, a candidate's effective version is its last repair, and a candidate that parses is never
sent for repair. Expected values worked out by hand below."""

from __future__ import annotations

from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.domain.iteration_samples import _self_check

GOOD = 'x = await self.code_generate(instruction="Write it.")\n        return x\n'
BAD = "return await self.nope()\n"


def _frame(qids, texts, *, turn, idx, parents, repairs=None):
    return tables.sampled_frame(
        0, qids, ["prompt of " + q for q in qids], [[tables.Sample(t, [1, 2], [-0.5, -0.5])] for t in texts], "code",
        parent_iteration=None, parent_sha256=None, generator="scripted", turn=turn, sample_idx=idx,
        parent_sample_idx=parents, repair_of=repairs)


class ScriptedSampler:
    """Answers each repair call with the next scripted completions, and records what it was asked."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, qids, prompts, n, turn, idx, parents, repairs, tag):
        self.calls.append({"qids": list(qids), "idx": idx, "repairs": repairs, "parents": parents, "tag": tag})
        return _frame(qids, self.answers.pop(0), turn=turn, idx=idx, parents=parents, repairs=repairs)


def _say(msg: str) -> None:
    pass


def test_repairs_are_numbered_after_every_turn_and_point_at_their_candidate():
    # turn 1 of 2 turns with m = 2: q1's candidates 2 (parses) and 3 (does not), q2's 2 and 3 (neither),
    # all sampled from state 0 of their query
    cur = tables.sampled_frame(
        0, ["q1", "q2"], ["p1", "p2"],
        [[tables.Sample(GOOD, [1], [-1.0]), tables.Sample(BAD, [1], [-1.0])],
         [tables.Sample(BAD, [1], [-1.0]), tables.Sample(BAD, [1], [-1.0])]], "code",
        parent_iteration=None, parent_sha256=None, generator="scripted", turn=1, sample_idx=[[2, 3], [2, 3]],
        parent_sample_idx=[[0, 0], [0, 0]])
    # attempt 0 repairs q1/3, q2/2, q2/3 (in key order): q1/3 and q2/3 then parse, q2/2 not; attempt 1: q2/2 parses
    sampler = ScriptedSampler([[GOOD, BAD, GOOD], [GOOD]])
    next_repair = {"q1": 2 * 2, "q2": 2 * 2}  # turns x m: after every turn's candidates
    rows, effective = _self_check(_say, sampler, cur, 1, 3, next_repair)

    assert [c["qids"] for c in sampler.calls] == [["q1", "q2", "q2"], ["q2"]]  # q1/2 parses: never repaired
    assert [c["idx"] for c in sampler.calls] == [[[4], [4], [5]], [[6]]]
    assert [c["repairs"] for c in sampler.calls] == [[[3], [2], [3]], [[2]]]  # the candidate each repairs
    assert [c["parents"] for c in sampler.calls] == [[[0], [0], [0]], [[0]]]  # its candidate's state
    assert [c["tag"] for c in sampler.calls] == [("repair", 1, 0), ("repair", 1, 1)]  # a seed per attempt
    assert next_repair == {"q1": 5, "q2": 7}
    assert rows.height == 4 + 3 + 1 and set(rows["turn"].to_list()) == {1}
    repairs = rows.filter(rows["repair_of"].is_not_null()).sort(["query_id", "sample_idx"])
    assert list(zip(repairs["query_id"], repairs["sample_idx"], repairs["repair_of"])) == [
        ("q1", 4, 3), ("q2", 4, 2), ("q2", 5, 3), ("q2", 6, 2)]
    # each slot's effective candidate: the original where it parsed, else its last repair
    assert sorted((r["query_id"], r["sample_idx"], r["parse_status"]) for r in effective) == [
        ("q1", 2, "ok"), ("q1", 4, "ok"), ("q2", 5, "ok"), ("q2", 6, "ok")]


def test_no_repairs_allowed_leaves_the_turn_as_it_was():
    cur = _frame(["q1"], [BAD], turn=0, idx=[[0]], parents=[[None]])
    sampler = ScriptedSampler([])
    rows, effective = _self_check(_say, sampler, cur, 0, 0, {"q1": 4})
    assert sampler.calls == [] and rows.height == 1
    assert [(r["sample_idx"], r["parse_status"]) for r in effective] == [(0, "invalid")]
