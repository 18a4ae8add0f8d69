"""How long a lesson takes on its preset's card: an upper-bound estimate from the measured phases and a card model.

The GPU presets were measured on an H100 or an H200 with random-weight stand-ins (:mod:`.measured`); students run
them on a T4, an RTX 4090 or an A100 (:data:`.hardware.PRESET_CARD`). For every heavy operation of a lesson
(:data:`OPERATIONS`: its trainings, generations and scoring passes, counted from the notebook) the estimate is

    count x (measured seconds of its phase on the H100/H200, scaled to the operation's size
             + the operation's arithmetic / (the card's fp16/bf16 or fp32 peak x EFFICIENCY)
             + the bytes it reads / (the card's memory bandwidth x EFFICIENCY))

The first term keeps what the measuring machine spent launching kernels and running Python (at these model sizes
most of a generation's time: 26.5 s of the 1.7B stand-in's PPO generation, whose weights an H200 reads in 0.2 s);
the other two add the card's own time for the work, at half its published peak. It is an upper bound as far as
(1) the student's host launches kernels as fast as the measuring machine's (Colab's small host is slower on the
launch-bound phases), and (2) the card reaches half its peak on the work; it counts the measuring GPU's own
device time twice, and every generation at its full token limit (a random model never stops: real answers end
earlier). Taught nowhere; printed by the resolution table, the lesson headers and docs/gpu.md.
"""
from __future__ import annotations

import math

from .hardware import CARDS, PRESET_CARD, shape

EFFICIENCY = 0.5          # the share of a card's published peak its kernels are assumed to reach
BUDGET_MINUTES = 60       # a lesson on its preset's card: about an hour, a student's session
PROMPT_TOKENS = 160       # a GSM8K prompt in Qwen's chat template is about 50-200 tokens (the stand-ins' prompts)
TOOL_PROMPT_TOKENS = 215  # what offering the calculator adds to a Qwen prompt (its tool schema), measured

# Lessons still over the budget on a card after the presets were cut to a session (2026-11-28; lessons 04 and 05 on
# 24g and 80g again on 2026-12-02), with the minutes they were estimated at then: their RL runs (lesson 08: its beam
# searches) take most of it, and fewer steps would leave their comparisons nothing to compare (docs/gpu.md).
# tests/library/test_sizing.py holds every other lesson to the budget and these to their minutes: an estimate may
# only go down, and this list only shrink.
OVER_BUDGET = {
    ("04", "80g"): 67,     # 26 GRPO steps of 16 prompts (416; t4-16g: 400) and the reward-hack run
    ("07", "t4-16g"): 363,
    ("07", "24g"): 284,
    ("07", "80g"): 386,
    ("08", "t4-16g"): 116,
    ("08", "24g"): 103,
    ("08", "80g"): 83,
    ("09", "t4-16g"): 109,
    ("09", "24g"): 125,
    ("09", "80g"): 148,
}


# ----------------------------------------------------------------------------- the work of one unit
def generation(rows: int, new: int, prompt: int = PROMPT_TOKENS) -> dict:
    """One batch of ``rows`` sequences decoding ``new`` tokens after ``prompt``: every step reads the weights and the
    cache (fp16/bf16), and each token costs 2 x params multiply-adds."""
    return {"kind": "generate", "rows": rows, "new": new, "prompt": prompt}


def training(sequences: int, tokens: int, checkpointing: bool = True) -> dict:
    """One optimizer step over ``sequences`` of ``tokens``: forward and backward, 6 x params per token (8 with the
    forward recomputed by activation checkpointing); a LoRA step skips the frozen weights' gradients: a bound."""
    return {"kind": "train", "sequences": sequences, "tokens": tokens, "checkpointing": checkpointing}


def forward(sequences: int, tokens: int) -> dict:
    """A forward pass without gradients (log-probabilities, scores): 2 x params per token."""
    return {"kind": "forward", "sequences": sequences, "tokens": tokens}


