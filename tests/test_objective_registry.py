"""An objective added through the registry alone (`core.training.registry.register`): a loss function and one entry,
no change to the trainer, the curation, the tables or the settings. It is then a valid `training.objective`,
the trainer feeds it what its declaration asks for, and its first step's loss is the value worked out by hand."""

from __future__ import annotations

import pytest
import torch

from spogw_dagster.core.training import registry
from spogw_dagster.core.hyperparams import ConfigError, ObjectiveConfig
from spogw_dagster.core.training.objectives import LossOutput
from spogw_dagster.core.training import TrainConfig, TrainExample, train_lora
from spogw_dagster.pipeline.settings import ConfigValidationError, load_config
from tiny_llama import save_tiny_llama, tiny_llama

TOY = "toy_weighted_ratio"


def toy_loss(batch, cfg) -> LossOutput:
    """L_i = −Â_i · mean_t ρ_{i,t} (no clip, no KL): at the first step ρ = 1, so the loss is −mean_i Â_i."""
    mask = batch.mask.float()
    ratio = torch.exp(torch.where(batch.mask.bool(), batch.logp - batch.old_logp, torch.zeros_like(batch.logp)))
    per_row = (ratio * mask).sum(1) / mask.sum(1)
    policy = -(batch.advantages * per_row).mean()
    return LossOutput(loss=policy, policy_loss=policy, kl_loss=torch.zeros(()))


@pytest.fixture
def toy():
    registry.register(registry.Objective(TOY, toy_loss, data="groups", uses_old=True,
                                         description="a test's objective", no_data="no groups for the toy"))
    yield registry.get(TOY)
    registry.unregister(TOY)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", *tiny_llama())


def test_a_registered_objective_is_a_valid_setting_and_an_unknown_one_is_not(toy):
    cfg = load_config("ci", overrides={"training": {"objective": TOY}})
    tc = cfg.train_config()
    assert tc.objective == TOY and tc.needs_old and not tc.needs_ref and tc.aggregates
    assert tc.logprob_T == cfg.generator.temperature  # "sampling" temperature, as declared
    with pytest.raises(ConfigValidationError, match="choose one of"):
        load_config("ci", overrides={"training": {"objective": "not_registered"}})
    registry.unregister(TOY)
    with pytest.raises(ConfigError, match=TOY):
        ObjectiveConfig(objective=TOY)


def test_the_trainer_trains_a_registered_objective(toy, tiny_model, tmp_path):
    # advantages 1.5, 0.5, −0.25, −1.0: the first step's loss is −(1.5 + 0.5 − 0.25 − 1.0)/4 = −0.1875
    rows = [("    a = generate(q)\n    return a\n", 1.5), ("    return await self.test(q)\n", 0.5),
            ("    pass\n", -0.25), ("    x = 1\n", -1.0)]
    examples = [TrainExample("Task: add two numbers.\n", c, advantage=a, score=0.5, group_id="q1") for c, a in rows]
    cfg = TrainConfig(objective=TOY, epochs=1, batch_size=4, learning_rate=1e-2, seed=1, device="cpu")
    res = train_lora(examples, cfg, tmp_path / "toy", base_model=tiny_model)
    s0 = res.stats["steps"][0]
    assert len(res.stats["steps"]) == 1 and s0["rows"] == 4
    assert s0["loss"] == pytest.approx(-0.1875, abs=1e-6) and s0["grad_norm"] > 0
    assert res.stats["config"]["objective"] == TOY


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_the_built_in_objectives_declare_what_the_trainer_needs(beta):
    """By hand from docs/algorithm.md: which policies each loss reads and at which temperature (T = 0.7 the
    sampler's), whether its rows merge into unique workflows, and the β of its KL term."""
    T = 0.7
    want = {  # (needs π_old, needs π_ref, log-prob T, aggregates, KL β)
        "spogw": (True, beta > 0, T, True, beta),
        "grpo": (True, beta > 0, T, True, beta),
        "grpo_nokl": (True, False, T, True, 0.0),
        "score_dpo": (False, True, 1.0, False, 0.0),
        "rwr": (False, False, 1.0, False, 0.0),
    }
    for name, expected in want.items():
        c = ObjectiveConfig(objective=name, beta=beta)
        tc = TrainConfig(objective=name, beta=beta, temperature=T)
        assert (c.needs_old, c.needs_ref, c.logprob_temperature(T), tc.aggregates, c.effective_beta) == expected, name
    assert [registry.get(n).data for n in want] == ["groups", "groups", "groups", "pairs", "candidates"]
