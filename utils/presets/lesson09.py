"""Lesson 09, agentic RL with a calculator: every knob on every tier (data only; ``presets.resolve`` reads it)."""
from .tiers import ALL_LINEAR as ALL
from .tiers import ATTENTION as ATT
from .tiers import DATASETS, MODELS

KNOBS = {  #                  tiny    t4-16g  24g     80g
    "model":                  MODELS,
    "dataset":                DATASETS,
    "difficulty":             ("mixed", "mixed", "mixed", "mixed"),
    "sft_steps":              (50,    150,    150,    150),    # both SFTs: lesson 01's recipe, the same steps
    "sft_batch_size":         (32,    4,      8,      4),       # lesson 01's batch halved on GPUs: twice its
    "sft_grad_accum":         (1,     8,      4,      8),       # max_length (its batch ran out of memory)
    "n_test":                 (250,   100,    100,    100),    # held-out problems of every accuracy
    "max_new_tokens":         (80,    256,    256,    256),     # one assistant turn
    "max_turns":              (8,     8,      8,      8),       # assistant turns per rollout (TRL: tool iterations + 1)
    "max_length":             (512,   1024,   1024,   1024),    # prompt + every turn, the tiny model's context
    "n_train":                (2000,  7473,   7473,   7473),    # RL prompt pool
    "num_generations":        (8,     8,      8,      8),       # G, rollouts per prompt
    "prompts_per_step":       (8,     8,      16,     16),
    "batch_size":             (64,    8,      16,     32),      # rollouts per forward/backward
    "grad_accum":             (1,     8,      8,      4),       # batch_size x grad_accum = one generation batch
    "temperature":            (1.0,   1.0,    1.0,    1.0),
    "max_completion_length":  (160,   512,    512,    512),     # every turn and tool result of one rollout
    "learning_rate":          (1e-3,  1e-5,   1e-5,   1e-5),    # LoRA adapters
    "max_steps":              (4,     20,     20,     20),     # GRPO with tools, optimizer steps
    "shy_scale":              (0.7,   0.7,    0.7,    0.7),     # section 7's start: the trace model, the call's
                                                                #   logit x this (utils.agent.weaken_call)
    "warmup_ratio":           (0.0,   0.0,    0.0,    0.0),
    "beta":                   (0.04,  0.04,   0.04,   0.04),
    "loss_type":              ("dapo", "dapo", "dapo", "dapo"),  # TRL's default
    "call_cost":              (0.1,   0.1,    0.1,    0.1),     # reward lost per call beyond the reference's steps
    "hack_bonus":             (1.0,   1.0,    1.0,    1.0),     # the naive shaping: reward per call (a right answer's)
    "hack_steps":             (8,     6,      6,      6),       # the hack run and its control (no bonus), each (GPUs:
                                                                #   6, paying for section 7's under-using start)
    "hack_prompts":           (4,     8,      16,     16),      # prompts per step of the hack run and its control (x G)
    "hack_learning_rate":     (2e-3,  2e-5,   2e-5,   2e-5),    # 2x section 7's; 5x collapsed its control too
    "turn_prompts":           (8,     8,      8,      8),     # per-turn vs per-trajectory credit: prompts x G
    "use_lora":               (True,  True,   True,   True),
    "lora_r":                 (16,    16,     16,     16),
    "lora_alpha":             (32,    32,     32,     32),
    "lora_dropout":           (0.0,   0.0,    0.0,    0.0),
    "lora_target_modules":    (ATT,   ALL,    ALL,    ALL),
    "eval_batch_size":        (250,   32,     64,     64),
    "gradient_checkpointing": (False, True,   True,   True),
    "save_steps":             (0,     10,     10,     10),
    "logging_steps":          (1,     5,      5,      5),
    "use_vllm":               (False, False,  False,  False),
}
