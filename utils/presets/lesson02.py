"""Lesson 02, SFT with TRL: every knob on every tier (data only; ``presets.resolve`` reads it)."""
from .tiers import ALL_LINEAR as ALL
from .tiers import DATASETS, MODELS

KNOBS = {  #                  tiny    t4-16g  24g     80g
    "model":                  MODELS,
    "dataset":                DATASETS,
    "n_train":                (2000,  7473,   7473,   7473),
    "n_test":                 (200,   300,    300,    300),
    "difficulty":             ("mixed", "mixed", "mixed", "mixed"),
    "max_length":             (160,   512,    512,    512),     # tokens per example (and per packed row)
    "max_new_tokens":         (96,    256,    256,    256),
    "batch_size":             (32,    8,      16,     16),      # padded examples per forward/backward
    "packed_batch_size":      (18,    3,      6,      6),       # packed rows of max_length (GSM8K: ~200 tokens each)
    "grad_accum":             (1,     4,      2,      2),
    "learning_rate":          (3e-3,  2e-4,   2e-4,   1e-4),
    "lora_learning_rate":     (1e-2,  2e-4,   2e-4,   1e-4),
    "max_steps":              (40,    300,    300,    300),
    "throughput_steps":       (8,     20,     20,     20),      # steps per collation in padding vs packing
    "warmup_ratio":           (0.05,  0.03,   0.03,   0.03),
    "full_finetune":          (True,  False,  False,  False),
    "lora_r":                 (16,    16,     32,     32),
    "lora_alpha":             (32,    32,     64,     64),
    "lora_dropout":           (0.0,   0.05,   0.05,   0.05),
    "lora_target_modules":    (ALL,   ALL,    ALL,    ALL),
    "eval_batch_size":        (100,   32,     64,     64),
    "gradient_checkpointing": (False, True,   True,   False),
    "save_steps":             (0,     100,    100,    100),
    "logging_steps":          (5,     10,     10,     10),
    "eval_steps":             (20,    50,     50,     50),      # held-out loss every this many steps
}
