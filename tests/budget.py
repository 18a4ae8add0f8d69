"""Where `make test` spends its time, part by part, against a budget per part (pytest plugin).

``pytest.ini`` loads it (``-p tests.budget``). Every test's setup, call and teardown is counted to the part its
file belongs to (:data:`PARTS`); two kinds of work are taken out of the test that happened to start them and
shown on their own: the lessons' executions (``tests/lesson_runs.py`` times each) and the side venvs' installs
(``tests/side_venv.py``). At the end the suite prints one line per part, its budget, and the parts over budget.

The budgets are seconds on the course's 2-core CI machine in an ordinary hour (its speed varies by 20-50 %
from hour to hour), for the whole of `make test`, where the lessons execute in the background beside the other
tests (``tests/lesson_runs.py``): a part's seconds are then its tests' time beside them, and the lesson part
holds what the session waited for them once the other tests were done (each lesson's own time is shown under
it). `make test-fast` runs the unit tests alone, against :data:`FAST_UNIT_BUDGET_S`. A part over budget is
printed, never failed: a test that fails on a busy machine where nothing is wrong is what this suite avoids
(timings belong in benchmarks, DEVELOPERS.md). ``--budget-strict`` makes it an error, for a benchmark run on an
idle machine.
"""
from __future__ import annotations

import fnmatch
import os
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

# part -> (budget in seconds in `make test`, the test files whose `slow` tests it holds). A test marked `lesson`
# counts to the lesson parts, a `slow` one to the first part whose files match its file (fnmatch), every other
# test to "unit tests": what `make test-fast` runs (alone there, against FAST_UNIT_BUDGET_S).
PARTS = {
    "lesson executions": (590, ()),                     # what the session still waited for them (tests/lesson_runs.py)
    "lesson record tests and nbval": (10, ()),
    "labs validated (labs, handout)": (150, ("tests/course/test_labs.py", "tests/course/test_handout.py")),
    "classes graded (grader, red team)": (290, ("tests/course/test_grade.py", "tests/course/test_redteam.py", "tests/course/test_speed.py",
                                                "tests/course/test_instructor_guide.py")),
    "nbgrader and verl (side venvs)": (60, ("tests/side/test_nbgrader.py", "tests/side/test_verl*.py")),
    "side venv installs": (120, ()),                    # only on a cold cache (~/.cache/post-training-course)
    "twins and Ctrl-C, end to end": (60, ("tests/course/test_twins.py", "tests/course/test_interrupt.py")),
    "other slow tests": (20, ()),
    "unit tests (make test-fast)": (170, ()),
}
# The parts but the installs sum to SUITE_BUDGET_S (a test says so). Measured from a fresh clone (docs/testing.md), the
# lessons beside the other tests: the wait for the lessons 582 s, labs 144, classes graded 286, nbgrader and verl
# 58, unit tests 207; the unit tests alone took 118-131 s, then about 12 s more with Qwen's real tokenizers
# (tests/course/test_qwen_tokenizers.py, the Qwen cases of tests/library/test_agent.py).
SUITE_BUDGET_S = 25 * 60 - 150   # CI's 25 minutes, less a fresh clone's install (about 2 min 30 s)
FAST_BUDGET_S = 3 * 60           # make test-fast, collection and start-up included (its wall time)
FAST_UNIT_BUDGET_S = 170         # the unit tests' own times summed, over xdist's workers too (make test-fast)
UNIT = "unit tests (make test-fast)"
CPU_PROPERTY = "budget_cpu_s"   # a test report's CPU seconds (user_properties)
MARKERS_PROPERTY = "budget_markers"   # and its markers' names (an xdist worker's reports reach the controller)
MOVED_FROM = {"lesson executions": "lesson record tests and nbval",
              "side venv installs": "nbgrader and verl (side venvs)"}

_extra: dict[str, float] = defaultdict(float)   # seconds of work named outside the tests (lessons, venv installs)
_details: dict[str, list] = defaultdict(list)
_cpu_extra: dict[str, float] = defaultdict(float)   # CPU seconds of that work (the lessons' executions)
_cpu_apart = [0.0]                                  # all of it: taken out of the test during which it was counted
cpu_lock = threading.Lock()   # held while work is reaped and noted apart, and while a test's CPU time is read


