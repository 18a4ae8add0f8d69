"""Where are we running, and what can this machine do?

Small, dependency-light helpers the lessons call in their setup and resolution
cells: the platform (Colab, AutoDL, local), the device and the dtype it supports,
whether the Hugging Face Hub can be reached (never waiting long), the Hub mirror
for users in China, seeding, and peak-memory readings.

Nothing here touches the network except :func:`hub_reachable` (and
:func:`use_hf_mirror`, which calls it), and that call is bounded by a short
timeout and skipped entirely when ``HF_HUB_OFFLINE`` is set.
"""
from __future__ import annotations

import gc
import os
import random
import sys
import threading
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import torch

DEFAULT_HUB = "https://huggingface.co"
DEFAULT_MIRROR = "https://hf-mirror.com"
AUTODL_DATA_DIR = "/root/autodl-tmp"  # AutoDL's data disk; its presence marks an AutoDL container
_TRUE = {"1", "true", "yes", "on"}

# Accepted spellings for dtypes in check_dtype / presets.
_DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
}


# ----------------------------------------------------------------------------- platform / device
def platform() -> str:
    """``"colab"``, ``"autodl"`` or ``"local"``."""
    if "google.colab" in sys.modules or os.environ.get("COLAB_RELEASE_TAG") or os.environ.get("COLAB_GPU"):
        return "colab"
    if any(k.startswith("AutoDL") for k in os.environ) or os.path.isdir(AUTODL_DATA_DIR):
        return "autodl"
    return "local"


def device() -> str:
    """``"cuda"`` if torch sees a CUDA GPU, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def gpu_info() -> dict | None:
    """The current CUDA GPU, or None without one.

    Returns ``{"name": str, "total_gb": float (GiB, 1 decimal), "capability": (major, minor),
    "bf16": bool}``; ``bf16`` is True from compute capability 8.0 (Ampere) on.
    """
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device()
    capability = tuple(torch.cuda.get_device_capability(idx))
    total = torch.cuda.get_device_properties(idx).total_memory
    return {
        "name": torch.cuda.get_device_name(idx),
        "total_gb": round(total / 2**30, 1),
        "capability": capability,
        "bf16": capability >= (8, 0),
    }


def hardware() -> str:
    """The machine in one line, for a lesson's records: the GPU and its memory, or the CPU cores.

    E.g. ``"NVIDIA GeForce RTX 4090 (23.6 GB)"`` or ``"CPU (2 cores)"``.
    """
    info = gpu_info()
    if info:
        return f"{info['name']} ({info['total_gb']} GB)"
    return f"CPU ({os.cpu_count()} cores)"


def _is_cuda(dev) -> bool:
    return str(dev).startswith("cuda")


def dtype_policy(dev=None) -> torch.dtype:
    """The training dtype for a device: bf16 on Ampere+ GPUs, fp16 on older GPUs (T4), fp32 on CPU."""
    dev = device() if dev is None else dev
    if not _is_cuda(dev):
        return torch.float32
    info = gpu_info()
    if info is None:
        return torch.float32
    return torch.bfloat16 if info["bf16"] else torch.float16


def as_dtype(dtype) -> torch.dtype:
    """A torch dtype from a torch dtype or a name such as ``"bf16"``, ``"float16"``, ``"fp32"``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; use one of {sorted(set(_DTYPES))} or a torch dtype.")
    return _DTYPES[key]


def dtype_name(dtype) -> str:
    """Short name of a dtype: ``"bf16"``, ``"fp16"`` or ``"fp32"`` (else torch's name)."""
    dtype = as_dtype(dtype)
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(
        dtype, str(dtype).removeprefix("torch."))


def check_dtype(dtype, dev=None) -> torch.dtype:
    """Raise ValueError if ``dtype`` cannot be used for training on ``dev``; else return it as a torch dtype.

    * bf16 on a GPU older than Ampere (compute capability < 8.0, e.g. the T4) -> error.
    * fp16/bf16 on CPU -> error (CPU runs use fp32).
    """
    dtype = as_dtype(dtype)
    dev = device() if dev is None else dev
    half = dtype in (torch.float16, torch.bfloat16)
    if not _is_cuda(dev):
        if half:
            raise ValueError(f"{dtype_name(dtype)} training was requested on {dev}; CPU runs use fp32 "
                             "(preset 'tiny' does this).")
        return dtype
    info = gpu_info()
    if info is None:
        raise ValueError(f"Device {dev!r} was requested but torch sees no CUDA GPU; use 'cpu' with fp32.")
    if dtype == torch.bfloat16 and not info["bf16"]:
        major, minor = info["capability"]
        raise ValueError(f"{info['name']} (compute capability {major}.{minor}) does not support bf16 "
                         "(needs 8.0+, Ampere or newer). Use fp16 instead: the 't4-16g' preset does.")
    return dtype


