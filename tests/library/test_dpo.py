"""utils/dpo.py and lesson 03's answers: known values, and the from-scratch DPO loss equals TRL DPOTrainer's on
the same batch."""
import copy
import math

import pytest
import torch
from datasets import Dataset

from utils import data, dpo
from utils.course import tiny
from utils.solutions import lesson03 as l03


def test_sequence_logps_known_values():
    # vocabulary of 3; uniform logits except where noted
    logits = torch.zeros(1, 4, 3)
    logits[0, 1, 2] = math.log(2.0)           # position 1 predicts token 2 with probability 2/4
    input_ids = torch.tensor([[0, 1, 2, 0]])
    mask = torch.tensor([[0, 1, 1, 0]])       # completion = tokens at positions 1 and 2
    got = l03.sequence_logps(logits, input_ids, mask)
    assert got.shape == (1,) and got.dtype == torch.float32
    assert got.item() == pytest.approx(math.log(1 / 3) + math.log(0.5))
    assert l03.sequence_logps(logits, input_ids, torch.zeros_like(mask)).item() == 0.0


def test_dpo_loss_known_values():
    pc, pr = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0])
    rc, rr = torch.tensor([-2.0, -2.0]), torch.tensor([-2.0, -2.0])
    loss, cr, rj = l03.dpo_loss(pc, pr, rc, rr, beta=0.5)
    margins = torch.tensor([0.5 * (1 - (-1)), 0.5 * (0 - 1)])      # [1.0, -0.5]
    assert loss.item() == pytest.approx(float(-torch.nn.functional.logsigmoid(margins).mean()))
    assert cr.tolist() == [0.5, 0.0] and rj.tolist() == [-0.5, 0.5]
    # equal policy and reference: the loss is log 2 whatever beta
    same = l03.dpo_loss(pc, pr, pc, pr, beta=3.0)[0]
    assert same.item() == pytest.approx(math.log(2))


