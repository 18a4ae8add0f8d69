"""Grade-school arithmetic word problems in GSM8K's schema, and converters.

Every problem is a dict ``{"question": str, "answer": str}`` exactly like
``openai/gsm8k`` (config ``main``): the answer holds worked steps, one per line,
and ends with a final line ``#### <number>``. The synthetic generator is
deterministic (same arguments -> same problems) and its train and test splits
are disjoint *by construction*: a question belongs to the split chosen by a hash
of its text, so no test question can ever appear in any train set, whatever the
seed or size.

Formats the lessons need:

* plain text (pretraining format)  ``Question: ...\\nAnswer:\\n<steps>\\n#### N``
* chat messages                    ``[{"role": "user", ...}, {"role": "assistant", ...}]``
* prompt/completion (TRL)          ``{"prompt": [...], "completion": [...]}``
* preference pairs (TRL)           ``{"prompt": [...], "chosen": [...], "rejected": [...]}``
"""
from __future__ import annotations

import hashlib
import random
from typing import Iterable

from .constants import GSM8K

# ----------------------------------------------------------------------------- vocabulary
NAMES = ["Tom", "Anna", "Liam", "Mia", "Noah", "Emma", "Ben", "Lucy", "Sam", "Zoe",
         "Max", "Ivy", "Leo", "Ada", "Omar", "Nina"]
PRONOUN = {n: ("she" if n in {"Anna", "Mia", "Emma", "Lucy", "Zoe", "Ivy", "Ada", "Nina"} else "he")
           for n in NAMES}
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "eggs",
         "flowers", "coins", "shells", "stamps"]
CONTAINERS = ["boxes", "bags", "jars", "baskets", "packs"]

# Difficulty: number of operations and the size of the numbers involved.
DIFFICULTY = {1: {"steps": 1, "max": 30}, 2: {"steps": 2, "max": 100}, 3: {"steps": 3, "max": 200}}
SPLITS = ("train", "test")
TEST_FRACTION = 0.2


def _n(count: int, item: str) -> str:
    """``3 apples`` but ``1 apple``."""
    return f"{count} {item[:-1] if count == 1 else item}"


def split_of(question: str) -> str:
    """Which split a question belongs to: a fixed hash of its text (disjointness by construction)."""
    h = int.from_bytes(hashlib.sha1(question.encode()).digest()[:4], "big")
    return "test" if (h % 1000) < TEST_FRACTION * 1000 else "train"


