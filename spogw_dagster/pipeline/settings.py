"""Typed, validated configuration of the pipeline, and its hash.

One `SpogwConfig` describes a whole run of the loop: the benchmark and its splits, the generator (the model
being trained), the executor (the model the workflows call), how workflows are executed and rewarded,
curation (m, n, t, ...), LoRA training, the held-out report and the number of iterations.

It is plain pydantic (no Dagster) so that the CLI, tests and the Dagster resources share it. Profiles
(`profiles.py`) are partial mappings over the defaults; a YAML file may name a `profile:` to start from and
override any field. Every error names the field and the fix (`ConfigValidationError`). The training-core
configs (`CurationConfig`, `TrainConfig`) validate again on construction, so their rules (m >= n >= 2t,
beta >= 0, ...) are enforced here too, with their own messages.

`config_hash` is the sha256 of the canonical JSON of the whole config; `section_hash` covers only the sections
an asset depends on (its code version uses it, so changing e.g. the report's baselines does not make the
sampled workflows stale).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
import typing
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from spogw_dagster.benchmarks import get_spec
from spogw_dagster.bundled_models import all_aliases, find
from spogw_dagster.core.hyperparams import ConfigError, CurationConfig
from spogw_dagster.core.methods.catalog import METHODS, W4S_FEEDBACK_QUERIES, W4S_TURNS
from spogw_dagster.core.rewards import Ladder
from spogw_dagster.core.training import TrainConfig, registry
from spogw_dagster.core.training.config import drop_default_off_policy
from spogw_dagster.models import ALIASES
from spogw_dagster.pipeline.profiles import get_profile, profile_names
from spogw_dagster.sandboxing.detect import isolation_choices
from spogw_dagster.static_methods import CODE_STRUCTURES, STATIC_METHODS
from spogw_dagster.workflow.template import shown_workflows

__all__ = [
    "ConfigValidationError",
    "SpogwConfig",
    "load_config",
    "config_hash",
    "section_hash",
    "ASSET_SECTIONS",
]


def _drop_defaults(d: Any, **defaults: Any) -> Any:
    """A section's serialized dict without the fields that hold the value they had before the field existed:
    configs written earlier keep their hashes (and their assets)."""
    if isinstance(d, dict):
        for name, default in defaults.items():
            if name in d and d[name] == default and type(d[name]) is type(default):
                d.pop(name)
    return d

class ConfigValidationError(ValueError):
    """The configuration is invalid; the message lists every problem with its field path."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BenchmarkSection(_Section):
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


class GeneratorSection(_Section):
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
        return _drop_defaults(handler(self), prompt="examples", anchors=False)

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


class ExecutorSection(_Section):
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
        return _drop_defaults(handler(self), urls=None, workers=None, threads=None)

    def endpoints(self) -> list[str]:
        """The endpoint URLs (empty: the embedded model)."""
        return list(self.urls) if self.urls else ([self.url] if self.url else [])


class ExecutionSection(_Section):
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
        return _drop_defaults(handler(self), anchor_runs=None)

    @field_validator("isolation")
    @classmethod
    def _known_isolation(cls, v: str) -> str:
        if v not in isolation_choices():
            raise ValueError(f"unknown isolation {v!r}; expected one of {', '.join(isolation_choices())}")
        return v


def _derived(core_cls: type, *, exclude: tuple[str, ...] = ()) -> type[_Section]:
    """A config section with exactly the fields (types and defaults) of a core dataclass config, so each field
    is declared once, in the core; its values are validated by the core class itself (see `SpogwConfig._cross`)."""
    hints = typing.get_type_hints(core_cls)
    spec = {f.name: (hints[f.name], f.default) for f in dataclasses.fields(core_cls) if f.name not in exclude}
    return create_model(f"_{core_cls.__name__}Fields", __base__=_Section, **spec)  # type: ignore[call-overload]


# The training temperature and dtype are not settable: π_old must match the sampler, so both are the generator's.
TRAINING_FROM_GENERATOR = ("temperature", "dtype")
# The training section's fields that are the pipeline's, not the trainer's (`TrainConfig` has none of them)
PIPELINE_TRAINING_FIELDS = ("processes", "min_queries")


