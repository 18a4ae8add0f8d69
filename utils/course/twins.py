"""Architecture twins: measure the GPU presets without downloading a model.

A *twin* has the real architecture of a preset's Hub model (its ``config.json`` values, copied
below) and random weights. Memory and step time depend on the architecture, the sizes and the
sequence lengths, not on what the weights have learnt, so a twin measures what a preset needs
(peak GPU memory, seconds per step) on a machine that cannot reach the Hub. What a twin cannot
measure is anything about quality (accuracy, rewards), and how long the real model's answers are:
a random model never emits its end-of-sequence token, so every generation here runs to the
preset's token limit, and every training example is cut at the preset's ``max_length``. The
figures are therefore upper bounds for a real run with the same sizes.

The twin uses the embedded tiny tokenizer (its ids are valid in Qwen's vocabulary; the model keeps
Qwen's 151,936-row embedding and output layer, which dominate the memory of the logits).

Each lesson's heaviest phases are run with the lesson's own code paths (``utils.sft``,
``utils.dpo``, ``utils.rl`` configs, TRL's trainers, PEFT's LoRA, bitsandbytes), for a few
steps, with the models the lesson keeps resident at that point::

    python -m utils twins measure --preset 24g --lessons 01 04 --out twins-24g.json

writes one record per lesson (phases with ``peak_gb`` = ``torch.cuda.max_memory_reserved`` and
``seconds`` per step or per batch; the lesson's peak and its extrapolated training time) and
the preset's parameters it measured, so ``tests/course/test_twins.py`` can tell when a preset changed
after it was measured. The committed figures are in ``utils/assets/twin-measurements.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import time
import traceback
from pathlib import Path

import torch

from .. import presets, runtime
from ..constants import TINY_MODEL_DIR
from ..presets import measured, sizing
from ..presets.hardware import ARCHITECTURES
from . import twin_lessons
from .twin_agent import lesson09
from .twin_judges import beam_problems, lesson07, lesson08
from .twin_lessons import lesson01, lesson02, lesson03, lesson04, lesson05, lesson06

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


# ----------------------------------------------------------------------------- twins
def twin_config(model_id: str, **overrides):
    """The ``transformers`` config of ``model_id``'s architecture (random weights come from it).

    ``overrides`` change fields (the tests shrink a twin to CPU size with them)."""
    from transformers import AutoConfig

    if model_id not in ARCHITECTURES:
        raise ValueError(f"No architecture twin for {model_id!r}; known: {sorted(ARCHITECTURES)}")
    fields = {**ARCHITECTURES[model_id], **overrides}
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def build_twin(model_id: str, out_dir, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
               real_tokenizer: bool = False, **overrides) -> Path:
    """Save a random-weight twin of ``model_id`` (in ``dtype``) with the tiny tokenizer to ``out_dir``, or with the
    model's real tokenizer and chat template (``real_tokenizer``: :mod:`.qwen_tokenizers`, built offline; lesson 09
    renders tool turns in Qwen's markup).

    The weights are drawn on ``device`` (a GPU draws a 4B model in seconds). Returns ``out_dir``,
    which loads like the Hub model: ``AutoModelForCausalLM.from_pretrained(out_dir)``."""
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(twin_config(model_id, **overrides), dtype=dtype)
    model.generation_config.eos_token_id = None   # the tiny tokenizer's stop tokens decide (evaluation.py)
    model.save_pretrained(out)
    if real_tokenizer:
        from .qwen_tokenizers import qwen_tokenizer

        qwen_tokenizer(model_id).save_pretrained(out)
    else:
        for name in TOKENIZER_FILES:
            shutil.copy(TINY_MODEL_DIR / name, out / name)
    del model
    return out


def parameter_count(model_id: str) -> int:
    """Parameters of ``model_id``'s architecture (tied embeddings counted once), without weights."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(twin_config(model_id))
    return sum(p.numel() for p in model.parameters())


