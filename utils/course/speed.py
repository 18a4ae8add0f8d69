"""How much slower than the course's reference machine this machine runs right now.

The grader's time limits (a cell's 30 s, a notebook's 180 s) and the test suite's few wall-clock limits were
set on the course's 2-core CI machine, idle. On a slower machine, or one busy with other work (a class graded
two at a time beside a test run), the same honest cell takes longer; a fixed limit then fails it where nothing
is wrong. :func:`slowdown` times a short fixed workload on one thread (interpreted Python: a grading run uses
one thread, ``OMP_NUM_THREADS=1``) and compares it with the reference machine's time: 1.0 there and on any
faster machine, 2.0 where it takes twice as long. :func:`scaled` stretches a limit by it. Measured when a
limit is about to be used (about 0.1 s), so the load of that moment counts: one measurement at a time in a
process (runs graded from several threads would otherwise slow each other's measurement down through the
GIL), shared by the calls of the next few seconds, and capped (:data:`MAX_SLOWDOWN`): a limit never grows
past four times its setting, whatever runs beside it.
"""
from __future__ import annotations

import math
import threading
import time

REFERENCE_S = 0.0335   # the workload's median time on the course's 2-core CI machine, idle (15 runs, 2026-11-27)
ROUNDS = 3
MAX_SLOWDOWN = 4.0     # a limit stretches at most this much
SHARED_S = 10.0        # a measurement serves the calls of the next 10 s

_lock = threading.Lock()
_last: tuple[float, float] | None = None   # (time.monotonic() of the measurement, its slowdown)


def _workload() -> int:
    total = 0
    for i in range(600_000):
        total += i * i % 7
    return total


def measure(rounds: int = ROUNDS) -> float:
    """The workload's median time in seconds over ``rounds`` runs (after one warm-up run)."""
    _workload()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        _workload()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def slowdown() -> float:
    """How many times slower than the reference machine this one runs now: between 1.0 (a faster machine
    keeps the limits as set) and :data:`MAX_SLOWDOWN`, rounded to a tenth."""
    global _last
    with _lock:
        now = time.monotonic()
        if _last is None or now - _last[0] > SHARED_S:
            _last = (now, min(MAX_SLOWDOWN, max(1.0, round(measure() / REFERENCE_S, 1))))
        return _last[1]


def scaled(seconds: float, factor: float | None = None) -> int:
    """``seconds`` stretched by :func:`slowdown` (or by ``factor``), rounded up to whole seconds."""
    return math.ceil(seconds * (slowdown() if factor is None else factor))
