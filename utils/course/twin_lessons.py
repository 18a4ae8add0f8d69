"""The phases of each lesson that an architecture twin measures (``twins`` runs them).

Each ``lessonNN(cfg, tokenizer, out, steps, resolve)`` runs the lesson's heaviest phases through
the lesson's own code paths (``utils.sft``, ``utils.dpo``, ``utils.rl`` configs, TRL's trainers,
PEFT, bitsandbytes) for a few steps, with the models the lesson keeps resident at that point, and
returns ``{phase: {"unit", "seconds", "peak_gb", "allocated_gb"}}``.
"""
from __future__ import annotations

import copy
import time

import torch

from .. import presets
from ..presets.sizing import PROMPT_TOKENS


# ----------------------------------------------------------------------------- data of a given length
def _text(tokenizer, n_tokens: int, seed: int) -> str:
    """Word-problem-like text of about ``n_tokens`` tokens (whole sentences, ending in a line break)."""
    import random

    rng = random.Random(seed)
    words, text = ["apples", "pencils", "marbles", "dollars", "books", "cookies"], ""
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < n_tokens:
        a, b = rng.randint(10, 99), rng.randint(2, 9)
        text += f"She has {a} {rng.choice(words)} and buys {b} times as many, so {a} * {b} = {a * b}.\n"
    return text


def problems(tokenizer, n: int, prompt_tokens: int = PROMPT_TOKENS, answer_tokens: int = 256) -> list[dict]:
    """``n`` problems in the course schema whose chat prompt and answer have about these token counts."""
    question, steps = _text(tokenizer, prompt_tokens - 20, 0), _text(tokenizer, answer_tokens - 8, 1)
    return [{"question": f"Problem {i}: {question}", "answer": f"{steps}#### {i}"} for i in range(n)]


# ----------------------------------------------------------------------------- measuring
class _Clock:
    """A trainer callback that timestamps every optimizer step's end."""

    def __init__(self):
        from transformers import TrainerCallback

        self.ends: list[float] = []
        clock = self

        class _CB(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                _sync()
                clock.ends.append(time.perf_counter())

        self.callback = _CB()

    def per_step(self, start: float) -> float:
        """Seconds per optimizer step: steps 2..N when there are two or more (step 1 warms up)."""
        if len(self.ends) >= 2:
            return (self.ends[-1] - self.ends[0]) / (len(self.ends) - 1)
        return self.ends[-1] - start if self.ends else float("nan")


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reset():
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(kind: str = "reserved") -> float | None:
    if not torch.cuda.is_available():
        return None
    peak = torch.cuda.max_memory_reserved() if kind == "reserved" else torch.cuda.max_memory_allocated()
    return round(peak / 2**30, 2)


class Phases:
    """Collects one lesson's phases: ``with phases("name", unit="step"): ...`` records peak memory
    (``peak_gb``: ``torch.cuda.max_memory_reserved``, what PyTorch's caching allocator took from the
    GPU; ``allocated_gb``: the tensors' own peak, which the allocator's cache can exceed) and wall
    time; ``phases.seconds(name, s)`` replaces the time with a per-step figure measured inside."""

    last: Phases | None = None    # the newest: what a lesson that raised had measured (``twins.measure_lesson``)

    def __init__(self):
        self.rows: dict[str, dict] = {}
        Phases.last = self

    def __call__(self, name: str, unit: str, count: int = 1):
        phases = self

        class _Ctx:
            def __enter__(self):
                _reset()
                self.t = time.perf_counter()
                return self

            def __exit__(self, *exc):
                _sync()
                if exc[0] is None:
                    phases.rows[name] = {"unit": unit, "seconds": round((time.perf_counter() - self.t) / count, 2),
                                         "peak_gb": _peak_gb(), "allocated_gb": _peak_gb("allocated")}
        return _Ctx()

    def seconds(self, name: str, value: float) -> None:
        self.rows[name]["seconds"] = round(value, 2)


def _load(cfg, path=None, **kw):
    from transformers import AutoModelForCausalLM

    if "quantization_config" in kw:
        return AutoModelForCausalLM.from_pretrained(path or cfg.model, device_map=cfg.device, **kw)
    dtype = kw.pop("dtype", cfg.dtype)
    return AutoModelForCausalLM.from_pretrained(path or cfg.model, dtype=dtype, **kw).to(cfg.device)


def _lora(cfg, task_type="CAUSAL_LM"):
    from peft import LoraConfig

    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.lora_target_modules), task_type=task_type)


