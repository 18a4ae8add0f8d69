"""Presets: which model, data and sizes each lesson uses on each kind of machine.

A preset is named by the hardware it targets (see CONVENTIONS.md, section 4):

* ``tiny``   -- CPU, the embedded model in ``utils/assets/tiny-qwen``, synthetic data,
               no network. What CI, nbval and the grader run.
* ``t4-16g`` -- Colab's T4 (16 GB, no bf16): Qwen2.5-0.5B-Instruct, fp16, LoRA.
* ``24g``    -- RTX 4090 / 3090 (24 GB, e.g. AutoDL): Qwen3-1.7B-Base, bf16, LoRA.
* ``80g``    -- A100 / H100 80 GB: Qwen3-4B-Base, bf16, LoRA.

Each preset holds one dict per lesson (``"01"`` .. ``"06"``); a lesson adds its own
entry to every preset and lists its keys in :data:`LESSON_KEYS`. A notebook calls::

    cfg = presets.resolve(PRESET, lesson="01", max_steps=MAX_STEPS, ...)  # None = preset decides
    cfg.show()
    cfg.max_steps, cfg.dtype, cfg.device
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from . import runtime

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "tiny-qwen"
TINY_MODEL_LABEL = "tiny-qwen (embedded)"
# Peak GPU memory and step times of the GPU presets, measured with architecture twins (utils/twins.py).
TWIN_MEASUREMENTS = Path(__file__).resolve().parent / "assets" / "twin-measurements.json"

# Keys every preset must define for a lesson (tests check this; add a line per new lesson).
LESSON_KEYS: dict[str, tuple[str, ...]] = {
    "01": ("model", "dataset", "n_train", "n_test", "difficulty", "max_length", "max_new_tokens",
           "batch_size", "grad_accum", "learning_rate", "max_steps", "warmup_ratio", "full_finetune",
           "lora_learning_rate", "lora_r",
           "lora_alpha", "lora_dropout", "lora_target_modules", "eval_batch_size",
           "gradient_checkpointing", "save_steps", "logging_steps"),
    "02": ("model", "dataset", "n_train", "n_test", "difficulty", "max_length", "max_new_tokens",
           "batch_size", "packed_batch_size", "grad_accum", "learning_rate", "lora_learning_rate",
           "max_steps", "throughput_steps", "warmup_ratio", "full_finetune", "lora_r", "lora_alpha",
           "lora_dropout", "lora_target_modules", "eval_batch_size", "gradient_checkpointing",
           "save_steps", "logging_steps", "eval_steps"),
    "03": ("model", "dataset", "difficulty", "sft_steps", "verbose_share", "shortcut_share", "n_prompts",
           "n_heldout", "n_test", "n_samples", "temperature", "max_new_tokens", "max_length", "batch_size", "grad_accum",
           "learning_rate", "max_steps", "warmup_ratio", "beta", "betas", "use_lora", "lora_r", "lora_alpha",
           "lora_dropout", "lora_target_modules", "eval_batch_size", "gradient_checkpointing", "save_steps",
           "logging_steps"),
    "04": ("model", "dataset", "difficulty", "sft_steps", "shortcut_share", "n_train", "n_test", "num_generations", "prompts_per_step",
           "batch_size", "grad_accum", "temperature", "max_completion_length", "learning_rate", "max_steps",
           "warmup_ratio", "beta", "loss_type", "use_lora", "lora_r", "lora_alpha", "lora_dropout",
           "lora_target_modules", "eval_batch_size", "gradient_checkpointing", "save_steps", "logging_steps",
           "use_vllm", "decode_rollout", "hack_steps", "hack_learning_rate", "sampled_eval_prompts", "sweep_prompts",
           "sweep_generations", "sweep_temperatures"),
    "05": ("model", "dataset", "difficulty", "sft_steps", "n_train", "n_test", "num_generations", "prompts_per_step",
           "batch_size", "grad_accum", "steps_per_generation", "temperature", "max_completion_length",
           "learning_rate", "max_steps", "warmup_ratio", "beta", "loss_type", "epsilon", "epsilon_high",
           "soft_punish_cache", "use_lora", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
           "eval_batch_size", "gradient_checkpointing", "save_steps", "logging_steps", "use_vllm", "seeds",
           "ttc_problems", "ttc_samples"),
    "06": ("model", "dataset", "difficulty", "sft_steps", "n_test", "max_new_tokens", "eval_batch_size", "ppl_problems",
           "blocksize", "outlier_prompts", "outlier_threshold", "qlora_steps", "lora_r", "lora_alpha"),
}

# Overrides accepted by resolve() for every lesson, besides the lesson's own keys.
COMMON_KEYS = ("seed",)

# All linear layers of a Qwen2/Qwen3 decoder block (attention and MLP).
QWEN_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
QWEN_ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]

GSM8K = "openai/gsm8k"   # 7,473 train / 1,319 test problems (config "main")

# Lessons 02 and 03 on the GPU presets: the 24g values; t4-16g and 80g override what differs.
_GPU_02 = {
    "dataset": GSM8K,
    "n_train": 7473,
    "n_test": 1319,
    "difficulty": "mixed",
    "max_length": 512,
    "max_new_tokens": 256,
    "batch_size": 16,
    "packed_batch_size": 6,       # rows of 512 tokens; a GSM8K example is ~200 tokens
    "grad_accum": 2,
    "learning_rate": 2e-4,
    "lora_learning_rate": 2e-4,
    "max_steps": 300,
    "throughput_steps": 20,
    "warmup_ratio": 0.03,
    "full_finetune": False,
    "lora_r": 32,
    "lora_alpha": 64,
    "lora_dropout": 0.05,
    "lora_target_modules": QWEN_LORA_TARGETS,
    "eval_batch_size": 64,
    "gradient_checkpointing": True,
    "save_steps": 100,
    "logging_steps": 10,
    "eval_steps": 50,
}
_GPU_04 = {
    "dataset": GSM8K,
    "difficulty": "mixed",
    "sft_steps": 300,             # lesson 01's recipe, shortened: the format, not the last point of accuracy
    "shortcut_share": 0.6,        # SFT answers that skip the working ("The answer is N."): GRPO's choice to make
    "n_train": 7473,              # prompt pool for RL (GSM8K train)
    "n_test": 1319,
    "num_generations": 8,
    "prompts_per_step": 16,       # generation batch = 16 x 8 = 128 completions per optimizer step
    "batch_size": 16,             # completions per forward/backward (TRL's per_device_train_batch_size)
    "grad_accum": 8,              # 16 x 8 = 128 = one generation batch per optimizer step (on-policy)
    "temperature": 1.0,
    "max_completion_length": 256,
    "learning_rate": 1e-5,        # LoRA adapters
    "max_steps": 200,
    "warmup_ratio": 0.0,
    "beta": 0.04,
    "loss_type": "dapo",
    "use_lora": True,             # beta > 0: the reference is the model with its adapter disabled
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.0,
    "lora_target_modules": QWEN_LORA_TARGETS,
    "eval_batch_size": 64,
    "gradient_checkpointing": True,
    "save_steps": 50,
    "logging_steps": 5,
    "use_vllm": False,            # vLLM is not in the pinned requirements: pip install vllm, then USE_VLLM=True
    "decode_rollout": False,      # TRL's generate (or vLLM) samples the rollouts
    "hack_steps": 30,
    "hack_learning_rate": 5e-5,   # 5x the real run: the exploit shows within a few dozen steps
    "sampled_eval_prompts": 200,
    "sweep_prompts": 64,
    "sweep_generations": [2, 4, 8, 16],
    "sweep_temperatures": [0.7, 1.0, 1.3],
}


def _rl_lesson(lesson04: dict) -> dict:
    """Lesson 04's RL settings without its lesson-04-only knobs (the hack run and the sweeps): lesson 05's base."""
    only04 = ("shortcut_share", "decode_rollout", "hack_steps", "hack_learning_rate", "sampled_eval_prompts", "sweep_prompts",
              "sweep_generations", "sweep_temperatures")
    return {k: v for k, v in lesson04.items() if k not in only04}


# Lesson 04 on tiny (lesson 05 on tiny starts from it)
_TINY_04 = {
    "model": str(TINY_MODEL_DIR),
    "dataset": "synthetic",
    "difficulty": "mixed",
    "sft_steps": 120,           # lesson 01's tiny recipe, twice as long: 40 % of its answers show the working
    "shortcut_share": 0.6,      # SFT answers that skip the working ("The answer is N.")
    "n_train": 4000,            # RL prompt pool
    "n_test": 500,
    "num_generations": 8,
    "prompts_per_step": 16,
    "batch_size": 128,          # completions per step: one generation batch, one optimizer step
    "grad_accum": 1,
    "temperature": 1.0,
    "max_completion_length": 80,
    "learning_rate": 1e-3,      # LoRA adapters on a 1.7 M model; 1e-2 makes it never stop
    "max_steps": 20,
    "warmup_ratio": 0.0,
    "beta": 0.04,
    "loss_type": "dapo",        # TRL's default
    "use_lora": True,           # the reference for beta > 0 is the model with its adapter disabled
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.0,
    "lora_target_modules": list(QWEN_ATTENTION),  # on a 1.7 M model the MLP adapters' elementwise work
                                # cost more than they give: 3.3 s per GRPO step instead of 4.3, no less learned
    "eval_batch_size": 250,
    "gradient_checkpointing": False,
    "save_steps": 0,
    "logging_steps": 1,
    "use_vllm": False,
    "decode_rollout": True,     # rollouts sampled by utils.rl.decode_rollout (TRL's rollout_func): ~2x faster on a CPU
    "hack_steps": 10,
    "hack_learning_rate": 4.5e-3,  # 4.5x the real run: the exploit shows within seconds
    "sampled_eval_prompts": 100,
    "sweep_prompts": 32,
    "sweep_generations": [2, 4, 8, 16],
    "sweep_temperatures": [0.7, 1.0, 1.3],
}

# Lesson 05 on the GPU presets: lesson 04's sizes, two optimizer steps per generation batch.
_GPU_05 = {
    **_rl_lesson(_GPU_04),
    "batch_size": 16,             # completions per forward/backward
    "grad_accum": 4,              # 64 completions per optimizer step
    "steps_per_generation": 8,    # 16 x 8 = 128 completions sampled at once = 2 optimizer steps (the 2nd off-policy)
    "max_steps": 200,             # optimizer steps: 100 generation batches
    "beta": 0.0,                  # TRL's default, and DAPO's and Dr. GRPO's choice: no reference model
    "epsilon": 0.2,
    "epsilon_high": 0.28,         # DAPO's clip-higher (used by the DAPO run only)
    "soft_punish_cache": 64,      # DAPO's L_cache: the overlong penalty ramps over the last 64 of 256 tokens
    "seeds": [0],                 # more seeds: SEEDS=[0, 1, 2] (each seed trains the four methods again)
    "ttc_problems": 200,
    "ttc_samples": 32,
}
_GPU_06 = {
    "dataset": GSM8K,
    "difficulty": "mixed",
    "sft_steps": 300,             # lesson 01's recipe for the model that is quantized and evaluated
    "n_test": 500,
    "max_new_tokens": 256,
    "eval_batch_size": 32,
    "ppl_problems": 200,
    "blocksize": 64,              # bitsandbytes' NF4 block size
    "outlier_prompts": 16,
    "outlier_threshold": 6.0,     # LLM.int8()'s threshold
    "qlora_steps": 100,
    "lora_r": 16,
    "lora_alpha": 32,
}
_GPU_03 = {
    "dataset": GSM8K,
    "difficulty": "mixed",
    "sft_steps": 300,
    "verbose_share": 0.5,         # SFT answers opening with a filler sentence: the preference the reward cannot see
    "shortcut_share": 0.6,        # SFT answers that skip the working ("The answer is N."), as in lesson 04
    "n_prompts": 2000,
    "n_heldout": 200,
    "n_test": 1319,
    "n_samples": 4,
    "temperature": 0.8,
    "max_new_tokens": 256,
    "max_length": 768,
    "batch_size": 4,
    "grad_accum": 4,
    "learning_rate": 5e-5,        # LoRA adapters; a full fine-tune would use ~5e-7
    "max_steps": 200,
    "warmup_ratio": 0.05,
    "beta": 0.1,
    "betas": [0.01, 0.1, 0.5],
    "use_lora": True,             # the reference is the model with its adapter disabled
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "lora_target_modules": QWEN_LORA_TARGETS,
    "eval_batch_size": 64,
    "gradient_checkpointing": True,
    "save_steps": 50,
    "logging_steps": 10,
}

TWIN_NOTE = ("peak GPU memory per lesson measured with architecture twins on an H100 (utils/twins.py; "
             "measurement(preset, lesson) reads utils/assets/twin-measurements.json); time on this GPU unmeasured")

PRESETS: dict[str, dict] = {
    "tiny": {
        "description": "CPU, embedded tiny Qwen3 model, synthetic arithmetic problems; no network",
        "needs_gpu": False,
        "min_gpu_gb": 0.0,
        "bf16": None,
        "dtype": "fp32",          # fp32 everywhere, even when a GPU is present
        "measured": "on 2 CPU cores, start-up included: lesson 01 1 min 35 s, lesson 02 1 min 32 s, lesson 03 1 min 41 s, lesson 04 2 min 34 s to 2 min 43 s (six runs in one hour), lesson 05 2 min 31 s, lesson 06 56 s; on a slow day (2026-11-23, a training step 35-70 % slower, before the shared-prefill sampler) 01 2 min 55 s, 02 2 min 15 s, 03 2 min 42 s, 04 5 min 38 s, 05 4 min 48 s, 06 1 min 49 s",
        "lessons": {
            "01": {
                "model": str(TINY_MODEL_DIR),
                "dataset": "synthetic",
                "n_train": 2000,
                "n_test": 200,
                "difficulty": "mixed",
                "max_length": 160,
                "max_new_tokens": 96,
                "batch_size": 32,
                "grad_accum": 1,
                "learning_rate": 3e-3,
                "full_finetune": True,      # 1.7 M parameters: train every weight
                "lora_learning_rate": 1e-2,  # adapters start at zero: larger steps
                "max_steps": 60,
                "warmup_ratio": 0.05,
                "lora_r": 16,
                "lora_alpha": 32,
                "lora_dropout": 0.0,
                "lora_target_modules": list(QWEN_LORA_TARGETS),
                "eval_batch_size": 100,
                "gradient_checkpointing": False,
                "save_steps": 0,          # 0 = no checkpoints
                "logging_steps": 10,
            },
            "02": {
                "model": str(TINY_MODEL_DIR),
                "dataset": "synthetic",
                "n_train": 2000,
                "n_test": 200,
                "difficulty": "mixed",
                "max_length": 160,
                "max_new_tokens": 96,
                "batch_size": 32,           # padded: examples per step
                "packed_batch_size": 18,    # packed: rows of max_length per step (about as many tokens)
                "grad_accum": 1,
                "learning_rate": 3e-3,
                "lora_learning_rate": 1e-2,
                "max_steps": 60,
                "throughput_steps": 12,     # steps per collation in the padding-vs-packing measurement
                "warmup_ratio": 0.05,
                "full_finetune": True,
                "lora_r": 16,
                "lora_alpha": 32,
                "lora_dropout": 0.0,
                "lora_target_modules": list(QWEN_LORA_TARGETS),
                "eval_batch_size": 100,
                "gradient_checkpointing": False,
                "save_steps": 0,
                "logging_steps": 5,
                "eval_steps": 20,
            },
            "03": {
                "model": str(TINY_MODEL_DIR),
                "dataset": "synthetic",
                "difficulty": "mixed",
                "sft_steps": 120,           # lesson 01's recipe (its tiny preset), twice as long, as in lesson 04
                "verbose_share": 0.5,       # SFT answers opening with a filler sentence
                "shortcut_share": 0.6,      # SFT answers that skip the working ("The answer is N.")
                "n_prompts": 192,           # training prompts sampled on-policy
                "n_heldout": 200,           # held-out prompts for preference accuracy and KL
                "n_test": 200,
                "n_samples": 8,             # per prompt: more chances of a sound worked answer and of a guess
                "temperature": 1.0,
                "max_new_tokens": 96,
                "max_length": 256,
                "batch_size": 8,            # preference pairs per step
                "grad_accum": 1,
                "learning_rate": 1e-4,      # 20 steps over 50-80 pairs: two to three epochs
                "max_steps": 20,
                "warmup_ratio": 0.05,
                "beta": 0.5,                # the sweep's largest: the least KL to the reference (see the sweep)
                "betas": [0.01, 0.1, 0.5],
                "use_lora": False,
                "lora_r": 16,
                "lora_alpha": 32,
                "lora_dropout": 0.0,
                "lora_target_modules": list(QWEN_LORA_TARGETS),
                "eval_batch_size": 320,     # sequences per generate call: 40 prompts x 8 samples
                "gradient_checkpointing": False,
                "save_steps": 0,
                "logging_steps": 5,
            },
            "04": _TINY_04,
            "05": {**_rl_lesson(_TINY_04),
                   "lora_target_modules": list(QWEN_LORA_TARGETS),  # lesson 05 was tuned with all seven
                   "sft_steps": 60,            # lesson 01's tiny recipe, unchanged (lesson 04 doubles it)
                   "batch_size": 64,           # completions per optimizer step
                   "steps_per_generation": 2,  # 16 x 8 = 128 completions sampled at once = 2 optimizer steps
                   "max_steps": 12,            # optimizer steps: 6 generation batches per method
                   "beta": 0.0,                # TRL's default: no reference model
                   "epsilon": 0.2,
                   "epsilon_high": 0.28,       # DAPO's clip-higher
                   "soft_punish_cache": 16,    # the overlong penalty ramps over the last 16 of 80 tokens
                   "seeds": [0],               # one seed fits the 4-minute budget; the spread is estimated below
                   "ttc_problems": 100,
                   "ttc_samples": 32},
            "06": {
                "model": str(TINY_MODEL_DIR),
                "dataset": "synthetic",
                "difficulty": "mixed",
                "sft_steps": 60,            # lesson 01's tiny recipe
                "n_test": 500,
                "max_new_tokens": 96,
                "eval_batch_size": 250,
                "ppl_problems": 200,
                "blocksize": 64,
                "outlier_prompts": 64,
                "outlier_threshold": 6.0,
                "qlora_steps": 30,
                "lora_r": 16,
                "lora_alpha": 32,
            },
        },
    },
    "t4-16g": {
        "description": "Colab T4 16 GB (no bf16): Qwen2.5-0.5B-Instruct, fp16, LoRA, GSM8K",
        "needs_gpu": True,
        "min_gpu_gb": 14.0,       # torch reports a T4 as ~14.7 GiB
        "bf16": False,            # fp16 mixed precision
        "measured": TWIN_NOTE,
        "lessons": {
            "01": {
                "model": "Qwen/Qwen2.5-0.5B-Instruct",
                "dataset": GSM8K,
                "n_train": 7473,
                "n_test": 500,            # generation on a T4 is slow; 500 keeps evaluation to minutes
                "difficulty": "mixed",    # unused for GSM8K
                "max_length": 512,        # GSM8K prompt + worked answer fits in ~350 tokens
                "max_new_tokens": 256,
                "batch_size": 8,
                "grad_accum": 4,          # effective batch 32
                "learning_rate": 2e-4,
                "full_finetune": False,     # fp32 AdamW needs ~16 B/parameter: LoRA instead
                "lora_learning_rate": 2e-4,
                "max_steps": 500,         # ~2 epochs of GSM8K train
                "warmup_ratio": 0.03,
                "lora_r": 16,
                "lora_alpha": 32,
                "lora_dropout": 0.05,
                "lora_target_modules": list(QWEN_LORA_TARGETS),
                "eval_batch_size": 32,
                "gradient_checkpointing": True,
                "save_steps": 100,        # Colab sessions drop: checkpoint often, resume with resume=True
                "logging_steps": 10,
            },
            "02": {**_GPU_02, "model": "Qwen/Qwen2.5-0.5B-Instruct", "n_test": 500, "batch_size": 8,
                   "packed_batch_size": 3, "grad_accum": 4, "lora_r": 16, "lora_alpha": 32, "eval_batch_size": 32},
            "03": {**_GPU_03, "model": "Qwen/Qwen2.5-0.5B-Instruct", "n_test": 500, "eval_batch_size": 32},
            "04": {**_GPU_04, "model": "Qwen/Qwen2.5-0.5B-Instruct", "n_test": 500, "eval_batch_size": 32,
                   "prompts_per_step": 8, "batch_size": 8, "grad_accum": 8},
            "05": {**_GPU_05, "model": "Qwen/Qwen2.5-0.5B-Instruct", "n_test": 500, "eval_batch_size": 32,
                   "prompts_per_step": 8, "batch_size": 8, "grad_accum": 4, "steps_per_generation": 8},
            "06": {**_GPU_06, "model": "Qwen/Qwen2.5-0.5B-Instruct"},
        },
    },
    "24g": {
        "description": "RTX 4090 / 3090 24 GB: Qwen3-1.7B-Base, bf16, LoRA, GSM8K",
        "needs_gpu": True,
        "min_gpu_gb": 20.0,
        "bf16": True,
        "measured": TWIN_NOTE,
        "lessons": {
            "01": {
                "model": "Qwen/Qwen3-1.7B-Base",
                "dataset": GSM8K,
                "n_train": 7473,
                "n_test": 1319,           # the full GSM8K test split
                "difficulty": "mixed",
                "max_length": 512,
                "max_new_tokens": 256,
                "batch_size": 16,
                "grad_accum": 2,          # effective batch 32
                "learning_rate": 2e-4,
                "full_finetune": False,     # fp32 AdamW needs ~16 B/parameter: LoRA instead
                "lora_learning_rate": 2e-4,
                "max_steps": 500,
                "warmup_ratio": 0.03,
                "lora_r": 32,
                "lora_alpha": 64,
                "lora_dropout": 0.05,
                "lora_target_modules": list(QWEN_LORA_TARGETS),
                "eval_batch_size": 64,
                "gradient_checkpointing": True,
                "save_steps": 100,
                "logging_steps": 10,
            },
            "02": {**_GPU_02, "model": "Qwen/Qwen3-1.7B-Base"},
            "03": {**_GPU_03, "model": "Qwen/Qwen3-1.7B-Base"},
            "04": {**_GPU_04, "model": "Qwen/Qwen3-1.7B-Base"},
            "05": {**_GPU_05, "model": "Qwen/Qwen3-1.7B-Base"},
            "06": {**_GPU_06, "model": "Qwen/Qwen3-1.7B-Base"},
        },
    },
    # 80g: Qwen3-4B-Base with LoRA rather than a full fine-tune of Qwen3-1.7B-Base. LoRA keeps
    # the one code path every other preset uses (same notebook, only sizes change), and the
    # larger base model shows what scale buys on GSM8K; a full fine-tune would need its own
    # code path and optimizer-state memory while teaching nothing new in lesson 01.
    "80g": {
        "description": "A100 / H100 80 GB: Qwen3-4B-Base, bf16, LoRA, GSM8K",
        "needs_gpu": True,
        "min_gpu_gb": 70.0,
        "bf16": True,
        "measured": TWIN_NOTE,
        "lessons": {
            "01": {
                "model": "Qwen/Qwen3-4B-Base",
                "dataset": GSM8K,
                "n_train": 7473,
                "n_test": 1319,
                "difficulty": "mixed",
                "max_length": 512,
                "max_new_tokens": 256,
                "batch_size": 8,          # 16 ran out of memory on an 80 GB H100 (twin, no checkpointing):
                "grad_accum": 4,          # 16 x 512 tokens of fp32 logits alone take 4.6 GiB; effective batch 32
                "learning_rate": 1e-4,
                "full_finetune": False,     # fp32 AdamW needs ~16 B/parameter: LoRA instead
                "lora_learning_rate": 1e-4,
                "max_steps": 500,
                "warmup_ratio": 0.03,
                "lora_r": 32,
                "lora_alpha": 64,
                "lora_dropout": 0.05,
                "lora_target_modules": list(QWEN_LORA_TARGETS),
                "eval_batch_size": 64,
                "gradient_checkpointing": False,  # memory to spare: trade it for speed
                "save_steps": 250,
                "logging_steps": 10,
            },
            "02": {**_GPU_02, "model": "Qwen/Qwen3-4B-Base", "learning_rate": 1e-4, "lora_learning_rate": 1e-4,
                   "gradient_checkpointing": False},
            "03": {**_GPU_03, "model": "Qwen/Qwen3-4B-Base", "gradient_checkpointing": False},
            "04": {**_GPU_04, "model": "Qwen/Qwen3-4B-Base", "batch_size": 32, "grad_accum": 4},
            "05": {**_GPU_05, "model": "Qwen/Qwen3-4B-Base", "batch_size": 32, "grad_accum": 2,
                   "steps_per_generation": 4, "seeds": [0, 1, 2]},
            "06": {**_GPU_06, "model": "Qwen/Qwen3-4B-Base"},
        },
    },
}

# Keys shown by LessonConfig.table() after preset/model/device/dtype, when the lesson has them.
TABLE_KEYS = ("dataset", "n_train", "n_test", "max_length", "batch_size", "max_steps", "lora_r")


# ----------------------------------------------------------------------------- resolved config
@dataclass
class LessonConfig:
    """A resolved preset for one lesson: attribute access to every lesson key (``cfg.max_steps``).

    Fields: ``preset``, ``lesson``, ``device`` ("cuda"/"cpu"), ``dtype`` (torch dtype),
    ``model_label`` (for display, never a machine path), ``seed`` and ``params`` (the lesson keys).
    """

    preset: str
    lesson: str
    device: str
    dtype: torch.dtype
    model_label: str
    params: dict = field(default_factory=dict)
    seed: int = 0

    def __getattr__(self, name):
        params = self.__dict__.get("params")
        if params is not None and name in params:
            return params[name]
        raise AttributeError(f"LessonConfig has no {name!r}; lesson {self.__dict__.get('lesson')} keys: "
                             f"{sorted(params or {})}")

    def __getitem__(self, key):
        return self.params[key]

    def to_dict(self) -> dict:
        """Plain JSON-friendly values; dtype as "bf16"/"fp16"/"fp32", repo paths made relative."""
        params = {k: list(v) if isinstance(v, tuple) else v for k, v in self.params.items()}
        if "model" in params:
            params["model"] = _portable_path(params["model"])
        return {"preset": self.preset, "lesson": self.lesson, "device": self.device,
                "dtype": runtime.dtype_name(self.dtype), "model_label": self.model_label,
                "seed": self.seed, **params}

    def table(self) -> str:
        """A short aligned two-column table: preset, model, device, dtype and the key sizes."""
        rows = [("preset", self.preset), ("model", self.model_label), ("device", self.device),
                ("dtype", runtime.dtype_name(self.dtype))]
        rows += [(k, self.params[k]) for k in TABLE_KEYS if k in self.params]
        if PRESETS.get(self.preset, {}).get("needs_gpu"):
            rows.append(("measured", measured_note(self.preset, self.lesson)))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def show(self) -> None:
        """Print :meth:`table`."""
        print(self.table())


def _portable_path(value: str) -> str:
    """A path inside the repo as a relative POSIX path; anything else unchanged."""
    try:
        return Path(value).resolve().relative_to(REPO_ROOT).as_posix()
    except (ValueError, OSError):
        return value


def _model_label(model: str) -> str:
    """Display name of a model: hub ids as they are, the embedded model and local dirs by name."""
    path = Path(model)
    if path.is_absolute() or path.is_dir():
        if path.resolve() == TINY_MODEL_DIR:
            return TINY_MODEL_LABEL
        return f"{path.name} (local)"
    return model


# ----------------------------------------------------------------------------- twin measurements
# Keys that change what the data says, not how large anything is: a twin measurement does not depend on them.
CONTENT_KEYS = ("model", "dataset", "difficulty", "verbose_share", "shortcut_share")


# Keys added after the twins were measured, with the value that runs exactly what was measured: a preset
# holding that value keeps its measurement (any other value changes the run, so the digest changes).
MEASURED_DEFAULTS = {"decode_rollout": False}


def params_digest(params: dict) -> str:
    """A short hash of a lesson's preset parameters (the model, checked separately, the
    :data:`CONTENT_KEYS` and keys at their :data:`MEASURED_DEFAULTS` value excluded): when it differs
    from the digest stored with a measurement, the preset changed after it was measured."""
    body = {k: v for k, v in params.items()
            if k not in CONTENT_KEYS and not (k in MEASURED_DEFAULTS and v == MEASURED_DEFAULTS[k])}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:12]


@lru_cache(maxsize=1)
def _twin_records() -> dict:
    if not TWIN_MEASUREMENTS.exists():
        return {}
    return json.loads(TWIN_MEASUREMENTS.read_text()).get("presets", {})


def measurement(preset: str, lesson) -> dict | None:
    """The architecture-twin record of ``lesson`` on GPU ``preset`` (``utils/assets/twin-measurements.json``:
    ``peak_gb`` = peak ``torch.cuda.max_memory_reserved`` in GiB, ``phases`` with seconds per step or
    batch), or None when that lesson was not measured or its preset has changed since."""
    lesson = _lesson_id(lesson)
    record = _twin_records().get(preset, {}).get(lesson)
    if not record or not record.get("phases") or preset not in PRESETS:
        return None
    params = PRESETS[preset]["lessons"][lesson]
    if record.get("params_digest") != params_digest(params) or record.get("model") != params.get("model"):
        return None
    return record


def measured_note(preset: str, lesson) -> str:
    """One line for the resolution table: the measured peak (reserved; the tensors' own peak where it was
    recorded; the cap, where the run played a smaller card) and main training step, or "unmeasured"."""
    record = measurement(preset, lesson)
    if record is None:
        return "unmeasured"
    note = f"peak {record['peak_gb']:.1f} GB"
    tensors = [p.get("allocated_gb") for p in record["phases"].values()]
    if all(tensors):
        note += f" (tensors {max(tensors):.1f} GB)"
    if record.get("memory_cap_gb"):
        note += f" with PyTorch capped at {record['memory_cap_gb']:g} GB"
    main = next((name for name in record.get("training_minutes", {}) if name in record["phases"]), None)
    if main:
        phase = record["phases"][main]
        note += f", {phase['seconds']:g} s per {phase['unit']} ({main})"
    return note + " on an H100 (architecture twin)"


def _memory_warning(name: str, lesson: str, info: dict | None) -> None:
    """Print a warning when this GPU (``runtime.gpu_info()``; None: no GPU, nothing to compare) has
    less memory than the lesson's measured peak on this preset."""
    record = measurement(name, lesson)
    if record and info and record["peak_gb"] > info["total_gb"]:
        worst = max(record["phases"], key=lambda k: record["phases"][k]["peak_gb"] or 0)
        print(f"[presets] warning: lesson {lesson} on {name!r} peaked at {record['peak_gb']:.1f} GB of GPU memory "
              f"({worst!r}) in an architecture-twin run, and {info['name']} has {info['total_gb']:g} GB. The figure "
              "is an upper bound (PyTorch's allocator cache, answers of the full max_completion_length); if it runs "
              "out of memory, lower prompts_per_step / batch_size / eval_batch_size (see the README's GPU table).")