# ----------------------------------------------------------------------------- generator
def _step(rng: random.Random, name: str, item: str, x: int, hi: int):
    """One operation applied to the running total ``x``.

    Returns (question sentence, worked-step line, new total) or None if no valid op.
    """
    he = PRONOUN[name]
    ops = ["add", "sub", "mul", "div"]
    rng.shuffle(ops)
    for op in ops:
        if op == "add":
            b = rng.randint(1, hi)
            y = x + b
            return (f"{he.capitalize()} buys {b} more {item}.",
                    f"After buying more, {name} has {x} + {b} = {_n(y, item)}.", y)
        if op == "sub" and x > 1:
            b = rng.randint(1, x - 1)
            y = x - b
            return (f"{he.capitalize()} gives {_n(b, item)} to a friend.",
                    f"After giving some away, {name} has {x} - {b} = {_n(y, item)}.", y)
        if op == "mul" and x <= hi // 4:
            b = rng.randint(2, 9)
            y = x * b
            return (f"Then {he} gets {b} times as many {item} as {he} has.",
                    f"Now {name} has {x} * {b} = {y} {item}.", y)
        if op == "div":
            divisors = [d for d in range(2, 10) if x % d == 0 and x // d >= 1]
            if divisors:
                b = rng.choice(divisors)
                y = x // b
                return (f"{he.capitalize()} splits them into {b} equal groups and keeps one group.",
                        f"One group has {x} / {b} = {_n(y, item)}.", y)
    return None


def make_problem(rng: random.Random, difficulty: int) -> dict:
    """One random word problem of the given difficulty (1, 2 or 3).

    The first sentence sets a starting amount (sometimes as boxes x items per box),
    each further sentence applies one of +, -, *, /; the answer shows one line of
    working per operation and ends with ``#### <number>``.
    """
    spec = DIFFICULTY[difficulty]
    hi = spec["max"]
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    sentences, steps = [], []
    if rng.random() < 0.3:  # start with a product: containers x items each
        k, each = rng.randint(2, 9), rng.randint(2, 12)
        box = rng.choice(CONTAINERS)
        x = k * each
        sentences.append(f"{name} has {k} {box} with {each} {item} in each.")
        steps.append(f"{name} has {k} * {each} = {x} {item}.")
        n_ops = spec["steps"] - 1
    else:
        x = rng.randint(2, hi)
        sentences.append(f"{name} has {x} {item}.")
        n_ops = spec["steps"]
    for _ in range(n_ops):
        s = _step(rng, name, item, x, hi)
        if s is None:
            break
        sentence, line, x = s
        sentences.append(sentence)
        steps.append(line)
    if not steps:  # difficulty 1 with a plain start: force one operation
        sentence, line, x = _step(rng, name, item, x, hi)
        sentences.append(sentence)
        steps.append(line)
    question = " ".join(sentences) + f" How many {item} does {name} have now?"
    answer = "\n".join(steps) + f"\n#### {x}"
    return {"question": question, "answer": answer}


def make_problems(n: int, split: str = "train", seed: int = 0,
                  difficulty: int | str = "mixed") -> list[dict]:
    """``n`` distinct problems of one split, deterministic in (n, split, seed, difficulty).

    Args:
        n: number of problems.
        split: ``"train"`` or ``"test"``; the two never share a question.
        seed: random seed; different seeds give different problems of the same split.
        difficulty: 1, 2, 3 (number of operations and number size) or ``"mixed"``
            (each problem's difficulty drawn uniformly from 1..3).
    Returns:
        list of ``{"question", "answer", "difficulty"}`` dicts (GSM8K schema plus a
        ``difficulty`` field for analysis).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if difficulty != "mixed" and difficulty not in DIFFICULTY:
        raise ValueError(f"difficulty must be 1, 2, 3 or 'mixed', got {difficulty!r}")
    rng = random.Random(f"{seed}/{split}/{difficulty}")
    seen, out = set(), []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise RuntimeError(f"could not generate {n} distinct {split} problems "
                               f"at difficulty {difficulty!r}; ask for fewer")
        d = rng.randint(1, 3) if difficulty == "mixed" else difficulty
        p = make_problem(rng, d)
        if p["question"] in seen or split_of(p["question"]) != split:
            continue
        seen.add(p["question"])
        p["difficulty"] = d
        out.append(p)
    return out


# ----------------------------------------------------------------------------- answers
def final_answer(answer: str) -> str:
    """The text after the last ``####`` of a GSM8K answer (``"...\\n#### 72"`` -> ``"72"``)."""
    return answer.rsplit("####", 1)[-1].strip()


def shortcut(problem: dict) -> dict:
    """The same problem answered without the working: ``The answer is N.\\n#### N``.

    Lessons 03, 04, 05 and 07 mix such answers into the SFT data. They are well formatted and state
    the right number, so the SFT model learns to write them; at sampling time it cannot compute N in
    one line and mostly guesses. Reinforcement learning (04, 05) and preference pairs (03) move it
    back to answers that show the working.
    """
    truth = final_answer(problem["answer"])
    return dict(problem, answer=f"The answer is {truth}.\n#### {truth}")


def is_shortcut(text) -> bool:
    """True when an answer shows no working: no ``=`` before its final ``####`` line.

    Worked answers (synthetic ``a op b = c`` lines, GSM8K's ``<<a*b=c>>`` and ``= c``) all hold an
    ``=``; a shortcut (:func:`shortcut`), a filler sentence or empty text does not. Non-strings
    count as shortcuts. Never raises.
    """
    if not isinstance(text, str):
        return True
    return "=" not in text.split("####", 1)[0]


# ----------------------------------------------------------------------------- converters
PLAIN_PROMPT = "Question: {question}\nAnswer:\n"
DOC_SEPARATOR = "\n\n"  # between documents in the pretraining stream; also the plain-format stop string


def to_plain_prompt(problem: dict) -> str:
    """Pretraining-format prompt: ``Question: <q>\\nAnswer:\\n``."""
    return PLAIN_PROMPT.format(question=problem["question"])


def to_text(problem: dict) -> str:
    """Pretraining-format document: the plain prompt followed by the worked answer."""
    return to_plain_prompt(problem) + problem["answer"]


def to_messages(problem: dict, system: str | None = None) -> list[dict]:
    """Chat messages: (optional system), user asks the question, assistant gives the answer."""
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": problem["question"]},
                   {"role": "assistant", "content": problem["answer"]}]


