"""Direct Preference Optimization helpers for lesson 03 (the loss itself is the lesson's exercise).

The batch layout is TRL's (``DataCollatorForPreference``): ``2B`` right-padded rows, the B chosen
sequences first, then the B rejected ones, each ``prompt + completion``, with a ``completion_mask``
of 1 on the completion tokens. :func:`implicit_rewards` scores pairs with the ``sequence_logps``
it is given: in the lesson, the student's own.

Preference data is made *on-policy* by :func:`preference_pairs`: sample several answers
per prompt from the SFT model and let the verifiable reward pick a correct, well-formatted
answer as *chosen* and a wrong one as *rejected*.
"""
from __future__ import annotations

import random

import torch

from . import data, evaluation, rewards, ttc
from .training import trainer_kwargs


def dpo_config(cfg, output_dir, **overrides):
    """``trl.DPOConfig`` for a resolved lesson-03 preset: :func:`utils.training.trainer_kwargs` (precision and
    checkpointing explicit) plus ``beta`` and ``max_length``. ``overrides``: any DPOConfig field."""
    from trl import DPOConfig

    return DPOConfig(**{**trainer_kwargs(cfg, output_dir), "beta": cfg.beta, "max_length": cfg.max_length,
                        **overrides})


def kto_config(cfg, output_dir, **overrides):
    """``trl.KTOConfig`` for a resolved lesson-03 preset, as :func:`dpo_config` (``beta``, ``max_length``, the preset's
    learning rate, not KTOConfig's 1e-6) with the reference log-probabilities computed once before training.
    ``overrides``: any KTOConfig field."""
    from trl import KTOConfig

    return KTOConfig(**{**trainer_kwargs(cfg, output_dir), "beta": cfg.beta, "max_length": cfg.max_length,
                        "precompute_ref_log_probs": True, **overrides})


# ----------------------------------------------------------------------------- batches
def tokenize_pair(tokenizer, pair: dict) -> dict:
    """Token ids of a conversational preference example, split as TRL splits them.

    Args:
        pair: ``{"prompt": [messages], "chosen": [assistant message], "rejected": [assistant message]}``.
    Returns:
        ``{"prompt_ids", "chosen_ids", "rejected_ids"}`` (lists of ints): the prompt rendered with the
        generation prompt, and each completion as the rest of the rendered conversation
        (the assistant's content, ``<|im_end|>`` and the template's newline).
    """
    def render(messages, **kw):
        return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kw)

    prompt = render(pair["prompt"], add_generation_prompt=True)
    out = {"prompt_ids": prompt}
    for side in ("chosen", "rejected"):
        full = render(pair["prompt"] + pair[side])
        if full[:len(prompt)] != prompt:
            raise ValueError("the chat template renders the prompt differently once an answer follows; "
                             "cannot split prompt and completion")
        out[f"{side}_ids"] = full[len(prompt):]
    return out


def collate_pairs(examples: list[dict], pad_token_id: int) -> dict:
    """TRL's preference batch from tokenized pairs (:func:`tokenize_pair`).

    Returns int64 tensors of shape (2B, T), right-padded: ``input_ids``, ``attention_mask``
    and ``completion_mask``; rows 0..B-1 are prompt+chosen, rows B..2B-1 prompt+rejected.
    """
    seqs, masks = [], []
    for side in ("chosen", "rejected"):
        for e in examples:
            seqs.append(e["prompt_ids"] + e[f"{side}_ids"])
            masks.append([0] * len(e["prompt_ids"]) + [1] * len(e[f"{side}_ids"]))
    T = max(len(s) for s in seqs)
    batch = {k: torch.full((len(seqs), T), fill, dtype=torch.long)
             for k, fill in (("input_ids", pad_token_id), ("attention_mask", 0), ("completion_mask", 0))}
    for i, (s, m) in enumerate(zip(seqs, masks)):
        batch["input_ids"][i, :len(s)] = torch.tensor(s)
        batch["attention_mask"][i, :len(s)] = 1
        batch["completion_mask"][i, :len(s)] = torch.tensor(m)
    return batch


@torch.no_grad()
def implicit_rewards(model, ref_model, tokenizer, pairs: list[dict], beta: float, sequence_logps,
                     batch_size: int = 32):
    """Implicit rewards ``beta * log(pi / pi_ref)`` of every pair's chosen and rejected answer.

    Args:
        pairs: TRL conversational preference rows (``{"prompt", "chosen", "rejected"}``).
        sequence_logps: ``sequence_logps(logits (N, T, V), input_ids (N, T), completion_mask (N, T))
            -> (N,)`` summed completion log-probabilities (lesson 03's exercise: pass yours).
    Returns ``(chosen, rejected)``, two (N,) float tensors on the CPU. The preference accuracy
    is ``(chosen > rejected).float().mean()``.
    """
    device = next(model.parameters()).device
    chosen, rejected = [], []
    for i in range(0, len(pairs), batch_size):
        batch = collate_pairs([tokenize_pair(tokenizer, p) for p in pairs[i:i + batch_size]], tokenizer.pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        pi, ref = (sequence_logps(m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    use_cache=False).logits, batch["input_ids"], batch["completion_mask"])
                   for m in (model, ref_model))
        c, r = (beta * (pi - ref)).float().cpu().chunk(2)
        chosen.append(c)
        rejected.append(r)
    return torch.cat(chosen), torch.cat(rejected)


