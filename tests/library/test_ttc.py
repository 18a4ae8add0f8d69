"""Test-time compute (utils/ttc.py): the verifier, majority vote, and best-of-N / vote accuracies on known values."""
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from utils import ttc


@pytest.mark.parametrize("text, score", [
    ("Sam has 3 * 9 = 27 apples.\nAfter giving some away, Sam has 27 - 9 = 18 apples.\n#### 18", 1.0),
    ("Sam has 3 * 9 = 28 apples.\nAfter giving some away, Sam has 28 - 9 = 19 apples.\n#### 19", 0.5),  # one slip
    ("One group has 87 / 3 = 29 cookies.\n#### 30", 0.5),          # right arithmetic, answer not the result
    ("One group has 87 / 3 = 27 cookies.\n#### 30", 0.0),          # wrong and inconsistent
    ("Anna has 4 x 3 = 12 pencils.\n#### 12", 1.0),
    ("One group has 5 / 0 = 0 coins.\n#### 0", 0.0),               # division by zero is never right
    ("The answer is 12.\n#### 12", 0.0),                           # no working to check
    ("Anna has 4 * 3 = 12 pencils.", 0.0),                         # no final answer
    ("", 0.0), (None, 0.0), (12, 0.0),
])
def test_verifier_score(text, score):
    assert ttc.verifier_score(text) == pytest.approx(score)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_verifier_never_raises(text):
    assert 0.0 <= ttc.verifier_score(text) <= 1.0
    assert 0.0 <= ttc.verifier_score(text + "\n2 * 3 = 6\n#### 6") <= 1.0


def test_verifier_on_huge_numbers():
    assert ttc.verifier_score("9" * 400 + " * 9 = 1\n#### 1") == 0.0


def test_majority_vote():
    assert ttc.majority_vote(["3", "5", "5", None, "3"]) == "3", "a tie goes to the answer seen first"
    assert ttc.majority_vote([None, "7", "8", "8"]) == "8"
    assert ttc.majority_vote([None, None]) is None and ttc.majority_vote([]) is None


def brute_best_of_n(scores, correct, n):
    """Enumerate every subset of size n; break ties by averaging over the tied members."""
    total, subsets = 0.0, list(itertools.combinations(range(len(scores)), n))
    for sub in subsets:
        top = max(scores[i] for i in sub)
        tied = [i for i in sub if scores[i] == top]
        total += sum(correct[i] for i in tied) / len(tied)
    return total / len(subsets)


def test_best_of_n_known_values():
    scores, correct = [0.9, 0.5, 0.5, 0.1], [True, False, True, False]
    assert ttc.best_of_n_accuracy(scores, correct, 1) == pytest.approx(0.5)       # pass@1
    assert ttc.best_of_n_accuracy(scores, correct, 4) == pytest.approx(1.0)       # the 0.9 sample is in
    # n = 2: 3 of the 6 pairs contain the 0.9 sample (right); {0.5, 0.5} tie: 1/2; {0.5a, 0.1}: 0; {0.5b, 0.1}: 1
    assert ttc.best_of_n_accuracy(scores, correct, 2) == pytest.approx((3 + 0.5 + 0 + 1) / 6)


def test_best_of_n_matches_enumeration():
    rng = random.Random(0)
    for _ in range(30):
        m = rng.randint(1, 8)
        scores = [rng.choice([0.0, 0.5, 1.0]) for _ in range(m)]
        correct = [rng.random() < 0.5 for _ in range(m)]
        for n in range(1, m + 1):
            assert ttc.best_of_n_accuracy(scores, correct, n) == pytest.approx(brute_best_of_n(scores, correct, n))


def test_best_of_n_with_an_oracle_is_pass_at_k():
    from utils.evaluation import pass_at_k
    correct = [True, False, False, True, False, False, False, False]
    for n in range(1, 9):
        assert ttc.best_of_n_accuracy([float(c) for c in correct], correct, n) == pytest.approx(pass_at_k(8, 2, n))


def test_best_of_n_bad_input():
    with pytest.raises(ValueError):
        ttc.best_of_n_accuracy([1.0], [True, False], 1)
    with pytest.raises(ValueError):
        ttc.best_of_n_accuracy([1.0, 0.0], [True, False], 3)


def test_majority_vote_accuracy():
    answers = ["4", "4", "5", None]
    assert ttc.majority_vote_accuracy(answers, "4", 4) == 1.0
    assert ttc.majority_vote_accuracy(answers, "5", 4) == 0.0
    assert ttc.majority_vote_accuracy(answers, "4", 1, trials=4000) == pytest.approx(0.5, abs=0.03)
    # n = 3 of 4: subsets {4,4,5}, {4,4,None} win; {4,5,None} is a tie, won by whichever is drawn first (1/2)
    assert ttc.majority_vote_accuracy(answers, "4", 3, trials=4000) == pytest.approx((2 + 2 * 0.5) / 4, abs=0.03)
    assert ttc.majority_vote_accuracy(answers, "4", 2, seed=1) == ttc.majority_vote_accuracy(answers, "4", 2, seed=1)
    assert math.isclose(ttc.majority_vote_accuracy(["1"], "1", 1), 1.0)


def test_equation_holds_and_close():
    assert ttc.equation_holds("7", "*", "4", "28") and ttc.equation_holds("91", "/", "7", "13.0")
    assert not ttc.equation_holds("7", "*", "4", "27") and not ttc.equation_holds("5", "/", "0", "0")
    assert ttc.equation_holds("3", "x", "4", "12") and ttc.equation_holds("10", "-", "12", "-2")
    assert ttc.close(1e7, 1e7 + 1) and not ttc.close(1.0, 1.001) and not ttc.close(float("inf"), float("inf"))


