"""pytest plugin: every lesson executed once per test session, feeding both its record tests and nbval.

``pytest.ini`` loads it (``-p tests.lesson_runs``). A lesson runs, on ``tiny`` under papermill, the first
time a test asks for it (the ``lesson_runs`` fixture), into one folder per session (``--lesson-runs DIR``
keeps it; by default a temporary folder). The executed copy then serves

* the record tests (``tests/lessons/test_lessonNN.py``: ``lesson_runs.records("04")``), and
* nbval: ``notebooks/NN_*.ipynb`` are collected as nbval's own items, one per code cell, whose outputs are
  compared, by nbval's ``compare_outputs`` with ``tests/nbval_sanitize.cfg``, with the same cell of that
  one execution instead of a second one. As with ``--nbval-lax``, only cells marked
  ``# NBVAL_CHECK_OUTPUT`` are compared; a cell whose execution raised fails.

Both are marked ``lesson`` (``make test-fast`` deselects them) and run after the session's other tests. Every
lesson they need starts in the background as soon as the tests are collected, beside the other tests (which
use less than one of the 2 cores on average: 316 s of CPU time in 430 s), one per core (up to
:data:`MAX_WORKERS`) at a time, longest first (by the committed run's ``wall_seconds``), each in a process of
its own (``python -m tests.lesson_runs``), all in the one folder (so that a lesson reuses an earlier one's SFT
model, ``utils.sft.sft_checkpoint``). Each kernel keeps the two CPU threads of every tiny run
(``utils.course.run.TINY_KERNEL_ENV_DEFAULTS``; its records are then the committed ones), waiting for work
passively (``OMP_WAIT_POLICY=PASSIVE``: OpenMP's spinning threads otherwise take the cores from each other).
Two at a time pays on 2 cores because the tiny model's small operations keep a second thread half idle:
lessons 09, 06 and 08 took 273 s two at a time against 316 s one after the other, measured back to back.
Ctrl-C (or the session's end) stops the background executions and their kernels. The GPU presets' rehearsals
(``tests/lessons/test_rehearsal.py``, ``utils.course.rehearsal``) are jobs of the same pool (``"04@24g"``), after the
lessons.
"""
from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import IPyNbCell, IPyNbFile, coalesce_streams, find_comment_markers, find_metadata_tags

from tests import budget
from utils import headlines
from utils.constants import LESSON_GLOB, NOTEBOOKS_DIR, REPO_ROOT
from utils.course.lessons import lesson_number
from utils.records import read_records

SANITIZE = Path(__file__).with_name("nbval_sanitize.cfg")
MAX_WORKERS = 4         # lessons side by side at most (each kernel holds about 1-2 GB)
STOP_WITHIN_S = 10      # a background execution told to stop (SIGTERM) is killed with its kernel after this
SIDE_BY_SIDE_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}   # a waiting thread sleeps: the cores are shared
# A job's process runs `main` below, as `python -m tests.lesson_runs` would, but without the IRI parsers that
# jsonschema builds when papermill imports nbformat: it imports ``rfc3987_syntax`` where that is installed
# (jupyterlab's dependencies install it), some 35 Earley parsers (jsonschema issue #1428) for the "iri" formats that
# no notebook schema uses. Marked absent, jsonschema leaves those two format checks out: 1.3 s of CPU time of each of
# the 25 jobs of `make test` (9 lessons, 16 rehearsals), measured.
WITHOUT_IRI_PARSERS = "import sys; sys.modules.setdefault('rfc3987_syntax', None); "
JOB_COMMAND = (sys.executable, "-c", WITHOUT_IRI_PARSERS + "from tests.lesson_runs import main; sys.exit(main(sys.argv[1:]))")


def side_by_side(cores: int, workers: int | None = None) -> int:
    """How many lessons to execute at a time on ``cores`` cores: ``workers`` (``--lesson-workers``), else one per
    core up to :data:`MAX_WORKERS`."""
    return max(1, workers if workers is not None else min(MAX_WORKERS, cores))


def expected_seconds(lesson: str) -> float:
    """How long the committed run of ``lesson`` took (its ``NN/wall_seconds`` record; 0 when it has none)."""
    from utils.course.lessons import find_lessons, wall_seconds

    try:
        (notebook,) = find_lessons([lesson])
        return float(wall_seconds(read_records(notebook)) or 0.0)
    except (LookupError, ValueError, OSError, TypeError):   # no such lesson (its execution says so), unreadable
        return 0.0


