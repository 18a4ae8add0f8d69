"""utils.course.twins (architecture twins for the GPU presets) and the committed measurements they produced.

The GPU itself is not here: these tests check the architectures against the model cards, run every
lesson's measurement code on a CPU-sized twin, and check the committed figures and how the presets
report them."""
import json
import subprocess
import sys

import pytest
import torch

from utils import presets, runtime
from utils.constants import TINY_MODEL_DIR, TWIN_MEASUREMENTS
from utils.course import twin_lessons, twins
from utils.presets import measured, sizing

# Parameter counts the model cards state (total, non-embedding), in billions, as rounded there.
MODEL_CARDS = {
    "Qwen/Qwen2.5-0.5B-Instruct": ("0.49", "0.36"),
    "Qwen/Qwen3-1.7B-Base": ("1.7", "1.4"),
    "Qwen/Qwen3-4B-Base": ("4.0", "3.6"),
}


@pytest.mark.parametrize("model_id", sorted(MODEL_CARDS))
def test_architecture_matches_the_model_card(model_id):
    total = twins.parameter_count(model_id)
    arch = twins.ARCHITECTURES[model_id]
    non_embedding = total - arch["vocab_size"] * arch["hidden_size"]   # tied: the embedding is counted once
    card_total, card_non_embedding = MODEL_CARDS[model_id]
    decimals = len(card_total.split(".")[1])
    assert f"{total / 1e9:.{decimals}f}" == card_total, (model_id, total)
    assert f"{non_embedding / 1e9:.{len(card_non_embedding.split('.')[1])}f}" == card_non_embedding
    assert arch["tie_word_embeddings"] and arch["vocab_size"] == 151936


def test_every_gpu_preset_model_has_a_twin():
    models = {spec["lessons"][les]["model"] for spec in presets.PRESETS.values() if spec["needs_gpu"]
              for les in spec["lessons"]}
    assert models <= set(twins.ARCHITECTURES), models - set(twins.ARCHITECTURES)


def test_unknown_architecture_is_a_clear_error():
    with pytest.raises(ValueError, match="No architecture twin for 'Qwen/Qwen9'"):
        twins.twin_config("Qwen/Qwen9")


def test_problems_have_the_requested_lengths():
    tok = __import__("transformers").AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    rows = twin_lessons.problems(tok, 3, prompt_tokens=60, answer_tokens=100)
    assert len(rows) == 3 and rows[0]["answer"].endswith("#### 0")
    n_answer = len(tok(rows[0]["answer"], add_special_tokens=False)["input_ids"])
    assert 92 <= n_answer <= 130, n_answer


# ----------------------------------------------------------------------------- every lesson on a CPU-sized twin
SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=1024)
SHRINK = dict(batch_size=2, packed_batch_size=2, grad_accum=1, max_length=64, max_new_tokens=8,
              max_completion_length=8, eval_batch_size=4, n_samples=2, num_generations=2, prompts_per_step=2,
              ttc_samples=2, lora_r=4, lora_alpha=8, gradient_checkpointing=True, hand_prompts=1,
              rl_pool=20, rl_prompts=2, rl_samples=2, rl_micro_batch=2, rl_minibatches=2, step_tokens=8,
              score_batch_size=3, beam_width=2, beam_expand=2)


def small_resolve(preset, lesson, **overrides):
    """The GPU preset's lesson config with CPU-sized batches and lengths (keeps its LoRA, beta, loss_type ...)."""
    lesson = presets._lesson_id(lesson)
    params = dict(presets.PRESETS[preset]["lessons"][lesson])
    params.update({k: v for k, v in SHRINK.items() if k in params})
    if "steps_per_generation" in params:          # lesson 05: two optimizer steps per generation batch
        params.update(steps_per_generation=2)
    elif "num_generations" in params:             # lesson 04: one generation batch per optimizer step
        params.update(grad_accum=2)
    params.update(overrides)
    return presets.LessonConfig(preset=preset, lesson=lesson, device="cpu", dtype=torch.float32,
                                model_label="twin", params=params)


@pytest.fixture(scope="module")
def small_twin(tmp_path_factory):
    return twins.build_twin("Qwen/Qwen3-1.7B-Base", tmp_path_factory.mktemp("twin"), torch.float32, **SMALL)