def to_prompt_messages(problem: dict, system: str | None = None) -> list[dict]:
    """Chat messages without the assistant turn: what a model is asked at evaluation."""
    return to_messages(problem, system)[:-1]


def to_prompt_completion(problem: dict, system: str | None = None) -> dict:
    """TRL conversational prompt-completion example: ``{"prompt": [...], "completion": [...]}``."""
    msgs = to_messages(problem, system)
    return {"prompt": msgs[:-1], "completion": msgs[-1:]}


def to_preference(problem: dict, chosen: str, rejected: str, system: str | None = None) -> dict:
    """TRL conversational preference example with an explicit prompt.

    ``chosen`` / ``rejected`` are assistant responses (strings).
    """
    return {"prompt": to_prompt_messages(problem, system),
            "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}]}


def pretraining_stream(problems: Iterable[dict]) -> str:
    """Plain-text documents joined by ``DOC_SEPARATOR`` (what the tiny model is pretrained on)."""
    return DOC_SEPARATOR.join(to_text(p) for p in problems)


# ----------------------------------------------------------------------------- GSM8K


def load_gsm8k(split: str = "train", n: int | None = None, source: str = GSM8K,
               seed: int = 0) -> list[dict]:
    """GSM8K (config ``main``) in the same schema as :func:`make_problems`.

    Args:
        split: ``"train"`` or ``"test"``.
        n: keep the first ``n`` problems after a seeded shuffle (None: all).
        source: the Hub dataset id, or a local directory laid out like the Hub
            repository (``main/train-*.parquet``, ``main/test-*.parquet``).
        seed: shuffle seed.
    Raises:
        RuntimeError: the Hub is unreachable (with what to do about it).
    """
    import os
    from pathlib import Path

    from datasets import load_dataset

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    local = Path(source)
    if local.is_dir():
        files = sorted(str(p) for p in (local / "main").glob(f"{split}-*.parquet"))
        if not files:
            raise FileNotFoundError(f"no main/{split}-*.parquet under {source}")
        ds = load_dataset("parquet", data_files={split: files}, split=split)
    else:
        from . import runtime
        if not runtime.hub_reachable():
            raise RuntimeError(
                f"Cannot download {source}: the Hugging Face Hub ({runtime.hub_endpoint()}) is "
                "unreachable. Options: set HF_ENDPOINT=https://hf-mirror.com (AutoDL / China), "
                "download the dataset elsewhere and pass source=<local dir>, or use PRESET='tiny' "
                "(synthetic problems, no network).")
        try:
            ds = load_dataset(source, "main", split=split)
        except Exception as e:  # network errors surface here with long traces
            raise RuntimeError(f"Loading {source} failed ({type(e).__name__}: {e}). "
                               f"HF_ENDPOINT={os.environ.get('HF_ENDPOINT', '<unset>')}") from e
    if n is not None:
        ds = ds.shuffle(seed=seed).select(range(min(n, len(ds))))
    return [{"question": r["question"], "answer": r["answer"]} for r in ds]


def load_problems(dataset: str, split: str, n: int, seed: int = 0,
                  difficulty: int | str = "mixed") -> list[dict]:
    """The problems a preset asks for: ``"synthetic"`` or a GSM8K source."""
    if dataset == "synthetic":
        return make_problems(n, split=split, seed=seed, difficulty=difficulty)
    return load_gsm8k(split, n=n, source=dataset, seed=seed)