# ----------------------------------------------------------------------------- hub / cache checks
def _is_local(value) -> bool:
    return isinstance(value, (str, os.PathLike)) and Path(value).exists()


def _hf_home() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(os.environ.get("HF_HOME", default)).expanduser()


def _in_local_cache(repo_id: str, repo_type: str) -> bool:
    """Whether a Hub repo was downloaded before (a snapshot in the hub cache, or a datasets cache dir)."""
    hub_cache = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
                     or _hf_home() / "hub").expanduser()
    snapshots = hub_cache / f"{repo_type}s--{repo_id.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return True
    if repo_type == "dataset":
        ds_cache = Path(os.environ.get("HF_DATASETS_CACHE") or _hf_home() / "datasets").expanduser()
        return (ds_cache / repo_id.replace("/", "___")).is_dir()
    return False


def _hub_downloads(params: dict) -> list[str]:
    """Hub repos this lesson would still have to download (not local paths, not cached)."""
    needed = []
    model = params.get("model")
    if model and not _is_local(model) and not _in_local_cache(str(model), "model"):
        needed.append(f"model {model}")
    dataset = params.get("dataset")
    if dataset and dataset != "synthetic" and not _is_local(dataset) and not _in_local_cache(str(dataset), "dataset"):
        needed.append(f"dataset {dataset}")
    return needed


