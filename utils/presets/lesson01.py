"""Lesson 01, SFT from scratch: every knob on every tier (data only; ``presets.resolve`` reads it)."""
from .tiers import ALL_LINEAR as ALL
from .tiers import DATASETS, MODELS

KNOBS = {  #                  tiny    t4-16g  24g     80g
    "model":                  MODELS,
    "dataset":                DATASETS,
    "n_train":                (2000,  7473,   7473,   7473),    # training problems (GSM8K train: 7,473)
    "n_test":                 (200,   200,    200,    200),    # held-out problems (GPU tiers: cut to fit a session)
    "difficulty":             ("mixed", "mixed", "mixed", "mixed"),  # synthetic problems: 1-3 steps (unused for GSM8K)
    "max_length":             (160,   512,    512,    512),     # tokens per example; a GSM8K prompt + answer < 350
    "max_new_tokens":         (96,    256,    256,    256),     # generation limit in evaluation
    "batch_size":             (32,    8,      16,     8),       # examples per forward/backward
    "grad_accum":             (1,     4,      2,      4),       # effective batch 32 on the GPU tiers
    "learning_rate":          (3e-3,  2e-4,   2e-4,   1e-4),    # full fine-tune (tiny) / LoRA (GPU tiers)
    "full_finetune":          (True,  False,  False,  False),   # fp32 AdamW needs ~16 B/parameter: LoRA on GPUs
    "lora_learning_rate":     (1e-2,  2e-4,   2e-4,   1e-4),    # adapters: larger steps (an empirical rule)
    "max_steps":              (40,    150,    150,    150),    # tiny: 1,280 examples; GPU: 4,800, 0.64 of an epoch
    "warmup_ratio":           (0.05,  0.03,   0.03,   0.03),
    "lora_r":                 (16,    16,     32,     32),
    "lora_alpha":             (32,    32,     64,     64),
    "lora_dropout":           (0.0,   0.05,   0.05,   0.05),
    "lora_target_modules":    (ALL,   ALL,    ALL,    ALL),     # every linear layer
    "eval_batch_size":        (100,   32,     64,     64),      # sequences per generate call
    "gradient_checkpointing": (False, True,   True,   False),   # 80g: memory to spare, trade it for speed
    "save_steps":             (0,     50,     50,     50),     # checkpoints for --resume (Colab sessions drop)
    "logging_steps":          (5,     10,     10,     10),
}
# 80g runs batch 8 x grad_accum 4: batch 16 did not fit an 80 GB H100 without activation checkpointing
# (the architecture-twin measurement; docs/gpu.md).
