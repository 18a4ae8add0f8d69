"""Fixtures the test modules share (the lessons' own executions come from ``tests/lesson_runs.py``)."""
import types

import pytest
import torch

from tests import side_venv
from utils.course.run import GLIBC_HEAP_ENV


def _one_thread_and_a_keeping_heap() -> None:
    """The test process computes on one CPU thread, with glibc's heap keeping what it frees (the kernels'
    settings, ``utils.course.run.GLIBC_HEAP_ENV``, set here by ``mallopt``: an environment
    variable would reach the lesson kernels, whose tiny runs are pinned to two threads). In `make test` the
    lessons execute beside this process, two kernels of two threads each on 2 cores; lesson 09's twin test took
    94 s of CPU time here on two threads with the default heap, 64 s on one thread, 43 s on one thread with this
    heap (28 s, 25 s and 2.5 s of it system time: page faults on the large blocks of a 151,936-token vocabulary's
    logits, mapped afresh and unmapped each time)."""
    import ctypes
    import ctypes.util

    torch.set_num_threads(1)
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):   # not glibc (macOS): its own allocator stays
        return
    env = GLIBC_HEAP_ENV
    for option, key in ((-4, "MALLOC_MMAP_MAX_"), (-1, "MALLOC_TRIM_THRESHOLD_"), (-2, "MALLOC_TOP_PAD_")):
        mallopt(option, min(int(env[key]), 2**31 - 1))   # M_MMAP_MAX, M_TRIM_THRESHOLD, M_TOP_PAD (an int each)


_one_thread_and_a_keeping_heap()

# GPUs as torch describes them: name, compute capability, memory in GiB.
GPUS = {
    "T4": ("Tesla T4", (7, 5), 14.7),
    "RTX 4090": ("NVIDIA GeForce RTX 4090", (8, 9), 23.6),
    "A10G": ("NVIDIA A10G", (8, 6), 22.1),
    "A100": ("NVIDIA A100-SXM4-80GB", (8, 0), 79.2),
    "H100": ("NVIDIA H100 80GB HBM3", (9, 0), 79.2),
    "V100": ("Tesla V100-SXM2-32GB", (7, 0), 31.7),
    "GTX 1080": ("NVIDIA GeForce GTX 1080", (6, 1), 7.9),
}


@pytest.fixture
def fake_gpu(monkeypatch):
    """``fake_gpu("RTX 4090")``: torch believes that GPU is present (what ``runtime.gpu_info`` reads)."""
    def install(gpu: str):
        name, capability, total_gb = GPUS[gpu]
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda idx=None: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda idx=None: types.SimpleNamespace(total_memory=int(total_gb * 2**30)))
    return install


@pytest.fixture
def no_gpu(monkeypatch):
    """torch sees no CUDA GPU, whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(scope="session")
def side_python():
    """``side_python("verl", requirements, timeout)``: the Python of a side venv (``tests/side_venv.py``),
    built once from ``requirements`` and reused while they do not change."""
    def ensure(name: str, requirements, timeout: float):
        venv = side_venv.venv_dir(name, f"{name.upper()}_VENV")
        return side_venv.ensure(venv, requirements, timeout, name)
    return ensure


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """``qwen_tokenizer("Qwen/Qwen3-1.7B-Base")``: a GPU preset's real tokenizer (utils.course.qwen_tokenizers),
    loaded once per session and shared by the tests that read it (none of them changes it)."""
    from utils.course import qwen_tokenizers

    loaded = {}

    def load(model_id: str):
        if model_id not in loaded:
            loaded[model_id] = qwen_tokenizers.qwen_tokenizer(model_id)
        return loaded[model_id]
    return load
