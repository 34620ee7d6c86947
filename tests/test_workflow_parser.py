"""The parser/validator: what passes, what is rejected, and with which status and reason."""

import pytest

from spogw_dagster.contracts import Status
from spogw_dagster.workflow.parser import WorkflowRejected, extract_code, parse_workflow, validate
from spogw_dagster.workflow.template import FEW_SHOT, TEMPLATES, WORKFLOW_HEADER, generator_prompt

HEADER = "class Workflow:\n    async def run(self):\n"


def wf(body: str) -> str:
    return HEADER + "".join("        " + line + "\n" for line in body.strip("\n").splitlines())


@pytest.mark.parametrize("family", ["code", "math", "qa"])
def test_templates_and_few_shot_examples_are_valid(family):
    assert validate(TEMPLATES[family], family).operator_call_sites == 1
    for body in FEW_SHOT[family]:
        assert validate(WORKFLOW_HEADER + body, family).operator_call_sites >= 1


def test_valid_workflow_with_loop_list_and_helper_method():
    code = (
        "class Workflow:\n"
        "    async def helper(self, k):\n"
        "        return await self.custom(instruction='Try ' + str(k))\n"
        "    async def run(self):\n"
        "        out = []\n"
        "        for i in range(3):\n"
        "            out.append(await self.helper(i))\n"
        "        best = await self.sc_ensemble(solutions=out)\n"
        "        if len(best) > 10:\n"
        "            best = await self.review(solution=best)\n"
        "        return best\n"
    )
    parsed = validate(code, "math")
    assert parsed.operators_used == ("custom", "review", "sc_ensemble")
    assert parsed.operator_call_sites == 3


@pytest.mark.parametrize(
    "body, family, reason",
    [
        ("import os\nreturn await self.custom(instruction='x')", "math", "import of 'os'"),
        ("import subprocess\nreturn await self.custom(instruction='x')", "math", "import of 'subprocess'"),
        ("from ctypes import CDLL\nreturn await self.custom(instruction='x')", "math", "import of 'ctypes'"),
        ("x = ().__class__.__base__.__subclasses__()\nreturn await self.custom(instruction='x')", "math",
         "attribute '__"),
        ("b = __builtins__\nreturn await self.custom(instruction='x')", "math", "dunder name"),
        ("f = open('/etc/passwd')\nreturn await self.custom(instruction='x')", "math", "name 'open'"),
        ("e = eval('1')\nreturn await self.custom(instruction='x')", "math", "name 'eval'"),
        ("g = getattr(self, 'custom')\nreturn await g(instruction='x')", "math", "name 'getattr'"),
        ("s = '{0.__class__}'\nreturn await self.custom(instruction=s)", "math", "'__'"),
        ("s = '{0.x}'.format(self)\nreturn await self.custom(instruction=s)", "math", "attribute 'format'"),
        ("c = self.custom(instruction='x')\nf = c.cr_frame\nreturn await c", "math", "attribute 'cr_frame'"),
        ("return await self.code_generate(instruction='x')", "math", "not offered for math"),
        ("return await self.programmer(analysis='x')", "code", "not offered for code"),
        ("return await self.custom(prompt='x')", "math", "unexpected argument 'prompt'"),
        ("return await self.custom()", "math", "missing a required argument"),
        ("return await self.sc_ensemble()", "qa", "missing a required argument"),
        ("x = await self.custom(instruction='x')", "math", "never returns"),
        ("return 'constant answer'", "math", "calls no operator"),
        ("global x\nreturn await self.custom(instruction='x')", "math", "Global"),
        ("return await self.nonexistent()", "math", "neither an offered operator"),
        # ast.parse accepts it, the compiler does not (a real SmolLM2 sample)
        ("return await self.review(solution='a', solution='b')", "math", "keyword argument repeated"),
    ],
)
def test_invalid_programs_are_rejected_with_a_reason(body, family, reason):
    with pytest.raises(WorkflowRejected) as ei:
        validate(wf(body), family)
    assert ei.value.status == Status.INVALID
    assert reason in ei.value.reason


