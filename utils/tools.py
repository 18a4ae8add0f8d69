"""A calculator tool for agentic RL (taught in lesson 09).

``calculator(expression)`` evaluates arithmetic with its own parser: numbers, ``+ - * /`` (and ``×``, ``÷``;
not ``x``, which would read ``0x10`` as 0 times 10), unary minus and parentheses. It never calls ``eval``,
never raises, and runs in time linear in its input, which is capped at :data:`MAX_CHARS` characters; every
result is exact (``fractions.Fraction``) and bounded by :data:`MAX_ABS` in magnitude, its numbers too. What it
cannot compute, or could only show as a wrong value (a non-zero result that rounds to 0 at :data:`DECIMALS`
places), comes back as text that starts with ``"error: "`` and says why, which the model reads as the tool's
answer (a wrong call costs a turn, not the run).

The function has the type hints and the Google-style docstring that ``transformers`` turns into a
tool schema (``get_json_schema``), so the same function is a tool of ``GRPOTrainer(tools=[...])``
and of a chat template's ``tools=`` argument. It imports nothing outside the standard library, so
verl's tool class can load it by path.
"""
from __future__ import annotations

import re
from fractions import Fraction

MAX_CHARS = 100            # longer input is refused before it is read
MAX_ABS = 10**12           # every intermediate result must stay within +-MAX_ABS (a wrong call, not a bignum)
MAX_DEPTH = 10             # nested parentheses
DECIMALS = 6               # non-integer results are rounded to this many decimals

_TOKEN_RE = re.compile(r"\s*(?:(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.?\d*|\.\d+)|(\S))", re.ASCII)
_OPS = {"+": "+", "-": "-", "−": "-", "*": "*", "×": "*", "/": "/", "÷": "/", "(": "(", ")": ")"}


class _Error(Exception):
    """A message for the model (never leaves this module as an exception)."""


def _tokens(text: str) -> list:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:                       # only whitespace is left
            break
        number, symbol = m.groups()
        if number is not None:
            out.append(Fraction(number.replace(",", "")))
        elif symbol in _OPS:
            out.append(_OPS[symbol])
        else:
            raise _Error(f"unexpected character {symbol!r} at position {m.start(2)}: "
                         "use numbers, + - * / and parentheses")
        pos = m.end()
    return out


def _check(value: Fraction) -> Fraction:
    if abs(value) > MAX_ABS:
        raise _Error(f"a number or result is larger than {MAX_ABS:,} in magnitude")
    return value


def _show(token) -> str:
    return f"number {format_number(token)}" if isinstance(token, Fraction) else repr(token)


def _parse(tokens: list) -> Fraction:
    """Precedence climbing without recursion on the input's length: expression := term (('+'|'-') term)*,
    term := factor (('*'|'/') factor)*, factor := '-' factor | number | '(' expression ')' (depth <= MAX_DEPTH)."""
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def factor(depth):
        nonlocal pos
        sign = 1
        while peek() in ("-", "+"):         # unary signs (any number of them: - - 3 is 3)
            sign = -sign if tokens[pos] == "-" else sign
            pos += 1
        tok = peek()
        if isinstance(tok, Fraction):
            pos += 1
            return sign * _check(tok)
        if tok == "(":
            if depth >= MAX_DEPTH:
                raise _Error(f"parentheses nested deeper than {MAX_DEPTH}")
            pos += 1
            value = expression(depth + 1)
            if peek() != ")":
                raise _Error("a '(' is never closed")
            pos += 1
            return sign * value
        raise _Error("the expression ends too early" if tok is None else f"unexpected {_show(tok)}: expected a number")

    def term(depth):
        nonlocal pos
        value = factor(depth)
        while peek() in ("*", "/"):
            op = tokens[pos]
            pos += 1
            right = factor(depth)
            if op == "/" and right == 0:
                raise _Error("division by zero")
            value = _check(value * right if op == "*" else value / right)
        return value

    def expression(depth):
        nonlocal pos
        value = term(depth)
        while peek() in ("+", "-"):
            op = tokens[pos]
            pos += 1
            value = _check(value + term(depth) if op == "+" else value - term(depth))
        return value

    value = expression(0)
    if pos != len(tokens):
        extra = tokens[pos]
        raise _Error("a ')' has no '('" if extra == ")" else f"unexpected {_show(extra)} after a complete expression")
    return _check(value)


def format_number(value: Fraction) -> str:
    """``12`` for an integer, else the decimal rounded to :data:`DECIMALS` places without trailing zeros
    (``2.5``, ``0.333333``, ``-0.5``)."""
    if value.denominator == 1:
        return str(value.numerator)
    scaled = round(value * 10**DECIMALS)           # an int, exactly (half to even)
    whole, frac = divmod(abs(scaled), 10**DECIMALS)
    text = f"{whole}.{frac:0{DECIMALS}d}".rstrip("0").rstrip(".")
    return "-" + text if scaled < 0 else text


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Arithmetic with numbers, + - * /, unary minus and parentheses, e.g. "(48 + 24) / 2".

    Returns:
        The result as text ("36", "2.5"), or a message starting with "error: " that says what is wrong.
    """
    if not isinstance(expression, str):
        return f"error: the expression must be text, got {type(expression).__name__}"
    if len(expression) > MAX_CHARS:
        return f"error: the expression is longer than {MAX_CHARS} characters"
    try:
        tokens = _tokens(expression)
        if not tokens:
            return "error: the expression is empty"
        value = _parse(tokens)
        if value and round(value * 10**DECIMALS) == 0:   # not 0, but it would print as 0: say so instead
            return f"error: the result is not 0 but rounds to 0 at {DECIMALS} decimals"
        return format_number(value)
    except _Error as err:
        return f"error: {err}"
