"""Tests for utils.stubs: in a lab's kernel, the cells that need an exercise not done yet are skipped, with a note."""
import math
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from utils import stubs  # noqa: E402
from utils.constants import LOCKED_CHECK_HEAD, SETUP_MARK, STUB_MESSAGE  # noqa: E402
from utils.course.kernel import started_again  # noqa: E402
from utils.records import read_records  # noqa: E402

STUB = STUB_MESSAGE.format(exercise="07-gae", what="write the body of gae()")


def _namespace(source: str) -> dict:
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 -- the test's own source
    return namespace


def test_read_cell_reads_what_runs_now_and_not_what_runs_later():
    reads, binds, fills = stubs.read_cell(
        "import numpy as np, os.path\n"
        "@register(table)\n"
        "def train(x, n=default_steps) -> Out:\n"
        "    return gae(x) + later\n"                            # a body runs later: not read now
        "score = lambda r, k=top_k: r * unseen\n"                # nor a lambda's
        "class Probe(Base):\n    scale = width\n    def f(self):\n        return hidden\n"
        "doubled = [2 * v for v in values if v > cut]\n"         # v is the comprehension's own
        "runs['PPO'][0] = train(rollout)\n"                     # runs is filled: it must exist already
        "model.config.x = cfg\n"
        "try:\n    pass\nexcept KeyError as err:\n    print(err)\n"
        "total = total + 1\n")                                  # read before it is bound
    assert reads == ["register", "table", "default_steps", "Out", "top_k", "Base", "width", "values", "cut", "runs",
                     "rollout", "model", "cfg", "KeyError", "print", "total", "gae", "later"], reads   # train() is
    # called: its body is read too
    assert binds == {"np", "os", "train", "score", "Probe", "doubled", "err", "total"}, binds
    assert fills == {"runs"}
    assert stubs.read_cell("f = lambda x: g(x) + y\nz = f(1)\n")[0] == ["g", "y"]
    assert stubs.read_cell("def outer():\n    def inner():\n        return deep\n    return inner()\nouter()")[0] == \
        ["deep"]
    assert stubs.read_cell("def unused():\n    return gae(1)\n")[0] == [], "defined, not used: an answer cell"
    assert [stubs.read_cell(s)[0] for s in ("model = model.to('cpu')", "steps += 1", "del hack_model",
                                            "for x in xs:\n    y = x + 1", "x = 1\nprint(x)")] == \
        [["model"], ["steps"], ["hack_model"], ["xs"], ["print"]]
    assert stubs.read_cell("def broken(:\n") is None


def test_blocked_follows_calls_to_a_fixed_point_and_only_the_notebooks_own_code(monkeypatch):
    namespace = _namespace(
        f"import math\ndef gae(r):\n    raise NotImplementedError({STUB!r})\n"
        "def advantages(r):\n    return [gae(x) for x in r]\n"        # through a comprehension's code
        "def train_rl(mode):\n    return advantages(1) if mode == 'ppo' else 0.5\n"
        "class Trainer:\n    def step(self):\n        return train_rl('ppo')\n"
        "def table():\n    return sorted(runs)\n"
        "def fine():\n    return math.gae if False else 1\n"          # an attribute named gae is not the stub
        "import functools\n@functools.lru_cache\ndef cached(n):\n    return gae(n)\n"
        "def logged(f):\n    @functools.wraps(f)\n    def wrapper(*a):\n        return f(*a)\n    return wrapper\n"
        "@logged\ndef rollout(n):\n    return gae(n)\n")   # under a decorator, the notebook's own function
    namespace["library_function"] = math.sqrt
    monkeypatch.setattr(stubs, "BLOCKED", {"runs": ("07-gae",)})
    block = stubs.blocked(namespace)
    gae = ("07-gae",)
    assert block == {"gae": (gae, "stub", "gae"), "runs": (gae, "skipped", "runs"), "advantages": (gae, "calls", "gae"),
                     "train_rl": (gae, "calls", "gae"), "Trainer": (gae, "calls", "gae"), "table": (gae, "calls", "runs"),
                     "rollout": (gae, "calls", "gae"), "cached": (gae, "calls", "gae")}, block   # the chain's root
    monkeypatch.setattr(stubs, "BLOCKED", {})
    assert stubs.blocked({**namespace, "gae": lambda r: r}) == {}, "every exercise done: nothing is blocked"
    assert stubs.blocked(namespace, {"gae"}) == {}, "a cell that defines the exercise again is not blocked by it"


def test_unfinished_reads_only_the_notebooks_own_functions_and_classes():
    namespace = _namespace(
        f"def gae():\n    raise NotImplementedError({'Exercise 07-gae: write it'!r})\n"
        f"class NF4Linear:\n    def forward(self):\n        raise NotImplementedError("
        f"{'Exercise 06-nf4-model: write it'!r})\n"
        "class Cfg(dict):\n    __getattr__ = dict.__getitem__\n")
    namespace["cfg"] = namespace["Cfg"](a=1)   # an object whose attributes raise KeyError
    assert stubs.unfinished(namespace) == ["06-nf4-model", "07-gae"]
    assert stubs.stubs(namespace) == {"gae": ("07-gae",), "NF4Linear": ("06-nf4-model",)}