def _hub_error(name: str, needed: list[str]) -> RuntimeError:
    offline = " (HF_HUB_OFFLINE is set)" if runtime.hub_offline() else ""
    return RuntimeError(
        f"Preset {name!r} needs the {' and the '.join(needed)} from the Hugging Face Hub, but "
        f"{runtime.hub_endpoint()} is unreachable{offline}. Options: set "
        f"HF_ENDPOINT={runtime.DEFAULT_MIRROR} before importing transformers (AutoDL / China), or call "
        "utils.runtime.use_hf_mirror(force=True) in the setup cell; download them beforehand "
        "(they are then found in the cache, or pass model=<local dir>); or use PRESET='tiny'.")


# ----------------------------------------------------------------------------- GPU checks
def _gpu_presets() -> list[str]:
    """GPU presets, largest memory first."""
    return sorted((n for n, p in PRESETS.items() if p["needs_gpu"]), key=lambda n: -PRESETS[n]["min_gpu_gb"])


def _fitting_preset(info: dict, lesson: str | None = None) -> str:
    """The largest GPU preset this GPU can run (memory and bf16), else ``"tiny"``."""
    for name in _gpu_presets():
        spec = PRESETS[name]
        if lesson is not None and lesson not in spec["lessons"]:
            continue
        if info["total_gb"] >= spec["min_gpu_gb"] and (not spec["bf16"] or info["bf16"]):
            return name
    return "tiny"


