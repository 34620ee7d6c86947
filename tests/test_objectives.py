"""Objectives on tiny tensors. Expected values are worked out by hand from the formulas in core/training/objectives.py (and the
documented choices in spogw_dagster/core/objectives.py); the comments carry the arithmetic, the literals come
from a calculator, never from the code under test."""

from __future__ import annotations

import math

import pytest
import torch

from spogw_dagster.core.hyperparams import ConfigError, ObjectiveConfig
from spogw_dagster.core.training.objectives import (
    LossBatch,
    compute_loss,
    grpo,
    grpo_nokl,
    k3_kl,
    rwr,
    sample_pairs,
    score_dpo,
    spogw,
)

DT = torch.float64


def leaf(rows):
    return torch.tensor(rows, dtype=DT, requires_grad=True)


def grad_of(loss, x):
    (g,) = torch.autograd.grad(loss, x, retain_graph=True, allow_unused=False)
    return g


# The tiny batch used throughout: B = 2, T = 3, on-policy (old = logp, so ρ = 1).
LOGP = [[-1.0, -2.0, -0.5], [-1.5, -1.0, -3.0]]
REF = [[-1.2, -2.0, -0.3], [-1.0, -1.0, -2.0]]
MASK = [[1, 1, 1], [1, 1, 0]]  # |o_0| = 3, |o_1| = 2
ADV = [1.0, -1.0]

# Hand computation (β = 0.1, ε_c = 0.2):
#   row 0, Â = +1 (M = 1): ρ = 1 so min(ρÂ, clip(ρ)Â) = 1 per token.
#     d = ref − logp = (−0.2, 0, 0.2);  D = e^d − d − 1 = (0.0187307531, 0, 0.0214027582), ΣD = 0.0401335112
#     L_0 = −(1/3)(3 − 0.1·0.0401335112) = −1 + 0.0013377837 = −0.9986622163
#   row 1, Â = −1 (M = 0 under mKL): surrogate −1 on its 2 tokens -> L_1 = −(1/2)(−2) = 1
#     d = (0.5, 0) -> D = (e^.5 − 1.5, 0) = (0.1487212707, 0), mean 0.0743606354 (only grpo charges it)
#   spogw = (L_0 + L_1)/2 = 0.0006688919
#   grpo  = spogw + 0.1 · 0.0743606354 / 2 = 0.0043869236
#   kl metric = (0.0133778371 + 0.0743606354)/2 = 0.0438692362
SPOGW_LOSS = 0.0006688918539691779
GRPO_LOSS = 0.004386923621472383
KL_METRIC = 0.043869236214724015


def tiny(adv=ADV):
    logp = leaf(LOGP)
    return logp, logp.detach().clone(), torch.tensor(REF, dtype=DT), torch.tensor(MASK), torch.tensor(adv, dtype=DT)


def test_k3_by_hand():
    d = torch.tensor([-0.2, 0.0, 0.5], dtype=DT)
    # k3(logp, ref) with ref − logp = d:  e^d − d − 1
    got = k3_kl(torch.zeros(3, dtype=DT), d)
    assert got.tolist() == pytest.approx([0.0187307531, 0.0, 0.1487212707], abs=1e-10)


def test_spogw_value_by_hand():
    logp, old, ref, mask, adv = tiny()
    out = spogw(logp, old, ref, mask, adv, beta=0.1, clip_eps=0.2)
    assert out.loss.item() == pytest.approx(SPOGW_LOSS, abs=1e-12)
    assert out.policy_loss.item() == pytest.approx(0.0, abs=1e-12)  # (−1 + 1)/2
    assert out.kl_loss.item() == pytest.approx(0.1 * 0.013377837079383928 / 2, abs=1e-12)
    assert out.kl == pytest.approx(KL_METRIC, abs=1e-12)
    assert out.clip_frac == 0.0
    assert out.extra["kl_mask_frac"] == 0.5  # one of two rows has Â > 0


