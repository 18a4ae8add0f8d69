"""The course's tooling (utils/course/, tests/budget.py, tests/lesson_runs.py): labs, handouts, grading, sandbox, runner, layout and docs."""
