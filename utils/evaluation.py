"""Batched generation and held-out metrics: accuracy, format compliance, pass@k.

The same code evaluates the embedded tiny model on a CPU and a real Qwen model on
a GPU. Two prompt formats:

* ``"plain"``: the pretraining format ``Question: ...\\nAnswer:\\n``; generation
  stops at the document separator (a blank line), like few-shot base-model evals.
* ``"chat"``: the tokenizer's chat template with ``add_generation_prompt=True``;
  generation stops at ``<|im_end|>`` / ``<|endoftext|>``.
"""
from __future__ import annotations

import importlib
import math

import torch
from tqdm.auto import tqdm

from . import data, rewards

FORMATS = ("chat", "plain")


def stop_token_ids(tokenizer) -> list[int]:
    """Ids that end a generation: the tokenizer's eos plus Qwen's ``<|im_end|>`` and ``<|endoftext|>``."""
    ids = {tokenizer.eos_token_id}
    for t in ("<|im_end|>", "<|endoftext|>"):
        i = tokenizer.convert_tokens_to_ids(t)
        if isinstance(i, int) and i != tokenizer.unk_token_id:
            ids.add(i)
    return sorted(i for i in ids if i is not None)


def format_prompts(tokenizer, problems: list[dict], fmt: str = "chat", system: str | None = None) -> list[str]:
    """Prompt strings for ``problems`` in the ``"chat"`` or ``"plain"`` format."""
    if fmt == "plain":
        return [data.to_plain_prompt(p) for p in problems]
    if fmt == "chat":
        return [tokenizer.apply_chat_template(data.to_prompt_messages(p, system), tokenize=False,
                                              add_generation_prompt=True) for p in problems]
    raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering as ``transformers``' ``TopPLogitsWarper``: keep the smallest set of most likely
    tokens whose probability reaches ``top_p`` (at least one), set the others to ``-inf``. (B, V) -> (B, V)."""
    sorted_logits, order = torch.sort(logits, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= (1 - top_p)
    drop[..., -1:] = False
    return logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))


# torch.multinomial draws its one sample per row by racing one exponential draw per vocabulary entry, about 16 ns
# each on the course's CPU: at Qwen's 151,936 tokens that is 2.4 ms per row and token, a third of a CPU rehearsal's
# time (utils.course.rehearsal). Above this many entries sample_tokens uses one uniform draw per row instead.
MULTINOMIAL_MAX_VOCAB = 4096


def sample_tokens(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` (R, V) float, each row non-negative with a positive sum -> (R,) int64.

    Draws token ``i`` with probability ``probs[r, i] / probs[r].sum()``; a zero entry is never drawn. Up to
    :data:`MULTINOMIAL_MAX_VOCAB` entries (the tiny model's 512) this is ``torch.multinomial(probs, 1)``, whose
    draws the committed tiny runs hold; above it, the inverse of the cumulative distribution (float64) at one
    uniform draw per row: the same distribution, other draws from the same seed. A row with a nan, an inf, a
    negative entry or no positive one raises (ValueError here; torch.multinomial's RuntimeError below the bound).
    """
    if probs.shape[-1] <= MULTINOMIAL_MAX_VOCAB:
        return torch.multinomial(probs, 1)[:, 0]
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    if not (torch.isfinite(total).all() and (total > 0).all() and (probs >= 0).all()):   # as torch.multinomial
        raise ValueError("sample_tokens: every row needs finite, non-negative weights with a positive sum (a nan or "
                         "inf in the logits, e.g. an fp16 overflow, gives nan probabilities)")
    u = torch.rand(total.shape, dtype=torch.float64, device=probs.device) * total   # in [0, total)
    return torch.searchsorted(cdf, u, right=True)[:, 0]   # the first i with cdf[i] > u: probs[i] > 0


