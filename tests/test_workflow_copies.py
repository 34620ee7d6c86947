"""Near copies of what the prompt shows, and distinct workflows per query (names and layout normalised)."""


from spogw_dagster.pipeline.data import report_stats
from spogw_dagster.pipeline.data import tables
from spogw_dagster.workflow.copies import copied_from, distinct_count, normalized
from spogw_dagster.workflow.template import FEW_SHOT, TEMPLATES, WORKFLOW_HEADER

RENAMED_EXAMPLE_2 = (
    "class Workflow:\n"
    "    async def run(self):\n"
    "        '''Generate, then test.'''\n"
    "        draft  =  await self.code_generate(instruction='Write the function.')   # first try\n"
    "\n"
    "        return await self.test(solution = draft)\n"
)
OTHER_INSTRUCTION = RENAMED_EXAMPLE_2.replace("Write the function.", "Write the function carefully.")


def test_shown_workflows_are_recognised_whatever_their_names_and_layout():
    assert copied_from(RENAMED_EXAMPLE_2, "code") == "example 2"
    assert copied_from(TEMPLATES["code"], "code") == "template"
    for i, body in enumerate(FEW_SHOT["math"], start=1):
        assert copied_from(WORKFLOW_HEADER + body, "math") == f"example {i}"
    # another instruction is another workflow; so is another family's example
    assert copied_from(OTHER_INSTRUCTION, "code") is None
    assert copied_from(WORKFLOW_HEADER + FEW_SHOT["math"][1], "code") is None
    assert copied_from("class Workflow(:\n", "code") is None and normalized(None) is None


def test_distinct_counts_normalised_forms():
    swapped = RENAMED_EXAMPLE_2.replace("draft", "x")
    assert distinct_count([RENAMED_EXAMPLE_2, swapped, OTHER_INSTRUCTION]) == 2
    assert distinct_count(["not python (", "not python (", "also not ("]) == 2


def test_report_near_copy_rate_and_distinct_per_query_by_hand():
    # q0: three valid samples, two of them the same workflow renamed (a copy of example 2), one new: 2 distinct;
    # q1: one copy of the template and one invalid sample: 1 distinct. Near copies 3 of 5 samples; distinct
    # per query (2 + 1) / 2 = 1.5
    rows = [_row("q0", 0, RENAMED_EXAMPLE_2, "example 2"), _row("q0", 1, RENAMED_EXAMPLE_2.replace("draft", "y"),
            "example 2"), _row("q0", 2, OTHER_INSTRUCTION, None), _row("q1", 0, TEMPLATES["code"], "template"),
            {**_row("q1", 1, "", None), "parse_status": "invalid", "valid": False, "status": "invalid"}]
    rep = report_stats.summarize_heldout(tables.heldout_frame(rows), iteration=0, config_hash="h", split_ids_sha256="s",
                                   resamples=50)
    m = {r["metric"]: r for r in rep.iter_rows(named=True)}
    assert m["near_copy_rate"]["value"] == 3 / 5
    assert m["distinct_per_query"]["value"] == 1.5
    assert rep["metric"].to_list()[0] == "answer_score"  # the headline comes first


def _row(q, j, code, copied):
    return {"iteration": 0, "split": "test", "system": "base", "kind": "previous", "mode": "sampled",
            "greedy": False, "query_id": q, "sample_idx": j, "seed": 1, "exec_seed": 2, "temperature": 0.5,
            "parse_status": "ok", "status": "ok", "valid": True, "executes": 1.0, "reward": 0.5,
            "answer_score": 0.0, "trivial": False, "copied_from": copied, "near_copy": copied is not None,
            "finish_reason": "stop", "n_tokens": 5, "llm_calls": 1, "cached_calls": 0, "prompt_tokens": 1,
            "completion_tokens": 1, "checkpoint_iteration": None, "adapter_sha256": None, "workflow": code,
            "error": ""}


def test_prompt_styles_show_what_they_say():
    from spogw_dagster.workflow.template import COMPOSITION_NOTES, generator_prompt

    full = generator_prompt("code", "Write add(a, b).")
    assert full.count("# Example workflow") == 3 and generator_prompt("code", "Write add(a, b).", "examples") == full
    none = generator_prompt("code", "Write add(a, b).", "operators")
    assert "# Example workflow" not in none and COMPOSITION_NOTES in none and none.endswith("    async def run(self):\n        ")
    # one example per query, not always the same one
    shown = set()
    for i in range(40):
        p = generator_prompt("code", f"Write task number {i}.", "one_example")
        assert p.count("# Example workflow") == 1
        shown.add(next(b for b in FEW_SHOT["code"] if b in p))
    assert len(shown) == 3
    import pytest

    with pytest.raises(ValueError, match="unknown generator prompt style 'many'"):
        generator_prompt("code", "x", "many")
