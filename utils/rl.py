"""Reinforcement-learning helpers for lessons 04 and 05, around TRL's ``GRPOTrainer`` and ``RLOOTrainer``.

One GRPO step, as TRL 1.16 computes it (``trl/trainer/grpo_trainer.py``):

1. Sample ``G`` completions per prompt (``num_generations``) and score each with the reward
   functions: a (N,) reward tensor, ``N = num_prompts * G``, each prompt's group ``G`` consecutive
   entries (TRL's ``RepeatSampler`` layout). On a CPU, :func:`decode_rollout` samples them.
2. Advantages: each reward minus its group's mean, divided by a std chosen by ``scale_rewards``
   (``"group"`` / ``"batch"`` / ``"none"``, ``eps = 1e-4``; lesson 04's exercise
   ``group_advantages``). :func:`rloo_advantages` is the leave-one-out baseline of ``RLOOTrainer``;
   :func:`zero_std_groups` finds the groups whose advantages are all 0.
3. The clipped surrogate per token, with ``rho = pi / pi_old`` clipped to
   ``[1 - epsilon, 1 + epsilon_high]`` (lesson 04's ``clipped_surrogate``).
4. The k3 estimate of KL(pi || pi_ref) per token, weighted by ``beta`` and added *before*
   aggregation (lesson 04's ``k3_kl``; with ``beta = 0``, TRL's default, no reference model is
   loaded). TRL 1.16 also defaults to ``use_bias_correction_kl=True``, which multiplies the per-token
   KL by the *unclipped* ratio ``rho = exp(logps - old_logps)`` first: on-policy the value is
   unchanged (rho = 1), the gradient is not.
5. One scalar from the (B, T) per-token losses and the completion mask, the four ways
   ``loss_type`` offers (``"grpo"``, ``"bnpo"``, ``"dr_grpo"``, ``"dapo"``: lesson 04's
   ``aggregate_loss``). Log-probabilities come from :func:`per_token_logps`.

The lessons' answers are in ``utils/solutions/lesson04.py`` and ``lesson05.py``; ``tests/library/test_rl.py``
checks them (value and gradient) against the loss the trainer itself computes on real generations,
with TRL's defaults: ``multi_objective_aggregation="sum_then_normalize"``,
``importance_sampling_level="token"``, no vLLM importance-sampling correction, no entropy mask or
bonus, ``delta=None``. The trainer logs what these pieces measure: ``kl`` (masked token mean of
the KL term, after the ratio weighting), ``clip_ratio/low_mean`` (tokens with ``rho < 1 - epsilon``
and ``A < 0``), ``clip_ratio/high_mean`` (``rho > 1 + epsilon_high`` and ``A > 0``),
``clip_ratio/region_mean`` (either), all token means over the mask, plus ``clip_ratio/low_min`` /
``clip_ratio/high_max`` over per-sequence means.

Shapes: B sequences (completions) in a batch, T completion positions (right-padded), N rewards.
"""
from __future__ import annotations

import torch

from .training import trainer_kwargs


