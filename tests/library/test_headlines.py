"""utils.headlines: a lesson's declared headline, evaluated on records, on hand-computed values."""
import json
import math

import pytest

from utils import headlines
from utils.course.figures import _draw_result, plot_summary
from utils.course.lessons import duration
from utils.course.summary import format_summary

RECORDS = {"04/n_test": 500, "04/sft_accuracy": 0.062, "04/grpo_accuracy": 0.202,
           "04/reward_before": 0.33, "04/reward_after": 8.0, "04/kl": 2.3, "04/kl_se": 0.17, "04/seeds": 1}
ACCURACY = {"name": "accuracy", "values": {"SFT": "sft_accuracy", "GRPO": "grpo_accuracy"}, "n": "n_test"}


def decl(*results, target=180):
    return {"results": list(results), "tiny_target_s": target}


def test_binomial_standard_errors_and_the_difference():
    (row,) = headlines.rows(decl(ACCURACY), RECORDS)
    (sft, grpo) = row["stages"]
    # Agresti-Coull: p~ = (p n + 2) / (n + 4), SE = sqrt(p~ (1 - p~) / (n + 4))
    assert sft["se"] == pytest.approx(math.sqrt(33 / 504 * (1 - 33 / 504) / 504))      # 0.01102
    assert grpo["se"] == pytest.approx(math.sqrt(103 / 504 * (1 - 103 / 504) / 504))   # 0.01796
    d = headlines.difference(row, 1)
    assert d["delta"] == pytest.approx(14.0)
    assert d["se"] == pytest.approx(100 * math.hypot(sft["se"], grpo["se"]))
    assert not d["within_noise"]
    assert row["noise"] == "SE over 500 problems"
    (line,) = headlines.block(decl(ACCURACY), RECORDS)
    assert line == "  accuracy, SFT → GRPO   0.062 ± 0.011 → 0.202 ± 0.018   +14.0 ± 2.1 pts   [SE over 500 problems]"


def test_zero_and_one_are_not_shown_as_exact():
    records = {**RECORDS, "04/sft_accuracy": 0.0, "04/grpo_accuracy": 1.0, "04/n_test": 200}
    (line,) = headlines.block(decl(ACCURACY), records)
    assert "0.000 ± 0.007 → 1.000 ± 0.007   +100.0 ± 1.0 pts" in line   # sqrt(2/204 * 202/204 / 204)


def test_a_difference_under_two_standard_errors_is_called_noise():
    records = {**RECORDS, "04/grpo_accuracy": 0.09}  # +2.8 pts, SE of the difference 1.7 pts
    (line,) = headlines.block(decl(ACCURACY), records)
    assert "+2.8 ± 1.7 pts, within noise" in line


def test_other_units_show_a_ratio_and_say_why_there_is_no_error():
    entry = {"name": "naive reward", "unit": "reward", "values": {"before": "reward_before", "after": "reward_after"},
             "noise": "one run"}
    (line,) = headlines.block(decl(entry), RECORDS)
    assert line.endswith("0.33 → 8.00 reward   ×24.2   [one run]")


def test_standard_errors_from_records_and_more_than_two_stages():
    entry = {"name": "KL", "unit": "nats", "values": {"one": "kl", "two": "kl", "three": "kl"},
             "se": {"one": "kl_se", "two": "kl_se"}}
    lines = headlines.block(decl(entry), RECORDS)
    assert lines == ["  KL (nats)   [SE]", "      one    2.30 ± 0.17", "      two    2.30 ± 0.17   ×1 vs one, within noise",
                     "      three  2.30   ×1 vs one"]


def test_stages_side_by_side_without_a_change():
    entry = {"name": "KL", "unit": "nats", "values": {"one": "kl", "two": "kl"}, "noise": "-", "compare": False}
    (line,) = headlines.block(decl(entry), RECORDS)
    assert line == "  KL, one → two   2.30 → 2.30 nats   [-]"


