"""tests/lesson_runs.py, the plugin behind `make test`: one execution per lesson, and nbval's comparison of
the committed outputs with that execution (fast: no real lesson is executed here)."""
import threading

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tests import lesson_runs
from utils.constants import REPO_ROOT
from utils.course import lessons as course_lessons
from utils.course import run as course_run
from utils.records import read_records

pytest_plugins = ["pytester"]


def test_each_lesson_executes_once_however_often_and_concurrently_it_is_asked_for(monkeypatch, tmp_path):
    calls = []

    def execute(notebook, out_dir, preset, seed):
        calls.append((notebook, seed))
        return {"status": "ok", "notebook": str(notebook)}

    monkeypatch.setattr(course_lessons, "find_lessons", lambda names: [tmp_path / f"{names[0]}_x.ipynb"])
    monkeypatch.setattr(course_run, "execute_lesson", execute)
    runs = lesson_runs.LessonRuns(tmp_path / "runs", seed=2)
    threads = [threading.Thread(target=runs.run, args=("04",)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs.run("04")
    runs.run("06")
    assert [(p.name, seed) for p, seed in calls] == [("04_x.ipynb", 2), ("06_x.ipynb", 2)]


@pytest.mark.parametrize("cores, workers, expected", [(2, None, 2), (1, None, 1), (16, None, 4), (2, 1, 1), (8, 3, 3)])
def test_lessons_side_by_side_one_per_core(cores, workers, expected):
    assert lesson_runs.side_by_side(cores, workers) == expected


def _fake_lesson(path, seconds: float):
    """A lesson that records its SEED and how its kernel's CPU threads were set up, then sleeps ``seconds``."""
    source = ("import os, time\nfrom utils.records import record, show_records\nrecord('x/seed', SEED)\n"
              "record('x/threads', os.environ.get('OMP_NUM_THREADS'))\n"
              "record('x/wait_policy', os.environ.get('OMP_WAIT_POLICY'))\n"
              f"time.sleep({seconds})\nrecord('x/slept', {seconds})\nshow_records()")
    parameters = new_code_cell("SEED = 0", metadata={"tags": ["parameters"]})
    nb = new_notebook(cells=[parameters, new_code_cell(f"import sys\nsys.path.insert(0, {str(REPO_ROOT)!r})"),
                             new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return str(path)


def test_a_jobs_process_starts_without_the_iri_parsers_and_nbformat_still_validates():
    """A job's process runs main() after WITHOUT_IRI_PARSERS (1.3 s of CPU time per job); in such a process nbformat
    still validates, and still rejects, notebooks, and rfc3987_syntax is never imported."""
    import subprocess
    import sys

    exe, flag, code = lesson_runs.JOB_COMMAND
    assert (exe, flag) == (sys.executable, "-c")
    assert code == lesson_runs.WITHOUT_IRI_PARSERS + "from tests.lesson_runs import main; sys.exit(main(sys.argv[1:]))"
    probe = lesson_runs.WITHOUT_IRI_PARSERS + """
import nbformat
from nbformat.v4 import new_notebook
nbformat.validate(new_notebook())
bad = new_notebook(); bad.cells.append({"cell_type": "code"})
try:
    nbformat.validate(bad); print("accepted")
except nbformat.ValidationError:
    print("rejected")
print(sys.modules.get("rfc3987_syntax"))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["rejected", "None"], out


def test_prefetched_lessons_run_side_by_side_in_processes_of_their_own(tmp_path, monkeypatch):
    """Two lessons of 1.5 s each, two at a time: both results in, on a tiny run's two threads waiting passively, the
    two sleeps overlapping, each with the session's seed; each execution's time shown apart and the session's wait
    counted once. The runs note into a ledger of their own: the session's lessons, executing in the background
    meanwhile, note into tests.budget's (one of them reaped during this test once made a third line here)."""
    import threading
    import time
    import types

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    ledger = types.SimpleNamespace(cpu_lock=threading.Lock(), waited=[], cpu=[], details=[])
    ledger.note_cpu = lambda part, cpu: ledger.cpu.append((part, cpu))
    ledger.detail = lambda part, what, seconds, cpu=None: ledger.details.append((part, what, seconds, cpu))
    note = lambda part, seconds, what: ledger.waited.append((part, seconds, what))   # noqa: E731
    (tmp_path / "nb").mkdir()
    lessons = [_fake_lesson(tmp_path / "nb" / f"0{i}_fake.ipynb", 1.5) for i in (1, 2)]
    runs = lesson_runs.LessonRuns(tmp_path / "runs", note=note, workers=2, seed=1, ledger=ledger)
    start = time.perf_counter()
    runs.prefetch(lessons)
    results = [runs.run(lesson) for lesson in lessons]
    took = time.perf_counter() - start
    for result in results:
        assert result["status"] == "ok", result
        assert read_records(result["notebook"]) == {"x/seed": 1, "x/threads": "2", "x/wait_policy": "PASSIVE",
                                                    "x/slept": 1.5}
    assert {part for part, *_ in ledger.details + ledger.cpu + ledger.waited} == {"lesson executions"}
    *jobs, (_, what, span, cpu_total) = ledger.details
    walls, cpus = [s for _, _, s, _ in jobs], [c for _, _, _, c in jobs]
    assert len(walls) == 2 and took < sum(walls), (took, walls)     # side by side, not one after the other
    assert what == "all, in the background" and max(walls) <= span <= took
    assert sum(s for _, s, _ in ledger.waited) == pytest.approx(took, abs=1.0)   # the session's wait, counted once
    # each worker's CPU time, its kernel's included (starting Python, papermill and a kernel), not its sleep
    assert all(0.5 < c < w for c, w in zip(cpus, walls)), (cpus, walls)
    assert cpu_total == pytest.approx(sum(cpus)) == pytest.approx(sum(c for _, c in ledger.cpu))


def test_reap_gives_a_finished_childs_cpu_time_with_its_childrens():
    import subprocess
    import sys
    import time

    burn = "import time; t = time.process_time(); exec('while time.process_time() - t < 0.4: pass')"
    proc = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', "
                             f"{burn!r}]); {burn}"])
    while (cpu := lesson_runs.reap(proc)) is None:
        time.sleep(0.01)
    assert proc.returncode == 0 and 0.8 <= cpu < 5.0, cpu
    assert lesson_runs.reap(proc) == 0.0, "reaped once"


def test_lessons_start_longest_first_then_the_rehearsals_longest_lesson_first(tmp_path, monkeypatch):
    seconds = {"01": 120, "04": 170, "07": 200, "08": 70}
    monkeypatch.setattr(lesson_runs, "expected_seconds", lambda lesson: seconds[lesson])
    started, done = [], threading.Event()
    monkeypatch.setattr(lesson_runs.LessonRuns, "_execute_side_by_side",
                        lambda self, todo: (started.extend(todo), done.set()))
    runs = lesson_runs.LessonRuns(tmp_path / "runs", workers=2)
    runs.prefetch(["08@24g", "01", "07@t4-16g", "04", "08", "01@24g", "07"])
    assert done.wait(60), "the pool never started"      # it starts in a thread of its own
    assert started == ["07", "04", "01", "08", "07@t4-16g", "01@24g", "08@24g"]


def test_a_lesson_whose_worker_dies_fails_its_tests_with_the_workers_log(tmp_path):
    runs = lesson_runs.LessonRuns(tmp_path / "runs", workers=2)
    runs.prefetch([str(tmp_path / "missing.ipynb")])
    with pytest.raises(pytest.fail.Exception, match=r"(?s)exit status 1: no result.*missing.ipynb' matches no lesson"):
        runs.notebook(str(tmp_path / "missing.ipynb"))


def test_the_tests_that_read_the_lessons_run_last(pytester):
    pytester.makepyfile(test_lesson01="def test_a():\n    pass\n", test_zz="def test_b():\n    pass\n")
    result = pytester.runpytest_inprocess("--co", "-q", "-p", "tests.lesson_runs", "-p", "no:cacheprovider")
    ids = [line for line in result.stdout.lines if "::" in line]
    assert ids == ["test_zz.py::test_b", "test_lesson01.py::test_a"]


# Under `pytest -n 2` every worker would execute every lesson it saw: their tests fail saying why, others pass.
# Tested with the budget's table under xdist, in one start of workers: tests/course/test_budget.py.


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
    result = pytester.runpytest_inprocess(str(committed), "-p", "tests.lesson_runs", "-p", "no:cacheprovider",
                                          "--lesson-workers", "1")   # nothing executed in the background
    if passes:
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, failed=1)
        assert "Cell outputs differ" in result.stdout.str()