@pytest.mark.parametrize(
    "code, reason",
    [
        ("def run():\n    return 1\n", "exactly one top-level `class Workflow`"),
        ("class Workflow:\n    def run(self):\n        return self.custom(instruction='x')\n", "async def run"),
        ("class Workflow:\n    async def run(self, problem):\n        return await self.custom(instruction=problem)\n",
         "only `self`"),
        ("class Workflow(object):\n    async def run(self):\n        return await self.custom(instruction='x')\n",
         "bases"),
        (HEADER + "        return await self.custom(instruction='x')\nimport os\nos.system('id')\n",
         "exactly one top-level"),
        (HEADER + "        return await self.custom(instruction='x')\nprint('side effect at import')\n",
         "exactly one top-level"),
        ("class Workflow:\n    x = 1\n    async def run(self):\n        return await self.custom(instruction='x')\n",
         "only methods"),
    ],
)
def test_structure_rules(code, reason):
    with pytest.raises(WorkflowRejected) as ei:
        validate(code, "math")
    assert reason in ei.value.reason


def test_size_and_call_count_limits():
    many = "\n".join(f"a{i} = await self.custom(instruction='x')" for i in range(17)) + "\nreturn a0"
    with pytest.raises(WorkflowRejected, match="17 operator call sites; the limit is 16"):
        validate(wf(many), "math")
    huge = wf("x = '" + "a" * 7000 + "'\nreturn await self.custom(instruction=x)")
    with pytest.raises(WorkflowRejected, match="characters; the limit is 6000"):
        validate(huge, "math")


def test_math_import_is_allowed_but_nothing_else():
    code = "import math\n" + wf("n = math.sqrt(4)\nreturn await self.custom(instruction=str(n))")
    assert validate(code, "math").operators_used == ("custom",)


def test_extract_code_from_fences_graph_tags_and_raw_text():
    code = wf("return await self.custom(instruction='x')")
    assert extract_code(f"Here you go:\n```python\n{code}```\nthanks") == code
    assert extract_code(f"<graph>\n{code}</graph>") == code
    assert extract_code(f"Sure.\n{code}") == code
    with pytest.raises(WorkflowRejected) as ei:
        extract_code("I cannot write a workflow.")
    assert ei.value.status == Status.FORMAT_ERROR
    with pytest.raises(WorkflowRejected) as ei:
        extract_code("   ")
    assert ei.value.status == Status.FORMAT_ERROR


def test_completion_mode_reassembles_and_cuts_trailing_junk():
    completion = "a = await self.custom(instruction='Solve.')\n        return a\n# Task: next\nclass Work"
    parsed = parse_workflow(completion, "math", completion=True)
    assert parsed.code == wf("a = await self.custom(instruction='Solve.')\nreturn a")


def test_completion_that_never_returns_is_invalid_and_empty_is_format_error():
    with pytest.raises(WorkflowRejected) as ei:
        parse_workflow("a = await self.custom(instruction='Solve.')\n", "math", completion=True)
    assert ei.value.status == Status.INVALID
    with pytest.raises(WorkflowRejected) as ei:
        parse_workflow("", "math", completion=True)
    assert ei.value.status == Status.FORMAT_ERROR


def test_generator_prompt_ends_with_prefilled_header_and_hides_no_hidden_tests():
    prompt = generator_prompt("code", "def f(x):\n    '''Return x.'''\n")
    assert prompt.endswith(WORKFLOW_HEADER + "        ")
    assert "self.code_generate" in prompt and "self.programmer" not in prompt
    assert "# Task: def f(x): '''Return x.'''" in prompt


def test_completion_whose_first_line_carries_the_tokenizers_space_is_read_at_the_bodys_indent():
    # the prompt prefilled 8 spaces; the first token brought its own (` a`): 9 columns, then 8
    parsed = parse_workflow(" a = await self.custom(instruction='Solve.')\n        return a\n", "math", completion=True)
    assert parsed.code == wf("a = await self.custom(instruction='Solve.')\nreturn a")
    # the extra column also on the next line (9, 9, 8): both 9s come back to 8
    text = " a = await self.custom(instruction='Solve.')\n         b = a\n        return b\n"
    parsed = parse_workflow(text, "math", completion=True)
    assert parsed.code == wf("a = await self.custom(instruction='Solve.')\nb = a\nreturn b")


