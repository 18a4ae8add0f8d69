"""Lesson 04 runs end to end on `tiny` under papermill; its records show each effect it claims."""
import pytest


@pytest.fixture(scope="module")
def records(lesson_runs):
    return lesson_runs.records("04")


def test_from_scratch_loss_matches_grpo_trainer(records):
    # the lesson's answers on TRL's own batch (off-policy, the clip binding): advantages from TRL's rewards, the loss
    # of every loss_type and its gradient with respect to every weight
    assert records["04/advantages_max_abs_diff"] < 1e-5
    assert records["04/trl_loss_max_abs_diff"] < 1e-5
    assert records["04/trl_grad_max_rel_diff"] < 1e-4


def test_naive_reward_is_gamed(records):
    # the gameable reward (correctness + 0.1 per line) rises while the real accuracy falls: answers pad lines.
    # With 20 hacking steps every seed ran (nearly) to the limit: seeds 0, 1, 2 -> naive reward 8.0,
    # lines 79.98-80.0, accuracy 0.0, format compliance 0.0. (With 10 steps seed 1 only reached 3.7 lines; with 14 steps
    # at learning rate 6e-3 seed 2 reached 32.8; with 4 prompts a step instead of 8 (hack_prompts), seed 2 never found
    # it: naive reward 0.33 -> 0.59.)
    assert records["04/hack_naive_reward_after"] > records["04/hack_naive_reward_before"] + 3
    assert records["04/hack_accuracy_after"] < 0.3 * records["04/hack_accuracy_before"]
    assert records["04/hack_lines_per_answer_after"] > 40, "twenty steps take it most of the way to the limit"
    assert records["04/hack_characters_per_answer_after"] > 2 * records["04/hack_characters_per_answer_before"]
    assert records["04/hack_format_compliance_after"] < 0.3


def test_grpo_run(records):
    assert records["04/sft_format_compliance"] >= 0.9
    assert records["04/grpo_format_compliance"] >= 0.9
    assert records["04/kl_last"] > 0, "beta > 0: the KL to the reference is logged and grows from 0"
    assert 0 < records["04/frac_reward_zero_std_mean"] < 1
    assert records["04/grpo_pass@1"] > records["04/sft_pass@1"]
    # the target: held-out greedy accuracy at least 10 points above the SFT start
    assert records["04/grpo_accuracy"] >= records["04/sft_accuracy"] + 0.10
    assert records["04/accuracy_gain"] == pytest.approx(records["04/grpo_accuracy"] - records["04/sft_accuracy"])


def test_grpo_moves_the_model_from_shortcuts_to_worked_answers(records):
    # the SFT model mostly names the answer without working it out (it saw 60 % such answers);
    # GRPO, rewarded on the final number only, makes it work the problem out
    # seeds 0, 1, 2 (16 steps of 12 prompts at learning rate 1.25e-3): 0.886 -> 0.022, 0.946 -> 0.004, 0.99 -> 0.156,
    # accuracy gains +0.140, +0.148, +0.130 (16 steps of 16 prompts: 0.0, 0.0, 0.228 and +0.138, +0.144, +0.122; 20 steps
    # at 1e-3: 0.0, 0.006, 0.154 and +0.140, +0.146, +0.150)
    assert records["04/sft_shortcut_share"] > 0.5
    assert records["04/grpo_shortcut_share"] < 0.3 and records["04/grpo_shortcut_share"] < records["04/sft_shortcut_share"] - 0.5


def test_larger_groups_carry_more_signal(records):
    assert records["04/zero_std_T1.0_G2"] > records["04/zero_std_T1.0_G8"] > records["04/zero_std_T1.0_G16"]
    # "most silent groups are all wrong" (the line under the sweep, at the run's T = 1.0 and G = 8)
    assert records["04/all_wrong_T1.0_G8"] > records["04/zero_std_T1.0_G8"] / 2
    # lesson 05 recalls that in this run frac_reward_zero_std was "a large share of every batch": 0.60-0.63 (seeds 0-2)
    assert records["04/frac_reward_zero_std_mean"] > 0.3


def test_headline_is_declared_and_read_from_the_run(lesson_runs):
    assert len(lesson_runs.headline("04")) >= 2


def test_capstone_grpo_step_is_grpo_trainers_and_trains(records):
    # the lesson's grpo_step (the capstone) on the batch it sampled: GRPOTrainer.compute_loss gives its loss and the
    # gradient it applied, its reference log-probs those of TRL's reference (seed 0: loss 3.0e-06 of it, gradient 1.1e-06
    # of the largest entry, both in fp32; the cell asserts the reference log-probs to 1e-4)
    assert records["04/hand_trl_loss_rel_diff"] < 1e-4
    assert records["04/hand_trl_grad_max_rel_diff"] < 1e-4
    # the short run with it (8 steps x 8 prompts on tiny) moves the model the way GRPOTrainer's run does: held-out
    # greedy accuracy up, answers without working down. Seeds 0, 1, 2: accuracy 0.062 -> 0.124, 0.066 -> 0.152,
    # 0.058 -> 0.214 (+0.062, +0.086, +0.156); shortcut answers 0.886 -> 0.442, 0.946 -> 0.414, 0.990 -> 0.028.
    # The training reward's own change over 8 steps is within its step-to-step noise on all three (-0.047 +- 0.078,
    # -0.008 +- 0.023, +0.055 +- 0.074), and the lesson prints which it is.
    assert records["04/hand_steps"] == 8 and records["04/hand_seconds"] > 0   # tiny's hand_steps
    # (Before MKL's strict mode was pinned, a Xeon with AVX-512 and AMX gave seed 0 0.064 -> 0.100; pinned, it gives the
    # values above: docs/testing.md, "Reproducible `tiny` runs".)
    assert records["04/hand_accuracy"] >= records["04/sft_accuracy"] + 0.04
    assert records["04/hand_shortcut_share"] < records["04/sft_shortcut_share"] - 0.3
