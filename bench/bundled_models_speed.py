"""Prompt and generation speed of every bundled model as the embedded executor, side by side in one run.

For each installed bundled model (`spogw models`), one llama.cpp server of our portable runtime, in the
pipeline's layout (one single-thread worker; `--threads` to change it), answers the same requests: a HumanEval
prompt as `code_generate` sends it and a GSM8K question as `custom` sends it, greedy, `--max-tokens` tokens,
alternating over the models for `--rounds` rounds (the machine is shared, so the models take turns instead of
running one after another). Prompt and generated token rates are the server's own timings (`timings` of each
reply). Prints per model the median rates and

    RATIO gen_tok_s <model>/smollm2 = X

so the cost of a bigger executor reads off directly, whatever else the machine is doing.

    python bench/bundled_models_speed.py [--rounds 3] [--max-tokens 128] [--threads 1] [--model qwen2.5-coder-0.5b]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spogw_dagster import bundled_models as bm  # noqa: E402
from spogw_dagster.executors.embedded import LlamaServer  # noqa: E402

PROMPTS = [
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Complete this Python function:\n\n```python\ndef below_zero(operations: list[int]) "
      "-> bool:\n    \"\"\"You're given a list of deposit and withdrawal operations on a bank account that starts "
      "with zero balance. Detect if at any point the balance falls below zero, and return True; otherwise return "
      "False.\n    >>> below_zero([1, 2, 3])\n    False\n    >>> below_zero([1, 2, -4, 5])\n    True\n    \"\"\"\n"
      "```\n\nReply with the complete Python function in one ```python code block."}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Solve the problem step by step.\n\nProblem: Natalia sold clips to 48 of her friends "
      "in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April "
      "and May?\n\nEnd with the final answer as '#### <number>'."}],
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", action="append", help="aliases (default: every installed bundled model)")
    a = ap.parse_args()
    names = a.model or [m.alias for m in bm.REGISTRY.values() if bm.state(m)["state"] != "not installed"]
    servers = {}
    for n in names:
        path = bm.gguf_path(n, progress=lambda m: print(m, file=sys.stderr))
        srv = LlamaServer(path, n_ctx=4096, threads=a.threads)
        srv.start()
        servers[n] = srv
    rates: dict[str, dict[str, list[float]]] = {n: {"prompt": [], "gen": []} for n in names}
    try:
        with httpx.Client(timeout=600) as client:
            for _ in range(a.rounds):
                for n, srv in servers.items():
                    for msgs in PROMPTS:
                        r = client.post(f"{srv.url}/v1/chat/completions",
                                        json={"messages": msgs, "max_tokens": a.max_tokens, "temperature": 0.0,
                                              "seed": 0, "cache_prompt": False})
                        r.raise_for_status()
                        t = r.json()["timings"]
                        rates[n]["prompt"].append(t["prompt_per_second"])
                        rates[n]["gen"].append(t["predicted_per_second"])
    finally:
        for srv in servers.values():
            srv.stop()
    print(f"bundled models as the embedded executor: {a.threads} thread(s) per server, {a.rounds} rounds x "
          f"{len(PROMPTS)} prompts, greedy, up to {a.max_tokens} tokens")
    print(f"  {'model':<22}{'MB':>7}{'prompt tok/s':>15}{'gen tok/s':>12}")
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in rates.items()}
    for n in names:
        print(f"  {n:<22}{bm.get(n).size / 1e6:>7.0f}{med[n]['prompt']:>15.1f}{med[n]['gen']:>12.1f}")
    if "smollm2" in med:
        for n in names:
            if n != "smollm2":
                print(f"RATIO gen_tok_s {n}/smollm2 = {med[n]['gen'] / med['smollm2']['gen']:.3f}")
                print(f"RATIO prompt_tok_s {n}/smollm2 = {med[n]['prompt'] / med['smollm2']['prompt']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
