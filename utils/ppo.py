"""PPO with a critic, and REINFORCE++, from scratch: the pieces lesson 07 (sections 7-8) trains with.

Each function computes what verl 0.9.1 computes (``verl/trainer/ppo/core_algos.py``,
``verl/utils/torch_functional.py``, ``apply_kl_penalty`` in ``verl/trainer/ppo/ray_trainer.py``),
written out so that a student can read it top to bottom; ``tests/side/test_verl.py`` runs verl's own
functions on the same inputs in the verl test venv and asserts equality to 1e-5. GAE itself is
lesson 07's graded exercise (``gae``), so it is not here.

One PPO iteration (verl's ``RayPPOTrainer.fit``, with ``algorithm.use_kl_in_reward=True``):

1. The policy samples responses; the reward (a verifier or a reward model) scores each one. The
   score sits on the response's **last** token, every other token gets 0 (verl's reward managers).
2. :func:`kl_in_reward`: every response token pays ``beta * (log pi_old - log pi_ref)`` (verl's
   ``kl_penalty="kl"``, the k1 estimate), so the reward is per token.
3. Advantages: GAE over the critic's values (``adv_estimator=gae``), whitened over the batch
   (:func:`masked_whiten`); or, with no critic, REINFORCE++'s whitened returns
   (:func:`reinforce_pp_advantages`).
4. The actor minimises :func:`policy_loss` (clipped surrogate, token mean) minus
   ``entropy_coeff`` times :func:`entropy_from_logits`'s token mean; the critic minimises
   :func:`value_loss` (clipped, towards the returns).

:func:`remove_padding` and :func:`restore_padding` are for speed only (verl's ``use_remove_padding``):
the loop's forward passes run on the batch's real tokens, packed, and give the padded batch's numbers.

Shapes: B sequences, T response positions (right-padded). ``mask`` is (B, T) float, 1.0 on
response tokens (up to and including the end-of-sequence token), 0.0 elsewhere.
"""
from __future__ import annotations

import torch

WHITEN_EPS = 1e-8   # verl: rsqrt(var + 1e-8)
LOG_RATIO_CLAMP = 20.0   # verl clamps log(pi / pi_old) to [-20, 20] before exp


def _check_mask(mask: torch.Tensor, like: torch.Tensor, name: str = "values") -> None:
    if mask.shape != like.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)} but {name} has {tuple(like.shape)}: both are (B, T)")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1 (over everything, or along ``dim``); 0 where the mask is empty.

    Args:
        values, mask: (B, T) float.
    Returns:
        () float, or (B,) / (T,) along ``dim``: ``sum(values * mask) / (sum(mask) + 1e-8)`` as verl.
    """
    _check_mask(mask, values)
    if dim is None:
        return (values * mask).sum() / (mask.sum() + WHITEN_EPS)
    return (values * mask).sum(dim) / (mask.sum(dim) + WHITEN_EPS)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``values`` by the mean and (unbiased) variance of the masked entries of the whole batch.

    Args:
        values, mask: (B, T) float; at least two masked entries.
        shift_mean: True: zero mean; False: the mean is added back after scaling (verl's option).
    Returns:
        (B, T) float: ``(values - mean) / sqrt(var + 1e-8)`` on every position (masked ones too:
        multiply by the mask where it matters), ``var`` with Bessel's correction ``n / (n - 1)``.
    """
    _check_mask(mask, values)
    n = mask.sum()
    if n < 2:
        raise ValueError(f"masked_whiten needs at least 2 masked entries to estimate a variance, got {n.item():g}: "
                         "use a larger batch")
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask) * n / (n - 1)
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    return whitened + mean if not shift_mean else whitened


