"""The config sections derived from the core's dataclasses, so each field is declared once, in the core:
`reward:` from `core.rewards.Ladder`, `curation:` from `core.hyperparams.CurationConfig`, `training:` from
`core.training.TrainConfig` (less what the generator decides, plus the pipeline's own fields). `core()` turns a
section into the core's config, which validates it again."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping

from pydantic import Field, create_model, model_serializer, model_validator

from spogw_dagster.core.hyperparams import CurationConfig
from spogw_dagster.core.rewards import Ladder
from spogw_dagster.core.training import TrainConfig, registry
from spogw_dagster.core.training.config import drop_inactive_anchor_fields
from spogw_dagster.pipeline.settings.section_base import Section, drop_defaults


def _derived(core_cls: type, *, exclude: tuple[str, ...] = ()) -> type[Section]:
    """A config section with exactly the fields (types and defaults) of a core dataclass config, so each field
    is declared once, in the core; its values are validated by the core class itself (see `SpogwConfig._cross`)."""
    hints = typing.get_type_hints(core_cls)
    spec = {f.name: (hints[f.name], f.default) for f in dataclasses.fields(core_cls) if f.name not in exclude}
    return create_model(f"_{core_cls.__name__}Fields", __base__=Section, **spec)  # type: ignore[call-overload]


# The training temperature and dtype are not settable: π_old must match the sampler, so both are the generator's.
TRAINING_FROM_GENERATOR = ("temperature", "dtype")
# The training section's fields that are the pipeline's, not the trainer's (`TrainConfig` has none of them)
PIPELINE_TRAINING_FIELDS = ("processes", "min_queries")


class RewardSection(_derived(Ladder)):  # type: ignore[misc]
    """FloWright-style reward ladder r = format·w_f + valid·w_v + executes·w_e + answer·w_a: the fields of
    `core.rewards.Ladder` (see it for their meaning and bounds)."""

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        return drop_defaults(handler(self), call_cost=0.0)

    def core(self) -> Ladder:
        return Ladder(**self.model_dump())


class CurationSection(_derived(CurationConfig)):  # type: ignore[misc]
    """The fields of `core.hyperparams.CurationConfig` (see it for their meaning and defaults)."""

    @model_serializer(mode="wrap")
    def _hash_stable(self, handler: Any) -> dict[str, Any]:
        return drop_defaults(handler(self), adv_std_floor=0.0, valid_only=False, anchor_groups="mixed",
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
            drop_inactive_anchor_fields(d)
        return d

    def core(self, temperature: float, dtype: str = "float32") -> TrainConfig:
        # the fields themselves, not model_dump (whose hash-stable form leaves some out); the pipeline's own
        # fields are not the trainer's
        fields = {k: getattr(self, k) for k in type(self).model_fields if k not in PIPELINE_TRAINING_FIELDS}
        return TrainConfig.from_dict({**fields, "temperature": float(temperature), "dtype": dtype})
