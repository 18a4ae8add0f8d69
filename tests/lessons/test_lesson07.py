"""Lesson 07 runs end to end on `tiny` under papermill; its records show each effect it claims."""
import pytest


@pytest.fixture(scope="module")
def records(lesson_runs):
    return lesson_runs.records("07")


def test_from_scratch_pieces_match_reward_trainer(records):
    assert records["07/bt_loss_trl_abs_diff"] < 1e-5, "bradley_terry_loss (+ centring) equals RewardTrainer's loss"
    assert records["07/last_token_max_abs_diff"] < 1e-5, "the score head read at last_token_index is the reward"
    assert records["07/train_pairs_dropped"] == 0, "no pair is longer than max_length on tiny"


def test_the_loops_shortcuts_are_float_rounding(records):
    # section 7's loop takes the old policy's log-probs from the sampler and runs its forward passes without padding:
    # on one rollout of the SFT model, the two agree with a forward pass to float32 rounding (seeds 0, 1, 2: 7e-6 to 1e-5)
    assert records["07/sampler_logps_max_abs_diff"] < 1e-4


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


ESTIMATORS = ("ppo", "reinforce_pp", "rloo", "grpo")


def test_every_estimator_and_online_rft_beat_the_sft_model(records):
    # Same SFT start, prompts and iterations (15 of 12 prompts x 4 samples on tiny); greedy accuracy on 200 held-out
    # problems (the same problems: each gain's error is paired, 0.025-0.032). Seeds 0, 1, 2: SFT 0.065 / 0.055 / 0.035,
    # PPO 0.165 / 0.160 / 0.155, REINFORCE++ 0.255 / 0.225 / 0.160, RLOO 0.215 / 0.215 / 0.170, GRPO 0.280 / 0.210 /
    # 0.170; online RFT (section 11, the same samples) 0.230 / 0.210 / 0.205. The smallest gain, PPO's +0.100 on seed 0
    # (± 0.025; ± 0.032 were the two sides independent). (Before
    # MKL's strict mode was pinned, a Xeon with AVX-512 and AMX gave seed 0 PPO +0.075 (± 0.030); pinned, it gives the
    # values above: docs/testing.md, "Reproducible `tiny` runs".)
    # Not asserted: offline RFT, 0.210 / 0.210 / 0.075 (+0.040 ± 0.016 over SFT on seed 2, paired).
    from utils.headlines import paired_se

    sft, sft_right = records["07/sft_heldout_accuracy"], records["07/sft_heldout_by_problem"]
    for key in ESTIMATORS + ("online_rft",):
        acc = records[f"07/{key}_heldout_accuracy"]
        se = paired_se(sft_right, records[f"07/{key}_heldout_by_problem"])
        assert acc - sft > 2 * se and acc - sft >= 0.08, f"{key}: {sft:.3f} -> {acc:.3f} (± {se:.3f})"
    # not asserted: the sampled accuracy during training (48 samples an iteration; SE about 0.04 over three) moves within
    # its noise, first three iterations against last three: PPO 0.090 -> 0.146 / 0.069 -> 0.062 / 0.167 -> 0.083.


def test_the_same_budget_means_the_same_samples(records):
    # every run samples rl_iterations x rl_prompts x rl_samples answers to the same prompts; only their lengths
    # differ (seed 0: 26.0k to 27.8k tokens)
    counts = [records[f"07/{key}_generated_tokens"] for key in ESTIMATORS + ("rft", "online_rft")]
    assert max(counts) < 1.25 * min(counts), counts


def verdict(records, a, b, names):
    """The lesson's words for a - b in held-out accuracy, from the records: the same problems, so the error is the
    paired one (of the per-problem differences)."""
    from utils.headlines import paired_se

    n = records["07/rl_heldout_problems"]
    x, y = records[f"07/{a}_heldout_accuracy"], records[f"07/{b}_heldout_accuracy"]
    x_right, y_right = records[f"07/{a}_heldout_by_problem"], records[f"07/{b}_heldout_by_problem"]
    assert len(x_right) == len(y_right) == n and sum(x_right) / n == pytest.approx(x)
    return said(x - y, paired_se(y_right, x_right), names[a], names[b])


