"""The `anchored` generator prompt: the starting workflow shown as what to improve on, the task as prose only
(no signature, no example values to pass around), examples that return no constant."""

from __future__ import annotations

import ast

from spogw_dagster.workflow.copies import copied_from
from spogw_dagster.workflow.template import (
    ANCHORED_EXAMPLES,
    TEMPLATES,
    WORKFLOW_HEADER,
    generator_prompt,
    task_summary,
)

QUESTION = '''from typing import List


def below_zero(operations: List[int]) -> bool:
    """ You're given a list of deposit and withdrawal operations on a bank account that starts with
    zero balance. Detect if at any point the balance falls below zero.
    >>> below_zero([1, 2, 3])
    False
    >>> below_zero([1, 2, -4, 5])
    True
    """
'''


def test_the_code_task_summary_is_the_docstring_prose_without_examples_or_signature():
    assert task_summary("code", QUESTION) == ("You're given a list of deposit and withdrawal operations on a bank "
                                              "account that starts with zero balance. Detect if at any point the "
                                              "balance falls below zero.")


def test_the_anchored_prompt_shows_the_template_and_no_task_literals():
    p = generator_prompt("code", QUESTION, "anchored")
    assert TEMPLATES["code"].rstrip("\n") in p
    assert "below_zero" not in p and "[1, 2, -4, 5]" not in p and ">>>" not in p
    assert p.endswith(WORKFLOW_HEADER + "        ")


def test_anchored_examples_are_valid_return_no_constant_and_count_as_near_copies():
    for family, bodies in ANCHORED_EXAMPLES.items():
        for i, body in enumerate(bodies, start=1):
            code = WORKFLOW_HEADER + body
            ret = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Return)][-1]
            assert not isinstance(ret.value, ast.Constant)
            assert copied_from(code, family) is not None


def test_a_comment_at_column_0_ends_the_generated_body_and_an_indented_one_does_not():
    # run F: most completions went on past the body with "# Example workflow 5 ..."; those tokens must end the
    # sample (the sampler keeps the tokens up to the stop, so training teaches the stop) rather than be trained on
    from spogw_dagster.core.inference.sampling import _cut_at_stop
    from spogw_dagster.workflow.template import GENERATOR_STOP

    body = ("a = await self.code_generate(instruction='Solve.')\n        # check it on the examples\n"
            "        return await self.test(solution=a)")
    assert _cut_at_stop(body + "\n# Example workflow 5 (built from\nclass Workflow:", GENERATOR_STOP) == (body, "\n#")
    assert _cut_at_stop(body, GENERATOR_STOP) == (body, None)
