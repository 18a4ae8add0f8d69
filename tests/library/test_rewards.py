"""Tests for utils.rewards: hand-written cases, property tests (never raise), and timing."""
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from utils.rewards import (  # noqa: E402
    answers_match,
    completion_text,
    compute_score,
    correctness_reward,
    extract_answer,
    format_reward,
    is_well_formatted,
    normalize_number,
)

GOOD = "Tom has 3 apples.\nHe buys 4 more: 3 + 4 = 7.\n#### 7"
FAST = settings(max_examples=200, deadline=None)


# ----------------------------------------------------------------------------- normalize_number
@pytest.mark.parametrize("s, want", [
    ("42", "42"), (" 42 \n", "42"), ("1,234", "1234"), ("1,234,567", "1234567"),
    ("$1,234.50", "1234.5"), ("-3", "-3"), ("\u22123", "-3"), ("-$3", "-3"), ("$-3", "-3"),
    ("2.50", "2.5"), ("3.0", "3"), (".5", "0.5"), ("-.5", "-0.5"), ("72.", "72"), ("-0", "0"),
    ("-0.0", "0"), ("007", "7"), ("+5", "5"), (12, "12"), (2.5, "2.5"),
    ("0.000001", "0.000001"), ("1" * 50, "1" * 50),
])
def test_normalize_number(s, want):
    assert normalize_number(s) == want


@pytest.mark.parametrize("s", [
    "", " ", "abc", "1,23", "12,34,567", "1234,567", "1,2345", ",5", "5,", "1.2.3", "5..", ".",
    "$", "-", "--5", "1e5", "inf", "nan", "1 000", "٣", "1" * 51, None, True, float("nan"), [1],
])
def test_normalize_number_rejects(s):
    assert normalize_number(s) is None


# ----------------------------------------------------------------------------- extract_answer
@pytest.mark.parametrize("text, want", [
    (GOOD, "7"),
    ("so the total is\n#### 1,234", "1234"),
    ("#### -5", "-5"),
    ("#### \u22125", "-5"),
    ("#### 2.50", "2.5"),
    ("#### $18", "18"),
    ("#### 72.", "72"),
    ("####72", "72"),
    ("#### 3\nwait, no\n#### 4", "4"),            # last marker wins
    ("#### 3 apples", "3"),
    ("#### 1,23", None),                           # malformed final answer: no fallback
    ("The answer is 18.", "18"),                   # no marker: last number
    ("costs $1,234.50 in total", "1234.5"),
    ("it went from 5 to -3", "-3"),
    ("pages 3-5", "5"),                            # a hyphen is not a minus sign
    ("values 1,2,3", "3"),
    ("#### seventy-two, I think 72", "72"),        # marker without a number: fall back
    ("no digits here", None),
    ("", None),
    (None, None),
    (42, "42"),
])
def test_extract_answer(text, want):
    assert extract_answer(text) == want


def test_extract_answer_strict():
    assert extract_answer("The answer is 18.", strict=True) is None
    assert extract_answer("#### nothing", strict=True) is None
    assert extract_answer("steps\n#### 18", strict=True) == "18"


def test_answers_match():
    assert answers_match("2.50", "2.5")
    assert answers_match("1,234", "1234")
    assert answers_match("-0", "0")
    assert not answers_match("3", "4")
    assert not answers_match(None, "4")
    assert not answers_match("4", None)
    assert not answers_match("x", "x")


# ----------------------------------------------------------------------------- is_well_formatted
@pytest.mark.parametrize("text", [GOOD, GOOD + "\n\n  ", "work\n#### 1,234", "work\n#### -2.5"])
def test_well_formatted(text):
    assert is_well_formatted(text)


@pytest.mark.parametrize("text", [
    "#### 7",                                   # no working
    "\n\n#### 7",                               # only blank lines before
    GOOD + "\nQuestion: next one?",             # rambles after the answer
    GOOD + "\n#### 7",                          # two markers
    "work\n#### 7 apples",                      # not just a number
    "work\n####7",                              # missing space
    "work\n #### 7",                            # indented
    "work\n#### 1,23",                          # malformed number
    "work\n#### $7",                            # strict: bare number only
    "work, the answer is 7",                    # no marker
    "", None, 7,
])
def test_not_well_formatted(text):
    assert not is_well_formatted(text)


# ----------------------------------------------------------------------------- TRL reward functions
def test_completion_text():
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "x"}]) == "x"
    assert completion_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    parts = [{"type": "text", "text": "#### "}, {"type": "image"}, {"type": "text", "text": "5"}]
    assert completion_text([{"role": "assistant", "content": parts}]) == "#### 5"
    for junk in (None, 3, [], [1], [{"role": "assistant"}], {"content": "x"}, [{"content": 5}]):
        assert completion_text(junk) == ""


def test_correctness_reward_trl_call():
    gsm8k_answer = "He has 3 + 4 = 7 apples.\n#### 7"
    out = correctness_reward(
        prompts=["q1", "q2", "q3", "q4"],
        completions=[GOOD, "I think it is 7", "#### 8", [{"role": "assistant", "content": "work\n#### 1,234"}]],
        completion_ids=[[1], [2], [3], [4]],
        answer=[gsm8k_answer, "7", gsm8k_answer, "#### 1234"],
        trainer_state=None,
    )
    assert out == [1.0, 1.0, 0.0, 1.0]
    assert all(type(r) is float for r in out)


