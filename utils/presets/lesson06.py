"""Lesson 06, quantization: every knob on every tier (data only; ``presets.resolve`` reads it)."""
from .tiers import DATASETS, MODELS

KNOBS = {  #                  tiny    t4-16g  24g     80g
    "model":                  MODELS,
    "dataset":                DATASETS,
    "difficulty":             ("mixed", "mixed", "mixed", "mixed"),
    "sft_steps":              (60,    150,    150,    150),    # lesson 01's recipe for the model that is quantized
    "n_test":                 (500,   200,    200,    200),
    "max_new_tokens":         (96,    256,    256,    256),
    "eval_batch_size":        (250,   32,     32,     32),
    "ppl_problems":           (200,   100,    100,    100),    # held-out answers for perplexity
    "blocksize":              (64,    64,     64,     64),      # bitsandbytes' NF4 block size
    "outlier_prompts":        (64,    16,     16,     16),      # prompts whose activations are inspected
    "outlier_threshold":      (6.0,   6.0,    6.0,    6.0),     # LLM.int8()'s threshold
    "qlora_steps":            (30,    60,     60,     60),     # QLoRA on the NF4 base
    "lora_r":                 (16,    16,     16,     16),
    "lora_alpha":             (32,    32,     32,     32),
}
