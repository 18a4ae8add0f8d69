"""Verifiable rewards for grade-school math in GSM8K format.

A GSM8K answer is worked steps, one per line, ending with a final line ``#### <number>``.
The rewards here read the number a completion commits to and compare it with the
ground truth. Nothing ever evaluates model output as code, and every public function
takes arbitrary text (None, empty, huge, unicode, digit soup) without raising and in
linear time: input is length-capped before any regex that could backtrack, and the
regexes that scan whole texts have no nested or adjacent unbounded repeats.

Three interfaces:

* plain functions: ``normalize_number``, ``extract_answer``, ``answers_match``, ``is_well_formatted``
* TRL reward functions (``GRPOTrainer(reward_funcs=[correctness_reward, format_reward])``):
  called as ``f(prompts=..., completions=..., completion_ids=..., **dataset_columns)``
  and returning one float per completion
* verl's custom score function: ``compute_score(data_source, solution_str, ground_truth, extra_info)``,
  the sum of the two TRL rewards (this file imports nothing outside the standard library,
  so verl can load it by path: ``reward.custom_reward_function.path=utils/rewards.py`` in verl 0.9)
"""
from __future__ import annotations

import decimal
import re
from decimal import Decimal

MAX_NUMBER_CHARS = 100  # longer "numbers" are not answers; the cap also bounds regex work
MAX_DIGITS = 50

# A whole string that is a number: optional sign, digits with optional thousands
# separators (groups of exactly three), optional decimals. Applied to <= 100 chars only.
_FULL_NUMBER_RE = re.compile(r"(?:\d{1,3}(?:,\d{3})+|\d*)(?:\.\d+)?", re.ASCII)

# The number-like token right after the last "####" (anchored; trailing "," / "." left out).
_FINAL_TOKEN_RE = re.compile(r"[-+\u2212]?\$?[-\u2212]?[\d,.]*\d", re.ASCII)

# A number anywhere in a text, for the fallback. A minus counts only when it does not
# follow a word character (so "3-5" reads as 3 and 5); commas are thousands separators
# only in groups of three (so "1,2,3" reads as 1, 2 and 3).
_NUMBER_RE = re.compile(
    r"(?:(?<![\w.])(?P<neg>[-\u2212]))?\$?(?<![\d.])"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)",
    re.ASCII,
)

# The strict final line of a well-formatted answer.
_FINAL_LINE_RE = re.compile(r"#### -?[\d,]*\.?\d+", re.ASCII)

_DECIMAL_CONTEXT = decimal.Context(prec=MAX_DIGITS + 10)


# ----------------------------------------------------------------------------- numbers
def normalize_number(s) -> str | None:
    """Canonical string of the number written in ``s``, or None if it is not one number.

    Accepts surrounding whitespace, a ``$`` (before or after the sign), thousands
    separators in groups of three (``1,234``; ``1,23`` is not a number), one trailing
    ``.``, ``-`` or unicode minus ``−``, and decimals. ``2.50`` -> ``2.5``,
    ``3.0`` -> ``3``, ``.5`` -> ``0.5``, ``-0`` -> ``0``. Ints and finite floats are
    accepted too. Numbers with more than 50 digits are rejected.
    """
    if isinstance(s, bool):
        return None
    if isinstance(s, int):
        s = str(s)
    elif isinstance(s, float):
        if s != s or s in (float("inf"), float("-inf")):
            return None
        s = format(Decimal(repr(s)), "f")
    if not isinstance(s, str) or len(s) > 4 * MAX_NUMBER_CHARS:
        return None
    s = s.strip().replace("\u2212", "-")
    if len(s) > MAX_NUMBER_CHARS:
        return None

    sign = ""
    if s[:1] in ("-", "+"):
        sign, s = s[0], s[1:]
    if s[:1] == "$":
        s = s[1:].lstrip()
    if not sign and s[:1] in ("-", "+"):
        sign, s = s[0], s[1:]
    if s.endswith("."):
        s = s[:-1]

    if not s or not _FULL_NUMBER_RE.fullmatch(s):
        return None
    digits = s.replace(",", "").replace(".", "")
    if not digits or len(digits) > MAX_DIGITS:
        return None

    value = Decimal(("-" if sign == "-" else "") + s.replace(",", ""))
    if value == value.to_integral_value(context=_DECIMAL_CONTEXT):
        return str(int(value))  # also turns -0 into 0
    return format(value.normalize(context=_DECIMAL_CONTEXT), "f")


