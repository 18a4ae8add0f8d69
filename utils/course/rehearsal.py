"""Rehearsals: every lesson executed on a GPU preset's code path, on a CPU, in seconds.

A GPU preset (``t4-16g``, ``24g``, ``80g``) loads a Qwen model and GSM8K from the Hub and needs a CUDA
card, so the lessons' ``tiny`` runs never execute its branch of the code. A rehearsal does, without the Hub
and without a GPU: the lesson is executed by papermill with ``PRESET`` set to the GPU preset, and
:func:`utils.presets.resolve` (reading ``$COURSE_REHEARSAL``, a spec this module writes) keeps everything that
preset decides except three things:

* the model is a **stand-in**: the preset's architecture (``utils.course.twins.ARCHITECTURES``: Qwen2 for
  ``t4-16g``, Qwen3 for ``24g``/``80g``) with Qwen's real 151,936-token vocabulary, shrunk to CPU size
  (:data:`STANDIN_SIZES`), random weights fitted for a few hundred steps to the stand-in data's answers
  (:func:`standin_model`), saved with the model's **real tokenizer and chat template**
  (:mod:`utils.course.qwen_tokenizers`) and its real end-of-sequence ids;
* the data is a **GSM8K stand-in** in the real schema (``main/{train,test}-*.parquet``, ``question`` and
  ``answer`` with GSM8K's ``<<48/2=24>>`` calculator annotations and ``#### 24``), read by the lesson's own
  ``data.load_gsm8k``;
* the sizes are cut to a step or two (:data:`SHRINK`); every other knob (LoRA targets, QLoRA, gradient
  checkpointing, checkpoint intervals scaled to a step, loss types, ...) is the preset's.

What a CPU cannot run is replaced and said so in the report (:func:`gpu_only`): fp16 mixed precision needs CUDA
(``t4-16g`` runs in fp32 here); bf16 runs on the CPU as it is. ``--resume`` executes each lesson a second time
in the same folder, so the code that finds and reuses checkpoints and saved models runs too::

    python -m utils rehearse --preset t4-16g 24g 80g [--lessons 04 09] [--resume] [--out runs/rehearsal]

A rehearsal says nothing about quality or speed (the model is random); it catches a lesson that assumes the tiny
tokenizer, its template, its dataset or the CPU. ``tests/lessons/test_rehearsal.py`` runs it in ``make test``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

from .. import presets
from ..constants import REPO_ROOT, RUNS_DIR, TWIN_MEASUREMENTS, UTILS_DIR
from . import qwen_tokenizers, twins
from .run import GLIBC_HEAP_ENV

CACHE_DIR = Path(os.environ.get("COURSE_REHEARSAL_CACHE",
                                Path.home() / ".cache" / "post-training-course" / "rehearsal"))
BUILD_VERSION = "6"               # part of the cached folders' names: bump when a build changes
GSM8K_STANDIN_SIZE = {"train": 64, "test": 32}
FIT_STEPS = 600                   # the stand-in model's fit to the stand-in's answers and tool traces (standin_model)
# The rehearsal's kernel (set unless the user set them): one CPU thread, and glibc's heap keeps what it frees.
# A stand-in's logits span Qwen's 151,936-token vocabulary, a few hundred MB per batch: glibc maps each such block
# afresh (mmap) and unmaps it when freed, and every first touch of a fresh page faults (a two-thread process also
# pays the other core's TLB flush on every unmap). Measured on 2 cores, lesson 07 on 24g's path: alone on two
# threads 103 s (119 s user and 63 s system CPU time); two such rehearsals side by side 276 and 261 s (the second
# with this heap: 4 s of system time instead of 54); two side by side on one thread each with this heap, 98 and
# 100 s (95 s of CPU each). Nothing a rehearsal records is compared, so its thread count is free to choose.
KERNEL_ENV_DEFAULTS = {"OMP_NUM_THREADS": "1", **GLIBC_HEAP_ENV}

# What a rehearsal's kernel runs first (IPython's start-up folder, ``$IPYTHONDIR/profile_default/startup``, set
# unless the user set it): ``datasets`` names every ``map``'s result by a hash of the function and its arguments,
# pickling what they hold, Qwen's 151,936-token tokenizer among them, every time (12 % of lesson 03's rehearsal,
# measured). Nothing a rehearsal computes is cached for a later run, so each result gets a random name instead, as
# ``datasets`` gives one whose function cannot be hashed, and its caching is off (results in temporary files).
KERNEL_STARTUP = """# utils/course/rehearsal.py: a CPU rehearsal names datasets' results at random (no tokenizer hashed)
# Everything happens inside a function: a start-up file runs in the notebook's namespace, and a name left there
# (datasets) would let a lesson that forgot an import pass its rehearsal.
def _course_rehearsal_startup():
    try:
        import datasets.arrow_dataset
        import datasets.fingerprint

        def random_name(fingerprint, transform, transform_args):
            return datasets.fingerprint.generate_random_fingerprint()

        datasets.fingerprint.update_fingerprint = datasets.arrow_dataset.update_fingerprint = random_name
        datasets.disable_caching()
    except Exception as e:  # a rehearsal runs without it, only slower
        print(f"(rehearsal start-up: datasets' fingerprints stay: {type(e).__name__}: {e})")


