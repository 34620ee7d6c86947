"""Small benchmark files in the standard MBPP, DROP and HotpotQA formats, written by us.

MBPP, DROP and HotpotQA ship in no package. These fixtures let the tests (and a user trying the
pipeline) exercise the real loaders and scorers without the real files. The problems are our own,
written in the style of each dataset; every MBPP reference solution passes its tests.

    from spogw_dagster.benchmarks.fixtures import write_fixtures
    paths = write_fixtures("demo_data")      # {"mbpp": Path, "drop": Path, "hotpotqa": Path}
    load_benchmark("mbpp", paths["mbpp"])
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------------------
# MBPP: mbpp.jsonl, one object per line

_MBPP: list[dict[str, Any]] = [
    {
        "task_id": 901,
        "text": "Write a python function to count the vowels in a given string.",
        "code": "def count_vowels(s):\r\n    return sum(1 for c in s.lower() if c in 'aeiou')",
        "test_list": [
            'assert count_vowels("hello") == 2',
            'assert count_vowels("sky") == 0',
            'assert count_vowels("AEIOU") == 5',
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 902,
        "text": "Write a function to find the second largest distinct number in a list, or None if there is none.",
        "code": (
            "def second_largest(nums):\r\n"
            "    vals = sorted(set(nums))\r\n"
            "    if len(vals) < 2:\r\n"
            "        return None\r\n"
            "    return vals[-2]"
        ),
        "test_list": [
            "assert second_largest([1, 5, 3, 5]) == 3",
            "assert second_largest([10, 20]) == 10",
            "assert second_largest([7, 7]) == None",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 903,
        "text": "Write a function to check whether a string is a palindrome, ignoring case and non-alphanumeric characters.",
        "code": (
            "def is_palindrome(s):\r\n"
            "    t = [c.lower() for c in s if c.isalnum()]\r\n"
            "    return t == t[::-1]"
        ),
        "test_list": [
            'assert is_palindrome("A man, a plan, a canal: Panama") == True',
            'assert is_palindrome("race a car") == False',
            'assert is_palindrome("") == True',
        ],
        "test_setup_code": "",
        "challenge_test_list": ['assert is_palindrome("No \'x\' in Nixon") == True'],
    },
    {
        "task_id": 904,
        "text": "Write a function to compute the running sums of a list of numbers.",
        "code": (
            "def running_sum(nums):\r\n"
            "    out = []\r\n"
            "    total = 0\r\n"
            "    for n in nums:\r\n"
            "        total += n\r\n"
            "        out.append(total)\r\n"
            "    return out"
        ),
        "test_list": [
            "assert running_sum([1, 2, 3, 4]) == [1, 3, 6, 10]",
            "assert running_sum([]) == []",
            "assert running_sum([5, -2]) == [5, 3]",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 905,
        "text": "Write a function to merge two sorted lists into one sorted list.",
        "code": (
            "import heapq\r\n"
            "def merge_sorted(a, b):\r\n"
            "    return list(heapq.merge(a, b))"
        ),
        "test_list": [
            "assert merge_sorted([1, 3, 5], [2, 4, 6]) == [1, 2, 3, 4, 5, 6]",
            "assert merge_sorted([], [1]) == [1]",
            "assert merge_sorted([1, 1], [1]) == [1, 1, 1]",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 906,
        "text": "Write a function to find the distance between two points (x1, y1) and (x2, y2).",
        "code": (
            "import math\r\n"
            "def point_distance(x1, y1, x2, y2):\r\n"
            "    return math.hypot(x2 - x1, y2 - y1)"
        ),
        "test_list": [
            "assert math.isclose(point_distance(0, 0, 3, 4), 5.0)",
            "assert math.isclose(point_distance(1, 1, 1, 1), 0.0)",
            "assert math.isclose(point_distance(-1, 2, 2, -2), 5.0)",
        ],
        "test_setup_code": "import math",
        "challenge_test_list": [],
    },
]

# --------------------------------------------------------------------------------------------------
# DROP: drop_dataset_dev.json

_EMPTY_DATE = {"day": "", "month": "", "year": ""}


def _num(n: str) -> dict[str, Any]:
    return {"number": n, "date": dict(_EMPTY_DATE), "spans": []}


def _spans(*s: str) -> dict[str, Any]:
    return {"number": "", "date": dict(_EMPTY_DATE), "spans": list(s)}


def _date(day: str, month: str, year: str) -> dict[str, Any]:
    return {"number": "", "date": {"day": day, "month": month, "year": year}, "spans": []}


_DROP: dict[str, Any] = {
    "nfl_fixture_1": {
        "passage": (
            "Coming off their bye week, the Gulls stayed home for a Week 8 duel with the Rangers. "
            "Harbor City trailed early in the first quarter as Rangers kicker Dan Ortiz got a 32-yard "
            "field goal. The Gulls answered with quarterback Eli Marsh completing a 14-yard touchdown "
            "pass to wide receiver Tom Brennan. In the second quarter, Ortiz nailed a 45-yard field goal, "
            "while Gulls running back Luis Pena got a 3-yard touchdown run. After a scoreless third "
            "quarter, Ortiz added a 27-yard field goal, but the Gulls held on to win 14-9."
        ),
        "qa_pairs": [
            {
                "question": "How many yards was the longest field goal?",
                "query_id": "drop-fixture-q1",
                "answer": _num("45"),
                "validated_answers": [_num("45")],
            },
            {
                "question": "Who caught the first touchdown pass of the game?",
                "query_id": "drop-fixture-q2",
                "answer": _spans("Tom Brennan"),
                "validated_answers": [_spans("Brennan")],
            },
            {
                "question": "Which players scored touchdowns for the Gulls?",
                "query_id": "drop-fixture-q3",
                "answer": _spans("Tom Brennan", "Luis Pena"),
                "validated_answers": [],
            },
        ],
        "wiki_url": "",
    },
    "history_fixture_1": {
        "passage": (
            "The treaty between the two duchies was signed on 14 March 1721 after four years of war. "
            "Under its terms the town of Velden passed to the northern duchy. In 1730 the town had "
            "2,400 inhabitants; by 1750 its population had grown to 3,100, largely because of the new "
            "river trade."
        ),
        "qa_pairs": [
            {
                "question": "When was the treaty signed?",
                "query_id": "drop-fixture-q4",
                "answer": _date("14", "March", "1721"),
                "validated_answers": [_date("14", "March", "1721")],
            },
            {
                "question": "How many more inhabitants did Velden have in 1750 than in 1730?",
                "query_id": "drop-fixture-q5",
                "answer": _num("700"),
                "validated_answers": [_spans("700 inhabitants")],
            },
        ],
        "wiki_url": "",
    },
}

# --------------------------------------------------------------------------------------------------
# HotpotQA: hotpot_dev_distractor_v1.json

_HOTPOT: list[dict[str, Any]] = [
    {
        "_id": "hotpot-fixture-1",
        "question": "Which river is longer, the Danube or the Rhine?",
        "answer": "Danube",
        "type": "comparison",
        "level": "easy",
        "supporting_facts": [["Danube", 1], ["Rhine", 1]],
        "context": [
            ["Danube", ["The Danube is the second-longest river in Europe, after the Volga.",
                        " It flows for about 2,850 km through Central and Eastern Europe."]],
            ["Volga", ["The Volga is the longest river in Europe.", " It flows into the Caspian Sea."]],
            ["Rhine", ["The Rhine is a river that begins in the Swiss Alps.",
                       " It is about 1,230 km long and empties into the North Sea."]],
            ["Elbe", ["The Elbe rises in the Krkonose mountains.", " It flows into the North Sea at Cuxhaven."]],
        ],
    },
    {
        "_id": "hotpot-fixture-2",
        "question": "In which city was the composer of the opera The Magic Flute born?",
        "answer": "Salzburg",
        "type": "bridge",
        "level": "medium",
        "supporting_facts": [["The Magic Flute", 0], ["Wolfgang Amadeus Mozart", 1]],
        "context": [
            ["The Magic Flute", ["The Magic Flute is an opera in two acts by Wolfgang Amadeus Mozart.",
                                 " It premiered in Vienna in 1791."]],
            ["Wolfgang Amadeus Mozart", ["Wolfgang Amadeus Mozart was a composer of the Classical period.",
                                         " He was born in Salzburg in 1756."]],
            ["Fidelio", ["Fidelio is the only opera by Ludwig van Beethoven."]],
            ["Vienna", ["Vienna is the capital of Austria.", " It lies on the Danube."]],
        ],
    },
    {
        "_id": "hotpot-fixture-3",
        "question": "Were Marie Curie and Lise Meitner both physicists?",
        "answer": "yes",
        "type": "comparison",
        "level": "easy",
        "supporting_facts": [["Marie Curie", 0], ["Lise Meitner", 0]],
        "context": [
            ["Marie Curie", ["Marie Curie was a Polish and naturalised-French physicist and chemist.",
                             " She conducted pioneering research on radioactivity."]],
            ["Lise Meitner", ["Lise Meitner was an Austrian-Swedish physicist.",
                              " She was one of those responsible for the discovery of nuclear fission."]],
            ["Rosalind Franklin", ["Rosalind Franklin was a British chemist and X-ray crystallographer."]],
        ],
    },
    {
        "_id": "hotpot-fixture-4",
        "question": "What is the capital of the country in which most of the Atacama Desert lies?",
        "answer": "Santiago",
        "type": "bridge",
        "level": "hard",
        "supporting_facts": [["Atacama Desert", 1], ["Chile", 1]],
        "context": [
            ["Atacama Desert", ["The Atacama Desert is a desert plateau on the Pacific coast of South America.",
                                " Most of it lies in northern Chile."]],
            ["Chile", ["Chile is a country in western South America.",
                       " Its capital and largest city is Santiago."]],
            ["Peru", ["Peru is a country in western South America.", " Its capital is Lima."]],
            ["Sahara", ["The Sahara is the largest hot desert in the world."]],
        ],
    },
    {
        "_id": "hotpot-fixture-5",
        "question": "Which was founded first, Harvard University or Yale University?",
        "answer": "Harvard University",
        "type": "comparison",
        "level": "medium",
        "supporting_facts": [["Harvard University", 0], ["Yale University", 0]],
        "context": [
            ["Harvard University", ["Harvard University is a private university in Cambridge, Massachusetts, founded in 1636."]],
            ["Yale University", ["Yale University is a private university in New Haven, Connecticut, founded in 1701."]],
            ["Princeton University", ["Princeton University was founded in 1746."]],
        ],
    },
]


def mbpp_fixture_records() -> list[dict[str, Any]]:
    return json.loads(json.dumps(_MBPP))


def drop_fixture_data() -> dict[str, Any]:
    return json.loads(json.dumps(_DROP))


def hotpotqa_fixture_data() -> list[dict[str, Any]]:
    return json.loads(json.dumps(_HOTPOT))


def _dir(directory: str | Path) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_mbpp_fixture(directory: str | Path) -> Path:
    """Write `mbpp.jsonl` (6 problems, standard MBPP JSON Lines) into `directory`; return its path."""
    p = _dir(directory) / "mbpp.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _MBPP), encoding="utf-8")
    return p


def write_drop_fixture(directory: str | Path) -> Path:
    """Write `drop_dataset_dev.json` (2 passages, 5 questions: number, span, multi-span, date)."""
    p = _dir(directory) / "drop_dataset_dev.json"
    p.write_text(json.dumps(_DROP, indent=1), encoding="utf-8")
    return p


def write_hotpotqa_fixture(directory: str | Path) -> Path:
    """Write `hotpot_dev_distractor_v1.json` (5 questions: bridge, comparison, yes/no)."""
    p = _dir(directory) / "hotpot_dev_distractor_v1.json"
    p.write_text(json.dumps(_HOTPOT, indent=1), encoding="utf-8")
    return p


def write_fixtures(directory: str | Path) -> dict[str, Path]:
    """Write all three fixtures; returns {"mbpp": path, "drop": path, "hotpotqa": path}."""
    return {
        "mbpp": write_mbpp_fixture(directory),
        "drop": write_drop_fixture(directory),
        "hotpotqa": write_hotpotqa_fixture(directory),
    }
