"""Lesson 03, DPO: every knob on every tier (data only; ``presets.resolve`` reads it)."""
from .tiers import ALL_LINEAR as ALL
from .tiers import DATASETS, MODELS

BETAS = [0.01, 0.1, 0.5]
LOSSES = ["ipo", "apo_zero", "sigmoid_norm", "kto"]   # trained beside DPO on the same pairs (kto: KTOTrainer, unpaired)
GPU_LOSSES = ["ipo", "kto"]                            # a target margin, and labels without pairs

KNOBS = {  #                  tiny    t4-16g  24g     80g
    "model":                  MODELS,
    "dataset":                DATASETS,
    "difficulty":             ("mixed", "mixed", "mixed", "mixed"),
    "sft_steps":              (120,   150,    150,    150),    # lesson 01's recipe (tiny: 3x its 40 steps)
    "verbose_share":          (0.5,   0.5,    0.5,    0.5),     # SFT answers opening with a filler sentence
    "shortcut_share":         (0.6,   0.6,    0.6,    0.6),     # SFT answers that skip the working (as in lesson 04)
    "n_prompts":              (192,   200,    300,    300),    # training prompts sampled on-policy
    "n_heldout":              (200,   100,    100,    100),    # held-out prompts: preference accuracy and KL
    "n_test":                 (200,   200,    200,    200),
    "n_samples":              (8,     4,      4,      4),       # answers per prompt to choose pairs from
    "temperature":            (1.0,   0.8,    0.8,    0.8),
    "max_new_tokens":         (96,    256,    256,    256),
    "max_length":             (256,   768,    768,    768),     # prompt + answer of a pair
    "batch_size":             (8,     4,      4,      4),       # preference pairs per forward/backward
    "grad_accum":             (1,     4,      4,      4),
    "learning_rate":          (1e-4,  5e-5,   5e-5,   5e-5),    # tiny: full model; GPU tiers: LoRA (full: ~5e-7)
    "max_steps":              (20,    40,     40,     40),
    "warmup_ratio":           (0.05,  0.05,   0.05,   0.05),
    "beta":                   (0.5,   0.1,    0.1,    0.1),     # tiny: the sweep's largest, the least KL
    "betas":                  (BETAS, BETAS,  BETAS,  BETAS),   # the beta sweep
    "preference_losses":      (LOSSES, [],    GPU_LOSSES, GPU_LOSSES),  # section 9, against DPO (cut to fit an hour)
    "use_lora":               (False, True,   True,   True),    # LoRA: the reference is the adapter disabled
    "lora_r":                 (16,    16,     16,     16),
    "lora_alpha":             (32,    32,     32,     32),
    "lora_dropout":           (0.0,   0.05,   0.05,   0.05),
    "lora_target_modules":    (ALL,   ALL,    ALL,    ALL),
    "eval_batch_size":        (320,   32,     64,     64),      # tiny: 40 prompts x 8 samples per generate call
    "gradient_checkpointing": (False, True,   True,   False),
    "save_steps":             (0,     50,     50,     50),
    "logging_steps":          (5,     10,     10,     10),
}
