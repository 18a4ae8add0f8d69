"""Presets: which model, data and sizes a lesson uses on which kind of machine.

Every lesson's knobs live in a data file of their own, one row per knob and one column per tier
(``utils/presets/lesson04.py``; the tiers are in ``tiers.py``)::

    tiny    CPU, the embedded model in utils/assets/tiny-qwen, synthetic data, no network (CI, grading)
    t4-16g  Colab's T4 (16 GB, no bf16): Qwen2.5-0.5B-Instruct, fp16, LoRA
    24g     RTX 4090 / 3090 (24 GB, e.g. AutoDL): Qwen3-1.7B-Base, bf16, LoRA
    80g     A100 / H100 80 GB: Qwen3-4B-Base, bf16, LoRA

This module is the mechanism. A notebook calls::

    cfg = presets.resolve(PRESET, lesson="04", max_steps=MAX_STEPS, ...)   # None = the preset decides
    cfg.show()                                                              # the resolution table
    cfg.max_steps, cfg.dtype, cfg.device

A new lesson adds ``lessonNN.py`` with a ``KNOBS`` table; nothing else changes here.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import runtime
from ..constants import REPO_ROOT, TINY_MODEL_DIR, TINY_MODEL_LABEL
from . import hardware, measured, sizing
from .tiers import ORDER, TIERS

REHEARSAL_ENV = "COURSE_REHEARSAL"   # a rehearsal's spec (utils/course/rehearsal.py): a GPU preset's path on a CPU
COMMON_KEYS = ("seed",)   # overrides resolve() accepts for every lesson, besides the lesson's own knobs
# Shown by LessonConfig.table() after preset/model/device/dtype, when the lesson has them.
TABLE_KEYS = ("dataset", "n_train", "n_test", "max_length", "batch_size", "max_steps", "lora_r")


def _load_lessons() -> dict[str, dict]:
    """``{"01": KNOBS, ...}`` from every ``lessonNN.py`` here, each row checked to have one value per tier."""
    lessons = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("lesson") and info.name[6:].isdigit():
            knobs = importlib.import_module(f"{__name__}.{info.name}").KNOBS
            for key, row in knobs.items():
                if not isinstance(row, tuple) or len(row) != len(ORDER):
                    raise ValueError(f"utils/presets/{info.name}.py: knob {key!r} needs a tuple of {len(ORDER)} "
                                     f"values, one per tier {ORDER}; got {row!r}")
            lessons[info.name[6:]] = knobs
    return dict(sorted(lessons.items()))


LESSONS: dict[str, dict] = _load_lessons()

# Each tier with every lesson's values: PRESETS["24g"]["lessons"]["04"]["num_generations"] == 8.
PRESETS: dict[str, dict] = {
    tier: {**TIERS[tier], "lessons": {lesson: {key: row[i] for key, row in knobs.items()}
                                      for lesson, knobs in LESSONS.items()}}
    for i, tier in enumerate(ORDER)
}


# ----------------------------------------------------------------------------- resolved config
@dataclass
class LessonConfig:
    """A resolved preset for one lesson: attribute access to every lesson key (``cfg.max_steps``).

    Fields: ``preset``, ``lesson``, ``device`` ("cuda"/"cpu"), ``dtype`` (torch dtype),
    ``model_label`` (for display, never a machine path), ``seed`` and ``params`` (the lesson keys).
    """

    preset: str
    lesson: str
    device: str
    dtype: torch.dtype
    model_label: str
    params: dict = field(default_factory=dict)
    seed: int = 0

    def __getattr__(self, name):
        params = self.__dict__.get("params")
        if params is not None and name in params:
            return params[name]
        raise AttributeError(f"LessonConfig has no {name!r}; lesson {self.__dict__.get('lesson')} keys: "
                             f"{sorted(params or {})}")

    def __getitem__(self, key):
        return self.params[key]

    def to_dict(self) -> dict:
        """Plain JSON-friendly values; dtype as "bf16"/"fp16"/"fp32", repo paths made relative."""
        params = {k: list(v) if isinstance(v, tuple) else v for k, v in self.params.items()}
        if "model" in params:
            params["model"] = _portable_path(params["model"])
        return {"preset": self.preset, "lesson": self.lesson, "device": self.device,
                "dtype": runtime.dtype_name(self.dtype), "model_label": self.model_label,
                "seed": self.seed, **params}

    def table(self) -> str:
        """A short aligned two-column table: preset, model, device, dtype and the key sizes."""
        rows = [("preset", self.preset), ("model", self.model_label), ("device", self.device),
                ("dtype", runtime.dtype_name(self.dtype))]
        rows += [(k, self.params[k]) for k in TABLE_KEYS if k in self.params]
        if needs_gpu(self.preset):
            gpu = runtime.gpu_info() if self.device == "cuda" else None
            rows.append(("estimate", estimate_note(self.preset, self.lesson, self.params, gpu)))
            rows.append(("measured", measured_note(self.preset, self.lesson)))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def show(self) -> None:
        """Print :meth:`table`."""
        print(self.table())


def _portable_path(value: str) -> str:
    """A path inside the repo as a relative POSIX path; anything else unchanged."""
    try:
        return Path(value).resolve().relative_to(REPO_ROOT).as_posix()
    except (ValueError, OSError):
        return value


def _model_label(model: str) -> str:
    """Display name of a model: hub ids as they are, the embedded model and local dirs by name."""
    path = Path(model)
    if path.is_absolute() or path.is_dir():
        if path.resolve() == TINY_MODEL_DIR:
            return TINY_MODEL_LABEL
        return f"{path.name} (local)"
    return model


# ----------------------------------------------------------------------------- measurements
def measurement(preset: str, lesson) -> dict | None:
    """The architecture-twin record of ``lesson`` on GPU ``preset``, or None when it was not measured or
    its preset values changed since (:mod:`utils.presets.measured`)."""
    lesson = _lesson_id(lesson)
    if preset not in PRESETS or lesson not in PRESETS[preset]["lessons"]:
        return None
    return measured.measurement(preset, lesson, PRESETS[preset]["lessons"][lesson])


def measured_note(preset: str, lesson) -> str:
    """The resolution table's "measured" line for a GPU preset (or "unmeasured")."""
    return measured.measured_note(measurement(preset, lesson))