def cpu_seconds() -> float:
    """CPU time (user and system) of this process and of its children that have been waited for: what the test
    session computed so far, its kernels, graders and pip installs included."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine_cpu() -> tuple[float, float] | None:
    """(CPU seconds the whole machine computed since boot, seconds the hypervisor took from it: steal), from
    ``/proc/stat``; None where there is none. Unlike :func:`cpu_seconds` it counts what the grader's sandbox runs
    (a PID namespace reaps those processes, so their time reaches no parent) and whatever else the machine did."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / tick, steal / tick


def _tests_cpu() -> float:
    """The session's CPU time so far less what was noted apart (:func:`note_cpu`)."""
    with cpu_lock:
        return cpu_seconds() - _cpu_apart[0]


def note_cpu(part: str, cpu: float) -> None:
    """Count ``cpu`` seconds of CPU time to ``part`` (a lesson's execution), not to the test that was running while
    it was counted (a background execution reaped, or a lesson executed in this process)."""
    _cpu_extra[part] += cpu
    _cpu_apart[0] += cpu


def note(part: str, seconds: float, what: str | None) -> None:
    """Count ``seconds`` to ``part`` instead of to the test that is running (lesson executions, venv installs);
    ``what`` names the piece ("lesson 04") in the table (None: no line of its own)."""
    _extra[part] += seconds
    if what is not None:
        _details[part].append((what, seconds))


def detail(part: str, what: str, seconds: float, cpu: float | None = None) -> None:
    """A line under ``part`` in the table, counted to nothing: work done beside the session's own (a lesson
    executed in the background, whose wait :func:`note` counted), with its CPU time when known."""
    _details[part].append((what, seconds) if cpu is None else (what, seconds, cpu))


def part_of(path: str, keywords) -> str:
    """The part a test belongs to, from its file (relative to the repository, with /) and its markers."""
    if "lesson" in keywords:
        return "lesson record tests and nbval"
    if "slow" in keywords:
        return next((part for part, (_, patterns) in PARTS.items() if any(fnmatch.fnmatch(path, p) for p in patterns)),
                    "other slow tests")
    return UNIT


class Breakdown:
    """Seconds per part of one session: the tests' durations, less the work noted apart."""

    def __init__(self):
        self.tests = defaultdict(float)
        self.cpu = defaultdict(float)       # CPU seconds per part (the tests' own; the lessons' from note_cpu)
        self.start = time.perf_counter()
        self.cpu_start, self.machine_start = cpu_seconds(), machine_cpu()

    def add(self, path: str, keywords, seconds: float) -> None:
        self.tests[part_of(path, keywords)] += seconds

    def add_cpu(self, path: str, keywords, cpu: float) -> None:
        self.cpu[part_of(path, keywords)] += cpu

    def parts(self, extra: dict[str, float]) -> dict[str, float]:
        """Seconds per part. What was noted apart is moved out of the parts whose tests started it: lesson
        executions out of the lesson tests, venv installs out of the nbgrader and verl checks."""
        out = dict(self.tests)
        for part, seconds in extra.items():
            out[part] = out.get(part, 0.0) + seconds
            source = MOVED_FROM.get(part)
            if source is not None and source in out:
                out[source] = max(0.0, out[source] - seconds)
        return {p: out[p] for p in PARTS if p in out}

    def report(self, extra: dict[str, float], details=None, cpu_extra=None) -> tuple[list[str], list[str]]:
        """(lines of the table, the parts over budget); ``details``: part -> [(what, seconds[, CPU seconds])], shown
        under it; ``cpu_extra``: part -> CPU seconds noted apart (:func:`note_cpu`). The CPU column is what a part
        computed, whatever ran beside it: the figure to compare from hour to hour (CPU time still stretches by
        part of a slow hour's 20-50 %, wall time by all of it and by what shared the cores)."""
        details = details or {}
        cpu = {**self.cpu}
        for part, seconds in (cpu_extra or {}).items():
            cpu[part] = cpu.get(part, 0.0) + seconds
        parts = self.parts(extra)
        lines = [f"{'part':<40} {'seconds':>8} {'budget':>7} {'CPU s':>7}"]
        over = []
        fast = set(parts) <= {UNIT}
        for part, seconds in parts.items():
            budget = FAST_UNIT_BUDGET_S if fast else PARTS[part][0]
            flag = "  OVER" if seconds > budget else ""
            if flag:
                over.append(f"{part} ({seconds:.0f} s of {budget} s)")
            used = f"{cpu[part]:7.0f}" if part in cpu else " " * 7
            lines.append(f"{part:<40} {seconds:8.0f} {budget:7d} {used}{flag}")
            for what, s, *c in details.get(part, ()):
                lines.append(f"    {what:<36} {s:8.0f} {'':7} {c[0]:7.0f}" if c else f"    {what:<36} {s:8.0f}")
        wall = time.perf_counter() - self.start
        limit, name = (FAST_BUDGET_S, "make test-fast") if fast else (SUITE_BUDGET_S, "make test")
        total = cpu_seconds() - self.cpu_start
        lines.append(f"{'the session (' + name + ')':<40} {wall:8.0f} {limit:7d} {total:7.0f}"
                     f"{'  OVER' if wall > limit else ''}")
        lines.append(f"(CPU time {total / 60:.1f} min in {wall / 60:.1f} min: {total / max(wall, 1e-9):.2f} of the "
                     f"machine's {usable_cores()} cores busy on average, the grader's sandboxed runs not counted)")
        now = machine_cpu()
        if now is not None and self.machine_start is not None:
            busy, steal = (a - b for a, b in zip(now, self.machine_start))
            lines.append(f"(the whole machine meanwhile: {busy / 60:.1f} CPU-min, {busy / max(wall, 1e-9):.2f} cores busy; "
                         f"{steal:.0f} s taken by the hypervisor)")
        if wall > limit:
            over.append(f"the session ({wall:.0f} s of {limit} s)")
        return lines, over


