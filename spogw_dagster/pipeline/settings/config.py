"""The whole configuration, `SpogwConfig`: one section per concern, the rules that span sections
(`_cross`), and the conveniences the pipeline asks of it."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spogw_dagster.benchmarks import get_spec
from spogw_dagster.core.hyperparams import ConfigError
from spogw_dagster.core.training import registry
from spogw_dagster.pipeline.settings.core_sections import CurationSection, RewardSection, TrainingSection
from spogw_dagster.pipeline.settings.hashing import config_hash
from spogw_dagster.pipeline.settings.sections import (
    BenchmarkSection,
    ComparisonSection,
    ExecutionSection,
    ExecutorSection,
    GeneratorSection,
    LoopSection,
    RefinementSection,
    ReportSection,
    SelectionSection,
)
from spogw_dagster.static_methods import CODE_STRUCTURES
from spogw_dagster.workflow.template import shown_workflows


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
        if self.training.anchor_stop is not None and not (
                self.generator.anchors and registry.get(self.training.objective).data == "groups"):
            raise ValueError("training.anchor_stop stops when the anchors' verdict is taken, and this config trains "
                             "no anchors in groups; set generator.anchors: true with objective spogw, grpo or "
                             "grpo_nokl, or remove anchor_stop")
        if self.training.anchor_stop is None and self.training.anchor_stop_margin:
            raise ValueError("training.anchor_stop_margin is the margin of anchor_stop, which is off; set "
                             "training.anchor_stop (e.g. 0.8) or remove anchor_stop_margin")
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
