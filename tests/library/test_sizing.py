"""utils.presets.hardware and utils.presets.sizing: the cards, the models' shapes and the upper-bound time estimate
of every lesson on its preset's card (docs/gpu.md, "Estimated time on each card")."""
import json

import pytest
import torch

from utils import presets
from utils.constants import NOTEBOOKS_DIR, REPO_ROOT
from utils.course import twins
from utils.presets import hardware, sizing

GPU_PRESETS = [p for p in presets.PRESETS if presets.PRESETS[p]["needs_gpu"]]
QWEN25 = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize("model_id", sorted(hardware.ARCHITECTURES))
def test_shape_counts_the_parameters_the_model_has(model_id):
    assert hardware.shape(model_id)["params"] == twins.parameter_count(model_id)


def test_device_seconds_by_hand():
    n = hardware.shape(QWEN25)["params"]                       # 494,032,768
    t4 = hardware.CARDS["T4"]
    train = sizing.device_seconds([sizing.training(2, 1000, checkpointing=False)], QWEN25, "T4")
    assert train == pytest.approx(6 * n * 2000 / (t4["fp16_tflops"] * 1e12 * sizing.EFFICIENCY))
    assert sizing.device_seconds([sizing.training(2, 1000)], QWEN25, "T4") == pytest.approx(train * 8 / 6)
    fp32 = sizing.device_seconds([sizing.forward(1, 100)], QWEN25, "T4", fp32=True)
    assert fp32 == pytest.approx(2 * n * 100 / (t4["fp32_tflops"] * 1e12 * sizing.EFFICIENCY))
    # one decode step of one row after no prompt: the weights once (2 bytes each) and half a token of cache
    kv = hardware.shape(QWEN25)["kv_per_token"]                # 2 x 24 layers x 2 heads x 64 = 6,144
    assert kv == 6144
    gen = sizing.device_seconds([sizing.generation(1, 1, prompt=0)], QWEN25, "T4")
    assert gen == pytest.approx(2 * n / (t4["fp16_tflops"] * 1e12 * sizing.EFFICIENCY)
                                + (n + kv * 0.5) * 2 / (t4["bandwidth_gbs"] * 1e9 * sizing.EFFICIENCY))


def test_cards_are_the_presets_and_are_named_from_the_device():
    assert set(hardware.PRESET_CARD) == set(GPU_PRESETS) and set(hardware.PRESET_CARD.values()) <= set(hardware.CARDS)
    assert hardware.CARDS["T4"]["bf16_tflops"] is None                         # fp16 only: t4-16g trains in fp16
    names = {"Tesla T4": "T4", "NVIDIA GeForce RTX 4090": "RTX 4090", "NVIDIA A100-SXM4-80GB": "A100 80GB",
             "NVIDIA H100 80GB HBM3": "H100 80GB", "NVIDIA H200": "H200", "NVIDIA A10G": None, None: None}
    assert {name: hardware.card_of(name) for name in names} == names


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_every_lesson_has_an_estimate_from_measured_phases(preset):
    for lesson in presets.PRESETS[preset]["lessons"]:
        e = presets.estimate(preset, lesson)
        assert e["card"] == hardware.PRESET_CARD[preset]
        assert e["minutes"] is not None, (preset, lesson, e["unmeasured"])
        assert e["minutes"] == pytest.approx(sum(r["minutes"] for r in e["rows"]))
        assert all(r["measured"] > 0 and r["device"] > 0 for r in e["rows"]), (preset, lesson)


def test_an_operation_needs_its_phase_measured(monkeypatch):
    """A phase that was not measured on the preset leaves the estimate open, and says which."""
    real = presets.measurement
    monkeypatch.setattr(presets, "measurement", lambda p, les: None if les == "04" else real(p, les))
    e = presets.estimate("24g", "04")
    assert e["minutes"] is None and "04 GRPO train" in e["unmeasured"]
    assert presets.estimate_note("24g", "04").startswith("none on the RTX 4090: unmeasured phases (04 GRPO train")


