"""Lesson 03 runs end to end on `tiny` under papermill; its records show each effect it claims."""
import pytest


@pytest.fixture(scope="module")
def records(lesson_runs):
    return lesson_runs.records("03")


def test_from_scratch_loss_matches_trl(records):
    assert records["03/trl_loss_abs_diff"] < 1e-5


def test_dpo_with_the_students_own_step(records):
    # the capstone: dpo_step with the lesson's sequence_logps and dpo_loss, DPOTrainer's pairs, steps and rate.
    # Seeds 0, 1, 2: loss (first -> last quarter) 0.404 -> 0.000, 0.396 -> 0.112, 0.426 -> 0.020; held-out
    # preference accuracy 0.954, 0.891, 1.000 (DPOTrainer's: 0.969, 0.873, 0.978)
    assert records["03/hand_dpo_loss_first"] > records["03/hand_dpo_loss_last"] + 0.05, "the DPO loss falls"
    assert records["03/hand_dpo_heldout_pref_accuracy"] >= 0.8, "it generalises the preferences as DPOTrainer does"


def test_on_policy_pairs_of_both_kinds(records):
    assert records["03/sft_format_compliance"] >= 0.9
    assert records["03/sft_shortcut_rate"] > 0.5, "the SFT model mostly answers without working (it guesses)"
    assert records["03/train_pairs"] >= 40 and records["03/train_pairs_style"] >= 5
    assert records["03/heldout_pairs"] >= 30


def test_dpo_generalises_the_preferences_and_keeps_accuracy(records):
    assert records["03/train_reward_accuracy_final"] >= 0.7
    # held-out implicit-reward preference accuracy: 0.969, 0.873, 0.978 with seeds 0, 1, 2 (an earlier issue's
    # target of 0.9 holds for seed 0 only); the lesson reads it as "high", not as a number
    assert records["03/heldout_pref_accuracy"] >= 0.8
    # "the task accuracy rises because the policy stops guessing": +0.145, +0.12, +0.12 with seeds 0, 1, 2
    assert records["03/dpo_accuracy"] >= records["03/sft_accuracy"] + 0.07
    # "those (style, worked vs guess) are most of the pairs"; worked vs worked are few
    assert records["03/heldout_pairs_worked_vs_worked"] < records["03/heldout_pairs"] / 2
    assert records["03/heldout_pref_accuracy_style"] >= 0.75, "concise over verbose generalises to held-out pairs"
    assert records["03/heldout_pref_accuracy_worked_vs_guess"] >= 0.9
    assert records["03/dpo_verbose_rate"] < records["03/sft_verbose_rate"] - 0.1
    assert records["03/dpo_shortcut_rate"] < records["03/sft_shortcut_rate"] - 0.3, "the policy stops guessing"
    assert records["03/dpo_format_compliance"] >= 0.9


def test_beta_sweep(records):
    betas = (0.01, 0.1, 0.5)
    # "the log-ratio margin is smallest at the largest beta": 0.5 against the smaller of 0.01 and 0.1 was
    # 0.65x, 0.79x, 0.93x with seeds 0, 1, 2 (0.01 and 0.1 are close to each other: the lesson does not order them)
    small = min(records[f"03/log_ratio_margin_beta_{b}"] for b in betas[:2])
    assert records["03/log_ratio_margin_beta_0.5"] < 0.97 * small
    for b in betas:
        assert records[f"03/kl_beta_{b}"] > 0 and 0 < records[f"03/kl_se_beta_{b}"] < records[f"03/kl_beta_{b}"] / 4
        # "the preference that matters here (work, do not guess) is learned at every beta"
        assert records[f"03/task_accuracy_beta_{b}"] >= records["03/sft_accuracy"] + 0.07


def test_headline_is_declared_and_read_from_the_run(lesson_runs):
    assert len(lesson_runs.headline("03")) >= 2


def test_other_preference_losses_are_compared_with_dpo_on_the_same_pairs(records):
    # Section 9's IPO, APO-zero and sigmoid_norm, trained as the DPO run, scored on its held-out pairs and prompts
    # (seed 0: preference accuracy 0.969 for all four; KL minus DPO's +0.139 +- 0.149, -0.353 +- 0.124, +0.191 +-
    # 0.158; per-token margin DPO 0.429, IPO 0.626 against its target 1 / (2 beta) = 1.0). No difference is beyond
    # two errors with one sign on seeds 0-2 (APO-zero's KL minus DPO's: -0.353 +- 0.124, -0.093 +- 0.037, +0.105 +-
    # 0.032; sigmoid_norm's +0.191, -0.019, -0.161; IPO's +0.139 +- 0.149, +0.070 +- 0.045, +0.021 +- 0.030), so the
    # lesson claims no ranking: it prints each paired difference with its verdict.
    assert 0 <= records["03/loss_dpo_accuracy"] <= 1 and records["03/loss_dpo_kl_mean"] > 0
    assert records["03/loss_dpo_kl_mean"] == records[f"03/kl_beta_{records['03/beta']}"], "the sweep's, same prompts"
    for loss in ("ipo", "apo_zero", "sigmoid_norm", "kto"):
        assert 0 <= records[f"03/loss_{loss}_accuracy"] <= 1 and records[f"03/loss_{loss}_kl_mean"] > 0
        # each paired standard error is positive and of a plausible size (seeds 0-2: 0.021-0.038 and 0.030-0.156)
        assert 0 < records[f"03/loss_{loss}_accuracy_diff_se"] < 0.2
        assert 0 < records[f"03/loss_{loss}_kl_diff_se"] < records["03/loss_dpo_kl_mean"]


def test_kto_learns_the_ranking_from_labels_and_its_reference_point_is_read(records):
    # KTOTrainer on the DPO run's answers without their pairing. Seeds 0-2: held-out preference accuracy 0.938, 0.855,
    # 0.956 (DPO's 0.969, 0.873, 0.978; KTO minus DPO -0.031 +- 0.026, -0.018 +- 0.025, -0.022 +- 0.030, within two
    # errors); KL minus DPO's -0.331 +- 0.129, -0.121 +- 0.036, +0.122 +- 0.052 (no sign holds: no claim). z0 (TRL's
    # kl per 5 steps): 0 0 0 0, 0.46 0.68 0 0, 0 0 0 0; the mismatched answers' log-ratio after training -4.66 +- 0.40,
    # -0.83 +- 0.53, -1.49 +- 0.32 nats: the clamp holds by the end of training.
    assert records["03/loss_kto_accuracy"] >= 0.8, "labels alone teach the ranking, far above chance (0.5)"
    z0 = records["03/kto_z0_by_window"]
    assert len(z0) >= 2, "one value per logging window"
    assert all(z >= 0 for z in z0), "z0 is clamped at 0 from below"
    assert z0[-1] == 0 and records["03/kto_kl_samples_mean"] < 0, "the clamp holds by the end of training"
    assert 0 < records["03/kto_kl_samples_se"] < 1
