"""What the GPU presets were measured at: the architecture-twin records (``utils/assets/twin-measurements.json``).

``python -m utils twins measure`` writes the records (``utils/course/twins.py``); this module only
reads them, for the resolution table (:func:`measured_note`) and the out-of-memory warning.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from ..constants import TWIN_MEASUREMENTS

# Keys that change what the data says, not how large anything is: a twin measurement does not depend on them.
CONTENT_KEYS = ("model", "dataset", "difficulty", "verbose_share", "shortcut_share")

# Keys that size only a part of a lesson the twins do not run (lesson 04's capstone, GRPO with the student's own
# step; the reward-hack runs of lessons 04 and 09, estimated from lesson 04's GRPO batch; lesson 05's clip probe,
# estimated from its DAPO batch; lesson 03's other preference losses, estimated from its DPO runs): the twin's
# figures hold for the phases it measured, and those keys are not in them.
UNTWINNED_KEYS = ("hand_steps", "hand_prompts", "hack_prompts", "clip_probe_prompts", "clip_probe_steps",
                  "clip_probe_learning_rate", "clip_probe_micro_batch", "preference_losses")

# Keys that set how many times a measured unit runs (steps, iterations, problems, seeds), not how large it is: the
# twins run a few steps of each phase whatever they are, so a preset cut to a session keeps its measurement (the
# time estimate, utils/presets/sizing.py, multiplies the units by these counts).
COUNT_KEYS = ("max_steps", "sft_steps", "hack_steps", "n_train", "n_test", "n_prompts", "n_heldout", "seeds",
              "rl_pool", "rl_iterations", "overopt_iterations", "ttc_problems", "prm_problems", "beam_max_steps",
              "refine_rounds", "sampled_eval_prompts", "sweep_prompts", "qlora_steps", "throughput_steps",
              "ppl_problems", "turn_prompts", "eval_steps", "save_steps", "logging_steps")

# Keys added after the twins were measured, with the value that runs exactly what was measured: a preset
# holding that value keeps its measurement (any other value changes the run, so the digest changes).
MEASURED_DEFAULTS = {"decode_rollout": False}


def params_digest(params: dict) -> str:
    """A short hash of a lesson's preset parameters (the model, checked separately, the
    :data:`CONTENT_KEYS`, the :data:`UNTWINNED_KEYS`, the :data:`COUNT_KEYS` and keys at their
    :data:`MEASURED_DEFAULTS` value excluded): when it differs from the digest stored with a measurement, the
    preset changed after it was measured."""
    body = {k: v for k, v in params.items()
            if k not in CONTENT_KEYS + UNTWINNED_KEYS + COUNT_KEYS
            and not (k in MEASURED_DEFAULTS and v == MEASURED_DEFAULTS[k])}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:12]


@lru_cache(maxsize=1)
def twin_records() -> dict:
    """``{preset: {lesson: record}}`` from the committed measurements ({} when the file is absent)."""
    if not TWIN_MEASUREMENTS.exists():
        return {}
    return json.loads(TWIN_MEASUREMENTS.read_text()).get("presets", {})


def measurement(preset: str, lesson: str, params: dict) -> dict | None:
    """The architecture-twin record of ``lesson`` on GPU ``preset`` whose preset values are ``params``
    (``peak_gb`` = peak ``torch.cuda.max_memory_reserved`` in GiB, ``phases`` with seconds per step or
    batch), or None when that lesson was not measured or its values changed since."""
    record = twin_records().get(preset, {}).get(lesson)
    if not record or not record.get("phases"):
        return None
    if record.get("params_digest") != params_digest(params) or record.get("model") != params.get("model"):
        return None
    return record


def measured_note(record: dict | None) -> str:
    """One line for the resolution table: the measured peak (reserved; the tensors' own peak where it was
    recorded; the cap, where the run played a smaller card) and main training step, or "unmeasured"."""
    if record is None:
        return "unmeasured"
    note = f"peak {record['peak_gb']:.1f} GB"
    tensors = [p.get("allocated_gb") for p in record["phases"].values()]
    if all(tensors):
        note += f" (tensors {max(tensors):.1f} GB)"
    if record.get("memory_cap_gb"):
        note += f" with PyTorch capped at {record['memory_cap_gb']:g} GB"
    minutes = {name: m for name, m in record.get("training_minutes", {}).items() if name in record["phases"]}
    main = max(minutes, key=minutes.get, default=None)    # the phase that takes the lesson's longest training
    gpu = record.get("gpu", "NVIDIA H100")     # the first sessions' card, named in the file's environment
    if main:
        phase = record["phases"][main]
        note += f", {phase['seconds']:g} s per {phase['unit']} ({main})"
        gpu = phase.get("gpu", gpu)
    return note + f" on an {gpu.removeprefix('NVIDIA ')} (random-weight stand-in)"


def memory_warning(preset: str, lesson: str, record: dict | None, gpu: dict | None) -> str | None:
    """A warning when this GPU (``runtime.gpu_info()``; None: no GPU, nothing to compare) has less memory
    than the lesson's measured peak on this preset, else None."""
    if not record or not gpu or record["peak_gb"] <= gpu["total_gb"]:
        return None
    worst = max(record["phases"], key=lambda k: record["phases"][k]["peak_gb"] or 0)
    return (f"[presets] warning: lesson {lesson} on {preset!r} peaked at {record['peak_gb']:.1f} GB of GPU memory "
            f"({worst!r}) in a run of its random-weight stand-in, and {gpu['name']} has {gpu['total_gb']:g} GB. "
            "The figure is an upper bound (PyTorch's allocator cache, answers of the full max_completion_length); "
            "if it runs out of memory, lower prompts_per_step / batch_size / eval_batch_size "
            "(see docs/gpu.md).")
