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