def test_fewer_steps_cost_less_and_the_table_says_so():
    full = presets.estimate("24g", "04")["minutes"]
    params = presets.PRESETS["24g"]["lessons"]["04"]
    half = presets.estimate("24g", "04", {**params, "max_steps": params["max_steps"] // 2})["minutes"]
    grpo = next(r for r in presets.estimate("24g", "04")["rows"] if r["label"].startswith("GRPO"))
    assert half == pytest.approx(full - grpo["minutes"] / 2)
    cfg = presets.LessonConfig(preset="24g", lesson="04", device="cuda", dtype=torch.bfloat16, model_label="m",
                               params=dict(presets.PRESETS["24g"]["lessons"]["04"]))
    line = next(x for x in cfg.table().splitlines() if x.startswith("estimate"))
    assert f"at most {full:.0f} min on the RTX 4090 (budget {sizing.BUDGET_MINUTES}" in line
    assert "estimate" not in presets.resolve("tiny", lesson="04").table()


def test_the_gpu_page_shows_the_estimates():
    estimates = {(lesson, p): presets.estimate(p, lesson) for p in GPU_PRESETS for lesson in sizing.OPERATIONS}
    readme = (REPO_ROOT / "docs" / "gpu.md").read_text()
    assert sizing.markdown(estimates) in readme
    over = sum(e["minutes"] > sizing.BUDGET_MINUTES for e in estimates.values())
    assert f"**{over} of the {len(estimates)} are still over the hour**" in readme
    for card in hardware.CARDS.values():
        assert card["source"] in readme


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_every_lesson_fits_a_session_on_its_card_or_is_listed(preset):
    """The budget: a lesson on its preset's card in at most BUDGET_MINUTES (an upper bound), or, for the lessons the
    cuts of 2026-11-28 left over it (sizing.OVER_BUDGET), no more than then. A listed lesson that fits leaves the list."""
    for lesson in presets.PRESETS[preset]["lessons"]:
        minutes = presets.estimate(preset, lesson)["minutes"]
        ceiling = sizing.OVER_BUDGET.get((lesson, preset))
        if ceiling is None:
            assert minutes <= sizing.BUDGET_MINUTES, f"lesson {lesson} on {preset}: {minutes:.0f} min"
        else:
            assert sizing.BUDGET_MINUTES < minutes <= ceiling, f"lesson {lesson} on {preset}: {minutes:.0f} min"


def test_each_lessons_header_states_its_estimate():
    """The time column of a lesson's GPU rows ends with the estimate on the preset's card, as the table computes it."""
    import nbformat

    from utils.constants import LESSON_GLOB, NOTEBOOKS_DIR

    for notebook in sorted(NOTEBOOKS_DIR.glob(LESSON_GLOB)):
        lesson, header = notebook.name[:2], nbformat.read(notebook, as_version=4).cells[0].source
        for preset in GPU_PRESETS:
            (row,) = [line for line in header.splitlines() if line.startswith(f"| `{preset}` |")]
            e = presets.estimate(preset, lesson)
            assert row.endswith(f"; estimated at most {e['minutes']:.0f} min on the {e['card']} (upper bound, [GPU page](../docs/gpu.md)) |"), \
                (lesson, preset, row)


def test_the_table_estimates_for_the_card_it_runs_on():
    """On a card the model knows, the resolution table estimates for it (an H100 is faster than the A100 80g is
    sized for); on any other GPU, for the preset's card."""
    a100 = presets.estimate("80g", "04")["minutes"]
    h100 = presets.estimate("80g", "04", card="H100 80GB")["minutes"]
    assert h100 < a100
    assert presets.estimate_note("80g", "04", gpu={"name": "NVIDIA H100 80GB HBM3"}).startswith(
        f"at most {h100:.0f} min on this H100 80GB")
    assert presets.estimate_note("80g", "04", gpu={"name": "NVIDIA A10G"}).startswith(
        f"at most {a100:.0f} min on the A100 80GB")


def test_auto_says_which_preset_it_chose_and_why(fake_gpu, monkeypatch, capsys):
    from utils import runtime

    fake_gpu("RTX 4090")
    monkeypatch.setattr(runtime, "hub_reachable", lambda *a, **k: True)
    cfg = presets.resolve("auto", lesson="02")
    out = capsys.readouterr().out
    assert cfg.preset == "24g" and "auto: NVIDIA GeForce RTX 4090" in out
    assert "-> '24g', the largest preset it fits (at least 20 GB and bf16)" in out


def test_a_lesson_over_the_budget_says_how_to_run_it_from_a_terminal():
    """A lesson over an hour on a card (sizing.OVER_BUDGET) says so in its header, with the command of a long run."""
    for lesson in sorted({lesson for lesson, _ in sizing.OVER_BUDGET}):
        (path,) = NOTEBOOKS_DIR.glob(f"{lesson}_*.ipynb")
        header = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
        assert "Long GPU runs" in header and f"nohup python -m utils run {lesson} --preset" in header, lesson