def test_spogw_gradient_by_hand():
    # dL/dlogp_{i,t} = (1/B)·(1/|o_i|)·[−Â_i ρ + β M_i (1 − e^{d_t})]   (ρ = 1, no clipping)
    #   row 0: (−1/3 + 0.1(1 − e^{−0.2})/3)/2 = −0.1636455126 ; −1/6 ; (−1/3 + 0.1(1 − e^{0.2})/3)/2 = −0.1703567126
    #   row 1: (+1/2)/2 = 0.25 on both workflow tokens; the masked token gets 0
    logp, old, ref, mask, adv = tiny()
    g = grad_of(spogw(logp, old, ref, mask, adv, beta=0.1).loss, logp)
    assert g.tolist()[0] == pytest.approx([-0.1636455125512997, -1 / 6, -0.17035671263600283], abs=1e-12)
    assert g.tolist()[1] == pytest.approx([0.25, 0.25, 0.0], abs=1e-12)


def test_grpo_differs_from_spogw_exactly_by_the_kl_of_non_positive_rows():
    logp, old, ref, mask, adv = tiny()
    s = spogw(logp, old, ref, mask, adv, beta=0.1)
    g = grpo(logp, old, ref, mask, adv, beta=0.1)
    assert g.loss.item() == pytest.approx(GRPO_LOSS, abs=1e-12)
    assert g.extra["kl_mask_frac"] == 1.0
    gs, gg = grad_of(s.loss, logp), grad_of(g.loss, logp)
    # row 0 (Â > 0): identical gradients
    assert torch.equal(gs[0], gg[0])
    # row 1 (Â < 0): they differ by the KL gradient β(1 − e^{d})/(|o_1|·B): token 0: 0.1(1 − e^{0.5})/4 = −0.0162180318,
    # token 1 (d = 0): 0, masked token: 0  -> grpo row 1 = (0.2337819682, 0.25, 0)
    assert (gg[1] - gs[1]).tolist() == pytest.approx([0.1 * (1 - math.exp(0.5)) / 4, 0.0, 0.0], abs=1e-12)
    assert gg[1].tolist() == pytest.approx([0.2337819682324968, 0.25, 0.0], abs=1e-12)


def test_mkl_contributes_nothing_for_non_positive_advantages_value_and_gradient():
    # rows with Â = 0 and Â < 0: spogw == grpo_nokl (value and gradient); the KL part has zero gradient there
    logp = leaf([[-1.0, -2.0], [-0.3, -0.7], [-2.0, -0.1]])
    ref = torch.tensor([[-0.5, -2.5], [-1.0, -0.2], [-0.4, -0.9]], dtype=DT)
    mask = torch.ones(3, 2)
    old = logp.detach() + 0.05  # ρ = e^{−0.05}, inside the clip range
    adv = torch.tensor([0.0, -0.7, 1.3], dtype=DT)
    s = spogw(logp, old, ref, mask, adv, beta=0.5)
    n = grpo_nokl(logp, old, mask, adv)
    g_kl = grad_of(s.kl_loss, logp)
    assert g_kl[0].abs().max().item() == 0.0 and g_kl[1].abs().max().item() == 0.0
    assert g_kl[2].abs().max().item() > 0.0
    gs, gn = grad_of(s.loss, logp), grad_of(n.loss, logp)
    assert torch.equal(gs[:2], gn[:2])
    # value: spogw − grpo_nokl = β·mean_tokens(D of row 2)/B only
    d = ref[2] - logp.detach()[2]
    extra = 0.5 * (torch.exp(d) - d - 1).mean().item() / 3
    assert (s.loss - n.loss).item() == pytest.approx(extra, abs=1e-12)
    # when no row has Â > 0 the mKL term is exactly zero
    s0 = spogw(logp, old, ref, mask, torch.tensor([0.0, -0.7, -1.3], dtype=DT), beta=0.5)
    assert s0.kl_loss.item() == 0.0


def test_spogw_equals_grpo_when_all_advantages_positive_and_nokl_when_beta_zero():
    logp, old, ref, mask, _ = tiny()
    adv = torch.tensor([0.5, 2.0], dtype=DT)
    assert spogw(logp, old, ref, mask, adv).loss.item() == grpo(logp, old, ref, mask, adv).loss.item()
    adv = torch.tensor(ADV, dtype=DT)
    assert spogw(logp, old, ref, mask, adv, beta=0.0).loss.item() == grpo_nokl(logp, old, mask, adv).loss.item()


