"""Scale-out to verl: the task as verl RL data, a reward module, and the ``main_ppo`` command.

verl (https://github.com/volcengine/verl) trains GRPO with Ray, FSDP and vLLM on many GPUs.
It needs three things from us, all produced here without importing verl:

* ``train.parquet`` / ``test.parquet`` in verl's RL dataset schema, one row per problem,
  exactly as verl's own ``examples/data_preprocess/gsm8k.py`` writes GSM8K::

      data_source   "openai/gsm8k" (or "synthetic-arithmetic"); verl groups metrics by it
      prompt        chat messages, [{"role": "user", "content": question}]
      ability       "math"
      reward_model  {"style": "rule", "ground_truth": "72"}
      extra_info    {"split": "train", "index": 0, "answer": <worked answer>, "question": <question>}

  The prompt is exactly :func:`utils.data.to_prompt_messages`, so the verl run sees the same
  prompt as the TRL lesson; verl applies the model's chat template itself (at rollout).
* ``reward.py`` next to the data: a copy of :mod:`utils.rewards` (standard library only), whose
  ``compute_score(data_source, solution_str, ground_truth, extra_info)`` is the sum of the TRL
  rewards ``correctness_reward + format_reward``. The folder can be copied to a cluster as is.
* the ``python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo ...`` command line
  (:func:`main_ppo_command`), every key checked against verl's config by ``tests/side/test_verl.py``.

Written and tested against verl 0.9.1 (``tests/verl/requirements.txt``). In that version the
custom reward is ``reward.custom_reward_function.path``: the older top-level
``custom_reward_function.path`` still parses but ``main_ppo`` no longer reads it.
"""
from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Callable, Iterable, Mapping

from . import data
from .constants import GSM8K, UTILS_DIR

GSM8K_SOURCE = GSM8K                         # verl names GSM8K by its Hub id (its built-in scorer keys on it)
SYNTHETIC_SOURCE = "synthetic-arithmetic"    # our generated problems (utils.data.make_problems)
ABILITY = "math"
REWARD_FILE = UTILS_DIR / "rewards.py"
REWARD_FN = "compute_score"

# What verl's gsm8k example appends to every question. Off by default: the lessons' models
# were trained on the bare question, and the TRL lesson prompts with the bare question.
VERL_GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

# The policy losses of lesson 05 ("Three other ways to bound an off-policy step") as verl 0.9.1's actor settings,
# at the values the lesson uses with TRL: GSPO's sequence ratio in its paper's range with one mean per sequence;
# CISPO's weight capped at 5 (verl clips it to [1 - clip_ratio_low, 1 + clip_ratio_high]: no lower bound here,
# as TRL's cispo); SAPO's temperatures. Any other key of the actor keeps its default ("vanilla": PPO's clip).
ACTOR = "actor_rollout_ref.actor."
LOSS_MODES = {
    "gspo": {ACTOR + "policy_loss.loss_mode": "gspo", ACTOR + "clip_ratio_low": 3e-4, ACTOR + "clip_ratio_high": 4e-4,
             ACTOR + "loss_agg_mode": "seq-mean-token-mean"},
    "cispo": {ACTOR + "policy_loss.loss_mode": "cispo", ACTOR + "clip_ratio_low": 1.0, ACTOR + "clip_ratio_high": 4.0},
    "sapo": {ACTOR + "policy_loss.loss_mode": "sapo", ACTOR + "tau_pos": 1.0, ACTOR + "tau_neg": 1.05},
}


def loss_mode_overrides(loss_mode: str) -> list[str]:
    """The ``key=value`` overrides that switch :func:`main_ppo_command`'s actor to ``loss_mode`` (:data:`LOSS_MODES`:
    ``"gspo"``, ``"cispo"``, ``"sapo"``); pass them as its ``extra``. Taught in lesson 05."""
    if loss_mode not in LOSS_MODES:
        raise ValueError(f"unknown loss_mode {loss_mode!r}: expected one of {sorted(LOSS_MODES)}")
    return [f"{k}={_value(v)}" for k, v in LOSS_MODES[loss_mode].items()]


def data_source_for(dataset: str) -> str:
    """verl ``data_source`` for a preset's ``dataset`` (``"synthetic"`` or a GSM8K source)."""
    return SYNTHETIC_SOURCE if dataset == "synthetic" else GSM8K_SOURCE