def _check_gpu(name: str, spec: dict) -> None:
    """Raise RuntimeError if this machine cannot run the GPU preset ``name``."""
    info = runtime.gpu_info()
    if info is None:
        raise RuntimeError(f"Preset {name!r} needs a CUDA GPU, but torch found none (this run is on the CPU). "
                           "Use PRESET='tiny' (CPU, embedded model) or PRESET='auto'.")
    if info["total_gb"] < spec["min_gpu_gb"]:
        raise RuntimeError(f"Preset {name!r} needs at least {spec['min_gpu_gb']:g} GB of GPU memory, but "
                           f"{info['name']} has {info['total_gb']:g} GB. Use PRESET="
                           f"{_fitting_preset(info)!r} (or 'auto').")
    if spec["bf16"]:
        try:
            runtime.check_dtype(torch.bfloat16, "cuda")
        except ValueError as err:
            raise RuntimeError(f"Preset {name!r} trains in bf16: {err}") from None


def _preset_dtype(spec: dict, dev: str) -> torch.dtype:
    """The preset's explicit dtype, else bf16/fp16 as its ``bf16`` flag says, else the runtime policy."""
    if spec.get("dtype"):
        return runtime.as_dtype(spec["dtype"])
    if spec["bf16"] is True:
        return torch.bfloat16
    if spec["bf16"] is False and dev == "cuda":
        return torch.float16
    return runtime.dtype_policy(dev)


