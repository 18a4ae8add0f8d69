"""Tests for utils.records: record() -> notebook outputs -> read_records()."""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from utils import records  # noqa: E402
from utils.constants import LESSON_GLOB, NOTEBOOKS_DIR  # noqa: E402
from utils.course.kernel import started_again  # noqa: E402
from utils.records import RECORD_MIME, read_records, record  # noqa: E402


def _record_output(key, value):
    """A display_data output exactly as record() emits it inside a kernel."""
    return new_output("display_data", data={RECORD_MIME: {"key": key, "value": value},
                                            "text/plain": f"[record] {key} = {value!r}"})


def _write(nb, tmp_path, name="nb.ipynb"):
    path = tmp_path / name
    nbformat.write(nb, str(path))
    return path


def test_round_trip_from_written_notebook(tmp_path):
    nb = new_notebook(cells=[
        new_markdown_cell("# Lesson"),
        new_code_cell("x = 1", outputs=[new_output("stream", name="stdout", text="hello\n")]),
        new_code_cell("record(...)", outputs=[
            _record_output("01/format_compliance_after", 0.9375),
            _record_output("grpo/heldout_accuracy_after", {"mean": 0.5, "per_seed": [0.4, 0.6]}),
        ]),
        new_code_cell("record(...)", outputs=[_record_output("01/n_params", 123)]),
    ])
    path = _write(nb, tmp_path)
    got = read_records(path)
    assert got == {"01/format_compliance_after": 0.9375,
                   "grpo/heldout_accuracy_after": {"mean": 0.5, "per_seed": [0.4, 0.6]},
                   "01/n_params": 123}
    assert list(got) == ["01/format_compliance_after", "grpo/heldout_accuracy_after", "01/n_params"]
    assert read_records(str(path)) == got  # str path works too
    assert read_records(nbformat.read(str(path), as_version=4)) == got  # and a loaded node


def test_show_records_output_keeps_order_and_reads_with_single_records(tmp_path):
    bulk = new_output("display_data", data={RECORD_MIME: {"records": [["02/b", 2], ["02/a", [1.5, None]]]},
                                            "text/plain": "2 values recorded"})
    nb = new_notebook(cells=[new_code_cell("record(...)", outputs=[_record_output("02/old", 1)]),
                             new_code_cell("show_records()", outputs=[bulk])])
    got = read_records(_write(nb, tmp_path))      # nbformat sorts JSON keys on disk: pairs keep the order
    assert list(got.items()) == [("02/old", 1), ("02/b", 2), ("02/a", [1.5, None])]
    bad = new_output("display_data", data={RECORD_MIME: {"records": [["02/x"]]}, "text/plain": ""})
    with pytest.raises(ValueError, match="malformed record in cell 0"):
        read_records(_write(new_notebook(cells=[new_code_cell("", outputs=[bad])]), tmp_path, "bad.ipynb"))


def test_execute_result_and_later_record_wins(tmp_path):
    nb = new_notebook(cells=[
        new_code_cell("a", outputs=[_record_output("t/a", 1), _record_output("t/b", 2)]),
        new_code_cell("b", execution_count=1, outputs=[
            new_output("execute_result", execution_count=1,
                       data={RECORD_MIME: {"key": "t/a", "value": 3}, "text/plain": "x"})]),
    ])
    assert read_records(_write(nb, tmp_path)) == {"t/a": 3, "t/b": 2}


def test_notebook_without_records(tmp_path):
    nb = new_notebook(cells=[new_markdown_cell("hi"), new_code_cell("1 + 1")])
    assert read_records(_write(nb, tmp_path)) == {}


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_records(tmp_path / "nope.ipynb")


def test_invalid_json_file(tmp_path):
    path = tmp_path / "broken.ipynb"
    path.write_text("{ not json", encoding="utf-8")
    with pytest.raises(ValueError, match="broken.ipynb is not a valid notebook"):
        read_records(path)


def test_json_but_not_a_notebook(tmp_path):
    path = tmp_path / "list.ipynb"
    path.write_text(json.dumps([1, 2, 3]), encoding="utf-8")
    with pytest.raises(ValueError, match="not a valid notebook"):
        read_records(path)


def test_record_stores_and_prints(capsys):
    record("t/acc", 0.9375)
    assert records.RECORDS["t/acc"] == 0.9375
    assert capsys.readouterr().out.strip() == "[record] t/acc = 0.9375"
    record("t/long", 1 / 3)
    assert records.RECORDS["t/long"] == 1 / 3  # full value kept
    assert capsys.readouterr().out.strip() == "[record] t/long = 0.3333"


@pytest.mark.parametrize("key", ["noslash", "a b/c", "/x", "x/", "lesson/metric name", "", 3])
def test_invalid_key(key):
    with pytest.raises(ValueError, match="invalid key"):
        record(key, 1.0)


def test_valid_keys():
    for key in ["01/format_compliance_after", "grpo/heldout_accuracy_after", "dpo/win_rate@8", "a.b-c/x/y"]:
        record(key, 1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), [1.0, float("nan")],
                                 {"x": float("nan")}, np.float32("nan")])
def test_non_finite_raises(bad):
    with pytest.raises(ValueError, match="record None"):
        record("t/bad", bad)


def test_none_is_allowed():
    record("t/undefined", None)
    assert records.RECORDS["t/undefined"] is None


def test_numpy_conversion():
    record("t/np", {"f": np.float32(0.5), "i": np.int64(7), "b": np.bool_(True),
                    "arr0": np.array(2.5), "tup": (np.int32(1), 2)})
    got = records.RECORDS["t/np"]
    assert got == {"f": 0.5, "i": 7, "b": True, "arr0": 2.5, "tup": [1, 2]}
    assert type(got["f"]) is float and type(got["i"]) is int and type(got["b"]) is bool
    json.dumps(got)  # plain JSON


