"""The judge (utils/course/judge.py) on the smallest grading notebooks that show each of its rules; the red team
(tests/course/test_redteam.py) runs the same cheats against a real lab in the sandbox."""
import runpy

import nbformat
import pytest

from utils.constants import CHECK_MESSAGE_CHARS
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


def grading_nb(*answers_and_checks, exports=("f", "g"), setup=SETUP):
    """(grading notebook, lab): a setup cell, then (answer source, check source) pairs, each check worth 1 point;
    the lab's stub of each answer defines ``exports``."""
    def cell(source, role, gid):
        c = nbformat.v4.new_code_cell(source)
        c.metadata["grading"] = {"role": role, "grade_id": gid}
        if role == "check":
            c.metadata["nbgrader"] = {"grade": True, "solution": False, "points": 1, "grade_id": gid}
        return c
    cells, lab = [cell(setup, "setup", None)], nbformat.v4.new_notebook()
    for i, (answer, check) in enumerate(answers_and_checks):
        cells += [cell(answer, "answer", f"c{i}-answer"), cell(check, "check", f"c{i}")]
        stub = nbformat.v4.new_code_cell("".join(f"def {n}(*a):\n    raise NotImplementedError\n" for n in exports))
        stub.metadata["nbgrader"] = {"grade": False, "solution": True, "grade_id": f"c{i}-answer"}
        lab.cells.append(stub)
    return nbformat.v4.new_notebook(cells=cells), lab


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
    assert judge["_hidden_message"](source, 2, own=True) == "hidden test: expected …, got …"
    assert judge["_hidden_message"](source, 3, own=True) == "plain words"
    assert judge["_hidden_message"](source, 2, own=False) == "a hidden test failed inside your code"


def test_checks_pass_fail_and_keep_their_hidden_tests_to_themselves(tmp_path):
    gnb, lab = grading_nb(("def f(x):\n    return x * x\nprint('top-level: not run')\n", CHECK),
                     ("def f(x):\n    return abs(x) * 2\n", CHECK),      # visible right, hidden wrong
                     ("def f(x):\n    return x + 1\n", CHECK),           # visible wrong
                     ("def g():\n    return 1\n", 'assert "secret" not in globals(), "a hidden test\'s name"\n'),
                     ("def g():\n    return 2\n", 'assert g() == 1, "why " * 200 + f"got {g()}"\n'),
                     ("def g():\n    return 3\n", 'assert g() == 1, "a line\\n" * 500\n'))
    run = grading.execute(gnb, lab, tmp_path / "run", timeout=120, cell_timeout=30)
    assert run["status"] == "ok", run
    assert run["checks"]["c0"]["passed"] and run["skipped"] == [{"grade_id": "c0-answer", "lines": [3]}]
    assert run["checks"]["c1"]["message"] == "hidden test: f of a negative number (…), got …", "nothing computed"
    assert run["checks"]["c2"]["message"] == "f(2) should be 4, got 3", "the visible part says what it computed"
    assert run["checks"]["c3"]["passed"], run["checks"]["c3"]
    assert run["checks"]["c4"]["message"] == "why " * 200 + "got 2", "a long message is kept whole"
    cut = run["checks"]["c5"]["message"]
    assert len(cut) == CHECK_MESSAGE_CHARS and cut.startswith("a line a line ") and cut.endswith("…"), cut[-20:]


@pytest.mark.parametrize("answer,why", [
    ("import torch\ndef f(x):\n    real = torch.allclose\n    def once(*a, **k):\n        torch.allclose = real\n"
     "        return True\n    torch.allclose = once\n    return 0\n", "changed torch.allclose"),
    ("import builtins\nbuiltins.abs = lambda x: 0\n_ = setattr(builtins, 'abs', lambda x: 0)\ndef f(x):\n    return 0\n",
     "changed builtins.abs"),
    ("import torch\nns = {}\n_ = exec(compile('def fake(*a, **k):\\n    return True\\n', torch.__file__, 'exec'), ns)\n"
     "def f(x):\n    torch.allclose = ns['fake']\n    return 0\n", "changed torch.allclose"),   # a library's file name
])
def test_an_answer_that_changes_what_the_checks_use_earns_nothing(tmp_path, answer, why):
    check = "assert torch.allclose(torch.tensor(float(f(2))), torch.tensor(4.0)) and abs(f(2) - 4) < 1e-6\n"
    run = grading.execute(*grading_nb((answer, check)), tmp_path / "run", timeout=120, cell_timeout=30)
    assert run["status"] == "touched" and why in run["detail"], run
    assert run["checks"]["c0"]["points"] == 0


