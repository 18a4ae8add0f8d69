"""Lesson 07 runs end to end on `tiny` under papermill; its records show each effect it claims."""
import pytest


@pytest.fixture(scope="module")
def records(lesson_runs):
    return lesson_runs.records("07")


def test_from_scratch_pieces_match_reward_trainer(records):
    assert records["07/bt_loss_trl_abs_diff"] < 1e-5, "bradley_terry_loss (+ centring) equals RewardTrainer's loss"
    assert records["07/last_token_max_abs_diff"] < 1e-5, "the score head read at last_token_index is the reward"
    assert records["07/train_pairs_dropped"] == 0, "no pair is longer than max_length on tiny"


def test_reward_model_ranks_held_out_pairs(records):
    # seeds 0, 1, 2: 0.908 / 0.891 / 0.956 over 65 / 55 / 45 held-out pairs; preferring the longer answer
    # 0.508 / 0.473 / 0.511; the untrained head 0.354 / 0.418 / 0.689; style and worked-vs-guess pairs 0.98-1.0
    acc = records["07/heldout_accuracy_reward_model"]
    assert acc >= 0.85
    assert acc > records["07/heldout_accuracy_longer_answer"] + 0.3, "better than preferring the longer answer"
    assert acc > records["07/heldout_accuracy_untrained_head"] + 0.2, "better than the untrained score head"
    assert records["07/heldout_accuracy_reward_model_style"] >= 0.9
    assert records["07/heldout_accuracy_reward_model_worked_vs_guess"] >= 0.9


def test_probes_show_what_it_rewards(records):
    # It learned the features that separate its pairs (the working, no filler), not correctness: a wrong
    # final number with the working intact changes the reward within noise on every seed. Seeds 0, 1, 2:
    # working removed -2.57 / -2.82 / -2.58, filler -1.48 / -1.42 / -1.52 (SE 0.04-0.07), wrong final number
    # -0.005 ± 0.007 / +0.003 ± 0.003 / +0.003 ± 0.002 (|d| + 2 SE: 0.018 / 0.010 / 0.008); no final line
    # -0.49 / -0.08 / -0.14 (not asserted).
    def delta(name):
        return records[f"07/probe_{name}"], records[f"07/probe_{name}_se"]

    for name in ("working_removed", "filler_added"):
        d, se = delta(name)
        assert d < -2 * se and d < -0.5, f"{name} lowers the reward: {d:.3f} ± {se:.3f}"
    d, se = delta("wrong_final_number")   # bounded, not "not significant": a smaller test would pass that more easily
    assert abs(d) + 2 * se < 0.05, f"a wrong final number barely changes the reward: {d:.3f} ± {se:.3f}"


def test_most_correctness_pairs_reject_a_guess(records):
    # what the probes are read against (section 6): "correct" and "has working" mostly came together.
    # Seeds 0, 1, 2: 42 / 27 / 42 worked-vs-guess training pairs against 15 / 5 / 8 worked-vs-worked.
    guess, worked = records["07/train_pairs_worked_vs_guess"], records["07/train_pairs_worked_vs_worked"]
    assert guess > 2 * worked


def test_ppo_and_reinforce_pp_both_beat_the_sft_model(records):
    # Same SFT start, prompts and iterations; greedy accuracy on 200 held-out problems (binomial SE about 0.03).
    # Seeds 0, 1, 2: SFT 0.065 / 0.055 / 0.035, PPO 0.260 / 0.210 / 0.155,
    # REINFORCE++ 0.240 / 0.185 / 0.165: gains of 0.12 to 0.20, each over 3.5 standard errors.
    n = records["07/rl_heldout_problems"]
    sft = records["07/sft_heldout_accuracy"]
    for key in ("ppo", "reinforce_pp"):
        acc = records[f"07/{key}_heldout_accuracy"]
        se = ((acc * (1 - acc) + sft * (1 - sft)) / n) ** 0.5
        assert acc - sft > 2 * se and acc - sft >= 0.08, f"{key}: {sft:.3f} -> {acc:.3f} (± {se:.3f})"
    # not asserted: the sampled accuracy during training (64 samples an iteration; SE about 0.04 over three) moves within
    # its noise, first three iterations against last three: PPO 0.125 -> 0.115 / 0.109 -> 0.120 / 0.120 -> 0.177.


def test_the_lesson_calls_the_ppo_reinforce_pp_difference_noise_when_it_is(records, lesson_runs):
    # The printed verdict agrees with the records: |PPO - REINFORCE++| under 2 SE (as `make run` computes them)
    # is "within noise". Seeds 0, 1, 2: +0.020 / +0.025 / -0.010, all within noise (2 SE about 0.08).
    from utils.headlines import binomial_se

    n = records["07/rl_heldout_problems"]
    a, b = records["07/ppo_heldout_accuracy"], records["07/reinforce_pp_heldout_accuracy"]
    se = (binomial_se(a, n) ** 2 + binomial_se(b, n) ** 2) ** 0.5
    text = lesson_runs.output_of("07", "rpp-run")
    verdict = "within noise" if abs(a - b) < 2 * se else ("PPO higher" if a > b else "REINFORCE++ higher")
    assert verdict in text, text[-300:]


def test_what_the_critic_costs(records):
    # accounting, not an effect: byte counts of the tensors; PPO's extra is its critic, which on tiny (a full
    # fine-tune) holds what the policy holds
    assert records["07/ppo_model_state_mb"] == pytest.approx(records["07/reinforce_pp_model_state_mb"]
                                                              + records["07/critic_state_mb"])
    # the critic learns: its explained variance rises from where the fresh head starts (seeds 0, 1, 2: from
    # -0.58 / -2.20 / -1.43 at the first iteration to +0.09 / +0.08 / +0.07 over the last three)
    assert records["07/ppo_explained_variance_last3"] > records["07/ppo_explained_variance_first"]


def test_headline_is_declared_and_read_from_the_run(lesson_runs):
    assert len(lesson_runs.headline("07")) == 4