@torch.no_grad()
def sample_answers(model, tokenizer, prompts: list[str], max_new_tokens: int = 96) -> dict:
    """One answer per prompt sampled from ``model`` at temperature 1 (no top-k/top-p): a sample of pi itself.

    Args:
        prompts: B prompt strings (chat template applied); they are padded on the left.
    Returns:
        int64 tensors of shape (B, T), the inputs of a forward pass over prompt + answer:
        ``input_ids``, ``attention_mask``, ``position_ids`` (as ``generate`` numbers left-padded rows)
        and ``completion_mask`` (1 on the answer's tokens up to and including the first stop token).
    """
    device = next(model.parameters()).device
    stops = torch.tensor(evaluation.stop_token_ids(tokenizer), device=device)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                    add_special_tokens=False).to(device)
    new = evaluation.decode(model, enc["input_ids"], enc["attention_mask"], max_new_tokens=max_new_tokens,
                            stop_ids=stops.tolist(), pad_token_id=tokenizer.pad_token_id, do_sample=True)
    seqs = torch.cat([enc["input_ids"], new], dim=1)
    ended = torch.isin(new, stops).long()
    valid = ((ended.cumsum(1) - ended) == 0).long()          # tokens up to and including the first stop
    attention = torch.cat([enc["attention_mask"], valid], dim=1)
    return {"input_ids": seqs, "attention_mask": attention,
            "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
            "completion_mask": torch.cat([torch.zeros_like(enc["attention_mask"]), valid], dim=1)}


@torch.no_grad()
def kl_to_reference(model, ref_model, tokenizer, problems: list[dict], max_new_tokens: int = 96,
                    batch_size: int = 64, forward_batch_size: int = 16, per_problem: bool = False):
    """Estimate of the sequence-level KL(pi || pi_ref) on chat prompts, in nats per answer.

    One answer y per problem is sampled from ``model`` at temperature 1 with no top-k/top-p (a
    sample of pi itself). Along it, the KL of the two next-token distributions is computed
    exactly over the vocabulary at every answer position, and summed up to and including the
    end-of-turn token (or ``max_new_tokens``):
    ``sum_t sum_v pi(v | x, y_<t) * (log pi(v | x, y_<t) - log pi_ref(v | x, y_<t))``.
    By the chain rule its expectation over y ~ pi is KL(pi(.|x) || pi_ref(.|x)), the same as the
    plain Monte-Carlo estimate ``log pi(y|x) - log pi_ref(y|x)``, with far less variance (and never
    negative). ``batch_size`` answers are sampled at a time and scored ``forward_batch_size`` at a
    time. Returns the mean over problems (a float), or with ``per_problem=True`` the (P,) float64 tensor of
    the per-problem estimates, whose mean is that float and whose standard error says how precisely the
    evaluation pinned it down (taught in lesson 03, section 8).
    """
    prompts = evaluation.format_prompts(tokenizer, problems, "chat")
    was_training = model.training
    model.eval()
    each = torch.zeros(len(prompts), dtype=torch.float64)
    try:
        for i in range(0, len(prompts), batch_size):
            batch = sample_answers(model, tokenizer, prompts[i:i + batch_size], max_new_tokens)
            # Score in chunks of similar length, each cut to its own columns: far less padding to compute
            # than one (N, T) pass (answers run from 10 to max_new_tokens tokens).
            for idx in batch["attention_mask"].sum(1).argsort().split(forward_batch_size):
                cols = batch["attention_mask"][idx].bool().any(0)   # contiguous: every row covers the prompt's end
                part = {k: v[idx][:, cols] for k, v in batch.items()}
                inputs = {k: part[k] for k in ("input_ids", "attention_mask", "position_ids")}
                logp, logq = (torch.log_softmax(m(**inputs, use_cache=False).logits[:, :-1].float(), dim=-1)
                              for m in (model, ref_model))
                kl_t = (logp.exp() * (logp - logq)).sum(-1)  # (n, T-1): KL of the distributions that drew tokens 1..T-1
                each[i + idx] = (kl_t * part["completion_mask"][:, 1:]).sum(1).double().cpu()
    finally:
        model.train(was_training)
    return each if per_problem else each.mean().item()


# ----------------------------------------------------------------------------- on-policy pairs
def sample_reward(text, truth) -> float:
    """The verifiable reward used to rank samples, from 0 to 4: ``2 * correct + formatted + working``.

    ``correct`` (0/1): well formatted and the final number equals ``truth``; ``formatted`` (0/1):
    :func:`utils.rewards.is_well_formatted`; ``working`` in [0, 1]: :func:`utils.ttc.verifier_score`,
    which re-does every ``a op b = c`` of the answer and checks the final number is the last result
    (0 for an answer without equations). So: correct with sound working 4, a correct bare guess 3,
    wrong with sound arithmetic 2, a wrong guess 1, malformed 0. Any correct answer outranks
    every wrong one. Never raises.
    """
    formatted = rewards.is_well_formatted(text)
    correct = formatted and rewards.answers_match(rewards.extract_answer(text, strict=True), truth)
    return 2.0 * correct + formatted + ttc.verifier_score(text)


