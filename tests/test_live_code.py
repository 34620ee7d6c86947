"""What the tests can run of a code answer (`workflow/live_code.py`): the live top-level statements, worked by
hand on small modules."""

from __future__ import annotations

import pytest

from spogw_dagster.workflow.live_code import live_statements


def live(code: str, roots=("f",)) -> list[str]:
    out = live_statements(code, roots)
    return None if out is None else [code[s.start:s.end] for s in out]


def test_python_keeps_the_last_definition():
    code = "def f(x):\n    return 1\n\ndef f(x):\n    return 2\n"
    assert live(code) == ["def f(x):\n    return 2"]


def test_a_helper_lives_when_a_live_function_reads_it_even_defined_after_it():
    code = "def f(x):\n    return g(x)\n\ndef g(x):\n    return h\n\nh = 3\n\ndef unused():\n    return 0\n"
    assert live(code) == ["def f(x):\n    return g(x)", "def g(x):\n    return h", "h = 3"]


def test_a_shadowed_helper_is_dead_and_the_last_one_lives():
    code = "def g():\n    return 1\ndef f():\n    return g()\ndef g():\n    return 2\n"
    assert live(code) == ["def f():\n    return g()", "def g():\n    return 2"]


def test_what_runs_at_import_lives_and_pulls_in_what_it_reads():
    code = ("import math\n"
            "def helper():\n    return 0\n"
            "print(helper())\n"
            "def f(x):\n    return x\n")
    # `import math` is read by nothing: dead; the print runs at import and reads helper
    assert live(code) == ["def helper():\n    return 0", "print(helper())", "def f(x):\n    return x"]


@pytest.mark.parametrize("dead", [
    '"""A module docstring."""',
    'if __name__ == "__main__":\n    print(f(1))',
    "if '__main__' == __name__:\n    f(2)",
    "spare = 3",
    "y = (1, -2, 'a', None, math.pi)",
    "z = lambda a: a + 1",
    "pass",
    "class Plain:\n    '''doc'''\n    k = 1\n    def m(self):\n        return 1",
])
def test_statements_that_do_nothing_the_tests_can_see_are_dead(dead):
    code = f"import math\n{dead}\ndef f(x):\n    return x\n"
    assert live(code) == ["def f(x):\n    return x"]


@pytest.mark.parametrize("effect", [
    "print('hi')",
    "assert f(1) == 1",
    "x = compute()",
    "x = [i for i in range(3)]",
    "items = List[int]",  # a subscript may call __class_getitem__
    "f.cache = {}",
    "x, y[0] = 1, 2",
    "for i in range(2):\n    pass",
    "if True:\n    pass",
    "try:\n    pass\nexcept Exception:\n    pass",
    "with open('x') as fh:\n    pass",
    "del something",
    "from os import *",
    "@decorate\ndef g():\n    return 1",
    "def g(x=make()):\n    return x",
    "def g(x: List[int]):\n    return x",
    "class C(Base):\n    pass",
    "class C:\n    x = compute()",
    "z = lambda a=make(): a",
    "if __name__ == '__main__':\n    pass\nelse:\n    f = 1",
])
def test_statements_that_run_code_at_import_are_live(effect):
    code = f"def f(x):\n    return x\n{effect}\n"
    assert effect.split("\n")[-1].strip() in "\n".join(live(code)), live(code)


def test_a_name_spelled_in_a_string_is_read():
    code = ("def hidden():\n    return 1\n"
            "def f():\n    return getattr(__import__('sys').modules[__name__], 'hidden')()\n")
    assert live(code)[0] == "def hidden():\n    return 1"


def test_a_definition_inside_an_if_shadows_the_plain_one_before_it():
    code = "def f():\n    return 1\nif True:\n    def f():\n        return 2\n"
    assert live(code) == ["if True:\n    def f():\n        return 2"]


def test_every_name_the_tests_call_is_a_root_and_imports_are_marked():
    code = "from math import sqrt\ndef g():\n    return sqrt(2)\ndef f():\n    return 1\ndef spare():\n    return 0\n"
    out = live_statements(code, ["f", "g"])
    assert [(code[s.start:s.end].split("\n")[0], s.is_import, s.binds_root) for s in out] == [
        ("from math import sqrt", True, False), ("def g():", False, True), ("def f():", False, True)]


def test_offsets_count_characters_not_bytes():
    code = "s = 'é'\ndef f():  # naïve\n    return s + 'ü'\n"
    assert live(code) == ["s = 'é'", "def f():  # naïve\n    return s + 'ü'"]


def test_a_decorated_definition_starts_at_its_decorator():
    code = "@cache\ndef f():\n    return 1\n"
    assert live(code) == ["@cache\ndef f():\n    return 1"]


@pytest.mark.parametrize("code,roots", [
    ("def f(:\n", ("f",)),  # does not parse
    ("def g():\n    return 1\n", ("f",)),  # binds no root
])
def test_nothing_is_said_when_the_code_does_not_parse_or_binds_no_root(code, roots):
    assert live_statements(code, roots) is None
