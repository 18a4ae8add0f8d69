"""Supervised fine-tuning for the lessons that start from an SFT model (03-06) and for lesson 02.

Lesson 01 writes the loss mask and the padded batch by hand (its exercises); the helpers here do
the same jobs with the libraries, for the lessons that only need an SFT model:
:func:`tokenize_sft_example` takes the mask from the chat template's ``{% generation %}`` markers,
as TRL's ``assistant_only_loss`` does; :func:`pack` batches examples padding-free;
:func:`train_sft` / :func:`sft_checkpoint` train lesson 01's recipe with ``transformers.Trainer``.

Loss masking convention (lesson 01's, and TRL's ``assistant_only_loss`` with a chat template that
marks the assistant turn): the loss covers the assistant's content and the ``<|im_end|>`` that
closes it -- the model must learn to *stop* -- and nothing else: no system/user tokens, no
``<|im_start|>assistant\\n`` header, no padding.
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

from . import runtime
from .training import last_checkpoint, quiet, trainer_kwargs, training_arguments, with_lora

IGNORE_INDEX = -100  # positions with this label are skipped by torch.nn.functional.cross_entropy


def _training_template(tokenizer) -> str | None:
    """The chat template to read the assistant mask from: None (the tokenizer's own) when it has
    ``{% generation %}`` markers, else TRL's training version of it (Qwen2.5 and Qwen3 among others)."""
    from trl.chat_template_utils import get_training_chat_template

    try:
        return get_training_chat_template(tokenizer)
    except ValueError as err:
        raise ValueError(f"the tokenizer's chat template has no {{% generation %}} markers and TRL has no training "
                         f"version of it ({err}); set tokenizer.chat_template to one that marks the assistant turn "
                         "with {% generation %} ... {% endgeneration %}") from None


def tokenize_sft_example(tokenizer, messages: list[dict], max_length: int) -> dict:
    """Token ids and labels for one conversation whose last message is the assistant's.

    The labels are the chat template's assistant mask (``apply_chat_template(...,
    return_assistant_tokens_mask=True)``, the positions TRL's ``assistant_only_loss`` trains), and the
    sequence ends at the ``<|im_end|>`` that closes the last assistant turn. On the tiny model's
    template (and on Qwen3's) these are exactly lesson 01's hand-made labels; with TRL's training
    version of Qwen2.5's template the mask also covers the line break after
    ``<|im_start|>assistant`` (``tests/library/test_sft.py`` checks both).

    Args:
        tokenizer: a tokenizer with a chat template.
        messages: ``[..., {"role": "assistant", "content": ...}]``.
        max_length: truncate to at most this many tokens.
    Returns:
        ``{"input_ids": list[int], "labels": list[int]}`` of equal length L <= max_length;
        ``labels[i] == IGNORE_INDEX`` outside the assistant's turn, ``input_ids[i]`` in it.
    """
    enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                        chat_template=_training_template(tokenizer))
    ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    closing = [i for i, (t, m) in enumerate(zip(ids, mask)) if m and t == end]
    if not closing:
        raise ValueError("no <|im_end|> inside the assistant's turn: the last message must be the assistant's")
    input_ids = ids[:closing[-1] + 1][:max_length]
    labels = [t if m else IGNORE_INDEX for t, m in zip(input_ids, mask)]
    return {"input_ids": input_ids, "labels": labels}


def first_fit(lengths: list[int], max_length: int) -> list[list[int]]:
    """First-fit decreasing bin packing: the longest item goes into the first row with room.

    Args:
        lengths: the items' lengths, each at most ``max_length``.
        max_length: capacity of a row.
    Returns:
        the rows, each the list of its items' indices in the order they were placed (longest first;
        ties in input order).
    """
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = next((j for j, f in enumerate(fill) if f + lengths[i] <= max_length), None)
        if r is None:                                   # no row has room: open a new one
            r = len(rows)
            rows.append([])
            fill.append(0)
        rows[r].append(i)
        fill[r] += lengths[i]
    return rows