class RewardSection(_derived(Ladder)):  # type: ignore[misc]
    """FloWright-style reward ladder r = format·w_f + valid·w_v + executes·w_e + answer·w_a: the fields of
    `core.rewards.Ladder` (see it for their meaning and bounds)."""

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        return _drop_defaults(handler(self), call_cost=0.0)

    def core(self) -> Ladder:
        return Ladder(**self.model_dump())


class CurationSection(_derived(CurationConfig)):  # type: ignore[misc]
    """The fields of `core.hyperparams.CurationConfig` (see it for their meaning and defaults)."""

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        return _drop_defaults(handler(self), adv_std_floor=0.0, valid_only=False, anchor_groups="mixed",
                              anchor_weight=1.0)

    def core(self) -> CurationConfig:
        return CurationConfig(**self.model_dump())


class TrainingSection(_derived(TrainConfig, exclude=TRAINING_FROM_GENERATOR)):  # type: ignore[misc]
    """The fields of `core.training.TrainConfig` (see it, and `core.hyperparams.ObjectiveConfig` for the objective's)
    except the temperature and dtype, which are the generator's; plus `processes`: how many processes train
    the adapter together (`accelerate launch`, one per GPU; `core.training.launch`). It changes how the adapter is
    computed, not what (the same run up to float rounding), so it is outside the config hash and the run hash;
    it needs lora_dropout = 0 (dropout masks are drawn per process)."""

    processes: int = Field(1, ge=1)
    # Train only when the iteration's training rows cover at least this many queries, else carry π_{k-1}
    # forward (as with no data). Once a policy concentrates, the near-duplicate screen can leave a few groups
    # of one query, and a few steps on them move the greedy policy anywhere (run J: docs/methods.md)
    min_queries: int = Field(1, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _not_from_generator(cls, data: Any) -> Any:
        for name in TRAINING_FROM_GENERATOR:
            if isinstance(data, Mapping) and name in data:
                raise ValueError(f"training.{name} is taken from generator.{name} (π_old must match the sampler); "
                                 f"remove it, or set generator.{name}")
        return data

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        d = handler(self)
        # only rwr reads it: other objectives keep their hash; an rwr config's hash changes with it (its
        # reward used to be the ladder score, so its old results are not this method's)
        obj = d.get("objective") if isinstance(d, dict) else None
        if isinstance(d, dict) and (obj not in registry.names() or registry.get(obj).data != "candidates"):
            d.pop("rwr_reward", None)
        if isinstance(d, dict) and d.get("min_queries") == 1:  # the default: older configs keep their hash
            d.pop("min_queries")
        if isinstance(d, dict):  # likewise
            drop_default_off_policy(d)
        return d

    def core(self, temperature: float, dtype: str = "float32") -> TrainConfig:
        # the fields themselves, not model_dump (whose hash-stable form leaves some out); the pipeline's own
        # fields are not the trainer's
        fields = {k: getattr(self, k) for k in type(self).model_fields if k not in PIPELINE_TRAINING_FIELDS}
        return TrainConfig.from_dict({**fields, "temperature": float(temperature), "dtype": dtype})


class ReportSection(_Section):
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
        return _drop_defaults(handler(self), runs=None)

    @model_validator(mode="after")
    def _some_mode(self) -> "ReportSection":
        if not self.greedy and self.samples == 0:
            raise ValueError("report.greedy is false and report.samples is 0: the report would score nothing; "
                             "set samples >= 1 or greedy: true")
        return self


class SelectionSection(_Section):
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
        return _drop_defaults(handler(self), epochs=None)

    def lengths(self, training_epochs: int) -> tuple[int, ...]:
        """The training lengths the gate chooses among, in tie-break order."""
        return self.epochs if self.epochs is not None else (training_epochs,)


class RefinementSection(_Section):
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


class ComparisonSection(_Section):
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


class LoopSection(_Section):
    """How the loop runs under `dagster dev` / `dg dev` (no asset reads it, so it is outside the config hash).

    sensor: `next_iteration_sensor` starts in the RUNNING state (it launches iteration k+1 when
    benchmark_report(k) lands); false leaves it STOPPED until someone starts it in the UI."""

    sensor: bool = True


class SpogwConfig(BaseModel):
    """The whole pipeline configuration. Build with `load_config` (profiles, files, overrides)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = "custom"
    iterations: int = Field(2, ge=1, le=9999)
    benchmark: BenchmarkSection = BenchmarkSection()
    generator: GeneratorSection = GeneratorSection()
    executor: ExecutorSection = ExecutorSection()
    execution: ExecutionSection = ExecutionSection()
    reward: RewardSection = RewardSection()
    curation: CurationSection = CurationSection()
    training: TrainingSection = TrainingSection()
    report: ReportSection = ReportSection()
    loop: LoopSection = LoopSection()
    comparison: ComparisonSection = ComparisonSection()
    refinement: RefinementSection = RefinementSection()
    selection: SelectionSection = SelectionSection()

    @model_validator(mode="after")
    def _cross(self) -> "SpogwConfig":
        try:
            self.curation.core()
        except ConfigError as e:
            raise ValueError(f"curation: {e}") from None
        try:
            self.reward.core()
        except ValueError as e:
            raise ValueError(f"reward: {e}") from None
        try:
            self.training.core(self.generator.temperature, self.generator.dtype)
        except (ConfigError, ValueError) as e:
            raise ValueError(f"training: {e}") from None
        if self.training.processes > 1 and self.training.lora_dropout > 0:
            raise ValueError(f"training.processes={self.training.processes} with training.lora_dropout="
                             f"{self.training.lora_dropout}: each process would draw other dropout masks than one "
                             "process does, so the run would not be the 1-process run; set lora_dropout: 0 or "
                             "processes: 1")
        if self.training.min_queries > self.benchmark.train_queries:
            raise ValueError(f"training.min_queries={self.training.min_queries} is more than benchmark.train_queries="
                             f"{self.benchmark.train_queries}: no iteration could ever train; lower min_queries")
        if self.generator.anchors and not shown_workflows(get_spec(self.benchmark.name).family, self.generator.prompt):
            raise ValueError(f"generator.anchors adds the workflows the prompt shows, and prompt "
                             f"{self.generator.prompt!r} shows none that every query shares; set generator.prompt "
                             "to 'anchored' or 'examples', or anchors to false")
        if self.training.off_policy_loss != "clipped":
            if not self.generator.anchors:
                raise ValueError(f"training.off_policy_loss={self.training.off_policy_loss!r} is the anchors' loss, "
                                 "and generator.anchors is off (every row is a sample); set generator.anchors: "
                                 "true, or remove off_policy_loss")
            if registry.get(self.training.objective).data != "groups":
                raise ValueError(f"training.off_policy_loss applies to the GRPO family's group rows; objective "
                                 f"{self.training.objective!r} trains on other data; remove it or choose spogw, "
                                 "grpo or grpo_nokl")
        structures = [b for b in self.report.baselines if b in CODE_STRUCTURES]
        if structures and get_spec(self.benchmark.name).family != "code":
            raise ValueError(f"report.baselines {structures} are static structures of the code operators, and "
                             f"{self.benchmark.name!r} is not a code benchmark; remove them")
        if not self.generator.anchors:
            for name, on in (("curation.anchor_groups", self.curation.anchor_groups != "mixed"),
                             ("execution.anchor_runs", self.execution.anchor_runs is not None)):
                if on:
                    raise ValueError(f"{name} applies to the prompt's own workflows, and generator.anchors is off "
                                     "(no row is an anchor); set generator.anchors: true, or remove it")
        if self.selection.epochs is not None and not self.selection.enabled:
            raise ValueError(f"selection.epochs={list(self.selection.epochs)} picks the training length on "
                             "validation, and selection is off; set selection.enabled: true, or remove epochs")
        if self.generator.anchors and self.refinement.enabled:
            raise ValueError("generator.anchors with W4S refinement (refinement.turns > 1): a turn's candidates are "
                             "sampled from the state's prompt, which shows no anchors; set one of them off")
        if self.benchmark.data_path is None:
            if get_spec(self.benchmark.name).needs_path:
                raise ValueError(f"benchmark {self.benchmark.name!r} ships in no package: set benchmark.data_path "
                                 "to its data file")
        return self

    # -- conveniences ---------------------------------------------------------------------------

    def report_temperature(self) -> float:
        """The temperature of the report's sampled mode: report.sample_temperature, else the training one."""
        t = self.report.sample_temperature
        return float(self.generator.temperature if t is None else t)

    def feedback_queries(self) -> int:
        """How many feedback queries W4S's turns take (the loop's own turns, the comparison's `w4s`, or both:
        the larger), 0 when neither runs."""
        loop = self.refinement.feedback_queries if self.refinement.enabled else 0
        comp = self.comparison.w4s_feedback_queries if "w4s" in self.comparison.methods else 0
        return max(loop, comp)

    def reserved_validation(self, split: str = "validation") -> int:
        """How many queries at the end of `split` are W4S's feedback queries, and so never scored: on the
        validation split with `refinement.feedback_split: validation`, `feedback_queries()`; else 0."""
        if split == "validation" and self.refinement.feedback_split == "validation":
            return self.feedback_queries()
        return 0

    def curation_config(self):
        return self.curation.core()

    def train_config(self):
        return self.training.core(self.generator.temperature, self.generator.dtype)

    def canonical(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())

    @property
    def hash(self) -> str:
        return config_hash(self)


# Sections each asset's output depends on (its code version and `section_hash` use them).
ASSET_SECTIONS: dict[str, tuple[str, ...]] = {
    "sampled_workflows": ("benchmark", "generator", "curation", "refinement"),
    "execution_scores": ("benchmark", "executor", "execution", "reward"),
    "screened_groups": ("curation",),
    "sharpened_groups": ("curation",),
    "lora_checkpoint": ("generator", "training"),
    "benchmark_report": ("benchmark", "generator", "executor", "execution", "reward", "report"),
    "objective_comparison": ("benchmark", "generator", "executor", "execution", "reward", "curation", "training",
                             "report", "comparison"),
}


def _canon_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(cfg: SpogwConfig) -> str:
    d = _hashed(cfg)
    # Neither changes what any asset computes: the profile is a name, `iterations` only how far the loop goes.
    d.pop("profile", None)
    d.pop("iterations", None)
    d.pop("loop", None)  # whether the sensor starts running changes no asset's output
    d.pop("comparison", None)  # only objective_comparison reads it (its code version covers it); what it
    # reserves of the validation split reaches the report and the gate through _hashed
    return hashlib.sha256(_canon_json(d).encode()).hexdigest()


def asset_sections(cfg: SpogwConfig, asset: str) -> tuple[str, ...]:
    """The sections `asset` reads under `cfg`: with refinement on, sampling also runs workflows for feedback."""
    if asset == "sampled_workflows" and cfg.refinement.enabled:
        return ASSET_SECTIONS[asset] + ("executor", "execution", "reward")
    if asset == "lora_checkpoint" and cfg.selection.enabled:  # the gate runs the executor on validation,
        # whose queries W4S's feedback may reserve (the count, from refinement or comparison, is in `selection`)
        return ASSET_SECTIONS[asset] + ("selection", "benchmark", "executor", "execution", "reward", "refinement")
    return ASSET_SECTIONS[asset]


def _hashed(cfg: SpogwConfig) -> dict[str, Any]:
    """The canonical config as hashed: refinement left out while it is off, so configs written before it
    existed keep their hashes (and their assets)."""
    d = cfg.canonical()
    if not cfg.refinement.enabled:
        d.pop("refinement", None)
    if not cfg.selection.enabled:  # the same for selection: earlier configs keep their hashes
        d.pop("selection", None)
    # The validation split less W4S's feedback queries is what the gate, a validation report and the comparison
    # score; the count can come from `comparison`, which no asset but objective_comparison hashes. Only a
    # non-zero count is written, so every config that reserves nothing keeps its hash.
    for section, split in (("selection", "validation"), ("report", cfg.report.split),
                           ("comparison", cfg.comparison.split)):
        if section in d and (reserved := cfg.reserved_validation(split)):
            d[section]["reserved_validation"] = reserved
    d["training"].pop("processes", None)  # how the adapter is computed, not what (TrainingSection)
    d["training"].pop("shared_prompt", None)  # the same: how a batch is computed (core/device_paths.py)
    d["executor"] = executor_identity(d["executor"])
    return d


def executor_identity(executor: dict[str, Any]) -> dict[str, Any]:
    """The canonical executor section (`cfg.canonical()["executor"]`) as hashes see it. Where the call cache
    lives is storage, not configuration: `--seeds` points every seed at one shared file, so with the path hashed
    a copied or moved `--seeds` run got another hash and redid finished iterations (and missed its cached
    baselines). It counts as the default, so runs that never set it keep their hashes. The speed levers
    (`stop_after_code`, `reproducible`) are written only when they differ from their defaults: every config
    written before them keeps its hash and its cached baselines."""
    out = {**executor, "cache_file": ExecutorSection.model_fields["cache_file"].default}
    for lever in ("stop_after_code", "reproducible"):
        if out.get(lever) == ExecutorSection.model_fields[lever].default:
            out.pop(lever, None)
    return out


def section_hash(cfg: SpogwConfig, asset: str) -> str:
    d = _hashed(cfg)
    return hashlib.sha256(_canon_json({s: d[s] for s in asset_sections(cfg, asset) if s in d}).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------
# loading


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_env(obj: Any, where: str = "") -> Any:
    """Replace ${VAR} in strings by the environment variable; a missing one is a clear error."""
    if isinstance(obj, dict):
        return {k: _expand_env(v, f"{where}.{k}" if where else str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_expand_env(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, str):
        def sub(m: re.Match) -> str:
            name = m.group(1)
            if name not in os.environ:
                raise ConfigValidationError(f"{where}: environment variable {name} is not set; fix: export {name}=...")
            return os.environ[name]

        return _ENV.sub(sub, obj)
    return obj


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _fields_at(loc: tuple) -> list[str]:
    """The field names of the section at `loc` (a path of section names from the top)."""
    model: Any = SpogwConfig
    for part in loc:
        model = model.model_fields[part].annotation
    return sorted(model.model_fields)


def _format_errors(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(config)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown field; valid fields here: {', '.join(_fields_at(err['loc'][:-1]))}"
        got = err.get("input")
        extra = f" (got {got!r})" if err["type"] not in ("value_error",) and not isinstance(got, dict) else ""
        lines.append(f"  {loc}: {msg}{extra}")
    return "invalid configuration:\n" + "\n".join(lines)


def parse_config(data: Mapping[str, Any]) -> SpogwConfig:
    """Validate a full mapping (after profile merging); raise ConfigValidationError with every problem."""
    try:
        return SpogwConfig.model_validate(_expand_env(dict(data)))
    except ValidationError as e:
        raise ConfigValidationError(_format_errors(e)) from None


def load_config(
    profile: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SpogwConfig:
    """Profile defaults, then the YAML file (which may name its own `profile:` to start from), then overrides.

    With neither a profile nor a file, the `tiny` profile is used."""
    file_data: dict[str, Any] = {}
    if config_file is not None:
        p = Path(config_file).expanduser()
        if not p.is_file():
            raise ConfigValidationError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigValidationError(f"config file {p} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigValidationError(f"config file {p} must hold a mapping at the top level, got {type(loaded).__name__}")
        file_data = loaded
    name = profile or file_data.get("profile") or ("custom" if config_file and not file_data.get("profile") else "tiny")
    if profile and file_data.get("profile") and file_data["profile"] != profile:
        raise ConfigValidationError(
            f"--profile {profile!r} conflicts with `profile: {file_data['profile']}` in {config_file}; give one")
    base = get_profile(name) if name != "custom" else {}
    if base is None:
        raise ConfigValidationError(f"unknown profile {name!r}; choose one of {', '.join(profile_names())}, "
                                    "or pass a YAML file with --config")
    # each layer's old names first, so a file's `objectives` and an override's `methods` merge as one key
    data = deep_merge(base, _renamed(file_data))
    data = deep_merge(data, _renamed(dict(overrides or {})))
    data["profile"] = name
    return parse_config(data)


def _renamed(layer: dict[str, Any]) -> dict[str, Any]:
    """`layer` with `comparison.objectives` (the old name) read as `comparison.methods`."""
    comp = layer.get("comparison")
    if not isinstance(comp, dict) or "objectives" not in comp:
        return layer
    try:
        return {**layer, "comparison": ComparisonSection._old_name(comp)}
    except ValueError as e:
        raise ConfigValidationError(str(e)) from None