class StaticCacheDecoder:
    """Decoding steps of a Qwen2/Qwen3 model on a CPU with a preallocated KV cache (used by :func:`decode`).

    ``transformers``' cache grows by ``torch.cat`` at every step, copying every layer's keys and values, and its
    forward builds the attention mask again each time. Here each layer's keys and values go into buffers sized
    for the whole generation once, and the step runs the model's own modules (norms, projections, LoRA
    adapters, MLP), its rotary embedding and ``scaled_dot_product_attention`` with the same arguments
    ``transformers``' decoding step passes (the padding mask, or none and ``enable_gqa``; grouped queries
    packed as its ``pack_gqa`` does). The logits are bit-for-bit those of the model's forward (a test holds
    it); decoding a batch of 250 tiny-model answers takes about three quarters of the time.

    :meth:`build` returns None where that equality is not established (another architecture, a GPU, eager
    attention, sliding windows, hooks or a replaced ``forward`` on a module it bypasses, training mode):
    :func:`decode` then calls the model.
    """

    def __init__(self, model, cache, attention_mask: torch.Tensor, capacity: int):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.lm_head, self.inner = base.lm_head, base.model
        self.rope = importlib.import_module(type(base).__module__).apply_rotary_pos_emb
        rows, width = attention_mask.shape
        self.keys, self.values = [], []
        for layer in cache.layers:                     # (rows, kv heads, width, head dim), filled by the prefill
            for have, buffers in ((layer.keys, self.keys), (layer.values, self.values)):
                buffer = have.new_zeros(*have.shape[:2], capacity, have.shape[3])
                buffer[:, :, :width] = have
                buffers.append(buffer)
        self.mask = torch.ones(rows, 1, 1, capacity, dtype=torch.bool, device=attention_mask.device)
        self.mask[:, 0, 0, :width] = attention_mask.bool()
        self.padded = not bool(attention_mask.all())
        self.length = width

    @classmethod
    def build(cls, model, cache, attention_mask: torch.Tensor, capacity: int):
        """A decoder for ``model`` after its prefill filled ``cache`` (a ``DynamicCache``), or None."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.config
        if (attention_mask.device.type != "cpu" or config.model_type not in ("qwen2", "qwen3")
                or config._attn_implementation != "sdpa"
                or any(t != "full_attention" for t in getattr(config, "layer_types", None) or ())
                or any(hasattr(m, "_hf_hook") for m in base.modules()) or model.training):
            return None
        # the modules whose forward the step does not call: no hook on them, no forward of their own. TRL's fused
        # LM head (a forward patched on the model) is let through: without fused_lm_head=True it is the original
        # forward (trl.trainer.utils.add_fused_lm_head)
        bypassed = [model, base, base.model, *base.model.layers, *(layer.self_attn for layer in base.model.layers)]
        for m in bypassed:
            own = vars(m).get("forward")
            trl_fused = getattr(getattr(own, "__code__", None), "co_name", None) == "_fused_forward"
            if m._forward_hooks or m._forward_pre_hooks or (own is not None and not trl_fused):
                return None
        return cls(model, cache, attention_mask, capacity)

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (int64 indices), as ``DynamicCache.batch_select_indices``."""
        self.keys = [k.index_select(0, keep) for k in self.keys]
        self.values = [v.index_select(0, keep) for v in self.values]
        self.mask = self.mask.index_select(0, keep)
        self.padded = not bool(self.mask[..., :self.length].all())

    def step(self, token: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Logits (rows, V) of the next token after ``token`` (rows,) at ``position_ids`` (rows, 1)."""
        inner, at = self.inner, self.length
        x = inner.embed_tokens(token[:, None])
        cos, sin = inner.rotary_emb(x, position_ids)
        rows = x.shape[0]
        mask = self.mask[..., :at + 1] if self.padded else None
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            shape = (rows, 1, -1, attn.head_dim)
            q, k = attn.q_proj(h).view(shape), attn.k_proj(h).view(shape)
            if hasattr(attn, "q_norm"):                # Qwen3 normalises each head's queries and keys
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            self.keys[i][:, :, at] = k[:, :, 0]
            self.values[i][:, :, at] = attn.v_proj(h).view(shape)[:, 0]
            keys, values = self.keys[i][:, :, :at + 1], self.values[i][:, :, :at + 1]
            groups, extra = attn.num_key_value_groups, {}
            if groups > 1 and mask is None:
                extra["enable_gqa"] = True
            elif groups > 1:                            # one query per row: its heads grouped by key head
                q = q.reshape(rows, -1, groups, attn.head_dim)
            out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=0.0,
                                                                   scale=attn.scaling, is_causal=False, **extra)
            out = out.reshape(rows, -1, 1, values.shape[-1]).transpose(1, 2).contiguous()
            x = x + attn.o_proj(out.reshape(rows, 1, -1).contiguous())
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.length = at + 1
        return self.lm_head(inner.norm(x))[:, -1]


@torch.inference_mode()
def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
           stop_ids: list[int], pad_token_id: int, do_sample: bool = False, temperature: float = 1.0,
           top_p: float = 1.0, num_return_sequences: int = 1, stop_strings: list[str] | None = None,
           tokenizer=None, return_logprobs: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Greedy or sampled decoding with a KV cache, dropping each row from the batch once it has ended.

    ``model.generate`` keeps every row in the batch until the longest one ends (finished rows
    keep computing padding); here a finished row leaves the batch and its KV cache, so a batch
    costs the sum of its answers' lengths, not its size times the longest: it pays when answers
    differ in length, as a trained model's do (a batch whose rows all run to ``max_new_tokens``
    gains nothing). Greedy decoding gives the same tokens as
    ``generate(do_sample=False)``; sampling draws from the same distribution (softmax of
    ``logits / temperature``, then ``top_p``; no top-k). The model's ``generation_config``
    (repetition penalty, default top-k ...) is not consulted: what you pass is what runs.
    With ``num_return_sequences=n`` each prompt is read once (one prefill) and its KV cache is
    copied to its n rows (``generate`` reads it n times: on the tiny model the prompt is longer
    than most answers, so this saves about a third of the sampling time); each row then samples
    on its own. After the prompt, the steps of a Qwen model on a CPU run with a preallocated cache
    (:class:`StaticCacheDecoder`: the same logits, bit for bit, in less time).

    Args:
        input_ids, attention_mask: (B, P) int64, prompts padded on the *left*.
        max_new_tokens: at most this many new tokens per row.
        num_return_sequences: n rows per prompt (sampling; greedy rows would be copies).
        stop_ids: token ids that end a row (the stop token is kept in the output).
        pad_token_id: fills the positions after a row's end.
        stop_strings: a row also ends once its text contains one of these (needs ``tokenizer``).
        return_logprobs: also return each new token's log-probability under ``softmax(logits /
            temperature)``, read off the logits the step sampled from (lesson 07 uses them as the
            sampling policy's log-probs, verl's ``rollout_correction.bypass_mode``). ``top_p`` is
            not applied to them: they are what a forward pass over the finished sequence at the
            same temperature computes, up to float rounding.
    Returns:
        (B * n, N) int64 new tokens, N <= ``max_new_tokens``, rows of one prompt adjacent (as
        ``input_ids.repeat_interleave(n, dim=0)``); after a row's stop token or stop string
        everything is ``pad_token_id``. With ``return_logprobs``: ``(tokens, logprobs)``, the
        second (B * n, N) float32, 0.0 after a row's end.
    """
    from transformers import DynamicCache

    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings needs the tokenizer")
    if num_return_sequences > 1 and not do_sample:
        raise ValueError("num_return_sequences > 1 needs do_sample=True (greedy gives n copies)")
    window = max((len(s) for s in stop_strings), default=0) + 4 if stop_strings else 0
    B, device = input_ids.shape[0] * num_return_sequences, input_ids.device
    out = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device) if return_logprobs else None
    stops = torch.tensor(stop_ids, device=device)
    rows = torch.arange(B, device=device)              # the original row of each row still decoding
    cache = DynamicCache(config=model.config)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)   # as generate numbers left-padded rows
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    position_ids = position_ids[:, -1:]
    if num_return_sequences > 1:                        # one prefill per prompt, its cache copied to its n rows
        cache.batch_repeat_interleave(num_return_sequences)
        logits, attention_mask, position_ids = (x.repeat_interleave(num_return_sequences, dim=0)
                                                for x in (logits, attention_mask, position_ids))
    static = StaticCacheDecoder.build(model, cache, attention_mask, attention_mask.shape[1] + max_new_tokens)
    if static is not None:
        del cache                                       # its keys and values now live in the static buffers
    n = 0
    for t in range(max_new_tokens):
        scores = logits.float() / temperature if do_sample or return_logprobs else None
        if do_sample:
            probs = (_top_p_filter(scores, top_p) if top_p < 1.0 else scores).softmax(dim=-1)
            token = sample_tokens(probs)
        else:
            token = logits.argmax(dim=-1)
        out[rows, t] = token
        if return_logprobs:
            logprobs[rows, t] = scores.log_softmax(dim=-1).gather(1, token[:, None])[:, 0]
        n = t + 1
        live = ~torch.isin(token, stops)
        if stop_strings:
            tails = tokenizer.batch_decode(out[rows, max(0, n - window):n])
            live &= torch.tensor([not any(s in x for s in stop_strings) for x in tails], device=device)
        if n == max_new_tokens or not live.any():
            break
        if not live.all():                              # drop the finished rows, their cache included
            keep = live.nonzero()[:, 0]
            rows, token = rows[keep], token[keep]
            attention_mask, position_ids = attention_mask[keep], position_ids[keep]
            static.select(keep) if static is not None else cache.batch_select_indices(keep)
        position_ids = position_ids + 1
        if static is not None:
            logits = static.step(token, position_ids)
            continue
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(rows), 1)], dim=1)
        logits = model(input_ids=token[:, None], attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=cache, use_cache=True).logits[:, -1]
    return (out[:, :n], logprobs[:, :n]) if return_logprobs else out[:, :n]