LESSONS = {"01": lesson01, "02": lesson02, "03": lesson03, "04": lesson04, "05": lesson05, "06": lesson06,
           "07": lesson07, "08": lesson08, "09": lesson09}
REAL_TOKENIZER = {"09"}   # lessons whose twin carries the model's real tokenizer and chat template


def _training_steps(cfg, lesson: str) -> dict:
    """The optimizer steps of a lesson's longest training runs on this preset (for the time estimate)."""
    if lesson == "01":
        return {"sft train": cfg.max_steps}
    if lesson == "02":
        return {"SFTTrainer padded": cfg.max_steps}
    if lesson == "03":
        others = [b for b in cfg.betas if b != cfg.beta]   # the run, the sweep's other betas, DPO + NLL
        return {"DPO train": cfg.max_steps * (2 + len(others))}
    if lesson == "04":
        return {"GRPO train": cfg.max_steps + cfg.hack_steps, "capstone grpo_step": cfg.hand_steps}
    if lesson == "05":
        batches = cfg.max_steps * cfg.grad_accum // cfg.steps_per_generation
        return {"DAPO train": 3 * batches * len(cfg.seeds), "RLOO train": batches * len(cfg.seeds)}
    if lesson == "07":   # the reward model; one RL run (PPO's, the dearest of the four estimators)
        return {"RewardTrainer train": cfg.max_steps, "PPO iteration": cfg.rl_iterations}
    if lesson == "08":   # the two verifiers; every sampled batch; both beam searches at the PRM's price per round
        answers = cfg.ttc_problems * cfg.ttc_samples + cfg.prm_problems * cfg.prm_samples
        return {"PRM train": cfg.max_steps, "ORM train": cfg.max_steps,
                "sampled eval": math.ceil(answers / cfg.eval_batch_size),
                "PRM beam search": 2 * cfg.beam_max_steps * math.ceil(cfg.ttc_problems / beam_problems(cfg))}
    if lesson == "09":   # both SFTs; the GRPO run, the hack run and its control (as long as a step of the GRPO run)
        return {"SFT train": 2 * cfg.sft_steps, "GRPO with tools train": cfg.max_steps + 2 * cfg.hack_steps,
                "tool rollout": rollout_evaluations(cfg)}
    return {"QLoRA train": cfg.qlora_steps}


def rollout_evaluations(cfg) -> int:
    """Lesson 09's turn batches: seven passes over ``n_test`` (the plain model, the trace model with and without the
    tool, the GRPO model with and without it, the hacked model and its control with it; those with the tool up to
    :func:`utils.presets.sizing.rollout_turns` turns each) and the credit section's ``turn_prompts x
    num_generations``."""
    batches = math.ceil(cfg.n_test / cfg.eval_batch_size)
    credit = math.ceil(cfg.turn_prompts * cfg.num_generations / cfg.eval_batch_size)
    turns = sizing.rollout_turns(cfg.params)
    return batches * (3 + 4 * turns) + credit * turns


def measure_lesson(preset: str, lesson: str, model_dir, out_dir, steps: int = 3, resolve=presets.resolve,
                   only=None) -> dict:
    """Measure one lesson of ``preset`` with the twin in ``model_dir``. Returns its record.

    ``resolve`` makes the lesson configs (``presets.resolve``; the tests pass one that shrinks the
    sizes to run on a CPU). ``only``: run just these phases (a lesson that can skip phases takes it; the record
    then holds those phases alone). A phase that fails is reported in ``error`` and loses nothing measured
    before it."""
    from transformers import AutoTokenizer

    cfg = resolve(preset, lesson=lesson, model=str(model_dir), dataset="synthetic")
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    t = time.perf_counter()
    rows, error = {}, None
    twin_lessons.Phases.last = None
    try:
        rows = LESSONS[lesson](cfg, tokenizer, Path(out_dir), steps, resolve, **({"only": set(only)} if only else {}))
    except Exception as err:  # one lesson's failure must not lose the others' figures
        error = f"{type(err).__name__}: {err}"[:500]
        traceback.print_exc()
        rows = dict(twin_lessons.Phases.last.rows) if twin_lessons.Phases.last else {}   # the phases before it
    estimate = {name: round(rows[name]["seconds"] * n / 60, 1) for name, n in _training_steps(cfg, lesson).items()
                if name in rows and not math.isnan(rows[name]["seconds"])}
    params = presets.PRESETS[preset]["lessons"][lesson]
    return {"model": params["model"], "dtype": runtime.dtype_name(cfg.dtype), "phases": rows,
            "peak_gb": max((r["peak_gb"] or 0 for r in rows.values()), default=None),
            "training_minutes": estimate, "measure_seconds": round(time.perf_counter() - t, 1),
            "params_digest": measured.params_digest(params), **({"error": error} if error else {})}