def pack(examples: list[dict], pad_token_id: int, max_length: int) -> dict:
    """Pack a batch of tokenized examples into few rows, padding-free, with the loss of a padded batch.

    First-fit decreasing (:func:`first_fit`): the longest example goes into the first row with room,
    up to ``max_length`` tokens per row. Each example keeps its own positions (``position_ids`` restart
    at 0), and with no ``attention_mask`` transformers reads those restarts as sequence
    boundaries and masks attention across them (``masking_utils.find_packed_sequence_indices``),
    so no token sees another example. The label of each example's first token is set to
    ``IGNORE_INDEX``: in a padded batch (lesson 01's ``collate``) nothing predicts a row's first
    token, here the previous example's last token would. Same tokens under the loss, same mean: the
    gradient of the padded batch, with fewer padded positions to compute (about 40 % fewer on the tiny
    lessons' mix of short and long answers).

    Args:
        examples: dicts with ``input_ids`` and ``labels`` (lists of ints, length L_i <= max_length).
        pad_token_id: id used to fill the end of a row.
        max_length: capacity of a row.
    Returns:
        ``input_ids`` (R, T) int64, ``labels`` (R, T) int64 (``IGNORE_INDEX`` on padding and on
        each example's first token), ``position_ids`` (R, T) int64 (0, 1, ... per example; the
        padding of a row counts on as one more sequence), and ``use_cache=False`` (with a KV cache
        the model would not look for packed sequences); R <= B rows, T = the fullest row's length.
    """
    if any(len(e["input_ids"]) > max_length for e in examples):
        raise ValueError(f"an example is longer than max_length={max_length}; truncate it first")
    rows = [[examples[i] for i in row] for row in first_fit([len(e["input_ids"]) for e in examples], max_length)]
    T = max(sum(len(e["input_ids"]) for e in row) for row in rows)
    ids = torch.full((len(rows), T), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), T), IGNORE_INDEX, dtype=torch.long)
    pos = torch.zeros((len(rows), T), dtype=torch.long)
    for r, row in enumerate(rows):
        start = 0
        for e in row:
            n = len(e["input_ids"])
            ids[r, start:start + n] = torch.tensor(e["input_ids"])
            labels[r, start + 1:start + n] = torch.tensor(e["labels"][1:])
            pos[r, start:start + n] = torch.arange(n)
            start += n
        pos[r, start:] = torch.arange(T - start)
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "use_cache": False}


def completion_loss(model, examples: list[dict], pad_token_id: int, batch_size: int = 8) -> float:
    """Mean cross-entropy per labelled token over ``examples`` (tokenized as above), without gradients.

    Batches are right-padded (``torch.nn.utils.rnn.pad_sequence``) and weighted by their number of
    labelled tokens, so the result does not depend on ``batch_size``.
    """
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            chunk = examples[i:i + batch_size]
            columns = (([torch.tensor(e["input_ids"]) for e in chunk], pad_token_id),
                       ([torch.tensor(e["labels"]) for e in chunk], IGNORE_INDEX),
                       ([torch.ones(len(e["input_ids"]), dtype=torch.long) for e in chunk], 0))
            ids, labels, mask = (pad_sequence(rows, batch_first=True, padding_value=value).to(device)
                                 for rows, value in columns)
            n = int((labels[:, 1:] != IGNORE_INDEX).sum())
            total += model(input_ids=ids, attention_mask=mask, labels=labels).loss.item() * n
            count += n
    return total / max(count, 1)


def sft_config(cfg, output_dir: str | Path, **overrides):
    """``trl.SFTConfig`` for a resolved preset, with every precision choice explicit.

    ``SFTConfig`` defaults to ``bf16=True`` whenever ``fp16`` is unset (even on a CPU or a T4)
    and to gradient checkpointing on; here both follow the preset (``cfg.dtype``,
    ``cfg.gradient_checkpointing``), so a run never changes precision silently.
    ``overrides`` are any ``SFTConfig`` fields (e.g. ``packing=True``, ``assistant_only_loss=True``).
    """
    from trl import SFTConfig

    return SFTConfig(**{**trainer_kwargs(cfg, output_dir), "max_length": cfg.max_length, **overrides})