def to_verl_row(problem: dict, split: str, index: int, data_source: str = GSM8K_SOURCE,
                system: str | None = None, instruction: str | None = None) -> dict:
    """One problem as a row of verl's RL dataset (the schema of verl's ``gsm8k.py`` example).

    Args:
        problem: ``{"question", "answer"}`` in GSM8K schema (answer ends with ``#### N``).
        split: ``"train"`` or ``"test"``, stored in ``extra_info``.
        index: position in the split, stored in ``extra_info`` (verl reads it as the row id).
        data_source: ``GSM8K_SOURCE`` or ``SYNTHETIC_SOURCE`` (see :func:`data_source_for`).
        system: optional system message, as in :func:`utils.data.to_prompt_messages`.
        instruction: optional text appended to the question after a space (e.g.
            ``VERL_GSM8K_INSTRUCTION``); None keeps the lesson's prompt unchanged.
    Returns:
        ``{"data_source", "prompt", "ability", "reward_model", "extra_info"}``; the ground truth
        is the final number with thousands separators removed (``"1,234"`` -> ``"1234"``), as verl does.
    """
    asked = problem if instruction is None else {**problem, "question": f"{problem['question']} {instruction}"}
    return {
        "data_source": data_source,
        "prompt": data.to_prompt_messages(asked, system=system),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": data.final_answer(problem["answer"]).replace(",", "")},
        "extra_info": {"split": split, "index": int(index),
                       "answer": problem["answer"], "question": problem["question"]},
    }