STEP_Q = "Sam has 63 cookies. He buys 28 more cookies. He splits them into 7 equal groups and keeps one group."
STEP_REF = "After buying more, Sam has 63 + 28 = 91 cookies.\nOne group has 91 / 7 = 13 cookies.\n#### 13"


@pytest.mark.parametrize("solution, want", [
    (STEP_REF, [(39, True), (74, True), (91, True)]),
    # a right final number reached through a slip: the slip and everything after it are wrong
    ("After buying more, Sam has 63 + 28 = 82 cookies.\nOne group has 82 / 7 = 13 cookies.\n#### 13",
     [(39, False), (74, False), (91, False)]),
    # a skipped step: each equation holds, but 63 / 7 = 9 is not on the reference's path
    ("One group has 63 / 7 = 9 cookies.\n#### 9", [(24, False), (40, False)]),
    # an invented operand (30 is in neither the question nor an earlier result)
    ("After buying more, Sam has 63 + 30 = 93 cookies.\n#### 93", [(39, False), (56, False)]),
    ("no working at all", []),
    ("#### 13", [(7, True)]),
])
def test_step_labels_on_hand_labelled_answers(solution, want):
    from utils.solutions.lesson08 import step_labels
    assert step_labels(STEP_Q, solution, STEP_REF) == want


@pytest.mark.parametrize("text, equations", [
    ("1,200 * 3 = 3,600", [("1,200", "*", "3", "3,600")]),                   # thousands separators
    ("$5 x 3 = $15 in all", [("$5", "x", "3", "$15")]),                       # dollars
    ("Natalia sold 48/2 = <<48/2=24>>24 clips", [("48", "/", "2", "24")]),    # GSM8K's calculator markup
    ("<<20*.05=1>>1 dollar", [("20", "*", ".05", "1")]),                      # a bare decimal point
    ("3 + 4 = 7, then 7 * 2 = 14", [("3", "+", "4", "7"), ("7", "*", "2", "14")]),
    ("10-12=-2", [("10", "-", "12", "-2")]),
    ("1,20 + 1 = 2", []), ("12,3456 * 2 = 1", []),                            # not numbers: never a tail of one
])
def test_equations_as_gsm8k_writes_them(text, equations):
    assert ttc.EQUATION_RE.findall(text) == equations
    assert all(ttc.equation_holds(*eq) for eq in equations)


def test_numbers_and_their_values():
    assert ttc.NUMBER_RE.findall("A $1,200 car, 3.5 km, .5 kg, 10-12, 1,20") == ["$1,200", "3.5", ".5", "10", "12"]
    assert [ttc.value(x) for x in ("$1,200", "-.5", "3,600.25", "7")] == [1200.0, -0.5, 3600.25, 7.0]
    assert ttc.verifier_score("He pays 1,200 * 3 = $3,600.\n#### 3,600") == 1.0


GSM_Q = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
         "How many clips did Natalia sell altogether in April and May?")
GSM_REF = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
           "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


@pytest.mark.parametrize("solution, want", [
    (GSM_REF, [True, True, True]),                                            # the reference, markup and all
    ("She sold 48 / 2 = 24 clips in May.\nIn all 48 + 24 = 72.\n#### 72", [True, True, True]),  # "half": a 2
    ("In all 48 + 24 = 72.\n#### 72", [False, False]),                        # 24 used before it is computed
    ("She sold 48 / 3 = 16 clips in May.\nIn all 48 + 16 = 64.\n#### 64", [False, False, False]),  # 3 is nowhere
])
def test_step_labels_on_gsm8k_format(solution, want):
    from utils.solutions.lesson08 import step_labels
    assert [right for _, right in step_labels(GSM_Q, solution, GSM_REF)] == want
    assert ttc.verifier_score(GSM_REF) == 1.0


def test_step_labels_never_raise_on_arbitrary_text():
    from utils.solutions.lesson08 import step_labels
    for text in ["1 / 0 = 0\n#### 0", "9" * 400 + " * 9 = 1\n####", "#### ####\n\n\n= = =", "\x00 + 1 = 2 ×÷", ""]:
        labels = step_labels(STEP_Q, text, STEP_REF)
        assert all(isinstance(e, int) and 0 <= e <= len(text) for e, _ in labels)


def test_beam_step_against_a_brute_force_ranking():
    """Lesson 08's beam step: the kept beams are, among the unfinished candidates, those no other unfinished
    candidate beats (a higher score, or the same score earlier in the list), `width` of them, best first."""
    import random

    from utils.solutions.lesson08 import beam_step
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        cands = [f"line {i} = {i}\n" + ("#### 1" if rng.random() < 0.3 else "") for i in range(n)]
        scores = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(n)]     # ties are common
        width = rng.randint(1, 4)
        beams, finished = beam_step(cands, scores, width)
        open_ = [i for i, c in enumerate(cands) if not c.endswith("#### 1")]
        rank = {i: sum((scores[j], -j) > (scores[i], -i) for j in open_) for i in open_}
        assert beams == [cands[i] for i in sorted(open_, key=rank.get) if rank[i] < width]
        assert finished == [(c, s) for c, s in zip(cands, scores) if c.endswith("#### 1")]
    with pytest.raises(ValueError):
        beam_step(["a\n"], [1.0, 2.0], 1)


def test_arithmetic_share_on_hand_counted_equations():
    assert ttc.arithmetic_share("3 + 4 = 7 and 7 * 2 = 15\n") == 0.5
    assert ttc.arithmetic_share("Tom has 3 + 4 = 7 apples.\n#### 7") == 1.0
    assert ttc.arithmetic_share("no equation yet\n") == 0.0 and ttc.arithmetic_share(None) == 0.0