def last_token_scores(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One score per response, placed on its last response token (what verl's reward managers build).

    Args:
        scores: (B,) float, the reward of each whole response.
        mask: (B, T) float response mask; every row has at least one response token.
    Returns:
        (B, T) float ``token_level_scores``: ``scores[b]`` at the last t with ``mask[b, t] == 1``, 0 elsewhere.
    """
    if scores.shape != mask.shape[:1]:
        raise ValueError(f"scores must be (B,) = ({mask.shape[0]},), got {tuple(scores.shape)}")
    if (mask.sum(1) == 0).any():
        raise ValueError("a response with no token (an all-zero mask row) has nowhere to put its score")
    last = mask.shape[1] - 1 - (mask > 0).flip(1).int().argmax(dim=1)    # argmax: the first 1 from the right
    out = torch.zeros_like(mask, dtype=scores.dtype)
    out[torch.arange(len(last), device=mask.device), last] = scores
    return out


def kl_in_reward(token_level_scores: torch.Tensor, logps: torch.Tensor, ref_logps: torch.Tensor,
                 mask: torch.Tensor, beta: float) -> tuple[torch.Tensor, float]:
    """Fold the KL to the reference into the reward, per token (verl: ``algorithm.use_kl_in_reward=True``).

    Args:
        token_level_scores: (B, T) float, from :func:`last_token_scores`.
        logps, ref_logps: (B, T) float, log-probs of the sampled tokens under the sampling policy
            and the reference (no gradient flows through either).
        mask: (B, T) float.
        beta: float, ``algorithm.kl_ctrl.kl_coef``.
    Returns:
        ``(token_level_rewards, kl)``: (B, T) float ``scores - beta * (logps - ref_logps) * mask``,
        and the float KL verl logs (``actor/reward_kl_penalty``): the per-sequence token mean of
        ``logps - ref_logps``, averaged over the batch.
    """
    _check_mask(mask, token_level_scores, "token_level_scores")
    kld = (logps - ref_logps) * mask
    return token_level_scores - beta * kld, masked_mean(kld, mask, dim=-1).mean().item()


def reinforce_pp_advantages(token_level_rewards: torch.Tensor, mask: torch.Tensor,
                            gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): no critic; each token's return, whitened over the global batch.

    Args:
        token_level_rewards: (B, T) float, from :func:`kl_in_reward` (the KL is part of the reward).
        mask: (B, T) float; positions with mask 0 (tool output, padding) pass the return through.
        gamma: float, the discount (``algorithm.gamma``; 1.0 for language).
    Returns:
        ``(advantages, returns)``, each (B, T) float: ``returns[t] = r_t + gamma * returns[t+1]``
        on response tokens (0 elsewhere), and the advantages ``masked_whiten(returns) * mask``:
        the baseline is the whole batch's mean return, not a group's (GRPO, RLOO) nor a critic's.
    """
    _check_mask(mask, token_level_rewards, "token_level_rewards")
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        new = token_level_rewards[:, t] + gamma * running
        returns[:, t] = new * mask[:, t]
        running = new * mask[:, t] + running * (1 - mask[:, t])
    return masked_whiten(returns, mask) * mask, returns


def policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                clip_ratio_c: float = 3.0) -> tuple[torch.Tensor, dict]:
    """PPO's clipped surrogate with dual clip, token mean (verl's ``compute_policy_loss_vanilla``).

    Args:
        logps: (B, T) float, log-probs of the sampled tokens under the policy being trained (with grad).
        old_logps: (B, T) float, the same under the policy that sampled them (constants).
        advantages: (B, T) float, one per token (GAE or REINFORCE++), constants.
        mask: (B, T) float.
        clip_ratio_low, clip_ratio_high: the ratio is clipped to [1 - low, 1 + high] (TRL: ``epsilon``,
            ``epsilon_high``).
        clip_ratio_c: dual clip (Ye et al. 2020, arXiv 1912.09729): for A < 0 the loss is capped at
            ``-A * c``, so one token whose ratio exploded cannot dominate the batch; must be > 1.
    Returns:
        ``(loss, metrics)``: () float, the token mean over the whole batch of
        ``max(-A * rho, -A * clip(rho))`` (capped at ``-A * c`` where ``A < 0``), ``rho =
        exp(clamp(logps - old_logps, -20, 20))``; metrics (floats): ``pg_clipfrac`` (tokens where
        the clipped term is the larger), ``pg_clipfrac_lower`` (where the dual clip binds),
        ``ppo_kl`` (token mean of ``old_logps - logps``).
    """
    _check_mask(mask, logps, "logps")
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (a cap above the clipped loss), got {clip_ratio_c}")
    log_ratio = torch.clamp(logps - old_logps, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    surrogate = torch.maximum(unclipped, clipped)
    capped = torch.minimum(-advantages * clip_ratio_c, surrogate)
    losses = torch.where(advantages < 0, capped, surrogate)
    metrics = {"pg_clipfrac": masked_mean((clipped > unclipped).float(), mask).item(),
               "pg_clipfrac_lower": masked_mean(((surrogate > -advantages * clip_ratio_c) & (advantages < 0)).float(),
                                                mask).item(),
               "ppo_kl": masked_mean(-log_ratio, mask).item()}
    return masked_mean(losses, mask), metrics


def value_loss(vpreds: torch.Tensor, values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               cliprange_value: float = 0.5) -> tuple[torch.Tensor, float]:
    """The critic's clipped value loss, token mean (verl's ``compute_value_loss``; ``critic.cliprange_value``).

    Args:
        vpreds: (B, T) float, the critic's values now (with grad).
        values: (B, T) float, its values when the batch was sampled (constants).
        returns: (B, T) float, the targets (GAE's ``advantages + values``, before whitening).
        mask: (B, T) float.
        cliprange_value: the new value may move at most this far from ``values`` before the
            clipped term takes over.
    Returns:
        ``(loss, clipfrac)``: ``0.5 * token_mean(max((vpreds - R)^2, (clip(vpreds, values +- c) - R)^2))``
        and the share of tokens where the clipped term is the larger.
    """
    _check_mask(mask, vpreds, "vpreds")
    clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped_loss, clipped_loss = (vpreds - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped_loss, clipped_loss), mask)
    return loss, masked_mean((clipped_loss > unclipped_loss).float(), mask).item()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's next-token distribution.

    Args:
        logits: (B, T, V) float.
    Returns:
        (B, T) float: ``logsumexp(logits) - sum(softmax(logits) * logits)`` (verl's form, in nats).
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def remove_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor, max_length: int | None = None) -> dict:
    """A padded batch without its padding, for one forward pass (verl's ``use_remove_padding``).

    Every row's real tokens (``attention_mask`` 1), in order, become one sequence; the sequences are laid
    one after another into as few rows as fit (:func:`utils.sft.first_fit`), each with ``position_ids``
    that restart at 0. Called with no ``attention_mask`` and ``use_cache=False``, transformers reads
    the restarts as sequence boundaries and keeps each sequence's attention to itself
    (``masking_utils.find_packed_sequence_indices``, as lesson 02's packed SFT): the outputs are the
    padded batch's, up to float rounding, and the padding is never computed.

    Args:
        input_ids, attention_mask: (B, L) int64, padded on the left, the right or both.
        max_length: capacity of a packed row (default: the longest sequence).
    Returns:
        dict: ``input_ids`` and ``position_ids``, (R, S) int64 with R <= B, for the model (the end of a
        row is filled with token 0 and counts on as one more sequence); and ``index``, (B, L) int64:
        where each position of the padded batch sits in the packed rows flattened (``row * S + column``),
        -1 on padding. :func:`restore_padding` puts the model's outputs back with it.
    """
    from .sft import first_fit

    if input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
                         "must both be (B, L)")
    real = attention_mask.bool()
    lengths = real.sum(1).tolist()
    if min(lengths) == 0:
        raise ValueError("a row of padding only has nothing to compute: drop it from the batch")
    max_length = max_length or max(lengths)
    if max(lengths) > max_length:
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit max_length={max_length}")
    rows = first_fit(lengths, max_length)
    S = max(sum(lengths[i] for i in row) for row in rows)
    packed = input_ids.new_zeros(len(rows), S)
    position_ids = torch.arange(S, device=input_ids.device).repeat(len(rows), 1)
    index = torch.full_like(input_ids, -1)
    for r, row in enumerate(rows):
        start = 0
        for i in row:
            n = lengths[i]
            packed[r, start:start + n] = input_ids[i][real[i]]
            position_ids[r, start:start + n] = torch.arange(n, device=input_ids.device)
            index[i][real[i]] = r * S + start + torch.arange(n, device=input_ids.device)
            start += n
        position_ids[r, start:] = torch.arange(S - start, device=input_ids.device)
    return {"input_ids": packed, "position_ids": position_ids, "index": index}