def test_a_deeper_first_line_is_the_models_own_indent_and_is_read_as_written():
    # 12 columns, then 8: not the tokenizer's one space, so no reading applies and the prefix repair keeps line 1
    with pytest.raises(WorkflowRejected, match="never returns"):
        parse_workflow("    a = await self.custom(instruction='Solve.')\n        return a\n", "math", completion=True)


def test_a_reading_that_parses_in_full_wins_over_the_prefix_repair():
    # as written (9, 9, 8, 8) only `a = ...; return a` parses; at 8 columns the whole text does, dead tail and all
    text = (" a = await self.custom(instruction='Solve.')\n         return a\n"
            "        b = await self.custom(instruction='x')\n        return b\n")
    with pytest.raises(WorkflowRejected, match="line 5 never runs"):
        parse_workflow(text, "math", completion=True)


def test_size_limit_counts_the_workflow_not_the_text_after_it():
    tail = "# Example workflow 5\n" + "x" * 7000  # column 0: ends the workflow, so it is not the workflow's size
    parsed = parse_workflow("return await self.custom(instruction='Solve.')\n" + tail, "math", completion=True)
    assert parsed.code == wf("return await self.custom(instruction='Solve.')")
    with pytest.raises(WorkflowRejected, match="characters; the limit is 6000"):
        parse_workflow("return await self.custom(instruction='" + "y" * 7000 + "')\n", "math", completion=True)


def test_completion_that_parses_as_written_is_kept_as_written():
    text = " a = await self.custom(instruction='Solve.')\n         return a\n"  # 9 columns throughout
    parsed = parse_workflow(text, "math", completion=True)
    assert parsed.code == HEADER + "         a = await self.custom(instruction='Solve.')\n         return a\n"


@pytest.mark.parametrize("body, line, keyword", [
    ("a = await self.custom(instruction='Solve.')\nreturn a\nb = await self.custom(instruction='x')", 5, "return"),
    ("a = await self.custom(instruction='Solve.')\nif a:\n    return a\n    a = 'x'\nreturn a", 6, "return"),
    ("a = await self.custom(instruction='Solve.')\nfor i in range(2):\n    break\n    a = 'x'\nreturn a", 6, "break"),
    ("a = await self.custom(instruction='Solve.')\ntry:\n    raise ValueError('x')\n    a = 'x'\n"
     "except ValueError:\n    return a\n    a = 'y'\nreturn a", 6, "raise"),
    ("a = await self.custom(instruction='Solve.')\ntry:\n    a = a.strip()\nexcept ValueError:\n    return a\n"
     "    a = 'y'\nreturn a", 8, "return"),
    ("a = await self.custom(instruction='Solve.')\nwhile a:\n    a = a[1:]\nelse:\n    return a\n    a = 'y'\n"
     "return a", 8, "return"),
    ("a = await self.custom(instruction='Solve.')\nfor i in range(2):\n    continue\n    a = 'x'\nreturn a", 6,
     "continue"),
])
def test_statements_after_a_jump_in_the_same_block_are_invalid(body, line, keyword):
    with pytest.raises(WorkflowRejected) as ei:
        validate(wf(body), "math")
    assert ei.value.status == Status.INVALID
    assert f"line {line} never runs" in ei.value.reason and f"`{keyword}`" in ei.value.reason


def test_a_return_in_a_branch_does_not_make_the_code_after_the_branch_dead():
    code = wf("a = await self.custom(instruction='Solve.')\nif a:\n    return a\nreturn 'none'")
    assert validate(code, "math").operator_call_sites == 1


def test_completion_with_broken_trailing_line_is_repaired():
    completion = "a = await self.custom(instruction='Solve.')\n        return a\n        b = (\n"
    parsed = parse_workflow(completion, "math", completion=True)
    assert parsed.repaired is True
    assert parsed.code == wf("a = await self.custom(instruction='Solve.')\nreturn a")