def test_clipping_by_hand():
    # ε_c = 0.2, one token per row, β = 0:
    #   row 0: Â=+1, ρ=1.5 -> min(1.5, 1.2) = 1.2 (clipped, no grad)     L = −1.2
    #   row 1: Â=−1, ρ=1.5 -> min(−1.5, −1.2) = −1.5 (unclipped)          L = 1.5,  dL/dlogp = −Âρ = 1.5
    #   row 2: Â=+1, ρ=0.5 -> min(0.5, 0.8) = 0.5 (unclipped)             L = −0.5, dL/dlogp = −0.5
    #   row 3: Â=−1, ρ=0.5 -> min(−0.5, −0.8) = −0.8 (clipped, no grad)   L = 0.8
    #   row 4: Â=+2, ρ=1.1 -> inside [0.8, 1.2]                            L = −2.2, dL/dlogp = −2.2
    #   loss = (−1.2 + 1.5 − 0.5 + 0.8 − 2.2)/5 = −0.32 ; clip_frac = 2/5 ; grad = (0, 1.5, −0.5, 0, −2.2)/5
    old = torch.tensor([[-1.0]] * 5, dtype=DT)
    ratios = [1.5, 1.5, 0.5, 0.5, 1.1]
    logp = leaf([[-1.0 + math.log(r)] for r in ratios])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0], dtype=DT)
    out = grpo_nokl(logp, old, torch.ones(5, 1), adv, clip_eps=0.2)
    assert out.loss.item() == pytest.approx(-0.32, abs=1e-12)
    assert out.clip_frac == pytest.approx(0.4)
    assert grad_of(out.loss, logp).flatten().tolist() == pytest.approx([0.0, 0.3, -0.1, 0.0, -0.44], abs=1e-12)


def test_clip_fraction_is_token_weighted():
    # row 0: 3 tokens, ρ = (1.5, 1, 1) with Â > 0 -> 1 clipped; row 1: 1 token ρ = 0.5, Â < 0 -> clipped
    # 2 of 4 workflow tokens (the masked token of row 1 does not count even though its ρ would be clipped)
    old = torch.zeros(2, 3, dtype=DT)
    logp = leaf([[math.log(1.5), 0.0, 0.0], [math.log(0.5), math.log(3.0), 0.0]])
    out = grpo_nokl(logp, old, torch.tensor([[1, 1, 1], [1, 0, 0]]), torch.tensor([1.0, -1.0], dtype=DT))
    assert out.clip_frac == pytest.approx(0.5)


def test_ratio_one_and_beta_zero_is_reinforce():
    # ρ = 1 (logp == old), β = 0: ∇L = −(1/B) Σ_i Â_i/|o_i| Σ_t ∇logp_{i,t}, i.e. dL/dlogp_{i,t} = −Â_i/(|o_i| B)
    torch.manual_seed(0)
    B, T = 4, 6
    logp = (torch.randn(B, T, dtype=DT) - 2).requires_grad_()
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3, [0, 1, 1, 1, 1, 0], [1] + [0] * 5])
    adv = torch.tensor([1.2, -0.4, 0.0, -2.0], dtype=DT)
    for name in ("spogw", "grpo_nokl"):
        cfg = ObjectiveConfig(objective=name, beta=0.0)
        out = compute_loss(name, LossBatch(logp=logp, mask=mask, old_logp=logp.detach(), advantages=adv), cfg)
        g = grad_of(out.loss, logp)
        lengths = mask.sum(-1).to(DT)
        expected = -(adv / lengths / B).unsqueeze(-1) * mask
        assert torch.allclose(g, expected, atol=1e-14)
        # and the same as differentiating the REINFORCE surrogate directly
        reinforce = -((adv.unsqueeze(-1) * logp * mask).sum(-1) / lengths).mean()
        assert torch.allclose(g, grad_of(reinforce, logp), atol=1e-14)