_course_rehearsal_startup()
del _course_rehearsal_startup
"""
# And on a CPU without native bf16 matrix products, those of a bf16 preset are computed as a card computes them
# (utils/course/cpu_bf16.py, whose source the start-up file holds: it runs before the notebook can import utils).
KERNEL_STARTUP += f"""

def _course_rehearsal_bf16(source):
    try:
        import types

        module = types.ModuleType("_course_cpu_bf16")
        exec(compile(source, "utils/course/cpu_bf16.py", "exec"), module.__dict__)
        module.install()
    except Exception as e:  # a rehearsal runs without it, only slower
        print(f"(rehearsal start-up: bf16 products stay torch's: {{type(e).__name__}}: {{e}})")


_course_rehearsal_bf16({(UTILS_DIR / "course" / "cpu_bf16.py").read_text()!r})
del _course_rehearsal_bf16
"""

# The stand-in's shape: the architecture's own fields, shrunk (vocabulary, tied embeddings, norms, rope and
# the model type stay the preset's). head_dim is given because Qwen3's config sets it apart from the width.
STANDIN_SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, max_window_layers=2)

# A step or two of every lesson: each knob that sets a count, a length or a batch, cut (the rest stays the
# preset's). What the trainers check still holds: batch_size x steps_per_generation (TRL's default: grad_accum)
# = the generation batch, prompts_per_step x num_generations; a save every step, so that checkpoints exist.
_COMMON = dict(n_test=8, eval_batch_size=32, batch_size=2, grad_accum=1, max_steps=2, sft_steps=2, save_steps=1,
               logging_steps=1, max_new_tokens=64, max_length=256)   # 64 tokens: a whole stand-in answer
SHRINK = {
    "01": dict(n_train=32, max_length=512),   # the presets' own; lesson 09's trace SFT takes this recipe (below)
    "02": dict(n_train=32, packed_batch_size=1, throughput_steps=2, eval_steps=1),
    "03": dict(n_prompts=16, n_heldout=8, n_samples=4, betas=[0.1]),   # the sweep: the run already trained
    "04": dict(n_train=16, num_generations=2, prompts_per_step=2, batch_size=4, max_completion_length=64,
               hack_steps=1, hack_prompts=1, hand_steps=8, hand_prompts=1, sampled_eval_prompts=4, sweep_prompts=4,
               sweep_generations=[2, 4], sweep_temperatures=[0.7, 1.0]),
    "05": dict(n_train=64, num_generations=4, prompts_per_step=2, batch_size=4, steps_per_generation=2,
               max_completion_length=64, soft_punish_cache=4, temperature=0.7,   # the stand-in rambles at 1.0
               clip_probe_prompts=2, clip_probe_steps=2),
    "06": dict(ppl_problems=8, outlier_prompts=4, qlora_steps=2),
    "07": dict(n_prompts=16, n_heldout=8, n_samples=4, rl_pool=32, rl_iterations=2, rl_prompts=4, rl_samples=2,
               rl_minibatches=1, rl_micro_batch=2, overopt_iterations=6, overopt_prompts=4),   # six windows
    "08": dict(ttc_problems=8, ttc_samples=8, prm_problems=8, prm_samples=2, score_batch_size=32, beam_width=2,
               beam_expand=2, beam_max_steps=2, step_tokens=8, refine_rounds=1, budgets=[8, 16]),
    # 09: a Qwen prompt with the calculator offered is 256-272 tokens, and a rollout a call, its result and an answer;
    # at temperature 1 the stand-in's samples ramble (as 05's) and TRL's loop would never see a call to run. A
    # rehearsal's cuts win over a lesson's own arguments (presets.resolve): the trace SFT gets lesson 01's cuts, whose
    # max_length must hold 09's traces (a test says so)
    "09": dict(n_train=16, max_turns=2, num_generations=2, prompts_per_step=2, batch_size=4, max_length=512,
               max_completion_length=128, hack_steps=1, hack_prompts=2, turn_prompts=4, sft_batch_size=2,
               sft_grad_accum=1, temperature=0.7),
}


def shrink(lesson: str) -> dict:
    """The knobs a rehearsal of ``lesson`` cuts: the common cuts the lesson has, then its own."""
    knobs = presets.LESSONS[lesson]
    return {**{k: v for k, v in _COMMON.items() if k in knobs}, **SHRINK[lesson]}


def gpu_only(preset: str) -> list[str]:
    """What of ``preset``'s code path a CPU rehearsal replaces, in words (the report prints it)."""
    spec = presets.PRESETS[preset]
    notes = ["a stand-in of the model's architecture at CPU size, fitted to the stand-in data in seconds: no "
             "accuracy, speed or memory of the real model is measured"]
    if spec["bf16"] is False:
        notes.append("fp16 mixed precision needs CUDA: the model and training run in fp32 here")
    else:
        notes.append("bf16 runs on the CPU as on the card (autocast and bf16 weights)")
        from . import cpu_bf16

        if cpu_bf16.needed():
            notes.append("this CPU has no native bf16 matrix product (AVX-512 bf16 or AMX): each is computed in "
                         "fp32 from bf16 operands and rounded to bf16, as a card does (utils/course/cpu_bf16.py)")
    notes.append("bitsandbytes' 4-bit and 8-bit layers run on its CPU backend, not its CUDA kernels")
    notes.append(f"GPU memory and time: {TWIN_MEASUREMENTS.relative_to(REPO_ROOT)} holds what a GPU measured")
    return notes


