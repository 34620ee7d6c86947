"""Training cost at the paper's grouping: per-group rows vs unique workflows (TrainConfig.aggregate_unique).

    python bench/train_scale.py                      # tiny random Llama (1024-token vocab), 4 queries
    python bench/train_scale.py --model smollm2 --queries 1 --completion-tokens 24   # the bundled model (slow)

Synthetic data with the paper's curation: for each of `--queries` queries m = 16 distinct workflows with
seeded scores in {0, 1/3, 2/3, 1}, `core.curation.curate` with n = 14, t = 4, g_max = 120 (all C(16, 14) = 120
groups, screened, sharpened to 2t = 8 rows, advantages), joined into one `TrainExample` per sharpened member
and group exactly as `pipeline.data.training_inputs.training_examples` does (~960 rows per query from <= 16 workflows).

Both modes run `train_lora` on the same examples with the same config (spogw, β = 0.1, π_old recomputed,
π_ref = base; batch_size rows per micro-batch and one optimizer step over all the data, i.e. grad_accum covers
every micro-batch: the full-data step whose loss and gradient the two modes share), each in a fresh process
so that the peak RSS (VmHWM over the loaded model) is its own. Printed per mode: rows trained, micro-batches,
π_old/π_ref precompute seconds, the optimizer step's seconds, total train_lora seconds, peak memory, and the
first-step loss (equal up to float rounding). The last lines are

    RATIO per-group/unique step time = X.XX          (the optimizer step: forward + backward of every row)
    RATIO per-group/unique total time = X.XX         (π_old/π_ref precompute + step + save)

Expected ≈ rows/unique (~80 at the paper's grouping) for the step: each row's cost is the same, so the ratio
is the ratio of rows, less the per-prompt work that both modes do once per micro-batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OPS = ["custom", "answer_generate", "code_generate", "programmer", "sc_ensemble", "test", "review"]


def _workflow(q: int, i: int, tokens: int) -> str:
    """A distinct, plausible workflow body of roughly `tokens` tokens."""
    lines, k = [], 0
    while sum(len(x) for x in lines) < tokens * 4:
        op = OPS[(i * 3 + k * 5 + q) % len(OPS)]
        lines.append(f"    s{k} = await self.{op}(problem, instruction='variant {i}.{k} of query {q}')\n")
        k += 1
    lines.append(f"    return s{k - 1}\n")
    return "".join(lines)


def build_examples(queries: int, m: int, n: int, t: int, g_max: int, completion_tokens: int, seed: int,
                   vocab: int | None = None):
    """(TrainExamples, summary) of the paper's curation on synthetic scores. With `vocab` (the tiny model's small
    vocabulary) the examples carry SmolLM2 token ids folded into [16, vocab)."""
    import polars as pl
    import torch

    from spogw_dagster.core.curation import curate
    from spogw_dagster.core.hyperparams import CurationConfig
    from spogw_dagster.core.training import TrainExample

    g = torch.Generator().manual_seed(seed)
    rows, text = [], {}
    for q in range(queries):
        prompt = (f"You write agentic workflows.\nOperators: {', '.join(OPS)}.\n# Query {q}: solve the problem "
                  f"and check the answer against the public tests before returning it.\nclass Workflow:\n"
                  f"    async def run(self, problem):\n")
        scores = (torch.randint(0, 4, (m,), generator=g).double() / 3).tolist()
        for i in range(m):
            wf = _workflow(q, i, completion_tokens)
            rows.append({"iteration": 0, "query_id": f"q{q}", "sample_idx": i, "workflow": wf, "score": scores[i],
                         "status": "ok"})
            text[(f"q{q}", i)] = (prompt, wf)
    cur = curate(pl.DataFrame(rows), CurationConfig(m=m, n=n, t=t, g_max=g_max, tau_sim=1.0))
    ids = {}
    if vocab is not None:
        from spogw_dagster.models import load_tokenizer

        tok = load_tokenizer("smollm2")
        fold = lambda xs: [16 + x % (vocab - 16) for x in xs]
        ids = {k: (fold(tok(p)["input_ids"]), fold(tok(w, add_special_tokens=False)["input_ids"]))
               for k, (p, w) in text.items()}
    ex = []
    for r in cur.members.sort(["group_id", "rank"]).iter_rows(named=True):
        key = (r["query_id"], r["sample_idx"])
        prompt, wf = text[key]
        pids, cids = ids.get(key, (None, None))
        ex.append(TrainExample(prompt, wf, advantage=float(r["advantage"]), score=float(r["score"]),
                               group_id=r["group_id"], prompt_token_ids=pids, completion_token_ids=cids))
    unique = len({(e.prompt, e.completion) for e in ex})
    return ex, {"queries": queries, "groups": cur.summary["groups_kept"], "rows": len(ex), "unique": unique,
                "groups_formed": cur.summary["groups_formed"]}


TINY_VOCAB = 1024


def tiny_model(folder: Path) -> Path:
    """The tiny random Llama of tests/test_trainer.py with a 1024-token vocabulary (SmolLM2's tokenizer is saved
    beside it for the pad id; the examples carry folded token ids), saved once: at SmolLM2's 49152-token
    vocabulary the LM head and log-softmax alone would make the per-group run take many minutes."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from spogw_dagster.models import load_tokenizer

    tok = load_tokenizer("smollm2")
    cfg = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def one_mode(args) -> None:
    """In this (fresh) process: one train_lora run; prints one JSON line."""
    import torch

    from spogw_dagster.core.training import TrainConfig, train_lora
    from spogw_dagster.models import load_model_and_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    ex, info = build_examples(args.queries, args.m, args.n, args.t, args.g_max, args.completion_tokens, args.seed,
                              TINY_VOCAB if args.tiny else None)
    load_model_and_tokenizer(args.model_path)  # warm the file cache; the model RSS is in `before` below
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
    before = _rss_kib("VmRSS")
    cfg = TrainConfig(objective="spogw", beta=0.1, temperature=0.7, batch_size=args.batch_size, grad_accum=100_000,
                      epochs=1, eval_after=False, aggregate_unique=bool(args.aggregate), seed=args.seed)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        res = train_lora(ex, cfg, Path(d) / "adapter", base_model=args.model_path, reuse_existing=False)
        total = time.perf_counter() - t0
    st = res.stats["steps"][0]
    s = res.stats["summary"]
    print("RESULT " + json.dumps({
        **info, "aggregate": bool(args.aggregate), "train_rows": res.stats["n_train_rows"],
        "micro_batches": math.ceil(res.stats["n_train_rows"] / args.batch_size), "loss": st["loss"],
        "grad_norm": st["grad_norm"], "precompute_s": s["precompute_seconds"], "step_s": s["train_seconds"],
        "total_s": round(total, 3), "tokens": s["completion_tokens_trained"],
        "peak_mib": round((_rss_kib("VmHWM") - before) / 1024, 1)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="'tiny' (random, built once under --cache) or a model name/folder")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "spogw-bench-tiny-llama-v1024"))
    ap.add_argument("--queries", type=int, default=4)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--n", type=int, default=14)
    ap.add_argument("--t", type=int, default=4)
    ap.add_argument("--g-max", type=int, default=120)
    ap.add_argument("--completion-tokens", type=int, default=32, help="approximate workflow length in tokens")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--aggregate", type=int, default=None, help=argparse.SUPPRESS)  # child process
    ap.add_argument("--model-path", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tiny", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.aggregate is not None:
        one_mode(args)
        return
    model_path = str(tiny_model(Path(args.cache))) if args.model == "tiny" else args.model
    res = {}
    for agg in (0, 1):
        cmd = [sys.executable, __file__, "--aggregate", str(agg), "--model-path", model_path,
               "--tiny", str(int(args.model == "tiny"))]
        for k in ("queries", "m", "n", "t", "g_max", "completion_tokens", "batch_size", "seed", "threads"):
            v = getattr(args, k)
            if v is not None:
                cmd += [f"--{k.replace('_', '-')}", str(v)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit(f"child (aggregate={agg}) failed with {out.returncode}")
        res[agg] = json.loads([x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])
    a, b = res[0], res[1]
    print(f"model {args.model}; {a['queries']} queries x m = {args.m}: {a['groups']} groups kept of "
          f"{a['groups_formed']} (n = {args.n}, g_max = {args.g_max}), sharpened to 2t = {2 * args.t}: "
          f"{a['rows']} per-group rows of {a['unique']} unique workflows ({a['rows'] / a['unique']:.1f} copies each); "
          f"spogw beta 0.1, batch_size {args.batch_size}, one optimizer step over all rows")
    for name, r in (("per-group", a), ("unique", b)):
        print(f"{name:>9}: rows {r['train_rows']:>5}, micro-batches {r['micro_batches']:>4}, completion tokens "
              f"{r['tokens']:>7}, precompute {r['precompute_s']:7.2f} s, step {r['step_s']:7.2f} s, total "
              f"{r['total_s']:7.2f} s, peak {r['peak_mib']:7.1f} MiB, loss {r['loss']:.8f}, grad_norm {r['grad_norm']:.6f}")
    print(f"first-step loss |diff| = {abs(a['loss'] - b['loss']):.2e}, grad_norm |diff| = {abs(a['grad_norm'] - b['grad_norm']):.2e}")
    print(f"RATIO per-group/unique total time = {a['total_s'] / b['total_s']:.2f}")
    print(f"RATIO per-group/unique step time = {a['step_s'] / b['step_s']:.2f}")


if __name__ == "__main__":
    main()
