"""Hyperparameters of the curation pipeline and of the training objectives, validated on construction.

Every value of the algorithm that the paper leaves open is a field here, with the default we chose and why.
Both classes are plain frozen dataclasses (no Dagster, no torch) so that a Dagster `Config`, a YAML file or a
test can build them with `CurationConfig(**mapping)` / `CurationConfig.from_dict(mapping)`. A bad value raises
`ConfigError` (a `ValueError`) whose message names the field, the value and the fix.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from .training import registry

__all__ = [
    "ConfigError",
    "CurationConfig",
    "ObjectiveConfig",
]

RWR_REWARDS: tuple[str, ...] = ("w4s", "score")


class ConfigError(ValueError):
    """A hyperparameter is out of range or inconsistent with another one."""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def _require_int(cls: str, name: str, value: Any) -> None:
    if not _is_int(value):
        raise ConfigError(f"{cls}.{name} must be an integer, got {value!r} ({type(value).__name__}).")


def _require_real(cls: str, name: str, value: Any) -> None:
    if not _is_real(value):
        raise ConfigError(f"{cls}.{name} must be a finite number, got {value!r}.")


class _FromDict:
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        """Build from a mapping; unknown keys are an error (a typo must not silently fall back to a default)."""
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"{cls.__name__}: unknown field(s) {unknown}; valid fields are {sorted(names)}."
            )
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


ANCHOR_GROUPINGS = ("mixed", "contrast")


@dataclass(frozen=True)
class CurationConfig(_FromDict):
    """Filtering, grouping, screening, sharpening and advantages (the algorithm as docs/algorithm.md specifies it).

    m         workflows sampled per query (paper: 16). Curation itself works with however many usable rows a
              query has; m is checked against n and 2t so that an impossible setting fails before sampling.
    n         group size before sharpening (paper: 14 of 16).
    t         sharpening keeps the top-t and bottom-t of each group, so a sharpened group has 2t members.
              The paper does not give t; 4 (groups of 8, TRL's default group size) is our default.
    g_max     at most this many groups per query; all C(m', n) groups are enumerated when C(m', n) <= g_max,
              else g_max distinct groups are sampled uniformly with a seeded RNG. Default 120 = C(16, 14), so
              the paper's setting enumerates every group.
    tau_sim   near-duplicate threshold on normalised-code similarity (0 < tau_sim <= 1); 1.0 drops only
              workflows whose normalised code is identical. Default 0.95.
    tau_std   screening keeps a group iff its score std >= tau_std (0 keeps every group, also equal-score ones).
              Default 0.05: drops equal-score groups and keeps a 14-group with one workflow at 1/3 (std 0.086).
    adv_eps   the ε in Â = (s − mean)/(std + ε). Default 1e-4, TRL's value.
    adv_std_floor
              a floor f on the std in the advantage: Â = (s − mean)/(max(std, f) + ε). Default 0 (plain GRPO). With
              a reward ladder, σ-normalisation gives a group that differs only in a low rung (valid 0.15 vs
              0.05) the same ±1 as one that differs in the answer; a floor near the answer's weight / 3 keeps
              small contrasts small (0.15 vs 0.05 with f = 0.25: ±0.2) and leaves answer contrasts at ±1.
    std_ddof  0 = population std (divide by k), 1 = sample std (divide by k − 1); used for screening and for
              the advantage. Default 0: with 2t = 2 the advantages are exactly ±1/(1+2ε) for distinct scores.
              (TRL's GRPO uses the sample std.)
    dedup_sharpened_groups
              when True, a sharpened group whose member set equals an earlier kept group of the same query is
              dropped with reason "duplicate_of_group:<group_id>". Overlapping n-subsets often sharpen to the
              same 2t workflows; the paper keeps them all (it weights extreme workflows by how often they are
              extreme), so the default is False.
    valid_only
              when True, workflows that never ran because none was extracted (format_error) or the validator
              refused them (invalid) leave before grouping (reason "not_valid"): groups compare what valid
              workflows do (the answer, and whether the run raised), and a frequent structure is not credited
              merely for parsing where its group's other members did not. What it gives up: nothing teaches
              validity, and an invalid workflow gets no advantage where a valid one that raises gets a
              negative one, so use it where the generator's greedy output is already valid.
              Default False (the paper keeps every scored workflow). Only the GRPO family's groups: ScoreFlow's
              pairs and W4S's candidates are drawn as their papers draw them.
    anchor_groups
              how rows marked `anchor` (the prompt's own workflows, `generator.anchors`) are grouped. "mixed" (default):
              like samples, in the same n-groups. "contrast": a query's anchors form one group of their own (all of
              them, no sharpening, never near-duplicates of a sample) whose advantages are zero-sum among the
              anchors; the samples form their n-groups without them. In "mixed", anchors that share an opening
              all get positive advantage in a group of weaker samples, so the token that decides between them gets
              the small difference of their sums; "contrast" gives it the anchors' own score difference.
    anchor_weight
              with "contrast", the anchor groups' advantages are multiplied by this (default 1). A query's
              anchor group holds 3 rows against up to g_max x 2t sampled rows, and where the anchors answer
              differently the samples' groups still outweigh them; > 1 lets the contrast decide the structure.
    seed      seed of group sampling (combined with iteration and query id, so groups do not depend on row order).
    """

    m: int = 16
    n: int = 14
    t: int = 4
    g_max: int = 120
    tau_sim: float = 0.95
    tau_std: float = 0.05
    adv_eps: float = 1e-4
    adv_std_floor: float = 0.0
    std_ddof: int = 0
    dedup_sharpened_groups: bool = False
    valid_only: bool = False
    anchor_groups: str = "mixed"
    anchor_weight: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        c = type(self).__name__
        for name in ("m", "n", "t", "g_max", "std_ddof", "seed"):
            _require_int(c, name, getattr(self, name))
        for name in ("tau_sim", "tau_std", "adv_eps", "adv_std_floor", "anchor_weight"):
            _require_real(c, name, getattr(self, name))
        if not 0.0 <= self.adv_std_floor <= 1.0:
            raise ConfigError(f"{c}.adv_std_floor={self.adv_std_floor}: a floor on the std of scores in [0, 1] "
                              "must lie in [0, 1]; use 0 for plain GRPO advantages.")
        for name in ("dedup_sharpened_groups", "valid_only"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{c}.{name} must be True or False, got {getattr(self, name)!r}.")
        if not self.anchor_weight > 0:
            raise ConfigError(f"{c}.anchor_weight={self.anchor_weight}: a weight on the anchors' advantages must be > 0.")
        if self.anchor_weight != 1.0 and self.anchor_groups != "contrast":
            raise ConfigError(f"{c}.anchor_weight={self.anchor_weight} weighs the anchors' own groups, and anchor_groups "
                              f"is {self.anchor_groups!r}; set anchor_groups to 'contrast', or remove anchor_weight.")
        if self.anchor_groups not in ANCHOR_GROUPINGS:
            raise ConfigError(f"{c}.anchor_groups={self.anchor_groups!r}: choose one of {', '.join(ANCHOR_GROUPINGS)}.")
        if self.t < 1:
            raise ConfigError(
                f"{c}.t={self.t}: sharpening keeps the top-t and bottom-t workflows, so t must be >= 1; set t >= 1."
            )
        if self.n < 2 * self.t:
            raise ConfigError(
                f"{c}.n={self.n} < 2t={2 * self.t}: a group of n workflows cannot be sharpened to its top-{self.t} "
                f"and bottom-{self.t}; set n >= 2t (or lower t to <= {self.n // 2})."
            )
        if self.m < self.n:
            raise ConfigError(
                f"{c}.m={self.m} < n={self.n}: groups of n are drawn from the m workflows sampled per query; "
                f"set m >= n (or lower n to <= {self.m})."
            )
        if self.g_max < 1:
            raise ConfigError(f"{c}.g_max={self.g_max}: at least one group per query is needed; set g_max >= 1.")
        if not (0.0 < self.tau_sim <= 1.0):
            raise ConfigError(
                f"{c}.tau_sim={self.tau_sim}: a similarity threshold must satisfy 0 < tau_sim <= 1 "
                f"(1.0 drops only identical normalised code); choose a value in (0, 1]."
            )
        if self.tau_std < 0.0:
            raise ConfigError(
                f"{c}.tau_std={self.tau_std}: a standard deviation threshold must be >= 0 "
                f"(0 keeps every group); set tau_std >= 0."
            )
        if self.adv_eps < 0.0:
            raise ConfigError(f"{c}.adv_eps={self.adv_eps}: the advantage ε must be >= 0; set adv_eps >= 0.")
        if self.std_ddof not in (0, 1):
            raise ConfigError(
                f"{c}.std_ddof={self.std_ddof}: use 0 (population std) or 1 (sample std)."
            )

    @property
    def sharpened_size(self) -> int:
        return 2 * self.t


# how off-policy rows (anchors) enter the GRPO family's loss (ObjectiveConfig.off_policy_loss)
OFF_POLICY_LOSSES = ("clipped", "shaped", "log_prob")


@dataclass(frozen=True)
class ObjectiveConfig(_FromDict):
    """Loss selection and its hyperparameters (the algorithm as docs/algorithm.md specifies it). The only declaration of these fields:
    `core.training.TrainConfig` inherits them, and the pipeline's `training:` section is derived from that.

    objective    the name of a registered objective (`core.training.registry`: spogw, grpo, grpo_nokl, score_dpo, rwr).
    beta         KL coefficient β of spogw/grpo (paper's best: 0.1). `grpo_nokl` ignores it (β = 0).
    clip_eps     ε_c of the clipped surrogate: ρ is clipped to [1 − ε_c, 1 + ε_c]. Default 0.2 (TRL, PPO).
    dpo_beta     β of Score-DPO (ScoreFlow: 0.1).
    dpo_pair_power
                 pairs are sampled with probability ∝ (s_w − s_l)^power (ScoreFlow: 3).
    dpo_num_pairs
                 ScoreFlow's pair budget per iteration: pairs drawn with replacement, ∝ (s_w − s_l)^power, from
                 all candidate pairs of all training queries (`curation.sample_preference_pairs`); None = as many
                 draws as there are candidate pairs (pairs of a query's scored workflows with different scores).
                 Default None. ScoreFlow fixes 2000 draws (600 for HumanEval) whatever the number of pairs: its
                 HumanEval run draws 600 for 33 queries, about 18.2 a query (of at most C(8, 2) = 28 candidate
                 pairs a query). The profiles copy that rate: 291 ≈ 18.2 × 16 queries (tiny, answers), 1182 ≈
                 18.2 × 65 (paper). None draws once per candidate pair, up to C(m, 2) a query (28 at m = 8, 120 at
                 m = 16), which is not ScoreFlow's rate; `ci` keeps it (2 queries × 4 workflows, at most 12
                 pairs: a smoke test). Each pair is two training rows. (The pure loss `objectives.score_dpo` called without explicit pairs also reads
                 it as its in-batch draw count; the trainer always passes explicit pairs.)
    rwr_temperature
                 W4S weight exp(r / T); T = 0.4 (W4S default).
    rwr_normalize_weights
                 False (W4S): raw weights exp(r/T). True: divide by their batch mean (self-normalised RWR).
    rwr_reward   the reward r of rwr: "w4s" (default, as W4S publishes it: history-relative, `core.methods.w4s`: 1 for
                 beating the best answer so far, 0.5 for beating the previous state, 0 otherwise, 0.1 less below
                 accuracy 0.3) or "score" (the row's absolute ladder score).
    seed         seed of score_dpo's pair sampling (combined with the iteration in the pipeline).
    off_policy_loss
                 the token term of off-policy rows (the GRPO family; in the pipeline, the anchors of
                 `generator.anchors`, which were not sampled from π_old). "clipped" (default): the clipped ratio,
                 as a sample. "shaped": LUFFY's policy shaping Â·π_θ/(π_θ + γ), no clip. "log_prob": Â·log π_θ
                 where Â > 0 (the clipped term's gradient at ρ = 1, kept past 1 + ε_c), the clipped term where
                 Â < 0. Why: the clip stops an anchor's rare tokens at 1 + ε_c times their π_old, and the
                 structure an anchor shows is decided by such a token (docs/algorithm.md).
    off_policy_gamma
                 γ of "shaped" (LUFFY: 0.1).

    Log-probs: score_dpo and rwr compute π_θ and π_ref at T = 1, as ScoreFlow (TRL's DPO trainer) and W4S
    (plain HF cross-entropy) do; the GRPO family at the sampling temperature, so that π_θ/π_old is the ratio
    of the policy that sampled (`logprob_temperature`).
    """

    objective: str = "spogw"
    beta: float = 0.1
    clip_eps: float = 0.2
    dpo_beta: float = 0.1
    dpo_pair_power: float = 3.0
    dpo_num_pairs: int | None = None
    rwr_temperature: float = 0.4
    rwr_normalize_weights: bool = False
    rwr_reward: str = "w4s"
    seed: int = 0
    off_policy_loss: str = "clipped"
    off_policy_gamma: float = 0.1

    def __post_init__(self) -> None:
        c = type(self).__name__
        if self.objective not in registry.names():
            raise ConfigError(f"{c}.objective={self.objective!r}: choose one of {list(registry.names())}.")
        for name in ("beta", "clip_eps", "dpo_beta", "dpo_pair_power", "rwr_temperature"):
            _require_real(c, name, getattr(self, name))
        _require_int(c, "seed", self.seed)
        if self.beta < 0.0:
            raise ConfigError(
                f"{c}.beta={self.beta}: the KL coefficient must be >= 0 (0 disables the KL term); set beta >= 0."
            )
        if not (0.0 < self.clip_eps < 1.0):
            raise ConfigError(
                f"{c}.clip_eps={self.clip_eps}: the ratio is clipped to [1 − ε, 1 + ε], so 0 < clip_eps < 1 "
                f"(0.2 is usual); choose a value in (0, 1)."
            )
        if self.dpo_beta <= 0.0:
            raise ConfigError(f"{c}.dpo_beta={self.dpo_beta}: the DPO β must be > 0 (ScoreFlow uses 0.1).")
        if self.dpo_pair_power < 0.0:
            raise ConfigError(
                f"{c}.dpo_pair_power={self.dpo_pair_power}: pair weights (s_w − s_l)^power need power >= 0 "
                f"(ScoreFlow uses 3; 0 samples uniformly)."
            )
        if self.dpo_num_pairs is not None:
            _require_int(c, "dpo_num_pairs", self.dpo_num_pairs)
            if self.dpo_num_pairs < 1:
                raise ConfigError(
                    f"{c}.dpo_num_pairs={self.dpo_num_pairs}: draw at least one pair, or None for one draw per "
                    f"candidate pair."
                )
        if self.rwr_temperature <= 0.0:
            raise ConfigError(
                f"{c}.rwr_temperature={self.rwr_temperature}: the weight exp(r/T) needs T > 0 (W4S uses 0.4)."
            )
        if self.rwr_reward not in RWR_REWARDS:
            raise ConfigError(f"{c}.rwr_reward={self.rwr_reward!r}: choose one of {list(RWR_REWARDS)} (\"w4s\": W4S's "
                              "history-relative reward; \"score\": the absolute ladder score).")
        if self.off_policy_loss not in OFF_POLICY_LOSSES:
            raise ConfigError(f"{c}.off_policy_loss={self.off_policy_loss!r}: choose one of {list(OFF_POLICY_LOSSES)}.")
        _require_real(c, "off_policy_gamma", self.off_policy_gamma)
        if not self.off_policy_gamma > 0.0:
            raise ConfigError(f"{c}.off_policy_gamma={self.off_policy_gamma}: γ of π/(π + γ) must be > 0 (LUFFY "
                              "uses 0.1).")
        if not isinstance(self.rwr_normalize_weights, bool):
            raise ConfigError(f"{c}.rwr_normalize_weights must be True or False, got {self.rwr_normalize_weights!r}.")

    @property
    def spec(self) -> "registry.Objective":
        """The objective's declaration (`core.training.registry`): its data, policies and log-prob temperature."""
        return registry.get(self.objective)

    @property
    def effective_beta(self) -> float:
        """β of the KL term as the loss applies it: `beta` for spogw and grpo, 0 for an objective without that
        term (grpo_nokl; score_dpo and rwr, whose β is dpo_beta or none)."""
        return self.spec.effective_beta(self.beta)

    @property
    def needs_ref(self) -> bool:
        """Whether the loss reads π_ref (score_dpo always, spogw/grpo when β > 0)."""
        return self.spec.needs_ref(self.beta)

    @property
    def needs_old(self) -> bool:
        """Whether the loss reads π_old (the clipped ratio)."""
        return self.spec.uses_old

    def logprob_temperature(self, sampling_temperature: float) -> float:
        """The T of log softmax(logits / T) for every log-prob the trainer computes (π_θ, π_old, π_ref):
        1.0 for score_dpo and rwr (ScoreFlow's TRL DPO and W4S score at T = 1), the sampling temperature for
        spogw / grpo / grpo_nokl (π_old is the sampler's distribution)."""
        return self.spec.temperature(sampling_temperature)

    def objective_config(self) -> "ObjectiveConfig":
        """Just the objective's fields (a `TrainConfig` carries them among its own)."""
        return ObjectiveConfig(**{f.name: getattr(self, f.name) for f in fields(ObjectiveConfig)})
