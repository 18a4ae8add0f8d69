"""The phases of lesson 09 (agentic RL with a calculator), for ``twins``: the SFT on tool traces, a batch of
the lesson's own multi-turn ``rollout`` and ``GRPOTrainer(tools=...)`` built by the lesson's own ``grpo_trainer``.

The twin carries the preset's **real** tokenizer and chat template (``twins.build_twin(..., tokenizer_dir=...)``
with :mod:`.qwen_tokenizers`), since the tool turns are rendered with Qwen's markup. A random model never
writes a tool call, so each rollout is one turn of ``max_new_tokens`` and each GRPO completion one turn of
``max_completion_length``: the time per turn is measured, and ``twins`` counts the turns a trained model makes
as at most what ``max_length`` leaves room for (:func:`utils.presets.sizing.rollout_turns`)."""
from __future__ import annotations

import copy
import re

import torch

from .. import presets
from .twin_judges import _lesson_defs
from .twin_lessons import Phases, _Clock, _load, _train_sft, problems

NOTEBOOK = "09_agentic_rl.ipynb"


def lesson09(cfg, tokenizer, out, steps, resolve=presets.resolve):
    """SFT (lesson 01's recipe at the lesson's ``max_length``: the two SFTs cost the same per step); one batch of
    ``eval_batch_size`` greedy rollouts through the lesson's ``rollout`` (cells ``run-calls``, ``mask``,
    ``rollout``); GRPO with tools through the lesson's ``grpo_trainer`` (cell ``grpo-setup``) from section 7's
    start (``agent.weaken_call``: untied embeddings, one more ``(vocab, hidden)`` matrix): LoRA, the calculator,
    ``max_completion_length`` over every turn, one generation batch per optimizer step."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOTrainer

    from .. import agent, data, evaluation, rewards, rl, training
    from ..tools import calculator

    phases = Phases()
    tokenizer = agent.tool_tokenizer(cfg.model)
    sft_cfg = resolve(cfg.preset, lesson="01", model=cfg.model, dataset=cfg.dataset, max_steps=steps,
                      max_length=cfg.max_length, batch_size=cfg.sft_batch_size, grad_accum=cfg.sft_grad_accum)
    _train_sft(phases, "SFT train", _load(sft_cfg), tokenizer, sft_cfg, out / "sft", steps)

    tools = [calculator]
    ns = {"cfg": cfg, "tokenizer": tokenizer, "torch": torch, "re": re, "copy": copy, "agent": agent, "data": data,
          "evaluation": evaluation, "rewards": rewards, "rl": rl, "TOOLS": tools, "calculator": calculator,
          "ROLLOUT_TEMPLATE": agent.rollout_template(tokenizer), "OUTPUT_DIR": out, "tool_dir": cfg.model,
          "AutoModelForCausalLM": __import__("transformers").AutoModelForCausalLM, "quiet": training.quiet,
          "Dataset": Dataset, "LoraConfig": LoraConfig, "GRPOTrainer": GRPOTrainer}
    ns["CALL_RE"] = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)   # the lesson's, a module constant
    ns["train_rollouts"] = []   # cell grpo-setup's list, which its reward ``correct`` appends to
    _lesson_defs(NOTEBOOK, ["run-calls", "mask", "rollout", "grpo-setup"], ns)
    model = _load(cfg).eval()
    with phases("tool rollout", "turn batch"):
        ns["rollout"](model, problems(tokenizer, cfg.eval_batch_size))
    agent.weaken_call(model, tokenizer, cfg.shy_scale).save_pretrained(out / "shy")   # section 7's start: untied
    del model

    pool = problems(tokenizer, cfg.prompts_per_step * max(steps, 2) * 2)
    ns["rl_data"] = Dataset.from_list([{"prompt": [{"role": "user", "content": p["question"]}], "answer": p["answer"],
                                        "calls_needed": 2} for p in pool])
    ns["lora"] = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                            target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM")
    run_cfg = resolve(cfg.preset, lesson="09", model=cfg.model, dataset=cfg.dataset, max_steps=max(2, steps))
    trainer = ns["grpo_trainer"]([ns["correct"], ns["call_cost"]], "grpo", run_cfg, start=out / "shy")
    clock = _Clock()
    trainer.add_callback(clock.callback)
    with phases("GRPO with tools train", "generation batch", count=max(2, steps)):
        trainer.train()
    phases.seconds("GRPO with tools train", clock.per_step(clock.ends[0] if clock.ends else 0))
    return phases.rows