def device_seconds(work: list[dict], model: str, card: str, fp32: bool = False) -> float:
    """Seconds ``card`` needs for ``work`` (a list of the units above) on ``model`` at :data:`EFFICIENCY` of its peak:
    fp16/bf16 tensor cores (``fp32``: plain fp32 units and 4-byte weights)."""
    spec, arch = CARDS[card], shape(model)
    peak = (spec["fp32_tflops"] if fp32 else spec["bf16_tflops"] or spec["fp16_tflops"]) * 1e12 * EFFICIENCY
    bandwidth = spec["bandwidth_gbs"] * 1e9 * EFFICIENCY
    width = 4 if fp32 else 2
    flops = bytes_read = 0.0
    for w in work:
        if w["kind"] == "generate":
            context = w["prompt"] + w["new"] / 2                      # the average length the cache holds
            flops += 2 * arch["params"] * w["rows"] * (w["prompt"] + w["new"])
            bytes_read += w["new"] * (arch["params"] + w["rows"] * arch["kv_per_token"] * context) * width
        elif w["kind"] == "train":
            flops += (8 if w["checkpointing"] else 6) * arch["params"] * w["sequences"] * w["tokens"]
        else:
            flops += 2 * arch["params"] * w["sequences"] * w["tokens"]
    return flops / peak + bytes_read / bandwidth


# ----------------------------------------------------------------------------- a lesson's operations
def _batches(n: int, size: int) -> int:
    return math.ceil(n / size)


def _sft(one: dict, steps: int, length: int | None = None, per_step: int | None = None) -> dict:
    """Lesson 01's recipe (``one``: its preset values) for ``steps`` steps, measured as lesson 01's "sft train"."""
    length = length or one["max_length"]
    examples = per_step or one["batch_size"] * one["grad_accum"]
    scale = examples * length / (one["batch_size"] * one["grad_accum"] * one["max_length"])
    return dict(label="SFT (lesson 01's recipe)", count=steps, phase=("01", "sft train"), scale=scale,
                work=[training(examples, length, one["gradient_checkpointing"])])