# ----------------------------------------------------------------------------- the stand-ins
def _cached(name: str, build, cache_dir: Path | None) -> Path:
    """``cache_dir/name``, built by ``build(tmp_folder)`` on first use (``qwen_tokenizers.build_once``)."""
    def build_and_mark(tmp: Path):
        build(tmp)
        (tmp / "done").write_text("built\n")

    return qwen_tokenizers.build_once(Path(cache_dir or CACHE_DIR) / name, build_and_mark, "done")


def _fit_batches(tokenizer, problems, steps: int, batch: int, traces=()):
    """The training data of :func:`_fit_answers`: ``(used, batches)``, the sorted token ids the examples use and
    ``steps`` batches ``(input_ids, attention_mask, labels)`` of ``batch`` random examples, right-padded, with labels
    indexing ``used`` (every token after the prompt; the prompt and padding -100). An example is a problem of
    ``problems`` with its answer in the chat template, or one of ``traces`` as lesson 09's tool conversation (its
    answer's calls to the calculator, their results and its last turn: the tool turns are fitted too, which the
    lesson's SFT leaves out, harmless where a turn ends at the end-of-turn token), rendered as the lesson's rollouts
    render it: the calculator offered (``tools=``), with ``agent.rollout_template`` (Qwen3: TRL's training template)."""
    import torch

    from .. import agent, data
    from ..tools import calculator

    examples = []
    for p in problems:
        messages = data.to_messages(p)
        prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True,
                                               return_dict=False)
        examples.append((tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False), len(prompt)))
    template = agent.rollout_template(tokenizer) if traces else None
    for p in traces:
        messages = agent.tool_trace(p, calculator)
        prompt = agent.prompt_ids(tokenizer, messages[:1], [calculator], template)
        ids = list(tokenizer.apply_chat_template(messages, tools=[calculator], chat_template=template, tokenize=True,
                                                 return_dict=False))
        if ids[:len(prompt)] != prompt:
            raise ValueError("a tool trace's rendering does not start with its prompt's: the template is not "
                             "prefix-preserving (agent.rollout_template)")
        examples.append((ids, len(prompt)))
    used = sorted({t for ids, _ in examples for t in ids})
    index = {t: i for i, t in enumerate(used)}

    def batches():
        g = torch.Generator().manual_seed(0)
        for _ in range(steps):
            picked = [examples[i] for i in torch.randint(len(examples), (batch,), generator=g).tolist()]
            width = max(len(ids) for ids, _ in picked)
            input_ids = torch.full((batch, width), tokenizer.pad_token_id)
            mask = torch.zeros((batch, width), dtype=torch.long)
            labels = torch.full((batch, width), -100)
            for r, (ids, n_prompt) in enumerate(picked):
                input_ids[r, :len(ids)], mask[r, :len(ids)] = torch.tensor(ids), 1
                labels[r, n_prompt:len(ids)] = torch.tensor([index[t] for t in ids[n_prompt:]])
            yield input_ids, mask, labels

    return used, batches()


