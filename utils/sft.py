"""Supervised fine-tuning pieces shared by the lessons (reference implementations).

Lesson 01 writes :func:`tokenize_sft_example` and :func:`collate` from scratch as
exercises; later lessons (DPO, GRPO, quantization) start from an SFT model and
get it from :func:`train_sft` instead of copying lesson 01's code.

Loss masking convention (the same as TRL's ``assistant_only_loss`` with a chat
template that marks the assistant turn): the loss covers the assistant's content
and the ``<|im_end|>`` that closes it -- the model must learn to *stop* -- and
nothing else: no system/user tokens, no ``<|im_start|>assistant\\n`` header, no
padding.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

IGNORE_INDEX = -100  # positions with this label are skipped by torch.nn.functional.cross_entropy


def tokenize_sft_example(tokenizer, messages: list[dict], max_length: int) -> dict:
    """Token ids and labels for one conversation whose last message is the assistant's.

    Args:
        tokenizer: a tokenizer with a chat template.
        messages: ``[..., {"role": "assistant", "content": ...}]``.
        max_length: truncate to at most this many tokens.
    Returns:
        ``{"input_ids": list[int], "labels": list[int]}`` of equal length L <= max_length;
        ``labels[i] == IGNORE_INDEX`` on prompt positions, ``input_ids[i]`` on the
        assistant's content and its closing ``<|im_end|>``.
    """
    prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
    full = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    if full[:len(prompt)] != prompt:
        raise ValueError("the chat template renders the prompt differently with and without the answer; "
                         "cannot locate the assistant turn")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    last_end = max(i for i, t in enumerate(full) if t == end)  # closes the assistant turn
    input_ids = full[:last_end + 1][:max_length]
    labels = ([IGNORE_INDEX] * len(prompt) + input_ids[len(prompt):])[:len(input_ids)]
    return {"input_ids": input_ids, "labels": labels}


def collate(examples: list[dict], pad_token_id: int) -> dict:
    """Right-pad a list of tokenized examples into a batch.

    Args:
        examples: dicts with ``input_ids`` and ``labels`` (lists of ints, per-example length L_i).
        pad_token_id: id used to pad ``input_ids``.
    Returns:
        ``input_ids`` (B, T) int64 padded with ``pad_token_id``, ``labels`` (B, T) int64
        padded with ``IGNORE_INDEX``, ``attention_mask`` (B, T) int64 (1 = real token),
        where T = max L_i.
    """
    T = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), T), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), T), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), T), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n] = torch.tensor(e["input_ids"])
        labels[i, :n] = torch.tensor(e["labels"])
        mask[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def pack(examples: list[dict], pad_token_id: int, max_length: int) -> dict:
    """Pack a batch of tokenized examples into few rows, padding-free, with the same loss as :func:`collate`.

    First-fit decreasing: the longest example goes into the first row with room, up to
    ``max_length`` tokens per row. Each example keeps its own positions (``position_ids`` restart
    at 0), and with no ``attention_mask`` transformers reads those restarts as sequence
    boundaries and masks attention across them (``masking_utils.find_packed_sequence_indices``),
    so no token sees another example. The label of each example's first token is set to
    ``IGNORE_INDEX``: in :func:`collate` nothing predicts a row's first token, here the previous
    example's last token would. Same tokens under the loss, same mean: the gradient of
    :func:`collate`'s batch, with fewer padded positions to compute (about 40 % fewer on the tiny
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
    rows: list[list[dict]] = []
    fill: list[int] = []
    for e in sorted(examples, key=lambda e: -len(e["input_ids"])):
        n = len(e["input_ids"])
        r = next((i for i, f in enumerate(fill) if f + n <= max_length), None)
        if r is None:                                   # no row has room: open a new one
            r = len(rows)
            rows.append([])
            fill.append(0)
        rows[r].append(e)
        fill[r] += n
    T = max(fill)
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

    Batches are weighted by their number of labelled tokens, so the result does not
    depend on ``batch_size``.
    """
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            batch = {k: v.to(device) for k, v in collate(examples[i:i + batch_size], pad_token_id).items()}
            n = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
            total += model(**batch).loss.item() * n
            count += n
    return total / max(count, 1)


def with_lora(model, cfg):
    """Wrap ``model`` with the preset's LoRA adapters (PEFT); only the adapters are trainable."""
    from peft import LoraConfig, get_peft_model

    if cfg.gradient_checkpointing:  # checkpointed blocks need an input that requires grad
        model.enable_input_require_grads()
    return get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                            target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM"))