def test_non_serializable_raises_type_error():
    with pytest.raises(TypeError, match="t/obj.*object"):
        record("t/obj", object())
    with pytest.raises(TypeError, match="t/arr"):
        record("t/arr", np.array([1.0, 2.0]))


def test_records_module_does_not_import_torch():
    code = f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import utils.records; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_end_to_end_with_kernel(tmp_path):
    nbclient = pytest.importorskip("nbclient")
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        pytest.skip("no 'python3' Jupyter kernelspec installed (pip install ipykernel)")
    nb = new_notebook(cells=[
        new_code_cell(f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n"
                      "from utils import record, show_records\n"
                      "record('t/x', 0.5)"),
        new_code_cell("record('t/y', [1, 2])\nrecord('t/z', 3)\nshow_records()"),
        new_code_cell("record('t/x', 0.25)\nshow_records()\nshow_records()"),
        new_code_cell("record('t/lost', 1)"),           # never shown: not saved in the notebook
    ])
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=60,
                                     resources={"metadata": {"path": str(tmp_path)}})
    started_again(client.execute)   # a kernel that dies before it starts is started again (utils.course.kernel)
    path = _write(nb, tmp_path, "executed.ipynb")
    assert read_records(path) == {"t/x": 0.25, "t/y": [1, 2], "t/z": 3}
    assert [len(c.outputs) for c in nb.cells] == [0, 1, 1, 0], "one output per show_records() with something to show"
    text = nb.cells[1].outputs[0]["data"]["text/plain"]
    assert text == "3 values recorded (t/x ... t/z): saved in this notebook (utils.read_records reads them back)", text


def test_a_results_cell_keeps_what_ran_and_names_what_did_not(tmp_path):
    """%%results: a statement that fails (a section that did not run) costs only its own records; the cell then
    fails once, naming each failed line and the lab's exercises still stubs."""
    nbclient = pytest.importorskip("nbclient")
    from utils.constants import STUB_MESSAGE

    stub = STUB_MESSAGE.format(exercise="07-gae", what="write the body of gae()")
    nb = new_notebook(cells=[
        new_code_cell(f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\nimport utils\nruns = {{'RLOO': 0.5}}"),
        new_code_cell(f"def gae(rewards):\n    # YOUR CODE HERE\n    raise NotImplementedError({stub!r})"),
        new_code_cell("%%results   # every statement on its own\nutils.record('07/rloo', runs['RLOO'])\n"
                      "utils.record('07/ppo', runs['PPO'])\nfor k in ('a', 'b'):\n    utils.record(f'07/{k}', 1)\n"
                      "utils.record('07/mixed', len(mixed))"),
        new_code_cell("%%results\nutils.record('07/all', 1)"),
        new_code_cell("train = globals()['gae']\ntrain(1)"),   # a stub reached where the reading does not see it
        new_code_cell("runs['PPO']"),                                    # and one that needs what it would make
        new_code_cell("import sys\nprint(type(sys.last_value).__name__)"),  # %tb and %debug see the latest error
        new_code_cell("%%results\n\n\nutils.record('08/x', missing)"),    # blank lines before the first statement
    ])
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=60, allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    started_again(client.execute)
    records = read_records(_write(nb, tmp_path, "executed.ipynb"))
    assert records == {"07/rloo": 0.5, "07/a": 1, "07/b": 1, "07/results_failed": [
        "line 3, utils.record('07/ppo', runs['PPO']): KeyError: 'PPO'",
        "line 6, utils.record('07/mixed', len(mixed)): NameError: name 'mixed' is not defined"], "07/all": 1,
        "08/results_failed": ["line 4, utils.record('08/x', missing): NameError: name 'missing' is not defined"]}
    error = nb.cells[2].outputs[-1]
    assert error["output_type"] == "error" and error["ename"] == "ResultsIncomplete", error
    assert "2 statement(s) of this cell failed" in error["evalue"] and "Exercises not done yet: 07-gae." in error["evalue"]
    assert [o["output_type"] for o in nb.cells[3].outputs] == ["display_data"], "a cell that ran whole: no error"
    (stopped,) = nb.cells[4].outputs   # the stub's error: its one line and what to do, not the training's frames
    assert stopped["ename"] == "NotImplementedError" and len(stopped["traceback"]) == 2, stopped
    assert stopped["traceback"][1].startswith("Exercise 07-gae is not done yet: write its answer cell")
    error, note = nb.cells[5].outputs   # any other error as usual, then the exercises still stubs
    assert error["ename"] == "KeyError" and note["text"].startswith("(Exercises not done yet: 07-gae.")
    assert nb.cells[6].outputs[0]["text"] == "KeyError\n"
    assert "line 4, utils.record('08/x', missing): NameError" in nb.cells[7].outputs[-1]["evalue"]


def test_run_each_keeps_going_and_compiles_without_this_modules_future_imports():
    namespace = {}
    failed = records.run_each("a = 1\nb = missing\nx: undefined = 2\nc = a + 1\n", namespace, first_line=2)
    assert [f.split(":")[0] for f in failed] == ["line 3, b = missing", "line 4, x"], failed
    assert namespace["c"] == 2 and "b" not in namespace


@pytest.mark.parametrize("lesson", sorted(NOTEBOOKS_DIR.glob(LESSON_GLOB)), ids=lambda p: p.stem[:2])
def test_every_lesson_has_one_results_cell_and_it_starts_with_the_magic(lesson):
    nb = json.loads(lesson.read_text(encoding="utf-8"))
    results = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).startswith("%%results")]
    assert len(results) == 1 and "utils.record(" in "".join(results[0]["source"]), "one results cell, %%results first"