PHASES = {
    "01": {"sft train", "greedy eval"},
    "02": {"SFTTrainer padded", "SFTTrainer packed", "QLoRA (NF4) padded", "greedy eval"},
    "03": {"preference sampling", "DPO train"},
    "04": {"GRPO train", "greedy eval", "sampled eval", "capstone grpo_step"},
    "05": {"DAPO train", "RLOO train"},
    "06": {"fp32 eval", "int8 eval", "NF4 eval", "QLoRA train"},
    "07": {"pair sampling", "RewardTrainer train", "PPO iteration"},
    "08": {"sampled eval", "PRM train", "ORM train", "PRM scoring", "PRM beam search"},
}   # lesson 09's twin carries the real tokenizer: test_lesson09_measures_on_a_cpu_twin_with_the_real_tokenizer


@pytest.mark.slow   # builds and runs a twin: `make test` only (tests/budget.py)
@pytest.mark.parametrize("lesson", sorted(PHASES))
def test_each_lesson_measures_on_a_cpu_twin(lesson, small_twin, tmp_path):
    record = twins.measure_lesson("24g", lesson, small_twin, tmp_path, steps=2, resolve=small_resolve)
    assert "error" not in record, record.get("error")
    assert set(record["phases"]) == PHASES[lesson]
    assert all(p["seconds"] > 0 and p["peak_gb"] is None for p in record["phases"].values())   # no GPU: no peak
    assert set(record["training_minutes"]) <= set(record["phases"]) and record["training_minutes"]
    assert record["params_digest"] == measured.params_digest(presets.PRESETS["24g"]["lessons"][lesson])


@pytest.mark.slow   # builds and runs a twin: `make test` only (tests/budget.py)
def test_only_the_phases_asked_for(small_twin, tmp_path):
    record = twins.measure_lesson("24g", "04", small_twin, tmp_path, steps=2, resolve=small_resolve,
                                  only=["capstone grpo_step"])
    assert "error" not in record and set(record["phases"]) == {"capstone grpo_step"}
    assert set(record["training_minutes"]) == {"capstone grpo_step"}


@pytest.mark.slow   # builds and runs a twin: `make test` only (tests/budget.py)
def test_lesson07_runs_the_lessons_own_loop(small_twin, tmp_path):
    """The PPO phase executes the notebook's rl-setup and rl-loop cells: its clock has the lesson's four parts."""
    record = twins.measure_lesson("24g", "07", small_twin, tmp_path, steps=2, resolve=small_resolve)
    ppo = record["phases"]["PPO iteration"]
    assert set(ppo["parts"]) == {"generate", "score and advantages", "update policy", "update critic"}
    assert ppo["seconds"] == pytest.approx(sum(ppo["parts"].values()), abs=0.03)


@pytest.mark.slow   # builds and runs a twin: `make test` only (tests/budget.py)
def test_lesson09_measures_on_a_cpu_twin_with_the_real_tokenizer(tmp_path):
    """Lesson 09's twin renders tool turns in Qwen's markup: it carries the real tokenizer and chat template (Qwen3's
    on 24g, whose rollouts render with TRL's training template) and runs the lesson's rollout and grpo_trainer."""
    preset = "24g"
    model_id = presets.PRESETS[preset]["lessons"]["09"]["model"]
    small = {**SMALL, "vocab_size": 151936}
    twin = twins.build_twin(model_id, tmp_path / "twin", torch.float32, real_tokenizer=True, **small)
    assert __import__("transformers").AutoTokenizer.from_pretrained(twin).convert_tokens_to_ids("<tool_call>") == 151657
    resolve = lambda p, lesson, **kw: small_resolve(p, lesson, **({"max_turns": 2, "n_test": 8} | kw))
    record = twins.measure_lesson(preset, "09", twin, tmp_path / "out", steps=2, resolve=resolve)
    assert "error" not in record, record.get("error")
    assert set(record["phases"]) == {"SFT train", "tool rollout", "GRPO with tools train"}
    assert all(p["seconds"] > 0 for p in record["phases"].values())
    assert set(record["training_minutes"]) == set(record["phases"])


def test_lesson09_counts_its_turn_batches():
    cfg = presets.LessonConfig(preset="24g", lesson="09", device="cpu", dtype=torch.float32, model_label="twin",
                               params=dict(presets.PRESETS["24g"]["lessons"]["09"]))
    assert sizing.rollout_turns(cfg.params) == 3             # (1024 - 160 - 215) / 256 tokens, rounded up
    # 100 / 64 -> 2 batches: 3 passes without the tool, 4 with up to 3 turns; 8 x 8 credit rollouts in 1 batch
    assert twins.rollout_evaluations(cfg) == 2 * (3 + 4 * 3) + 1 * 3