def _fit_answers(model, tokenizer, problems, steps: int, lr: float = 3e-3, batch: int = 16, traces=()) -> float:
    """Fit ``model`` (in place) to the answers of ``problems`` in its chat template, and to those of ``traces`` as
    lesson 09's tool conversations: the prompt-masked next-token loss over the vocabulary the data uses only (a
    few hundred of the 151,936 rows, so that a step costs milliseconds; :func:`_fit_batches`). Returns the last loss."""
    import torch

    used, batches = _fit_batches(tokenizer, problems, steps, batch, traces)
    rows = torch.tensor(used)
    # AdamW over the whole (151,936-row) embedding was half of the fit's time, yet only the rows of the tokens the
    # data uses (and the padding's) ever get a gradient: Adam leaves every other row's moments at zero, so all it
    # does there is AdamW's decoupled decay. Adam runs on a copy of those rows, and the decay on the rest, with the
    # same operations as AdamW's on the whole matrix: the weights are bit for bit those of AdamW on all rows.
    embedding = model.get_input_embeddings().weight
    if model.lm_head.weight is not embedding:
        raise ValueError("_fit_answers fits a model with tied embeddings (both stand-ins tie theirs)")
    tracked = torch.tensor(sorted({*used, tokenizer.pad_token_id}))
    live = torch.nn.Parameter(embedding.detach()[tracked].clone())
    opt = torch.optim.AdamW([p for p in model.parameters() if p is not embedding] + [live], lr=lr)
    decay = 1 - lr * opt.defaults["weight_decay"]
    for input_ids, mask, labels in batches:
        hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state[:, :-1]
        logits = hidden @ model.lm_head.weight[rows].T
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, len(used)), labels[:, 1:].reshape(-1))
        loss.backward()
        live.grad, embedding.grad = embedding.grad[tracked], None
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            embedding.mul_(decay)
            embedding[tracked] = live
    return loss.item()


def _off_by_one(problem: dict) -> dict:
    """``problem`` with its final answer one more than the truth (``#### 8`` for ``#### 7``)."""
    head, final = problem["answer"].rsplit("#### ", 1)
    return {**problem, "answer": f"{head}#### {int(final) + 1}"}