def test_correctness_reward_config_errors():
    with pytest.raises(ValueError, match="answer"):
        correctness_reward(prompts=["q"], completions=["#### 1"])
    with pytest.raises(ValueError, match="2 completions"):
        correctness_reward(completions=["#### 1", "#### 2"], answer=["1"])


def test_format_reward():
    conv = [{"role": "assistant", "content": GOOD}]
    assert format_reward(prompts=["a", "b", "c"], completions=[GOOD, GOOD + "\nmore", conv]) == [1.0, 0.0, 1.0]


def test_compute_score():
    assert compute_score("openai/gsm8k", GOOD, "7") == 2.0
    assert compute_score("openai/gsm8k", GOOD, "He has 7.\n#### 7", extra_info={"split": "test"}) == 2.0
    assert compute_score("openai/gsm8k", GOOD, "8") == 1.0                 # well formatted, wrong
    assert compute_score("openai/gsm8k", "so it is 7", "7") == 1.0          # right, loose format
    assert compute_score("openai/gsm8k", GOOD + "\n#### 7", "7") == 1.0     # two markers: not formatted
    assert compute_score("openai/gsm8k", None, "7") == 0.0
    assert compute_score("openai/gsm8k", "working\n#### 7", None) == 1.0   # format only


def test_compute_score_is_the_sum_of_the_trl_rewards():
    texts = [GOOD, GOOD + "\nmore", "so it is 7", "#### 7", "", "working\n#### 8", "7 then 8"]
    for truth in ["7", "He has 7.\n#### 7", "8"]:
        trl = [c + f for c, f in zip(correctness_reward(completions=texts, answer=[truth] * len(texts)),
                                     format_reward(completions=texts))]
        assert [compute_score("openai/gsm8k", t, truth) for t in texts] == trl


def test_rewards_module_does_not_import_torch():
    code = f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import utils.rewards; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- properties
SOUP = st.from_regex(r"[0-9,.\-#$ \n]{0,60}", fullmatch=True)
ANY_TEXT = st.one_of(st.text(), SOUP)
MESSAGE = st.dictionaries(st.sampled_from(["role", "content", "text", "type"]),
                          st.one_of(st.none(), st.integers(), st.text(), SOUP,
                                    st.lists(st.dictionaries(st.sampled_from(["type", "text"]), st.text()))))
ANY_COMPLETION = st.one_of(st.none(), st.integers(), st.text(), SOUP, st.lists(MESSAGE))


def _check_number(out):
    assert out is None or (isinstance(out, str) and normalize_number(out) == out)


@FAST
@given(ANY_TEXT)
def test_normalize_never_raises(s):
    _check_number(normalize_number(s))


@FAST
@given(ANY_TEXT, st.booleans())
def test_extract_never_raises(s, strict):
    _check_number(extract_answer(s, strict=strict))


@FAST
@given(ANY_TEXT, ANY_TEXT)
def test_match_and_format_never_raise(a, b):
    assert isinstance(answers_match(a, b), bool)
    assert isinstance(is_well_formatted(a), bool)
    assert compute_score("x", a, b) in (0.0, 1.0, 2.0)


@FAST
@given(st.integers(min_value=-10**12, max_value=10**12))
def test_integers_round_trip(n):
    assert normalize_number(f"{n:,}") == str(n)
    assert extract_answer(f"steps\n#### {n:,}") == str(n)
    assert is_well_formatted(f"steps\n#### {n:,}")


@FAST
@given(st.lists(ANY_COMPLETION, max_size=5), st.data())
def test_reward_functions_never_raise_on_completions(completions, data):
    answers = data.draw(st.lists(st.one_of(st.text(), SOUP, st.integers()),
                                 min_size=len(completions), max_size=len(completions)))
    for c in completions:
        assert isinstance(completion_text(c), str)
    for out in (correctness_reward(completions=completions, answer=answers), format_reward(completions=completions)):
        assert isinstance(out, list) and len(out) == len(completions)
        assert all(r in (0.0, 1.0) and type(r) is float for r in out)


# ----------------------------------------------------------------------------- timing
N = 200_000
ADVERSARIAL = [
    "1," * (N // 2), "1" * N, "#" * N, "####" * (N // 4), "#### " + "9" * N, "#### " + "1," * (N // 2),
    " " * N + "x", "-" * N, "$-" * (N // 2), "1." * (N // 2), "1,111" * (N // 5), ".5" * (N // 2),
    "work\n#### " + "1" * N + ",", "\n" * N + "#### 5", "1,234," * (N // 6) + "####",
]


@pytest.mark.parametrize("i", range(len(ADVERSARIAL)))
def test_linear_time_on_adversarial_strings(i):
    s = ADVERSARIAL[i]
    start = time.process_time()   # CPU time: a busy machine slows the clock, not the work
    normalize_number(s)
    extract_answer(s)
    extract_answer(s, strict=True)
    is_well_formatted(s)
    answers_match(s, s)
    correctness_reward(completions=[s], answer=[s])
    format_reward(completions=[s])
    compute_score("x", s, s)
    assert time.process_time() - start < 1.0
