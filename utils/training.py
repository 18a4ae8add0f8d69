"""Glue between a resolved preset and Hugging Face's ``Trainer`` (and TRL's trainers, which extend it).

Every lesson that trains uses these: the ``TrainingArguments`` fields a preset decides
(:func:`trainer_kwargs`, taught in lesson 01), LoRA adapters from the preset (:func:`with_lora`,
lesson 01 section 8), a trainer that shows a progress bar but no wall of logs (:func:`quiet`), and
the newest checkpoint to resume from (:func:`last_checkpoint`).
"""
from __future__ import annotations

from pathlib import Path

import torch


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


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest ``checkpoint-N`` folder under ``output_dir`` (for resuming), or None."""
    ckpts = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return str(ckpts[-1]) if ckpts else None