def quiet(trainer):
    """Keep a plain tqdm progress bar (off when ``TQDM_DISABLE=1``) but stop ``Trainer`` printing
    every log dict or a live HTML table (the curves are in ``trainer.state.log_history``).
    Returns the trainer."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils.notebook import NotebookProgressCallback

    class BarOnly(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            pass

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(NotebookProgressCallback)
    trainer.add_callback(BarOnly)
    return trainer


def trainer_kwargs(cfg, output_dir: str | Path) -> dict:
    """The ``TrainingArguments`` fields every lesson derives the same way from a resolved preset:
    steps, batch, learning rate and its schedule, logging, checkpoints, precision (``cfg.dtype``;
    TRL's configs would otherwise default to bf16), activation checkpointing, device and seed."""
    save = cfg.save_steps and cfg.save_steps > 0
    return dict(
        output_dir=str(output_dir), max_steps=cfg.max_steps, per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.learning_rate, warmup_steps=round(cfg.warmup_ratio * cfg.max_steps),
        lr_scheduler_type="cosine", weight_decay=0.0, logging_steps=cfg.logging_steps,
        save_strategy="steps" if save else "no", save_steps=cfg.save_steps if save else 500, save_total_limit=2,
        bf16=cfg.dtype == torch.bfloat16, fp16=cfg.dtype == torch.float16, use_cpu=cfg.device == "cpu",
        activation_checkpointing=cfg.gradient_checkpointing,  # transformers 5.23's name for gradient checkpointing
        report_to="none", seed=cfg.seed, dataloader_num_workers=0, dataloader_pin_memory=cfg.device == "cuda",
    )


def training_arguments(cfg, output_dir: str | Path, **overrides):
    """``transformers.TrainingArguments`` for a resolved preset (``utils.presets.resolve``)."""
    from transformers import TrainingArguments

    return TrainingArguments(**{**trainer_kwargs(cfg, output_dir), "remove_unused_columns": False, **overrides})


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
    ``padding_fraction`` = 1 - tokens / positions. Added as a trainer callback it also
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
        self.positions += batch["input_ids"].numel()
        return batch

    @property
    def tokens(self) -> int:
        return sum(self.batch_tokens)

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.tokens / self.positions if self.positions else 0.0

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


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest ``checkpoint-N`` folder under ``output_dir`` (for resuming), or None."""
    ckpts = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return str(ckpts[-1]) if ckpts else None


def train_sft(model, tokenizer, problems: list[dict], cfg, output_dir: str | Path, resume: bool = False,
              callbacks=None, **overrides):
    """Chat-format SFT with ``transformers.Trainer``, the loss mask above and :func:`pack`ed batches.

    Trains all weights when the preset says ``full_finetune``, else LoRA adapters.
    Returns the trainer (``trainer.model`` is trained; ``trainer.state.log_history``
    holds the curves). With ``resume=True`` it continues from the newest checkpoint
    in ``output_dir`` when there is one. ``callbacks``: extra ``TrainerCallback``s (e.g. a step clock).
    """
    from transformers import Trainer

    from . import data

    if not cfg.full_finetune:
        model = with_lora(model, cfg)
        overrides.setdefault("learning_rate", cfg.lora_learning_rate)
    train = [tokenize_sft_example(tokenizer, data.to_messages(p), cfg.max_length) for p in problems]
    trainer = quiet(Trainer(model=model, args=training_arguments(cfg, output_dir, **overrides), train_dataset=train,
                            data_collator=lambda b: pack(b, tokenizer.pad_token_id, cfg.max_length),
                            callbacks=callbacks))
    trainer.train(resume_from_checkpoint=last_checkpoint(output_dir) if resume else None)
    return trainer


def sft_checkpoint(cfg, tokenizer, problems: list[dict], output_dir: str | Path, resume: bool = False) -> Path:
    """The SFT starting point of the later lessons: lesson 01's recipe, trained and saved once.

    ``cfg`` is a resolved lesson-01 preset (``presets.resolve(preset, lesson="01", max_steps=...)``).
    Trains ``cfg.model`` on ``problems`` with :func:`train_sft` (checkpoints in ``output_dir/sft``),
    folds a LoRA adapter into the weights (GPU presets) and saves the model to
    ``output_dir/sft-model``. With ``resume=True`` a model already saved there is reused as is.
    Returns that directory: load the model from it, never reuse the trained object (trainers patch
    the ``forward`` of the model they are given).
    """
    from transformers import AutoModelForCausalLM

    sft_dir = Path(output_dir) / "sft-model"
    if resume and (sft_dir / "config.json").exists():
        return sft_dir
    base = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=cfg.dtype).to(cfg.device)
    trained = train_sft(base, tokenizer, problems, cfg, Path(output_dir) / "sft").model
    if hasattr(trained, "merge_and_unload"):
        trained = trained.merge_and_unload()
    trained.save_pretrained(sft_dir)
    return sft_dir
