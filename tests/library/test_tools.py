"""The calculator tool (utils/tools.py): known values, readable errors, and properties on arbitrary input:
it never raises, never hangs, and agrees with exact arithmetic on random expression trees."""
import time
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from utils import tools
from utils.tools import calculator


@pytest.mark.parametrize("expression, result", [
    ("48/2", "24"), ("(48 + 24) / 2", "36"), ("48+24*2", "96"), ("(48+24)*2", "144"), ("10 - 4 - 3", "3"),
    ("100 / 10 / 5", "2"), ("1,200 * 3", "3600"), ("10 ÷ 4", "2.5"), ("3 × 4", "12"),
    ("-(3*4)", "-12"), ("- - 3", "3"), ("2 * -3", "-6"), (".5 + .5", "1"), ("3.", "3"), ("1/3", "0.333333"),
    ("-1/3", "-0.333333"), ("2/3", "0.666667"), ("0.0000006", "0.000001"), ("0.1 + 0.2", "0.3"), ("0.0000004 - 0.0000004", "0"),
    ("999999999999.333333 + 0", "999999999999.333333"),        # exact: a float would lose the last digits
    ("((((((((((1))))))))))", "1"), ("99999*99999*99", "989980200099"),
])
def test_known_values(expression, result):
    assert calculator(expression) == result


@pytest.mark.parametrize("expression, message", [
    ("1/0", "division by zero"), ("1/(2-2)", "division by zero"), ("", "empty"), ("   ", "empty"),
    ("(1+2", "never closed"), ("1+2)", "has no '('"), ("1 2", "unexpected number 2"), ("2-", "ends too early"),
    ("3 + 4 = 7", "unexpected character '='"), ("1e5", "unexpected character 'e'"), ("1,2+3", "','"),
    ("import os", "unexpected character 'i'"), ("__import__('os')", "unexpected character '_'"),
    ("9" * 13, "larger than"), ("999999 * 999999 * 999999", "larger than"),
    ("(" * 11 + "1" + ")" * 11, "nested deeper"), ("1+" * 60 + "1", "longer than 100"),
    (None, "must be text"), (12, "must be text"),
    # a silent wrong value is worse than an error: "x" would read 0x10 as 0 times 10, and a result that is not 0
    # would print as 0; a number too large is refused even where the result would be in range
    ("3 x 4", "unexpected character 'x'"), ("0x10", "unexpected character 'x'"),
    ("0.0000004", "rounds to 0"), ("-0.0000004", "rounds to 0"), ("1/3000000", "rounds to 0"),
    ("0.0000005", "rounds to 0"), ("1111111111111*0", "larger than"),
])
def test_errors_say_what_is_wrong(expression, message):
    out = calculator(expression)
    assert out.startswith("error: ") and message in out, out


def test_it_has_a_tool_schema():
    """transformers turns the signature and docstring into the schema GRPOTrainer(tools=...) and chat templates use."""
    from transformers.utils import get_json_schema

    fn = get_json_schema(calculator)["function"]
    assert fn["name"] == "calculator" and fn["parameters"]["required"] == ["expression"]
    assert fn["parameters"]["properties"]["expression"]["type"] == "string"


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="0123456789+-*/().,× ÷x", max_size=120)))
def test_never_raises_on_arbitrary_text(text):
    out = calculator(text)
    assert isinstance(out, str) and out
    if not out.startswith("error: "):
        assert abs(Fraction(out)) <= tools.MAX_ABS


def test_never_hangs_on_adversarial_input():
    cases = ["(" * 100, "-" * 100, "9" * 100, "9*" * 49 + "9", "1/" * 49 + "3", "(-" * 50, "1" * 10**6,
             "0." + "0" * 97 + "1", "1/3" + "/7" * 32]
    start = time.process_time()   # CPU time: a busy machine slows the clock, not the work
    for text in cases:
        assert calculator(text).startswith(("error: ", "0", "1", "-"))
    assert time.process_time() - start < 1.0


def _render(tree) -> str:
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    return f"({_render(left)} {op} {_render(right)})"


def _value(tree) -> Fraction:
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = _value(left), _value(right)
    return {"+": a + b, "-": a - b, "*": a * b}[op] if op != "/" else a / b


trees = st.recursive(st.integers(0, 999), lambda sub: st.tuples(st.sampled_from("+-*/"), sub, sub), max_leaves=6)


@settings(max_examples=400, deadline=None)
@given(trees)
@example(("/", ("/", 1, 10), ("*", 253, 791)))    # 1/2001230: not 0, but 0 at six decimals
def test_agrees_with_exact_arithmetic_on_random_trees(tree):
    """The tree's value computed directly (no parsing) against the calculator on its fully parenthesized text
    (precedence without parentheses: test_precedence_and_left_to_right)."""
    text = _render(tree)
    try:
        want = _value(tree)
    except ZeroDivisionError:
        assert calculator(text) == "error: division by zero"
        return
    if len(text) > tools.MAX_CHARS or text.count("(") > tools.MAX_DEPTH:
        assert calculator(text).startswith("error: ")
        return
    got = calculator(text)
    if abs(want) > tools.MAX_ABS:
        assert got.startswith("error: ")
    elif want and round(want * 10**tools.DECIMALS) == 0:   # not 0, but 0 at the decimals shown: an error, not "0"
        assert got.startswith("error: ") and ("rounds to 0" in got or "larger than" in got), got
    elif got.startswith("error: "):          # an intermediate result may exceed the bound when the final does not
        assert "larger than" in got, got
    else:
        assert got == tools.format_number(want)


@pytest.mark.parametrize("text, want", [("7 - 3 - 2", "2"), ("8 / 4 / 2", "1"), ("2 + 3 * 4", "14"),
                                        ("2 * 3 + 4", "10"), ("-2 * -2", "4"), ("6 / -4", "-1.5")])
def test_precedence_and_left_to_right(text, want):
    """a - b - c = (a - b) - c; a / b / c = (a / b) / c; * binds tighter than +; unary minus binds tightest."""
    assert calculator(text) == want