def test_the_seeds_spread_adds_to_the_binomial_error_when_several_seeds_ran():
    entry = {**ACCURACY, "seed_std": {"GRPO": "grpo_std"}, "seeds": "seeds"}
    (one,) = headlines.rows(decl(entry), {**RECORDS, "04/grpo_std": 0.03})   # one seed: binomial only
    assert one["noise"] == "SE over 500 problems"
    (row,) = headlines.rows(decl(entry), {**RECORDS, "04/grpo_std": 0.03, "04/seeds": 3})
    assert row["noise"] == "SE over 3 seeds and 500 problems"
    binomial = one["stages"][1]["se"]
    assert row["stages"][1]["se"] == pytest.approx(math.sqrt(0.03 ** 2 / 3 + binomial ** 2))
    assert row["stages"][0]["se"] == one["stages"][0]["se"], "a stage without a seed spread keeps its binomial error"
    assert headlines.difference(row, 1)["se"] is not None


def test_paired_standard_error_on_known_values_and_mcnemars_form():
    # differences 0, 1, 0, -1: (2 + 1 - 0 / 6) / 6^2
    assert headlines.paired_se([1, 0, 1, 1], [1, 1, 1, 0]) == pytest.approx(math.sqrt(3) / 6)   # 0.289
    # 1/0 scores: c problems right only under b, e only under a, n in all: Agresti and Min's Wald+2 error
    n, c, e = 500, 23, 9
    a = [0] * c + [1] * e + [1] * 100 + [0] * (n - c - e - 100)
    b = [1] * c + [0] * e + [1] * 100 + [0] * (n - c - e - 100)
    assert headlines.paired_se(a, b) == pytest.approx(math.sqrt((c + e + 1) - (c - e) ** 2 / (n + 2)) / (n + 2))
    # ... close to the plain paired error, sd(d) / sqrt(n), on this many problems
    d = [y - x for x, y in zip(a, b)]
    plain = math.sqrt(sum((x - sum(d) / n) ** 2 for x in d) / (n - 1) / n)
    assert headlines.paired_se(a, b) == pytest.approx(plain, rel=0.02)
    # every problem moving the same way is not shown as exact (as Agresti-Coull does for a share)
    assert headlines.paired_se([0] * 200, [1] * 200) == pytest.approx(math.sqrt(201 - 200 ** 2 / 202) / 202)   # 0.0086
    assert headlines.paired_se([0.5, 0.25], [0.5, 0.25]) == pytest.approx(1 / 4)    # no difference: sqrt(1) / 4
    with pytest.raises(ValueError, match="same n >= 1"):
        headlines.paired_se([1, 0], [1])


def test_clustered_standard_error_on_known_values():
    # p = 3/4; residuals 3 - 0.75 * 3 = 0.75 and 0 - 0.75 = -0.75: sqrt(2 * 1.125) / 4
    assert headlines.clustered_se([3, 0], [3, 1]) == pytest.approx(0.375)
    # one item per problem: the Wald error with n - 1
    hits = [1] * 30 + [0] * 70
    assert headlines.clustered_se(hits, [1] * 100) == pytest.approx(math.sqrt(0.3 * 0.7 / 99))
    # ten problems of ten steps, each all right or all wrong: the error of ten items, not of a hundred
    assert headlines.clustered_se([10] * 3 + [0] * 7, [10] * 10) == pytest.approx(math.sqrt(0.3 * 0.7 / 9))
    with pytest.raises(ValueError, match="K >= 2"):
        headlines.clustered_se([1], [1])


PAIRED = {**ACCURACY, "per_problem": {"SFT": "sft_right", "GRPO": "grpo_right"}}


def test_a_change_on_the_same_problems_is_paired():
    # SFT right on 31 of 500 problems, GRPO on the same 31 and 70 more (0.062 -> 0.202)
    records = {**RECORDS, "04/sft_right": [1] * 31 + [0] * 469, "04/grpo_right": [1] * 101 + [0] * 399}
    (row,) = headlines.rows(decl(PAIRED), records)
    d = headlines.difference(row, 1)
    assert d["paired"] and d["delta"] == pytest.approx(14.0)
    assert d["se"] == pytest.approx(100 * math.sqrt(71 - 70 ** 2 / 502) / 502)   # Wald+2: 1.56 points
    assert row["noise"] == "SE over 500 problems; changes paired over them"
    assert [s["se"] for s in row["stages"]] == [s["se"] for s in headlines.rows(decl(ACCURACY), records)[0]["stages"]]
    (line,) = headlines.block(decl(PAIRED), records)
    assert line.endswith("0.062 ± 0.011 → 0.202 ± 0.018   +14.0 ± 1.6 pts   [SE over 500 problems; changes paired "
                         "over them]")