def reap(proc: subprocess.Popen) -> float | None:
    """None while ``proc`` runs; once it has ended, reap it (setting its ``returncode``) and return its CPU time
    with that of the processes it waited for (its kernel): what it computed (``os.wait4``; 0.0 where that is
    missing)."""
    if proc.returncode is not None or not hasattr(os, "wait4"):
        return None if proc.poll() is None else 0.0
    try:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    except ChildProcessError:                      # reaped elsewhere (Popen.poll from another thread)
        proc.poll()
        return 0.0
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


class LessonRuns:
    """The session's executions of the lessons, each made once: on first request, or in the background after
    :meth:`prefetch`."""

    def __init__(self, out_dir: Path, note=None, workers: int = 1, seed: int = 0, ledger=budget):
        """``note(part, seconds, what)`` is told each execution's time (the session's: :func:`tests.budget.note`);
        ``workers`` > 1: :meth:`prefetch` executes that many lessons at a time, each in a process of its own;
        ``seed``: the lessons' ``SEED`` (``--lesson-seed``; the committed runs are seed 0's); ``ledger``: where the
        executions' CPU time and table lines go (``note_cpu``, ``detail`` and ``cpu_lock``: :mod:`tests.budget`'s;
        a test of this class passes its own, which the session's executions, reaped meanwhile, do not touch)."""
        self.out_dir = Path(out_dir)
        self.seed = seed
        self.note = note
        self.ledger = ledger
        self.workers = workers
        self.results: dict[str, dict] = {}
        self._locks = defaultdict(threading.Lock)
        self._ready: dict[str, threading.Event] = {}    # lessons prefetched, set when their result is in
        self._procs: dict[str, subprocess.Popen] = {}   # background executions running
        self._stop = threading.Event()
        self._starting = threading.Lock()               # no execution starts while stop() runs
        self.refused: str | None = None                 # why this process executes no lesson (an xdist worker)

    def running(self) -> int:
        """How many executions run in the background now."""
        return sum(proc.poll() is None for proc in list(self._procs.values()))

    def run(self, lesson: str) -> dict:
        """The runner's result dict of lesson ``lesson`` ("04", or a rehearsal "04@24g": :func:`execute_job`),
        executing it when not done yet (or waiting for its background execution)."""
        if self.refused:
            pytest.fail(self.refused, pytrace=False)
        with self._locks[lesson]:
            if lesson in self._ready and lesson not in self.results:
                start = time.perf_counter()
                try:
                    while not self._ready[lesson].wait(0.25):
                        pass
                except BaseException:
                    self.stop()
                    raise
                if self.note is not None:   # the session's time spent on the lessons: what it waited for them
                    self.note("lesson executions", time.perf_counter() - start, None)
            if lesson not in self.results:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                start, cpu = time.perf_counter(), budget.cpu_seconds()
                self.results[lesson] = execute_job(lesson, self.out_dir, self.seed)
                if self.note is not None:
                    self.note("lesson executions", time.perf_counter() - start, f"lesson {lesson}")
                    with self.ledger.cpu_lock:
                        self.ledger.note_cpu("lesson executions", budget.cpu_seconds() - cpu)
            return self.results[lesson]

    # ------------------------------------------------------------------ background executions, side by side
    def prefetch(self, lessons) -> None:
        """Start executing ``lessons`` (those not done or started yet) in the background, ``workers`` at a time,
        longest first, then the rehearsals ("04@24g"), longest lesson first (a long job started last would
        leave the other worker idle); :meth:`run` then waits for each. Nothing happens with one worker."""
        if self.workers <= 1 or self._stop.is_set():
            return
        todo = sorted((l for l in dict.fromkeys(lessons) if l not in self._ready and l not in self.results),
                      key=lambda job: ("@" not in job, expected_seconds(job.split("@")[0])), reverse=True)
        for lesson in todo:
            self._ready[lesson] = threading.Event()
        if todo:
            threading.Thread(target=self._execute_side_by_side, args=(todo,), name="lesson-runs", daemon=True).start()

    def _execute_side_by_side(self, todo: list[str]) -> None:
        started: dict[str, tuple[float, Path]] = {}
        reason = "the session stopped before it finished"
        begin, cpu_total = time.perf_counter(), 0.0
        try:
            while (todo or self._procs) and not self._stop.is_set():
                while todo and len(self._procs) < self.workers:
                    with self._starting:
                        if self._stop.is_set():
                            break
                        lesson = todo.pop(0)
                        started[lesson] = (time.perf_counter(), self._start(lesson))
                for lesson, proc in list(self._procs.items()):
                    with self.ledger.cpu_lock:   # reaped and noted apart at once: no test's CPU time holds it meanwhile
                        cpu = reap(proc)
                        if cpu is not None and self.note is not None:
                            self.ledger.note_cpu("lesson executions", cpu)
                    if cpu is not None:
                        cpu_total += cpu
                        del self._procs[lesson]
                        start, result_file = started[lesson]
                        self._finish(lesson, proc.returncode, result_file, time.perf_counter() - start, cpu)
                        if self.note is not None and not todo and not self._procs:
                            self.ledger.detail("lesson executions", "all, in the background", time.perf_counter() - begin,
                                          cpu_total)
                        self._ready[lesson].set()
                time.sleep(0.2)
        except BaseException as e:  # noqa: BLE001 -- every test waiting for a lesson gets the reason
            reason = f"its background execution could not go on: {type(e).__name__}: {e}"
            raise
        finally:   # no test waits for ever: a lesson without a result gets the reason
            for lesson, ready in self._ready.items():
                if not ready.is_set() and (lesson in started or lesson in todo):
                    self.results.setdefault(lesson, {"status": "failed", "notebook": None, "lesson": lesson,
                                                     "error": {"ename": "not executed", "evalue": reason}})
                    ready.set()

    def _start(self, lesson: str) -> Path:
        """Start the background execution of ``lesson`` (its number, or a notebook's path); its result file."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        name = Path(lesson).stem
        result_file = self.out_dir / f"{name}.result.json"
        result_file.unlink(missing_ok=True)
        env = {**os.environ, **SIDE_BY_SIDE_ENV}
        with open(self.out_dir / f"{name}.worker.log", "w") as log:
            self._procs[lesson] = subprocess.Popen(
                [*JOB_COMMAND, lesson, str(self.out_dir), str(result_file), str(self.seed)],
                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return result_file

    def _finish(self, lesson: str, returncode: int, result_file: Path, seconds: float, cpu: float = 0.0) -> None:
        if result_file.is_file():
            result = json.loads(result_file.read_text())
        else:
            log = result_file.with_name(result_file.name.replace(".result.json", ".worker.log"))
            tail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
            result = {"status": "failed", "notebook": None, "lesson": lesson,
                      "error": {"ename": f"exit status {returncode}", "evalue": f"no result; its log ends:\n{tail}"}}
        self.results[lesson] = result
        if self.note is not None:
            what = f"rehearsal {lesson}" if "@" in lesson else f"lesson {lesson}"
            self.ledger.detail("lesson executions", f"{what} (side by side)", seconds, cpu)

    def stop(self) -> None:
        """Stop the background executions: SIGTERM (each kills its kernel), SIGKILL with their kernels after
        :data:`STOP_WITHIN_S`."""
        import psutil

        from utils.course.kernel import kill_tree

        with self._starting:
            self._stop.set()
            procs = list(self._procs.values())
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WITHIN_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    kill_tree([psutil.Process(proc.pid)])
                except psutil.Error:
                    pass

    def notebook(self, lesson: str) -> Path:
        """The executed copy of a lesson; fails the test (with the runner's message) when it failed."""
        from utils.course.summary import describe_error

        result = self.run(lesson)
        if result["status"] != "ok":
            pytest.fail(f"lesson {lesson} failed under papermill: {describe_error(result)}; executed copy: "
                        f"{result.get('notebook')}, log: {self.out_dir / 'run.log'}", pytrace=False)
        return Path(result["notebook"])

    def records(self, lesson: str) -> dict:
        return read_records(self.notebook(lesson))

    def output_of(self, lesson: str, cell_id: str) -> str:
        """The text a cell of the executed lesson printed (its stdout streams), to check prose printed from values."""
        cells = json.loads(self.notebook(lesson).read_text())["cells"]
        (cell,) = [c for c in cells if c.get("id") == cell_id]
        return "".join("".join(o["text"]) for o in cell.get("outputs", []) if o.get("output_type") == "stream")

    def headline(self, lesson: str) -> list[dict]:
        """The lesson's headline read from its records (``utils.headlines.rows``), after checking that it
        declared one with a ``tiny`` time target and that its run recorded every value and error it names, and,
        where it pairs its changes, every stage's per-problem scores, whose mean is the stage's value."""
        records = self.records(lesson)
        declaration = records.get(f"{lesson}/headline")
        assert declaration, f"lesson {lesson} declares no headline (utils.headline(...) after its records)"
        assert declaration["tiny_target_s"], f"lesson {lesson}'s headline sets no tiny_target_s"
        rows = headlines.rows(declaration, records)
        for row in rows:
            assert all(s["value"] is not None for s in row["stages"]), f"{row['name']}: a value was not recorded"
            assert "not recorded" not in row["noise"], f"{row['name']}: {row['noise']}"
            entry = next(e for e in headlines.check(declaration)["results"] if e["name"] == row["name"])
            for s in row["stages"]:
                if s["label"] in entry.get("per_problem", {}):
                    scores = s["per_problem"]
                    assert scores is not None, f"{row['name']}, {s['label']}: no per-problem scores fit the n"
                    # (to float32's precision: a lesson may average its scores with torch)
                    assert sum(scores) / len(scores) == pytest.approx(s["value"], abs=1e-6), \
                        f"{row['name']}, {s['label']}: the per-problem scores' mean is not the value"
        return rows


# ----------------------------------------------------------------------------- pytest hooks
def pytest_addoption(parser):
    group = parser.getgroup("lesson runs")
    group.addoption("--lesson-runs", default=None, metavar="DIR",
                    help="where the session executes the lessons (default: a temporary folder)")
    group.addoption("--lesson-workers", type=int, default=None, metavar="N",
                    help="lessons executed side by side (default: one per core, up to 4; 1: one after the other, "
                         "in this process)")
    group.addoption("--lesson-seed", type=int, default=0, metavar="N",
                    help="execute the lessons with SEED=N: the record tests then re-check each lesson's effects on "
                         "that seed (nbval compares the committed outputs, seed 0's, only when N is 0)")


def pytest_configure(config):
    config.addinivalue_line("markers", "lesson: executes a whole lesson (make test-fast leaves these out)")
    out = config.getoption("--lesson-runs")
    if out is None:
        config._lesson_tmp = tempfile.TemporaryDirectory(prefix="lesson-runs-")
        out = config._lesson_tmp.name
    workers = side_by_side(budget.usable_cores(), config.getoption("--lesson-workers"))
    config._lesson_runs = LessonRuns(Path(out), note=budget.note, workers=workers,
                                     seed=config.getoption("--lesson-seed"))


def pytest_unconfigure(config):
    runs = getattr(config, "_lesson_runs", None)
    if runs is not None:
        runs.stop()
    tmp = getattr(config, "_lesson_tmp", None)
    if tmp is not None:
        tmp.cleanup()




@pytest.fixture(scope="session")
def lesson_runs(pytestconfig) -> LessonRuns:
    """The lessons, each executed once per session: ``lesson_runs.records("04")``."""
    return pytestconfig._lesson_runs


def pytest_collect_file(file_path, parent):
    path = Path(file_path)
    if path.parent.resolve() == NOTEBOOKS_DIR.resolve() and path.match(LESSON_GLOB):
        return ReplayedNotebook.from_parent(parent, path=path)
    return None


def lesson_of(item) -> str | None:
    """The lesson ("04") whose execution a test item reads: nbval's cells of notebooks/NN_*.ipynb and the record
    tests of tests/lessons/test_lessonNN.py; the rehearsal ("04@24g") a test of tests/lessons/test_rehearsal.py reads; None for any
    other test."""
    if isinstance(item, ReplayedCell):
        return lesson_number(item.path)
    if item.path.name == "test_rehearsal.py":   # the rehearsals: one job "04@24g" per test
        return getattr(item, "callspec", None) and item.callspec.params.get("job")
    match = re.fullmatch(r"test_lesson(\d\d)\.py", item.path.name)
    return match.group(1) if match else None


@pytest.hookimpl(tryfirst=True)   # before -m selects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        if lesson_of(item) is not None:
            item.add_marker(pytest.mark.lesson)
    # The tests that read the lessons' executions go last: the lessons then run side by side with nothing else.
    items[:] = [i for i in items if lesson_of(i) is None] + [i for i in items if lesson_of(i) is not None]


def pytest_collection_finish(session):
    """The lessons the selected tests read start in the background now, beside the session's other tests (which
    leave most of the CPU idle: 316 s of CPU time in 430 s on 2 cores)."""
    lessons = [l for l in map(lesson_of, session.items) if l]
    if hasattr(session.config, "workerinput"):   # a pytest-xdist worker: each would execute every lesson it saw
        session.config._lesson_runs.refused = ("the lessons execute once per session, in the background of one pytest "
                                               "process: run the tests that read them without -n (make test)")
    elif not session.config.option.collectonly:
        session.config._lesson_runs.prefetch(lessons)


# ----------------------------------------------------------------------------- nbval on the session's run
class ReplayedNotebook(IPyNbFile):
    """nbval's collector for a committed lesson, with no kernel of its own: its cells are compared with
    the session's execution of the lesson (``lesson_runs``)."""

    def setup(self):
        if not self.parent.config.option.nbval_sanitize_with:
            self.parent.config.option.nbval_sanitize_with = str(SANITIZE)
        self.setup_sanitize_files()
        executed = nbformat.read(self.config._lesson_runs.notebook(lesson_number(self.path)), as_version=4)
        self.executed = {c.get("id"): c for c in executed.cells}

    def teardown(self):
        pass

    def collect(self):
        self.compare_outputs = False   # nbval's lax mode: only cells marked NBVAL_CHECK_OUTPUT are compared
        self.nb = nbformat.read(str(self.path), as_version=4)
        for cell_num, cell in enumerate(c for c in self.nb.cells if c.cell_type == "code"):
            options = defaultdict(bool, find_metadata_tags(cell.metadata))
            options.update(dict(find_comment_markers(cell.source)))
            options.setdefault("check", self.compare_outputs)
            yield ReplayedCell.from_parent(self, name=f"Cell {cell_num}", cell_num=cell_num, cell=cell, options=options)


class ReplayedCell(IPyNbCell):
    """One code cell: the executed copy's outputs, checked as nbval checks a kernel's."""

    def runtest(self):
        if self.options["skip"]:
            pytest.skip()
        executed = self.parent.executed.get(self.cell.get("id"))
        if executed is None:
            self.raise_cell_error(f"cell id {self.cell.get('id')!r} is not in the executed copy (ids must be stable)")
        outs = coalesce_streams(copy.deepcopy(executed.get("outputs", [])))
        errors = [o for o in outs if o.get("output_type") == "error"]
        if errors and not self.options["check_exception"]:
            self.raise_cell_error("Cell execution caused an exception", "\n" + "\n".join(errors[0].get("traceback", [])))
        if self.cell.execution_count is None and self.cell.outputs:
            self.raise_cell_error("Unrun reference cell has outputs")
        if self.options["check"] and self.config._lesson_runs.seed != 0:
            pytest.skip("the committed outputs are seed 0's (--lesson-seed)")
        if self.options["check"] and self.cell.execution_count is not None:
            if not self.compare_outputs(outs, coalesce_streams(copy.deepcopy(self.cell.outputs))):
                self.raise_cell_error("Cell outputs differ", "\n".join(self.comparison_traceback))


# ----------------------------------------------------------------------------- a background execution
def execute_job(job: str, folder: Path, seed: int = 0) -> dict:
    """Execute ``job`` and return the runner's result dict: ``"04"`` is lesson 04 on tiny with ``SEED=seed``, into
    ``folder``; ``"04@24g"`` is its rehearsal on GPU preset 24g's code path (``utils.course.rehearsal``), into
    ``folder/rehearsal-24g``."""
    from utils.course import rehearsal
    from utils.course.lessons import find_lessons
    from utils.course.run import execute_lesson

    lesson, _, preset = job.partition("@")
    (notebook,) = find_lessons([lesson])
    if not preset:
        return execute_lesson(notebook, Path(folder), "tiny", seed=seed)
    (result,) = rehearsal.rehearse(preset, [notebook], Path(folder) / f"rehearsal-{preset}")
    return result


def main(argv: list[str]) -> int:
    """``python -m tests.lesson_runs JOB FOLDER RESULT_JSON [SEED]``: execute one job (:func:`execute_job`) into
    FOLDER and write the runner's result dict to RESULT_JSON (what :meth:`LessonRuns.prefetch` starts). 130 when
    interrupted."""
    from utils.course.kernel import sigterm_as_interrupt

    job, folder, result_file, *seed = argv
    try:
        with sigterm_as_interrupt():
            result = execute_job(job, Path(folder), int(seed[0]) if seed else 0)
    except KeyboardInterrupt:
        return 130
    partial = Path(result_file).with_suffix(".partial")
    partial.write_text(json.dumps(result, default=str))
    partial.replace(result_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
