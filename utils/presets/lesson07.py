"""Lesson 07, reward models to over-optimisation: every knob on every tier (data only; ``presets.resolve`` reads it)."""
from .tiers import ALL_LINEAR as ALL
from .tiers import DATASETS, MODELS

KNOBS = {  #                  tiny    t4-16g  24g     80g
    "model":                  MODELS,
    "dataset":                DATASETS,
    "difficulty":             ("mixed", "mixed", "mixed", "mixed"),
    "sft_steps":              (120,   150,    150,    150),    # lesson 01's recipe (tiny: 120 steps, as lesson 03)
    "verbose_share":          (0.5,   0.5,    0.5,    0.5),     # SFT answers opening with a filler sentence (lesson 03)
    "shortcut_share":         (0.6,   0.6,    0.6,    0.6),     # SFT answers that skip the working (lesson 03)
    "n_prompts":              (192,   300,    300,    300),    # training prompts sampled on-policy for pairs
    "n_heldout":              (200,   100,    100,    100),    # held-out prompts: pairs and probes
    "n_samples":              (8,     4,      4,      4),       # answers per prompt to choose pairs from
    "temperature":            (1.0,   0.8,    0.8,    0.8),
    "max_new_tokens":         (96,    256,    256,    256),
    "max_length":             (256,   768,    768,    768),     # prompt + answer; RewardTrainer drops longer pairs
    "batch_size":             (8,     4,      4,      4),       # preference pairs per forward/backward
    "grad_accum":             (1,     4,      4,      4),
    "learning_rate":          (1e-4,  5e-5,   5e-5,   5e-5),    # RewardConfig's default is 1e-4
    "max_steps":              (40,    40,     40,     40),     # reward-model optimizer steps
    "warmup_ratio":           (0.05,  0.05,   0.05,   0.05),
    "center_rewards_coefficient": (0.01, 0.01, 0.01,  0.01),    # TRL's recommended value: rewards centred on 0
    "use_lora":               (False, True,   True,   True),    # LoRA: task_type SEQ_CLS, the score head trained fully
    "lora_r":                 (16,    16,     16,     16),
    "lora_alpha":             (32,    32,     32,     32),
    "lora_dropout":           (0.0,   0.05,   0.05,   0.05),
    "lora_target_modules":    (ALL,   ALL,    ALL,    ALL),
    "eval_batch_size":        (320,   32,     64,     64),      # tiny: 40 prompts x 8 samples per generate call
    "gradient_checkpointing": (False, True,   True,   False),
    "save_steps":             (0,     50,     50,     50),
    "logging_steps":          (5,     10,     10,     10),
    "rl_pool":                (2000,  7473,   7473,   7473),    # sections 7-12, verl's names: the RL runs' prompt pool
    "rl_iterations":          (15,    30,     30,     30),     # rollout + update rounds
    "rl_prompts":             (12,    16,     32,     64),      # prompts per rollout (data.train_batch_size)
    "rl_samples":             (4,     4,      4,      4),       # responses per prompt (rollout.n)
    "rl_minibatches":         (2,     4,      4,      4),       # updates per rollout (batch / ppo_mini_batch_size)
    "rl_micro_batch":         (32,    2,      4,      8),       # sequences per forward (ppo_micro_batch_size_per_gpu)
    "rl_learning_rate":       (1e-4,  1e-5,   1e-5,   1e-5),    # actor (tiny: full fine-tune; GPU: LoRA)
    "critic_learning_rate":   (1e-3,  1e-4,   1e-4,   1e-4),    # critic: a fresh value head learns fast
    "kl_coef":                (0.05,  0.05,   0.05,   0.05),    # algorithm.kl_ctrl.kl_coef (KL in the reward)
    "gamma":                  (1.0,   1.0,    1.0,    1.0),     # algorithm.gamma (verl's default)
    "lam":                    (1.0,   1.0,    1.0,    1.0),     # algorithm.lam (verl's default)
    "clip_ratio":             (0.2,   0.2,    0.2,    0.2),     # actor.clip_ratio (low = high)
    "cliprange_value":        (0.5,   0.5,    0.5,    0.5),     # critic.cliprange_value (verl's default)
    "entropy_coeff":          (0.0,   0.0,    0.0,    0.0),     # actor.entropy_coeff (verl's default: no bonus)
    "overopt_iterations":     (30,    30,     30,     30),     # section 12: rounds against the reward model
    "overopt_prompts":        (6,     16,     32,     64),      # section 12: prompts per rollout
    "overopt_kl_coef":        (0.0,   0.0,    0.0,    0.0),     # section 12: no KL, the fewest steps to over-optimise
}
