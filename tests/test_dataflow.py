"""Trivial by data flow (`workflow/dataflow.py`, `rewards.is_trivial`): a workflow earns the executes rung
only when the value it returns can depend on the output of an operator that writes a solution. Each case
below is traced by hand: which values carry an operator's output to the `return`."""

from __future__ import annotations

import pytest

from spogw_dagster.core.rewards import Ladder, is_trivial, ladder_reward
from spogw_dagster.workflow.parser import WorkflowRejected, validate

HEADER = "class Workflow:\n    async def run(self):\n"


def family(code: str) -> str:
    return "code" if "code_generate" in code or "test(" in code else "qa" if "answer_generate" in code else "math"


def wf(body: str, extra: str = "") -> str:
    return HEADER + "".join("        " + ln + "\n" for ln in body.strip("\n").splitlines()) + extra


TRIVIAL = {
    # the case: a dead generate, then a test of a constant
    "dead_generate_then_test_false": "await self.code_generate(instruction='x')\nreturn await self.test(solution=False)",
    "no_producer_at_all": "return await self.test(solution='def f(): pass')",
    "overwritten_before_return": "x = await self.custom(instruction='x')\nx = 'A'\nreturn x",
    "condition_only": "x = await self.custom(instruction='x')\nreturn 'A' if 'B' in x else 'C'",
    "branch_on_it_return_constants": "x = await self.custom(instruction='x')\nif len(x) > 3:\n    return 'yes'\nreturn 'no'",
    "result_in_an_unused_list": "xs = [await self.custom(instruction='x')]\nys = ['0']\nreturn await self.sc_ensemble(solutions=ys)",
    "unpacked_then_dropped": "a, b = await self.custom(instruction='x'), '1'\na = b\nreturn a",
    "deleted_name_reassigned": "x = await self.custom(instruction='x')\ndel x\nx = '5'\nreturn x",
    "review_of_a_constant": "await self.custom(instruction='x')\nreturn await self.review(solution='42')",
    "loop_overwrites_each_time": "for i in range(2):\n    x = await self.custom(instruction='x')\n    x = str(i)\nreturn x",
    # dead code: after a return or a raise, in a branch or loop that cannot run
    "code_after_return": "return 'A'\nreturn await self.custom(instruction='x')",
    "if_false_branch": "x = 'A'\nif False:\n    x = await self.custom(instruction='x')\nreturn x",
    "if_not_true_branch": "x = 'A'\nif not 1:\n    x = await self.custom(instruction='x')\nreturn x",
    "while_false_loop": "x = 'A'\nwhile False:\n    x = await self.custom(instruction='x')\nreturn x",
    "for_over_range_0": "x = 'A'\nfor i in range(0):\n    x = await self.custom(instruction='x')\nreturn x",
    "for_over_empty_list": "x = 'A'\nfor i in []:\n    x = await self.custom(instruction='x')\nreturn x",
    "after_raise_in_try": "try:\n    raise ValueError('a')\n    return await self.custom(instruction='x')\n"
                          "except ValueError:\n    return 'A'",
    # a value computed from the output that holds nothing of it
    "empty_slice": "x = await self.custom(instruction='x')\nreturn x[:0] + 'A'",
    "times_zero": "x = await self.custom(instruction='x')\nreturn x * 0 + 'A'",
    "replace_itself": "x = await self.custom(instruction='x')\nreturn x.replace(x, '') + 'A'",
    "len_of_it": "x = await self.custom(instruction='x')\nreturn str(len(x) * 0)",
    "a_comparison": "x = await self.custom(instruction='x')\nreturn str('42' in x)",
    "test_of_an_emptied_solution": "s = await self.code_generate(instruction='x')\n"
                                   "return await self.test(solution=s[:0] + 'def f(): pass')",
    # found by a second review: constant conditions and picks, values that keep nothing of the output
    "return_in_finally": "x = await self.custom(instruction='x')\ntry:\n    return x\nfinally:\n    return 'A'",
    "constant_ifexp": "x = await self.custom(instruction='x')\nreturn 'A' if True else x",
    "if_empty_tuple": "x = await self.custom(instruction='x')\ny = 'A'\nif ():\n    y = x\nreturn y",
    "if_one_eq_two": "x = await self.custom(instruction='x')\ny = 'A'\nif 1 == 2:\n    y = x\nreturn y",
    "while_one_gt_two": "x = await self.custom(instruction='x')\ny = 'A'\nwhile 1 > 2:\n    y = x\nreturn y",
    "and_constant": "x = await self.custom(instruction='x')\nreturn x and 'A'",
    "tuple_index": "x = await self.custom(instruction='x')\nreturn (x, 'A')[1]",
    "dict_key_lookup": "x = await self.custom(instruction='x')\nreturn {'k': 'A', 'j': x}['k']",
    "slice_with_step": "x = await self.custom(instruction='x')\nreturn x[:0:1] + 'A'",
    "times_minus_one": "x = await self.custom(instruction='x')\nreturn x * -1 + 'A'",
    "strip_itself": "x = await self.custom(instruction='x')\nreturn x.strip(x) + 'A'",
    "split_itself": "x = await self.custom(instruction='x')\nreturn ''.join(x.split(x)) + 'A'",
    "count_itself": "x = await self.custom(instruction='x')\nreturn str(x.count(x))",
    "filtered_comprehension": "x = await self.custom(instruction='x')\nreturn ''.join([c for c in x if False]) + 'A'",
    "self_attr_overwritten": "self.ans = await self.custom(instruction='x')\nself.ans = 'A'\nreturn self.ans",
}