def test_old_logp_none_means_on_policy():
    logp, _, ref, mask, adv = tiny()
    a = spogw(logp, None, ref, mask, adv).loss.item()
    assert a == pytest.approx(SPOGW_LOSS, abs=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Masked tokens
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["spogw", "grpo", "grpo_nokl", "score_dpo", "rwr"])
def test_masked_tokens_carry_no_gradient_even_with_garbage_values(name):
    nan, inf = float("nan"), float("inf")
    logp = leaf([[-1.0, -0.5, nan, -inf], [-2.0, inf, -0.3, -0.2]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 1]])
    old = torch.tensor([[-1.1, -0.4, inf, nan], [-2.0, nan, -0.3, -0.25]], dtype=DT)
    ref = torch.tensor([[-0.9, -0.6, -inf, 5.0], [-2.5, -inf, -0.1, -0.2]], dtype=DT)
    batch = LossBatch(logp=logp, mask=mask, old_logp=old, ref_logp=ref,
                      advantages=torch.tensor([0.8, -0.8], dtype=DT), scores=torch.tensor([1.0, 0.25], dtype=DT))
    out = compute_loss(name, batch, ObjectiveConfig(objective=name))
    assert torch.isfinite(out.loss)
    g = grad_of(out.loss, logp)
    assert torch.isfinite(g).all()
    assert (g[mask == 0] == 0).all()
    assert (g[mask != 0] != 0).any()


def test_values_at_masked_positions_do_not_change_the_loss():
    logp, old, ref, mask, adv = tiny()
    logp2 = logp.detach().clone()
    logp2[1, 2] = -50.0
    ref2 = ref.clone()
    ref2[1, 2] = 3.0
    a = grpo(logp, old, ref, mask, adv).loss.item()
    b = grpo(logp2.requires_grad_(), old, ref2, mask, adv).loss.item()
    assert a == b


# ----------------------------------------------------------------------------------------------------------------
# Score-DPO
# ----------------------------------------------------------------------------------------------------------------


def test_score_dpo_by_hand():
    # Δ_0 = (−1 + 1.5) + (−1 + 1) = 0.5 ; Δ_1 = (−2 + 1.5) + (−2 + 1.5) = −1
    # s_w = 0.8, s_l = 0.3: z = 0.1·(0.8·0.5 − 0.7·(−1)) = 0.1·1.1 = 0.11
    # loss = −log σ(0.11) = log(1 + e^{−0.11}) = 0.6396589186
    # chosen reward 0.1·0.8·0.5 = 0.04, rejected 0.1·0.7·(−1) = −0.07, margin 0.11, accuracy 1
    # dL/dlogp: dL/dz = −σ(−z) = −0.4725276957; dz/dlogp_0t = β s_w = 0.08; dz/dlogp_1t = −β(1 − s_l) = −0.07
    logp = leaf([[-1.0, -1.0], [-2.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0], [-1.5, -1.5]], dtype=DT)
    out = score_dpo(logp, ref, torch.ones(2, 2), torch.tensor([0.8, 0.3], dtype=DT), beta=0.1,
                    pairs=torch.tensor([[0, 1]]))
    assert out.loss.item() == pytest.approx(0.639658918622423, abs=1e-12)
    assert out.extra["chosen_reward"] == pytest.approx(0.04)
    assert out.extra["rejected_reward"] == pytest.approx(-0.07)
    assert out.extra["reward_margin"] == pytest.approx(0.11)
    assert out.extra["reward_accuracy"] == 1.0 and out.extra["n_pairs"] == 1.0
    sig = 0.47252769565540637
    g = grad_of(out.loss, logp)
    assert g.flatten().tolist() == pytest.approx([-sig * 0.08] * 2 + [sig * 0.07] * 2, abs=1e-12)


def test_score_dpo_sums_over_workflow_tokens_only():
    # padding after the response must not change Δ: same as above with an extra masked column
    logp = leaf([[-1.0, -1.0, -9.0], [-2.0, -2.0, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-1.5, -1.5, 0.0]], dtype=DT)
    out = score_dpo(logp, ref, torch.tensor([[1, 1, 0], [1, 1, 0]]), torch.tensor([0.8, 0.3], dtype=DT),
                    pairs=torch.tensor([[0, 1]]))
    assert out.loss.item() == pytest.approx(0.639658918622423, abs=1e-12)