def estimate(preset: str, lesson, params: dict | None = None, card: str | None = None) -> dict:
    """The upper-bound time of ``lesson`` on GPU ``preset``'s card, or on ``card`` (a ``hardware.CARDS`` name;
    :func:`utils.presets.sizing.estimate`), from the preset's values (``params``: the lesson's own, overrides
    included) and the current measurements."""
    lesson = _lesson_id(lesson)
    own = params or PRESETS[preset]["lessons"][lesson]
    return sizing.estimate(preset, lesson, lambda les: own if les == lesson else PRESETS[preset]["lessons"][les],
                           lambda les: measurement(preset, les), PRESETS[preset]["lessons"][lesson]["model"], card)


def estimate_note(preset: str, lesson, params: dict | None = None, gpu: dict | None = None) -> str:
    """The resolution table's "estimate" line: minutes on this GPU (``gpu``: ``runtime.gpu_info()``) when it is one of
    the cards the model knows, else on the preset's card, against the session budget."""
    here = hardware.card_of(gpu["name"]) if gpu else None
    e = estimate(preset, lesson, params, here)
    where = f"this {e['card']}" if here else f"the {e['card']}"
    if e["minutes"] is None:
        return f"none on {where}: unmeasured phases ({', '.join(e['unmeasured'])})"
    over = e["minutes"] > sizing.BUDGET_MINUTES
    return (f"at most {e['minutes']:.0f} min on {where} (budget {sizing.BUDGET_MINUTES}"
            f"{': over it' if over else ''}; upper bound, docs/gpu.md)")


# ----------------------------------------------------------------------------- hub / cache checks
def _is_local(value) -> bool:
    return isinstance(value, (str, os.PathLike)) and Path(value).exists()


def _hf_home() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(os.environ.get("HF_HOME", default)).expanduser()


def _in_local_cache(repo_id: str, repo_type: str) -> bool:
    """Whether a Hub repo was downloaded before (a snapshot in the hub cache, or a datasets cache dir)."""
    hub_cache = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
                     or _hf_home() / "hub").expanduser()
    snapshots = hub_cache / f"{repo_type}s--{repo_id.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return True
    if repo_type == "dataset":
        ds_cache = Path(os.environ.get("HF_DATASETS_CACHE") or _hf_home() / "datasets").expanduser()
        return (ds_cache / repo_id.replace("/", "___")).is_dir()
    return False