def test_pairing_shows_a_change_the_independent_error_calls_noise():
    # 0.200 -> 0.230: 15 problems newly right, none lost; independent SE 2.6 pts, paired 0.76 pts
    records = {**RECORDS, "04/sft_accuracy": 0.2, "04/grpo_accuracy": 0.23,
               "04/sft_right": [1] * 100 + [0] * 400, "04/grpo_right": [1] * 115 + [0] * 385}
    (plain,) = headlines.block(decl(ACCURACY), records)
    (paired,) = headlines.block(decl(PAIRED), records)
    assert "+3.0 ± 2.6 pts, within noise" in plain
    assert "+3.0 ± 0.8 pts   [" in paired


def test_the_seeds_spread_adds_to_a_paired_change():
    entry = {**PAIRED, "seed_std": {"GRPO": "grpo_std"}, "seeds": "seeds"}
    records = {**RECORDS, "04/seeds": 3, "04/grpo_std": 0.03,
               "04/sft_right": [1] * 31 + [0] * 469, "04/grpo_right": [1] * 101 + [0] * 399}
    (row,) = headlines.rows(decl(entry), records)
    problems = headlines.paired_se(records["04/sft_right"], records["04/grpo_right"])
    assert headlines.difference(row, 1)["se"] == pytest.approx(100 * math.sqrt(problems ** 2 + 0.03 ** 2 / 3))


@pytest.mark.parametrize("sft_right", [
    [1] * 31 + [0] * 468,                  # one problem short of n_test
    ["1"] * 500, [True] * 500, [float("nan")] * 500, "1" * 500, [[1]] * 500, None,
    [1] * (headlines.MAX_PROBLEMS + 1), [1e308] * 500, [2] * 500, [-0.5] * 500,   # a share is in [0, 1]
])
def test_per_problem_scores_that_do_not_fit_are_not_paired(sft_right):
    records = {**RECORDS, "04/sft_right": sft_right, "04/grpo_right": [1] * 101 + [0] * 399}
    (row,) = headlines.rows(decl(PAIRED), records)
    assert not headlines.difference(row, 1)["paired"] and row["noise"] == "SE over 500 problems"
    assert headlines.block(decl(PAIRED), records) == headlines.block(decl(ACCURACY), records)


@pytest.mark.parametrize("records", [
    {},                                                                    # nothing recorded: the run stopped early
    {"04/sft_accuracy": "0.5", "04/grpo_accuracy": True, "04/n_test": -3},  # a student's notebook: any JSON
    {"04/sft_accuracy": float("nan"), "04/grpo_accuracy": 1e308, "04/n_test": float("inf")},
    {"04/sft_accuracy": 10 ** 400, "04/grpo_accuracy": [0.5], "04/n_test": {"n": 5}},
])
def test_missing_or_hostile_records_never_raise(records):
    lines = headlines.block(decl(ACCURACY, {"name": "r", "unit": "x", "values": {"a": "sft_accuracy",
                                                                                 "b": "grpo_accuracy"}, "noise": "-"}),
                            records)
    assert len(lines) == 2 and "Traceback" not in "".join(lines)
    assert "not recorded" in lines[0]


@pytest.mark.parametrize("bad, message", [
    ({"results": []}, "one to four"),
    (decl({"values": {"a": "x"}, "n": 5}), "needs a 'name'"),
    (decl({"name": "a", "values": {}, "n": 5}), "'values' maps each stage"),
    (decl({"name": "a", "values": [["a", "x"], ["a", "y"]], "n": 5}), "labels repeat"),
    (decl({"name": "a", "values": {"a": "x"}}), "exactly one of 'n'"),
    (decl({"name": "a", "values": {"a": "x"}, "n": 5, "noise": "exact"}), "exactly one of 'n'"),
    (decl({"name": "a", "unit": "MB", "values": {"a": "x"}, "n": 5}), "for a share only"),
    (decl({"name": "a", "values": {"a": "x"}, "n": 5, "colour": "red"}), "unknown keys"),
    (decl({"name": "a", "values": {"a": "x"}, "n": 5, "compare": "no"}), "'compare' is True"),
    (decl({"name": "a", "values": {"a": "x"}, "se": {"b": "y"}}), "stage labels"),
    (decl({"name": "a", "values": {"a": "x"}, "n": 5, "seed_std": {"a": "y"}}), "goes with 'seeds'"),
    (decl({"name": "a", "values": {"a": "x"}, "n": 5, "per_problem": {"b": "y"}}), "'per_problem' maps stage"),
    (decl({"name": "a", "values": {"a": "x"}, "n": 5, "per_problem": {"a": 3}}), "'per_problem' maps stage"),
    (decl({"name": "a", "values": {"a": "x"}, "se": {"a": "s"}, "per_problem": {"a": "y"}}), "goes with 'n'"),
    (decl(ACCURACY, target=-1), "tiny_target_s"),
    (decl(ACCURACY, target=float("nan")), "tiny_target_s"),
    ("not a dict", "a headline is"),
])
def test_a_malformed_declaration_says_what_is_wrong(bad, message):
    with pytest.raises(ValueError, match=message):
        headlines.check(bad)


