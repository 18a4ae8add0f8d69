"""The four tiers every lesson is written for, and the values their lesson tables share.

A lesson's table (``lessonNN.py``) has one column per tier, in the order of :data:`ORDER`.
"""
from ..constants import GSM8K, TINY_MODEL_DIR

ORDER = ("tiny", "t4-16g", "24g", "80g")   # the column order of every lesson's KNOBS

TIERS = {
    "tiny": {
        "description": "CPU, embedded tiny Qwen3 model, synthetic arithmetic problems; no network",
        "needs_gpu": False,
        "min_gpu_gb": 0.0,
        "bf16": None,
        "dtype": "fp32",          # fp32 everywhere, even when a GPU is present
    },
    "t4-16g": {
        "description": "Colab T4 16 GB (no bf16): Qwen2.5-0.5B-Instruct, fp16, LoRA, GSM8K",
        "needs_gpu": True,
        "min_gpu_gb": 14.0,       # torch reports a T4 as ~14.7 GiB
        "bf16": False,            # fp16 mixed precision
    },
    "24g": {
        "description": "RTX 4090 / 3090 24 GB: Qwen3-1.7B-Base, bf16, LoRA, GSM8K",
        "needs_gpu": True,
        "min_gpu_gb": 20.0,
        "bf16": True,
    },
    # 80g: Qwen3-4B-Base with LoRA rather than a full fine-tune of Qwen3-1.7B-Base. LoRA keeps the one
    # code path every other tier uses (same notebook, only sizes change), and the larger base model shows
    # what scale buys on GSM8K; a full fine-tune would need its own code path and optimizer-state memory.
    "80g": {
        "description": "A100 / H100 80 GB: Qwen3-4B-Base, bf16, LoRA, GSM8K",
        "needs_gpu": True,
        "min_gpu_gb": 70.0,
        "bf16": True,
    },
}

# The model of each tier, in ORDER (every lesson uses these; ``model=<local dir>`` overrides it).
MODELS = (str(TINY_MODEL_DIR), "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-4B-Base")
DATASETS = ("synthetic", GSM8K, GSM8K, GSM8K)

# LoRA targets: all linear layers of a Qwen2/Qwen3 decoder block, or its attention projections only.
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
