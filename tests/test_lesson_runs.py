"""tests/lesson_runs.py, the plugin behind `make test`: one execution per lesson, and nbval's comparison of
the committed outputs with that execution (fast: no lesson is executed here)."""
import threading

import nbformat
import pytest

from tests import lesson_runs
from utils.course import lessons as course_lessons
from utils.course import run as course_run

pytest_plugins = ["pytester"]


def test_each_lesson_executes_once_however_often_and_concurrently_it_is_asked_for(monkeypatch, tmp_path):
    calls = []

    def execute(notebook, out_dir, preset):
        calls.append(notebook)
        return {"status": "ok", "notebook": str(notebook)}

    monkeypatch.setattr(course_lessons, "find_lessons", lambda names: [tmp_path / f"{names[0]}_x.ipynb"])
    monkeypatch.setattr(course_run, "execute_lesson", execute)
    runs = lesson_runs.LessonRuns(tmp_path / "runs")
    threads = [threading.Thread(target=runs.run, args=("04",)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs.run("04")
    runs.run("06")
    assert [p.name for p in calls] == ["04_x.ipynb", "06_x.ipynb"]


def _notebook(path, checked_output: str, unchecked_output: str):
    def cell(cell_id, source, text):
        c = nbformat.v4.new_code_cell(source, id=cell_id, execution_count=1)
        c.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        return c
    nb = nbformat.v4.new_notebook(cells=[cell("checked", "# NBVAL_CHECK_OUTPUT\nprint(1)", checked_output),
                                         cell("free", "print(2)", unchecked_output)])
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("executed_checked, passes", [("1\n", True), ("3\n", False)])
def test_replay_compares_only_checked_cells_with_the_session_run(pytester, monkeypatch, executed_checked, passes):
    notebooks = pytester.path / "notebooks"
    notebooks.mkdir()
    committed = _notebook(notebooks / "01_x.ipynb", "1\n", "2\n")
    executed = _notebook(pytester.path / "executed.ipynb", executed_checked, "a different number\n")
    monkeypatch.setattr(lesson_runs, "NOTEBOOKS_DIR", notebooks)
    monkeypatch.setattr(lesson_runs.LessonRuns, "notebook", lambda self, lesson: executed)
    result = pytester.runpytest_inprocess(str(committed), "-p", "tests.lesson_runs", "-p", "no:cacheprovider")
    if passes:
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, failed=1)
        assert "Cell outputs differ" in result.stdout.str()
