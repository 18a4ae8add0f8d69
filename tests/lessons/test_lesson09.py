"""Lesson 09 runs end to end on `tiny` under papermill; its records show each effect it claims."""
import pytest


@pytest.fixture(scope="module")
def records(lesson_runs):
    return lesson_runs.records("09")


def test_the_tool_after_rl_beats_the_plain_model(records):
    # the target, paired over the held-out problems (the tool taken away is measured in section 5 only);
    # seeds 0, 1, 2 after section 7's run: +0.124 +- 0.032, +0.176 +- 0.034, +0.124 +- 0.034
    d, se = records["09/rl_tool_minus_plain"], records["09/rl_tool_minus_plain_se"]
    assert d > 2 * se, (d, se)


def test_traces_teach_the_tool_and_the_tool_beats_plain_sft(records):
    d, se = records["09/sft_tool_minus_plain"], records["09/sft_tool_minus_plain_se"]
    assert d > 2 * se, (d, se)
    assert records["09/sft_without_accuracy"] < records["09/plain_accuracy"], "the trace model cannot work without it"
    # one call per line of working: exactly one on one-step problems, more with more steps
    # (seeds 0, 1, 2 on three-step problems: 2.80, 2.87, 2.54 calls)
    levels = sorted(int(k[len("09/steps"):].split("_")[0]) for k in records if k.endswith("_sft_calls"))
    calls = [records[f"09/steps{d}_sft_calls"] for d in levels]
    assert calls[0] == pytest.approx(1.0, abs=0.1) and all(a < b for a, b in zip(calls, calls[1:])), calls


def test_from_scratch_rollout_and_mask_equal_trls(records):
    assert records["09/trl_mask_identical"] is True
    assert 0 < records["09/trl_mask_tool_tokens"] < records["09/trl_mask_tokens"]


def test_per_turn_credit_disagrees_with_per_trajectory_credit(records):
    # seeds 0, 1, 2: 21 / 34 / 15 right calls in wrong answers, 14 / 14 / 7 of them pushed down; 9 / 14 / 6 turns flip
    assert records["09/credit_right_call_wrong_answer"] > 0
    assert 0 < records["09/credit_right_call_wrong_answer_pushed_down"] <= records["09/credit_right_call_wrong_answer"]
    assert 0 < records["09/credit_sign_disagreements"] < records["09/credit_turns"]


def test_a_bonus_per_call_is_hacked(records):
    # held-out calls per answer, seeds 0, 1, 2: trace SFT 1.92 / 1.95 / 1.87 -> hacked 2.48 / 5.60 / 5.51 (the
    # training log's calls, 4 prompts per step, are too noisy to assert on); accuracy with the tool 0.472 / 0.412 /
    # 0.380 -> 0.272 / 0.036 / 0.064. (Seed 0's hacked run once depended on MKL's mode: docs/testing.md,
    # "Reproducible `tiny` runs".)
    assert records["09/hack_calls"] > records["09/sft_calls"] + 0.3, "the bonus buys calls"
    d, se = records["09/hack_minus_sft"], records["09/hack_minus_sft_se"]
    assert d < -2 * se, "and the calls crowd out right answers"


def test_the_bonus_costs_accuracy_against_its_control(records):
    """The control runs the hack's settings (start, seed, learning rate, steps, prompts) on the answer's reward alone:
    the hacked run's loss against it is the bonus's, the control's loss against the start the settings'."""
    # seeds 0, 1, 2: control 0.416 / 0.336 / 0.388 (from 0.472 / 0.412 / 0.380: -0.056 +- 0.023, -0.076 +- 0.023,
    # +0.008 +- 0.023), hacked 0.272 / 0.036 / 0.064: the bonus's own effect -0.144 +- 0.030, -0.300 +- 0.033,
    # -0.324 +- 0.032 (paired); calls per answer 1.86 / 1.74 / 1.76 in the control, 2.48 / 5.60 / 5.51 hacked. At the
    # earlier hack settings (5x section 7's learning rate, a bonus of 0.5) the control fell too, to 0.344 on seed 0
    # and 0.028 on seed 1, where the bonus then cost nothing more (+0.012 +- 0.016).
    assert records["09/hack_calls"] > records["09/control_calls"] + 0.3, "the calls are the bonus's doing"
    d, se = records["09/hack_minus_control"], records["09/hack_minus_control_se"]
    assert d < -2 * se, ("the bonus costs right answers beyond what its settings cost", d, se)
    assert records["09/control_minus_sft"] > d, "and more than the settings alone"


def test_what_the_tool_fixes_and_what_it_cannot(records):
    # the plain model's wrong answers with a false equation, and the tool model's wrong answers off the path
    assert 0 < records["09/plain_wrong_fixed_by_tool"] and 0 < records["09/plain_wrong_with_slip"]
    assert 0 < records["09/sft_off_path_wrong"]


def test_grpo_raises_the_calls_and_the_accuracy_of_an_under_using_start(records):
    """Section 7: the trace model with the call's logit scaled down calls less; GRPO on the answer's reward raises
    its calls and its accuracy, because within a prompt the sampled rollouts that call are right more often."""
    # seeds 0, 1, 2 (shy_scale 0.7, 4 steps): calls 1.92 / 1.95 / 1.87 (trace) -> 0.67 / 1.26 / 0.37 (start) -> 1.15 /
    # 1.58 / 1.36; accuracy 0.200 / 0.340 / 0.216 -> 0.372 / 0.388 / 0.364, +0.172 +- 0.025, +0.048 +- 0.020 (the
    # thinnest: its start under-used least), +0.148 +- 0.024 (paired); calling paid +0.169 +- 0.055, +0.178 +- 0.059,
    # +0.131 +- 0.041 within 32 prompts each. Seed 1 at shy_scale 0.65 gained +0.040 +- 0.029 (its calls 0.42 -> 1.16).
    assert records["09/shy_calls"] < records["09/sft_calls"] - 0.3, "the start under-uses the tool"
    assert records["09/shy_tool_accuracy"] < records["09/sft_tool_accuracy"], "and loses accuracy by it"
    d, se = records["09/rl_minus_shy"], records["09/rl_minus_shy_se"]
    assert d > 2 * se, ("GRPO's gain over its start, paired", d, se)
    assert records["09/rl_calls"] > records["09/shy_calls"] + 0.2, "by calling more"
    m, s = records["09/train_calling_pays"], records["09/train_calling_pays_se"]
    assert records["09/train_calling_pays_prompts"] >= 10 and m > 2 * s, ("calling paid within prompts", m, s)


def test_the_verl_export_is_written(records):
    assert records["09/verl_files"] == sorted(["train.parquet", "test.parquet", "reward.py", "tool_config.yaml",
                                               "calculator.py", "calculator_tool.py"])