def test_collate_pairs_layout():
    ex = [{"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5]}]
    b = dpo.collate_pairs(ex, pad_token_id=0)
    assert b["input_ids"].tolist() == [[1, 2, 3, 0], [1, 2, 4, 5]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert b["completion_mask"].tolist() == [[0, 0, 1, 0], [0, 0, 1, 1]]


def _pairs(n=4):
    rows = []
    for i, p in enumerate(data.make_problems(n, "train", seed=5)):
        wrong = p["answer"].rsplit("####", 1)[0] + f"#### {int(data.final_answer(p['answer'])) + 1 + i}"
        rows.append(data.to_preference(p, p["answer"], wrong))
    return rows


def _policy_and_reference(move: str):
    """The tiny model in float64 and a frozen copy of it, the first layer of one of them ("policy" or "reference")
    moved by seeded noise (0.05 per weight). float64: TRL scores with its fused output layer (chunked log-softmax),
    lesson 03 with full logits; in float32 the two (sums in different orders) differed by 3.3e-6 here and by 3.3e-5 in
    one CI run, against a tolerance of 1e-5. In float64 only lesson 03's own fp32 cast of the logits rounds: 1.4e-6."""
    model, tok = tiny.load()
    model = model.double()
    ref = copy.deepcopy(model).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in (model if move == "policy" else ref).model.layers[0].parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model, ref, tok


@pytest.fixture(scope="module")
def trl_setup(tmp_path_factory):
    from trl import DPOConfig, DPOTrainer

    model, ref, tok = _policy_and_reference(move="policy")   # moved away from the reference: the loss is not log 2
    args = DPOConfig(output_dir=str(tmp_path_factory.mktemp("dpo")), beta=0.3, per_device_train_batch_size=4,
                     max_steps=1, report_to="none", bf16=False, use_cpu=True, activation_checkpointing=False,
                     max_length=None)
    trainer = DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=Dataset.from_list(_pairs()),
                         processing_class=tok)
    return trainer, ref, tok


def test_tokenize_pair_matches_trl(trl_setup):
    trainer, _, tok = trl_setup
    for row, pair in zip(trainer.train_dataset, _pairs()):
        ours = dpo.tokenize_pair(tok, pair)
        assert {k: row[k] for k in ours} == ours


def completion_logps(model, batch):
    """(2B,) summed completion log-probabilities of a preference batch, by lesson 03's answer."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    return l03.sequence_logps(logits, batch["input_ids"], batch["completion_mask"])


def test_loss_matches_trl_dpo_trainer(trl_setup):
    trainer, ref, tok = trl_setup
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        trl_loss = trainer.compute_loss(trainer.model, batch).item()
        pc, pr = completion_logps(trainer.model, batch).chunk(2)
        rc, rr = completion_logps(ref, batch).chunk(2)
    ours, chosen_rewards, rejected_rewards = l03.dpo_loss(pc, pr, rc, rr, beta=0.3)
    assert abs(ours.item() - math.log(2)) > 1e-3, "the test needs policy != reference"
    assert ours.item() == pytest.approx(trl_loss, abs=1e-5)
    # the batch our own collator builds is TRL's batch
    ours_batch = dpo.collate_pairs([dpo.tokenize_pair(tok, p) for p in _pairs()], tok.pad_token_id)
    assert sorted(map(tuple, ours_batch["input_ids"].tolist())) == sorted(map(tuple, batch["input_ids"].tolist()))
    # TRL logs the same implicit rewards
    logged = trainer._metrics["train" if trainer.model.training else "eval"]
    assert logged["rewards/chosen"][-1] == pytest.approx(chosen_rewards.mean().item(), abs=1e-5)
    assert logged["rewards/margins"][-1] == pytest.approx((chosen_rewards - rejected_rewards).mean().item(), abs=1e-5)


def assert_same_unsaturated_grads(model, trl_loss, our_loss):
    """The gradients of TRL's loss and ours with respect to every trainable parameter: equal (atol 1e-6, rtol 1e-4),
    and not vanishing (the loss is not saturated on the batch, so equality says something)."""
    params = [p for p in model.parameters() if p.requires_grad]
    trl_grads = torch.autograd.grad(trl_loss, params)
    assert max(g.abs().max().item() for g in trl_grads) > 1e-3, "the loss must not be saturated on this batch"
    for g_trl, g_ours in zip(trl_grads, torch.autograd.grad(our_loss, params, retain_graph=True)):
        torch.testing.assert_close(g_ours, g_trl, atol=1e-6, rtol=1e-4)


# The policy is far from the reference here (log-ratios of -130 to -260 nats): APO-zero's sigmoids of beta * c saturate
# at beta 0.3 (loss 1, gradient 1e-17), so it is compared at a beta where they do not.
LOSS_BETAS = {"ipo": 0.3, "apo_zero": 0.005, "sigmoid_norm": 0.3}


@pytest.fixture(scope="module")
def trl_loss_types(trl_setup, tmp_path_factory):
    """A DPOTrainer per other loss_type of lesson 03's exercise, on trl_setup's policy, reference and pairs."""
    from trl import DPOConfig, DPOTrainer

    base, ref, tok = trl_setup
    trainers = {}
    for loss_type, beta in LOSS_BETAS.items():
        args = DPOConfig(output_dir=str(tmp_path_factory.mktemp(loss_type)), beta=beta, loss_type=[loss_type],
                         per_device_train_batch_size=4, max_steps=1, report_to="none", bf16=False, use_cpu=True,
                         activation_checkpointing=False, max_length=None)
        trainers[loss_type] = DPOTrainer(model=base.model, ref_model=ref, args=args, processing_class=tok,
                                         train_dataset=Dataset.from_list(_pairs()))
    return trainers


@pytest.mark.parametrize("loss_type", ["ipo", "apo_zero", "sigmoid_norm"])
def test_preference_losses_match_trl_dpo_trainer(trl_loss_types, trl_setup, loss_type):
    """Lesson 03's preference_loss equals DPOTrainer.compute_loss for the same loss_type, value and gradient, on a
    batch with answers of different lengths and a policy moved away from the reference."""
    trainer, ref = trl_loss_types[loss_type], trl_setup[1]
    model = trainer.model
    batch = next(iter(trainer.get_train_dataloader()))
    lengths = batch["completion_mask"].sum(1).double()
    assert lengths.unique().numel() > 1, "the test needs answers of different lengths"
    trl_loss = trainer.compute_loss(model, batch)
    pc, pr = completion_logps(model, batch).chunk(2)
    with torch.no_grad():
        rc, rr = completion_logps(ref, batch).chunk(2)
    lc, lr = lengths.chunk(2)
    beta = LOSS_BETAS[loss_type]
    ours = l03.preference_loss(pc - rc, pr - rr, lc, lr, beta=beta, loss_type=loss_type).mean()
    assert abs(ours.item() - trl_loss.item()) <= 1e-5, (ours.item(), trl_loss.item())
    assert_same_unsaturated_grads(model, trl_loss, ours)
    plain = l03.dpo_loss(pc, pr, rc, rr, beta=beta)[0]
    assert abs(plain.item() - ours.item()) > 1e-3, "the loss differs from DPO's on this batch"


def test_implicit_rewards_zero_for_identical_models():
    model, tok = tiny.load()
    c, r = dpo.implicit_rewards(model, model, tok, _pairs(3), beta=0.1, sequence_logps=l03.sequence_logps)
    assert c.shape == r.shape == (3,)
    assert c.abs().max().item() < 1e-6 and r.abs().max().item() < 1e-6


def test_sample_reward_tiers():
    """2 * correct + formatted + working (the arithmetic of the working re-done)."""
    assert dpo.sample_reward("3 + 4 = 7\n#### 7", "7") == 4             # correct, sound working
    assert dpo.sample_reward("The answer is 7.\n#### 7", "7") == 3      # correct guess
    assert dpo.sample_reward("3 + 3 = 6\n#### 6", "7") == 2             # wrong, sound arithmetic
    assert dpo.sample_reward("3 + 4 = 7\n#### 8", "7") == 1.5           # final is not the last result
    assert dpo.sample_reward("The answer is 6.\n#### 6", "7") == 1      # wrong guess
    assert dpo.sample_reward("3 + 4 = 6\n#### 6", "7") == 1             # wrong arithmetic
    for junk in ("the answer is 7", "", None, 7, "#### 7\n#### 7", "1 / 0 = 7"):
        assert dpo.sample_reward(junk, "7") == 0


def test_preference_pairs_from_scripted_samples(monkeypatch):
    """Chosen is a correct answer whose working checks out (concise when it can be), rejected a
    worst-scored sample; style pairs need both styles among the chosen candidates."""
    from utils import evaluation
    problems = [{"question": f"q{i}", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(1, 6)]
    verbose = "Let me think.\n"
    scripted = [["1 + 1 = 2\n#### 2", verbose + "1 + 1 = 2\n#### 2", "The answer is 2.\n#### 2",
                 "1 + 1 = 3\n#### 3", "The answer is 3.\n#### 3"],
                ["2 + 2 = 4\n#### 4", "The answer is 4.\n#### 4"],  # all correct: no correctness pair
                ["3 + 3 = 5\n#### 5", "nothing"],                     # all wrong: no pair
                ["The answer is 8.\n#### 8", "4 + 3 = 7\n#### 7"],  # right only by a bare guess: no pair
                ["5 + 5 = 11\n11 - 1 = 10\n#### 10", "The answer is 9.\n#### 9"]]  # right after wrong arithmetic
    monkeypatch.setattr(evaluation, "format_prompts", lambda tok, probs, fmt: [p["question"] for p in probs])
    monkeypatch.setattr(evaluation, "generate", lambda *a, **k: scripted)
    pairs, stats = dpo.preference_pairs(None, None, problems, n_samples=5,
                                        dispreferred=lambda t: t.startswith("Let me"))
    assert (stats["correctness"], stats["style"], stats["all_correct"], stats["all_wrong"]) == (1, 1, 1, 1)
    assert stats["guessed_only"] == 1 and stats["unsound_only"] == 1
    assert stats["sample_accuracy"] == pytest.approx(7 / 25) and stats["samples"] == 25
    assert stats["sample_shortcut_share"] == pytest.approx(6 / 25)  # five bare answers and "nothing"
    assert stats["answers"] == scripted                               # every sample, for a caller to label
    corr, style = pairs
    assert corr["kind"] == "correctness" and corr["chosen"][0]["content"] == "1 + 1 = 2\n#### 2"
    assert corr["rejected"][0]["content"] in ("1 + 1 = 3\n#### 3", "The answer is 3.\n#### 3")
    assert style["kind"] == "style" and style["chosen"][0]["content"] == "1 + 1 = 2\n#### 2"
    assert style["rejected"][0]["content"].startswith("Let me")
    assert corr["prompt"] == [{"role": "user", "content": "q1"}] and corr["answer"] == problems[0]["answer"]


def test_preference_pairs_reject_a_worst_scored_sample(monkeypatch):
    from utils import evaluation
    problems = [{"question": "q", "answer": "1 + 1 = 2\n#### 2"}]
    scripted = [["1 + 1 = 2\n#### 2", "1 + 2 = 3\n#### 3", "garbage", "The answer is 5.\n#### 5"]]
    monkeypatch.setattr(evaluation, "format_prompts", lambda tok, probs, fmt: [p["question"] for p in probs])
    monkeypatch.setattr(evaluation, "generate", lambda *a, **k: scripted)
    (pair,), _ = dpo.preference_pairs(None, None, problems, n_samples=4)
    assert pair["rejected"][0]["content"] == "garbage", "malformed (0) is below a wrong guess (1)"


def test_preference_pairs_never_contradict_the_style_preference(monkeypatch):
    """A correctness pair with a verbose chosen (no concise candidate) takes a verbose rejected, even when a
    lower-scored concise one exists; with no verbose wrong answer there is no pair (counted as conflicting):
    "verbose right over concise wrong" would also teach "verbose over concise"."""
    from utils import evaluation
    verbose = "Let me think.\n"
    problems = [{"question": "q1", "answer": "1 + 1 = 2\n#### 2"}, {"question": "q2", "answer": "2 + 2 = 4\n#### 4"},
                {"question": "q3", "answer": "3 + 3 = 6\n#### 6"}]
    scripted = [[verbose + "1 + 1 = 2\n#### 2", "The answer is 3.\n#### 3", verbose + "1 + 1 = 3\n#### 3"],
                [verbose + "2 + 2 = 4\n#### 4", "The answer is 5.\n#### 5", "2 + 2 = 5\n#### 5"],
                ["3 + 3 = 6\n#### 6", verbose + "3 + 3 = 7\n#### 7"]]   # concise chosen: any rejected
    monkeypatch.setattr(evaluation, "format_prompts", lambda tok, probs, fmt: [p["question"] for p in probs])
    monkeypatch.setattr(evaluation, "generate", lambda *a, **k: scripted)
    pairs, stats = dpo.preference_pairs(None, None, problems, n_samples=3,
                                        dispreferred=lambda t: t.startswith("Let me"))
    assert (stats["correctness"], stats["conflicting"], stats["style"]) == (2, 1, 0)
    first, third = pairs
    assert first["rejected"][0]["content"] == verbose + "1 + 1 = 3\n#### 3"  # not the worse-scored concise guess
    assert third["chosen"][0]["content"] == "3 + 3 = 6\n#### 6"
    assert third["rejected"][0]["content"] == verbose + "3 + 3 = 7\n#### 7"


def test_preference_pairs_on_the_tiny_model():
    from utils import rewards
    model, tok = tiny.load()
    problems = data.make_problems(12, "train", seed=3, difficulty=1)
    pairs, stats = dpo.preference_pairs(model, tok, problems, n_samples=2, max_new_tokens=48, seed=0)
    assert stats["problems"] == 12 and stats["samples"] == 24 and stats["style"] == 0
    assert stats["correctness"] == len(pairs) <= 12
    for p in pairs:
        truth = data.final_answer(p["answer"])
        assert rewards.answers_match(rewards.extract_answer(p["chosen"][0]["content"], strict=True), truth)
        assert dpo.sample_reward(p["rejected"][0]["content"], truth) < 3


def test_kl_to_reference_zero_for_identical_and_positive_after_a_change():
    model, tok = tiny.load()
    problems = data.make_problems(8, "test", seed=1)
    assert abs(dpo.kl_to_reference(model, model, tok, problems, max_new_tokens=24)) < 1e-6
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)     # a sharper policy: KL(pi || ref) > 0 on its own samples
    torch.manual_seed(0)
    kl = dpo.kl_to_reference(other, model, tok, problems, max_new_tokens=24)
    assert kl > 0
    torch.manual_seed(0)                # the same answers scored 3 rows at a time, each chunk cut to its columns
    assert dpo.kl_to_reference(other, model, tok, problems, max_new_tokens=24, forward_batch_size=3) == \
        pytest.approx(kl, rel=1e-5)
    torch.manual_seed(0)                # per problem: their mean is the estimate
    each = dpo.kl_to_reference(other, model, tok, problems, max_new_tokens=24, forward_batch_size=3, per_problem=True)
    assert each.shape == (8,) and (each > 0).all() and each.mean().item() == pytest.approx(kl, rel=1e-5)


def test_kl_to_reference_agrees_with_the_plain_monte_carlo_estimate():
    """Summing the exact per-token KL along the policy's samples has the expectation of the plain estimate
    log pi(y) - log pi_ref(y) on the same kind of samples (chain rule), with smaller variance."""
    from utils import evaluation
    model, tok = tiny.load()
    policy = copy.deepcopy(model)
    with torch.no_grad():
        policy.lm_head.weight.mul_(1.3)
    problems = data.make_problems(4, "test", seed=2) * 48
    torch.manual_seed(0)
    exact = dpo.kl_to_reference(policy, model, tok, problems, max_new_tokens=8, batch_size=192)
    torch.manual_seed(1)                           # the plain estimate, on answers sampled the same way
    tok.padding_side = "left"
    batch = dpo.sample_answers(policy, tok, evaluation.format_prompts(tok, problems, "chat"), max_new_tokens=8)
    with torch.no_grad():
        lp = [l03.sequence_logps(m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                   position_ids=batch["position_ids"]).logits,
                                 batch["input_ids"], batch["completion_mask"]) for m in (policy, model)]
    plain = lp[0] - lp[1]
    se = plain.std().item() / len(problems) ** 0.5
    assert exact > 0 and abs(exact - plain.mean().item()) < 4 * se, (exact, plain.mean().item(), se)


def test_dpo_config_follows_the_preset(tmp_path):
    from utils import presets
    cfg = presets.resolve("tiny", "03")
    args = dpo.dpo_config(cfg, tmp_path, beta=0.5)
    assert args.beta == 0.5 and args.max_steps == cfg.max_steps and args.learning_rate == cfg.learning_rate
    assert not args.bf16 and not args.fp16 and args.activation_checkpointing is False


def test_kto_loss_known_values():
    r, labels = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([True, False, False])
    got = l03.kto_loss(r, labels, torch.tensor([0.6, 0.2]), beta=1.0)           # z0 = 0.4
    want = [1 - torch.sigmoid(torch.tensor(0.6)), 1 - torch.sigmoid(torch.tensor(2.4)), 1 - torch.sigmoid(torch.tensor(-0.1))]
    assert got.tolist() == pytest.approx([w.item() for w in want], abs=1e-6)
    clamped = l03.kto_loss(r, labels, torch.tensor([-1.0, 0.2]), beta=1.0)     # a negative mean: z0 = 0
    assert clamped.tolist() == pytest.approx(l03.kto_loss(r, labels, torch.zeros(1), beta=1.0).tolist())


@pytest.fixture(scope="module")
def kto_setup(tmp_path_factory):
    """A KTOTrainer on unpaired answers, its policy ahead of its reference on every answer (the reference's first layer
    is perturbed): the mismatched answers' mean log-ratio is positive, so z0 > 0 is not clamped away."""
    from trl import KTOConfig, KTOTrainer, unpair_preference_dataset

    model, ref, tok = _policy_and_reference(move="reference")
    args = KTOConfig(output_dir=str(tmp_path_factory.mktemp("kto")), beta=KTO_BETA, desirable_weight=1.3,
                     undesirable_weight=0.7, per_device_train_batch_size=8, max_steps=1, report_to="none", bf16=False,
                     use_cpu=True, activation_checkpointing=False, max_length=None)
    answers = unpair_preference_dataset(Dataset.from_list(_pairs())).shuffle(seed=0)
    return KTOTrainer(model=model, ref_model=ref, args=args, processing_class=tok, train_dataset=answers), ref


KTO_BETA = 0.02   # the log-ratios here are 135-257 nats: at this beta the sigmoids do not saturate


def test_kto_loss_matches_trl_kto_trainer(kto_setup):
    """Lesson 03's kto_loss, on the log-ratios of a KTOTrainer batch and of its mismatched KL answers, equals
    KTOTrainer.compute_loss, value and gradient, with unequal weights and a reference point that is not clamped."""
    trainer, ref = kto_setup
    model = trainer.model
    batch = next(iter(trainer.get_train_dataloader()))
    assert 0 < batch["label"].sum() < len(batch["label"]), "the test needs desirable and undesirable answers"
    kl_batch = {"input_ids": batch["KL_input_ids"], "attention_mask": batch["KL_attention_mask"],
                "completion_mask": batch["KL_completion_mask"]}
    trl_loss = trainer.compute_loss(model, batch)
    with torch.no_grad():
        ref_logps, ref_kl_logps = completion_logps(ref, batch), completion_logps(ref, kl_batch)
    kl_logratios = completion_logps(model, kl_batch) - ref_kl_logps     # with a graph: z0 must be detached
    assert kl_logratios.mean() > 1, "the test needs a reference point above the clamp"
    logratios = completion_logps(model, batch) - ref_logps
    logged = trainer._metrics["train" if model.training else "eval"]["kl"][-1]
    assert logged == pytest.approx(kl_logratios.mean().item(), abs=1e-4), "TRL's logged kl is z0"
    ours = l03.kto_loss(logratios, batch["label"], kl_logratios, KTO_BETA, desirable_weight=1.3,
                        undesirable_weight=0.7).mean()
    assert abs(ours.item() - trl_loss.item()) <= 1e-5, (ours.item(), trl_loss.item())
    at_zero = l03.kto_loss(logratios, batch["label"], torch.zeros(1), KTO_BETA, 1.3, 0.7).mean()
    assert abs(at_zero.item() - ours.item()) > 1e-3, "z0 changes the loss on this batch"
    assert_same_unsaturated_grads(model, trl_loss, ours)
