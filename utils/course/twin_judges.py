"""The phases of lessons 07 and 08, whose models judge answers (a reward model and a critic; a PRM and an
ORM), for ``twins``. They run the lesson's own cells or functions (``_lesson_cells``, ``_lesson_defs``);
the measuring helpers and lessons 01-06 are in :mod:`.twin_lessons`."""
from __future__ import annotations

import ast
import json
import math
import time

import torch

from .. import presets
from ..constants import NOTEBOOKS_DIR
from .twin_lessons import Phases, _Clock, _generate_batch, _load, _lora, _pairs, problems


def _cells(notebook: str) -> dict:
    return {c.get("id"): "".join(c["source"]) for c in json.loads((NOTEBOOKS_DIR / notebook).read_text())["cells"]}


def _lesson_cells(notebook: str, cell_ids, namespace: dict) -> dict:
    """Run the code cells ``cell_ids`` of ``notebooks/<notebook>`` in ``namespace``: the lesson's code, as written."""
    cells = _cells(notebook)
    for cell_id in cell_ids:
        exec(compile(cells[cell_id], f"{notebook}#{cell_id}", "exec"), namespace)
    return namespace


def _lesson_defs(notebook: str, cell_ids, namespace: dict) -> dict:
    """Only the imports and the function definitions of the cells ``cell_ids``, run in ``namespace``: the lesson's
    functions, as written, without the experiments the cells go on to run."""
    cells = _cells(notebook)
    for cell_id in cell_ids:
        tree = ast.parse(cells[cell_id])
        tree.body = [node for node in tree.body
                     if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))]
        exec(compile(tree, f"{notebook}#{cell_id}", "exec"), namespace)
    return namespace


def lesson07(cfg, tokenizer, out, steps, resolve=presets.resolve):
    """Pair sampling (``n_samples`` per prompt); ``RewardTrainer`` (LoRA, ``SEQ_CLS``) with the SFT model
    resident; PPO with a critic through the lesson's own loop (cells ``rl-setup`` and ``rl-loop``, run as
    written): rollout, the reference's and the critic's passes, ``rl_minibatches`` updates of the policy and of the
    critic, with the reference resident (the lesson moves the reward models to the CPU there)."""
    import random

    from datasets import Dataset
    from peft import LoraConfig
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM
    from trl import RewardConfig, RewardTrainer

    from .. import data, rewards, runtime, training
    from ..solutions.lesson07 import gae

    phases = Phases()
    sft_model = _load(cfg).eval()
    _generate_batch(phases, "pair sampling", sft_model, tokenizer, cfg, cfg.max_new_tokens, n=cfg.n_samples,
                    temperature=cfg.temperature)
    pairs = _pairs(tokenizer, cfg, cfg.batch_size * cfg.grad_accum * steps)
    clock = _Clock()
    args = RewardConfig(**{**training.trainer_kwargs(cfg, out / "rm"), "max_steps": steps, "save_strategy": "no"},
                        max_length=cfg.max_length, center_rewards_coefficient=cfg.center_rewards_coefficient)
    trainer = RewardTrainer(model=str(cfg.model), processing_class=tokenizer, train_dataset=Dataset.from_list(pairs),
                            peft_config=_lora(cfg, "SEQ_CLS") if cfg.use_lora else None, callbacks=[clock.callback],
                            args=args)
    with phases("RewardTrainer train", "step") as ctx:
        trainer.train()
    phases.seconds("RewardTrainer train", clock.per_step(ctx.t))
    ns = _lesson_cells("07_reward_models_ppo.ipynb", ["rl-setup", "rl-loop"], {
        "cfg": cfg, "tokenizer": tokenizer, "torch": torch, "time": time, "random": random, "runtime": runtime,
        "data": data, "rewards": rewards, "LoraConfig": LoraConfig, "AutoModelForCausalLM": AutoModelForCausalLM,
        "SEED": 0, "sft_dir": cfg.model, "sft_model": sft_model, "gae": gae, "tqdm": tqdm,
        "reward_model": trainer.model, "orm": torch.nn.Module()})     # the twin trains no outcome reward model
    ns["rl_problems"] = problems(tokenizer, cfg.rl_prompts * steps)        # GSM8K-length prompts
    with phases("PPO iteration", "iteration", count=steps):
        _, run = ns["train_rl"]("ppo", iterations=steps)
    phases.rows["PPO iteration"]["parts"] = {k: round(v / steps, 2) for k, v in run["clock"].items()}
    phases.seconds("PPO iteration", sum(run["clock"].values()) / steps)
    return phases.rows