def measure(preset: str, lessons, out_dir, steps: int = 3, only=None) -> dict:
    """Measure ``lessons`` of a GPU ``preset`` on this GPU with twins. Returns ``{lesson: record}``."""
    out_dir = Path(out_dir)
    spec = presets.PRESETS[preset]
    results, twins = {}, {}
    for lesson in lessons:
        model_id = spec["lessons"][lesson]["model"]
        key = (model_id, lesson in REAL_TOKENIZER)
        if key not in twins:
            twins[key] = build_twin(model_id, out_dir / "twins" / (model_id.split("/")[-1] + "-real" * key[1]),
                                    presets._preset_dtype(spec, "cuda"), "cuda", real_tokenizer=key[1])
        results[lesson] = measure_lesson(preset, lesson, twins[key], out_dir / lesson, steps, only=only)
        print(json.dumps({preset: {lesson: results[lesson]}}), flush=True)
    return results


def _environment() -> dict:
    from .. import runtime

    info = runtime.gpu_info()
    return {"gpu": info["name"] if info else None, "gpu_total_gb": info["total_gb"] if info else None,
            "date": time.strftime("%Y-%m-%d"),
            **{k: runtime._version(k) for k in ("torch", "transformers", "trl", "peft", "bitsandbytes", "accelerate")}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils twins", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="measure GPU presets with architecture twins (needs a CUDA GPU)")
    m.add_argument("--preset", nargs="+", default=["t4-16g", "24g", "80g"])
    m.add_argument("--lessons", nargs="+", default=sorted(LESSONS))
    m.add_argument("--steps", type=int, default=3, help="optimizer steps per training phase (default 3)")
    m.add_argument("--phases", nargs="+", default=None,
                   help="measure only these phases (lesson 04: 'capstone grpo_step'); the record holds them alone")
    m.add_argument("--work", default="/tmp/twins", help="where twins and trainer outputs go")
    m.add_argument("--out", required=True, help="JSON file for the results (rewritten after each preset)")
    m.add_argument("--memory-gb", type=float, default=None,
                   help="cap PyTorch's memory at this many GiB, to play a smaller card on a larger one "
                        "(an RTX 4090 leaves about 23.4 GiB to PyTorch); a run over the cap fails as it would there")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("measuring the GPU presets needs a CUDA GPU (torch sees none)")
    args.preset = [presets.preset_name(p) for p in args.preset]
    unknown = [p for p in args.preset if not presets.needs_gpu(p)]
    if unknown:
        parser.error(f"not GPU presets: {unknown}; choose from {presets._gpu_presets()}")
    report = {"environment": _environment(), "presets": {}}
    if args.memory_gb:
        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_gb / total))
        report["environment"]["memory_cap_gb"] = args.memory_gb
    for preset in args.preset:
        report["presets"][preset] = measure(preset, [presets._lesson_id(x) for x in args.lessons],
                                            Path(args.work) / preset, args.steps, args.phases)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        shutil.rmtree(Path(args.work) / preset, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