def test_in_batch_pair_sampling_by_hand():
    # scores 1, .5, 0 (one group): candidates (0,1) w = .5^3 = .125, (0,2) w = 1, (1,2) w = .125 -> p = .1, .8, .1
    scores = torch.tensor([1.0, 0.5, 0.0])
    pairs = sample_pairs(scores, num_pairs=20000, power=3.0, seed=0)
    freq = {tuple(p): 0 for p in [(0, 1), (0, 2), (1, 2)]}
    for w, l in pairs.tolist():
        freq[(w, l)] += 1
    assert freq[(0, 1)] / 20000 == pytest.approx(0.1, abs=0.01)
    assert freq[(0, 2)] / 20000 == pytest.approx(0.8, abs=0.01)
    assert freq[(1, 2)] / 20000 == pytest.approx(0.1, abs=0.01)
    assert torch.equal(pairs, sample_pairs(scores, num_pairs=20000, seed=0))  # seeded
    # None = one draw per candidate; groups restrict pairs; equal scores give none; chosen first
    assert sample_pairs(scores).shape == (3, 2)
    assert sample_pairs(scores, torch.tensor([0, 0, 1]), num_pairs=5).tolist() == [[0, 1]] * 5
    assert sample_pairs(torch.tensor([0.0, 1.0]), num_pairs=2).tolist() == [[1, 0]] * 2
    assert sample_pairs(torch.tensor([0.5, 0.5])).shape == (0, 2)


def test_score_dpo_without_pairs_is_zero_and_differentiable():
    logp = leaf([[-1.0], [-2.0]])
    out = score_dpo(logp, torch.zeros(2, 1, dtype=DT), torch.ones(2, 1), torch.tensor([0.5, 0.5], dtype=DT))
    assert out.loss.item() == 0.0 and out.extra["n_pairs"] == 0.0
    out.loss.backward()
    assert logp.grad.abs().max().item() == 0.0


def test_score_dpo_dispatch_samples_pairs_with_the_config_seed():
    logp = leaf([[-1.0], [-2.0], [-0.5]])
    batch = LossBatch(logp=logp, mask=torch.ones(3, 1), ref_logp=torch.full((3, 1), -1.0, dtype=DT),
                      scores=torch.tensor([1.0, 0.5, 0.0], dtype=DT))
    cfg = ObjectiveConfig(objective="score_dpo", dpo_num_pairs=7, seed=3)
    a = compute_loss("score_dpo", batch, cfg)
    b = compute_loss("score_dpo", batch, cfg)
    assert a.extra["n_pairs"] == 7.0 and a.loss.item() == b.loss.item()


# ----------------------------------------------------------------------------------------------------------------
# RWR
# ----------------------------------------------------------------------------------------------------------------


