"""Lesson 04/05's answers (utils/solutions) and utils/rl.py: hand-computed values, and the loss equals TRL
GRPOTrainer's on real generations."""
import math

import pytest
import torch
from datasets import Dataset

from utils import data, rewards, rl
from utils.course import tiny
from utils.solutions import lesson04 as l04
from utils.solutions import lesson05 as l05

# transformers 5.23 deprecates the name TRL still calls (utils/__init__ silences it, pytest re-enables it)
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def masked_mean(values, mask):
    """Mean of ``values`` where ``mask`` is 1 (TRL logs its metrics as such token means)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum()


# ============================================================================= hand-computed values
R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])     # two groups of 4; the second all equal


def test_group_advantages_group_scale():
    # group 1: mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = 1/sqrt(3) = 0.57735; group 2: std 0 -> all 0
    a = 0.5 / (3 ** -0.5 + 1e-4)                                  # 0.86588
    got = l04.group_advantages(R, 4)
    assert got.shape == (8,) and got.dtype == torch.float32
    assert got.tolist() == pytest.approx([a, -a, -a, a, 0, 0, 0, 0], abs=1e-6)
    assert a == pytest.approx(0.86588, abs=1e-5)
    assert got[4:].abs().max().item() == 0.0                      # exactly zero, not 0/0
    assert l04.group_advantages(R, 4, eps=0.0)[:4].tolist() == pytest.approx([3 ** 0.5 / 2 * s for s in (1, -1, -1, 1)])


def test_group_advantages_batch_and_none():
    # batch: mean 0.75, unbiased var (6 * 0.0625 + 2 * 0.5625) / 7 = 1.5 / 7, std 0.46291
    b = 0.5 / ((1.5 / 7) ** 0.5 + 1e-4)                            # 1.07990
    assert b == pytest.approx(1.07990, abs=1e-5)
    assert l04.group_advantages(R, 4, scale="batch").tolist() == pytest.approx([b, -b, -b, b, 0, 0, 0, 0], abs=1e-6)
    assert l04.group_advantages(R, 4, scale="none").tolist() == [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]
    # group_size 1: no spread within a group -> advantages 0 (TRL uses std 0 there, not NaN)
    # integer rewards are accepted


def test_rloo_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0, 6.0, 8.0])
    # group 1: 1 - (0 + 0 + 1) / 3 = 2/3, 0 - 2/3; group 2: 2 - 18/3 = -4, 4 - 16/3, 6 - 14/3, 8 - 12/3
    want = [2 / 3, -2 / 3, -2 / 3, 2 / 3, -4.0, -4 / 3, 4 / 3, 4.0]
    assert rl.rloo_advantages(r, 4).tolist() == pytest.approx(want)
    # = G / (G - 1) * (r - group mean)
    centered = l04.group_advantages(r, 4, scale="none")
    assert rl.rloo_advantages(r, 4).tolist() == pytest.approx((4 / 3 * centered).tolist())
    assert rl.rloo_advantages(torch.tensor([3.0, 1.0]), 2).tolist() == [2.0, -2.0]


def test_clipped_surrogate_known_values():
    log = math.log
    # log-ratios per column: rho = 1.5 (above 1 + eps), rho = 0.5 (below 1 - eps), rho = 1
    logps = torch.tensor([[log(1.5), log(0.5), 0.0], [log(1.5), log(0.5), 0.0]])
    old = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])                       # row 0: A > 0, row 1: A < 0
    got = l04.clipped_surrogate(logps, old, adv)
    assert got.shape == (2, 3)
    # A > 0: rho = 1.5 clipped to 1.2 (no reward for moving further); rho = 0.5 is kept (pessimistic min)
    # A < 0: rho = 0.5 clipped to 0.8; rho = 1.5 is kept (the larger loss)
    assert got.tolist()[0] == pytest.approx([-1.2, -0.5, -1.0])
    assert got.tolist()[1] == pytest.approx([1.5, 0.8, 1.0])
    assert torch.equal(l04.clipped_surrogate(logps, old, adv.unsqueeze(1)), got)      # (B, 1) advantages
    # asymmetric clip-higher (DAPO): the upper bound moves to 1.28, the lower stays at 0.8
    asym = l04.clipped_surrogate(logps, old, adv, eps_low=0.2, eps_high=0.28)
    assert asym.tolist()[0] == pytest.approx([-1.28, -0.5, -1.0])
    assert asym.tolist()[1] == pytest.approx([1.5, 0.8, 1.0])
    r125, zero, one = torch.tensor([[log(1.25)]]), torch.zeros(1, 1), torch.tensor([1.0])   # rho = 1.25, A = 1
    assert l04.clipped_surrogate(r125, zero, one).item() == pytest.approx(-1.2)                # clipped at 1.2
    assert l04.clipped_surrogate(r125, zero, one, eps_high=0.28).item() == pytest.approx(-1.25)  # inside [0.8, 1.28]
    # logps are shifted by a common offset: only the difference matters
    torch.testing.assert_close(l04.clipped_surrogate(logps - 3.0, old - 3.0, adv), got)


def test_clipped_surrogate_gradient_on_policy():
    """With old = logps.detach() the loss is -A per token and its gradient is -A (the REINFORCE gradient)."""
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss = l04.clipped_surrogate(logps, logps.detach(), torch.tensor([0.7]))
    assert loss.tolist()[0] == pytest.approx([-0.7, -0.7])
    loss.sum().backward()
    assert logps.grad.tolist()[0] == pytest.approx([-0.7, -0.7])


def test_k3_kl_known_values():
    lp = torch.tensor([[-1.0, -2.5, -0.1]])
    assert l04.k3_kl(lp, lp).abs().max().item() == 0.0
    ln2 = math.log(2.0)
    # ref - logp = ln 2: 2 - ln 2 - 1 = 0.306853;  ref - logp = -ln 2: 0.5 + ln 2 - 1 = 0.193147
    got = l04.k3_kl(torch.tensor([[0.0, ln2]]), torch.tensor([[ln2, 0.0]]))
    assert got.tolist()[0] == pytest.approx([0.306853, 0.193147], abs=1e-6)
    assert (l04.k3_kl(torch.randn(3, 5), torch.randn(3, 5)) >= 0).all()


L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize("loss_type, want", [
    ("grpo", (1.5 + 4.0) / 2),          # per-sequence means (1+2)/2 and 4/1, then their mean
    ("bnpo", 7 / 3),                    # (1 + 2 + 4) / 3 unmasked tokens
    ("dapo", 7 / 3),                    # same formula on a single generation batch
    ("dr_grpo", 7 / (2 * 4)),           # / (B * max_completion_length), max_completion_length = 4
])
def test_aggregate_loss_known_values(loss_type, want):
    assert l04.aggregate_loss(L, M, loss_type, max_completion_length=4).item() == pytest.approx(want)


def test_aggregate_loss_empty_sequences():
    m = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # grpo: the empty sequence contributes 0 but still counts in the mean over sequences (clamped denominator)
    assert l04.aggregate_loss(L, m, "grpo").item() == pytest.approx(1.5 / 2)
    assert l04.aggregate_loss(L, m, "bnpo").item() == pytest.approx(3 / 2)
    assert l04.aggregate_loss(L, m, "dr_grpo", max_completion_length=3).item() == pytest.approx(3 / 6)
    nothing = torch.zeros_like(m)
    for lt in ("grpo", "bnpo", "dapo"):
        assert l04.aggregate_loss(L, nothing, lt).item() == 0.0


def test_errors_are_helpful():
    with pytest.raises(ValueError, match="group_size >= 2"):
        rl.rloo_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError, match="not divisible"):
        rl.rloo_advantages(torch.ones(5), 2)
    with pytest.raises(ValueError, match=r"shape \(N,\)"):
        rl.rloo_advantages(torch.ones(2, 4), 4)
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'"):
        l04.aggregate_loss(L, M, "ppo")


# ============================================================================= against TRL's GRPOTrainer
# TRL builds the batch: `_generate_and_score_completions` (generation, rewards, advantages, reference log-probs),
# called on one generation batch laid out as `RepeatSampler` does (each prompt repeated G times), with
# gradient_accumulation_steps = steps_per_generation = num_iterations = 1, so TRL's batch is also the micro-batch.
# TRL's loss is `trainer.compute_loss`; ours recomputes the per-token log-probs from the model's logits and
# applies lesson 04's answers. The value and the gradient of both are compared, on-policy and with perturbed old log-probs.
G = 4                      # num_generations
B = 8                      # per_device_train_batch_size = one generation batch (2 prompts x 4)
MAX_LEN = 16               # max_completion_length
EPS, EPS_HIGH = 0.2, 0.28  # epsilon, epsilon_high
STOP = "\n\n"              # extra stop token, so completions end at varied lengths (some padding in the mask)


def length_reward(completions, **kwargs):
    """Deterministic, varied reward (so advantages are not all zero): characters / 10."""
    return [len(rewards.completion_text(c)) / 10 for c in completions]


def _policy(tok):
    """The tiny model, slightly perturbed (seeded) so that policy != reference and the KL is not 0."""
    model, _ = tiny.load()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.model.layers[0].parameters():
            p.add_(0.005 * torch.randn(p.shape, generator=gen))
    # stop at "\n\n" as well as at <|im_end|>/<|endoftext|>: TRL reads its eos ids from the generation config
    (stop_id,) = tok.encode(STOP)
    model.generation_config.eos_token_id = [*model.generation_config.eos_token_id, stop_id]
    return model


class TRLRig:
    """GRPOTrainers and generation batches, built lazily and cached (the module fixture shares one rig)."""

    def __init__(self, tmp):
        _, self.tok = tiny.load()
        problems = data.make_problems(8, split="train", seed=0)
        self.dataset = Dataset.from_list([{"prompt": data.to_prompt_messages(p), "answer": p["answer"]}
                                          for p in problems])
        self.tmp = tmp
        self.trainers, self.batches = {}, {}

    def trainer(self, loss_type, beta, temperature=1.0, scale="group", bias_kl=False, **extra):
        key = (loss_type, beta, temperature, scale, bias_kl, *sorted(extra.items()))
        if key not in self.trainers:
            from trl import GRPOConfig, GRPOTrainer

            # CPU, fp32. TRL's configs default to bf16=True and gradient_checkpointing=True; transformers 5.23 reads
            # the latter as a deprecated alias of activation_checkpointing, so that is the name to turn off.
            args = GRPOConfig(
                output_dir=str(self.tmp / "_".join(map(str, key)).replace(" ", "")), use_cpu=True, bf16=False, fp16=False,
                activation_checkpointing=False, report_to=[], seed=0, per_device_train_batch_size=B,
                gradient_accumulation_steps=1, num_generations=G, max_completion_length=MAX_LEN,
                temperature=temperature, loss_type=loss_type, beta=beta,
                **{"epsilon": EPS, "epsilon_high": EPS_HIGH, **extra},
                scale_rewards=scale, use_bias_correction_kl=bias_kl)
            trainer = GRPOTrainer(model=_policy(self.tok), args=args, train_dataset=self.dataset,
                                  processing_class=self.tok,
                                  reward_funcs=[rewards.correctness_reward, rewards.format_reward, length_reward])
            # what Trainer.train() sets before the first step (gradient_accumulation_steps=1)
            trainer.model.train()
            trainer.current_gradient_accumulation_steps = 1
            self.trainers[key] = trainer
        return self.trainers[key]

    def batch(self, beta, temperature=1.0, scale="group"):
        """One generation batch (TRL's own `_generate_and_score_completions`) and its summed rewards, shared by
        all loss types (generation does not depend on `loss_type`)."""
        key = (beta, temperature, scale)
        if key not in self.batches:
            trainer = self.trainer("dapo", beta, temperature, scale)
            inputs = [self.dataset[i] for i in range(B // G) for _ in range(G)]   # RepeatSampler's layout
            torch.manual_seed(0)
            batch = trainer._generate_and_score_completions(inputs)
            logged = trainer._logs["rewards"]                                     # this batch's rewards, in order
            total = torch.tensor([list(logged[name]) for name in trainer.reward_func_names]).sum(0)
            self.batches[key] = (batch, total)
        return self.batches[key]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    # One intra-op thread: the tiny model gains nothing from more, and on a busy machine threads waiting for each
    # other made these tests several times slower. Restored afterwards for the rest of the session.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield TRLRig(tmp_path_factory.mktemp("grpo"))
    torch.set_num_threads(threads)


# (loss_type, beta, temperature, scale_rewards, use_bias_correction_kl)
CASES = [(lt, 0.0, 1.0, "group", False) for lt in LOSS_TYPES] + [
    (lt, 0.04, 1.0, "group", False) for lt in LOSS_TYPES] + [
    ("dapo", 0.04, 1.0, "group", True),     # TRL's default: the KL term is weighted by the ratio rho
    ("grpo", 0.04, 0.7, "group", True),     # temperature scaling of the log-probs (policy and reference)
    ("bnpo", 0.0, 1.0, "batch", False),     # the other two scale_rewards
    ("dr_grpo", 0.0, 1.0, "none", False),
]


def assert_same_loss_and_grads(model, trl_loss, our_loss):
    """TRL's loss and ours on the same batch: the same value (to 1e-5) and the same gradient of every trainable
    parameter. Our graph is kept (its log-probs are reused by a later check)."""
    assert our_loss.item() == pytest.approx(trl_loss.item(), abs=1e-5)
    params = [p for p in model.parameters() if p.requires_grad]
    trl_grads = torch.autograd.grad(trl_loss, params, allow_unused=True, materialize_grads=True)
    our_grads = torch.autograd.grad(our_loss, params, allow_unused=True, materialize_grads=True, retain_graph=True)
    for g_trl, g_ours in zip(trl_grads, our_grads):
        torch.testing.assert_close(g_ours, g_trl, atol=1e-5, rtol=1e-4)


def moved_old_logps(logps, mask):
    """Old log-probs moved from ``logps`` by a fixed random amount (seed 1), so that clips and gates bind on some
    tokens; zero on padding, as TRL's own log-probs are there."""
    gen = torch.Generator().manual_seed(1)
    return (logps.detach() + 0.3 * torch.randn(logps.shape, generator=gen)) * mask


@pytest.mark.parametrize("loss_type, beta, temperature, scale, bias_kl", CASES)
def test_loss_matches_trl_grpo_trainer(rig, loss_type, beta, temperature, scale, bias_kl):
    trainer = rig.trainer(loss_type, beta, temperature, scale, bias_kl)
    batch, total_rewards = rig.batch(beta, temperature, scale)
    model, mask = trainer.model, batch["completion_mask"]

    # the generation batch: varied lengths (padding in the mask), TRL's advantages = ours from its rewards
    assert batch["completion_ids"].shape[0] == B and batch["completion_ids"].shape[1] <= MAX_LEN
    assert mask.sum(-1).min() < mask.sum(-1).max()
    assert "old_per_token_logps" not in batch                 # num_iterations=1: TRL uses logps.detach()
    assert batch["num_items_in_batch"].item() == mask.sum().item()
    adv = l04.group_advantages(total_rewards, G, scale=scale)
    assert adv.abs().max() > 0.1, "the test needs non-zero advantages"
    torch.testing.assert_close(batch["advantages"], adv, atol=1e-5, rtol=1e-5)

    logps = rl.per_token_logps(model, batch, temperature)
    ref_logps = None
    if beta > 0:
        with torch.no_grad():
            ref_logps = rl.per_token_logps(trainer.ref_model, batch, temperature)
        torch.testing.assert_close(batch["ref_per_token_logps"] * mask, ref_logps * mask, atol=1e-5, rtol=1e-5)

    def ours(old_logps):
        per_token = l04.clipped_surrogate(logps, old_logps, batch["advantages"], eps_low=EPS, eps_high=EPS_HIGH)
        if beta > 0:
            kl = l04.k3_kl(logps, ref_logps)
            if bias_kl:  # TRL's use_bias_correction_kl (default True): KL times the unclipped ratio, with gradient
                kl = kl * torch.exp(logps - old_logps)
            per_token = per_token + beta * kl                               # added per token, before aggregation
        return l04.aggregate_loss(per_token, mask, loss_type, max_completion_length=MAX_LEN)

    # 1. on-policy (old = logps.detach(), rho = 1): the value is just -A (+ KL), the gradient is the real check
    assert_same_loss_and_grads(model, trainer.compute_loss(model, batch), ours(logps.detach()))
    if beta > 0:
        kl = masked_mean(l04.k3_kl(logps, ref_logps), mask).item()
        assert kl > 1e-4, "the test needs policy != reference"
        assert trainer._metrics["train"]["kl"][-1] == pytest.approx(kl, abs=1e-5)

    # 2. off-policy: old log-probs moved, so the clip binds on some tokens
    old_logps = moved_old_logps(logps, mask)
    trl_loss = trainer.compute_loss(model, {**batch, "old_per_token_logps": old_logps})
    assert_same_loss_and_grads(model, trl_loss, ours(old_logps))
    rho = torch.exp(logps.detach() - old_logps)
    a = batch["advantages"].unsqueeze(1)
    low, high = (rho < 1 - EPS) & (a < 0), (rho > 1 + EPS_HIGH) & (a > 0)
    assert (low & mask.bool()).any() and (high & mask.bool()).any(), "the clip must bind on both sides"
    for name, clipped in [("low_mean", low), ("high_mean", high), ("region_mean", low | high)]:
        assert trainer._metrics["train"][f"clip_ratio/{name}"][-1] == pytest.approx(
            masked_mean(clipped.float(), mask).item(), abs=1e-6)
    # and the clip changes the surrogate: the unclipped ratio gives another value
    clipped = l04.aggregate_loss(l04.clipped_surrogate(logps.detach(), old_logps, a, EPS, EPS_HIGH), mask, loss_type,
                                max_completion_length=MAX_LEN)
    unclipped = l04.aggregate_loss(-rho * a, mask, loss_type, max_completion_length=MAX_LEN)
    assert abs(unclipped.item() - clipped.item()) > 1e-3


# GSPO, CISPO and SAPO (lesson 05's answers on lesson 04's clip and aggregation): the configuration TRL's docs give
# for each, with ranges at which the clip or the gate binds on these perturbed old log-probs.
FAMILIES = {
    "gspo": ({"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
             lambda lp, old, a, m: l04.aggregate_loss(l04.clipped_surrogate(
                 l05.sequence_log_ratio(lp, old, m), torch.zeros(len(lp), 1), a, 3e-4, 4e-4), m, "grpo")),
    "cispo": ({"loss_type": "cispo", "epsilon_high": 1.2},
              lambda lp, old, a, m: l04.aggregate_loss(l05.cispo_surrogate(lp, old, a, 1.2), m, "dapo")),
    "sapo": ({"loss_type": "sapo", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05},
             lambda lp, old, a, m: l04.aggregate_loss(l05.sapo_surrogate(lp, old, a, 1.0, 1.05), m, "grpo")),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_loss_families_match_trl_grpo_trainer(rig, family):
    """Value and gradient of lesson 05's GSPO ratio, CISPO and SAPO equal GRPOTrainer.compute_loss's, off-policy
    (old log-probs moved by a fixed random amount), where GSPO's clip, CISPO's cap and SAPO's gate bind."""
    config, ours = FAMILIES[family]
    trainer = rig.trainer(config["loss_type"], 0.0, **{k: v for k, v in config.items() if k != "loss_type"})
    batch, _ = rig.batch(0.0)
    model, mask, adv = trainer.model, batch["completion_mask"], batch["advantages"]
    logps = rl.per_token_logps(model, batch)
    old_logps = moved_old_logps(logps, mask)
    trl_loss = trainer.compute_loss(model, {**batch, "old_per_token_logps": old_logps})
    assert_same_loss_and_grads(model, trl_loss, ours(logps, old_logps, adv, mask))
    # the bound binds here: the gradient of the loss per log-prob differs from the plain policy gradient's
    x = logps.detach().requires_grad_(True)
    (per_logp,) = torch.autograd.grad(ours(x, old_logps, adv, mask), x)
    (plain,) = torch.autograd.grad(l04.aggregate_loss(-adv[:, None] * x, mask, "grpo" if family != "cispo" else "dapo"), x)
    rho = torch.exp(logps.detach() - old_logps)
    if family == "gspo":   # whole completions: some without any gradient, some with
        dead = ((per_logp == 0) | (mask == 0)).all(1) & (adv != 0)      # a completion with a push, and no gradient
        assert dead.any() and not dead[adv != 0].all(), "GSPO's clip must drop some completions and keep others"
    elif family == "cispo":   # no token loses its gradient; the capped ones are scaled, not dropped
        capped = (rho > 1.2) & mask.bool() & (adv[:, None] != 0)
        assert capped.any() and (per_logp[capped] != 0).all()
        torch.testing.assert_close(per_logp[capped], plain[capped] * 1.2, atol=1e-6, rtol=1e-5)
    else:                  # the gate moves every weight off 1 and cuts none
        live = mask.bool() & (adv[:, None] != 0)
        assert (per_logp[live] != 0).all() and ((per_logp[live] / plain[live] - 1).abs() > 1e-3).any()


class GradientRecorder(torch.optim.Optimizer):
    """step() keeps a copy of each parameter's gradient and changes nothing (lesson 04's capstone comparison)."""

    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):
        self.grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                      for group in self.param_groups for p in group["params"]]


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_grpo_step_applies_the_gradient_of_trl_grpo_trainer(rig, loss_type):
    """Lesson 04's capstone answer, grpo_step, on TRL's own generation batch (its sampler and rewards replayed): the
    loss it reports and the gradient it hands the optimizer are GRPOTrainer.compute_loss's on the batch it returns,
    its advantages and reference log-probs TRL's (temperature 0.7, beta > 0, the policy away from the reference)."""
    import copy

    trainer = rig.trainer(loss_type, 0.04, 0.7)
    trl_batch, total_rewards = rig.batch(0.04, 0.7)
    model = trainer.model
    params = [p for p in model.parameters() if p.requires_grad]
    recorder = GradientRecorder(params)
    args = copy.copy(trainer.args)
    args.max_grad_norm = float("inf")            # the recorder sees the gradient itself
    sample = lambda policy, ids, mask: (trl_batch["completion_ids"], trl_batch["completion_mask"])
    out = l04.grpo_step(model, trainer.ref_model, trl_batch["prompt_ids"][::G], trl_batch["prompt_mask"][::G],
                        recorder, args, sample, lambda ids, mask: total_rewards, l04.group_advantages,
                        l04.clipped_surrogate, l04.k3_kl, l04.aggregate_loss)
    batch, mask = out["batch"], trl_batch["completion_mask"]
    assert torch.equal(batch["prompt_ids"], trl_batch["prompt_ids"]) and all(p.grad is None for p in params)
    torch.testing.assert_close(batch["advantages"], trl_batch["advantages"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch["ref_per_token_logps"] * mask, trl_batch["ref_per_token_logps"] * mask,
                               atol=1e-5, rtol=1e-5)
    trl_loss = trainer.compute_loss(model, {**batch, "num_items_in_batch": trl_batch["num_items_in_batch"]})
    assert out["loss"] == pytest.approx(trl_loss.item(), abs=1e-5)
    trl_grads = torch.autograd.grad(trl_loss, params, allow_unused=True, materialize_grads=True)
    assert max(g.abs().max().item() for g in trl_grads) > 1e-4, "the test needs a gradient"
    for g_trl, g_ours in zip(trl_grads, recorder.grads):
        torch.testing.assert_close(g_ours, g_trl, atol=1e-5, rtol=1e-4)
    grouped = total_rewards.view(-1, G)
    assert out["reward"] == pytest.approx(total_rewards.mean().item())
    assert out["frac_reward_zero_std"] == pytest.approx((grouped == grouped[:, :1]).all(1).float().mean().item())


# ============================================================================= GRPOConfig from a preset
def test_grpo_config_follows_the_preset(tmp_path):
    from utils import presets

    cfg = presets.resolve("tiny", lesson="04")
    args = rl.grpo_config(cfg, tmp_path)
    assert (args.num_generations, args.temperature, args.beta, args.loss_type) == (
        cfg.num_generations, cfg.temperature, cfg.beta, cfg.loss_type)
    assert args.max_completion_length == cfg.max_completion_length and args.max_steps == cfg.max_steps
    assert args.bf16 is False and args.fp16 is False, "precision follows the preset, not TRL's bf16=True default"
    assert args.use_vllm is False
    # one optimizer step consumes one generation batch of whole groups
    assert args.generation_batch_size == cfg.prompts_per_step * cfg.num_generations
    assert args.steps_per_generation == args.gradient_accumulation_steps
    assert rl.grpo_config(cfg, tmp_path, beta=0.0, max_steps=3).beta == 0.0


def test_grpo_config_rejects_inconsistent_sizes_and_missing_vllm(tmp_path, monkeypatch):
    import importlib.util

    from utils import presets

    with pytest.raises(ValueError, match="prompts_per_step"):
        rl.grpo_config(presets.resolve("tiny", lesson="04", prompts_per_step=3), tmp_path)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    with pytest.raises(ImportError, match="pip install vllm"):
        rl.grpo_config(presets.resolve("tiny", lesson="04", use_vllm=True), tmp_path)



@pytest.mark.parametrize("preset", ["tiny", "24g"])
def test_lesson05_configs_split_each_generation_batch_into_two_steps(tmp_path, preset, monkeypatch):
    from utils import presets

    monkeypatch.setattr(presets, "_check_gpu", lambda *a: None)        # sizes only: no GPU or Hub needed
    monkeypatch.setattr(presets, "_hub_downloads", lambda *a: [])
    cfg = presets.resolve(preset, lesson="05")
    grpo = rl.grpo_config(cfg, tmp_path, loss_type="dr_grpo", scale_rewards="none")
    rloo = rl.rloo_config(cfg, tmp_path)
    for args in (grpo, rloo):
        assert args.generation_batch_size == cfg.prompts_per_step * cfg.num_generations
        assert args.steps_per_generation == 2 * args.gradient_accumulation_steps, "two optimizer steps per batch"
        assert (args.num_generations, args.temperature, args.max_completion_length) == (
            cfg.num_generations, cfg.temperature, cfg.max_completion_length)
        assert args.beta == cfg.beta == 0.0, "RLOOConfig's own default is 0.05: the preset's beta is passed"
        assert args.lr_scheduler_type == "constant_with_warmup"
    assert (grpo.loss_type, grpo.scale_rewards) == ("dr_grpo", "none")
    assert rl.grpo_config(cfg, tmp_path, epsilon_high=cfg.epsilon_high).epsilon_high == 0.28
    with pytest.raises(ValueError, match="multiple of grad_accum"):
        rl.rloo_config(presets.resolve("tiny", lesson="05", grad_accum=3), tmp_path)
    with pytest.raises(ValueError, match="steps_per_generation"):
        rl.rloo_config(presets.resolve("tiny", lesson="05", num_generations=4), tmp_path)

# ----------------------------------------------------------------------------- DAPO pieces (lesson 05)
def test_zero_std_groups():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert rl.zero_std_groups(r, 3).tolist() == [True, False, True]
    with pytest.raises(ValueError):
        rl.zero_std_groups(r, 4)


def test_dynamic_sampling_refills_the_batch():
    table = {"a": [1, 1], "b": [0, 1], "c": [0, 0], "d": [1, 0], "e": [0, 1]}
    kept, stats = l05.dynamic_sampling(lambda p: table[p], "abcde", num_groups=2, group_size=2)
    assert kept == [("b", [0.0, 1.0]), ("d", [1.0, 0.0])]
    assert stats == {"sampled": 4, "dropped": 2, "exhausted": False}, "stops as soon as the batch is full"
    kept, stats = l05.dynamic_sampling(lambda p: table[p], "abc", num_groups=2, group_size=2)
    assert len(kept) == 1 and stats == {"sampled": 3, "dropped": 2, "exhausted": True}
    with pytest.raises(ValueError, match="expected 2"):
        l05.dynamic_sampling(lambda p: [1.0], "a", num_groups=1, group_size=2)


def test_soft_overlong_penalty_values_and_trl():
    from trl.rewards import get_soft_overlong_punishment

    lengths = [0, 50, 80, 81, 90, 99, 100, 101, 500]
    got = l05.soft_overlong_penalty(lengths, max_completion_length=100, cache_length=20)
    assert got == pytest.approx([0, 0, 0, -0.05, -0.5, -0.95, -1.0, -1.0, -1.0])
    trl_fn = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    assert got == pytest.approx(trl_fn([[7] * n for n in lengths]))
    with pytest.raises(ValueError):
        l05.soft_overlong_penalty([1], 10, 0)


def test_decode_rollout_gives_trls_rollouts(rig):
    """rl.decode_rollout (GRPOTrainer's rollout_func) tokenizes the prompts as TRL does and, near-greedy
    (temperature 1e-3, where both samplers give the argmax), returns TRL's own completions: cut after the
    first eos id of the trainer (kept), or at max_completion_length."""
    trainer = rig.trainer("dapo", 0.0, temperature=1e-3)
    inputs = [rig.dataset[i] for i in range(B // G) for _ in range(G)]
    prompts = [x["prompt"] for x in inputs]
    ours = rl.decode_rollout(prompts, trainer)
    assert ours["logprobs"] is None and set(ours) == {"prompt_ids", "completion_ids", "logprobs"}
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    assert ours["prompt_ids"] == [list(p) for p in prompt_ids]
    torch.manual_seed(0)
    theirs, _ = trainer._generate_single_turn(prompt_ids, None, {}, G)
    assert ours["completion_ids"] == [list(c) for c in theirs]
    lengths = {len(c) for c in ours["completion_ids"]}
    assert max(lengths) <= MAX_LEN and len(lengths) > 1
    ended = [c for c in ours["completion_ids"] if c[-1] in trainer.eos_token_ids]
    assert ended and all(not set(c[:-1]) & set(trainer.eos_token_ids) for c in ended)


def test_decode_rollout_in_a_training_batch(rig):
    """Set as the trainer's rollout_func, it feeds TRL's scoring: one batch of B completions, G per prompt,
    sampled (temperature 1: a group is not G copies), with rewards and advantages."""
    trainer = rig.trainer("dapo", 0.0)
    inputs = [rig.dataset[i] for i in range(B // G) for _ in range(G)]
    trainer.rollout_func = rl.decode_rollout
    try:
        torch.manual_seed(0)
        batch = trainer._generate_and_score_completions(inputs)
    finally:
        trainer.rollout_func = None
    assert batch["completion_ids"].shape[0] == B and batch["advantages"].shape == (B,)
    rows = [tuple(r[m.bool()].tolist()) for r, m in zip(batch["completion_ids"], batch["completion_mask"])]
    assert len(set(rows[:G])) > 1
    trainer.top_k = 5
    try:
        with pytest.raises(ValueError, match="top_k"):
            rl.decode_rollout([x["prompt"] for x in inputs], trainer)
    finally:
        trainer.top_k = 0


# ----------------------------------------------------------------------------- lesson 05: where the clip binds
def _probe_batch():
    from peft import LoraConfig

    model, tok = tiny.load()
    prompts = [tok.apply_chat_template(data.to_prompt_messages(p), tokenize=False, add_generation_prompt=True)
               for p in data.make_problems(2, split="train", seed=0)]
    completions = [["x = 3 + 4 = 7", "7"], ["no idea at all", "answer: 12 and more words here"]]
    batch = rl.completion_batch(tok, prompts, completions, stop_id=tok.eos_token_id, max_completion_length=12)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return model, tok, batch, lora


def test_completion_batch_is_trls_layout():
    model, tok, batch, _ = _probe_batch()
    assert batch["prompt_ids"].shape[0] == batch["completion_ids"].shape[0] == 4
    # prompts left-padded (their last column is real), each group's rows adjacent
    assert batch["prompt_mask"][:, -1].all() and torch.equal(batch["prompt_ids"][0], batch["prompt_ids"][1])
    assert not torch.equal(batch["prompt_ids"][1], batch["prompt_ids"][2])
    # completions right-padded; the mask covers the text and the end token, nothing after
    for row, text in enumerate(["x = 3 + 4 = 7", "7", "no idea at all", "answer: 12 and more words here"]):
        n = int(batch["completion_mask"][row].sum())
        ids = batch["completion_ids"][row, :n].tolist()
        if len(tok.encode(text, add_special_tokens=False)) < 12:
            assert ids[-1] == tok.eos_token_id and tok.decode(ids[:-1]) == text
        else:   # cut at max_completion_length, with no end token (as TRL's batches)
            assert len(ids) == 12 and ids[-1] != tok.eos_token_id and text.startswith(tok.decode(ids))
        assert batch["completion_mask"][row, :n].all() and not batch["completion_mask"][row, n:].any()
    entropy, logps = rl.token_entropy_logps(model, batch, micro_batch=3)
    with torch.no_grad():
        want = rl.per_token_logps(model, batch)
    mask = batch["completion_mask"].bool()
    assert torch.allclose(logps[mask], want[mask], atol=1e-5) and (entropy[mask] >= 0).all()


def test_off_policy_steps_accumulate_micro_batches_and_leave_the_model_alone():
    model, _, batch, lora = _probe_batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _, old = rl.token_entropy_logps(model, batch, micro_batch=4)
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0])
    kw = dict(surrogate_fn=l04.clipped_surrogate, aggregate_fn=l04.aggregate_loss, steps=3, learning_rate=0.05, eps_low=0.2, lora_config=lora, seed=0)
    whole = rl.off_policy_steps(model, batch, old, advantages, eps_high=0.2, micro_batch=4, **kw)
    parts = rl.off_policy_steps(model, batch, old, advantages, eps_high=0.2, micro_batch=1, **kw)
    unclipped = rl.off_policy_steps(model, batch, old, advantages, eps_high=10.0, micro_batch=4, **kw)
    mask = batch["completion_mask"].bool()
    # one optimizer step over the whole batch, however it is cut into micro-batches
    assert torch.allclose(whole["logps"][mask], parts["logps"][mask], atol=1e-5)
    assert whole["up_clipped"][0] == 0.0, "the first step is on-policy: every ratio is 1"
    assert whole["clipped"].any() and not (whole["clipped"] & ~mask).any()
    assert not whole["clipped"][advantages <= 0].any(), "only tokens with A > 0 are up-clipped"
    assert max(whole["up_clipped"]) > 0, "a large learning rate moves ratios past 1 + eps"
    assert max(unclipped["up_clipped"]) < max(whole["up_clipped"]), "fewer ratios pass a higher bound"
    assert not torch.allclose(whole["logps"][mask], unclipped["logps"][mask]), "the upper clip changed the steps"
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), "the model is not trained"
