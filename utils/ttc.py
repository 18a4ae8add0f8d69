"""Test-time compute: spend generation instead of training (taught in lessons 05 and 08).

Given M sampled completions per problem, each method picks one final answer from a subset of
N <= M of them:

- **pass@N** (:func:`utils.evaluation.pass_at_k`): right if *any* of the N is right, an oracle
  that knows the truth. It bounds every method below from above.
- **best-of-N** (:func:`best_of_n_accuracy`): the completion a *verifier* scores highest. Here
  the verifier is :func:`verifier_score`, which never sees the ground truth: it re-does the
  arithmetic of every equation in the working and checks that the final answer is the last
  result (a toy process verifier, in the spirit of the PRMs of Snell et al. 2024).
- **majority vote** / self-consistency (:func:`majority_vote`, :func:`majority_vote_accuracy`):
  the most frequent final answer (Wang et al. 2023).

Accuracies are expectations over the subsets of N drawn from the M samples, so one set of M
samples gives the whole curve against N.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter

from utils import rewards

# A number as written in answers: a sign, a "$", thousands separators in groups of three ("1,200"), a decimal
# part or only one (".5", as GSM8K's "<<20*.05=1>>"). Not inside another number: "1,200" is never read as "200".
_NUM = r"(?<![\d.,])-?\$?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?!\d|[.,]\d)"
NUMBER_RE = re.compile(_NUM, re.ASCII)
EQUATION_RE = re.compile(rf"({_NUM})\s*([-+*/x×÷])\s*({_NUM})\s*=\s*({_NUM})")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "x": lambda a, b: a * b,
        "×": lambda a, b: a * b, "/": lambda a, b: a / b if b else math.nan, "÷": lambda a, b: a / b if b else math.nan}


def value(number: str) -> float:
    """The value of one :data:`NUMBER_RE` match (or one group of an :data:`EQUATION_RE` match): ``"$1,200.5"`` ->
    1200.5, ``"-.5"`` -> -0.5. Lesson 08's step labels compare numbers through it."""
    return float(number.replace(",", "").replace("$", ""))


def close(x: float, y: float) -> bool:
    """True when two numbers agree to a relative 1e-6 (absolute below 1): how the verifier compares results."""
    return abs(x - y) < 1e-6 * max(1.0, abs(x))


def equation_holds(a: str, op: str, b: str, c: str) -> bool:
    """Whether ``a op b = c`` is right (the four strings of one :data:`EQUATION_RE` match); a division by 0 is not.
    Lesson 08's step labels use it; :func:`verifier_score` counts it over an answer."""
    result = _OPS[op](value(a), value(b))
    return math.isfinite(result) and close(result, value(c))


def arithmetic_share(text) -> float:
    """The share of the ``a op b = c`` equations in ``text`` whose arithmetic holds: 0.0 without any (and for
    non-strings). Never raises. :func:`verifier_score` builds on it; lesson 08's beam search scores a partial
    answer with it."""
    if not isinstance(text, str):
        return 0.0
    equations = EQUATION_RE.findall(text[:10_000])
    return sum(equation_holds(*eq) for eq in equations) / len(equations) if equations else 0.0


def verifier_score(text) -> float:
    """A verifier that does not know the answer: how sound the working of one completion looks.

    Args:
        text: a completion (any object; non-strings score 0).
    Returns:
        float in [0, 1]: 0 without a final ``#### N`` line or without any ``a op b = c`` equation;
        otherwise the fraction of equations whose arithmetic is right, halved when the final
        answer is not the result of the last equation. Never raises.
    """
    if not isinstance(text, str):
        return 0.0
    final = rewards.extract_answer(text, strict=True)
    equations = EQUATION_RE.findall(text[:10_000])
    if final is None or not equations:
        return 0.0
    consistent = rewards.answers_match(final, equations[-1][3])
    return arithmetic_share(text) * (1.0 if consistent else 0.5)


def majority_vote(answers):
    """The most frequent answer (self-consistency); ties go to the one that appears first.

    Args:
        answers: sequence of normalized final answers (str), None for a completion without one.
    Returns:
        the winning answer, or None when no completion has an answer.
    """
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def best_of_n_accuracy(scores, correct, n: int) -> float:
    """Expected accuracy of best-of-N: draw N of the M samples at random, keep the top-scored one.

    Args:
        scores: (M,) verifier scores of the M samples of one problem.
        correct: (M,) bools, whether each sample's final answer is right.
        n: N, 1 <= N <= M. Ties for the top score are broken uniformly at random.
    Returns:
        float in [0, 1], exact (no sampling): with the samples sorted by score, a tie group
        holding ranks a..b (1-based) holds the subset's best with probability
        ``(C(M - a + 1, N) - C(M - b, N)) / C(M, N)``, and then each of its members is equally
        likely to be the pick, so the group contributes that probability times its share of
        correct samples. With N = 1 this is the mean of ``correct`` (pass@1).
    """
    m = len(scores)
    if m != len(correct) or not 1 <= n <= m:
        raise ValueError(f"need len(scores) == len(correct) >= n >= 1, got {m}, {len(correct)}, n={n}")
    order = sorted(range(m), key=lambda i: -scores[i])
    total, a = 0.0, 0
    while a < m:
        b = a
        while b + 1 < m and scores[order[b + 1]] == scores[order[a]]:
            b += 1
        p_group = (math.comb(m - a, n) - math.comb(m - b - 1, n)) / math.comb(m, n)
        total += p_group * sum(bool(correct[i]) for i in order[a:b + 1]) / (b - a + 1)
        a = b + 1
    return total


def majority_vote_accuracy(answers, truth, n: int, trials: int = 200, seed: int = 0) -> float:
    """Accuracy of majority vote over N of the M samples, averaged over random subsets.

    Args:
        answers: (M,) normalized final answers (None where a sample has none).
        truth: the normalized right answer.
        n: N, 1 <= N <= M.
        trials: random subsets averaged (one subset when N == M: the vote is then fixed).
        seed: seed of the subsets, for a reproducible curve.
    Returns:
        float in [0, 1]: the share of subsets whose vote equals ``truth``. Ties inside a subset
        go to the answer drawn first, so they are broken at random.
    """
    m = len(answers)
    if not 1 <= n <= m:
        raise ValueError(f"need 1 <= n <= len(answers), got n={n}, len={m}")
    if n == m:
        return float(rewards.answers_match(majority_vote(answers), truth))
    rng = random.Random(seed)
    hits = sum(rewards.answers_match(majority_vote(rng.sample(list(answers), n)), truth) for _ in range(trials))
    return hits / trials
