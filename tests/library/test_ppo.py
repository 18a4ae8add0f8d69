"""utils.ppo: the PPO / REINFORCE++ pieces of lesson 07 on hand-checkable values (verl's own functions: test_verl.py)."""
from __future__ import annotations

import math

import pytest
import torch

from utils import ppo


def test_masked_mean_and_whiten():
    v = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert ppo.masked_mean(v, m).item() == pytest.approx(2.0)
    assert ppo.masked_mean(v, m, dim=-1).tolist() == pytest.approx([2.0])
    w = ppo.masked_whiten(v, m)        # mean 2, unbiased variance 1 over the three masked entries
    assert w.tolist()[0][:3] == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)
    assert w[0, 3].item() == pytest.approx(98.0, rel=1e-6)      # masked positions are transformed, not zeroed
    assert ppo.masked_whiten(v, m, shift_mean=False).tolist()[0][:3] == pytest.approx([1.0, 2.0, 3.0], abs=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        ppo.masked_whiten(v, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="shape"):
        ppo.masked_mean(v, m[:, :3])


def test_last_token_scores_and_kl_in_reward():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    s = ppo.last_token_scores(torch.tensor([2.0, 3.0]), mask)
    assert s.tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, 3.0]]
    with pytest.raises(ValueError, match="no token"):
        ppo.last_token_scores(torch.tensor([1.0, 1.0]), torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    logps = torch.tensor([[-1.0, -2.0, -5.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -2.0, -1.0]])
    r, kl = ppo.kl_in_reward(s, logps, ref, mask, beta=0.1)
    # k1 = logps - ref = [[.5, -1, (masked)], [0, 1, 0]]: every token pays beta * k1
    assert torch.allclose(r, torch.tensor([[-0.05, 2.1, 0.0], [0.0, -0.1, 3.0]]))
    assert kl == pytest.approx(((0.5 - 1.0) / 2 + 1.0 / 3) / 2)


def test_reinforce_pp_returns_and_global_whitening():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.ones(2, 3)
    adv, ret = ppo.reinforce_pp_advantages(r, mask, gamma=1.0)
    assert ret.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    z = 0.5 / math.sqrt(6 * 0.25 / 5)   # mean 0.5, unbiased variance 0.3 over the whole batch
    assert torch.allclose(adv, torch.tensor([[z] * 3, [-z] * 3]), atol=1e-5)
    # gamma discounts; a masked (observation) position passes the return through and gets 0
    adv, ret = ppo.reinforce_pp_advantages(torch.tensor([[1.0, 7.0, 2.0, 5.0]]), torch.tensor([[1.0, 0.0, 1.0, 0.0]]),
                                           gamma=0.5)
    assert ret.tolist() == [[2.0, 0.0, 2.0, 0.0]]
    assert adv[0, 1].item() == 0 and adv[0, 3].item() == 0


def test_policy_loss_clip_and_dual_clip():
    logps = torch.tensor([[0.5, 1.5, 0.1]], requires_grad=True)
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, m = ppo.policy_loss(logps, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    # token 0: rho = e^.5 > 1.2, A > 0: clipped, -1.2; token 1: rho = e^1.5, A < 0: -A*rho = 4.48 capped at 3
    assert loss.item() == pytest.approx((-1.2 + 3.0) / 2, abs=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(0.5) and m["pg_clipfrac_lower"] == pytest.approx(0.5)
    assert m["ppo_kl"] == pytest.approx(-(0.5 + 1.5) / 2)
    loss.backward()
    assert logps.grad.tolist() == [[0.0, 0.0, 0.0]]   # both tokens clipped: no gradient; token 2 masked
    inside = torch.tensor([[0.1]], requires_grad=True)
    loss, _ = ppo.policy_loss(inside, torch.zeros(1, 1), torch.tensor([[2.0]]), torch.ones(1, 1))
    loss.backward()
    assert inside.grad.item() == pytest.approx(-2.0 * math.exp(0.1))
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo.policy_loss(inside, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_ratio_c=1.0)


def test_value_loss_clips_towards_the_old_value():
    mask = torch.ones(1, 3)
    vpreds = torch.tensor([[2.0, 0.2, 1.5]])
    values = torch.zeros(1, 3)
    returns = torch.tensor([[1.0, 1.0, 1.4]])
    loss, clipfrac = ppo.value_loss(vpreds, values, returns, mask, cliprange_value=0.5)
    # max((v - R)^2, (clip(v, -.5, .5) - R)^2) = [1, .64, .81]
    assert loss.item() == pytest.approx(0.5 * (1.0 + 0.64 + 0.81) / 3, abs=1e-6)
    assert clipfrac == pytest.approx(1 / 3)


def test_entropy_and_state_bytes():
    assert torch.allclose(ppo.entropy_from_logits(torch.zeros(2, 3, 4)), torch.full((2, 3), math.log(4)))
    peaked = torch.tensor([[[0.0, -1e4]]])
    assert ppo.entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
    model = torch.nn.Linear(3, 2)            # 8 parameters, float32
    opt = torch.optim.AdamW(model.parameters())
    assert ppo.state_bytes(model, opt) == {"weights": 32, "grads": 0, "optimizer": 0, "total": 32}
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert ppo.state_bytes(model, opt) == {"weights": 32, "grads": 32, "optimizer": 64, "total": 128}


def test_remove_padding_known_values():
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 9, 0], [0, 4, 8, 0, 0]])     # left, right, both sides padded
    att = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0], [0, 1, 1, 0, 0]])
    p = ppo.remove_padding(ids, att, max_length=6)
    # first fit, longest first: [1 2 3 9] opens row 0, [5 6 7] opens row 1, [4 8] fits beside [1 2 3 9]
    assert p["input_ids"].tolist() == [[1, 2, 3, 9, 4, 8], [5, 6, 7, 0, 0, 0]]
    assert p["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]]
    assert p["index"].tolist() == [[-1, -1, 6, 7, 8], [0, 1, 2, 3, -1], [-1, 4, 5, -1, -1]]
    out = torch.arange(12.0).view(2, 6, 1) + 1                                # (R, S, 1): 1 .. 12
    assert ppo.restore_padding(out, p["index"])[..., 0].tolist() == [[0, 0, 7, 8, 9], [1, 2, 3, 4, 0], [0, 5, 6, 0, 0]]
    assert ppo.restore_padding(out[..., 0], p["index"][:, 2:4]).tolist() == [[7, 8], [3, 4], [6, 0]]
    assert ppo.remove_padding(ids, att)["input_ids"].shape == (3, 4)       # default capacity: the longest sequence
    with pytest.raises(ValueError, match="does not fit"):
        ppo.remove_padding(ids, att, max_length=3)
    with pytest.raises(ValueError, match="padding only"):
        ppo.remove_padding(ids, att * torch.tensor([[1], [1], [0]]))


def test_remove_padding_gives_the_padded_batchs_outputs_and_gradients():
    """The tiny model on a left-padded prompt + right-padded response batch, as lesson 07's rollouts: the same
    logits at every real position and the same gradient, with fewer positions computed."""
    from utils.course import tiny

    model = tiny.load()[0]
    g = torch.Generator().manual_seed(0)
    att = torch.zeros(6, 11, dtype=torch.long)                  # prompts in columns 0-5, responses in 6-10
    for b, (p, r) in enumerate(zip((2, 1, 3, 6, 5, 2), (3, 2, 1, 5, 4, 5))):
        att[b, 6 - p:6], att[b, 6:6 + r] = 1, 1
    ids = torch.randint(3, 500, (6, 11), generator=g) * att
    weight = torch.randn(6, 11, 1, generator=g)

    def run(packed):
        model.zero_grad()
        if packed:
            p = ppo.remove_padding(ids, att)
            logits = ppo.restore_padding(model(input_ids=p["input_ids"], position_ids=p["position_ids"],
                                               use_cache=False).logits, p["index"])
        else:
            logits = model(input_ids=ids, attention_mask=att, position_ids=(att.cumsum(1) - 1).clamp(min=0)).logits
        logits = logits * att[..., None]
        (logits * weight).sum().backward()
        return logits.detach(), model.model.layers[1].mlp.up_proj.weight.grad.clone()

    (padded, grad_padded), (packed, grad_packed) = run(False), run(True)
    assert ppo.remove_padding(ids, att)["input_ids"].numel() < ids.numel()
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    assert ((grad_packed - grad_padded).norm() / grad_padded.norm()).item() < 1e-5     # float rounding (about 3e-7)