class TokenCounter:
    """Count what a data collator batches, and time the training steps it feeds.

    Wraps a collator: ``tokens`` (real tokens of the examples) and ``positions`` (cells of
    the batch tensors, padding included) accumulate over every batch, so
    ``padding_fraction`` = 1 - tokens / positions. ``pairs`` counts the query-key pairs of
    attention with a dense mask (SDPA or eager: a CPU, a T4), T**2 per row of a (B, T) batch,
    masked or not, so ``pairs_per_token`` is the attention work per real token, whatever the
    clock says (taught in lesson 02). Added as a trainer callback it also
    timestamps the end of every optimizer step, and ``tokens_per_s`` is the real tokens of
    steps 2..N over their wall time: the first step (lazy initialisation, warm-up) is left
    out. Usage::

        counter = trainer.data_collator = TokenCounter(trainer.data_collator)
        trainer.add_callback(counter.callback)
        trainer.train()
        counter.tokens_per_s, counter.padding_fraction
    """

    def __init__(self, collator):
        from transformers import TrainerCallback

        self.collator = collator
        self.batch_tokens: list[int] = []   # per collated batch, in order
        self.positions = 0
        self.pairs = 0
        self.step_ends: list[float] = []    # time.perf_counter() at the end of each optimizer step
        self.grad_accum = 1
        counter = self

        class _Clock(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                counter.grad_accum = args.gradient_accumulation_steps

            def on_step_end(self, args, state, control, **kwargs):
                counter.step_ends.append(time.perf_counter())

        self.callback = _Clock()

    def __call__(self, examples):
        batch = self.collator(examples)
        self.batch_tokens.append(sum(len(e["input_ids"]) for e in examples))
        rows, length = batch["input_ids"].shape
        self.positions += rows * length
        self.pairs += rows * length ** 2
        return batch

    @property
    def tokens(self) -> int:
        return sum(self.batch_tokens)

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.tokens / self.positions if self.positions else 0.0

    @property
    def pairs_per_token(self) -> float:
        return self.pairs / self.tokens if self.tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Real tokens per second over steps 2..N (needs ``trainer.add_callback(counter.callback)``)."""
        n = len(self.step_ends)
        if n < 2:
            raise ValueError("tokens_per_s needs at least 2 timed steps: add counter.callback to the trainer "
                             "and train for 2 steps or more")
        ga = self.grad_accum
        timed = sum(self.batch_tokens[ga:n * ga])  # the batches of steps 2..n (a prefetched extra batch is left out)
        return timed / (self.step_ends[-1] - self.step_ends[0])


def train_sft(model, tokenizer, problems: list[dict], cfg, output_dir: str | Path, resume: bool = False,
              callbacks=None, examples: list[dict] | None = None, **overrides):
    """Chat-format SFT with ``transformers.Trainer``, the loss mask above and :func:`pack`ed batches.

    Trains all weights when the preset says ``full_finetune``, else LoRA adapters. ``examples``: already
    tokenized ``{"input_ids", "labels"}`` to train on instead of ``problems``' chat-format answers (lesson 09's
    tool traces), with the same recipe.
    Returns the trainer (``trainer.model`` is trained; ``trainer.state.log_history``
    holds the curves). With ``resume=True`` it continues from the newest checkpoint
    in ``output_dir`` when there is one. ``callbacks``: extra ``TrainerCallback``s (e.g. a step clock).
    """
    from transformers import Trainer

    from . import data

    if not cfg.full_finetune:
        model = with_lora(model, cfg)
        overrides.setdefault("learning_rate", cfg.lora_learning_rate)
    train = examples if examples is not None else [
        tokenize_sft_example(tokenizer, data.to_messages(p), cfg.max_length) for p in problems]
    trainer = quiet(Trainer(model=model, args=training_arguments(cfg, output_dir, **overrides), train_dataset=train,
                            data_collator=lambda b: pack(b, tokenizer.pad_token_id, cfg.max_length),
                            callbacks=callbacks))
    trainer.train(resume_from_checkpoint=last_checkpoint(output_dir) if resume else None)
    return trainer


SHARED_DIR = "sft-models"   # beside the lessons' own folders: runs/<preset>/sft-models/<recipe digest>/
RNG_FILE = "rng-state.json"  # the random generators as training left them (restored where the model is loaded)
SHARED_FROM = "shared-from.txt"  # in a lesson's sft-model taken from sft-models/: the digest it came from


def recipe_digest(cfg, tokenizer, problems: list[dict]) -> str:
    """A digest of everything :func:`train_sft` makes a model from: the resolved preset (steps, batch, rates,
    seed, dtype, device, base model), the training problems, the tokenizer (vocabulary and chat template),
    the base model's files when it is a local folder, the library versions, the thread count, and the source
    of the modules training reads (this one, :mod:`utils.training`, :mod:`utils.data` which writes the
    conversations, :mod:`utils.runtime` which seeds). Two lessons with the same digest train the same model, bit
    for bit. (A Hub model is named by its id: a new upload under the same id is not seen; delete
    ``runs/<preset>/sft-models/`` after changing a model's revision.)"""
    import accelerate
    import datasets
    import peft
    import transformers
    import trl

    from . import data, training

    h = hashlib.sha256()

    def add(value) -> None:
        h.update(json.dumps(value, sort_keys=True, default=str).encode())
        h.update(b"\0")

    add(cfg.to_dict())
    add(problems)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    add(backend.to_str() if backend is not None else sorted(tokenizer.get_vocab().items()))
    add([tokenizer.chat_template, tokenizer.all_special_tokens])
    model = Path(str(cfg.model))
    if model.is_dir():   # a local model: its files' contents (a large one: their sizes and times)
        add(sorted((f.name, hashlib.sha256(f.read_bytes()).hexdigest() if f.stat().st_size <= 64 << 20
                    else (f.stat().st_size, f.stat().st_mtime_ns)) for f in model.iterdir() if f.is_file()))
    add([torch.__version__, transformers.__version__, peft.__version__, trl.__version__, accelerate.__version__,
         datasets.__version__, torch.get_num_threads()])
    add([inspect.getsource(m) for m in (training, data, runtime, sys.modules[__name__])])
    return h.hexdigest()[:20]


def sft_checkpoint(cfg, tokenizer, problems: list[dict], output_dir: str | Path, resume: bool = False) -> Path:
    """The SFT starting point of the later lessons: lesson 01's recipe, trained and saved once.

    ``cfg`` is a resolved lesson-01 preset (``presets.resolve(preset, lesson="01", max_steps=...)``).
    Trains ``cfg.model`` on ``problems`` with :func:`train_sft` (checkpoints in ``output_dir/sft``),
    folds a LoRA adapter into the weights (GPU presets) and saves the model to
    ``output_dir/sft-model``. With ``resume=True`` a model already saved there is reused as is.

    Lessons that start from the same recipe (lessons 04 and 05; 06 and 08; 03 and 07) share it: a copy goes to
    ``output_dir/../sft-models/<digest>/`` (:func:`recipe_digest`: preset, problems, tokenizer, base model,
    libraries and this code), and a later lesson whose digest matches takes that copy into its own
    ``sft-model`` instead of training again (run in one folder, as ``python -m utils run`` and the tests do;
    on a T4 this saves the ten minutes of a 300-step SFT). Copies are hard links where the file system allows
    (no second copy of the weights on disk); a folder is emptied before it is written, so writing one never
    changes another through a shared file. The copy is bit-for-bit what training would give (a test holds it),
    and the random generators are left as training leaves them (saved beside the model), so what the lesson
    samples next is the same either way.
    Returns the model's directory: load the model from it, never reuse the trained object (trainers patch
    the ``forward`` of the model they are given).
    """
    sft_dir = Path(output_dir) / "sft-model"
    if resume and (sft_dir / "config.json").exists():
        return _loaded(sft_dir)
    shared = Path(output_dir).parent / SHARED_DIR / recipe_digest(cfg, tokenizer, problems)
    with _training_lock(shared):      # another lesson training this recipe in this folder: wait, then take its model
        return _trained_or_shared(cfg, tokenizer, problems, output_dir, sft_dir, shared)


@contextlib.contextmanager
def _training_lock(shared: Path):
    """Hold ``shared``'s lock file while the model is looked for, trained and shared: two lessons executed side by
    side in one folder (``make test``, two terminals) train a recipe once, the second waiting for the first. No
    lock where the file system or the platform has none (``fcntl``: Linux, macOS)."""
    try:
        import fcntl
        shared.parent.mkdir(parents=True, exist_ok=True)
        handle = open(shared.with_name(f".{shared.name}.lock"), "w")
    except (ImportError, OSError):
        handle = None
    if handle is None:
        yield
        return
    with handle:
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:                    # another process holds it: say so, then wait
                print(f"SFT start: another run in this folder is training the same recipe; waiting for its model "
                      f"({SHARED_DIR}/{shared.name})")
                fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:                                # e.g. a file system without locks: go on without
            pass
        yield


def _trained_or_shared(cfg, tokenizer, problems, output_dir, sft_dir: Path, shared: Path) -> Path:
    from transformers import AutoModelForCausalLM

    if (shared / "config.json").exists() and (shared / RNG_FILE).exists():
        print(f"SFT start: the same recipe, data and base model as an earlier lesson's; loading its model from "
              f"{SHARED_DIR}/{shared.name} instead of training again")
        shutil.rmtree(sft_dir, ignore_errors=True)
        _link_tree(shared, sft_dir)
        (sft_dir / SHARED_FROM).write_text(shared.name + "\n")
        return _loaded(sft_dir)
    shutil.rmtree(sft_dir, ignore_errors=True)       # fresh files: never write through a link into a shared copy
    base = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=cfg.dtype).to(cfg.device)
    runtime.seed_everything(cfg.seed)   # LoRA's initial weights (GPU presets) drawn the same in every lesson
    trained = train_sft(base, tokenizer, problems, cfg, Path(output_dir) / "sft").model
    if hasattr(trained, "merge_and_unload"):
        trained = trained.merge_and_unload()
    trained.save_pretrained(sft_dir)
    (sft_dir / RNG_FILE).write_text(json.dumps(runtime.rng_state()))
    shared.parent.mkdir(parents=True, exist_ok=True)
    staging = shared.with_name(f".{shared.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _link_tree(sft_dir, staging)
        os.replace(staging, shared)                   # atomic: a reader sees the whole model or none
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        if not (shared / "config.json").exists():     # else another run wrote it first: theirs is the same model
            print(f"(the SFT model could not be shared in {SHARED_DIR}/, {type(e).__name__}: {e}; "
                  "later lessons will train their own)")
    return sft_dir


def reused(model_dir: str | Path) -> bool:
    """Whether :func:`sft_checkpoint` took the model in ``model_dir`` from an earlier lesson's run (not trained)."""
    return (Path(model_dir) / SHARED_FROM).is_file()


def _link_tree(src: Path, dst: Path) -> None:
    """Copy the folder ``src`` to ``dst`` (new), each file a hard link to its original where the file system allows."""
    def link_or_copy(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dst, copy_function=link_or_copy)


def _loaded(model_dir: Path) -> Path:
    """``model_dir``, with the random generators put back as its training left them (where it saved them): the
    lesson then samples after loading what it would have sampled after training."""
    saved = model_dir / RNG_FILE
    if saved.exists():
        runtime.set_rng_state(json.loads(saved.read_text()))
    return model_dir