def test_rwr_by_hand():
    # r = (1, 0), T = 0.4: w = (e^{2.5}, 1) = (12.1824939607, 1)
    # per-token mean NLL: row 0 (−1, −3) -> 2 ; row 1 (−0.5, masked) -> 0.5
    # loss = (12.1824939607·2 + 1·0.5)/2 = 12.4324939607 ; dL/dlogp_{0,t} = −w_0/(|o_0| B) = −3.0456234902
    logp = leaf([[-1.0, -3.0], [-0.5, -7.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    r = torch.tensor([1.0, 0.0], dtype=DT)
    out = rwr(logp, mask, r, temperature=0.4)
    assert out.loss.item() == pytest.approx(12.432493960703473, abs=1e-10)
    assert out.extra["weight_max"] == pytest.approx(12.182493960703473)
    g = grad_of(out.loss, logp)
    assert g.flatten().tolist() == pytest.approx([-12.182493960703473 / 4] * 2 + [-1 / 2, 0.0], abs=1e-12)
    # self-normalised weights: w / mean(w) -> loss = (2·w_0 + 0.5·w_1)/(w_0 + w_1) = 1.8862127300
    out = rwr(logp, mask, r, temperature=0.4, normalize_weights=True)
    assert out.loss.item() == pytest.approx(1.8862127299681346, abs=1e-12)


def test_rwr_via_dispatcher_uses_config_temperature():
    logp = leaf([[-1.0]])
    out = compute_loss("rwr", LossBatch(logp=logp, mask=torch.ones(1, 1), scores=torch.tensor([0.5], dtype=DT)),
                       ObjectiveConfig(objective="rwr", rwr_temperature=0.25))
    assert out.loss.item() == pytest.approx(math.exp(2.0) * 1.0)  # e^{0.5/0.25} · NLL 1


# ----------------------------------------------------------------------------------------------------------------
# Dispatcher, input errors, config
# ----------------------------------------------------------------------------------------------------------------


def test_dispatcher_matches_direct_calls_and_grpo_nokl_ignores_beta():
    logp, old, ref, mask, adv = tiny()
    b = LossBatch(logp=logp, mask=mask, old_logp=old, ref_logp=ref, advantages=adv)
    assert compute_loss("spogw", b).loss.item() == pytest.approx(SPOGW_LOSS, abs=1e-12)
    assert compute_loss("grpo", b, ObjectiveConfig(objective="grpo")).loss.item() == pytest.approx(GRPO_LOSS, abs=1e-12)
    nokl = compute_loss("grpo_nokl", b, ObjectiveConfig(objective="grpo_nokl", beta=5.0))
    assert nokl.loss.item() == pytest.approx(0.0, abs=1e-12) and nokl.kl == pytest.approx(KL_METRIC)
    assert set(nokl.metrics()) >= {"loss", "policy_loss", "kl_loss", "clip_frac", "kl"}
    # grpo_nokl needs no reference
    b2 = LossBatch(logp=logp, mask=mask, advantages=adv)
    assert compute_loss("grpo_nokl", b2).kl is None


def test_input_errors_are_clear():
    logp, old, ref, mask, adv = tiny()
    with pytest.raises(ValueError, match="grpo_nokl"):
        compute_loss("spogw", LossBatch(logp=logp, mask=mask, advantages=adv))  # β = 0.1 but no reference
    with pytest.raises(ValueError, match="advantages"):
        compute_loss("grpo", LossBatch(logp=logp, mask=mask, ref_logp=ref))
    with pytest.raises(ValueError, match="no workflow tokens"):
        spogw(logp, old, ref, torch.tensor([[1, 1, 1], [0, 0, 0]]), adv)
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        spogw(logp, old, ref[:, :2], mask, adv)
    with pytest.raises(ValueError, match=r"expected \(2,\)"):
        spogw(logp, old, ref, mask, adv[:1])
    with pytest.raises(ValueError, match="unknown objective"):
        compute_loss("ppo", LossBatch(logp=logp, mask=mask))
    with pytest.raises(ValueError, match=r"scores in \[0, 1\]"):
        score_dpo(logp, ref, mask, torch.tensor([1.5, 0.0], dtype=DT))
    with pytest.raises(ValueError, match="ref_logp"):
        compute_loss("score_dpo", LossBatch(logp=logp, mask=mask, scores=torch.tensor([1.0, 0.0])))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"beta": -0.1}, r"beta=-0.1.*set beta >= 0"),
        ({"clip_eps": 0.0}, r"0 < clip_eps < 1"),
        ({"clip_eps": 1.0}, r"0 < clip_eps < 1"),
        ({"objective": "ppo"}, r"objective=.ppo.: choose one of"),
        ({"dpo_beta": 0.0}, r"DPO β must be > 0"),
        ({"rwr_temperature": 0.0}, r"needs T > 0"),
        ({"dpo_pair_power": -1.0}, r"power >= 0"),
        ({"dpo_num_pairs": 0}, r"at least one pair"),
        ({"beta": float("inf")}, r"finite number"),
    ],
)
def test_objective_config_errors_name_the_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ObjectiveConfig(**kwargs)


def test_objective_config_defaults():
    cfg = ObjectiveConfig()
    assert (cfg.objective, cfg.beta, cfg.clip_eps, cfg.dpo_beta, cfg.dpo_pair_power, cfg.rwr_temperature) == (
        "spogw", 0.1, 0.2, 0.1, 3.0, 0.4)
    assert ObjectiveConfig(objective="grpo_nokl", beta=0.3).effective_beta == 0.0
    assert ObjectiveConfig.from_dict({"objective": "rwr"}).objective == "rwr"


def test_float32_inputs_work():
    logp = torch.tensor(LOGP, requires_grad=True)
    out = spogw(logp, None, torch.tensor(REF), torch.tensor(MASK), torch.tensor(ADV))
    assert out.loss.dtype == torch.float32
    assert out.loss.item() == pytest.approx(SPOGW_LOSS, abs=1e-6)


# --------------------------------------------------------------------------------------------------------------
# Off-policy rows (anchors): ObjectiveConfig.off_policy_loss
# --------------------------------------------------------------------------------------------------------------
# Row 0 is off-policy (an anchor), π_θ = (0.1, 0.5), π_old = (0.01, 0.5): on-policy its first token's ratio 10
# would be clipped at 1.2 when Â > 0. Row 1 is a sample, Â = −1, one token at ρ = 1. β = 0, γ = 0.1.
SHAPE_LOGP = [[math.log(0.1), math.log(0.5)], [math.log(0.5), 0.0]]
SHAPE_OLD = [[math.log(0.01), math.log(0.5)], [math.log(0.5), 0.0]]
SHAPE_MASK = [[1, 1], [1, 0]]