def extract_answer(text, strict: bool = False) -> str | None:
    """The final numeric answer in ``text``, normalized, or None.

    The answer is the number right after the LAST ``####`` marker (as in GSM8K and
    verl's gsm8k scorer). If that number is malformed (``#### 1,23``) the answer is
    None: the text committed to something that is not a number. If there is no
    marker, or no number follows it, then ``strict=True`` gives None and
    ``strict=False`` falls back to the last number anywhere in the text.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return normalize_number(text)
    if not isinstance(text, str):
        return None

    idx = text.rfind("####")
    if idx >= 0:
        m = _FINAL_TOKEN_RE.match(text[idx + 4:].lstrip())
        if m:
            return normalize_number(m.group(0))
    if strict:
        return None

    last = None
    for last in _NUMBER_RE.finditer(text):  # noqa: B007 (the loop keeps the last match)
        pass
    if last is None:
        return None
    return normalize_number((last.group("neg") or "") + last.group("num"))


def answers_match(pred, truth) -> bool:
    """True if ``pred`` and ``truth`` are numbers with the same value (``"2.50"`` == ``"2.5"``)."""
    a, b = normalize_number(pred), normalize_number(truth)
    if a is None or b is None:
        return False
    return Decimal(a) == Decimal(b)


def is_well_formatted(text) -> bool:
    """Strict GSM8K format check ("format compliance").

    True when, after stripping trailing whitespace, the last line is exactly
    ``#### <number>``, at least one non-empty line of working precedes it, and
    ``####`` occurs exactly once in the whole text.

    Strict on purpose: a base model that writes ``#### 42`` and then keeps rambling
    (another question, another ``####``) has not learned the format, even though a
    lenient extractor would still find an answer in its text. This is the number
    SFT is supposed to move, so it must not give credit for accidents.
    """
    if not isinstance(text, str):
        return False
    text = text.rstrip()
    if text.count("####") != 1:
        return False
    lines = text.splitlines()
    last = lines[-1]
    if len(last) > MAX_NUMBER_CHARS or not _FINAL_LINE_RE.fullmatch(last):
        return False
    if normalize_number(last[len("#### "):]) is None:
        return False
    return any(line.strip() for line in lines[:-1])


# ----------------------------------------------------------------------------- TRL rewards
def completion_text(c) -> str:
    """Text of one completion as TRL passes it.

    A string is returned as is; a conversational completion (list of message dicts)
    gives the content of its last message, whose content may be a string or a list
    of parts with ``"text"`` (joined). Anything else gives ``""``.
    """
    if isinstance(c, str):
        return c
    if not isinstance(c, (list, tuple)) or not c or not isinstance(c[-1], dict):
        return ""
    content = c[-1].get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        return "".join(t for t in texts if isinstance(t, str))
    return ""


def _check_completions(completions, name: str) -> None:
    """Raise ValueError if ``completions`` is not a list (a caller's mistake, not model output)."""
    if not isinstance(completions, (list, tuple)):
        raise ValueError(f"{name}: completions must be a list, got {type(completions).__name__}")


def correctness_reward(completions, answer=None, **kwargs) -> list[float]:
    """1.0 per completion whose final answer equals the ground truth, else 0.0.

    ``answer`` is the dataset's GSM8K ``answer`` column (TRL passes every dataset
    column as a keyword argument): a full worked answer ending in ``#### N``, or
    just the number. Completions are strings or lists of message dicts. Other
    keyword arguments (``prompts``, ``completion_ids``, ``trainer_state``, ...) are ignored.
    """
    _check_completions(completions, "correctness_reward")
    if answer is None:
        raise ValueError(
            "correctness_reward needs the ground truth: the dataset must have an 'answer' column "
            "(GSM8K style, e.g. '...\\n#### 42'); TRL passes dataset columns to reward functions by name."
        )
    if not isinstance(answer, (list, tuple)) or len(answer) != len(completions):
        n = len(answer) if isinstance(answer, (list, tuple)) else type(answer).__name__
        raise ValueError(
            f"correctness_reward: got {len(completions)} completions but answer is {n}; "
            f"expected a list with one answer per completion"
        )
    rewards = []
    for c, a in zip(completions, answer):
        pred = extract_answer(completion_text(c))
        truth = extract_answer(a, strict=False)
        rewards.append(1.0 if answers_match(pred, truth) else 0.0)
    return rewards


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 per completion that passes ``is_well_formatted``, else 0.0."""
    _check_completions(completions, "format_reward")
    return [1.0 if is_well_formatted(completion_text(c)) else 0.0 for c in completions]


# ----------------------------------------------------------------------------- verl
def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl custom reward: the sum of the TRL rewards above for one completion.

    ``correctness_reward + format_reward``: 2.0 for a correct, well-formatted answer,
    1.0 for a correct answer in a loose format or a well-formatted wrong one, 0.0 otherwise
    -- exactly what ``GRPOTrainer(reward_funcs=[correctness_reward, format_reward])``
    gives the same completion (reward weights 1). ``ground_truth`` is a number string or a
    full GSM8K answer; ``data_source`` and ``extra_info`` are accepted and ignored. Never raises.
    """
    pred = extract_answer(solution_str)
    truth = extract_answer(ground_truth, strict=False)
    correct = 1.0 if answers_match(pred, truth) else 0.0
    return correct + (1.0 if is_well_formatted(solution_str) else 0.0)
