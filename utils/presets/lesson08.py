"""Lesson 08, test-time compute: every knob on every tier (data only; ``presets.resolve`` reads it)."""
from .tiers import ALL_LINEAR as ALL
from .tiers import DATASETS, MODELS

KNOBS = {  #                  tiny    t4-16g  24g     80g
    "model":                  MODELS,
    "dataset":                DATASETS,
    "difficulty":             ("mixed", "mixed", "mixed", "mixed"),
    "sft_steps":              (60,    150,    150,    150),    # lesson 01's recipe, as lesson 06 trains it
    "n_test":                 (500,   200,    200,    200),    # greedy accuracy and the thinking budget
    "max_new_tokens":         (80,    256,    256,    256),
    "temperature":            (1.0,   1.0,    1.0,    1.0),
    "ttc_problems":           (100,   50,     50,     50),     # test-time compute: held-out problems ...
    "ttc_samples":            (16,    16,     16,     16),      # ... and samples of each (M)
    "prm_problems":           (64,    300,    300,    300),    # training problems whose samples label the PRM
    "prm_samples":            (8,     4,      4,      4),       # samples of each
    "batch_size":             (16,    8,      8,      16),      # labelled answers per forward/backward
    "grad_accum":             (1,     2,      2,      1),
    "learning_rate":          (1e-3,  1e-4,   1e-4,   1e-4),    # full fine-tune (tiny) / LoRA (GPU tiers)
    "max_steps":              (32,    75,     75,     75),    # one epoch of prm_problems x prm_samples answers
    "warmup_ratio":           (0.0,   0.05,   0.05,   0.05),
    "use_lora":               (False, True,   True,   True),    # LoRA: task_type TOKEN_CLS, the head trained fully
    "lora_r":                 (16,    16,     16,     16),
    "lora_alpha":             (32,    32,     32,     32),
    "lora_dropout":           (0.0,   0.05,   0.05,   0.05),
    "lora_target_modules":    (ALL,   ALL,    ALL,    ALL),
    "eval_batch_size":        (256,   32,     64,     64),
    "score_batch_size":       (64,    32,     64,     64),      # answers per forward pass of a PRM / ORM
    "gradient_checkpointing": (False, True,   True,   True),      # 80g: 97.8 GB without it (twin, H200)
    "save_steps":             (0,     0,      0,      0),       # the verifiers train in minutes: no checkpoints
    "logging_steps":          (4,     10,     10,     10),
    "beam_width":             (2,     4,      4,      4),       # beam search: partial answers kept at each step ...
    "beam_expand":            (4,     4,      4,      4),       # ... and lines sampled from each (N: their product)
    "beam_max_steps":         (6,     8,      8,      8),      # lines an answer may have before its search stops
    "step_tokens":            (40,    128,    128,    128),     # max_new_tokens of one step (one line)
    "refine_rounds":          (3,     3,      3,      3),       # self-refinement: rounds of feedback and revision
    "budgets":                ((8, 16, 24, 32, 48, 64, 80), (32, 64, 96, 128, 192, 256), (32, 64, 96, 128, 192, 256),
                               (32, 64, 96, 128, 192, 256)),  # thinking budgets: max_new_tokens of the greedy answer
}
