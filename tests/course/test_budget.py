"""tests/budget.py, the plugin that prints where `make test` spent its time, part by part, against budgets."""
import pytest

from tests import budget

pytest_plugins = ["pytester"]


def test_each_test_goes_to_one_part_by_its_markers_and_file():
    assert budget.part_of("tests/lessons/test_lesson04.py", {"lesson": 1}) == "lesson record tests and nbval"
    assert budget.part_of("notebooks/04_grpo.ipynb", {"lesson": 1}) == "lesson record tests and nbval"
    assert budget.part_of("tests/course/test_labs.py", {"slow": 1}) == "labs validated (labs, handout)"
    assert budget.part_of("tests/course/test_redteam.py", {"slow": 1}) == "classes graded (grader, red team)"
    assert budget.part_of("tests/side/test_verl_tools.py", {"slow": 1}) == "nbgrader and verl (side venvs)"
    assert budget.part_of("tests/course/test_labs.py", {}) == budget.UNIT, "a test that is not slow is a unit test"
    assert budget.part_of("tests/library/test_sft.py", {"slow": 1}) == "other slow tests", "make test-fast leaves it out"
    assert budget.part_of("tests/course/test_twins.py", {"slow": 1}) == "twins and Ctrl-C, end to end"
    assert set(budget.PARTS) >= {budget.UNIT, *budget.MOVED_FROM, *budget.MOVED_FROM.values()}


def test_the_parts_budgets_add_up_to_the_suites():
    # a fresh clone's `.ci/run` in 25 minutes: its install, then the parts (the venv installs only on a cold cache)
    assert sum(b for part, (b, _) in budget.PARTS.items() if part != "side venv installs") == budget.SUITE_BUDGET_S
    assert budget.FAST_UNIT_BUDGET_S <= budget.FAST_BUDGET_S


def test_work_noted_apart_leaves_the_part_that_started_it():
    b = budget.Breakdown()
    b.add("tests/lessons/test_lesson01.py", {"lesson": 1}, 130.0)   # the first test of lesson 01 executed it
    b.add("notebooks/01_sft.ipynb", {"lesson": 1}, 2.0)
    b.add("tests/side/test_nbgrader.py", {"slow": 1}, 70.0)
    b.add("tests/library/test_sft.py", {}, 9.0)
    parts = b.parts({"lesson executions": 125.0, "side venv installs": 40.0})
    assert parts == {"lesson executions": 125.0, "lesson record tests and nbval": 7.0,
                     "nbgrader and verl (side venvs)": 30.0, "side venv installs": 40.0, budget.UNIT: 9.0}
    lines, over = b.report({"lesson executions": 125.0, "side venv installs": 40.0},
                           {"lesson executions": [("lesson 01", 125.0)]})
    assert any("lesson 01" in line for line in lines) and not over
    b.add_cpu("tests/library/test_sft.py", {}, 8.5)
    lines, over = b.report({"lesson executions": 125.0}, {"lesson executions": [("lesson 01", 125.0, 190.0)]},
                           {"lesson executions": 190.0})
    (row,) = [line.split() for line in lines if line.startswith("unit tests")]
    assert row[-1] == "8", "the CPU column: the part's own"
    (row,) = [line.split() for line in lines if line.startswith("lesson executions")]
    assert row[-1] == "190", "and the work noted apart"
    assert [line.split()[-1] for line in lines if "lesson 01" in line] == ["190"]
    assert any("cores busy on average" in line for line in lines[-2:])
    lines, over = b.report({"lesson executions": 5000.0, "side venv installs": 40.0})
    assert over == [f"lesson executions (5000 s of {budget.PARTS['lesson executions'][0]} s)"]
    assert any(line.startswith("lesson executions") and line.endswith("OVER") for line in lines)


@pytest.mark.parametrize("strict", [False, True])
def test_the_session_prints_its_parts_and_fails_over_budget_only_when_strict(pytester, monkeypatch, strict):
    monkeypatch.setattr(budget, "FAST_UNIT_BUDGET_S", 0)           # any unit test alone is over a budget of 0 s
    pytester.makepyfile(test_x="def test_one():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "tests.budget", "-p", "no:cacheprovider",
                                          *(["--budget-strict"] if strict else []))
    result.stdout.fnmatch_lines(["*where the time went (tests/budget.py)*", "unit tests (make test-fast)*OVER",
                                 "over budget: unit tests (make test-fast)*"])
    assert result.ret == (1 if strict else 0)


def test_under_xdist_the_workers_tests_and_their_cpu_time_reach_the_table(pytester, monkeypatch):
    """`make test-fast` runs on pytest-xdist's workers: their tests land in their parts, with their CPU time. The
    same session (one start of workers for both plugins, as `make test-fast` loads them) checks that a worker
    refuses the lessons, which one process executes (tests/lesson_runs.py): its test fails saying why."""
    from utils.constants import REPO_ROOT

    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    pytester.makepyfile(test_x="import pytest, time\n"
                               "def test_burn():\n    t = time.process_time()\n"
                               "    while time.process_time() - t < 1.0: pass\n"
                               "@pytest.mark.slow\ndef test_slow():\n    pass\n",
                        test_lesson01="def test_a(lesson_runs):\n    lesson_runs.records('01')\n")
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    result = pytester.runpytest_subprocess("-p", "tests.budget", "-p", "tests.lesson_runs", "-p", "no:cacheprovider",
                                           "-n", "2", "-rf")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*_ test_a _*", "the lessons execute once per session*without -n*"])
    (unit,) = [line.split() for line in result.stdout.lines if line.startswith("unit tests")]
    assert 1 <= float(unit[-1]) < 6, unit                       # the CPU column: the burn's second
    assert any(line.startswith("other slow tests") for line in result.stdout.lines), "the marker read from the report"