@torch.inference_mode()
def generate(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 128, do_sample: bool = False,
             temperature: float = 1.0, top_p: float = 1.0, num_return_sequences: int = 1,
             batch_size: int = 32, stop_strings: list[str] | None = None, progress: bool = True,
             desc: str = "generate") -> list[list[str]]:
    """Generate completions for already-formatted prompt strings (with :func:`decode`).

    Args:
        prompts: P prompt strings (chat template already applied, or plain text).
        num_return_sequences: n completions per prompt (needs ``do_sample=True`` when n > 1).
        batch_size: sequences per forward pass (prompts per batch = batch_size // n).
        stop_strings: generation stops at the first of these; the text is cut there.
    Returns:
        P lists of n completion strings (special tokens removed).
    """
    was_training = model.training
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    per_batch = max(1, batch_size // num_return_sequences)
    device = next(model.parameters()).device
    out: list[list[str]] = []
    try:
        for i in tqdm(range(0, len(prompts), per_batch), desc=desc, **({} if progress else {"disable": True})):
            # decoder-only models generate to the right of the prompt: pad on the left
            enc = tokenizer(prompts[i:i + per_batch], return_tensors="pt", padding=True, padding_side="left",
                            add_special_tokens=False).to(device)
            new = decode(model, enc["input_ids"], enc["attention_mask"], max_new_tokens=max_new_tokens,
                         stop_ids=stop_token_ids(tokenizer), pad_token_id=pad_id, do_sample=do_sample,
                         temperature=temperature, top_p=top_p, num_return_sequences=num_return_sequences,
                         stop_strings=stop_strings, tokenizer=tokenizer)
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            if stop_strings:
                texts = [_cut(t, stop_strings) for t in texts]
            for j in range(0, len(texts), num_return_sequences):
                out.append(texts[j:j + num_return_sequences])
    finally:
        model.train(was_training)
    return out


def _cut(text: str, stops: list[str]) -> str:
    """``text`` up to the first stop string."""
    cut = min((text.find(s) for s in stops if s in text), default=len(text))
    return text[:cut]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): P(at least one of k draws from n samples, c correct, is correct).

    ``1 - C(n-c, k) / C(n, k)``; requires ``k <= n``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate(model, tokenizer, problems: list[dict], *, fmt: str = "chat", n: int = 1,
             temperature: float = 0.0, ks: tuple[int, ...] | None = None, max_new_tokens: int = 128,
             batch_size: int = 64, system: str | None = None, progress: bool = True,
             desc: str | None = None) -> dict:
    """Accuracy, format compliance and pass@k of ``model`` on held-out ``problems``.

    ``temperature=0`` means greedy decoding (then ``n`` must be 1). With n samples per
    problem, ``accuracy`` and ``format_compliance`` average over all samples (so
    accuracy estimates pass@1) and ``pass@k`` uses the unbiased estimator.

    Returns a dict: ``accuracy``, ``format_compliance``, ``pass@k`` for each k in
    ``ks`` (default: 1 and n), ``accuracy_by_difficulty`` (when problems carry a
    ``difficulty`` field), ``n_correct`` (per problem), ``by_problem`` (each problem's share of right and of
    well-formatted samples, ``{"accuracy": [...], "format_compliance": [...]}``: 1.0 or 0.0 for a greedy answer;
    what a paired comparison of two models on the same problems reads, :func:`utils.headlines.paired_se`) and
    ``completions``.
    """
    greedy = temperature == 0
    if greedy and n != 1:
        raise ValueError("greedy decoding (temperature=0) gives one completion per problem; use n=1")
    prompts = format_prompts(tokenizer, problems, fmt, system)
    stops = [data.DOC_SEPARATOR] if fmt == "plain" else None
    comps = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, do_sample=not greedy,
                     temperature=temperature if not greedy else 1.0, num_return_sequences=n,
                     batch_size=batch_size, stop_strings=stops, progress=progress,
                     desc=desc or f"eval {fmt} n={n}")
    answers = [p["answer"] for p in problems]
    correct = [[rewards.answers_match(rewards.extract_answer(c), rewards.extract_answer(a)) for c in cs]
               for cs, a in zip(comps, answers)]
    formatted = [[rewards.is_well_formatted(c) for c in cs] for cs in comps]
    n_correct = [sum(c) for c in correct]
    res = {
        "accuracy": sum(n_correct) / (len(problems) * n),
        "format_compliance": sum(map(sum, formatted)) / (len(problems) * n),
        "n_correct": n_correct,
        "by_problem": {"accuracy": [c / n for c in n_correct], "format_compliance": [sum(f) / n for f in formatted]},
        "completions": comps,
    }
    for k in sorted(set(ks or (1, n))):
        res[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in n_correct) / len(problems)
    if problems and all("difficulty" in p for p in problems):
        by = {}
        for p, c in zip(problems, n_correct):
            by.setdefault(p["difficulty"], []).append(c / n)
        res["accuracy_by_difficulty"] = {d: sum(v) / len(v) for d, v in sorted(by.items())}
    return res