# ----------------------------------------------------------------------------- Hugging Face Hub
def hub_endpoint() -> str:
    """The Hub endpoint in use: ``$HF_ENDPOINT`` or https://huggingface.co (no trailing slash)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_HUB).rstrip("/")


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to a true value ("1", "true", "yes", "on")."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Do not follow redirects: a 3xx answer already proves the host is reachable."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)
_reachable_cache: dict[str, bool] = {}


def _probe(url: str, timeout: float) -> bool:
    """One HEAD request; any HTTP answer (even 4xx/5xx) means reachable, any other failure means not."""
    try:
        with _OPENER.open(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except Exception:  # DNS failure, refused, timeout, TLS error, ...
        return False


def hub_reachable(endpoint: str | None = None, timeout: float = 3.0) -> bool:
    """Whether the Hub (or ``endpoint``) answers an HTTPS HEAD request within ``timeout`` seconds.

    Returns False at once when ``HF_HUB_OFFLINE`` is set. The probe runs in a daemon
    thread so that even a slow DNS lookup (not covered by socket timeouts) cannot make
    it wait longer than ``timeout``. Results are cached per endpoint for the session;
    call ``hub_reachable.cache_clear()`` (or :func:`clear_cache`) to probe again.
    """
    if hub_offline():
        return False
    url = (endpoint or hub_endpoint()).rstrip("/")
    if url not in _reachable_cache:
        result = []
        worker = threading.Thread(target=lambda: result.append(_probe(url, timeout)), daemon=True)
        worker.start()
        worker.join(timeout + 0.5)
        _reachable_cache[url] = bool(result and result[0])
    return _reachable_cache[url]


QUIET_BARS = ("Loading weights", "Writing model shards")   # transformers' bars around a model's weights


def quiet_loading_bars() -> None:
    """Hide transformers' progress bars for loading and saving a model's weights: a line on stderr for every model
    a lesson loads or saves (a dozen in some), noise beside what the lesson prints. The Hub's download bars and the
    trainers' progress stay. Called by :func:`utils.presets.resolve`, so every lesson gets it."""
    from transformers.utils import logging as hf_logging

    def hook(factory, args, kwargs):
        return hf_logging.EmptyTqdm(*args, **kwargs) if kwargs.get("desc") in QUIET_BARS else factory(*args, **kwargs)

    hf_logging.set_tqdm_hook(hook)


def clear_cache() -> None:
    """Forget cached :func:`hub_reachable` results."""
    _reachable_cache.clear()


hub_reachable.cache_clear = clear_cache


def _patch_loaded_hub_libraries(endpoint: str) -> None:
    """Point already-imported huggingface_hub / datasets at ``endpoint``.

    huggingface_hub reads ``HF_ENDPOINT`` once, at import, into ``constants.ENDPOINT``
    and ``constants.HUGGINGFACE_CO_URL_TEMPLATE`` (= ENDPOINT + "/{repo_id}/resolve/...");
    its module-level ``HfApi`` instance and ``datasets.config`` copy it too. Modules
    not yet imported will read the environment variable themselves.
    """
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        old = constants.ENDPOINT
        constants.ENDPOINT = endpoint
        template = getattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", None)
        if isinstance(template, str) and template.startswith(old):  # derived from the endpoint
            constants.HUGGINGFACE_CO_URL_TEMPLATE = endpoint + template[len(old):]
        hosts = getattr(constants, "HF_URL_HOSTS", None)
        host = urlsplit(endpoint).hostname
        if isinstance(hosts, frozenset) and host:  # hosts trusted for redirects (the endpoint's is one)
            constants.HF_URL_HOSTS = hosts | {host.lower()}
        hf_api = sys.modules.get("huggingface_hub.hf_api")
        api = getattr(hf_api, "api", None)
        if api is not None and getattr(api, "endpoint", None) == old:
            api.endpoint = endpoint
        package = sys.modules.get("huggingface_hub")
        for name in ("ENDPOINT", "HUGGINGFACE_CO_URL_TEMPLATE"):  # lazily re-exported, maybe cached
            if package is not None and name in vars(package):
                setattr(package, name, getattr(constants, name))
    ds_config = sys.modules.get("datasets.config")
    if ds_config is not None:
        old = ds_config.HF_ENDPOINT
        ds_config.HF_ENDPOINT = endpoint
        if ds_config.HUB_DATASETS_URL.startswith(old):
            ds_config.HUB_DATASETS_URL = endpoint + ds_config.HUB_DATASETS_URL[len(old):]