def said(d, se, name_a, name_b):
    """The lesson's words (its difference()) for a difference d = a - b with standard error se."""
    return "within noise" if abs(d) < 2 * se else f"{name_a if d > 0 else name_b} higher"


def words(a, b, name_a, name_b):
    """:func:`said` for two independent estimates, each a (value, standard error): their errors in quadrature."""
    return said(a[0] - b[0], (a[1] ** 2 + b[1] ** 2) ** 0.5, name_a, name_b)


NAMES = {"ppo": "PPO", "reinforce_pp": "REINFORCE++", "rloo": "RLOO", "grpo": "GRPO", "rft": "RFT",
         "online_rft": "online RFT"}


def test_the_lesson_calls_differences_noise_when_they_are(records, lesson_runs):
    # The printed verdicts agree with the records: |a - b| under 2 SE is "within noise", the SE paired over the same
    # 200 held-out problems (0.019-0.031). Re-measured on 2026-11-29, seeds 0, 1, 2: PPO - REINFORCE++ -0.090 /
    # -0.065 (REINFORCE++ higher) / -0.005 (within noise). The best of the four against the others: GRPO +0.115
    # (PPO), +0.025, +0.065 (RLOO) / REINFORCE++ +0.065 (PPO), +0.010, +0.015 / RLOO +0.015, +0.010, 0.000 (all within
    # noise). Online RFT - RFT +0.020 / 0.000 / +0.130 (beyond on seed 2); GRPO - online RFT +0.050 (beyond) / 0.000
    # / -0.035; GRPO - RFT +0.070 (beyond) / 0.000 / +0.095 (beyond). No ranking holds on every seed; none is asserted.
    text = lesson_runs.output_of("07", "rpp-run")
    assert "PPO - REINFORCE++: " in text and verdict(records, "ppo", "reinforce_pp", NAMES) in text, text[-300:]
    text = lesson_runs.output_of("07", "four-run")
    best = max(ESTIMATORS, key=lambda k: records[f"07/{k}_heldout_accuracy"])
    for key in ESTIMATORS:
        if key != best:
            line = next(x for x in text.splitlines() if x.startswith(f"{NAMES[best]} - {NAMES[key]}: "))
            assert verdict(records, best, key, NAMES) in line, line
    text = lesson_runs.output_of("07", "rft-run")
    for a, b in (("online_rft", "rft"), ("grpo", "online_rft"), ("grpo", "rft")):
        line = next(x for x in text.splitlines() if x.startswith(f"{NAMES[a]} - {NAMES[b]}: "))
        assert verdict(records, a, b, NAMES) in line, line


def test_gradient_coefficients_on_real_samples(records):
    # accounting on the GRPO policy's samples: SFT always pushes; a group without a right answer gives RFT nothing,
    # a group of equal rewards gives GRPO and DPO nothing (with beta = 0), so GRPO and DPO go silent together
    assert records["07/gc_no_signal_sft"] == 0
    assert records["07/gc_no_signal_grpo"] == records["07/gc_no_signal_dpo"]
    assert records["07/gc_problems"] - records["07/gc_mixed_problems"] == records["07/gc_no_signal_grpo"]
    assert records["07/gc_no_signal_rft"] == records["07/gc_no_signal_online_rft"] <= records["07/gc_no_signal_grpo"]


def test_what_the_critic_costs(records):
    # accounting, not an effect: byte counts of the tensors; PPO's extra is its critic, which on tiny (a full
    # fine-tune) holds what the policy holds
    for key in ("reinforce_pp", "rloo", "grpo"):
        assert records["07/ppo_model_state_mb"] == pytest.approx(records[f"07/{key}_model_state_mb"]
                                                                  + records["07/critic_state_mb"])
    # the critic learns: its explained variance rises from where the fresh head starts (seeds 0, 1, 2: from
    # -0.58 / -2.20 / -1.43 at the first iteration to +0.09 / +0.08 / +0.07 over the last three)
    assert records["07/ppo_explained_variance_first"] < 0, "the fresh head starts worse than predicting the mean"
    assert records["07/ppo_explained_variance_last3"] > records["07/ppo_explained_variance_first"]