NON_TRIVIAL = {
    "generate_then_test": "s = await self.code_generate(instruction='x')\nreturn await self.test(solution=s)",
    "return_directly": "return await self.custom(instruction='x')",
    "string_methods": "a = await self.answer_generate()\nreturn a.split('Answer:')[-1].strip()",
    "appended_then_ensembled": "xs = []\nfor i in range(3):\n    xs.append(await self.custom(instruction='x'))\n"
                               "return await self.sc_ensemble(solutions=xs)",
    "one_branch_carries_it": "x = await self.custom(instruction='x')\nif 'a' in x:\n    return x\nreturn 'no'",
    "fstring": "x = await self.programmer(analysis='go')\nreturn f'Answer: {x}'",
    "augmented": "r = ''\nr += await self.custom(instruction='x')\nreturn r",
    "subscript_store": "d = {}\nd['a'] = await self.custom(instruction='x')\nreturn d['a']",
    "comprehension": "xs = [await self.custom(instruction=str(i)) for i in range(2)]\nreturn [x.strip() for x in xs][0]",
    "carried_round_a_loop": "best = ''\nfor i in range(2):\n    if i == 1:\n        return best\n"
                            "    best = await self.custom(instruction='x')\nreturn best",
    "in_try_handler": "x = 'none'\ntry:\n    x = await self.custom(instruction='x')\n    raise ValueError()\n"
                      "except ValueError:\n    return x\nreturn 'no'",
    "walrus": "if (x := await self.custom(instruction='x')):\n    return x\nreturn 'none'",
    "boolop": "x = await self.custom(instruction='x')\nreturn x or 'empty'",
    "setdefault_append": "d = {}\nd.setdefault('a', []).append(await self.custom(instruction='x'))\nreturn d['a'][0]",
    "break_carries_it_out": "x = ''\nwhile True:\n    x = await self.custom(instruction='x')\n    break\nreturn x",
    "continue_then_later": "x = ''\nfor i in range(3):\n    if i < 2:\n        continue\n"
                           "    x = await self.custom(instruction='x')\nreturn x",
    "slice_that_keeps_text": "x = await self.custom(instruction='x')\nreturn x[-200:]",
    "try_returns_it_finally_cleans_up": "x = await self.custom(instruction='x')\ny = ''\ntry:\n    return x\n"
                                        "finally:\n    y = 'done'",
    "and_keeps_the_last": "x = await self.custom(instruction='x')\nreturn 'ok' and x",
    "tuple_index_of_it": "x = await self.custom(instruction='x')\nreturn ('A', x)[1]",
    "self_attr_set_in_a_branch": "self.ans = 'A'\nx = await self.custom(instruction='x')\nif 'b' in x:\n"
                                 "    self.ans = x\nreturn self.ans",
}


# a statement after `return`/`raise` in the same block: invalid since the validator refuses dead statements
UNREACHABLE_STATEMENTS = {"code_after_return", "after_raise_in_try"}


@pytest.mark.parametrize("name", sorted(TRIVIAL))
def test_dead_or_unused_operator_output_is_trivial(name):
    code = wf(TRIVIAL[name])
    if name in UNREACHABLE_STATEMENTS:  # the validator refuses these first; data flow still calls them trivial
        with pytest.raises(WorkflowRejected, match="never runs"):
            validate(code, family(code))
    else:
        validate(code, family(code))  # a valid workflow
    assert is_trivial(code, True), name