def _pairs(tokenizer, cfg, n):
    """``n`` preference pairs (TRL's conversational format) whose prompt plus answer fills ``cfg.max_length``."""
    from .. import data

    prompt_len = min(PROMPT_TOKENS, cfg.max_length // 3)
    return [data.to_preference(p, p["answer"], p["answer"].replace("=", "is"))
            for p in problems(tokenizer, n, prompt_tokens=prompt_len,
                              answer_tokens=min(cfg.max_new_tokens, cfg.max_length - prompt_len))]


def _generate_batch(phases, name, model, tokenizer, cfg, max_new_tokens, n=1, temperature=1.0):
    """One evaluation batch of ``cfg.eval_batch_size`` sequences (``n`` samples per prompt)."""
    from .. import evaluation

    prompts = evaluation.format_prompts(tokenizer, problems(tokenizer, max(1, cfg.eval_batch_size // n)), "chat")
    kw = dict(do_sample=True, temperature=temperature, num_return_sequences=n) if n > 1 else {}
    with phases(name, "batch"):
        evaluation.generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=cfg.eval_batch_size,
                            progress=False, **kw)


def _train_sft(phases, name, model, tokenizer, cfg, out, steps):
    from .. import sft

    clock = _Clock()
    data = problems(tokenizer, cfg.batch_size * cfg.grad_accum * steps, answer_tokens=cfg.max_length)
    with phases(name, "step") as ctx:
        trainer = sft.train_sft(model, tokenizer, data, cfg, out, callbacks=[clock.callback], max_steps=steps,
                                save_strategy="no")
    phases.seconds(name, clock.per_step(ctx.t))
    return trainer


def _sft_trainer(phases, name, model, tokenizer, cfg, out, steps, dataset, **args):
    from trl import SFTTrainer

    from .. import sft

    clock = _Clock()
    trainer = SFTTrainer(model=model, args=sft.sft_config(cfg, out, max_steps=steps, save_strategy="no", **args),
                         train_dataset=dataset, processing_class=tokenizer, peft_config=_lora(cfg),
                         callbacks=[clock.callback])
    if cfg.dtype != torch.bfloat16:  # as lesson 02 does: TRL keeps a quantized model's adapters in bf16, which
        for p in trainer.model.parameters():  # fp16 mixed precision cannot unscale (and a CPU computes slowly)
            if p.requires_grad:
                p.data = p.data.to(torch.float32)
    with phases(name, "step") as ctx:
        trainer.train()
    phases.seconds(name, clock.per_step(ctx.t))


def _rewards():
    from .. import rewards

    return [rewards.correctness_reward, rewards.format_reward]


def _rl_dataset(tokenizer, n):
    from datasets import Dataset

    from .. import data

    return Dataset.from_list([{"prompt": data.to_prompt_messages(p), "answer": p["answer"]}
                              for p in problems(tokenizer, n)])


def lesson01(cfg, tokenizer, out, steps, resolve=presets.resolve):
    """SFT with ``transformers.Trainer`` (``sft.train_sft``: LoRA on the GPU presets), then greedy evaluation."""
    phases = Phases()
    model = _load(cfg)
    trainer = _train_sft(phases, "sft train", model, tokenizer, cfg, out / "sft", steps)
    _generate_batch(phases, "greedy eval", trainer.model, tokenizer, cfg, cfg.max_new_tokens)
    return phases.rows


def lesson02(cfg, tokenizer, out, steps, resolve=presets.resolve):
    """SFTTrainer padded and packed (LoRA; the base model stays loaded, as in the lesson), then QLoRA on NF4."""
    from datasets import Dataset
    from transformers import BitsAndBytesConfig

    from .. import data

    phases = Phases()
    base = _load(cfg)                                           # the lesson keeps its base model for comparisons
    rows = lambda n: Dataset.from_list([{"messages": data.to_messages(p)} for p in
                                        problems(tokenizer, n, answer_tokens=cfg.max_length)])
    _sft_trainer(phases, "SFTTrainer padded", _load(cfg), tokenizer, cfg, out / "padded", steps,
                 rows(cfg.batch_size * cfg.grad_accum * steps))
    _sft_trainer(phases, "SFTTrainer packed", _load(cfg), tokenizer, cfg, out / "packed", steps,
                 rows(cfg.packed_batch_size * cfg.grad_accum * steps * 2), packing=True,
                 per_device_train_batch_size=cfg.packed_batch_size)
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=cfg.dtype)
    _sft_trainer(phases, "QLoRA (NF4) padded", _load(cfg, quantization_config=bnb, dtype=cfg.dtype), tokenizer,
                 cfg, out / "qlora", steps, rows(cfg.batch_size * cfg.grad_accum * steps))
    _generate_batch(phases, "greedy eval", base, tokenizer, cfg, cfg.max_new_tokens)
    return phases.rows


def lesson03(cfg, tokenizer, out, steps, resolve=presets.resolve):
    """On-policy sampling (``n_samples`` per prompt), DPOTrainer with LoRA (the reference is the adapter
    disabled, log-probs precomputed), the SFT model resident for implicit rewards, as in the lesson."""
    from datasets import Dataset
    from trl import DPOTrainer

    from .. import dpo

    phases = Phases()
    sft_model = _load(cfg).eval()
    _generate_batch(phases, "preference sampling", sft_model, tokenizer, cfg, cfg.max_new_tokens, n=cfg.n_samples,
                    temperature=cfg.temperature)
    pairs = _pairs(tokenizer, cfg, cfg.batch_size * cfg.grad_accum * steps)
    clock = _Clock()
    trainer = DPOTrainer(model=copy.deepcopy(sft_model), ref_model=None if cfg.use_lora else copy.deepcopy(sft_model),
                         processing_class=tokenizer, peft_config=_lora(cfg) if cfg.use_lora else None,
                         train_dataset=Dataset.from_list(pairs), callbacks=[clock.callback],
                         args=dpo.dpo_config(cfg, out / "dpo", max_steps=steps, precompute_ref_log_probs=True,
                                             save_strategy="no"))
    with phases("DPO train", "step") as ctx:
        trainer.train()
    phases.seconds("DPO train", clock.per_step(ctx.t))
    return phases.rows


def _grpo(phases, name, cfg, tokenizer, out, steps, trainer_cls=None, **overrides):
    from trl import GRPOTrainer, RLOOTrainer

    from .. import rl

    steps_per_batch = max(1, (getattr(cfg, "steps_per_generation", None) or cfg.grad_accum) // cfg.grad_accum)
    clock = _Clock()
    n_prompts = cfg.prompts_per_step * max(steps, steps_per_batch) * 2
    common = dict(model=_load(cfg), processing_class=tokenizer, reward_funcs=_rewards(),
                  train_dataset=_rl_dataset(tokenizer, n_prompts), peft_config=_lora(cfg) if cfg.use_lora else None,
                  callbacks=[clock.callback])
    if trainer_cls == "rloo":
        trainer = RLOOTrainer(args=rl.rloo_config(cfg, out, max_steps=steps, save_strategy="no", **overrides), **common)
    else:
        trainer = GRPOTrainer(args=rl.grpo_config(cfg, out, max_steps=steps, save_strategy="no", **overrides), **common)
    with phases(name, "generation batch", count=max(1, steps // steps_per_batch)):
        trainer.train()
    if steps_per_batch == 1:
        phases.rows[name]["seconds"] = round(clock.per_step(clock.ends[0] if clock.ends else 0), 2)
    return trainer


def _grpo_by_hand(phases, name, sft_model, cfg, tokenizer, out, steps):
    """The capstone's loop (cell ``capstone-grpo-run``): ``grpo_step`` (the reference solution) on a LoRA copy of
    the SFT model, ``hand_prompts`` prompts x ``num_generations`` completions a step, one backward pass each."""
    from .. import evaluation, rewards, rl, training
    from ..solutions.lesson04 import aggregate_loss, clipped_surrogate, group_advantages, grpo_step, k3_kl

    stop_ids = evaluation.stop_token_ids(tokenizer)
    G = cfg.num_generations

    def sample_groups(policy, prompt_ids, prompt_mask):           # as the lesson's, with the twin's fixed length
        policy.eval()
        ids = evaluation.decode(policy, prompt_ids, prompt_mask, max_new_tokens=cfg.max_completion_length,
                                stop_ids=stop_ids, pad_token_id=tokenizer.pad_token_id, do_sample=True,
                                temperature=cfg.temperature, num_return_sequences=G).clone()
        policy.train()
        ended = torch.isin(ids, torch.tensor(stop_ids, device=ids.device))
        end = torch.where(ended.any(1), ended.int().argmax(1), ids.size(1))
        return ids, (torch.arange(ids.size(1), device=ids.device) <= end[:, None]).long()

    def reward_fn(completion_ids, completion_mask):
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        return torch.tensor(rewards.format_reward(texts), device=completion_ids.device, dtype=torch.float32)

    prompts = evaluation.format_prompts(tokenizer, problems(tokenizer, cfg.hand_prompts), "chat")
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                    add_special_tokens=False).to(cfg.device)
    policy = copy.deepcopy(sft_model)
    if cfg.gradient_checkpointing:
        policy.activation_checkpointing_enable()
    policy = (training.with_lora(policy, cfg) if cfg.use_lora else policy).train()
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.learning_rate)
    args = rl.grpo_config(cfg, out, save_strategy="no")
    ends = []
    with phases(name, "step") as ctx:
        for _ in range(steps):
            grpo_step(policy, sft_model, enc["input_ids"], enc["attention_mask"], opt, args, sample_groups, reward_fn,
                      group_advantages, clipped_surrogate, k3_kl, aggregate_loss)
            _sync()
            ends.append(time.perf_counter())
    phases.seconds(name, (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else ends[-1] - ctx.t)


def lesson04(cfg, tokenizer, out, steps, resolve=presets.resolve, only=None):
    """GRPOTrainer with LoRA and ``beta > 0`` (reference = adapter disabled), the SFT model resident;
    greedy and sampled evaluation batches; the capstone's GRPO with ``grpo_step``. ``only``: the phases to run."""
    phases = Phases()
    want = lambda name: only is None or name in only
    sft_model = _load(cfg).eval()
    if want("GRPO train"):
        _grpo(phases, "GRPO train", cfg, tokenizer, out / "grpo", max(2, steps))
    if want("greedy eval"):
        _generate_batch(phases, "greedy eval", sft_model, tokenizer, cfg, cfg.max_completion_length)
    if want("sampled eval"):
        _generate_batch(phases, "sampled eval", sft_model, tokenizer, cfg, cfg.max_completion_length,
                        n=cfg.num_generations, temperature=cfg.temperature)
    if want("capstone grpo_step"):
        _grpo_by_hand(phases, "capstone grpo_step", sft_model, cfg, tokenizer, out / "hand", max(2, steps))
    return phases.rows


def lesson05(cfg, tokenizer, out, steps, resolve=presets.resolve):
    """DAPO (GRPOTrainer, two optimizer steps per generation batch) and RLOO, one generation batch each,
    the SFT model resident (lesson 05 evaluates it; its test-time-compute sampling moved to lesson 08)."""
    phases = Phases()
    sft_model = _load(cfg).eval()
    per_batch = cfg.steps_per_generation // cfg.grad_accum
    _grpo(phases, "DAPO train", cfg, tokenizer, out / "dapo", per_batch, loss_type="dapo",
          epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high)
    _grpo(phases, "RLOO train", cfg, tokenizer, out / "rloo", per_batch, trainer_cls="rloo", epsilon=cfg.epsilon)
    del sft_model     # resident through both trainings, as in the lesson
    return phases.rows


def lesson06(cfg, tokenizer, out, steps, resolve=presets.resolve):
    """The model in fp32, int8 (LLM.int8()) and NF4 + double quantization, one evaluation batch each;
    QLoRA (lesson 01's recipe on the NF4 base)."""
    from transformers import BitsAndBytesConfig

    phases = Phases()
    compute = torch.float32 if cfg.device == "cpu" else cfg.dtype
    variants = {
        "fp32 eval": dict(dtype=torch.float32),
        "int8 eval": dict(quantization_config=BitsAndBytesConfig(load_in_8bit=True)),
        "NF4 eval": dict(quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute)),
    }
    for name, kw in variants.items():
        model = _load(cfg, **kw).eval()
        _generate_batch(phases, name, model, tokenizer, cfg, cfg.max_new_tokens)
        phases.rows[name]["weights_gb"] = round(model.get_memory_footprint() / 2**30, 2)
        del model
    qlora_cfg = resolve(cfg.preset, lesson="01", model=cfg.model, dataset=cfg.dataset, max_steps=cfg.qlora_steps,
                        full_finetune=False, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha)
    base4 = _load(cfg, **variants["NF4 eval"])
    _train_sft(phases, "QLoRA train", base4, tokenizer, qlora_cfg, out / "qlora", steps)
    return phases.rows
