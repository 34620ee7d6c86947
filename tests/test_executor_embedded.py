"""The embedded executor (the bundled SmolLM2 GGUF via llama.cpp): serialisation under cancellation and
across event loops, and prompts longer than the context window.

Scenarios that would crash the interpreter on a regression (llama.cpp aborts the whole process with a
GGML_ASSERT when one context is used from two threads at once) run in a subprocess, so that a
regression fails the test instead of killing pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[1]

_CANCEL_SCRIPT = textwrap.dedent(
    """
    import asyncio, threading
    from spogw_dagster.executors.embedded import EmbeddedExecutor
    from spogw_dagster.contracts import SamplingParams

    ex = EmbeddedExecutor()
    # count llama.cpp calls in flight at once (must never exceed 1)
    orig = ex._llm.create_chat_completion
    guard = threading.Lock()
    active = [0]
    peak = [0]

    def counted(*a, **k):
        with guard:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            return orig(*a, **k)
        finally:
            with guard:
                active[0] -= 1

    ex._llm.create_chat_completion = counted
    long_msgs = [{"role": "user", "content": "Write a very long story about dragons and castles."}]
    short_msgs = [{"role": "user", "content": "Say hi."}]

    async def first_loop():
        for i in range(2):
            t = asyncio.create_task(ex.chat(long_msgs, SamplingParams(temperature=0.8, max_tokens=300, seed=i)))
            await asyncio.sleep(0.3)
            t.cancel()
            try:
                await t
            except asyncio.CancelledError:
                print("cancelled", i, flush=True)
            # immediately another call: must wait for the abandoned llama.cpp call, not run beside it
            r = await ex.chat(short_msgs, SamplingParams(temperature=0.0, max_tokens=8, seed=1))
            print("after cancel", i, "ok", r.completion_tokens > 0, flush=True)
        rs = await asyncio.gather(*[ex.chat(short_msgs, SamplingParams(max_tokens=4, seed=s)) for s in range(2)])
        print("gather loop 1", len(rs), flush=True)

    async def second_loop():
        rs = await asyncio.gather(*[ex.chat(short_msgs, SamplingParams(max_tokens=4, seed=s)) for s in range(2)],
                                  return_exceptions=True)
        print("gather loop 2", [type(r).__name__ for r in rs], flush=True)
        await ex.aclose()

    asyncio.run(first_loop())
    asyncio.run(second_loop())
    print("peak", peak[0], flush=True)
    print("DONE", flush=True)
    """
)


def test_cancelled_call_keeps_the_model_serialised_and_a_second_event_loop_works():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _CANCEL_SCRIPT], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{out}\nstderr:\n{proc.stderr[-3000:]}"
    assert "cancelled 0" in out and "cancelled 1" in out
    assert "after cancel 0 ok True" in out and "after cancel 1 ok True" in out
    assert "gather loop 1 2" in out
    assert "gather loop 2 ['ChatResult', 'ChatResult']" in out
    assert "peak 1" in out
    assert "DONE" in out


@pytest.fixture(scope="module")
def embedded():
    from spogw_dagster.executors.embedded import EmbeddedExecutor

    return EmbeddedExecutor()


def test_concurrent_calls_from_two_event_loops_in_turn(embedded):
    """No lock bound to the first event loop: a later asyncio.run can call (and contend) again."""
    import asyncio

    from spogw_dagster.contracts import ChatResult, SamplingParams

    msgs = [{"role": "user", "content": "hi"}]

    async def two():
        return await asyncio.gather(*[embedded.chat(msgs, SamplingParams(max_tokens=4, seed=i)) for i in range(2)],
                                    return_exceptions=True)

    for _ in range(2):
        rs = asyncio.run(two())
        assert all(isinstance(r, ChatResult) for r in rs), rs


async def test_prompt_longer_than_the_context_is_prompt_too_long(embedded):
    from spogw_dagster.executors import ExecutorError, PromptTooLongError
    from spogw_dagster.contracts import SamplingParams

    huge = [{"role": "user", "content": "dragon castle knight " * 3500}]  # ~10k tokens > n_ctx 8192
    with pytest.raises(PromptTooLongError, match="exceed context window") as ei:
        await embedded.chat(huge, SamplingParams(max_tokens=4))
    assert isinstance(ei.value, ExecutorError) and not ei.value.retryable
    r = await embedded.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4, seed=1))
    assert r.completion_tokens > 0  # the model is still usable