def _eval(p: dict, n: int, label: str, phase: tuple, new: int | None = None, samples: int = 1,
          prompt: int = PROMPT_TOKENS, phase_new: int | None = None, calls: int = 1) -> dict:
    """``calls`` evaluations of ``n`` prompts x ``samples`` answers of ``new`` tokens, each in batches of
    ``eval_batch_size // samples`` prompts (a partial batch costs a whole one), measured as ``phase`` (a generation
    batch of ``phase_new`` tokens: the host time scales with the decode steps)."""
    new = new or p.get("max_new_tokens") or p["max_completion_length"]
    batches = calls * _batches(n, max(1, p["eval_batch_size"] // samples))
    return dict(label=label, count=batches, phase=phase, scale=new / (phase_new or new),
                work=[generation(p["eval_batch_size"], new, prompt)])


def _rl_batch(p: dict, label: str, steps: int, phase: tuple, prompts: int | None = None, reference: bool = True,
              new: int | None = None, prompt: int = PROMPT_TOKENS, scale: float = 1.0) -> dict:
    """``steps`` generation batches of ``prompts x num_generations`` completions: the rollout, a reference forward
    (``reference``) and the policy's forward and backward, measured as ``phase`` (``scale``: its host time's share;
    a smaller batch keeps the whole, since a generation's launches do not depend on its rows)."""
    rows = (prompts or p["prompts_per_step"]) * p["num_generations"]
    new = new or p["max_completion_length"]
    work = [generation(rows, new, prompt), training(rows, prompt + new, p["gradient_checkpointing"])]
    if reference:
        work.append(forward(rows, prompt + new))
    return dict(label=label, count=steps, phase=phase, scale=scale, work=work)


def _op(label, count, phase, work, scale=1.0, fp32=False) -> dict:
    return dict(label=label, count=count, phase=phase, scale=scale, work=work, fp32=fp32)


def _scoring(p: dict, label: str, n: int, tokens: int, phase: tuple, phase_tokens: float, batch: int) -> dict:
    """``n`` sequences of ``tokens`` scored without gradients in batches of ``batch``, the host time taken from
    ``phase`` (a training step over ``phase_tokens``) in proportion to the tokens, a third of it (no backward)."""
    return _op(label, _batches(n, batch), phase, [forward(batch, tokens)], scale=batch * tokens / phase_tokens / 3)


def _lesson01(p, one):
    step = one["batch_size"] * one["grad_accum"] * one["max_length"]
    return [_eval(p, p["n_test"], "greedy evaluations: base (chat, plain) and four trained models",
                  ("01", "greedy eval"), calls=6),
            _op("the hand-written SFT loop", p["max_steps"], ("01", "sft train"),
                [training(p["batch_size"], p["max_length"], False)], scale=1 / p["grad_accum"]),
            {**_sft(one, 3 * p["max_steps"]), "label": "three Trainer runs (sft, lora, no-mask)"},
            _scoring(p, "completion losses", 256, p["max_length"], ("01", "sft train"), step, 8)]


def _lesson02(p, one):
    packed = p["packed_batch_size"] * p["grad_accum"]
    step = p["batch_size"] * p["grad_accum"] * p["max_length"]
    return [_eval(p, p["n_test"], "greedy evaluations: before, after SFT, after QLoRA", ("02", "greedy eval"),
                  calls=3),
            _op("throughput: padded", p["throughput_steps"], ("02", "SFTTrainer padded"),
                [training(p["batch_size"] * p["grad_accum"], p["max_length"], p["gradient_checkpointing"])]),
            _op("throughput: TRL packing and packed rows", 2 * p["throughput_steps"], ("02", "SFTTrainer packed"),
                [training(packed, p["max_length"], p["gradient_checkpointing"])]),
            _op("SFT, packed", p["max_steps"], ("02", "SFTTrainer packed"),
                [training(packed, p["max_length"], p["gradient_checkpointing"])]),
            _op("QLoRA, packed", p["max_steps"], ("02", "QLoRA (NF4) padded"),
                [training(packed, p["max_length"], p["gradient_checkpointing"])],
                scale=packed / (p["batch_size"] * p["grad_accum"])),
            _scoring(p, "held-out losses", p["max_steps"] // p["eval_steps"] * p["n_test"], p["max_length"],
                     ("02", "SFTTrainer padded"), step, p["batch_size"])]


def _lesson03(p, one):
    pairs = p["batch_size"] * p["grad_accum"]
    runs = 2 + len([b for b in p["betas"] if b != p["beta"]])      # the run, DPO + NLL, the sweep's other betas
    losses = len(p["preference_losses"])                            # section 9's other losses: no greedy evaluation
    step = pairs * 2 * p["max_length"]
    return [_sft(one, p["sft_steps"]),
            _eval(p, p["n_test"], "greedy evaluations: SFT and each DPOTrainer model", ("03", "preference sampling"),
                  calls=1 + runs),
            _eval(p, p["n_prompts"], "preference sampling", ("03", "preference sampling"), samples=p["n_samples"]),
            _eval(p, p["n_heldout"], "preference sampling, held out", ("03", "preference sampling"),
                  samples=p["n_samples"]),
            _op("DPOTrainer and KTOTrainer runs", (runs + losses) * p["max_steps"], ("03", "DPO train"),
                [training(2 * pairs, p["max_length"], p["gradient_checkpointing"])]),
            _op("the hand-written DPO loop (reference forward each step)", p["max_steps"], ("03", "DPO train"),
                [training(2 * p["batch_size"], p["max_length"], False), forward(2 * p["batch_size"], p["max_length"])],
                scale=1 / p["grad_accum"]),
            _scoring(p, "reference log-probabilities and implicit rewards",
                     ((runs + losses) * 2 * p["n_prompts"] + (runs + 1 + (losses + 1 if losses else 0)) * 2
                      * p["n_heldout"]) * 2, p["max_length"],
                     ("03", "DPO train"), step, p["eval_batch_size"]),
            _eval(p, p["n_heldout"], "KL to the reference: samples", ("03", "preference sampling"),
                  calls=len(p["betas"]) + losses)] + ([
            _op("KTOTrainer: its KL term's answers, forward only", p["max_steps"], ("03", "DPO train"),
                [forward(2 * pairs, p["max_length"])], scale=1 / 3),
            _scoring(p, "KTOTrainer: reference log-probabilities of its KL term's answers", 2 * p["n_prompts"],
                     p["max_length"], ("03", "DPO train"), step, p["eval_batch_size"])]
            if "kto" in p["preference_losses"] else [])


def _lesson04(p, one):
    return [_sft(one, p["sft_steps"]),
            _eval(p, p["n_test"], "greedy evaluations: SFT, GRPO, the hand run", ("04", "greedy eval"), calls=3),
            _eval(p, p["sampled_eval_prompts"], "sampled evaluations: SFT, the hack run, GRPO", ("04", "sampled eval"),
                  samples=p["num_generations"], calls=3),
            _eval(p, p["sweep_prompts"], "the G x temperature sweep", ("04", "sampled eval"),
                  samples=max(p["sweep_generations"]), calls=len(p["sweep_temperatures"])),
            _rl_batch(p, "GRPO (GRPOTrainer, reference forward)", p["max_steps"], ("04", "GRPO train")),
            _rl_batch(p, "the reward-hack run (no reference)", p["hack_steps"], ("04", "GRPO train"),
                      prompts=p["hack_prompts"], reference=False),
            _op("the capstone's GRPO by hand", p["hand_steps"], ("04", "capstone grpo_step"),
                _rl_batch(p, "", 1, ("04", ""), prompts=p["hand_prompts"])["work"])
            | {"fallback": ("04", "GRPO train")}]


def _lesson05(p, one):
    batches = p["max_steps"] * p["grad_accum"] // p["steps_per_generation"]
    seeds, rows = len(p["seeds"]), p["prompts_per_step"] * p["num_generations"]
    probe = p["clip_probe_prompts"] * p["num_generations"]
    rl = _rl_batch(p, "", 1, ("05", "DAPO train"), reference=False)["work"]
    rl.append(forward(rows, PROMPT_TOKENS + p["max_completion_length"]))   # old log-probs: two steps per batch
    return [_sft(one, p["sft_steps"]),
            _eval(p, p["n_test"], "greedy evaluations: SFT and each trained model", ("04", "greedy eval"),
                  calls=1 + 4 * seeds),
            _eval(p, 2 * p["prompts_per_step"], "DAPO's filter: groups sampled until enough have signal (at most "
                  "n_train)", ("04", "sampled eval"), samples=p["num_generations"],
                  calls=_batches(p["n_train"], 2 * p["prompts_per_step"])),
            _op("GRPO, Dr. GRPO, DAPO (GRPOTrainer)", 3 * seeds * batches, ("05", "DAPO train"), rl),
            _op("RLOO (RLOOTrainer)", seeds * batches, ("05", "RLOO train"), rl),
            _op("where the clip binds: off-policy steps on one batch, two clips", 2 * p["clip_probe_steps"],
                ("05", "DAPO train"), [training(probe, PROMPT_TOKENS + p["max_completion_length"],
                                                p["gradient_checkpointing"])],
                scale=probe / rows)]   # a share of a generation batch's time, its generation included: a bound


def _lesson06(p, one):
    qlora = one["batch_size"] * one["grad_accum"]
    step = qlora * one["max_length"]
    return [_sft(one, p["sft_steps"]),
            _eval(p, p["n_test"], "fp32 evaluation", ("06", "fp32 eval")) | {"fp32": True},
            _eval(p, p["n_test"], "int8 evaluations (with and without the outlier decomposition)",
                  ("06", "int8 eval"), calls=2),
            _eval(p, p["n_test"], "NF4 evaluations (bitsandbytes, double quantization, yours)", ("06", "NF4 eval"),
                  calls=3),
            _eval(p, p["n_test"], "the QLoRA model's evaluation", ("06", "NF4 eval")),
            _scoring(p, "perplexities", 6 * p["ppl_problems"], one["max_length"], ("06", "QLoRA train"), step, 8),
            _op("QLoRA", p["qlora_steps"], ("06", "QLoRA train"),
                [training(qlora, one["max_length"], one["gradient_checkpointing"])])]


def _lesson07(p, one, fp32=False):
    rows = p["rl_prompts"] * p["rl_samples"]
    new, length = p["max_new_tokens"], PROMPT_TOKENS + p["max_new_tokens"]
    ppo = [generation(rows, new), forward(3 * rows, length), training(2 * rows, length, p["gradient_checkpointing"])]
    step = p["batch_size"] * p["grad_accum"] * 2 * p["max_length"]
    return [_sft(one, p["sft_steps"]),
            _eval(p, p["n_prompts"], "pair sampling", ("07", "pair sampling"), samples=p["n_samples"]),
            _eval(p, p["n_heldout"], "pair sampling, held out", ("07", "pair sampling"), samples=p["n_samples"]),
            _op("the reward model and the outcome reward model", 2 * p["max_steps"], ("07", "RewardTrainer train"),
                [training(p["batch_size"] * p["grad_accum"] * 2, p["max_length"], p["gradient_checkpointing"])]),
            _scoring(p, "scores and probes", 3 * 2 * 2 * p["n_heldout"] + 10 * p["n_heldout"], length,
                     ("07", "RewardTrainer train"), step, 64),
            _eval(p, p["n_heldout"], "held-out greedy evaluations", ("07", "pair sampling"), calls=8) | {"fp32": fp32},
            _eval(p, rows, "rollouts: the sampler check, the gradient coefficients, the features",
                  ("07", "pair sampling"), calls=5) | {"fp32": fp32},
            _op("PPO, REINFORCE++, RLOO, GRPO, section 12 (as PPO: the dearest)", 4 * p["rl_iterations"] +
                p["overopt_iterations"], ("07", "PPO iteration"), ppo, fp32=fp32),
            _op("RFT and online RFT (rollouts; trained on the right ones)", 2 * p["rl_iterations"],
                ("07", "PPO iteration"),
                [generation(rows, new), training(rows, length, p["gradient_checkpointing"])], scale=0.6, fp32=fp32)]


def _lesson08(p, one):
    lines = p["beam_width"] * p["beam_expand"]
    per_round = max(1, p["eval_batch_size"] // lines)
    step = p["batch_size"] * p["grad_accum"] * (PROMPT_TOKENS + p["max_new_tokens"])
    return [_sft(one, p["sft_steps"]),
            _eval(p, p["n_test"], "greedy evaluation", ("08", "sampled eval")),
            _eval(p, p["n_test"], "thinking budget", ("08", "sampled eval"),
                  new=p["budgets"][len(p["budgets"]) // 2], phase_new=p["max_new_tokens"]),
            _eval(p, p["ttc_problems"], "sampling: the best-of-N pool", ("08", "sampled eval"),
                  samples=p["ttc_samples"]),
            _eval(p, p["prm_problems"], "sampling: the verifiers' training answers", ("08", "sampled eval"),
                  samples=p["prm_samples"]),
            _op("the PRM and the ORM", 2 * p["max_steps"], ("08", "PRM train"),
                [training(p["batch_size"] * p["grad_accum"], PROMPT_TOKENS + p["max_new_tokens"], True)]),
            _scoring(p, "PRM and ORM scoring", 2 * p["ttc_problems"] * p["ttc_samples"],
                     PROMPT_TOKENS + p["max_new_tokens"], ("08", "PRM train"), step, p["score_batch_size"]),
            _op("beam search guided by the rule and by the PRM (as the PRM's)", 2 * p["beam_max_steps"] *
                math.ceil(p["ttc_problems"] / per_round), ("08", "PRM beam search"),
                [generation(per_round * lines, p["step_tokens"], PROMPT_TOKENS + p["max_new_tokens"] // 2),
                 forward(per_round * lines, PROMPT_TOKENS + p["max_new_tokens"])]),
            _eval(p, p["ttc_problems"], "self-refinement", ("08", "sampled eval"), calls=p["refine_rounds"])]


def rollout_turns(p: dict) -> int:
    """Turns of ``max_new_tokens`` a lesson-09 rollout can generate before its ``max_length`` is full after a prompt
    with the tool schema: an upper bound on a trained model's turns (the rollout also stops at ``max_turns``)."""
    room = p["max_length"] - PROMPT_TOKENS - TOOL_PROMPT_TOKENS
    return max(1, min(p["max_turns"], math.ceil(room / p["max_new_tokens"])))


def _lesson09(p, one, four):
    prompt, turns = PROMPT_TOKENS + TOOL_PROMPT_TOKENS, rollout_turns(p)
    per_step = p["sft_batch_size"] * p["sft_grad_accum"]
    return [{**_sft(one, 2 * p["sft_steps"], p["max_length"], per_step), "label": "plain and trace SFT (lesson 01's "
             "recipe at twice its max_length; measured as lesson 01's)"},
            _eval(p, p["n_test"], "evaluations without the tool", ("01", "greedy eval"), prompt=prompt, calls=2),
            _eval(p, p["n_test"], f"multi-turn rollouts with the tool (up to {turns} turns)", ("01", "greedy eval"),
                  prompt=prompt, calls=5 * turns),
            _eval(p, p["turn_prompts"] * p["num_generations"], "the credit section's sampled rollouts",
                  ("01", "greedy eval"), prompt=prompt, calls=turns),
            _rl_batch(p, "GRPO with tools (measured as lesson 04's GRPO)", p["max_steps"], ("04", "GRPO train"),
                      new=p["max_completion_length"], prompt=prompt,
                      scale=p["max_completion_length"] / four["max_completion_length"]),
            _rl_batch(p, "the hack run and its control (measured as lesson 04's GRPO)", 2 * p["hack_steps"],
                      ("04", "GRPO train"), prompts=p["hack_prompts"], new=p["max_completion_length"], prompt=prompt,
                      scale=p["max_completion_length"] / four["max_completion_length"])]


OPERATIONS = {"01": _lesson01, "02": _lesson02, "03": _lesson03, "04": _lesson04, "05": _lesson05, "06": _lesson06,
              "07": _lesson07, "08": _lesson08, "09": _lesson09}


def estimate(preset: str, lesson: str, params, record, model: str | None = None, card: str | None = None) -> dict:
    """The upper-bound minutes of ``lesson`` on ``preset``'s card (:data:`.hardware.PRESET_CARD`), or on ``card``.

    ``params(lesson)`` gives the preset's values of a lesson, ``record(lesson)`` its current measurement (or None),
    ``model`` the Hub model whose architecture sizes the work (default: the lesson's; a local copy has the preset's).
    Returns ``{"card", "minutes", "rows": [{"label", "minutes", "measured", "device"}], "unmeasured": [phases]}``;
    ``minutes`` is None when a phase an operation needs was not measured on this preset."""
    card, p, one = card or PRESET_CARD[preset], params(lesson), params("01")
    fp32 = lesson == "07" and CARDS[card]["bf16_tflops"] is None      # lesson 07 trains in fp32 without bf16
    extra = {"07": (fp32,), "09": (params("04"),)}.get(lesson, ())
    rows, missing = [], []
    for op in OPERATIONS[lesson](p, one, *extra):
        rec = record(op["phase"][0])
        phase = (rec or {}).get("phases", {}).get(op["phase"][1])
        if phase is None and op.get("fallback"):       # a phase measured on other presets only: the batch it repeats
            phase = ((record(op["fallback"][0]) or {}).get("phases", {})).get(op["fallback"][1])
        device = device_seconds(op["work"], model or p["model"], card, op.get("fp32", False)) * op["count"]
        if phase is None:
            missing.append(f"{op['phase'][0]} {op['phase'][1]}")
        host = phase["seconds"] * op["scale"] * op["count"] if phase else None
        rows.append({"label": op["label"], "count": op["count"], "device": device / 60,
                     "measured": None if host is None else host / 60,
                     "minutes": None if host is None else (host + device) / 60})
    total = None if missing else sum(r["minutes"] for r in rows)
    return {"card": card, "minutes": total, "rows": rows, "unmeasured": sorted(set(missing))}


def markdown(estimates: dict) -> str:
    """docs/gpu.md's table of ``estimates`` (``{(lesson, preset): estimate}``): minutes per lesson and card, against
    :data:`BUDGET_MINUTES`, and the operation that costs most on each preset."""
    presets = sorted({p for _, p in estimates}, key=list(PRESET_CARD).index)
    head = "| lesson | " + " | ".join(f"`{p}` on the {PRESET_CARD[p]}" for p in presets) + " | what costs most |"
    lines = [head, "|" + " --- |" * (len(presets) + 2)]
    for lesson in sorted({les for les, _ in estimates}):
        cells, largest = [], []
        for p in presets:
            e = estimates[(lesson, p)]
            cells.append("unmeasured" if e["minutes"] is None else
                         f"{e['minutes']:.0f} min" + (" (over)" if e["minutes"] > BUDGET_MINUTES else ""))
            top = max(e["rows"], key=lambda r: r["minutes"] or 0)
            largest.append(f"{p}: {top['label']}, {top['minutes']:.0f} min" if top["minutes"] else f"{p}: -")
        lines.append(f"| {lesson} | " + " | ".join(cells) + " | " + "; ".join(largest) + " |")
    return "\n".join(lines)