# ----------------------------------------------------------------------------- advantages
def _check_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N,) float rewards, validated to split into whole groups of ``group_size``."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor of shape (N,), got shape {tuple(rewards.shape)}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int (TRL: num_generations), got {group_size!r}")
    if rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards has {rewards.numel()} entries, not divisible by group_size={group_size}: "
            f"each prompt's group must be {group_size} consecutive rewards"
        )
    return rewards if rewards.is_floating_point() else rewards.float()


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out advantages: each reward minus the mean of the *other* rewards of its group.

    Args:
        rewards: (N,) float, groups of ``group_size`` consecutive entries (TRL's layout).
        group_size: G >= 2 (with G = 1 there is no other completion to form a baseline).
    Returns:
        (N,) float::

            A_i = r_i - (sum_{j in group, j != i} r_j) / (G - 1)  =  G / (G - 1) * (r_i - mean(group))

        the baseline TRL's ``RLOOTrainer`` uses (before its optional ``normalize_advantages``).
    """
    rewards = _check_groups(rewards, group_size)
    if group_size < 2:
        raise ValueError(f"rloo_advantages needs group_size >= 2 (a baseline from the other completions), "
                         f"got {group_size}")
    grouped = rewards.view(-1, group_size)                                   # (N/G, G)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - baseline).view(-1)


def zero_std_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups carry no learning signal: all their rewards are equal (so all advantages are 0).

    Args:
        rewards: (N,) float, groups of ``group_size`` consecutive entries.
        group_size: G.
    Returns:
        (N // G,) bool, True for a group whose rewards are all equal. Its mean over a batch is
        what TRL logs as ``frac_reward_zero_std``.
    """
    grouped = _check_groups(rewards, group_size).view(-1, group_size)
    return (grouped == grouped[:, :1]).all(dim=1)


# ----------------------------------------------------------------------------- log-probabilities
def per_token_logps(model, batch: dict, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs of a GRPO batch's completion tokens, as TRL's ``GRPOTrainer`` computes them.

    Args:
        model: a causal LM.
        batch: TRL's generation batch: ``prompt_ids``/``prompt_mask`` (B, P, left-padded) and
            ``completion_ids``/``completion_mask`` (B, T, right-padded).
        temperature: the sampling temperature; logits are divided by it (TRL: ``temperature``).
    Returns:
        (B, T) float32: ``log softmax(logits / temperature)`` at each completion token (values on
        padding positions are meaningless: multiply by the mask).
    """
    return _completion_log_softmax(model, batch, temperature).gather(
        -1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def _completion_log_softmax(model, batch: dict, temperature: float = 1.0) -> torch.Tensor:
    """(B, T, V) float32 ``log softmax(logits / temperature)`` at each completion position of a TRL batch."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    T = batch["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, -T - 1:-1].float()
    return torch.log_softmax(logits / temperature, dim=-1)


# ----------------------------------------------------------------------------- TRL configuration
def _rl_kwargs(cfg, output_dir, overrides: dict) -> dict:
    """The fields ``GRPOConfig`` and ``RLOOConfig`` share, from a resolved lesson-04/05 preset."""
    import importlib.util

    steps_per_generation = getattr(cfg, "steps_per_generation", None) or cfg.grad_accum
    if steps_per_generation % cfg.grad_accum:
        raise ValueError(f"steps_per_generation ({steps_per_generation}) must be a multiple of grad_accum "
                         f"({cfg.grad_accum}): each optimizer step takes grad_accum micro-batches of one "
                         "generation batch")
    if cfg.batch_size * steps_per_generation != cfg.prompts_per_step * cfg.num_generations:
        raise ValueError(
            f"batch_size * steps_per_generation ({cfg.batch_size} * {steps_per_generation}) must equal "
            f"prompts_per_step * num_generations ({cfg.prompts_per_step} * {cfg.num_generations}): one generation "
            "batch holds whole groups (steps_per_generation defaults to grad_accum)")
    use_vllm = bool(overrides.get("use_vllm", cfg.use_vllm))
    if use_vllm and importlib.util.find_spec("vllm") is None:
        raise ImportError("use_vllm=True needs vLLM, which is not in the pinned requirements: "
                          "`pip install vllm` (Linux + CUDA GPU), or run with USE_VLLM=False")
    kw = {**trainer_kwargs(cfg, output_dir),
          "num_generations": cfg.num_generations, "max_completion_length": cfg.max_completion_length,
          "temperature": cfg.temperature, "beta": cfg.beta, "steps_per_generation": steps_per_generation,
          "lr_scheduler_type": "constant_with_warmup", "use_vllm": use_vllm}
    if use_vllm:
        kw["vllm_mode"] = "colocate"      # one GPU: generation and training share it
    return kw


def grpo_config(cfg, output_dir, **overrides):
    """``trl.GRPOConfig`` for a resolved lesson-04/05 preset (``utils.presets.resolve(..., lesson="04")``).

    :func:`utils.training.trainer_kwargs` (precision and activation checkpointing explicit: TRL's
    configs default to ``bf16=True`` and to checkpointing on) plus the GRPO fields in TRL's names:
    ``num_generations``, ``max_completion_length``, ``temperature``, ``beta``, ``loss_type``,
    ``steps_per_generation``, ``use_vllm``. ``per_device_train_batch_size`` counts *completions*;
    one generation batch of ``batch_size * steps_per_generation = prompts_per_step *
    num_generations`` completions is sampled at a time and split into ``steps_per_generation /
    grad_accum`` optimizer steps. ``steps_per_generation`` defaults to ``grad_accum`` (TRL's
    default: one optimizer step per generation batch, fully on-policy, so the clip never binds);
    lesson 05 uses two optimizer steps per batch, so the second is off-policy and ``epsilon_high``
    matters. The learning rate is constant after warm-up. ``overrides``: any ``GRPOConfig`` field.
    """
    from trl import GRPOConfig

    kw = {**_rl_kwargs(cfg, output_dir, overrides), "loss_type": cfg.loss_type}
    return GRPOConfig(**{**kw, **overrides})


def rloo_config(cfg, output_dir, **overrides):
    """``trl.RLOOConfig`` for a resolved lesson-05 preset: the same sizes, precision and schedule as
    :func:`grpo_config` (RLOO has no ``loss_type``: its loss is per sequence). TRL's ``RLOOConfig``
    defaults to ``beta=0.05``; the preset's ``beta`` is passed explicitly. ``overrides``: any
    ``RLOOConfig`` field.
    """
    from trl import RLOOConfig

    return RLOOConfig(**{**_rl_kwargs(cfg, output_dir, overrides), **overrides})


# ----------------------------------------------------------------------------- rollouts on a CPU
def decode_rollout(prompts: list, trainer) -> dict:
    """``GRPOTrainer(rollout_func=...)``: the rollouts sampled with :func:`utils.evaluation.decode`.

    TRL's own path calls ``model.generate`` on the whole generation batch: every row keeps
    computing until the longest one ends, and each prompt is read ``num_generations`` times. Here
    each prompt is read once (its KV cache copied to its group) and each completion leaves the
    batch when it ends: the same samples in distribution (softmax of ``logits / temperature``,
    ``top_p``), without the padding rows ``generate`` keeps computing. Everything else in the step (rewards,
    advantages, logps, the loss) is TRL's. For GPUs, TRL's ``use_vllm`` does this job.

    Args:
        prompts: N conversational prompts (lists of messages), as the trainer passes them: each
            prompt's ``num_generations`` copies adjacent (TRL's ``RepeatSampler``).
        trainer: the ``GRPOTrainer``; its ``temperature``, ``top_p``, ``max_completion_length``,
            ``eos_token_ids`` and ``chat_template_kwargs`` are used.
    Returns:
        ``{"prompt_ids": N lists, "completion_ids": N lists (up to and including the first eos
        token, as TRL keeps it), "logprobs": None}`` (no sampling logprobs: TRL computes its own).
    """
    from .evaluation import decode

    if trainer.top_k not in (0, None) or trainer.min_p is not None or trainer.repetition_penalty != 1.0:
        raise ValueError("decode_rollout samples with temperature and top_p only: leave top_k, min_p and "
                         "repetition_penalty at their defaults, or drop rollout_func (TRL's generate)")
    if trainer.use_vllm:
        raise ValueError("decode_rollout is the CPU path: with use_vllm=True, drop rollout_func (vLLM samples)")
    if trainer.tools:
        raise ValueError("decode_rollout samples single turns: with tools, drop rollout_func (TRL's generate)")
    tok = trainer.processing_class
    prompt_ids = tok.apply_chat_template(conversation=prompts, chat_template=trainer.chat_template,
                                         add_generation_prompt=True, tokenize=True, return_dict=True,
                                         **trainer.chat_template_kwargs)["input_ids"]
    # groups of identical adjacent prompts: each is read once
    n = trainer.num_generations
    grouped = len(prompts) % n == 0 and all(prompt_ids[i] == prompt_ids[i - i % n] for i in range(len(prompts)))
    n = n if grouped else 1
    enc = tok.pad({"input_ids": prompt_ids[::n]}, return_tensors="pt", padding_side="left")
    input_ids, attention_mask = (enc[k].to(trainer.accelerator.device) for k in ("input_ids", "attention_mask"))
    model = trainer.accelerator.unwrap_model(trainer.model)
    was_training = model.training
    model.eval()
    try:
        new = decode(model, input_ids, attention_mask, max_new_tokens=trainer.max_completion_length,
                     stop_ids=list(trainer.eos_token_ids), pad_token_id=tok.pad_token_id, do_sample=True,
                     temperature=trainer.temperature, top_p=trainer.top_p, num_return_sequences=n)
    finally:
        model.train(was_training)
    stops = set(trainer.eos_token_ids)
    completion_ids = []
    for row in new.tolist():
        end = next((i for i, t in enumerate(row) if t in stops), len(row) - 1)
        completion_ids.append(row[:end + 1])
    return {"prompt_ids": [list(p) for p in prompt_ids], "completion_ids": completion_ids, "logprobs": None}


# ----------------------------------------------------------------------------- lesson 05: where the clip binds
def completion_batch(tokenizer, prompts: list[str], completions: list[list[str]], stop_id: int,
                     max_completion_length: int) -> dict:
    """TRL's generation-batch layout for completions already sampled as text (lesson 05's clip probe).

    Args:
        prompts: P prompt strings (chat template applied); completions: P lists of G completion strings each.
        stop_id: the end token, appended to every completion shorter than ``max_completion_length`` tokens (one
            that long was cut there, with no end token, as in TRL's batches).
    Returns:
        dict of int64 tensors: ``prompt_ids``/``prompt_mask`` (P * G, S) left-padded, prompt p's rows adjacent;
        ``completion_ids``/``completion_mask`` (P * G, T) right-padded, the mask 1 up to and including the end token.
    """
    rows = [(p, c) for p, group in zip(prompts, completions) for c in group]
    prompt = tokenizer([p for p, _ in rows], add_special_tokens=False)["input_ids"]
    done = [ids[:max_completion_length] + ([stop_id] if len(ids) < max_completion_length else [])
            for ids in tokenizer([c for _, c in rows], add_special_tokens=False)["input_ids"]]
    S, T = max(map(len, prompt)), max(map(len, done))
    pad = tokenizer.pad_token_id

    def tensor(seqs, width, left):
        ids = [[pad] * (width - len(s)) + s if left else s + [pad] * (width - len(s)) for s in seqs]
        mask = [[0] * (width - len(s)) + [1] * len(s) if left else [1] * len(s) + [0] * (width - len(s)) for s in seqs]
        return torch.tensor(ids), torch.tensor(mask)

    (pi, pm), (ci, cm) = tensor(prompt, S, True), tensor(done, T, False)
    return {"prompt_ids": pi, "prompt_mask": pm, "completion_ids": ci, "completion_mask": cm}


def token_entropy_logps(model, batch: dict, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(entropy, logps), each (B, T) float32, of ``model``'s next-token distribution at each completion position
    (temperature 1), computed ``micro_batch`` rows at a time without gradients; padding positions meaningless."""
    out = []
    with torch.no_grad():
        for i in range(0, batch["completion_ids"].size(0), micro_batch):
            part = {k: v[i:i + micro_batch].to(model.device) for k, v in batch.items()}
            lp = _completion_log_softmax(model, part)
            out.append((-(lp.exp() * lp).sum(-1).cpu(), lp.gather(-1, part["completion_ids"].unsqueeze(-1))
                        .squeeze(-1).cpu()))
    return torch.cat([e for e, _ in out]), torch.cat([lp for _, lp in out])


def off_policy_steps(model, batch: dict, old_logps: torch.Tensor, advantages: torch.Tensor, *, surrogate_fn,
                     aggregate_fn, steps: int, learning_rate: float, eps_low: float, eps_high: float, lora_config,
                     micro_batch: int, seed: int = 0, max_grad_norm: float = 1.0,
                     gradient_checkpointing: bool = False) -> dict:
    """``steps`` optimizer steps of the clipped loss on one fixed batch, from a copy of ``model`` with a fresh LoRA
    adapter (AdamW): every step after the first is off-policy, as TRL's ``steps_per_generation`` and
    ``num_iterations`` make them, so the clip binds (lesson 05, "where the clip binds").

    The loss is ``aggregate_fn(surrogate_fn(logps, old_logps, advantages, eps_low, eps_high), mask, "dapo")``, DAPO's
    token mean, over the whole batch: each micro-batch's mean weighted by its share of the tokens, the gradients
    accumulated (lesson 04's ``clipped_surrogate`` and ``aggregate_loss``). ``model`` is not changed.
    Args:
        batch: :func:`completion_batch`'s dict, B rows; old_logps: (B, T) float32 under the sampling policy;
            advantages: (B,) float32.
    Returns:
        dict: ``"entropy"`` and ``"logps"`` (B, T) float32 of the trained copy (:func:`token_entropy_logps`);
        ``"up_clipped"``, per step, the share of completion tokens with ``A > 0`` and ``rho > 1 + eps_high`` in that
        step's forward pass (TRL's ``clip_ratio/high_mean``); ``"clipped"``, (B, T) bool, the tokens up-clipped in
        any step.
    """
    import copy

    from peft import get_peft_model

    torch.manual_seed(seed)   # the adapter's initialisation: the same for every clip compared
    policy = get_peft_model(copy.deepcopy(model), lora_config)
    if gradient_checkpointing:
        policy.enable_input_require_grads()
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy.train()
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)   # TrainingArguments' default decay
    mask = batch["completion_mask"].float()
    n_tokens, up_clipped, clipped = mask.sum(), [], torch.zeros(mask.shape, dtype=torch.bool)
    for _ in range(steps):
        up = 0.0
        for i in range(0, mask.size(0), micro_batch):
            part = {k: v[i:i + micro_batch].to(policy.device) for k, v in batch.items()}
            old, adv, m = (x[i:i + micro_batch].to(policy.device) for x in (old_logps, advantages, mask))
            logps = per_token_logps(policy, part)
            loss = aggregate_fn(surrogate_fn(logps, old, adv, eps_low, eps_high), m, "dapo") * (m.sum() / n_tokens)
            loss.backward()
            with torch.no_grad():
                now = ((logps - old).exp() > 1 + eps_high) & (adv[:, None] > 0) & (m > 0)
                up += now.sum().item()
                clipped[i:i + micro_batch] |= now.cpu()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        up_clipped.append(up / n_tokens.item())
    policy.eval()
    entropy, logps = token_entropy_logps(policy, batch, micro_batch)
    del policy, optimizer
    return {"entropy": entropy, "logps": logps, "up_clipped": up_clipped, "clipped": clipped}