def beam_problems(cfg) -> int:
    """Problems whose first beam-search round fills one generation batch (``beam_width x beam_expand`` lines each)."""
    return max(1, cfg.eval_batch_size // (cfg.beam_width * cfg.beam_expand))


def lesson08(cfg, tokenizer, out, steps, resolve=presets.resolve):
    """Sampling (``ttc_samples`` per prompt); the PRM and then the ORM trained through the lesson's own
    ``train_token_classifier`` (the model in fp32 with a fresh two-way head, LoRA ``TOKEN_CLS``) on rows its own
    ``labelled_rows`` builds, the policy resident (and the PRM, while the ORM trains); one scoring batch of
    ``token_probs``; PRM-guided search through the lesson's ``beam_search`` (``prm_score``, the reference
    ``beam_step``), two rounds on the problems that fill a generation batch, all three models resident. The twin
    never ends a line, so every step runs to ``step_tokens``: an upper bound."""
    from datasets import Dataset
    from transformers import Trainer

    from .. import data, evaluation, rewards
    from ..solutions.lesson08 import beam_step, step_labels

    phases = Phases()
    tcfg = resolve(cfg.preset, lesson="08", model=cfg.model, dataset=cfg.dataset, max_steps=steps, beam_max_steps=2)
    policy = _load(cfg).eval()
    _generate_batch(phases, "sampled eval", policy, tokenizer, cfg, cfg.max_new_tokens, n=cfg.ttc_samples,
                    temperature=cfg.temperature)
    clocks = []

    class ClockedTrainer(Trainer):             # the lesson's Trainer, with a clock on its optimizer steps
        def __init__(self, *args, **kwargs):
            clocks.append(_Clock())
            super().__init__(*args, callbacks=[clocks[-1].callback], **kwargs)

    ns = _lesson_defs("08_test_time_compute.ipynb", ["prm-data", "prm-train", "prm-eval", "beam-search"], {
        "cfg": tcfg, "tokenizer": tokenizer, "torch": torch, "time": time, "data": data, "rewards": rewards,
        "evaluation": evaluation, "Dataset": Dataset, "step_labels": step_labels, "beam_step": beam_step,
        "sft_dir": cfg.model, "OUTPUT_DIR": out, "model": policy})
    ns["Trainer"] = ClockedTrainer
    rows_problems = problems(tokenizer, tcfg.batch_size * tcfg.grad_accum * steps, answer_tokens=cfg.max_new_tokens)
    answers = [[p["answer"]] for p in rows_problems]      # GSM8K-length answers, a label at every line's end
    models = {}
    for name, kind in (("PRM train", "prm"), ("ORM train", "orm")):
        with phases(name, "step") as ctx:
            models[kind], _, _ = ns["train_token_classifier"](ns["labelled_rows"](rows_problems, answers, kind), kind)
        phases.seconds(name, clocks[-1].per_step(ctx.t))
    score_rows = ns["labelled_rows"](rows_problems, answers, "prm")
    score_rows = (score_rows * math.ceil(tcfg.score_batch_size / len(score_rows)))[:tcfg.score_batch_size]
    with phases("PRM scoring", "batch"):
        ns["token_probs"](models["prm"], score_rows)
    ns["prm"] = models["prm"]
    with phases("PRM beam search", "round", count=tcfg.beam_max_steps):
        ns["beam_search"](problems(tokenizer, beam_problems(tcfg)), ns["prm_score"], tcfg.beam_width,
                          tcfg.beam_expand)
    phases.rows["PRM beam search"]["problems"] = beam_problems(tcfg)
    return phases.rows