def test_lesson09_sft_holds_no_more_tokens_per_forward_than_lesson01_measured():
    """Lesson 09 trains lesson 01's recipe at twice its max_length. With lesson 01's batch its twins ran out of memory
    on every GPU preset (2026-11-28: fp32 logits of 8 x 1024 tokens over 151,936 entries asked for 4.64 GiB more under
    a T4's cap): its SFT batch must hold no more tokens than lesson 01's measured one, with the same effective batch."""
    for name in presets._gpu_presets():
        one, nine = presets.PRESETS[name]["lessons"]["01"], presets.PRESETS[name]["lessons"]["09"]
        assert nine["sft_batch_size"] * nine["max_length"] <= one["batch_size"] * one["max_length"], name
        assert nine["sft_batch_size"] * nine["sft_grad_accum"] == one["batch_size"] * one["grad_accum"], name
        assert presets.measurement(name, "01") is not None, name      # the fit rests on lesson 01's measurement
    tiny_one, tiny_nine = presets.PRESETS["tiny"]["lessons"]["01"], presets.PRESETS["tiny"]["lessons"]["09"]
    assert (tiny_nine["sft_batch_size"], tiny_nine["sft_grad_accum"]) == (tiny_one["batch_size"], tiny_one["grad_accum"])


def test_lesson_defs_define_the_lessons_functions_without_running_its_experiments():
    """Lesson 08's twin takes the notebook's functions, not its cells' runs (those need the lesson's whole state:
    in an empty namespace they would raise NameError)."""
    from utils.course import twin_judges

    ns = twin_judges._lesson_defs("08_test_time_compute.ipynb", ["prm-data", "prm-train", "prm-eval", "beam-search"],
                                   {"torch": torch})   # the decorator of token_probs
    assert all(callable(ns[f]) for f in ("labelled_rows", "train_token_classifier", "token_probs", "beam_search",
                                         "prm_score"))
    assert not {"prm_rows", "prm", "beam"} & set(ns)
    assert twin_judges.beam_problems(small_resolve("80g", "08")) == 1          # 4 sequences // (2 x 2) lines
    assert twin_judges.beam_problems(small_resolve("80g", "08", eval_batch_size=64, beam_width=4, beam_expand=4)) == 4


@pytest.mark.slow   # builds and runs a twin: `make test` only (tests/budget.py)
def test_sft_phase_trains_the_given_steps_not_the_preset_max(small_twin, tmp_path):
    """The tool caps every training phase at `steps` (the preset's max_steps would take hours on a GPU)."""
    tok = __import__("transformers").AutoTokenizer.from_pretrained(small_twin)
    cfg = small_resolve("24g", "01", model=str(small_twin))
    phases = twin_lessons.Phases()
    trainer = twin_lessons._train_sft(phases, "sft", twin_lessons._load(cfg), tok, cfg, tmp_path, steps=2)
    assert trainer.state.global_step == 2 and cfg.max_steps == 150


