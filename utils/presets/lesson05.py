"""Lesson 05, beyond GRPO: every knob on every tier (data only; ``presets.resolve`` reads it)."""
from .tiers import ALL_LINEAR as ALL
from .tiers import DATASETS, MODELS

KNOBS = {  #                  tiny    t4-16g  24g     80g
    "model":                  MODELS,
    "dataset":                DATASETS,
    "difficulty":             ("mixed", "mixed", "mixed", "mixed"),
    "sft_steps":              (120,   150,    150,    150),    # lesson 04's start: lesson 01's recipe (tiny: 3x) ...
    "shortcut_share":         (0.6,   0.6,    0.6,    0.6),     # ... on answers that skip the working: RL's job
    "n_train":                (4000,  600,    400,    300),    # RL prompt pool (DAPO's filter: at most all of it)
    "n_test":                 (500,   150,    150,    150),
    "num_generations":        (8,     8,      8,      8),
    "prompts_per_step":       (16,    8,      16,     16),      # generation batch = prompts_per_step x G
    "batch_size":             (64,    8,      16,     32),      # completions per forward/backward
    "grad_accum":             (1,     4,      4,      2),       # tiny: 64, GPU tiers: 32-64 completions per step
    "steps_per_generation":   (2,     8,      8,      4),       # micro-batches per generation batch: 2 optimizer steps
    "temperature":            (1.0,   1.0,    1.0,    1.0),
    "max_completion_length":  (80,    256,    256,    256),
    "learning_rate":          (1e-3,  1e-5,   1e-5,   1e-5),
    "max_steps":              (12,    26,     14,     14),     # optimizer steps (generation batches: tiny 6, 24g/80g 7)
    "warmup_ratio":           (0.0,   0.0,    0.0,    0.0),
    "beta":                   (0.0,   0.0,    0.0,    0.0),     # TRL's default, DAPO's and Dr. GRPO's: no reference
    "loss_type":              ("dapo", "dapo", "dapo", "dapo"),  # each method sets its own in the lesson
    "epsilon":                (0.2,   0.2,    0.2,    0.2),
    "epsilon_high":           (0.28,  0.28,   0.28,   0.28),    # DAPO's clip-higher (the DAPO run only)
    "clip_probe_prompts":     (16,    4,      4,      4),       # "where the clip binds": groups with signal, ...
    "clip_probe_steps":       (8,     4,      4,      4),       # ... off-policy steps on them ...
    "clip_probe_learning_rate": (1e-3, 1e-4,  1e-4,   1e-4),    # ... at 10x the runs' rate on GPUs (so it binds) ...
    "clip_probe_micro_batch": (64,    4,      4,      4),       # ... in micro-batches (a full-vocabulary softmax)
    "soft_punish_cache":      (16,    64,     64,     64),      # DAPO's L_cache: the overlong ramp before the limit
    "use_lora":               (True,  True,   True,   True),
    "lora_r":                 (16,    16,     16,     16),
    "lora_alpha":             (32,    32,     32,     32),
    "lora_dropout":           (0.0,   0.0,    0.0,    0.0),
    "lora_target_modules":    (ALL,   ALL,    ALL,    ALL),
    "eval_batch_size":        (250,   32,     64,     64),
    "gradient_checkpointing": (False, True,   True,   True),
    "save_steps":             (0,     16,     7,      7),
    "logging_steps":          (1,     5,      5,      5),
    "use_vllm":               (False, False,  False,  False),
    "seeds":                  ([0],   [0],    [0],    [0]),    # SEED + each: every seed trains the four methods
}