def test_a_skipped_cell_blocks_what_it_would_have_set_and_says_why(monkeypatch, capsys):
    monkeypatch.setattr(stubs, "BLOCKED", {})
    monkeypatch.setattr(stubs, "FILLED", set())
    stubs.skipped_cell(["log"], ["runs"], "train_rl", ("07-gae", "07-rloo"), "calls", "gae", "stub")
    assert stubs.BLOCKED == {"log": ("07-gae", "07-rloo"), "runs": ("07-gae", "07-rloo")} and stubs.FILLED == {"runs"}
    first, advice = capsys.readouterr().out.splitlines()
    assert first == ("Skipped (nothing in this cell ran): it uses `train_rl`, which calls `gae` "
                     "(exercises 07-gae, 07-rloo, not done yet).")
    assert advice.startswith("Finish exercises 07-gae, 07-rloo (their answer cells, then their graded checks), then")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A lab in a kernel, run on past its unfinished exercise as "Run Selected Cell and All Below" does."""
    nbclient = pytest.importorskip("nbclient")
    cells = [
        f"{SETUP_MARK}\nimport sys; sys.path.insert(0, {str(REPO_ROOT)!r})\nimport utils\nruns, results = {{}}, {{}}",
        f"def gae(rewards):\n    # YOUR CODE HERE\n    raise NotImplementedError({STUB!r})",
        f"{LOCKED_CHECK_HEAD} GAE\nassert gae(1) == 2",                                   # 2: fails, never skipped
        "def train_rl(mode):\n    return gae(1) if mode == 'ppo' else 0.5\n\ndef table():\n    return sorted(runs)",
        "runs['PPO'] = train_rl('ppo')\nlog = [1, 2]",                                    # 4: skipped
        "print(len(log))",                                                                # 5: skipped (log)
        "print(table())",                                                                 # 6: skipped (runs)
        "print(sorted(runs))\nrlhf = 'fine'",                                             # 7: skipped (runs)
        f"{SETUP_MARK}\nprint(sorted(runs))",                                             # 8: a setup cell runs
        "def later():\n    return rlhf\nglobals()['g' + 'ae'](1)",                       # 9: past the reading: stops
        "runs = {'RLOO': 0.5}\nprint(table())",                                           # 10: rebinds runs: runs
        "%%results\nutils.record('t/rloo', runs['RLOO'])\nutils.record('t/log', log)",    # 11: keeps what ran
        "def gae(rewards):\n    return 2 * rewards",                                      # 12: the exercise, done
        "runs['PPO'] = train_rl('ppo')\nlog = [runs['PPO']]\nprint(log)",                 # 13: runs now
        "print(len(log), later())",                                                       # 14: rlhf still blocked
        f"def gae(rewards):\n    raise NotImplementedError({STUB!r})",                      # 15: a stub again
        "results['ppo'] = train_rl('ppo')",                                               # 16: skipped, fills
        "print(sorted(results))",                                                         # 17: skipped
        "def gae(rewards):\n    return 2 * rewards",                                      # 18: done again
        "results['ppo'] = train_rl('ppo')",                                               # 19: its fill mends it
        "print(sorted(results))",                                                         # 20: runs again
    ]
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    tmp = tmp_path_factory.mktemp("lab")
    # coalesce_streams: one print reaches the notebook as one output, as a front-end shows it (a loaded kernel may
    # send it in several stream messages)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=60, allow_errors=True, coalesce_streams=True,
                                     resources={"metadata": {"path": str(tmp)}})
    started_again(client.execute)
    nbformat.write(nb, str(tmp / "executed.ipynb"))
    return nb, tmp / "executed.ipynb"


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")


def test_cells_that_need_an_unfinished_exercise_are_skipped_with_a_note(lab):
    nb, _ = lab
    check = nb.cells[2].outputs[0]
    assert check["output_type"] == "error" and check["ename"] == "NotImplementedError", "a check is never skipped"
    skipped = [i for i, c in enumerate(nb.cells) if _text(c).startswith("Skipped (nothing in this cell ran)")]
    assert skipped == [4, 5, 6, 7, 14, 16, 17], skipped   # not 10: it sets runs again, and table() reads it
    assert [o["output_type"] for c in (nb.cells[i] for i in skipped) for o in c.outputs] == ["stream"] * 7, \
        "a skip is not an error: Run All goes on"
    assert _text(nb.cells[4]).startswith("Skipped (nothing in this cell ran): it uses `train_rl`, which calls `gae` "
                                         "(exercise 07-gae, not done yet).\nFinish exercise 07-gae")
    assert "it needs `log`, which a cell skipped above would have set (exercise 07-gae, not done yet)" in \
        _text(nb.cells[5])
    assert "it uses `table`, which needs `runs`, which a cell skipped above would have set" in _text(nb.cells[6])
    assert _text(nb.cells[8]) == "[]\n", "a setup cell always runs (here on the runs the skipped cell did not fill)"
    stopped = nb.cells[9].outputs[-1]   # what the reading cannot see stops where the stub is, with the note
    assert stopped["ename"] == "NotImplementedError" and "Until then, cells that need it are skipped" in \
        stopped["traceback"][1]
    assert _text(nb.cells[10]) == "['RLOO']\n", "a cell that binds a blocked name runs, and unblocks it"
    assert _text(nb.cells[13]) == "[2]\n", "once the exercise is done, its cells run again"
    assert "Exercise 07-gae is done now: run again the cells above that set `rlhf`, then this one." in \
        _text(nb.cells[14]), _text(nb.cells[14])
    assert _text(nb.cells[20]) == "['ppo']\n", "a cell that fills what a skipped cell only filled runs, and mends it"


def test_the_results_cell_keeps_the_records_of_what_ran(lab):
    nb, path = lab
    assert read_records(path) == {"t/rloo": 0.5, "t/results_failed": [
        "line 3, utils.record('t/log', log): NameError: name 'log' is not defined"]}
    assert "Exercises not done yet: 07-gae." in nb.cells[11].outputs[-1]["evalue"]