@pytest.mark.parametrize("name", sorted(NON_TRIVIAL))
def test_an_answer_carrying_operator_output_is_not_trivial(name):
    code = wf(NON_TRIVIAL[name])
    validate(code, family(code))
    assert not is_trivial(code, True), name


def test_helpers_and_self_attributes_carry_values_across_methods():
    via_attr = wf("await self.fill()\nreturn self.best",
                  "    async def fill(self):\n        self.best = await self.custom(instruction='x')\n")
    via_param = wf("x = await self.custom(instruction='x')\nreturn await self.tidy(x)",
                   "    async def tidy(self, s):\n        return s.strip()\n")
    helper_drops_it = wf("x = await self.custom(instruction='x')\nreturn await self.tidy(x)",
                         "    async def tidy(self, s):\n        return 'constant'\n")
    helper_generates = wf("return await self.ask('q')",
                          "    async def ask(self, q):\n        return await self.custom(instruction=q)\n")
    helper_dead_call = wf("return await self.ask('q')",
                          "    async def ask(self, q):\n        await self.custom(instruction=q)\n        return q\n")
    recursive = wf("return await self.again(2)",
                   "    async def again(self, n):\n        if n == 0:\n            return await self.custom(instruction='x')\n"
                   "        return await self.again(n - 1)\n")
    fills_param = wf("xs = []\nawait self.fill(xs)\nreturn await self.sc_ensemble(solutions=xs)",
                     "    async def fill(self, xs):\n        xs.append(await self.custom(instruction='x'))\n")
    varargs = wf("return await self.pick(await self.custom(instruction='x'))",
                 "    async def pick(self, *xs):\n        return xs[0]\n")
    for code in (via_attr, via_param, helper_generates, recursive, fills_param, varargs):
        validate(code, "math")
        assert not is_trivial(code, True)
    for code in (helper_drops_it, helper_dead_call):
        validate(code, "math")
        assert is_trivial(code, True)


def test_trivial_forfeits_the_executes_rung_and_invalid_code_is_not_trivial():
    ladder = Ladder(format=0.1, valid=0.2, executes=0.2, answer=0.5)
    dead = wf(TRIVIAL["dead_generate_then_test_false"])
    real = wf(NON_TRIVIAL["generate_then_test"])
    # both ran to the end and both answers were wrong: format + valid for the dead call, + executes for the real
    assert ladder_reward(ladder, "ok", ["ok"], 0.0, is_trivial(dead, True)) == pytest.approx(0.3)
    assert ladder_reward(ladder, "ok", ["ok"], 0.0, is_trivial(real, True)) == pytest.approx(0.5)
    assert not is_trivial(dead, False) and not is_trivial(None, True) and not is_trivial("not python(", True)


async def test_a_run_earns_the_executes_rung_only_if_a_solution_writing_operator_ran():
    """What static data flow cannot decide (a condition it cannot fold), the run's trace does: the workflow
    below is not trivial by its code, but its runs never call `custom`, so they get no executes credit."""
    from spogw_dagster.contracts import Problem
    from spogw_dagster.evaluation import evaluate_workflow
    from spogw_dagster.sandboxing import detect_isolation
    from spogw_dagster.core.rewards import executes_share
    from tests.fakes import ScriptedExecutor

    never = wf("x = 'A'\nif len('ab') == 3:\n    x = await self.custom(instruction='x')\n"
               "return await self.review(solution=x)")
    always = wf("x = await self.custom(instruction='x')\nreturn await self.review(solution=x)")
    problem = Problem("gsm8k", "q", "What is 6 times 7?", answer="42", family="math")
    iso = detect_isolation()
    ladder = Ladder(format=0.1, valid=0.2, executes=0.2, answer=0.5)
    results = {}
    for name, code in (("never", never), ("always", always)):
        validate(code, "math")
        assert not is_trivial(code, True)
        results[name] = await evaluate_workflow(code, problem, ScriptedExecutor("\\boxed{41}"), iso, runs=2)
    assert [r.status.value for r in results.values()] == ["ok", "ok"]
    assert results["never"].run_produced == [False, False] and results["always"].run_produced == [True, True]
    assert executes_share(results["never"].run_statuses, results["never"].run_produced) == 0.0
    assert executes_share(results["always"].run_statuses, results["always"].run_produced) == 1.0
    r = results["never"]
    assert ladder_reward(ladder, "ok", r.run_statuses, 0.0, False, r.run_produced) == pytest.approx(0.3)
