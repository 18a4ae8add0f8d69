"""GRPO-style policy-gradient pieces, written out (reference implementations for the RL lesson).

One GRPO step, in the order the pieces below are used:

1. Sample ``G`` completions per prompt (TRL: ``num_generations``) and score each one with the
   reward functions. The rewards form a (N,) tensor, ``N = num_prompts * G``, each prompt's
   group being ``G`` consecutive entries (TRL's ``RepeatSampler`` layout).
2. :func:`group_advantages`: the reward minus its group's mean, divided by a std chosen by
   ``scale`` (TRL: ``scale_rewards`` = ``"group"`` / ``"batch"`` / ``"none"``, ``eps = 1e-4``).
   :func:`rloo_advantages` is the leave-one-out alternative (TRL's ``RLOOTrainer``).
3. :func:`clipped_surrogate`: the PPO clipped objective per token, with the ratio
   ``rho = pi / pi_old`` clipped to ``[1 - epsilon, 1 + epsilon_high]`` (TRL: ``epsilon``,
   ``epsilon_high``; ``epsilon_high=None`` means ``epsilon``).
4. :func:`k3_kl`: the per-token k3 estimate of KL(pi || pi_ref), weighted by ``beta`` and added to
   the per-token loss *before* aggregation (TRL: ``beta``; with ``beta = 0``, TRL's default, no
   reference model is loaded at all). Careful: TRL 1.16 also defaults to
   ``use_bias_correction_kl=True``, which multiplies the per-token KL by the *unclipped* ratio
   ``rho = exp(logps - old_logps)`` first. On-policy that leaves the value unchanged (rho = 1) but
   not the gradient. To reproduce it::

       per_token = (clipped_surrogate(logps, old_logps, A, eps, eps_high)
                    + beta * torch.exp(logps - old_logps) * k3_kl(logps, ref_logps))

   With ``use_bias_correction_kl=False`` the KL term is just ``beta * k3_kl(logps, ref_logps)``.
5. :func:`aggregate_loss`: one scalar from the (B, T) per-token losses and the completion mask,
   the four ways TRL's ``loss_type`` offers (``"grpo"``, ``"bnpo"``, ``"dr_grpo"``, ``"dapo"``,
   TRL's default).
   :func:`masked_mean` and :func:`masked_normalize` are the two reductions behind them.

The formulas match TRL 1.16's ``GRPOTrainer`` (``trl/trainer/grpo_trainer.py``):
``_generate_and_score_completions`` for the advantages (``multi_objective_aggregation=
"sum_then_normalize"``, its default) and ``_compute_loss`` for the clipped surrogate, the KL term
and the loss aggregation (``importance_sampling_level="token"``, no vLLM importance-sampling
correction, no entropy mask or bonus, ``delta=None``: all TRL defaults). ``tests/test_rl.py`` checks
them (value and gradient) against the loss the trainer itself computes on real generations.
The trainer logs what these pieces measure: ``kl`` (masked token mean of the KL term, after the
ratio weighting),
``clip_ratio/low_mean`` (tokens with ``rho < 1 - epsilon`` and ``A < 0``), ``clip_ratio/high_mean``
(``rho > 1 + epsilon_high`` and ``A > 0``), ``clip_ratio/region_mean`` (either), all token means
over the mask, plus ``clip_ratio/low_min`` / ``clip_ratio/high_max`` over per-sequence means.

Shapes: B sequences (completions) in a batch, T completion positions (right-padded), N rewards.
"""
from __future__ import annotations

import torch

