"""The pipeline's own config sections, each declared and validated here: benchmark, generator, executor,
execution, report, selection, refinement, comparison, loop. (The reward, curation and training sections are
derived from the core's dataclasses: `core_sections.py`.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_serializer, model_validator

from spogw_dagster.benchmarks import get_spec
from spogw_dagster.bundled_models import all_aliases, find
from spogw_dagster.core.methods.catalog import METHODS, W4S_FEEDBACK_QUERIES, W4S_TURNS
from spogw_dagster.models import ALIASES
from spogw_dagster.pipeline.settings.section_base import Section, drop_defaults
from spogw_dagster.sandboxing.detect import isolation_choices
from spogw_dagster.static_methods import STATIC_METHODS


class BenchmarkSection(Section):
    """Which benchmark; d training queries and h held-out (test) queries from its deterministic splits.

    Training queries are the first `train_queries` of the train split and held-out queries the first
    `heldout_queries` of the test split, both made with `split_seed` and the default split sizes (the same
    test queries `spogw baseline --limit h` scores)."""

    name: str = "humaneval"
    data_path: str | None = None
    split_seed: int = 0
    train_queries: int = Field(10, ge=1)
    heldout_queries: int = Field(20, ge=1)
    # the validation split (disjoint from train and test) on which settings are chosen; None: all of it
    validation_queries: int | None = Field(None, ge=1)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        try:
            return get_spec(v).name
        except ValueError as e:
            raise ValueError(str(e)) from None


class GeneratorSection(Section):
    """The policy being trained: the bundled model ("smollm2") or a local Hugging Face folder."""

    model: str = "smollm2"
    backend: Literal["transformers", "vllm", "auto"] = "transformers"
    temperature: float = Field(1.0, gt=0, le=5)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(128, ge=1)
    batch_size: int = Field(8, ge=1)
    seed: int = 0
    # "auto": bfloat16 where the device computes it natively and it was measured faster, else float32
    # (core/device_paths.dtype_for; the trainer's stats record the type taken)
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    # what the prompt shows besides the operators (workflow/template.PROMPT_STYLES)
    prompt: Literal["examples", "one_example", "operators", "anchored"] = "examples"
    # add the workflows the prompt shows to every training query's samples (off-policy rows scored and grouped
    # like samples; pipeline/domain/anchors.py): each group then holds the structures a policy rarely samples
    anchors: bool = False

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        return drop_defaults(handler(self), prompt="examples", anchors=False)

    @field_validator("model")
    @classmethod
    def _model_exists(cls, v: str) -> str:
        if v.lower() in ALIASES:
            return v.lower()
        p = Path(v).expanduser()
        if p.suffix == ".gguf" and p.is_file():
            return str(p)
        if not p.is_dir():
            raise ValueError(
                f"generator model {v!r} is neither an alias ({', '.join(ALIASES)}) nor an existing local folder; "
                "fix: pass the path of a Hugging Face model folder (config.json + weights + tokenizer)"
            )
        return str(p.resolve())


class ExecutorSection(Section):
    """The LLM the workflows call: the embedded bundled model (url and urls unset; `model` a bundled alias such as
    qwen2.5-coder-0.5b or a .gguf path, default SmolLM2), an OpenAI-compatible
    endpoint (`url`), or a fleet of endpoints serving the same model (`urls`: requests go to the healthy
    endpoint with the fewest in flight; a dead one is skipped and re-probed, its calls retried on the others).
    `url: X` is the same as `urls: [X]`. `max_concurrency` and `timeout_s` apply per endpoint.

    temperature/top_p/max_tokens are the operators' sampling parameters (each call is seeded, so cached)."""

    url: str | None = None
    urls: tuple[str, ...] | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = Field(8, ge=1)
    timeout_s: float = Field(120.0, gt=0)
    cache: bool = True
    cache_file: str = "call_cache.sqlite"  # relative paths are under the assets directory
    temperature: float = Field(0.7, ge=0, le=5)
    top_p: float = Field(0.95, gt=0, le=1)
    max_tokens: int = Field(384, ge=1)
    max_operator_calls: int = Field(16, ge=1)  # per workflow run: a looping workflow cannot run up a bill
    max_llm_calls: int = Field(32, ge=1)
    # the embedded model's llama.cpp servers: workers answer calls side by side, each with `threads` threads;
    # unset: one single-thread worker per core. A call's text depends on `threads`, never on `workers`.
    workers: int | None = Field(None, ge=1, le=64)
    threads: int | None = Field(None, ge=1, le=256)
    # end a code reply where its fenced block closes (the prose after it is never scored): fewer decoded tokens,
    # the same tokens up to the stop, so the same answer unless a reply's last block is not its first
    stop_after_code: bool = False
    # the embedded model only. True: the portable llama.cpp build, one call computed alone: a seeded call gives
    # the same text on any x86-64 CPU. False: the build for this CPU's vector units and n-gram speculation, faster,
    # whose texts may differ from the reproducible mode's (the call cache keys the two apart)
    reproducible: bool = True

    @field_validator("model")
    @classmethod
    def _bundled_alias(cls, v: str | None, info: ValidationInfo) -> str | None:
        # the embedded executor on a bundled model: one spelling per model, so its aliases share a config hash
        if v is None or info.data.get("url") or info.data.get("urls"):
            return v

        m = find(v)
        return m.alias if m is not None else v

    @field_validator("urls")
    @classmethod
    def _fleet(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return None
        if not v:
            raise ValueError("executor.urls is empty: list one or more endpoint URLs, or unset it")
        bad = [u for u in v if not re.match(r"^https?://[^/\s]+", u.strip())]
        if bad:
            raise ValueError(f"executor.urls: not an http(s) URL: {', '.join(map(repr, bad))} "
                             "(e.g. http://10.0.0.1:8000/v1)")
        norm = [u.strip().rstrip("/") for u in v]
        dupes = sorted({u for u in norm if norm.count(u) > 1})
        if dupes:
            raise ValueError(f"executor.urls lists an endpoint twice: {', '.join(dupes)}")
        return tuple(norm)

    @model_validator(mode="after")
    def _url_and_model(self) -> "ExecutorSection":
        if self.url and self.urls:
            raise ValueError("executor.url and executor.urls are both set: give one (url: X is a fleet of one, "
                             "the same as urls: [X]); for several endpoints use urls only")
        if self.urls and not self.model:
            raise ValueError("executor.urls needs executor.model (the one model name every endpoint serves)")
        if self.url and not self.model:
            raise ValueError("executor.url needs executor.model (the model name the endpoint serves)")
        if self.model and not (self.url or self.urls):
            # no endpoint: the embedded executor on a bundled model (an alias) or a local .gguf file
            if find(self.model) is None and not (Path(self.model).expanduser().suffix.lower() == ".gguf"
                      and Path(self.model).expanduser().is_file()):
                raise ValueError(
                    f"executor.model {self.model!r} without executor.url is neither a bundled model "
                    f"({', '.join(all_aliases())}) nor an existing .gguf file; fix: name one of those for the embedded "
                    "executor, or give executor.url (or executor.urls) for an endpoint serving it")
        return self

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        # `urls` unset is left out, so configs written before fleets existed keep their hashes (and assets)
        return drop_defaults(handler(self), urls=None, workers=None, threads=None)

    def endpoints(self) -> list[str]:
        """The endpoint URLs (empty: the embedded model)."""
        return list(self.urls) if self.urls else ([self.url] if self.url else [])


class ExecutionSection(Section):
    """How each workflow runs: R runs averaged, in the sandbox, a few at a time."""

    runs: int = Field(1, ge=1)
    concurrency: int = Field(2, ge=1)
    isolation: str = "auto"  # one of sandboxing.isolation_choices(): auto, a backend's name, or none
    allow_unsandboxed: bool = False
    wall_s: float = Field(180.0, gt=0)
    seed: int = 0
    max_executor_error_rate: float = Field(0.1, ge=0, le=1)  # above it execution_scores fails (writes nothing)
    # runs averaged for `generator.anchors`' rows (None: `runs`): the prompt's fixed workflows score the same in
    # every seed and iteration (their calls are cached), so more runs cost once and steady the anchors' contrast
    anchor_runs: int | None = Field(None, ge=1)

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        return drop_defaults(handler(self), anchor_runs=None)

    @field_validator("isolation")
    @classmethod
    def _known_isolation(cls, v: str) -> str:
        if v not in isolation_choices():
            raise ValueError(f"unknown isolation {v!r}; expected one of {', '.join(isolation_choices())}")
        return v


class ReportSection(Section):
    """The held-out report: workflows for each query of `split` from checkpoint k and from π_{k-1} (the base
    model at k = 0), greedy and/or `samples` per query at `sample_temperature` (default: the generator's
    training temperature), beside static baselines (AFlow's IO, CoT, CoT-SC written as workflows; on code
    benchmarks also the static structures of `spogw baseline`: gen_test, sc3, sc3_test, sc5).

    Sample j of every query uses the same sampler seed and executor seed for both policies (paired). Static
    baselines have no generator: "greedy" is one executor run (seed `seed`, as `spogw baseline`); with
    `baseline_samples` > 0 they also get a "sampled" mode of that many executor seeds per query (the seeds
    sample j of the policies uses). `split` is test (held-out) or validation (choose settings there, never
    on test)."""

    baselines: tuple[Literal[STATIC_METHODS], ...] = ("io", "cot_sc")  # type: ignore[valid-type]
    split: Literal["test", "validation"] = "test"
    greedy: bool = True
    samples: int = Field(4, ge=0, le=256)
    sample_temperature: float | None = Field(None, gt=0, le=5)
    baseline_samples: int = Field(0, ge=0, le=256)
    # executor runs per held-out workflow, its answer the mean (ScoreFlow scores with 3): resolves a paired
    # difference of a few queries that one run's executor sampling hides; None = execution.runs
    runs: int | None = Field(None, ge=1, le=16)
    bootstrap_resamples: int = Field(2000, ge=100)
    seed: int = 0
    max_regression: float = Field(0.1, ge=0, le=1)  # the check warns when the answer score drops more

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        return drop_defaults(handler(self), runs=None)

    @model_validator(mode="after")
    def _some_mode(self) -> "ReportSection":
        if not self.greedy and self.samples == 0:
            raise ValueError("report.greedy is false and report.samples is 0: the report would score nothing; "
                             "set samples >= 1 or greedy: true")
        return self


class SelectionSection(Section):
    """Checkpoint selection on the validation split, as AFlow and ScoreFlow pick on validation (off by default).
    After iteration k trains, the trained adapter and π_{k-1} each write one greedy workflow per validation query,
    run with executor seed `seed` (`runs` runs each, the mean; None: execution.runs). The
    adapter becomes checkpoint k only if its paired answer score minus π_{k-1}'s is at least `min_delta`;
    otherwise π_{k-1} is carried forward as checkpoint k and the trained adapter stays beside it as
    `lora_checkpoint/<k>.trained` (a rerun reuses it; `spogw gc` keeps it while partition k exists). The trainer
    never sees this section: turning it on or off copies the identical finished run between `<k>` and
    `<k>.trained` rather than training again.

    `epochs` (a list; None: training.epochs alone) also picks the training length on validation: the iteration
    trains once per entry (the entry equal to training.epochs in `<k>.trained`, the others in
    `<k>.trained.e<N>`), every trained adapter writes its greedy validation workflows beside π_{k-1}'s, and
    the one with the highest answer score is the candidate the rule above judges (a tie goes to the entry listed
    first). Which length suits an iteration's data differs by training seed (docs/methods.md)."""

    enabled: bool = False
    min_delta: float = Field(0.0, ge=-1.0, le=1.0)
    runs: int | None = Field(None, ge=1, le=16)
    seed: int = 0
    epochs: tuple[int, ...] | None = None

    @model_validator(mode="after")
    def _lengths(self) -> "SelectionSection":
        if self.epochs is not None:
            if not self.epochs or any(e < 1 or e > 100 for e in self.epochs):
                raise ValueError(f"selection.epochs={list(self.epochs)}: give one or more epoch counts between 1 "
                                 "and 100, e.g. [2, 3], or leave it unset to train training.epochs alone")
            if len(set(self.epochs)) != len(self.epochs):
                raise ValueError(f"selection.epochs={list(self.epochs)} repeats a length; list each once")
        return self

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        return drop_defaults(handler(self), epochs=None)

    def lengths(self, training_epochs: int) -> tuple[int, ...]:
        """The training lengths the gate chooses among, in tie-break order."""
        return self.epochs if self.epochs is not None else (training_epochs,)


class RefinementSection(Section):
    """W4S's multi-turn optimisation (`pipeline/domain/refinement.py`). With turns = T > 1, sampled_workflows samples m
    candidates per query (turn 0); a candidate that does not parse gets up to `repairs` repair attempts (W4S's
    self-check); every candidate runs on `feedback_queries` feedback queries (never the training query, whose
    answer is the reward): by default (`feedback_split: train`) the last ones of the train split, which the loop
    does not train on (train_queries + feedback_queries must fit the split), so W4S's feedback never touches
    the validation queries the comparison is judged on; `validation` takes the last ones of the validation
    split, as W4S's code does, and leaves them out of every validation score. The best by feedback accuracy
    advances the state, and turn t samples m candidates from one prompt showing that workflow, its accuracy, up
    to `failure_cases` failures and the change against the previous state. Every turn and repair is a row
    (turn, parent_sample_idx, repair_of, feedback_accuracy), executed and scored like any other. W4S trains with
    RWR on its history-relative reward (training.objective: rwr, `core/methods/w4s.py`). turns = 1: single-shot."""

    turns: int = Field(1, ge=1, le=30)  # W4S's code: 30 iterations; its paper's main table: about 10
    feedback_queries: int = Field(2, ge=1, le=64)
    feedback_split: Literal["train", "validation"] = "train"
    repairs: int = Field(3, ge=0, le=3)  # W4S's debug_max
    failure_cases: int = Field(10, ge=0, le=32)  # W4S shows up to ~10

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        d = handler(self)
        if isinstance(d, dict) and d.get("turns") == 1:  # single-shot reads no feedback: older hashes hold
            d.pop("feedback_split", None)
        return d

    @property
    def enabled(self) -> bool:
        return self.turns > 1


class ComparisonSection(Section):
    """`objective_comparison` (materialized on demand, not by the loop): the methods trained side by side from
    the same parent adapter on the same iteration's data and seeds, each scored on the report's held-out
    queries (`core.methods.catalog` lists them; `spogw` is the reference of the paired differences)."""

    methods: tuple[str, ...] = ("spogw", "grpo", "score_dpo", "rwr")
    # W4S's turns and feedback queries when `w4s` is compared: its paper's by default (`core/methods/catalog.py`;
    # `spogw plan` states what they cost); its feedback comes from `refinement.feedback_split`
    w4s_turns: int = Field(W4S_TURNS, ge=2, le=30)
    w4s_feedback_queries: int = Field(W4S_FEEDBACK_QUERIES, ge=1, le=64)
    # choices between methods are made on validation; `test` once, for the final table (a report of its own)
    split: Literal["test", "validation"] = "validation"

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, data: Any) -> Any:
        """`objectives` was this field's name until 2026-12-05 (it holds methods, not losses): still read."""
        if isinstance(data, dict) and "objectives" in data:
            if "methods" in data:
                raise ValueError("comparison sets both `methods` and `objectives` (its old name): keep `methods`")
            data = {("methods" if k == "objectives" else k): v for k, v in data.items()}
        return data

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in v if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
        if not v:
            raise ValueError("comparison.methods is empty: name at least one method")
        return tuple(dict.fromkeys(v))  # a method twice would be trained twice on the same data


class LoopSection(Section):
    """How the loop runs under `dagster dev` / `dg dev` (no asset reads it, so it is outside the config hash).

    sensor: `next_iteration_sensor` starts in the RUNNING state (it launches iteration k+1 when
    benchmark_report(k) lands); false leaves it STOPPED until someone starts it in the UI."""

    sensor: bool = True