def preference_pairs(model, tokenizer, problems: list[dict], n_samples: int = 4, temperature: float = 0.8,
                     max_new_tokens: int = 96, batch_size: int = 64, seed: int = 0,
                     dispreferred=None) -> tuple[list[dict], dict]:
    """On-policy preference pairs judged by the verifiable reward.

    For each problem, sample ``n_samples`` chat answers from ``model`` and score them with
    :func:`sample_reward`. *Chosen* candidates are the answers with the top reward, 4: correct,
    and their working checks out (a bare guess that happens to be right, or a right number after
    wrong arithmetic, is not worth imitating). When there is one and a wrong answer, the problem
    gives a ``kind="correctness"`` pair: *chosen* a candidate, *rejected* a worst-scored sample.
    With ``dispreferred`` (a function text -> bool, e.g. "is verbose"), chosen answers avoid the
    dispreferred style when they can, and a problem whose candidates come in both styles also
    gives a ``kind="style"`` pair (the reward cannot tell these two apart). No pair contradicts
    the style preference: when the chosen is in the dispreferred style, the rejected is a
    worst-scored wrong answer in that style too, and without one the problem gives no
    correctness pair (counted in ``conflicting``). Ties are broken with ``random.Random(seed)``.

    Returns ``(pairs, stats)``: TRL conversational preference rows (``data.to_preference``)
    with ``kind`` and the problem's ``answer`` added, and counts: ``problems``, ``samples``,
    ``sample_accuracy``, ``sample_shortcut_share`` (:func:`utils.data.is_shortcut`),
    ``correctness``, ``style``, ``all_correct``, ``all_wrong``, ``guessed_only`` (right only by
    bare guesses), ``unsound_only`` (right with working, but none whose arithmetic checks out)
    and ``conflicting`` (see above); those three give no pair; and ``answers``, every sampled
    answer (one list of ``n_samples`` texts per problem), for a caller that labels them itself
    (lesson 07's outcome reward model).
    """
    rng = random.Random(seed)
    prompts = evaluation.format_prompts(tokenizer, problems, "chat")
    samples = evaluation.generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, do_sample=True,
                                  temperature=temperature, num_return_sequences=n_samples, batch_size=batch_size)
    bad_style = dispreferred or (lambda text: False)
    pairs = []
    stats = {"problems": len(problems), "samples": len(problems) * n_samples, "correctness": 0, "style": 0,
             "all_correct": 0, "all_wrong": 0, "guessed_only": 0, "unsound_only": 0, "conflicting": 0}
    n_correct = n_shortcut = 0
    for problem, answers in zip(problems, samples):
        truth = data.final_answer(problem["answer"])
        scored = [(sample_reward(a, truth), a) for a in answers]
        n_good = sum(r >= 3 for r, _ in scored)      # correct (2 * 1 + formatted)
        n_correct += n_good
        n_shortcut += sum(data.is_shortcut(a) for a in answers)
        stats["all_correct"] += n_good == len(scored)
        stats["all_wrong"] += n_good == 0
        shown = [a for r, a in scored if r >= 3 and not data.is_shortcut(a)]   # correct, with working
        top = [a for r, a in scored if r == 4]        # ... and the working checks out
        worst = min(r for r, _ in scored)
        stats["guessed_only"] += n_good > 0 and not shown
        stats["unsound_only"] += bool(shown) and not top
        preferred = [a for a in top if not bad_style(a)]
        if top and worst < 3:
            chosen = rng.choice(preferred or top)
            # A pair must not contradict the other preference: with a chosen in the dispreferred style,
            # only a rejected in that style too (else the pair teaches "verbose over concise").
            wrong = [(r, a) for r, a in scored if r < 3 and (not bad_style(chosen) or bad_style(a))]
            if wrong:
                low = min(r for r, _ in wrong)
                rejected = rng.choice([a for r, a in wrong if r == low])
                pairs.append({**data.to_preference(problem, chosen, rejected), "kind": "correctness",
                              "answer": problem["answer"]})
                stats["correctness"] += 1
            else:
                stats["conflicting"] += 1
        styled = [a for a in top if bad_style(a)]
        if preferred and styled:
            pairs.append({**data.to_preference(problem, rng.choice(preferred), rng.choice(styled)), "kind": "style",
                          "answer": problem["answer"]})
            stats["style"] += 1
    stats["sample_accuracy"] = n_correct / max(1, stats["samples"])
    stats["sample_shortcut_share"] = n_shortcut / max(1, stats["samples"])
    stats["answers"] = [list(a) for a in samples]
    return pairs, stats