SCALES = ("group", "batch", "none")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


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


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantages: each reward relative to the other completions of the same prompt.

    Args:
        rewards: (N,) float; ``rewards[g*G:(g+1)*G]`` are the G = ``group_size`` completions of
            prompt g (TRL: ``num_generations``). Integer rewards are converted to float32.
        group_size: G, the number of completions per prompt.
        scale: TRL's ``scale_rewards``: ``"group"`` divides by each group's std, ``"batch"`` by the
            std of all N rewards, ``"none"`` does not divide.
        eps: added to the std (TRL hard-codes 1e-4), so a group whose rewards are all equal gets
            advantages of exactly 0 instead of 0/0.
    Returns:
        (N,) float, same dtype as ``rewards``::

            A_i = (r_i - mean(group of i)) / (std + eps)    std = group std ("group") or batch std ("batch")
            A_i =  r_i - mean(group of i)                   ("none")

        std is the unbiased (Bessel-corrected, divides by n - 1) standard deviation, torch's default
        and TRL's ``nanstd``. As in TRL, a single-element group (or batch) has std 0, not NaN.
        TRL also skips NaN rewards (a completion every reward function returned None for) and
        sets their advantage to 0; here all rewards must be finite.
    """
    rewards = _check_groups(rewards, group_size)
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; expected one of {SCALES} "
                         "(TRL's scale_rewards=True/False mean 'group'/'none')")
    grouped = rewards.view(-1, group_size)                                   # (N/G, G)
    mean = grouped.mean(dim=1).repeat_interleave(group_size)                 # (N,)
    advantages = rewards - mean
    if scale == "none":
        return advantages
    if scale == "group":
        std = grouped.std(dim=1).repeat_interleave(group_size) if group_size > 1 else torch.zeros_like(rewards)
    else:  # "batch"
        std = rewards.std().expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    return advantages / (std + eps)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out advantages: each reward minus the mean of the *other* rewards of its group.

    Args:
        rewards: (N,) float, groups of ``group_size`` consecutive entries (as in :func:`group_advantages`).
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


# ----------------------------------------------------------------------------- DAPO (lesson 05)
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


def dynamic_sampling(sample_group, prompts, num_groups: int, group_size: int):
    """DAPO's dynamic sampling: keep drawing prompts until ``num_groups`` groups have varied rewards.

    Groups whose G rewards are all equal (every completion right, or every one wrong) have zero
    advantage everywhere and only dilute the batch; DAPO drops them and refills the batch with
    groups sampled for further prompts (Yu et al. 2025, "over-sample and filter out prompts with
    accuracy equal to 1 and 0").

    Args:
        sample_group: callable, ``sample_group(prompt) -> sequence of G rewards`` (floats): it
            generates G completions for the prompt and scores them.
        prompts: iterable of prompts, consumed in order.
        num_groups: how many groups with varied rewards the batch needs.
        group_size: G; every group must have exactly G rewards.
    Returns:
        ``(kept, stats)``: ``kept`` is a list of ``(prompt, rewards)`` for the first ``num_groups``
        groups whose rewards are not all equal; ``stats`` is ``{"sampled": groups generated,
        "dropped": groups without signal, "exhausted": True when the prompts ran out first}``.
        The cost of the filter is ``sampled / num_groups`` times the generation of a plain batch.
    """
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    kept, sampled = [], 0
    for prompt in prompts:
        rewards = [float(r) for r in sample_group(prompt)]
        if len(rewards) != group_size:
            raise ValueError(f"sample_group returned {len(rewards)} rewards for one prompt, expected {group_size}")
        sampled += 1
        if max(rewards) != min(rewards):
            kept.append((prompt, rewards))
            if len(kept) == num_groups:
                break
    return kept, {"sampled": sampled, "dropped": sampled - len(kept), "exhausted": len(kept) < num_groups}


def soft_overlong_penalty(lengths, max_completion_length: int, cache_length: int) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13), one reward term per completion.

    Args:
        lengths: sequence of completion lengths |y| in tokens (ints).
        max_completion_length: L_max.
        cache_length: L_cache, the width of the ramp before L_max (0 < L_cache <= L_max).
    Returns:
        list of floats: 0 for |y| <= L_max - L_cache; ``(L_max - L_cache - |y|) / L_cache`` (from 0
        down to -1) on the ramp L_max - L_cache < |y| <= L_max; -1 beyond L_max. Added to the task
        reward, it punishes rambling towards the limit without punishing length elsewhere.
        TRL ships the same function as ``trl.rewards.get_soft_overlong_punishment``.
    """
    if not 0 < cache_length <= max_completion_length:
        raise ValueError(f"need 0 < cache_length <= max_completion_length, got {cache_length} and "
                         f"{max_completion_length}")
    start = max_completion_length - cache_length
    return [0.0 if n <= start else (start - n) / cache_length if n <= max_completion_length else -1.0
            for n in lengths]


# ----------------------------------------------------------------------------- masked reductions
def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1.

    Args:
        values: (..., T) float.
        mask: same shape, bool/int/float, 1 (True) on positions to count, 0 elsewhere.
        dim: dimension to reduce; None reduces over all elements.
    Returns:
        ``sum(values * mask, dim) / sum(mask, dim)``: a 0-d tensor if ``dim`` is None, else
        ``values`` with ``dim`` removed. No clamping: a row with no unmasked position gives NaN.
    """
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum()
    return (values * mask).sum(dim) / mask.sum(dim)


def masked_normalize(values: torch.Tensor, mask: torch.Tensor, constant: float,
                     dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` over the positions where ``mask`` is 1, divided by a fixed ``constant``.

    Args:
        values: (..., T) float.
        mask: same shape, bool/int/float.
        constant: the normalizer (e.g. ``B * max_completion_length`` in Dr. GRPO).
        dim: dimension to sum over; None sums over all elements.
    Returns:
        ``sum(values * mask, dim) / constant``: 0-d if ``dim`` is None, else ``dim`` removed.
    """
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / constant
    return (values * mask).sum(dim) / constant


# ----------------------------------------------------------------------------- per-token terms
def clipped_surrogate(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                      eps_low: float = 0.2, eps_high: float | None = None) -> torch.Tensor:
    """PPO/GRPO clipped surrogate loss per token.

    Args:
        logps: (B, T) float, log pi(o_t | q, o_<t) of the sampled tokens under the current policy
            (with gradient).
        old_logps: (B, T) float, the same under the policy that sampled them (no gradient). With one
            optimizer step per generation batch (TRL: ``num_iterations=1``) it equals
            ``logps.detach()``, so ``rho = 1`` and only the gradient is non-trivial.
        advantages: (B,) or (B, 1) float, one advantage per sequence, broadcast over its tokens
            ((B, T) per-token advantages broadcast too).
        eps_low: TRL's ``epsilon``; the ratio is clipped below at ``1 - eps_low``.
        eps_high: TRL's ``epsilon_high`` (DAPO's "clip-higher" uses 0.28); None means ``eps_low``.
    Returns:
        (B, T) float::

            rho  = exp(logps - old_logps)
            loss = -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)

        Padding positions are not masked here; :func:`aggregate_loss` does that.
    """
    if eps_high is None:
        eps_high = eps_low
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)                                 # (B, 1)
    ratio = torch.exp(logps - old_logps)                                     # (B, T)
    clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    return -torch.min(ratio * advantages, clipped_ratio * advantages)


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) (Schulman, "Approximating KL divergence").

    Args:
        logps: (B, T) float, log pi of the sampled tokens under the policy.
        ref_logps: (B, T) float, log pi_ref of the same tokens under the frozen reference.
    Returns:
        (B, T) float, ``exp(ref - logp) - (ref - logp) - 1``: >= 0 everywhere, 0 where the two
        log-probs are equal, unbiased for KL(pi || pi_ref) on tokens sampled from pi.
    """
    return torch.exp(ref_logps - logps) - (ref_logps - logps) - 1


# ----------------------------------------------------------------------------- aggregation
def aggregate_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str,
                   max_completion_length: int | None = None) -> torch.Tensor:
    """Reduce (B, T) per-token losses to the scalar loss, as TRL's ``loss_type`` does.

    Args:
        per_token_loss: (B, T) float (e.g. ``clipped_surrogate(...) + beta * k3_kl(...)``).
        mask: (B, T) bool/int, 1 on completion tokens that count (TRL's ``completion_mask``).
        loss_type: one of
            ``"grpo"``:    mean over each sequence's tokens, then mean over sequences
                           ``mean_b( sum_t(l*m)[b] / max(sum_t m[b], 1) )`` -- a sequence with no
                           unmasked token contributes 0 and still counts in the mean over B;
            ``"bnpo"``:    ``sum(l*m) / max(sum(m), 1)`` over the whole (local) batch;
            ``"dr_grpo"``: ``sum(l*m) / (B * max_completion_length)``, a constant normalizer;
            ``"dapo"``:    ``sum(l*m) / max(sum(m), 1)``: the token count of the batch passed in.
        max_completion_length: required by ``"dr_grpo"`` (TRL: ``max_completion_length``).
    Returns:
        0-d float tensor.

    How this relates to TRL 1.16 (``GRPOTrainer._compute_loss``), which computes the loss per
    micro-batch of ``per_device_train_batch_size`` sequences:

    * "grpo", "bnpo", "dr_grpo": the formulas above on the micro-batch, then divided by the number
      of gradient-accumulation steps (in train mode), so that summing the micro-batch losses of one
      optimizer step averages them. With ``gradient_accumulation_steps=1`` TRL's loss is ours.
    * "dapo": ``sum(l*m) / normalizer`` with ``normalizer = num_items_in_batch.clamp(min=1)
      / num_processes * gradient_accumulation_steps / steps_per_generation`` (train mode), where
      ``num_items_in_batch`` is the mask sum of the whole *generation batch* (all
      ``steps_per_generation`` micro-batches), summed over all processes. Ours uses the mask sum of
      the tensors passed in, so the two are equal exactly when ``mask`` is the whole generation
      batch of a single process: one process and ``steps_per_generation ==
      gradient_accumulation_steps == 1`` (a generation batch of ``per_device_train_batch_size``
      sequences, one optimizer step per generation). With ``steps_per_generation ==
      gradient_accumulation_steps = k`` (TRL's default ``steps_per_generation``), ours on the full
      generation batch equals the *sum* of TRL's k micro-batch losses, i.e. the step's loss. In
      eval mode TRL uses ``num_items_in_batch / num_processes``, again ours in one process.
    * "bnpo" differs from "dapo" only there: it always normalizes by the micro-batch's own tokens.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {LOSS_TYPES}")
    mask = mask.to(per_token_loss.dtype)
    masked = per_token_loss * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type in ("bnpo", "dapo"):
        return masked.sum() / mask.sum().clamp(min=1.0)
    # "dr_grpo"
    if max_completion_length is None:
        raise ValueError("loss_type='dr_grpo' normalizes by B * max_completion_length: "
                         "pass max_completion_length (TRL: GRPOConfig.max_completion_length)")
    return masked_normalize(per_token_loss, mask, per_token_loss.size(0) * max_completion_length)


# ----------------------------------------------------------------------------- log-probabilities
def completion_logps(model, batch: dict, temperature: float = 1.0) -> torch.Tensor:
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
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    T = batch["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, -T - 1:-1].float()
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


# ----------------------------------------------------------------------------- TRL configuration
def _rl_kwargs(cfg, output_dir, overrides: dict) -> dict:
    """The fields ``GRPOConfig`` and ``RLOOConfig`` share, from a resolved lesson-04/05 preset."""
    import importlib.util

    from .sft import trainer_kwargs

    steps_per_generation = getattr(cfg, "steps_per_generation", None) or cfg.grad_accum
    if steps_per_generation % cfg.grad_accum:
        raise ValueError(f"steps_per_generation ({steps_per_generation}) must be a multiple of grad_accum "
                         f"({cfg.grad_accum}): each optimizer step takes grad_accum micro-batches of one generation batch")
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

    :func:`utils.sft.trainer_kwargs` (precision and activation checkpointing explicit: TRL's
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
    ``top_p``), at about half the cost on the tiny model. Everything else in the step (rewards,
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