def export_parquet(train_problems: Iterable[dict], test_problems: Iterable[dict], out_dir,
                   data_source: str = GSM8K_SOURCE, system: str | None = None,
                   instruction: str | None = None, extend_row: Callable[[dict], None] | None = None) -> dict[str, Path]:
    """Write ``train.parquet``, ``test.parquet`` and ``reward.py`` into ``out_dir``.

    ``reward.py`` is a copy of ``utils/rewards.py`` (standard library only), so ``out_dir`` is
    self-contained: copy it to a cluster and point ``data.train_files``, ``data.val_files`` and
    ``reward.custom_reward_function.path`` at it (:func:`main_ppo_command` does). ``extend_row``, when
    given, adds keys to each :func:`to_verl_row` row in place before it is written (:func:`export_tool_task`).

    Returns:
        ``{"train": Path, "test": Path, "reward": Path}``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, problems in (("train", train_problems), ("test", test_problems)):
        rows = [to_verl_row(p, split, i, data_source=data_source, system=system, instruction=instruction)
                for i, p in enumerate(problems)]
        if extend_row is not None:
            for row in rows:
                extend_row(row)
        if not rows:
            raise ValueError(f"no {split} problems to export")
        paths[split] = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), paths[split])
    paths["reward"] = out / "reward.py"
    shutil.copyfile(REWARD_FILE, paths["reward"])
    return paths


TOOL_FILE = UTILS_DIR / "tools.py"
TOOL_CLASS_FILE = UTILS_DIR / "assets" / "verl_calculator_tool.py"
TOOL_AGENT = "tool_agent"                    # verl 0.9.1's registered multi-turn agent loop


def tool_config() -> dict:
    """verl's tool config for the calculator (``actor_rollout_ref.rollout.multi_turn.tool_config_path``): the
    class by its import path in the export folder, and the OpenAI schema ``transformers`` derives from
    :func:`utils.tools.calculator` (what the TRL lesson's chat template renders)."""
    from transformers.utils import get_json_schema

    from .tools import calculator

    schema = get_json_schema(calculator)
    schema["function"].pop("return", None)         # not part of OpenAI's function schema
    return {"tools": [{"class_name": "calculator_tool.CalculatorTool", "config": {"type": "native"},
                       "tool_schema": schema}]}


def export_tool_task(train_problems: Iterable[dict], test_problems: Iterable[dict], out_dir,
                     data_source: str = GSM8K_SOURCE, system: str | None = None) -> dict[str, Path]:
    """The calculator task for verl's multi-turn agent loop (lesson 09): :func:`export_parquet`'s rows with
    ``agent_name = "tool_agent"`` and ``extra_info.tools_kwargs`` (the ground truth as the calculator's
    ``create_kwargs``: verl 0.9.1 passes them to every call's ``create``, and pyarrow cannot store an empty
    one), plus ``tool_config.yaml``, ``calculator.py`` (a copy of ``utils/tools.py``) and
    ``calculator_tool.py`` (the ``BaseTool`` around it). Put ``out_dir`` on ``PYTHONPATH`` for verl.

    Returns:
        ``{"train", "test", "reward", "tool_config", "calculator", "calculator_tool"}`` paths.
    """
    import json

    def for_the_agent_loop(row):
        row["agent_name"] = TOOL_AGENT
        row["extra_info"]["tools_kwargs"] = {"calculator": {"create_kwargs": {
            "ground_truth": row["reward_model"]["ground_truth"]}}}
        row["extra_info"]["need_tools_kwargs"] = True

    paths = export_parquet(train_problems, test_problems, out_dir, data_source=data_source, system=system,
                           extend_row=for_the_agent_loop)
    out = Path(out_dir)
    paths["tool_config"] = out / "tool_config.yaml"
    paths["tool_config"].write_text(json.dumps(tool_config(), indent=1) + "\n")   # JSON is YAML
    paths["calculator"] = out / "calculator.py"
    shutil.copyfile(TOOL_FILE, paths["calculator"])
    paths["calculator_tool"] = out / "calculator_tool.py"
    shutil.copyfile(TOOL_CLASS_FILE, paths["calculator_tool"])
    return paths


def tool_overrides(data_dir, max_assistant_turns: int = 6, max_parallel_calls: int = 8,
                   max_tool_response_length: int = 256) -> dict:
    """The multi-turn keys of verl 0.9.1 for :func:`export_tool_task`'s folder, for ``main_ppo_overrides(extra=)``:
    the tool config, Hermes-style ``<tool_call>`` parsing (Qwen's format), the turn limit, the calls run per turn
    and the tool text's cap. The rows' ``agent_name`` picks the tool agent loop; rollouts are asynchronous (0.9.1
    has no sync mode).

    ``max_parallel_calls``: TRL, and the lesson's loop, run every call of a turn; verl's tool agent loop runs the
    first ``max_parallel_calls`` (its default: 1) and drops the rest without a result, though their tokens stay in
    the sequence it trains on (a GSM8K line with two annotations is a turn of two calls). ``max_tool_response_length``
    counts characters and cuts a longer result in the middle: verl's default, 256, is above every message of the
    calculator (a test checks it), where 64 cut three of them."""
    base = "actor_rollout_ref.rollout."
    return {base + "mode": "async", base + "multi_turn.enable": True,
            base + "multi_turn.tool_config_path": str(Path(_local(data_dir)) / "tool_config.yaml"),
            base + "multi_turn.format": "hermes", base + "multi_turn.max_assistant_turns": max_assistant_turns,
            base + "multi_turn.max_parallel_calls": max_parallel_calls,
            base + "multi_turn.max_tool_response_length": max_tool_response_length}


def _local(path) -> str:
    """An existing local path made absolute (verl's Ray workers may run elsewhere); anything
    else (a Hub model id, a path on the cluster) as given."""
    p = Path(str(path)).expanduser()
    return str(p.resolve()) if p.exists() else str(path)


def _value(v) -> str:
    """A Python value in Hydra override syntax (``True``, ``1e-06``, ``[a,b]``)."""
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    return str(v)


def main_ppo_overrides(
    model: str,
    data_dir,
    *,
    reward_path=None,
    n_gpus: int = 1,
    nnodes: int = 1,
    train_batch_size: int = 64,
    mini_batch_size: int | None = None,
    micro_batch_size_per_gpu: int = 8,
    num_generations: int = 8,
    max_prompt_length: int = 512,
    max_response_length: int = 512,
    learning_rate: float = 1e-6,
    beta: float = 0.0,
    adv_estimator: str = "grpo",
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    lam: float = 1.0,
    entropy_coeff: float = 0.0,
    critic_learning_rate: float = 1e-5,
    cliprange_value: float = 0.5,
    critic_warmup: int = 0,
    epochs: int = 1,
    max_steps: int | None = None,
    temperature: float = 1.0,
    lora_r: int = 0,
    lora_alpha: int | None = None,
    lora_target_modules=None,
    rollout: str = "vllm",
    tensor_parallel: int = 1,
    gpu_memory_utilization: float = 0.5,
    gradient_checkpointing: bool = True,
    project_name: str = "post-training-course",
    experiment_name: str = "grpo",
    logger: Iterable[str] = ("console",),
    test_freq: int = 10,
    save_freq: int = -1,
    val_before_train: bool = True,
    extra: Mapping | Iterable[str] | None = None,
) -> list[str]:
    """The Hydra overrides of :func:`main_ppo_command`, as ``key=value`` strings (unquoted).

    Argument names follow the TRL lesson; the verl key each one sets:

    ============================  =====================================================
    model                         ``actor_rollout_ref.model.path`` (Hub id or local dir)
    data_dir                      ``data.train_files`` / ``data.val_files`` (``{train,test}.parquet``)
    reward_path                   ``reward.custom_reward_function.path`` (default ``data_dir/reward.py``)
    n_gpus, nnodes                ``trainer.n_gpus_per_node``, ``trainer.nnodes``
    train_batch_size              ``data.train_batch_size``: prompts per step
    num_generations               ``actor_rollout_ref.rollout.n``: completions per prompt (the group)
    mini_batch_size               ``actor.ppo_mini_batch_size`` in prompts (default: the whole
                                  batch, one update per step = on-policy, as TRL's default)
    micro_batch_size_per_gpu      ``actor.ppo_micro_batch_size_per_gpu`` (sequences per forward);
                                  also the log-prob micro batch of rollout and reference
    max_prompt_length             ``data.max_prompt_length`` (longer prompts are dropped:
                                  ``data.filter_overlong_prompts=True``)
    max_response_length           ``data.max_response_length`` (TRL: ``max_completion_length``)
    learning_rate                 ``actor.optim.lr``
    beta                          KL to the reference as a loss term: ``actor.use_kl_loss`` (beta > 0)
                                  and ``actor.kl_loss_coef``; 0 needs no reference model
    adv_estimator                 ``algorithm.adv_estimator``: ``grpo``, ``rloo``, ``reinforce_plus_plus``,
                                  ``gae`` (PPO with a critic: adds the ``critic.*`` keys) ...
    kl_coef                       KL folded into the reward (lesson 07): ``algorithm.use_kl_in_reward``
                                  (kl_coef > 0), ``algorithm.kl_ctrl.kl_coef`` (fixed), ``kl_penalty=kl``
    gamma, lam                    ``algorithm.gamma``, ``algorithm.lam`` (GAE's lambda); verl's defaults 1.0
    entropy_coeff                 ``actor.entropy_coeff`` (the entropy bonus)
    critic_learning_rate          ``critic.optim.lr`` (``gae`` only: the critic starts from ``model``,
                                  ``critic.model.path``, with the actor's LoRA settings)
    cliprange_value               ``critic.cliprange_value``
    critic_warmup                 ``trainer.critic_warmup``: steps that train the critic only
    epochs, max_steps             ``trainer.total_epochs``, ``trainer.total_training_steps``
    temperature                   ``actor_rollout_ref.rollout.temperature``
    lora_r, lora_alpha,           ``actor_rollout_ref.model.lora_rank`` (0 = full fine-tune),
    lora_target_modules           ``.lora_alpha``, ``.target_modules`` (default ``all-linear``)
    rollout                       ``actor_rollout_ref.rollout.name``: ``vllm`` or ``sglang``
    extra                         further overrides, ``{"key": value}`` or ``["key=value", ...]``
    ============================  =====================================================
    """
    data_dir = _local(data_dir)
    reward_path = _local(reward_path) if reward_path is not None else str(Path(data_dir) / "reward.py")
    mini_batch_size = train_batch_size if mini_batch_size is None else mini_batch_size
    ov = {
        "algorithm.adv_estimator": adv_estimator,
        "algorithm.use_kl_in_reward": kl_coef > 0,
    }
    if kl_coef > 0:
        ov.update({"algorithm.kl_penalty": "kl", "algorithm.kl_ctrl.type": "fixed",
                   "algorithm.kl_ctrl.kl_coef": kl_coef})
    if adv_estimator == "gae":
        ov.update({"algorithm.gamma": gamma, "algorithm.lam": lam})
    elif adv_estimator.startswith("reinforce_plus_plus"):
        ov["algorithm.gamma"] = gamma
    ov.update({
        "data.train_files": str(Path(data_dir) / "train.parquet"),
        "data.val_files": str(Path(data_dir) / "test.parquet"),
        "data.prompt_key": "prompt",
        "data.train_batch_size": train_batch_size,
        "data.max_prompt_length": max_prompt_length,
        "data.max_response_length": max_response_length,
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "actor_rollout_ref.model.path": _local(model),
        "actor_rollout_ref.model.enable_gradient_checkpointing": gradient_checkpointing,
        "actor_rollout_ref.model.lora_rank": lora_r,
    })
    if lora_r > 0:
        ov["actor_rollout_ref.model.lora_alpha"] = lora_alpha if lora_alpha is not None else 2 * lora_r
        ov["actor_rollout_ref.model.target_modules"] = lora_target_modules or "all-linear"
    ov.update({
        "actor_rollout_ref.actor.optim.lr": learning_rate,
        "actor_rollout_ref.actor.ppo_mini_batch_size": mini_batch_size,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro_batch_size_per_gpu,
        "actor_rollout_ref.actor.use_kl_loss": beta > 0,
        "actor_rollout_ref.actor.kl_loss_coef": beta,
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff": entropy_coeff,
        "actor_rollout_ref.rollout.name": rollout,
        "actor_rollout_ref.rollout.n": num_generations,
        "actor_rollout_ref.rollout.temperature": temperature,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": tensor_parallel,
        "actor_rollout_ref.rollout.gpu_memory_utilization": gpu_memory_utilization,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro_batch_size_per_gpu,
    })
    if lora_r > 0:
        ov["actor_rollout_ref.rollout.load_format"] = "safetensors"  # verl's LoRA recipe
    ov["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] = micro_batch_size_per_gpu
    if adv_estimator == "gae":                        # PPO: a critic, initialised from the same model
        ov.update({
            "critic.model.path": _local(model),
            "critic.model.enable_gradient_checkpointing": gradient_checkpointing,
            "critic.model.lora_rank": lora_r,
            "critic.optim.lr": critic_learning_rate,
            "critic.ppo_micro_batch_size_per_gpu": micro_batch_size_per_gpu,
            "critic.cliprange_value": cliprange_value,
            "trainer.critic_warmup": critic_warmup,
        })
        if lora_r > 0:
            ov["critic.model.lora_alpha"] = lora_alpha if lora_alpha is not None else 2 * lora_r
            ov["critic.model.target_modules"] = lora_target_modules or "all-linear"
    ov.update({
        "reward.custom_reward_function.path": reward_path,
        "reward.custom_reward_function.name": REWARD_FN,
        "trainer.logger": list(logger),
        "trainer.project_name": project_name,
        "trainer.experiment_name": experiment_name,
        "trainer.n_gpus_per_node": n_gpus,
        "trainer.nnodes": nnodes,
        "trainer.total_epochs": epochs,
        "trainer.test_freq": test_freq,
        "trainer.save_freq": save_freq,
        "trainer.val_before_train": val_before_train,
    })
    if max_steps is not None:
        ov["trainer.total_training_steps"] = max_steps
    out = [f"{k}={_value(v)}" for k, v in ov.items()]
    if isinstance(extra, Mapping):
        out += [f"{k}={_value(v)}" for k, v in extra.items()]
    elif extra is not None:
        out += list(extra)
    return out


def main_ppo_command(model: str, data_dir, *, multiline: bool = True, python: str = "python",
                     **kwargs) -> str:
    """The shell command that trains on the exported data with verl (GRPO by default; ``adv_estimator``).

    ``python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_files=... \\``
    with one override per line (``multiline=False``: one line). Arguments as in
    :func:`main_ppo_overrides`. Values are shell-quoted where needed; ``shlex.split`` of the
    result gives back the argv verl's Hydra parses.
    """
    parts = [python, "-m", "verl.trainer.main_ppo"] + main_ppo_overrides(model, data_dir, **kwargs)
    quoted = [shlex.quote(p) for p in parts]
    if not multiline:
        return " ".join(quoted)
    return " ".join(quoted[:3]) + " \\\n" + " \\\n".join("    " + q for q in quoted[3:])
