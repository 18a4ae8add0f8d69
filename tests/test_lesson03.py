"""Lesson 03 runs end to end on `tiny` under papermill; its records show each effect it claims."""
import pytest


@pytest.fixture(scope="module")
def records(lesson_runs):
    return lesson_runs.records("03")


def test_from_scratch_loss_matches_trl(records):
    assert records["03/trl_loss_abs_diff"] < 1e-5


def test_on_policy_pairs_of_both_kinds(records):
    assert records["03/sft_format_compliance"] >= 0.9
    assert records["03/sft_shortcut_rate"] > 0.5, "the SFT model mostly answers without working (it guesses)"
    assert records["03/train_pairs"] >= 40 and records["03/train_pairs_style"] >= 5
    assert records["03/heldout_pairs"] >= 30


def test_dpo_generalises_the_preferences_and_keeps_accuracy(records):
    assert records["03/train_reward_accuracy_final"] >= 0.7
    # the targets: held-out implicit-reward preference accuracy >= 0.9, task accuracy at most 2 points down
    assert records["03/heldout_pref_accuracy"] >= 0.9
    assert records["03/dpo_accuracy"] >= records["03/sft_accuracy"] - 0.02
    assert records["03/heldout_pref_accuracy_style"] >= 0.75, "concise over verbose generalises to held-out pairs"
    assert records["03/heldout_pref_accuracy_worked_vs_guess"] >= 0.9
    assert records["03/dpo_verbose_rate"] < records["03/sft_verbose_rate"] - 0.1
    assert records["03/dpo_shortcut_rate"] < records["03/sft_shortcut_rate"] - 0.3, "the policy stops guessing"
    assert records["03/dpo_format_compliance"] >= 0.9


def test_beta_sweep_trades_kl_for_margin(records):
    assert records["03/kl_beta_0.01"] > records["03/kl_beta_0.5"] > 0
    assert records["03/log_ratio_margin_beta_0.01"] > records["03/log_ratio_margin_beta_0.1"] \
        > records["03/log_ratio_margin_beta_0.5"]