def test_headline_records_the_declaration_and_prints_the_block(capsys):
    headlines.RECORDS.update({"98/sft_accuracy": 0.062, "98/grpo_accuracy": 0.202, "98/n_test": 500})
    try:
        headlines.headline("98", [ACCURACY], tiny_target_s=180)
        stored = headlines.RECORDS["98/headline"]
        assert stored["results"][0]["values"] == [["SFT", "sft_accuracy"], ["GRPO", "grpo_accuracy"]]
        # stages keep their order through a notebook, whose JSON has sorted keys
        assert headlines.rows(json.loads(json.dumps(stored, sort_keys=True)), RECORDS)[0]["stages"][0]["label"] == "SFT"
    finally:
        for key in [k for k in headlines.RECORDS if k.startswith("98/")]:
            del headlines.RECORDS[key]
    out = capsys.readouterr().out
    assert "[record] 98/headline (1 results, below)" in out
    assert "0.062 ± 0.011 → 0.202 ± 0.018   +14.0 ± 2.1 pts" in out


def test_summary_blocks_time_against_target_and_the_picture(tmp_path):
    records = {**RECORDS, "04/headline": decl(ACCURACY), "04/hardware": "CPU (2 cores)"}
    results = [{"lesson": "04_grpo", "status": "ok", "preset": "tiny", "wall_s": 200.4, "records": records},
               {"lesson": "05_x", "status": "failed", "preset": "tiny", "wall_s": 3.0, "records": {},
                "error": {"ename": "ValueError", "evalue": "boom"}}]
    text = format_summary(results)
    assert "04_grpo  ok  3 min 20 s of a 3 min target (OVER)  (tiny · CPU (2 cores))" in text
    assert "  accuracy, SFT → GRPO   0.062 ± 0.011 → 0.202 ± 0.018" in text
    assert "05_x  failed  3 s" in text and "error: ValueError: boom" in text and "declares no headline" in text
    assert "sft_accuracy" not in text and "sft_accuracy" in format_summary(results, show_all=True)
    assert (duration(59.6), duration(120), duration(61)) == ("1 min", "2 min", "1 min 01 s")
    # a declaration or records that are not what they should be never stop the summary
    odd = [dict(results[0], records={**records, "04/headline": "nonsense", "04/grpo_accuracy": 10 ** 400}),
           dict(results[0], records={**records, "04/headline": decl(ACCURACY, target="3 min")})]
    assert format_summary(odd).count("declares no headline") == 2
    saved = [dict(results[0], headline=headlines.rows(decl(ACCURACY), records), tiny_target_s=180),
             dict(results[1], headline=None)]
    plot_summary(saved, tmp_path / "summary.png")
    assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"


def test_a_panel_shows_negative_values_whole():
    from matplotlib.figure import Figure

    entry = {"name": "reward change", "unit": "reward", "compare": False, "values": {"a": "kl", "b": "neg"},
             "se": {"a": "kl_se", "b": "kl_se"}}
    (row,) = headlines.rows(decl(entry), {**RECORDS, "04/neg": -2.5})
    ax = Figure().subplots()
    _draw_result(ax, row)
    low, high = ax.get_ylim()
    assert low < -2.5 - 0.17 and high > 2.3 + 0.17, "every bar and its error bar inside the axis"
