"""pytest plugin: every lesson executed once per test session, feeding both its record tests and nbval.

``pytest.ini`` loads it (``-p tests.lesson_runs``). A lesson runs, on ``tiny`` under papermill, the first
time a test asks for it (the ``lesson_runs`` fixture), into one folder per session (``--lesson-runs DIR``
keeps it; by default a temporary folder). The executed copy then serves

* the record tests (``tests/test_lessonNN.py``: ``lesson_runs.records("04")``), and
* nbval: ``notebooks/NN_*.ipynb`` are collected as nbval's own items, one per code cell, whose outputs are
  compared, by nbval's ``compare_outputs`` with ``tests/nbval_sanitize.cfg``, with the same cell of that
  one execution instead of a second one. As with ``--nbval-lax``, only cells marked
  ``# NBVAL_CHECK_OUTPUT`` are compared; a cell whose execution raised fails.

Both are marked ``lesson`` (``make test-fast`` deselects them).
"""
from __future__ import annotations

import copy
import json
import re
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
from utils.constants import LESSON_GLOB, NOTEBOOKS_DIR
from utils.course.lessons import lesson_number
from utils.records import read_records

SANITIZE = Path(__file__).with_name("nbval_sanitize.cfg")


class LessonRuns:
    """The session's executions of the lessons, each made once, on first request."""

    def __init__(self, out_dir: Path, note=None):
        """``note(part, seconds, what)`` is told each execution's time (the session's: :func:`tests.budget.note`)."""
        self.out_dir = Path(out_dir)
        self.note = note
        self.results: dict[str, dict] = {}
        self._locks = defaultdict(threading.Lock)

    def run(self, lesson: str) -> dict:
        """The runner's result dict of lesson ``lesson`` ("04"), executing it when not done yet."""
        from utils.course.lessons import find_lessons
        from utils.course.run import execute_lesson

        with self._locks[lesson]:
            if lesson not in self.results:
                (notebook,) = find_lessons([lesson])
                self.out_dir.mkdir(parents=True, exist_ok=True)
                start = time.perf_counter()
                self.results[lesson] = execute_lesson(notebook, self.out_dir, "tiny")
                if self.note is not None:
                    self.note("lesson executions", time.perf_counter() - start, f"lesson {lesson}")
            return self.results[lesson]

    def notebook(self, lesson: str) -> Path:
        """The executed copy of a lesson; fails the test (with the runner's message) when it failed."""
        from utils.course.summary import describe_error

        result = self.run(lesson)
        if result["status"] != "ok":
            pytest.fail(f"lesson {lesson} failed under papermill: {describe_error(result)}; executed copy: "
                        f"{result['notebook']}, log: {self.out_dir / 'run.log'}", pytrace=False)
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
        declared one with a ``tiny`` time target and that its run recorded every value and error it names."""
        records = self.records(lesson)
        declaration = records.get(f"{lesson}/headline")
        assert declaration, f"lesson {lesson} declares no headline (utils.headline(...) after its records)"
        assert declaration["tiny_target_s"], f"lesson {lesson}'s headline sets no tiny_target_s"
        rows = headlines.rows(declaration, records)
        for row in rows:
            assert all(s["value"] is not None for s in row["stages"]), f"{row['name']}: a value was not recorded"
            assert "not recorded" not in row["noise"], f"{row['name']}: {row['noise']}"
        return rows


# ----------------------------------------------------------------------------- pytest hooks
def pytest_addoption(parser):
    group = parser.getgroup("lesson runs")
    group.addoption("--lesson-runs", default=None, metavar="DIR",
                    help="where the session executes the lessons (default: a temporary folder)")


def pytest_configure(config):
    config.addinivalue_line("markers", "lesson: executes a whole lesson (make test-fast leaves these out)")
    out = config.getoption("--lesson-runs")
    if out is None:
        config._lesson_tmp = tempfile.TemporaryDirectory(prefix="lesson-runs-")
        out = config._lesson_tmp.name
    config._lesson_runs = LessonRuns(Path(out), note=budget.note)


def pytest_unconfigure(config):
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


@pytest.hookimpl(tryfirst=True)   # before -m selects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        if isinstance(item, ReplayedCell) or re.fullmatch(r"test_lesson\d\d\.py", item.path.name):
            item.add_marker(pytest.mark.lesson)


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
        if self.options["check"] and self.cell.execution_count is not None:
            if not self.compare_outputs(outs, coalesce_streams(copy.deepcopy(self.cell.outputs))):
                self.raise_cell_error("Cell outputs differ", "\n".join(self.comparison_traceback))