def use_hf_mirror(mirror: str = DEFAULT_MIRROR, force: bool = False, timeout: float = 3.0) -> str:
    """Use a Hugging Face Hub mirror when the Hub itself cannot be reached; return the endpoint in use.

    * ``HF_ENDPOINT`` already set -> kept as is (the user chose).
    * ``force=True``, or on AutoDL when huggingface.co is unreachable but the mirror
      answers -> ``HF_ENDPOINT`` is set to ``mirror``.

    Best practice is to set ``HF_ENDPOINT`` *before* importing transformers, datasets or
    huggingface_hub (``export HF_ENDPOINT=https://hf-mirror.com`` in the shell, or
    ``os.environ[...]`` in the first cell): those libraries read it at import. If they are
    already imported, this function also patches ``huggingface_hub.constants.ENDPOINT``
    (and the URL template, the module-level ``HfApi`` and ``datasets.config``) so the
    mirror takes effect in the running session.

    Users in China can also download models from ModelScope (``pip install modelscope``;
    ``modelscope.snapshot_download("Qwen/Qwen2.5-0.5B-Instruct")``) and pass the local
    directory to the lesson (``model=<dir>``).
    """
    current = os.environ.get("HF_ENDPOINT")
    if current:
        return current.rstrip("/")
    mirror = mirror.rstrip("/")
    if not force:
        if platform() != "autodl" or hub_reachable(DEFAULT_HUB, timeout):
            return hub_endpoint()
        if not hub_reachable(mirror, timeout):
            return hub_endpoint()
        print(f"[runtime] {DEFAULT_HUB} is unreachable; using the mirror {mirror} (HF_ENDPOINT).")
    os.environ["HF_ENDPOINT"] = mirror
    _patch_loaded_hub_libraries(mirror)
    return mirror


# ----------------------------------------------------------------------------- seeding / memory / summary
def rng_state() -> dict:
    """Every random generator's state (Python's ``random``, NumPy's global one, torch's CPU and CUDA ones) as plain
    JSON values: :func:`set_rng_state` puts them back (``utils.sft.sft_checkpoint`` does, where it loads a model
    instead of training it, so that the samples drawn after it are the ones drawn after training)."""
    import numpy as np

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss], "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
            "torch": torch.get_rng_state().tolist(),
            "cuda": [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned (the CUDA states only where as many devices are visible)."""
    import numpy as np

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if state["cuda"] and torch.cuda.is_available() and torch.cuda.device_count() == len(state["cuda"]):
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (all CUDA devices too), and set ``PYTHONHASHSEED``.

    ``PYTHONHASHSEED`` only affects Python processes started afterwards (e.g. dataloader workers).
    """
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def _vm_hwm_kib() -> int | None:
    """Linux: the process's resident-set high-water mark (``VmHWM``, KiB), resettable; else None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_memory_mb() -> dict:
    """Peak memory since the start or the last :func:`reset_peak_memory`.

    Returns ``{"process_rss_peak_mb": float, "gpu_peak_mb": float | None}``. The RSS peak is
    Linux's ``VmHWM`` (reset by :func:`reset_peak_memory`), elsewhere ``getrusage``'s
    lifetime peak (KiB on Linux, bytes on macOS); the GPU peak is
    ``torch.cuda.max_memory_allocated`` (tensors only, not the CUDA context), None without CUDA.
    """
    rss_kib = _vm_hwm_kib()
    if rss_kib is None:
        try:
            import resource  # Unix only
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            rss_kib = rss / 2**10 if sys.platform == "darwin" else rss
        except ImportError:  # Windows: psutil's peak working set when available
            import psutil
            rss_kib = getattr(psutil.Process().memory_info(), "peak_wset", 0) / 2**10
    gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {"process_rss_peak_mb": round(rss_kib / 2**10, 1), "gpu_peak_mb": None if gpu is None else round(gpu, 1)}


def reset_peak_memory() -> bool:
    """Start a new peak-memory window for :func:`peak_memory_mb` (GPU always; process RSS on Linux).

    Returns True when the process peak was reset, False where the OS keeps only a lifetime
    peak (macOS, Windows): then ``process_rss_peak_mb`` is the peak since the process started.
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/clear_refs", "w") as f:  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
            f.write("5")
        return True
    except OSError:
        return False


def _version(package: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def describe() -> dict:
    """A JSON-friendly summary of the runtime, for the top of a lesson or a bug report."""
    info = gpu_info()
    return {
        "platform": platform(),
        "device": device(),
        "gpu": info["name"] if info else None,
        "gpu_memory_gb": info["total_gb"] if info else None,
        "dtype": dtype_name(dtype_policy()),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "trl": _version("trl"),
        "peft": _version("peft"),
        "cpu_count": os.cpu_count(),
    }


def install_requirements(root, skip=("torch",), timeout: float = 900.0) -> list[str]:
    """Install the course's pinned requirements that are missing or at another version.

    Used by the lessons' setup cell on Colab. ``skip`` keeps packages the platform
    already provides in a build of its own (Colab's CUDA torch). Returns the pins it
    installed (empty when everything was in place).
    """
    import subprocess
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    todo = []
    for line in (Path(root) / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or "==" not in line:
            continue
        name, pinned = line.split("==", 1)
        if name in skip:
            continue
        try:
            ok = version(name).split("+")[0] == pinned
        except PackageNotFoundError:
            ok = False
        if not ok:
            todo.append(line)
    if todo:
        print(f"installing {len(todo)} pinned packages: {' '.join(todo)}")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *todo], check=True, timeout=timeout)
    return todo