# ----------------------------------------------------------------------------- resolve
def _lesson_id(lesson) -> str:
    """``1`` or ``"1"`` or ``"01"`` -> ``"01"``."""
    text = str(lesson).strip()
    return f"{int(text):02d}" if text.isdigit() else text


def _auto(lesson: str, overrides: dict) -> str:
    """Pick a preset from the hardware and the Hub's reachability, printing why when it falls back."""
    info = runtime.gpu_info()
    if info is None:
        return "tiny"
    name = _fitting_preset(info, lesson)
    if name == "tiny":
        print(f"[presets] auto: {info['name']} ({info['total_gb']:g} GB) is too small for the GPU presets "
              "of this lesson; using 'tiny'.")
        return name
    needed = _hub_downloads({**PRESETS[name]["lessons"][lesson], **overrides})
    if needed and not runtime.hub_reachable():
        print(f"[presets] auto: the Hugging Face Hub ({runtime.hub_endpoint()}) is unreachable, so preset "
              f"{name!r} cannot download its model/data; using 'tiny' (set HF_ENDPOINT={runtime.DEFAULT_MIRROR} "
              "for the mirror).")
        return "tiny"
    return name


def resolve(preset: str = "auto", lesson: str = "01", **overrides) -> LessonConfig:
    """Resolve a preset for a lesson, check this machine can run it, and apply overrides.

    Args:
        preset: ``"auto"`` (choose by GPU memory, bf16 support and Hub reachability) or a
            name in :data:`PRESETS`.
        lesson: ``"01"`` .. ``"06"`` (an int works too).
        **overrides: lesson keys (e.g. ``max_steps=20``) or ``seed``; ``None`` values are
            ignored (notebook parameters default to None = "the preset decides").
            ``model=<local dir>`` loads a model without the Hub.
    Raises:
        ValueError: unknown preset, lesson or override key.
        RuntimeError: the preset needs hardware (or the Hub) this machine does not have.
    """
    name = str(preset).strip().lower()
    if name != "auto" and name not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; choose one of {['auto', *PRESETS]}.")
    lesson = _lesson_id(lesson)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    seed = int(overrides.pop("seed", 0))

    if name == "auto":
        if not any(lesson in p["lessons"] for p in PRESETS.values()):
            raise ValueError(f"No preset defines lesson {lesson!r}; defined: "
                             f"{sorted({les for p in PRESETS.values() for les in p['lessons']})}.")
        name = _auto(lesson, overrides)
    spec = PRESETS[name]
    if lesson not in spec["lessons"]:
        raise ValueError(f"Preset {name!r} does not define lesson {lesson!r}; it defines {sorted(spec['lessons'])}.")
    params = {k: list(v) if isinstance(v, list) else v for k, v in spec["lessons"][lesson].items()}
    unknown = sorted(set(overrides) - set(params))
    if unknown:
        raise ValueError(f"Unknown override(s) {unknown} for lesson {lesson}; valid keys: "
                         f"{sorted(params) + list(COMMON_KEYS)}.")
    params.update(overrides)

    dev = runtime.device()
    if spec["needs_gpu"]:
        _check_gpu(name, spec)
        _memory_warning(name, lesson, runtime.gpu_info())
        needed = _hub_downloads(params)
        if needed and not runtime.hub_reachable():
            raise _hub_error(name, needed)
    return LessonConfig(preset=name, lesson=lesson, device=dev, dtype=_preset_dtype(spec, dev),
                        model_label=_model_label(str(params.get("model", ""))), params=params, seed=seed)
