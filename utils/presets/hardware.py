"""The GPUs the presets are sized for, and the models they run: what the time estimate needs (:mod:`.sizing`).

``ARCHITECTURES`` holds the architecture fields of each GPU preset's Hub model (its ``config.json``), which the
random-weight stand-ins (``utils/course/twins.py``) are built from and :func:`shape` reads; ``CARDS`` holds each
GPU's published memory bandwidth and tensor-core throughput, with the page that states them.
"""
from __future__ import annotations

# config.json of each Hub model a GPU preset uses (the architecture fields; dtype set per preset).
ARCHITECTURES: dict[str, dict] = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(
        model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=151936, hidden_size=896,
        intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        max_position_embeddings=32768, max_window_layers=21, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False, bos_token_id=151643,
        eos_token_id=151645),
    "Qwen/Qwen3-1.7B-Base": dict(
        model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=2048,
        intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False, bos_token_id=151643,
        eos_token_id=151643),
    "Qwen/Qwen3-4B-Base": dict(
        model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=2560,
        intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False, bos_token_id=151643,
        eos_token_id=151643),
}


def shape(model_id: str) -> dict:
    """What the time estimate needs of ``model_id``'s architecture, counted from :data:`ARCHITECTURES` (no weights):
    ``params`` (tied embeddings once: the output layer's matrix product uses them), ``layers``, ``hidden``,
    ``vocab`` and ``kv_per_token`` (key and value entries a sequence caches per token, all layers)."""
    a = ARCHITECTURES[model_id]
    d, heads, kv, layers = a["hidden_size"], a["num_attention_heads"], a["num_key_value_heads"], a["num_hidden_layers"]
    head_dim = a.get("head_dim") or d // heads
    q, k = heads * head_dim, kv * head_dim
    bias = q + 2 * k if a["model_type"] == "qwen2" else 0                      # Qwen2 has q/k/v biases
    qk_norm = 2 * head_dim if a["model_type"] == "qwen3" else 0                # Qwen3 normalises q and k per head
    per_layer = d * (q + 2 * k) + bias + q * d + 3 * d * a["intermediate_size"] + 2 * d + qk_norm
    params = layers * per_layer + a["vocab_size"] * d * (1 if a["tie_word_embeddings"] else 2) + d
    return {"params": params, "layers": layers, "hidden": d, "vocab": a["vocab_size"],
            "kv_per_token": 2 * layers * k}


# Published peak figures (NVIDIA's own documents; tensor-core throughput dense, i.e. without the 2:4 sparsity that
# datasheets print with an asterisk, with fp32 accumulation): bandwidth in GB/s (10^9 bytes), throughput in TFLOPS.
CARDS: dict[str, dict] = {
    "T4": dict(bandwidth_gbs=320, fp16_tflops=65.0, bf16_tflops=None, fp32_tflops=8.1, memory_gb=16,
               source="https://www.nvidia.com/en-us/data-center/tesla-t4/ (320+ GB/s, 65 FP16/FP32 mixed-precision "
                      "TFLOPS, 8.1 FP32; its datasheet prints 300 GB/s; Turing has no bf16 and no sparsity mode)"),
    "RTX 4090": dict(bandwidth_gbs=1008, fp16_tflops=165.2, bf16_tflops=165.2, fp32_tflops=82.6, memory_gb=24,
                     source="https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf "
                            "(Appendix A: Peak FP16 and BF16 Tensor TFLOPS with FP32 Accumulate 165.2/330.4, dense/"
                            "sparse; 1008 GB/sec)"),
    "A100 80GB": dict(bandwidth_gbs=1935, fp16_tflops=312.0, bf16_tflops=312.0, fp32_tflops=19.5, memory_gb=80,
                      source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                             "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (312 TFLOPS dense, 624 with "
                             "sparsity; 1,935 GB/s PCIe 80GB, 2,039 GB/s SXM: the slower one is taken)"),
    "H100 80GB": dict(bandwidth_gbs=3350, fp16_tflops=989.4, bf16_tflops=989.4, fp32_tflops=66.9, memory_gb=80,
                      source="https://www.nvidia.com/en-us/data-center/h100/ and the H100 architecture whitepaper "
                             "(SXM5: 3.35 TB/s; Peak BF16 Tensor 989.4 TFLOPS dense, 1978.9 with sparsity)"),
    "H200": dict(bandwidth_gbs=4800, fp16_tflops=989.5, bf16_tflops=989.5, fp32_tflops=67.0, memory_gb=141,
                 source="https://www.nvidia.com/en-us/data-center/h200/ (4.8 TB/s; 1,979 TFLOPS FP16/BF16 printed "
                        "with sparsity, halved here)"),
}

# The card each GPU preset is sized for: the slowest it names (t4-16g: Colab's T4; 24g: an RTX 4090, as fast as the
# AutoDL 4090s and faster than a 3090; 80g: an A100 80GB, slower than an H100).
PRESET_CARD = {"t4-16g": "T4", "24g": "RTX 4090", "80g": "A100 80GB"}


def card_of(gpu_name: str | None) -> str | None:
    """The :data:`CARDS` entry a device name (``torch.cuda.get_device_name``) is, or None when it is none of them."""
    name = (gpu_name or "").upper()
    for card, needles in (("H200", ("H200",)), ("H100 80GB", ("H100",)), ("A100 80GB", ("A100",)),
                          ("RTX 4090", ("4090",)), ("T4", ("T4",))):
        if any(n in name for n in needles):
            return card
    return None