def _shape_batch(off, a0=1.0):
    return LossBatch(logp=leaf(SHAPE_LOGP), old_logp=torch.tensor(SHAPE_OLD, dtype=DT),
                     mask=torch.tensor(SHAPE_MASK), advantages=torch.tensor([a0, -1.0], dtype=DT),
                     off_policy=None if off is None else torch.tensor(off))


def _nokl(loss, **kw):
    return ObjectiveConfig(objective="grpo_nokl", off_policy_loss=loss, **kw)


def test_shaped_off_policy_row_by_hand():
    # row 0 shaped: π/(π+γ) = 0.1/0.2 = 0.5 and 0.5/0.6 = 0.8333333333 -> L_0 = −(0.5 + 0.8333333333)/2 = −0.6666666667
    # row 1 clipped as a sample: ρ = 1, Â = −1 -> L_1 = +1.  loss = (−0.6666666667 + 1)/2 = 0.1666666667
    # d/dlogp of Â π/(π+γ) = Â γπ/(π+γ)²: 0.1·0.1/0.04 = 0.25 and 0.1·0.5/0.36 = 0.1388888889, each /|o_0| = 2 /B = 2
    b = _shape_batch([True, False])
    out = compute_loss("grpo_nokl", b, _nokl("shaped", off_policy_gamma=0.1))
    assert out.loss.item() == pytest.approx(0.16666666666666666, abs=1e-12)
    g = grad_of(out.loss, b.logp)
    assert g.tolist()[0] == pytest.approx([-0.0625, -0.034722222222222224], abs=1e-12)
    assert g.tolist()[1] == pytest.approx([0.5, 0.0], abs=1e-12)  # −Â ρ / |o_1| / B
    assert out.clip_frac == 0.0  # the shaped row is never clipped


def test_log_prob_off_policy_row_by_hand():
    # Â = +1: L_0 = −(log 0.1 + log 0.5)/2 = −(−2.302585093 − 0.6931471806)/2 = 1.4978661368; loss = (1.4978661368 + 1)/2
    # = 1.2489330684; gradient −Â/|o_0|/B = −0.25 on both tokens, the one at ρ = 10 too (no clip)
    b = _shape_batch([True, False])
    out = compute_loss("grpo_nokl", b, _nokl("log_prob"))
    assert out.loss.item() == pytest.approx(1.2489330683884301, abs=1e-12)
    assert grad_of(out.loss, b.logp).tolist()[0] == pytest.approx([-0.25, -0.25], abs=1e-12)
    assert out.clip_frac == 0.0
    # Â = −1: the clipped term as a sample, −Â max(ρ, clip ρ) = (10 + 1)/2 -> L_0 = 5.5, loss (5.5 + 1)/2 = 3.25;
    # gradient ρ/|o_0|/B = 10/4 and 1/4 (ρ above 1 + ε is not cut when Â < 0)
    b = _shape_batch([True, False], a0=-1.0)
    out = compute_loss("grpo_nokl", b, _nokl("log_prob"))
    assert out.loss.item() == pytest.approx(3.25, abs=1e-12)
    assert grad_of(out.loss, b.logp).tolist()[0] == pytest.approx([2.5, 0.25], abs=1e-12)


def test_clipped_off_policy_rows_train_like_samples():
    # "clipped" (or no row marked): row 0 is min(ρÂ, clip(ρ)Â) = (1.2, 1) -> L_0 = −1.1; loss = (−1.1 + 1)/2 = −0.05;
    # its first token is clipped (no gradient): 1 of 3 workflow tokens
    for off, loss in (([True, False], "clipped"), (None, "shaped"), ([False, False], "log_prob")):
        b = _shape_batch(off)
        out = compute_loss("grpo_nokl", b, _nokl(loss))
        assert out.loss.item() == pytest.approx(-0.05, abs=1e-12)
        assert grad_of(out.loss, b.logp).tolist()[0] == pytest.approx([0.0, -0.25], abs=1e-12)
        assert out.clip_frac == pytest.approx(1 / 3, abs=1e-6)  # a float32 count ratio