def restore_padding(outputs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The outputs of a packed forward pass, back in the padded batch's layout.

    Args:
        outputs: (R, S, ...) the model's output on :func:`remove_padding`'s rows (logits, values).
        index: (B, L') int64, :func:`remove_padding`'s ``index``, or some of its columns.
    Returns:
        (B, L', ...) ``outputs`` at each position of the padded batch, 0 where ``index`` is -1
        (padding); differentiable with respect to ``outputs``.
    """
    flat = outputs.flatten(0, 1)[index.clamp(min=0)]
    return flat * (index >= 0).view(*index.shape, *[1] * (flat.dim() - index.dim())).to(flat.dtype)


def state_bytes(model, optimizer=None) -> dict:
    """Bytes a model holds in memory: weights, gradients and the optimizer's state (AdamW: two moments).

    Returns:
        ``{"weights", "grads", "optimizer", "total"}`` in bytes, counted from the tensors themselves
        (exact, not a measurement of the process); the optimizer's state exists after its first step.
    """
    params = list(model.parameters())
    out = {"weights": sum(p.numel() * p.element_size() for p in params),
           "grads": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
           "optimizer": 0}
    if optimizer is not None:
        out["optimizer"] = sum(v.numel() * v.element_size() for s in optimizer.state.values()
                               for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    out["total"] = out["weights"] + out["grads"] + out["optimizer"]
    return out
