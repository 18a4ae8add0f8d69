"""The judge (utils/course/judge.py) on the smallest grading notebooks that show each of its rules; the red team
(tests/test_redteam.py) runs the same cheats against a real lab in the sandbox."""
import runpy

import nbformat
import pytest

from utils.course import grading

judge = runpy.run_path(str(grading.JUDGE_PATH), run_name="__judge_test__")

SETUP = "import math\nimport torch\n"
CHECK = '''assert f(2) == 4, f"f(2) should be 4, got {f(2)}"
### BEGIN HIDDEN TESTS
secret = 12345
assert f(-3) == 9, f"hidden test: f of a negative number ({secret}), got {f(-3)}"
### END HIDDEN TESTS
print("ok")
'''


def grading_nb(*answers_and_checks):
    """A grading notebook: a setup cell, then (answer source, check source) pairs, each check worth 1 point."""
    def cell(source, role, gid):
        c = nbformat.v4.new_code_cell(source)
        c.metadata["grading"] = {"role": role, "grade_id": gid}
        if role == "check":
            c.metadata["nbgrader"] = {"grade": True, "solution": False, "points": 1, "grade_id": gid}
        return c
    cells = [cell(SETUP, "setup", None)]
    for i, (answer, check) in enumerate(answers_and_checks):
        cells += [cell(answer, "answer", f"c{i}-answer"), cell(check, "check", f"c{i}")]
    return nbformat.v4.new_notebook(cells=cells)


def test_an_answer_runs_as_its_definitions():
    code, skipped = judge["_definitions"](
        'import os\nX = 3\nprint("hi")\ndef f(x):\n    return x\nos.environ["A"] = "1"\nclass C:\n    pass\n"""doc"""\n',
        "<answer t>")
    assert skipped == [3, 6], "the print and the item assignment are not run"
    names = {}
    exec(code, names)
    assert {"os", "X", "f", "C"} <= set(names) and "A" not in names["os"].environ


def test_a_hidden_failure_says_only_the_constant_text_of_its_message():
    source = 'x = 1\nassert x == 2, f"hidden test: expected {x + 1}, got {x}"\nraise AssertionError("plain " "words")\n'
    assert judge["_hidden_message"](source, 2, "AssertionError", own=True) == "hidden test: expected …, got …"
    assert judge["_hidden_message"](source, 3, "AssertionError", own=True) == "plain words"
    assert judge["_hidden_message"](source, 2, "ValueError", own=False) == \
        "a hidden test failed (ValueError raised inside your code)"


def test_checks_pass_fail_and_keep_their_hidden_tests_to_themselves(tmp_path):
    gnb = grading_nb(("def f(x):\n    return x * x\nprint('top-level: not run')\n", CHECK),
                     ("def f(x):\n    return abs(x) * 2\n", CHECK),      # visible right, hidden wrong
                     ("def f(x):\n    return x + 1\n", CHECK),           # visible wrong
                     ("def g():\n    return 1\n", 'assert "secret" not in globals(), "a hidden test\'s name"\n'))
    run = grading.execute(gnb, tmp_path / "run", timeout=120, cell_timeout=30)
    assert run["status"] == "ok", run
    assert run["checks"]["c0"]["passed"] and run["skipped"] == [{"grade_id": "c0-answer", "lines": [3]}]
    assert run["checks"]["c1"]["message"] == "hidden test: f of a negative number (…), got …", "nothing computed"
    assert run["checks"]["c2"]["message"] == "f(2) should be 4, got 3", "the visible part says what it computed"
    assert run["checks"]["c3"]["passed"], run["checks"]["c3"]


@pytest.mark.parametrize("answer,why", [
    ("import torch\ndef f(x):\n    real = torch.allclose\n    def once(*a, **k):\n        torch.allclose = real\n"
     "        return True\n    torch.allclose = once\n    return 0\n", "changed torch.allclose"),
    ("import builtins\nbuiltins.abs = lambda x: 0\n_ = setattr(builtins, 'abs', lambda x: 0)\ndef f(x):\n    return 0\n",
     "changed builtins.abs"),
])
def test_an_answer_that_changes_what_the_checks_use_earns_nothing(tmp_path, answer, why):
    check = "assert torch.allclose(torch.tensor(float(f(2))), torch.tensor(4.0)) and abs(f(2) - 4) < 1e-6\n"
    run = grading.execute(grading_nb((answer, check)), tmp_path / "run", timeout=120, cell_timeout=30)
    assert run["status"] == "touched" and why in run["detail"], run
    assert run["checks"]["c0"]["points"] == 0
