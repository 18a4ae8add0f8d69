"""utils.runtime: platform detection, dtype policy, Hub probing and the mirror -- all offline and fast."""
import http.server
import json
import os
import random
import sys
import threading
import time
import types

import pytest
import torch

from utils import runtime
from utils.course import speed


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No platform markers, no Hub settings, an empty probe cache."""
    for key in list(os.environ):
        if key.startswith(("COLAB_", "AutoDL")) or key in ("HF_ENDPOINT", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(key)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(runtime, "AUTODL_DATA_DIR", str(tmp_path / "no-such-dir"))
    runtime.clear_cache()
    yield
    runtime.clear_cache()


# ----------------------------------------------------------------------------- platform
def test_platform_local():
    assert runtime.platform() == "local"


def test_platform_colab_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert runtime.platform() == "colab"


@pytest.mark.parametrize("var", ["COLAB_RELEASE_TAG", "COLAB_GPU"])
def test_platform_colab_env(monkeypatch, var):
    monkeypatch.setenv(var, "1")
    assert runtime.platform() == "colab"


def test_platform_autodl_env(monkeypatch):
    monkeypatch.setenv("AutoDLContainerUUID", "abc")
    assert runtime.platform() == "autodl"


def test_platform_autodl_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "AUTODL_DATA_DIR", str(tmp_path))
    assert runtime.platform() == "autodl"


# ----------------------------------------------------------------------------- device / dtype
def test_cpu_policy(monkeypatch, no_gpu):
    assert runtime.device() == "cpu"
    assert runtime.gpu_info() is None
    assert runtime.dtype_policy() == torch.float32


def test_t4_policy(monkeypatch, fake_gpu):
    fake_gpu("T4")
    info = runtime.gpu_info()
    assert info == {"name": "Tesla T4", "total_gb": 14.7, "capability": (7, 5), "bf16": False}
    assert runtime.device() == "cuda"
    assert runtime.dtype_policy() == torch.float16


def test_a100_policy(monkeypatch, fake_gpu):
    fake_gpu("A100")
    assert runtime.gpu_info()["bf16"] is True
    assert runtime.dtype_policy() == torch.bfloat16
    assert runtime.dtype_policy("cpu") == torch.float32


def test_check_dtype_bf16_on_t4(monkeypatch, fake_gpu):
    fake_gpu("T4")
    with pytest.raises(ValueError) as err:
        runtime.check_dtype("bf16")
    msg = str(err.value)
    assert "Tesla T4" in msg and "7.5" in msg and "fp16" in msg and "t4-16g" in msg
    assert runtime.check_dtype("float16") == torch.float16
    assert runtime.check_dtype(torch.float32) == torch.float32


def test_check_dtype_bf16_on_a100(monkeypatch, fake_gpu):
    fake_gpu("A100")
    assert runtime.check_dtype("bfloat16") == torch.bfloat16
    assert runtime.check_dtype(torch.bfloat16, "cuda") == torch.bfloat16


@pytest.mark.parametrize("dtype", ["fp16", "bf16", torch.float16, torch.bfloat16])
def test_check_dtype_half_on_cpu(monkeypatch, dtype, no_gpu):
    with pytest.raises(ValueError, match="fp32"):
        runtime.check_dtype(dtype)


def test_check_dtype_fp32_on_cpu_and_unknown_name(monkeypatch, no_gpu):
    assert runtime.check_dtype("fp32") == torch.float32
    with pytest.raises(ValueError, match="Unknown dtype"):
        runtime.check_dtype("int8")


# ----------------------------------------------------------------------------- Hub
def test_hub_endpoint(monkeypatch):
    assert runtime.hub_endpoint() == "https://huggingface.co"
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.com/")
    assert runtime.hub_endpoint() == "https://hf-mirror.com"


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_hub_reachable_offline_is_instant(monkeypatch, value):
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    calls = []
    monkeypatch.setattr(runtime, "_probe", lambda *a: calls.append(a) or True)
    start = time.perf_counter()   # no probe, no wait: wall time, stretched by the machine's measured slowdown
    assert runtime.hub_reachable() is False
    assert time.perf_counter() - start < 0.5 * speed.slowdown()
    assert calls == []


def test_hub_reachable_closed_port():
    start, slack = time.perf_counter(), 0.6 * speed.slowdown()   # a waiting test: wall time, its slack stretched
    assert runtime.hub_reachable("https://127.0.0.1:9", timeout=1.0) is False
    assert time.perf_counter() - start < 1.0 + slack


def test_hub_reachable_slow_probe_is_cut_off(monkeypatch):
    monkeypatch.setattr(runtime, "_probe", lambda url, timeout: time.sleep(5) or True)
    start, slack = time.perf_counter(), 0.8 * speed.slowdown()   # by the machine's slowdown (utils.course.speed)
    assert runtime.hub_reachable("https://slow.invalid", timeout=0.2) is False
    assert time.perf_counter() - start < 0.2 + slack


def test_hub_reachable_http_error_counts_as_reachable():
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert runtime.hub_reachable(f"http://127.0.0.1:{server.server_port}", timeout=2.0) is True
    finally:
        server.shutdown()
        server.server_close()


def test_hub_reachable_caches_per_endpoint(monkeypatch):
    calls = []
    monkeypatch.setattr(runtime, "_probe", lambda url, timeout: calls.append(url) or True)
    assert runtime.hub_reachable("https://a.example") and runtime.hub_reachable("https://a.example/")
    assert runtime.hub_reachable("https://b.example")
    assert calls == ["https://a.example", "https://b.example"]
    runtime.hub_reachable.cache_clear()
    runtime.hub_reachable("https://a.example")
    assert len(calls) == 3


@pytest.fixture
def restore_hub_constants(monkeypatch):
    """Let use_hf_mirror patch huggingface_hub / datasets; monkeypatch puts everything back."""
    import huggingface_hub.constants as constants
    import huggingface_hub.hf_api as hf_api
    for name in ("ENDPOINT", "HUGGINGFACE_CO_URL_TEMPLATE", "HF_URL_HOSTS"):
        monkeypatch.setattr(constants, name, getattr(constants, name))
    monkeypatch.setattr(hf_api.api, "endpoint", hf_api.api.endpoint)
    package = sys.modules["huggingface_hub"]
    for name in ("ENDPOINT", "HUGGINGFACE_CO_URL_TEMPLATE"):
        if name in vars(package):
            monkeypatch.setattr(package, name, vars(package)[name])
    if "datasets.config" in sys.modules:
        ds_config = sys.modules["datasets.config"]
        for name in ("HF_ENDPOINT", "HUB_DATASETS_URL"):
            monkeypatch.setattr(ds_config, name, getattr(ds_config, name))
    return constants


def test_use_hf_mirror_keeps_existing_endpoint(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://my-mirror.example")
    assert runtime.use_hf_mirror(force=True) == "https://my-mirror.example"
    assert runtime.hub_endpoint() == "https://my-mirror.example"


def test_use_hf_mirror_forced(monkeypatch, restore_hub_constants):
    constants = restore_hub_constants
    assert runtime.use_hf_mirror(force=True) == runtime.DEFAULT_MIRROR
    assert os.environ["HF_ENDPOINT"] == "https://hf-mirror.com"
    assert constants.ENDPOINT == "https://hf-mirror.com"
    assert constants.HUGGINGFACE_CO_URL_TEMPLATE.startswith("https://hf-mirror.com/{repo_id}/resolve/")
    assert "hf-mirror.com" in constants.HF_URL_HOSTS
    assert sys.modules["huggingface_hub.hf_api"].api.endpoint == "https://hf-mirror.com"
    from huggingface_hub import hf_hub_url
    assert hf_hub_url("Qwen/Qwen3-1.7B-Base", "config.json").startswith("https://hf-mirror.com/")


def test_use_hf_mirror_local_does_nothing(monkeypatch):
    monkeypatch.setattr(runtime, "hub_reachable", lambda *a, **k: pytest.fail("local runs must not probe"))
    assert runtime.use_hf_mirror() == "https://huggingface.co"
    assert "HF_ENDPOINT" not in os.environ


def test_use_hf_mirror_autodl(monkeypatch, restore_hub_constants):
    monkeypatch.setenv("AutoDLContainerUUID", "abc")
    reachable = {"https://huggingface.co": True, "https://hf-mirror.com": True}
    monkeypatch.setattr(runtime, "hub_reachable", lambda endpoint=None, timeout=3.0: reachable[endpoint])
    assert runtime.use_hf_mirror() == "https://huggingface.co"      # the Hub answers: keep it
    reachable["https://huggingface.co"] = False
    assert runtime.use_hf_mirror() == "https://hf-mirror.com"       # the Hub does not: mirror
    assert os.environ["HF_ENDPOINT"] == "https://hf-mirror.com"


# ----------------------------------------------------------------------------- seeding, memory, describe
def test_seed_everything():
    import numpy as np
    runtime.seed_everything(123)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    runtime.seed_everything(123)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
    assert os.environ["PYTHONHASHSEED"] == "123"


def test_peak_memory_and_describe(monkeypatch, no_gpu):
    mem = runtime.peak_memory_mb()
    assert mem["process_rss_peak_mb"] > 10 and mem["gpu_peak_mb"] is None
    info = runtime.describe()
    assert {"platform", "device", "gpu", "gpu_memory_gb", "dtype", "torch", "transformers", "trl", "peft",
            "cpu_count"} <= set(info)
    assert info["device"] == "cpu" and info["dtype"] == "fp32"
    json.dumps(info)


def test_reset_peak_memory_starts_a_new_window(monkeypatch, no_gpu):
    import mmap

    big = mmap.mmap(-1, 300 * 2**20)       # +300 MB resident, mapped apart from the heap (which the test process
    big[::4096] = b"x" * len(big[::4096])  # keeps, tests/conftest.py): touch every page, then unmap them
    high = runtime.peak_memory_mb()["process_rss_peak_mb"]
    big.close()
    if not runtime.reset_peak_memory():
        pytest.skip("this OS keeps only a lifetime peak")
    low = runtime.peak_memory_mb()["process_rss_peak_mb"]
    assert low < high - 200, (low, high)


def test_hardware_names_the_gpu_or_the_cpu(monkeypatch, fake_gpu):
    fake_gpu("RTX 4090")
    assert runtime.hardware() == "NVIDIA GeForce RTX 4090 (23.6 GB)"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 2)
    assert runtime.hardware() == "CPU (2 cores)"


def test_rng_state_round_trips_through_json():
    import json
    import random

    import numpy as np

    runtime.seed_everything(3)
    torch.rand(5), random.random(), np.random.rand()
    saved = json.loads(json.dumps(runtime.rng_state()))
    expected = torch.rand(3).tolist(), random.random(), float(np.random.rand())
    runtime.seed_everything(4)
    runtime.set_rng_state(saved)
    assert (torch.rand(3).tolist(), random.random(), float(np.random.rand())) == expected