@pytest.mark.parametrize(
    "body, reason",
    [
        # driving an operator's coroutine by hand reaches the event loop (and from there, subprocesses)
        ("c = self.custom('x')\nfut = c.send(None)\nloop = fut.get_loop()\nreturn await c", "awaited directly"),
        ("f = self.custom\nreturn await f(instruction='x')", "awaited directly"),
        ("xs = [self.custom('a'), self.custom('b')]\nreturn await xs[0]", "awaited directly"),
        ("g = lambda: self.custom('x')\nreturn await g()", "awaited directly"),
        ("a = await self.custom('x')\nn = a.real\nreturn a", "attribute 'real' is not allowed"),
        ("a = await self.custom('x')\nm = a.upper\nreturn m()", "called directly"),
        ("a = await self.custom('x')\nreturn a.encode()", "attribute 'encode' is not allowed"),
        ("a = await self.custom('x')\nreturn a.throw(ValueError)", "attribute 'throw' is not allowed"),
    ],
)
def test_coroutines_and_non_allow_listed_attributes_are_rejected(body, reason):
    with pytest.raises(WorkflowRejected) as ei:
        validate(wf(body), "math")
    assert ei.value.status == Status.INVALID
    assert reason in ei.value.reason


def test_allow_listed_methods_and_awaited_helper_methods_pass():
    code = (
        "import math\n"
        "class Workflow:\n"
        "    async def ask(self, s):\n"
        "        return await self.custom(instruction=s.strip())\n"
        "    async def run(self):\n"
        "        parts = ' a, b '.split(',')\n"
        "        outs = [await self.ask(p) for p in parts]\n"
        "        n = math.floor(len(outs) / 2)\n"
        "        return await self.sc_ensemble(solutions=outs[: n + 1])\n"
    )
    assert validate(code, "math").operators_used == ("custom", "sc_ensemble")
    with pytest.raises(WorkflowRejected, match="awaited directly"):
        validate(code.replace("[await self.ask(p)", "[self.ask(p)"), "math")


def test_pathological_nesting_is_invalid_not_a_crash():
    deep = wf("return " + "-" * 3000 + "1")
    with pytest.raises(WorkflowRejected) as ei:
        validate(deep, "math")
    assert ei.value.status == Status.INVALID
    with pytest.raises(WorkflowRejected) as ei:
        parse_workflow("return " + "-" * 3000 + "1\n", "math", completion=True)
    assert ei.value.status == Status.INVALID


def test_reviewers_event_loop_escape_is_rejected():
    """Found in review: drive an operator coroutine by hand, get the loop, start a subprocess."""
    code = (
        "class Workflow:\n"
        "    def connection_made(self, transport):\n"
        "        self.out = []\n"
        "    async def run(self):\n"
        "        c = self.custom('x')\n"
        "        fut = c.send(None)\n"
        "        loop = fut.get_loop()\n"
        "        tr, pr = await loop.subprocess_exec(lambda: self, '/proc/self/exe', '-c', 'print(1)')\n"
        "        return str(self.out)\n"
    )
    with pytest.raises(WorkflowRejected) as ei:
        validate(code, "math")
    assert ei.value.status == Status.INVALID


def test_math_survives_extraction_and_works_inside_run_too():
    text = ("Here is my workflow:\n```python\nimport math\n\nclass Workflow:\n    async def run(self):\n"
            "        n = math.floor(2.5)\n        return await self.custom(instruction=str(n))\n```")
    assert parse_workflow(text, "math").code.startswith("import math\n")
    inside = wf("import math\nn = math.floor(2.5)\nreturn await self.custom(instruction=str(n))")
    assert validate(inside, "math").operators_used == ("custom",)
    # a stray import above the class is kept, so the validator sees it and rejects it
    with pytest.raises(WorkflowRejected, match="import of 'os'"):
        parse_workflow("import os\n" + wf("return await self.custom(instruction='x')"), "math")