def usable_cores() -> int:
    """The CPU cores this process may use (its affinity: a container's CPU set, ``taskset``)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ----------------------------------------------------------------------------- pytest hooks
class _Collector:
    """Registered per session: adds each test report's duration and CPU time to the session's breakdown."""

    def __init__(self, breakdown: Breakdown):
        self.breakdown = breakdown

    def pytest_runtest_logreport(self, report):
        sent = dict(report.user_properties)   # filled by pytest_runtest_makereport, in an xdist worker too
        markers = set(sent.get(MARKERS_PROPERTY, ()))   # by name: a test id "slow" is not the marker
        path = report.location[0].replace("\\", "/")
        self.breakdown.add(path, markers, report.duration)
        if sent.get(CPU_PROPERTY) is not None:
            self.breakdown.add_cpu(path, markers, sent[CPU_PROPERTY])

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid, location):
        self.mark = _tests_cpu()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):   # each phase's CPU time travels in its report (to xdist's too)
        outcome = yield
        now = _tests_cpu()
        sent = outcome.get_result().user_properties
        sent.append((CPU_PROPERTY, now - getattr(self, "mark", now)))
        sent.append((MARKERS_PROPERTY, sorted({m.name for m in item.iter_markers()})))
        self.mark = now


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (make test-fast): one worker per core this process may use (xdist's own count reads the
    machine's physical cores, whatever a container's CPU set allows)."""
    return usable_cores()


def pytest_addoption(parser):
    parser.getgroup("budget").addoption("--budget-strict", action="store_true",
                                        help="fail the session when a part is over its budget (tests/budget.py): "
                                             "for a benchmark on an idle machine, never for CI")


def pytest_configure(config):
    config._budget = Breakdown()
    config.pluginmanager.register(_Collector(config._budget), "budget-collector")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    breakdown = getattr(config, "_budget", None)
    if breakdown is None or not breakdown.tests:
        return
    lines, over = breakdown.report(_extra, _details, _cpu_extra)
    terminalreporter.section("where the time went (tests/budget.py)")
    for line in lines:
        terminalreporter.write_line(line)
    if over:
        terminalreporter.write_line("over budget: " + "; ".join(over), yellow=True, bold=True)


def pytest_sessionfinish(session, exitstatus):
    breakdown = getattr(session.config, "_budget", None)
    if breakdown is not None and session.config.getoption("--budget-strict") and breakdown.tests:
        if breakdown.report(_extra)[1] and session.exitstatus == 0:
            session.exitstatus = 1