@pytest.mark.slow   # builds and runs a twin: `make test` only (tests/budget.py)
def test_a_failing_lesson_is_reported_not_raised(small_twin, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setitem(twins.LESSONS, "03", broken)
    record = twins.measure_lesson("24g", "03", small_twin, tmp_path, resolve=small_resolve)
    assert record["error"] == "RuntimeError: CUDA out of memory (simulated)" and record["phases"] == {}

    def broken_later(*args, **kwargs):          # a phase measured, then the next one fails: the first is kept
        phases = twin_lessons.Phases()
        with phases("pair sampling", "batch"):
            pass
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setitem(twins.LESSONS, "03", broken_later)
    record = twins.measure_lesson("24g", "03", small_twin, tmp_path, resolve=small_resolve)
    assert record["error"].startswith("RuntimeError") and set(record["phases"]) == {"pair sampling"}


def test_measure_needs_a_gpu(tmp_path):
    run = subprocess.run([sys.executable, "-m", "utils", "twins", "measure", "--out", str(tmp_path / "x.json")],
                         capture_output=True, text=True, env={"CUDA_VISIBLE_DEVICES": "", "PATH": ""})
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


# ----------------------------------------------------------------------------- the committed measurements
def committed():
    return json.loads(TWIN_MEASUREMENTS.read_text())


def test_committed_measurements_cover_every_gpu_preset_and_lesson():
    data = committed()
    assert data["environment"]["gpu"].startswith("NVIDIA H100") and data["environment"]["trl"] == "1.16.0"
    for name in presets._gpu_presets():
        for lesson in presets.PRESETS[name]["lessons"]:
            record = data["presets"][name][lesson]
            assert record["model"] == presets.PRESETS[name]["lessons"][lesson]["model"]
            if record["phases"]:
                assert record["peak_gb"] == max(p["peak_gb"] for p in record["phases"].values()) > 0
                assert all(p["seconds"] > 0 for p in record["phases"].values())
            else:  # not measured: the record says why
                assert record["peak_gb"] is None and record["error"].startswith("not measured")


def test_measurement_is_dropped_when_the_preset_changes(monkeypatch):
    assert presets.measurement("24g", "04")["peak_gb"] == committed()["presets"]["24g"]["04"]["peak_gb"]
    changed = {**presets.PRESETS["24g"]["lessons"]["04"], "prompts_per_step": 8}
    monkeypatch.setitem(presets.PRESETS["24g"]["lessons"], "04", changed)
    assert presets.measurement("24g", "04") is None
    assert presets.measured_note("24g", "04") == "unmeasured"


def test_measurement_survives_a_key_added_at_the_measured_value(monkeypatch):
    """decode_rollout came after the twins: False (TRL's generate, what was measured) keeps the
    record, True (our decoder samples the rollouts) is another run and drops it."""
    params = presets.PRESETS["24g"]["lessons"]["04"]
    assert params["decode_rollout"] is False and presets.measurement("24g", "04") is not None
    without = {k: v for k, v in params.items() if k != "decode_rollout"}
    assert measured.params_digest(without) == measured.params_digest(params)
    monkeypatch.setitem(presets.PRESETS["24g"]["lessons"], "04", {**params, "decode_rollout": True})
    assert presets.measurement("24g", "04") is None


def test_unmeasured_lessons_say_so():
    for name in presets._gpu_presets():
        for lesson in presets.PRESETS[name]["lessons"]:
            if not committed()["presets"][name][lesson]["phases"]:
                assert presets.measured_note(name, lesson) == "unmeasured"
    assert presets.measurement("tiny", "01") is None


def test_resolution_table_shows_the_measurement_on_gpu_presets_only():
    gpu = presets.LessonConfig(preset="24g", lesson="04", device="cuda", dtype=torch.bfloat16, model_label="m",
                               params=dict(presets.PRESETS["24g"]["lessons"]["04"]))
    assert gpu.table().endswith("measured    peak 23.3 GB (tensors 16.7 GB) with PyTorch capped at 23.4 GB, "
                                "26.35 s per generation batch (GRPO train) on an H100 (random-weight stand-in)")
    old = dict(presets.measurement("80g", "04"))
    assert presets.measured_note("80g", "04") == ("peak 37.2 GB, 39.64 s per generation batch (GRPO train) on an "
                                                  "H100 (random-weight stand-in)")   # a record without allocated_gb
    assert "allocated_gb" not in old["phases"]["GRPO train"]
    assert "measured" not in presets.resolve("tiny", lesson="04").table()


def test_memory_warning_when_the_gpu_is_smaller_than_the_measured_peak():
    def warning(lesson, gpu):
        return measured.memory_warning("24g", lesson, presets.measurement("24g", lesson), gpu)

    a10g, rtx4090 = {"name": "NVIDIA A10G", "total_gb": 22.1}, {"name": "NVIDIA GeForce RTX 4090", "total_gb": 23.6}
    peak = presets.measurement("24g", "04")["peak_gb"]
    out = warning("04", a10g)
    assert f"peaked at {peak:.1f} GB" in out and "'GRPO train'" in out and "lower prompts_per_step" in out
    assert warning("04", rtx4090) is None   # ran capped at 23.4
    assert warning("03", rtx4090) is None and warning("01", rtx4090) is None   # 21.9 GB
    assert warning("02", a10g) is None   # 17.5 GB
    assert warning("04", None) is None   # no GPU (a test that skips the GPU check): nothing to compare


def test_resolve_prints_the_warning_on_a_small_gpu(fake_gpu, monkeypatch, capsys):
    fake_gpu("A10G")
    monkeypatch.setattr(runtime, "hub_reachable", lambda *a, **k: True)
    cfg = presets.resolve("24g", lesson="05")
    assert cfg.preset == "24g" and "[presets] warning: lesson 05 on '24g' peaked at 23.4 GB" in capsys.readouterr().out
    fake_gpu("RTX 4090")   # the card the cap played: no warning
    presets.resolve("24g", lesson="05")
    assert "warning" not in capsys.readouterr().out


def test_capped_records_stayed_under_their_cap():
    capped = [(name, lesson, r) for name, records in committed()["presets"].items()
              for lesson, r in records.items() if r.get("memory_cap_gb")]
    assert {(name, lesson) for name, lesson, _ in capped} == {("24g", "04"), ("24g", "05"), ("t4-16g", "07"),
                                                          ("24g", "07"), ("80g", "07"), ("t4-16g", "08"),
                                                          ("24g", "08"), ("80g", "08")}
    for _, _, record in capped:
        assert "error" not in record and record["peak_gb"] <= record["memory_cap_gb"]
        assert all(p["allocated_gb"] <= p["peak_gb"] for p in record["phases"].values())
    phases = [p for records in committed()["presets"].values() for r in records.values() for p in r["phases"].values()
              if p.get("memory_cap_gb")]                # a phase measured later, capped, in an older record
    assert len(phases) == 2 and all(p["allocated_gb"] <= p["peak_gb"] <= p["memory_cap_gb"] for p in phases)


def test_capstone_phases_hold_the_presets_sizes():
    """hand_steps and hand_prompts stay out of the digest (the GRPOTrainer phases do not depend on them), so the
    capstone's phase carries the values it ran with; its size (hand_prompts) must be the preset's, its steps are a
    count (the presets' were cut to a session after it ran)."""
    for name, records in committed()["presets"].items():
        phase = records["04"]["phases"].get("capstone grpo_step")
        if phase:
            params = presets.PRESETS[name]["lessons"]["04"]
            assert phase["hand_prompts"] == params["hand_prompts"]
    assert {n for n, r in committed()["presets"].items() if "capstone grpo_step" in r["04"]["phases"]} == {
        "t4-16g", "24g"}


def test_a_record_measured_on_another_gpu_names_it():
    assert presets.measured_note("t4-16g", "07").endswith(", 24.17 s per iteration (PPO iteration) on an H200 "
                                                          "(random-weight stand-in)")
    assert presets.measured_note("24g", "07").endswith(", 48.16 s per iteration (PPO iteration) on an H200 "
                                                       "(random-weight stand-in)")
    assert presets.measured_note("24g", "09") == "unmeasured"


def test_each_lessons_header_cites_its_measurement():
    """A lesson's GPU rows quote the twin's peak (and the card it ran on) where one was measured, and quote none
    where none was: lesson 07's t4-16g row still said "no GPU was lent" a session after its twin had run."""
    import nbformat

    from utils.constants import LESSON_GLOB, NOTEBOOKS_DIR

    notebooks = sorted(NOTEBOOKS_DIR.glob(LESSON_GLOB))
    assert len(notebooks) >= 9
    for notebook in notebooks:
        lesson, header = notebook.name[:2], nbformat.read(notebook, as_version=4).cells[0].source
        for preset in presets._gpu_presets():
            (row,) = [line for line in header.splitlines() if line.startswith(f"| `{preset}` |")]
            record = presets.measurement(preset, lesson)
            if record is None:
                assert " GB" not in row.rsplit("|", 2)[1], (lesson, preset, row)   # the time column: no figure
            else:
                assert f"{record['peak_gb']:.1f} GB" in row, (lesson, preset, row)
                gpus = {record.get("gpu")} | {phase.get("gpu") for phase in record["phases"].values()}
                assert ("H200" in row) == ("NVIDIA H200" in gpus), (lesson, preset, row)


def test_the_gpu_page_quotes_the_committed_peaks():
    """Each row of the GPU page's table (docs/gpu.md) quotes the JSON's peak (the capstone rows: that phase's), and a lesson
    whose record has no phases has a row of dashes, so a new measurement cannot leave the table behind."""
    import re

    from utils.constants import REPO_ROOT

    rows = re.findall(r"^\| `([\w-]+)` \| (\d\d) ([^|]*)\| ([^|]*)\|", (REPO_ROOT / "docs" / "gpu.md").read_text(), re.M)
    assert len(rows) >= 24
    for preset, lesson, label, peak in rows:
        record = committed()["presets"][preset][lesson]
        if "capstone" in label:
            want = record["phases"]["capstone grpo_step"]["peak_gb"]
        elif not record["phases"]:
            assert peak.strip() == "–", (preset, lesson, peak)
            continue
        else:
            want = max(p["peak_gb"] for name, p in record["phases"].items() if name != "capstone grpo_step")
        assert abs(float(peak.split(",")[0]) - want) <= 0.05 + 1e-9, (preset, lesson, label, peak, want)  # 1 decimal
