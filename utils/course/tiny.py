"""The embedded tiny model: a few-million-parameter Qwen3 trained here, on a CPU.

``python -m utils tiny build`` trains it from nothing, deterministically:

1. a byte-level BPE tokenizer with Qwen's pre-tokenizer (digits split one by one),
   Qwen's special tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) and a
   Qwen-style chat template;
2. a ``Qwen3ForCausalLM`` pretrained on plain-text word problems with worked
   solutions (``Question: ...\\nAnswer:\\n<steps>\\n#### N``, documents separated by
   a blank line) -- never on the chat format, so SFT has something to teach;
3. a manifest (``manifest.json``) with the parameter count, steps, data seed and the
   metrics measured on held-out problems.

The result loads like any Hub model::

    AutoModelForCausalLM.from_pretrained(TINY_MODEL_DIR)
    AutoTokenizer.from_pretrained(TINY_MODEL_DIR)

``python -m utils tiny eval`` re-measures the committed model.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

from ..constants import TINY_MODEL_DIR

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen-style ChatML template, without a default system prompt. The
# {% generation %} markers let `apply_chat_template(..., return_assistant_tokens_mask=True)`
# (and TRL's assistant_only_loss) find the assistant tokens.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{% generation %}{{- message['content'] + '<|im_end|>' -}}{% endgeneration %}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Everything that decides the result. Changing any of it changes the model.
RECIPE = dict(
    vocab_size=512,
    hidden_size=192,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=48,
    seq_len=192,
    batch_size=32,
    steps=800,
    lr=3e-3,
    warmup=100,
    weight_decay=0.1,
    data_seed=1234,
    n_pretrain_problems=100_000,
    torch_seed=0,
)


# ----------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list[str], vocab_size: int):
    """Train a byte-level BPE with Qwen2's pre-tokenization and wrap it as a ``Qwen2Tokenizer``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    spec = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["merges"]]
    hf_tok = Qwen2Tokenizer(vocab=spec["vocab"], merges=merges, eos_token="<|im_end|>",
                            pad_token="<|endoftext|>", unk_token=None,
                            additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.model_max_length = 512
    return hf_tok


# ----------------------------------------------------------------------------- data
def pack_documents(token_lists: list[list[int]], seq_len: int):
    """Pack tokenized documents into rows of exactly ``seq_len`` tokens.

    Each row starts at a document boundary (as an evaluation prompt does) and is
    filled with whole documents; the document that overflows is cut. Returns a
    ``(rows, seq_len)`` int64 tensor.
    """
    import torch

    rows, cur = [], []
    for ids in token_lists:
        cur.extend(ids)
        if len(cur) >= seq_len:
            rows.append(cur[:seq_len])
            cur = []
    return torch.tensor(rows, dtype=torch.long)


# ----------------------------------------------------------------------------- model
def make_model(tokenizer, r: dict):
    """A randomly initialised ``Qwen3ForCausalLM`` of the recipe's size, tied embeddings."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=r["hidden_size"], intermediate_size=r["intermediate_size"],
        num_hidden_layers=r["num_hidden_layers"], num_attention_heads=r["num_attention_heads"],
        num_key_value_heads=r["num_key_value_heads"], head_dim=r["head_dim"], max_position_embeddings=512,
        rope_theta=10000.0, tie_word_embeddings=True, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id)
    return Qwen3ForCausalLM(cfg)


def lr_at(step: int, r: dict) -> float:
    """Linear warm-up, then inverse-square-root decay: ``lr * sqrt(warmup / step)``.

    The schedule does not depend on the total number of steps, so the model after
    N steps of a longer run is exactly the model a run of N steps produces (this is
    how the recipe's ``steps`` was chosen: see the manifest's ``learning_curve``).
    """
    if step < r["warmup"]:
        return r["lr"] * (step + 1) / r["warmup"]
    return r["lr"] * math.sqrt(r["warmup"] / (step + 1))


def pretrain(model, rows, r: dict, log_every: int = 100, on_log=None) -> list[float]:
    """Plain next-token-prediction training loop (AdamW, fp32 on CPU).

    ``on_log(step, model)`` is called every ``log_every`` steps (e.g. to measure accuracy).
    """
    import torch

    g = torch.Generator().manual_seed(r["torch_seed"])
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": r["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=r["lr"], betas=(0.9, 0.95))
    model.train()
    losses, t0 = [], time.time()
    for step in range(r["steps"]):
        idx = torch.randint(0, rows.shape[0], (r["batch_size"],), generator=g)
        batch = rows[idx]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, r)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if log_every and (step + 1) % log_every == 0:
            avg = sum(losses[-log_every:]) / log_every
            print(f"step {step + 1:5d}/{r['steps']}  loss {avg:.4f}  {time.time() - t0:6.0f}s", flush=True)
            if on_log is not None:
                on_log(step + 1, model)
                model.train()
    return losses


# ----------------------------------------------------------------------------- metrics
def measure(model, tokenizer, n_test: int = 500, n_sampled: int = 200, k: int = 8,
            temperature: float = 1.0, progress: bool = False) -> dict:
    """The manifest's metrics on held-out problems (test split, seed 0).

    * greedy accuracy in the pretraining (plain) format,
    * pass@1 and pass@k from k samples at ``temperature`` in the plain format,
    * greedy format compliance and accuracy in the chat format (before any SFT).
    """
    import torch

    from .. import data, evaluation

    torch.manual_seed(0)
    test = data.make_problems(n_test, split="test", seed=0)
    greedy = evaluation.evaluate(model, tokenizer, test, fmt="plain", max_new_tokens=96, progress=progress)
    sampled = evaluation.evaluate(model, tokenizer, test[:n_sampled], fmt="plain", n=k, temperature=temperature,
                                  ks=(1, k), max_new_tokens=96, progress=progress)
    chat = evaluation.evaluate(model, tokenizer, test[:n_sampled], fmt="chat", max_new_tokens=96, progress=progress)
    return {
        "plain_greedy_accuracy": round(greedy["accuracy"], 4),
        "plain_accuracy_by_difficulty": {str(d): round(a, 4) for d, a in greedy["accuracy_by_difficulty"].items()},
        f"plain_pass@1_t{temperature:g}": round(sampled["pass@1"], 4),
        f"plain_pass@{k}_t{temperature:g}": round(sampled[f"pass@{k}"], 4),
        "chat_format_compliance": round(chat["format_compliance"], 4),
        "chat_greedy_accuracy": round(chat["accuracy"], 4),
        "n_test_greedy": n_test,
        "n_test_sampled": n_sampled,
    }


# ----------------------------------------------------------------------------- build
def build(out: Path = TINY_MODEL_DIR, steps: int | None = None, log_every: int = 100, metrics: bool = True,
          on_log=None, **recipe) -> dict:
    """Tokenizer + pretraining + manifest, written to ``out``. Deterministic for a given recipe.

    ``steps`` and ``recipe`` override :data:`RECIPE` entries (for experiments and tests);
    ``metrics=False`` skips the held-out measurements.
    """
    import torch
    from transformers import GenerationConfig

    from .. import data

    unknown = set(recipe) - set(RECIPE)
    if unknown:
        raise ValueError(f"unknown recipe keys {sorted(unknown)}; valid: {sorted(RECIPE)}")
    r = {**RECIPE, **recipe}
    if steps is not None:
        r["steps"] = steps
    torch.manual_seed(r["torch_seed"])
    t_start = time.time()

    problems = data.make_problems(r["n_pretrain_problems"], split="train", seed=r["data_seed"])
    docs = [data.to_text(p) + data.DOC_SEPARATOR for p in problems]
    chat_samples = [f"{role}\n{p['question']}" for p in problems[:200] for role in ("system", "user", "assistant")]
    tokenizer = train_tokenizer(docs[:20_000] + chat_samples, r["vocab_size"])
    token_lists = tokenizer(docs, add_special_tokens=False)["input_ids"]
    rows = pack_documents(token_lists, r["seq_len"])
    print(f"tokenizer: {len(tokenizer)} tokens; data: {rows.shape[0]} rows x {r['seq_len']} tokens "
          f"({rows.numel() / 1e6:.1f}M tokens, {sum(map(len, token_lists)) / len(docs):.0f} tokens/doc)", flush=True)

    model = make_model(tokenizer, r)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: Qwen3ForCausalLM, {n_params / 1e6:.2f}M parameters; "
          f"{r['steps']} steps x {r['batch_size'] * r['seq_len']} tokens", flush=True)
    t_train = time.time()
    losses = pretrain(model, rows, r, log_every=log_every, on_log=on_log)
    train_s = time.time() - t_train

    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tokenizer.pad_token_id, do_sample=False)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    t_eval = time.time()
    metrics = measure(model, tokenizer) if metrics else {}
    eval_s = time.time() - t_eval
    manifest = {
        "name": "tiny-qwen",
        "architecture": "Qwen3ForCausalLM",
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "recipe": r,
        "tokens_seen": r["steps"] * r["batch_size"] * r["seq_len"],
        "final_train_loss": round(sum(losses[-50:]) / min(50, len(losses)), 4),
        "metrics": metrics,
        "build_seconds": {"train": round(train_s), "eval": round(eval_s), "total": round(time.time() - t_start)},
        "torch_threads": torch.get_num_threads(),
        "built_with": _versions(),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _versions() -> dict:
    import tokenizers
    import torch
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def load(path: Path | str = TINY_MODEL_DIR):
    """(model, tokenizer) of the embedded model, through the ordinary Auto classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m utils tiny", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="train tokenizer + model from scratch and write them with a manifest")
    b.add_argument("--out", type=Path, default=TINY_MODEL_DIR)
    b.add_argument("--steps", type=int, default=None, help="override the recipe's steps (for trying things out)")
    e = sub.add_parser("eval", help="re-measure the manifest metrics of a built model")
    e.add_argument("--path", type=Path, default=TINY_MODEL_DIR)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.cmd == "build":
        m = build(args.out, steps=args.steps)
        print(json.dumps({k: m[k] for k in ("parameters", "final_train_loss", "metrics", "build_seconds")}, indent=2))
    else:
        model, tok = load(args.path)
        print(json.dumps(measure(model, tok, progress=True), indent=2))


if __name__ == "__main__":
    main()
