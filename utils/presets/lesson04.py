"""Lesson 04, GRPO: every knob on every tier (data only; ``presets.resolve`` reads it)."""
from .tiers import ALL_LINEAR as ALL
from .tiers import ATTENTION as ATT
from .tiers import DATASETS, MODELS

GENERATIONS, TEMPERATURES = [2, 4, 8, 16], [0.7, 1.0, 1.3]

KNOBS = {  #                  tiny    t4-16g  24g     80g
    "model":                  MODELS,
    "dataset":                DATASETS,
    "difficulty":             ("mixed", "mixed", "mixed", "mixed"),
    "sft_steps":              (120,   150,    150,    150),    # lesson 01's recipe (tiny: 3x its 40 steps)
    "shortcut_share":         (0.6,   0.6,    0.6,    0.6),     # SFT answers that skip the working: GRPO's choice
    "n_train":                (4000,  7473,   7473,   7473),    # RL prompt pool
    "n_test":                 (500,   200,    200,    200),
    "num_generations":        (8,     8,      8,      8),       # G, completions per prompt
    "prompts_per_step":       (12,    8,      16,     16),      # generation batch = prompts_per_step x G
    "batch_size":             (96,    8,      16,     32),      # completions per forward/backward
    "grad_accum":             (1,     8,      8,      4),       # batch_size x grad_accum = one generation batch
    "temperature":            (1.0,   1.0,    1.0,    1.0),
    "max_completion_length":  (80,    256,    256,    256),
    "learning_rate":          (1.25e-3, 1e-5, 1e-5,   1e-5),    # LoRA adapters (tiny: 1e-2 never settles)
    "max_steps":              (16,    50,     28,     26),     # optimizer steps (24g/80g: 16 prompts each)
    "warmup_ratio":           (0.0,   0.0,    0.0,    0.0),
    "beta":                   (0.04,  0.04,   0.04,   0.04),    # KL weight: > 0, so the KL is logged
    "loss_type":              ("dapo", "dapo", "dapo", "dapo"),  # TRL's default
    "use_lora":               (True,  True,   True,   True),    # the reference is the adapter disabled
    "lora_r":                 (16,    16,     16,     16),
    "lora_alpha":             (32,    32,     32,     32),
    "lora_dropout":           (0.0,   0.0,    0.0,    0.0),
    "lora_target_modules":    (ATT,   ALL,    ALL,    ALL),     # tiny: the MLP adapters cost more time than they give
    "eval_batch_size":        (250,   32,     64,     64),
    "gradient_checkpointing": (False, True,   True,   True),
    "save_steps":             (0,     25,     14,     13),
    "logging_steps":          (1,     5,      5,      5),
    "use_vllm":               (False, False,  False,  False),   # vLLM is not pinned: pip install vllm, USE_VLLM=True
    "decode_rollout":         (True,  False,  False,  False),   # tiny: rl.decode_rollout samples (TRL's rollout_func)
    "hack_steps":             (20,    10,     10,     10),     # the reward-hacking run
    "hack_prompts":           (8,     4,      8,      8),       # its prompts per step (x G completions)
    "hack_learning_rate":     (4.5e-3, 5e-5,  5e-5,   5e-5),    # 3.6x / 5x the real run: the exploit shows quickly
    "hand_steps":             (8,     10,     10,     5),      # the capstone: GRPO with the student's grpo_step
    "hand_prompts":           (8,     2,      2,      4),       # prompts per step (x G completions, one backward)
    "sampled_eval_prompts":   (50,    50,     50,     50),     # held-out prompts for pass@k
    "sweep_prompts":          (32,    16,     16,     16),     # the num_generations x temperature sweep
    "sweep_generations":      (GENERATIONS,) * 4,
    "sweep_temperatures":     (TEMPERATURES,) * 4,
}