def standin_model(model_id: str, cache_dir: Path | None = None) -> Path:
    """A folder that loads like ``model_id`` from the Hub: its architecture at :data:`STANDIN_SIZES`, its real
    tokenizer and chat template, its real end-of-sequence and padding ids, fp32 weights drawn at random (seed 0)
    and then fitted for :data:`FIT_STEPS` steps to the GSM8K stand-in's answers (:func:`_fit_answers`).
    The fit makes it behave as a real model does and a random one never does: it writes the answer format and
    ends its turn. It sees every problem of both splits twice, with its answer and with the final number one
    off, so that its samples of a problem disagree (right and wrong about as often): preference pairs and
    groups with reward variance occur as in a real run, on training and held-out problems alike. It also sees
    each of them as lesson 09's tool conversation (a call to the calculator, its result, the answer), so that
    with the calculator offered it calls it, as lesson 09's trace model does: the lesson's rehearsal then runs
    its rollouts' tool turns and TRL's multi-turn loop (a step or two of the lesson's own SFT cannot teach that)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    def build(out: Path):
        tok = qwen_tokenizers.qwen_tokenizer(model_id)
        overrides = {k: v for k, v in STANDIN_SIZES.items() if k != "max_window_layers"
                     or "max_window_layers" in twins.ARCHITECTURES[model_id]}
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(twins.twin_config(model_id, **overrides), dtype=torch.float32)
        seen = gsm8k_problems("train") + gsm8k_problems("test")
        both = seen + [_off_by_one(p) for p in seen]
        _fit_answers(model, tok, both, FIT_STEPS, traces=both)
        eos = twins.ARCHITECTURES[model_id]["eos_token_id"]
        model.generation_config.eos_token_id = sorted({eos, tok.eos_token_id})
        model.generation_config.pad_token_id = tok.pad_token_id
        model.save_pretrained(out)
        tok.save_pretrained(out)

    slug = model_id.replace("/", "--")
    return _cached(f"{slug}-standin-v{BUILD_VERSION}-transformers{transformers.__version__}", build, cache_dir)


_CALC = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")


def gsm8k_answer(answer: str) -> str:
    """A synthetic worked answer written as GSM8K writes one: ``4 * 11 = <<4*11=44>>44``."""
    return _CALC.sub(lambda m: f"{m[1]} {m[2]} {m[3]} = <<{m[1]}{m[2]}{m[3]}={m[4]}>>{m[4]}", answer)


def gsm8k_problems(split: str) -> list[dict]:
    """The GSM8K stand-in's rows of ``split``: synthetic one-step problems (answers of 22-34 Qwen tokens, whole
    within a rehearsal's 64 new tokens) with their answers in GSM8K's format."""
    from .. import data

    return [{"question": r["question"], "answer": gsm8k_answer(r["answer"])}
            for r in data.make_problems(GSM8K_STANDIN_SIZE[split], split, seed=0, difficulty=1)]


def gsm8k_standin(cache_dir: Path | None = None) -> Path:
    """A folder laid out like the Hub's ``openai/gsm8k`` (config ``main``: one parquet file per split, the
    columns ``question`` and ``answer``), holding :func:`gsm8k_problems`."""
    def build(out: Path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        (out / "main").mkdir()
        for split in GSM8K_STANDIN_SIZE:
            rows = gsm8k_problems(split)
            table = pa.table({"question": [r["question"] for r in rows], "answer": [r["answer"] for r in rows]})
            pq.write_table(table, out / "main" / f"{split}-00000-of-00001.parquet")

    return _cached(f"gsm8k-standin-v{BUILD_VERSION}", build, cache_dir)


def write_spec(preset: str, path: Path, cache_dir: Path | None = None) -> Path:
    """Write the spec ``utils.presets.resolve`` reads from ``$COURSE_REHEARSAL``; return ``path``."""
    preset = presets.preset_name(preset)
    if not presets.needs_gpu(preset):
        raise ValueError(f"Only the GPU presets are rehearsed; got {preset!r} (choose from {presets._gpu_presets()})")
    model_id = presets.PRESETS[preset]["lessons"]["01"]["model"]
    spec = {"preset": preset, "model": str(standin_model(model_id, cache_dir)),
            "dataset": str(gsm8k_standin(cache_dir)),
            "lessons": {lesson: shrink(lesson) for lesson in presets.LESSONS}}
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(spec, indent=1))
    partial.replace(path)   # rehearsals side by side share the file: a reader never sees half of it
    return path


# ----------------------------------------------------------------------------- running
def rehearse(preset: str, lessons, out_dir: Path, resume: bool = False, cache_dir: Path | None = None) -> list[dict]:
    """Execute ``lessons`` (notebook paths) on ``preset``'s code path into ``out_dir``; with ``resume``, each a
    second time with ``RESUME=True`` in the same folder. Returns one result per execution (see
    :func:`utils.course.run.execute_lesson`), each with ``pass`` ("first" or "resume")."""
    from .run import execute_lesson

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = write_spec(preset, out_dir / "rehearsal.json", cache_dir)
    results = []
    saved = os.environ.get(presets.REHEARSAL_ENV)
    defaults = {**KERNEL_ENV_DEFAULTS, "IPYTHONDIR": str(kernel_startup(cache_dir))}
    unset = [key for key in defaults if key not in os.environ]
    os.environ.update({key: defaults[key] for key in unset})   # the kernel inherits them
    os.environ[presets.REHEARSAL_ENV] = str(spec.resolve())
    try:
        for notebook in lessons:
            for which in ("first", "resume") if resume else ("first",):
                result = execute_lesson(Path(notebook), out_dir, preset, resume=which == "resume")
                results.append({**result, "pass": which})
                if result["status"] != "ok":
                    break
    finally:
        for key in unset:
            os.environ.pop(key, None)
        if saved is None:
            os.environ.pop(presets.REHEARSAL_ENV, None)
        else:
            os.environ[presets.REHEARSAL_ENV] = saved
    return results


def kernel_startup(cache_dir: Path | None = None) -> Path:
    """An IPython folder whose start-up runs :data:`KERNEL_STARTUP` (written when missing or changed)."""
    folder = Path(cache_dir or CACHE_DIR) / "ipython"
    script = folder / "profile_default" / "startup" / "00-rehearsal.py"
    if not script.is_file() or script.read_text() != KERNEL_STARTUP:
        script.parent.mkdir(parents=True, exist_ok=True)
        partial = script.with_name(f".{script.name}.{os.getpid()}")
        partial.write_text(KERNEL_STARTUP)
        partial.replace(script)                       # two rehearsals side by side: each sees a whole file
    return folder


def report(preset: str, results: list[dict]) -> str:
    """The rehearsal's report: what was replaced, then one line per execution."""
    lines = [f"Rehearsal of {preset} ({presets.PRESETS[preset]['lessons']['01']['model']}) on the CPU; replaced:"]
    lines += [f"  - {note}" for note in gpu_only(preset)]
    for r in results:
        err = r.get("error") or {}
        where = "" if r["status"] == "ok" else f": cell {err.get('cell')}: {err.get('ename')}: {err.get('evalue')}"
        lines.append(f"  {r['lesson']:<24} {r['pass']:<6} {r['status']:<6} {r['wall_s'] or 0:6.1f} s{where}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from ..constants import NOTEBOOKS_DIR
    from .lessons import find_lessons
    from .run import log_to

    p = argparse.ArgumentParser(prog="python -m utils rehearse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", nargs="+", default=presets._gpu_presets()[::-1], help="GPU presets (default: all)")
    p.add_argument("--lessons", nargs="*", default=[], help="lessons (default: all)")
    p.add_argument("--resume", action="store_true", help="execute each lesson again with RESUME=True")
    p.add_argument("--out", type=Path, default=RUNS_DIR / "rehearsal", help="output folder (one per preset inside)")
    args = p.parse_args(argv)
    lessons = find_lessons(args.lessons, NOTEBOOKS_DIR)
    failed = 0
    for preset in args.preset:
        out = args.out / preset
        out.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with log_to(out / "run.log"):
            results = rehearse(preset, lessons, out, resume=args.resume)
        print(report(preset, results) + f"\n  total {time.perf_counter() - start:.0f} s", flush=True)
        failed += sum(r["status"] != "ok" for r in results)
    return 1 if failed else 0