def _hub_downloads(params: dict) -> list[str]:
    """Hub repos this lesson would still have to download (not local paths, not cached)."""
    needed = []
    model = params.get("model")
    if model and not _is_local(model) and not _in_local_cache(str(model), "model"):
        needed.append(f"model {model}")
    dataset = params.get("dataset")
    if dataset and dataset != "synthetic" and not _is_local(dataset) and not _in_local_cache(str(dataset), "dataset"):
        needed.append(f"dataset {dataset}")
    return needed


def _hub_error(name: str, needed: list[str]) -> RuntimeError:
    offline = " (HF_HUB_OFFLINE is set)" if runtime.hub_offline() else ""
    return RuntimeError(
        f"Preset {name!r} needs the {' and the '.join(needed)} from the Hugging Face Hub, but "
        f"{runtime.hub_endpoint()} is unreachable{offline}. Options: set "
        f"HF_ENDPOINT={runtime.DEFAULT_MIRROR} before importing transformers (AutoDL / China), or call "
        "utils.runtime.use_hf_mirror(force=True) in the setup cell; download them beforehand "
        "(they are then found in the cache, or pass model=<local dir>); or use PRESET='tiny'.")


# ----------------------------------------------------------------------------- GPU checks
def preset_name(preset) -> str:
    """A preset as :func:`resolve` reads it: ``" T4-16G "`` -> ``"t4-16g"`` (None -> ``""``)."""
    return str(preset or "").strip().lower()


def needs_gpu(preset) -> bool:
    """Whether ``preset`` names a GPU preset (``t4-16g``, ``24g``, ``80g``; not ``tiny``, ``auto`` or None)."""
    return bool(PRESETS.get(preset_name(preset), {}).get("needs_gpu"))


def _gpu_presets() -> list[str]:
    """GPU presets, largest memory first."""
    return sorted((n for n, p in PRESETS.items() if p["needs_gpu"]), key=lambda n: -PRESETS[n]["min_gpu_gb"])


def _fitting_preset(info: dict, lesson: str | None = None) -> str:
    """The largest GPU preset this GPU can run (memory and bf16), else ``"tiny"``."""
    for name in _gpu_presets():
        spec = PRESETS[name]
        if lesson is not None and lesson not in spec["lessons"]:
            continue
        if info["total_gb"] >= spec["min_gpu_gb"] and (not spec["bf16"] or info["bf16"]):
            return name
    return "tiny"


def _check_gpu(name: str, spec: dict) -> None:
    """Raise RuntimeError if this machine cannot run the GPU preset ``name``."""
    info = runtime.gpu_info()
    if info is None:
        raise RuntimeError(f"Preset {name!r} needs a CUDA GPU, but torch found none (this run is on the CPU). "
                           "Use PRESET='tiny' (CPU, embedded model) or PRESET='auto'.")
    if info["total_gb"] < spec["min_gpu_gb"]:
        raise RuntimeError(f"Preset {name!r} needs at least {spec['min_gpu_gb']:g} GB of GPU memory, but "
                           f"{info['name']} has {info['total_gb']:g} GB. Use PRESET="
                           f"{_fitting_preset(info)!r} (or 'auto').")
    if spec["bf16"]:
        try:
            runtime.check_dtype(torch.bfloat16, "cuda")
        except ValueError as err:
            raise RuntimeError(f"Preset {name!r} trains in bf16: {err}") from None


def _preset_dtype(spec: dict, dev: str) -> torch.dtype:
    """The preset's explicit dtype, else bf16/fp16 as its ``bf16`` flag says, else the runtime policy."""
    if spec.get("dtype"):
        return runtime.as_dtype(spec["dtype"])
    if spec["bf16"] is True:
        return torch.bfloat16
    if spec["bf16"] is False and dev == "cuda":
        return torch.float16
    return runtime.dtype_policy(dev)


# ----------------------------------------------------------------------------- resolve
def _rehearsal(name: str, lesson: str) -> dict | None:
    """The values a rehearsal of GPU preset ``name`` replaces (model, dataset, sizes), when ``$COURSE_REHEARSAL``
    names a spec for that preset (``python -m utils rehearse`` writes it); else None."""
    path = os.environ.get(REHEARSAL_ENV)
    if not path or not PRESETS[name]["needs_gpu"]:
        return None
    import json
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"${REHEARSAL_ENV}={path!r} is not a readable rehearsal spec ({e}); unset it to run "
                           "the lessons for real.") from None
    if spec.get("preset") != name:
        return None
    return {"model": spec["model"], "dataset": spec["dataset"], **spec["lessons"].get(lesson, {})}