@pytest.mark.parametrize("loss", ["shaped", "log_prob"])
def test_off_policy_rows_aggregate_like_their_group_rows(loss):
    # an anchor in two groups (Â = +1 and −0.5) stands for (A⁺ 1, A⁻ −0.5, count 2): the same loss, gradient and
    # clip fraction as the two per-group rows
    cfg = ObjectiveConfig(objective="spogw", off_policy_loss=loss)
    ref = torch.tensor([[math.log(0.2), math.log(0.4)], [math.log(0.5), 0.0]], dtype=DT)
    rows = LossBatch(logp=leaf([SHAPE_LOGP[0], SHAPE_LOGP[0], SHAPE_LOGP[1]]),
                     old_logp=torch.tensor([SHAPE_OLD[0], SHAPE_OLD[0], SHAPE_OLD[1]], dtype=DT),
                     ref_logp=ref[[0, 0, 1]], mask=torch.tensor([SHAPE_MASK[0], SHAPE_MASK[0], SHAPE_MASK[1]]),
                     advantages=torch.tensor([1.0, -0.5, 0.3], dtype=DT), off_policy=torch.tensor([True, True, False]))
    uniq = LossBatch(logp=leaf(SHAPE_LOGP), old_logp=torch.tensor(SHAPE_OLD, dtype=DT), ref_logp=ref,
                     mask=torch.tensor(SHAPE_MASK), adv_pos=torch.tensor([1.0, 0.3], dtype=DT),
                     adv_neg=torch.tensor([-0.5, 0.0], dtype=DT), n_pos=torch.tensor([1.0, 1.0], dtype=DT),
                     n_neg=torch.tensor([1.0, 0.0], dtype=DT), count=torch.tensor([2.0, 1.0], dtype=DT),
                     off_policy=torch.tensor([True, False]))
    a, u = compute_loss("spogw", rows, cfg), compute_loss("spogw", uniq, cfg)
    assert u.loss.item() == pytest.approx(a.loss.item(), abs=1e-12)
    ga, gu = grad_of(a.loss, rows.logp), grad_of(u.loss, uniq.logp)
    assert gu[0].tolist() == pytest.approx((ga[0] + ga[1]).tolist(), abs=1e-12)
    assert gu[1].tolist() == pytest.approx(ga[2].tolist(), abs=1e-12)
    assert u.clip_frac == pytest.approx(a.clip_frac, abs=1e-6)


def test_off_policy_config_errors():
    with pytest.raises(ConfigError, match="must be > 0"):
        ObjectiveConfig(off_policy_loss="shaped", off_policy_gamma=0.0)
    with pytest.raises(ConfigError, match=r"off_policy_loss='luffy': choose one of"):
        ObjectiveConfig(off_policy_loss="luffy")
    with pytest.raises(ValueError, match=r"off_policy has shape \(3,\)"):
        compute_loss("spogw", LossBatch(logp=leaf(SHAPE_LOGP), mask=torch.tensor(SHAPE_MASK),
                                        advantages=torch.tensor([1.0, -1.0], dtype=DT),
                                        off_policy=torch.tensor([True, False, True])),
                     ObjectiveConfig(beta=0.0, off_policy_loss="log_prob"))


@pytest.mark.parametrize("loss", ["shaped", "log_prob"])
def test_an_off_policy_row_with_a_vanishing_pi_old_keeps_a_finite_gradient(loss):
    # π_old = e^−95 on the first token: exp(lp − old) would overflow float32 (e^93.7); the shaped / log-prob term
    # does not read ρ, and its gradient must not turn NaN through the unused clipped branch
    logp = torch.tensor([[math.log(0.1), math.log(0.5)]], requires_grad=True)
    b = LossBatch(logp=logp, old_logp=torch.tensor([[-95.0, math.log(0.5)]]), mask=torch.ones(1, 2),
                  advantages=torch.tensor([1.0]), off_policy=torch.tensor([True]))
    out = compute_loss("grpo_nokl", b, ObjectiveConfig(objective="grpo_nokl", off_policy_loss=loss))
    (g,) = torch.autograd.grad(out.loss, logp)
    assert torch.isfinite(g).all() and torch.isfinite(out.loss)
    assert g[0, 0].item() == pytest.approx(-0.125 if loss == "shaped" else -0.5, abs=1e-6)  # −Â·γπ/(π+γ)²/2, −Â/2