def test_outcome_reward_model_lowers_a_wrong_final_number(records):
    # Trained on the verifier's labels (drawn from every sample of section 1; 40 steps of 16 see 0.42 of an epoch on
    # tiny), the outcome RM lowers the reward of a wrong final number beyond its noise on every seed, where the
    # preference RM cannot tell (test_probes_...); a small effect (log-odds: 0.01 is about 0.1 points of P(correct)
    # at the 10% it predicts) that the lesson shows in its table, not a claim of size. Seeds 0, 1, 2:
    # wrong final number -0.008 ± 0.002 / -0.013 ± 0.004 / -0.012 ± 0.003, working removed -0.15 / -0.31 / -0.25
    # (SE 0.011-0.015), filler -0.060 / -0.030 / -0.084 (SE 0.009-0.012); no final line +0.11 / +0.13 / +0.23 (SE
    # about 0.02: an edit no training answer had, extrapolated). Not asserted: held-out ranking 0.785 / 0.618 / 0.933
    # against the preference RM's 0.908 / 0.891 / 0.956 (lower beyond 2 SE on seeds 0 and 1, within noise on 2).
    def delta(name):
        return records[f"07/orm_probe_{name}"], records[f"07/orm_probe_{name}_se"]

    for name in ("wrong_final_number", "working_removed"):
        d, se = delta(name)
        assert d < -2 * se, f"outcome RM, {name} lowers the reward: {d:.4f} ± {se:.4f}"
    d, se = delta("no_final_line")
    assert d > 2 * se, f"outcome RM, no final line: {d:.4f} ± {se:.4f}"
    assert records["07/orm_train_answers"] > 4 * records["07/train_pairs"], "labelled: every sampled answer, not pairs"
    assert 0 < records["07/orm_train_correct"] < records["07/orm_train_answers"]


def test_the_lesson_prints_each_outcome_rm_verdict(records, lesson_runs):
    text = lesson_runs.output_of("07", "orm-compare")
    for name in ("wrong final number", "filler added", "working removed", "no final line"):
        d, se = records[f"07/orm_probe_{name.replace(' ', '_')}"], records[f"07/orm_probe_{name.replace(' ', '_')}_se"]
        word = "lowers the reward" if d < -2 * se else "raises the reward" if d > 2 * se else "changes it within noise"
        assert f"outcome RM, {name}: {word}" in text, (name, d, se)


def test_over_optimisation_the_proxy_rises_the_gold_does_not_follow(records):
    # GRPO against the reward model, no KL, 30 iterations of 6 prompts x 4 samples: as many sampled answers (720) as
    # section 9's GRPO on the verifier. The proxy's window means rise .53 -> 1.55 / .26 -> 1.41 / .34 -> 1.76 (seeds
    # 0, 1, 2; per-iteration sd 0.07-0.31) and the KL grows (0.028 -> 0.19 / 0.024 -> 0.22 / 0.012 -> 0.15 per token).
    # Held-out greedy accuracy, 200 problems: SFT 0.065 / 0.055 / 0.035, GRPO on the verifier 0.280 / 0.210 / 0.170,
    # GRPO on the reward model 0.115 / 0.090 / 0.125: its gain over SFT +0.050 / +0.035 / +0.090 (within noise,
    # within noise, beyond 2 SE) against the verifier's +0.215 / +0.155 / +0.135; verifier - reward model +0.165 /
    # +0.120 / +0.045 (beyond 2 SE on seeds 0 and 1, within noise on 2; errors paired, 0.024-0.031): asserted only as
    # "never better beyond noise".
    # The windows' sampled gold (SE over the 30 prompts of a window, 0.027-0.057), first -> best -> last: .083 -> .158
    # (iterations 16-20) -> .108 / .142 -> .158 (16-20) -> .075 / .183 (1-5, the first) -> .058. The rise to the best
    # window is within noise on every seed (+0.075 ± 0.067 / +0.017 ± 0.069 / 0), and the best window is biased up
    # (the largest of six); the last window against the first is within noise on seeds 0 and 1 (+0.025 ± 0.056 /
    # -0.067 ± 0.060) and lower beyond 2 SE on seed 2 (-0.125 ± 0.059): no peak-and-fall is asserted.
    assert records["07/overopt_sampled_answers"] == records["07/grpo_sampled_answers"], "the same budget"
    proxy = records["07/overopt_proxy"]
    assert proxy[-1] - proxy[0] > 1.0, f"the proxy rises: {proxy}"
    assert records["07/overopt_kl"][-1] > records["07/overopt_kl"][0], "the policy moves away from the SFT model"
    names = {"overopt": "GRPO, reward model", "grpo": "GRPO, verifier"}
    assert verdict(records, "overopt", "grpo", names) != "GRPO, reward model higher", "the proxy is never the better gold"


