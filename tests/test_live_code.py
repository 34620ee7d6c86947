"""What the tests can run of a code answer (`benchmarks/live_code.py`): the live top-level statements, worked by
hand on small modules."""

from __future__ import annotations

import pytest

from spogw_dagster.benchmarks.live_code import live_only, live_statements


def live(code: str, roots=("f",)) -> list[str]:
    out = live_statements(code, roots)
    return None if out is None else [code[s.start:s.end] for s in out]


def test_python_keeps_the_last_definition():
    code = "def f(x):\n    return 1\n\ndef f(x):\n    return 2\n"
    assert live(code) == ["def f(x):\n    return 2"]


def test_a_helper_lives_when_a_live_function_reads_it_even_defined_after_it():
    code = "def f(x):\n    return g(x)\n\ndef g(x):\n    return h\n\nh = 3\n\ndef unused():\n    return 0\n"
    assert live(code) == ["def f(x):\n    return g(x)", "def g(x):\n    return h", "h = 3"]


def test_every_binding_of_a_name_a_live_statement_reads_lives():
    # f may be called while the module runs (then it finds the first g) or after (the last): both count
    code = "def g():\n    return 1\ndef f():\n    return g()\ndef g():\n    return 2\n"
    assert live(code) == ["def g():\n    return 1", "def f():\n    return g()", "def g():\n    return 2"]


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


def test_a_definition_inside_an_if_does_not_hide_the_plain_one_before_it():
    code = "def f():\n    return 1\nif True:\n    def f():\n        return 2\n"
    assert live(code) == ["def f():\n    return 1", "if True:\n    def f():\n        return 2"]
    # a plain definition after it does
    assert live(code + "def f():\n    return 3\n") == ["if True:\n    def f():\n        return 2",
                                                        "def f():\n    return 3"]


def test_every_name_the_tests_call_is_a_root_and_imports_are_marked():
    code = "from math import sqrt\ndef g():\n    return sqrt(2)\ndef f():\n    return 1\ndef spare():\n    return 0\n"
    out = live_statements(code, ["f", "g"])
    assert [(code[s.start:s.end].split("\n")[0], s.neutral, s.binds_root) for s in out] == [
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


# what a policy could learn with string concatenation alone: its own entry point, made to look dead
OWN = "def f(xs):\n    return 42\n"
DRAFT = "def f(xs):\n    return len(xs) > 99\n"
INDENTED = "    " + DRAFT.rstrip().replace("\n", "\n    ") + "\n"


@pytest.mark.parametrize("tail", [
    'if __name__ == "__main__":\n' + INDENTED,  # a block that never runs binds nothing
    "if False:\n" + INDENTED,  # a binding that may not happen does not hide the one before it
    'f: """' + DRAFT + '"""\n',  # a bare annotation binds nothing
])
def test_a_binding_that_may_not_run_does_not_shadow_the_one_that_does(tail):
    assert "def f(xs):\n    return 42" in live(OWN + tail)


def test_a_read_at_import_time_keeps_every_binding_of_the_name():
    # TABLE is filled while the module runs, from the first helper; the second one comes too late to matter
    code = ("def helper(i):\n    return 42\n"
            "TABLE = [helper(i) for i in range(3)]\n"
            "def f(n):\n    return TABLE[n]\n"
            "def helper(i):\n    return 0\n")
    assert "def helper(i):\n    return 42" in live(code) and "def helper(i):\n    return 0" in live(code)


def test_a_main_block_runs_where_the_module_may_rebind_its_name():
    code = DRAFT + '__name__ = "__main__"\nif __name__ == "__main__":\n    f.__code__ = (lambda xs: 42).__code__\n'
    assert live(code)[1:] == ['__name__ = "__main__"',
                              'if __name__ == "__main__":\n    f.__code__ = (lambda xs: 42).__code__']
    spelled = "def f():\n    return globals()['__name__']\nif __name__ == '__main__':\n    f = 1\n"
    assert len(live(spelled)) == 2


def test_a_star_import_binds_every_name():
    out = live_statements(DRAFT + "from statistics import *\n", ["f"])
    assert [(s.neutral, s.binds_root) for s in out] == [(False, True)]  # judged: it decides what f is


def test_an_alias_of_a_function_the_answer_defines_is_neutral_an_alias_of_a_library_name_is_not():
    out = live_statements("def solve(xs):\n    return sorted(xs)\nf = solve\n", ["f"])
    assert [(s.neutral, s.binds_root) for s in out] == [(False, False), (True, True)]
    out = live_statements("from statistics import median\nf = median\n", ["f"])
    assert [(s.neutral, s.binds_root) for s in out] == [(True, False), (False, True)]


def test_the_module_the_tests_run_holds_only_the_live_statements():
    code = ('"""doc"""\nimport os\ndef g():\n    return 1\n' + DRAFT
            + "def f(xs):  # the last one\n    return 0\nif __name__ == '__main__':\n    print(f([]))\n")
    assert live_only(code, ["f"]) == '"""doc"""\nimport os\npass\npass\ndef f(xs):  # the last one\n    return 0\npass\n'
    assert live_only("def f(:\n", ["f"]) is None