def _lesson_id(lesson) -> str:
    """``1`` or ``"1"`` or ``"01"`` -> ``"01"``."""
    text = str(lesson).strip()
    return f"{int(text):02d}" if text.isdigit() else text


def _auto(lesson: str, overrides: dict) -> str:
    """Pick a preset from the hardware and the Hub's reachability, printing why when it falls back."""
    info = runtime.gpu_info()
    if info is None:
        return "tiny"
    name = _fitting_preset(info, lesson)
    if name == "tiny":
        print(f"[presets] auto: {info['name']} ({info['total_gb']:g} GB) is too small for the GPU presets "
              "of this lesson; using 'tiny'.")
        return name
    needed = _hub_downloads({**PRESETS[name]["lessons"][lesson], **overrides})
    if needed and not runtime.hub_reachable():
        print(f"[presets] auto: the Hugging Face Hub ({runtime.hub_endpoint()}) is unreachable, so preset "
              f"{name!r} cannot download its model/data; using 'tiny' (set HF_ENDPOINT={runtime.DEFAULT_MIRROR} "
              "for the mirror).")
        return "tiny"
    spec, bf16 = PRESETS[name], ", bf16" if info["bf16"] else ", no bf16"
    print(f"[presets] auto: {info['name']} ({info['total_gb']:g} GB{bf16}) -> {name!r}, the largest preset it fits "
          f"(at least {spec['min_gpu_gb']:g} GB{' and bf16' if spec['bf16'] else ''})")
    return name


def resolve(preset: str = "auto", lesson: str = "01", **overrides) -> LessonConfig:
    """Resolve a preset for a lesson, check this machine can run it, and apply overrides.

    Args:
        preset: ``"auto"`` (choose by GPU memory, bf16 support and Hub reachability) or a
            name in :data:`PRESETS`.
        lesson: ``"01"`` .. ``"06"`` (an int works too).
        **overrides: lesson keys (e.g. ``max_steps=20``) or ``seed``; ``None`` values are
            ignored (notebook parameters default to None = "the preset decides").
            ``model=<local dir>`` loads a model without the Hub.
    Raises:
        ValueError: unknown preset, lesson or override key.
        RuntimeError: the preset needs hardware (or the Hub) this machine does not have.
    """
    name = preset_name(preset)
    if name != "auto" and name not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; choose one of {['auto', *PRESETS]}.")
    runtime.quiet_loading_bars()
    lesson = _lesson_id(lesson)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    seed = int(overrides.pop("seed", 0))

    if name == "auto":
        if lesson not in LESSONS:
            raise ValueError(f"No preset defines lesson {lesson!r}; defined: {sorted(LESSONS)}.")
        name = _auto(lesson, overrides)
    spec = PRESETS[name]
    if lesson not in spec["lessons"]:
        raise ValueError(f"Preset {name!r} does not define lesson {lesson!r}; it defines {sorted(spec['lessons'])}.")
    params = {k: list(v) if isinstance(v, list) else v for k, v in spec["lessons"][lesson].items()}
    unknown = sorted(set(overrides) - set(params))
    if unknown:
        raise ValueError(f"Unknown override(s) {unknown} for lesson {lesson}; valid keys: "
                         f"{sorted(params) + list(COMMON_KEYS)}.")
    params.update(overrides)

    dev = runtime.device()
    rehearsal = _rehearsal(name, lesson)
    if rehearsal is not None:   # the preset's code path on a CPU: a stand-in model and data, a step or two
        params.update(rehearsal)
        dev = "cpu"
        label = f"{spec['lessons'][lesson]['model']} (CPU rehearsal stand-in)"
        return LessonConfig(preset=name, lesson=lesson, device=dev, dtype=_preset_dtype(spec, dev),
                            model_label=label, params=params, seed=seed)
    if spec["needs_gpu"]:
        _check_gpu(name, spec)
        warning = measured.memory_warning(name, lesson, measurement(name, lesson), runtime.gpu_info())
        if warning:
            print(warning)
        needed = _hub_downloads(params)
        if needed and not runtime.hub_reachable():
            raise _hub_error(name, needed)
    return LessonConfig(preset=name, lesson=lesson, device=dev, dtype=_preset_dtype(spec, dev),
                        model_label=_model_label(str(params.get("model", ""))), params=params, seed=seed)