def test_what_an_answer_keeps_from_the_hidden_tests_never_reaches_the_feedback(tmp_path):
    # The hidden part runs in a forked child: the arguments an answer stored there are gone, and a failure
    # there names only a builtin exception class (an answer's own class may be named after what it saw).
    stored = "_seen = []\ndef f(x):\n    _seen.append(x)\n    return x * x\n"
    named = "def f(x):\n    if x < 0:\n        raise type(f'LEAK_{x}', (Exception,), {})()\n    return x * x\n"
    tell = ("def g():\n    raise ValueError(f'seen {_seen}')\n", "assert g() == 1\n")
    run = grading.execute(*grading_nb((stored, CHECK), tell), tmp_path / "a", timeout=120, cell_timeout=30)
    assert run["checks"]["c0"]["passed"] and run["checks"]["c1"]["message"] == "ValueError: seen [2]", run["checks"]
    run = grading.execute(*grading_nb((named, CHECK)), tmp_path / "b", timeout=120, cell_timeout=30)
    assert run["checks"]["c0"]["message"] == "Exception: a hidden test failed inside your code", run["checks"]


def test_a_cell_magic_a_tuple_and_an_if_block_are_definitions_too(tmp_path):
    answer = "%%time\nimport math\nPAD, SCALE = 0, 2\nif SCALE:\n    BASE = 0\ndef f(x):\n    return x * SCALE + BASE\n%time f(1)\n"
    run = grading.execute(*grading_nb((answer, "assert f(2) == 4\n")), tmp_path / "run", timeout=120, cell_timeout=30)
    assert run["checks"]["c0"]["passed"], run
    assert run["skipped"] == [{"grade_id": "c0-answer", "lines": [7]}], "the line magic is a call: not run"


def test_the_answers_cannot_reach_the_setup_and_a_blocked_shortcut_reaches_them(tmp_path):
    setup = SETUP + "def helper():\n    return 2\ndef expected(x):\n    return x * helper()\n" \
                    "def shortcut(x):\n    return x * x\n"
    blocked = ("def not_yours(*a):\n    raise AssertionError('a shortcut, not yours to call')\nsaved = shortcut\n"
               "shortcut = not_yours\ntry:\n    r = g(3)\nfinally:\n    shortcut = saved\nassert r == 9\n")
    gnb, lab = grading_nb(
        ("def helper():\n    return 0\ndef f(x):\n    return 2 * x\n", "assert f(3) == expected(3)\n"),  # same name
        ("def g(x):\n    return shortcut(x)\n", blocked),
        ("import functools\n@functools.lru_cache(maxsize=None)\ndef f(x):\n    return x * x\n", "assert f(3) == 9\n"),
        ("%time y = 1\nz = %timeit -n1 -r1 1\ndef g(x):\n    return x\n", "assert g(1) == 1\n"),
        ("import collections\nclass Yes:\n    def __eq__(self, other):\n        return True\n"
         "def f(x):\n    return collections.UserList([Yes()])\n", "assert f(1) == [5]\n"),
        ("def g(x):\n    return iter([x])\n", "assert list(g(1)) == [1]\n"), setup=setup)
    run = grading.execute(gnb, lab, tmp_path / "run", timeout=120, cell_timeout=30)
    got = {k: (c["passed"], c["message"]) for k, c in run["checks"].items()}
    assert got["c0"] == (True, ""), "the setup's helper is the setup's, whatever an answer names its own"
    assert got["c1"] == (False, "a shortcut, not yours to call"), "the check's blocker reached the answer's call"
    assert got["c2"] == (True, "") and got["c3"] == (True, ""), "a cached function and a magic line are fine"
    assert "a Yes, a class of the answer's own" in got["c4"][1] and "an iterator" in got["c5"][1], got