def test_over_optimisation_verdicts_are_read_from_the_records(records, lesson_runs):
    labels = {"first": "first window", "peak": "gold's peak", "last": "last window"}
    w = {k: (records[f"07/overopt_gold_{k}"], records[f"07/overopt_gold_{k}_se"]) for k in labels}
    text = lesson_runs.output_of("07", "overopt-read")
    for a, b in (("peak", "first"), ("last", "peak"), ("last", "first")):
        line = next(x for x in text.splitlines() if x.startswith(f"{labels[a]} - {labels[b]}: "))
        assert words(w[a], w[b], labels[a], labels[b]) in line, line
    names = {"overopt": "GRPO, reward model", "grpo": "GRPO, verifier", "sft": "SFT"}
    for a, b in (("overopt", "sft"), ("grpo", "overopt")):
        line = next(x for x in text.splitlines() if x.startswith(f"{names[a]} - {names[b]}: "))
        assert verdict(records, a, b, names) in line, line


def test_the_over_optimised_policy_learned_what_the_proxy_pays_for(records):
    # the probes' features, held-out answers of the SFT model and of the over-optimised policy (48 each). Seeds 0, 1,
    # 2: shows working 0.38 / 0.23 / 0.29 -> 1.00 on all three; opens with filler 0.44 / 0.44 / 0.65 -> 0.00
    assert records["07/overopt_after_shows_working"] >= 0.9 > records["07/overopt_sft_shows_working"] + 0.3
    assert records["07/overopt_after_opens_with_filler"] <= 0.1 < records["07/overopt_sft_opens_with_filler"] - 0.2
    assert records["07/overopt_after_proxy"] > records["07/overopt_sft_proxy"] + 1.0


def test_the_proxy_and_the_gold_rank_the_two_grpo_policies(records, lesson_runs):
    # The reward model's mean score of 48 sampled held-out answers (SE over the 12 prompts), GRPO on the reward model
    # minus GRPO on the verifier, seeds 0, 1, 2: +0.70 ± 0.26 / +1.57 ± 0.27 / +2.26 ± 0.27, the proxy prefers the
    # policy that optimised it on every seed; the gold (held-out greedy accuracy) the other way round, -0.165 ± 0.031 /
    # -0.120 ± 0.030 / -0.045 ± 0.025 (paired; within noise on seed 2): that direction is asserted above as "never
    # better".
    # GRPO on the verifier learned to show its working too (shows working 0.81 / 0.69 / 0.48, the SFT model's 0.38 /
    # 0.23 / 0.29): correct answers mostly show it.
    names = ("GRPO, reward model", "GRPO, verifier")
    after = (records["07/overopt_after_proxy"], records["07/overopt_after_proxy_se"])
    verifier = (records["07/overopt_verifier_proxy"], records["07/overopt_verifier_proxy_se"])
    assert words(after, verifier, *names) == "GRPO, reward model higher", (after, verifier)
    text = lesson_runs.output_of("07", "overopt-what").splitlines()
    proxy, gold = [i for i, x in enumerate(text) if x.strip().startswith("GRPO, reward model - GRPO, verifier: ")]
    assert words(after, verifier, *names) in text[proxy] and text[proxy - 1].startswith("proxy"), text[proxy]
    assert verdict(records, "overopt", "grpo", dict(zip(("overopt", "grpo"), names))) in text[gold], text[gold]
    assert records["07/overopt_verifier_shows_working"] > records["07/overopt_sft_shows_working"]


def test_reward_model_in_grpo_trainer_scores_as_ours(records):
    # GRPOTrainer's reward_funcs entry renders the chat template and reads logits[:, 0]: section 4's scoring
    assert records["07/trl_rm_abs_diff"] < 1e-5


def test_headline_is_declared_and_read_from_the_run(lesson_runs):
    assert len(lesson_runs.headline("07")) == 4
