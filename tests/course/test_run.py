"""utils.course.run: the lesson runner, on two fake lessons (one fails) in a temporary directory.

Kernel start-ups cost 2-3 s each, so the runs are module-scoped fixtures shared by the tests.
"""
import contextlib
import io
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from utils.constants import REPO_ROOT
from utils.course.lessons import clean_for_commit, find_lessons, header_time, tiny_time
from utils.course.run import GLIBC_HEAP_ENV, INLINE_BACKEND, X86_KERNEL_ENV_DEFAULTS, kernel_env, main
from utils.records import read_records

REPO_ROOT = str(REPO_ROOT)


def _lesson(path: Path, body: str, extra_params: str = "") -> None:
    """Write a fake lesson: a parameters cell, then ``body``."""
    params = new_code_cell('PRESET = "auto"\nSEED = 0\nOUTPUT_DIR = None' + extra_params)
    params.metadata["tags"] = ["parameters"]
    header = "# Fake lesson\n\n| preset | time |\n| --- | --- |\n| `tiny` | typed by hand |"
    nb = new_notebook(cells=[new_markdown_cell(header), params, new_code_cell(body)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


OK_BODY = f"""import os, sys
sys.path.insert(0, {REPO_ROOT!r})
from utils import record
print("hello from the kernel")
record("99/preset", PRESET)
record("99/model", "fake-model")
record("99/device", "cpu")
record("99/accuracy", 0.5)
record("99/loss", 2.25)
record("99/wall_seconds", 88.4)
record("99/resume", RESUME)
record("99/output_dir", OUTPUT_DIR)
record("99/cwd", os.getcwd())
record("99/mplbackend", os.environ.get("MPLBACKEND"))
record("99/tqdm_disable", os.environ.get("TQDM_DISABLE"))
record("99/hash_of_a_string", hash("post-training"))
import torch
record("99/cpu_capability", torch.backends.cpu.get_cpu_capability())
record("99/torch_threads", torch.get_num_threads())
record("99/mkl_cbwr", os.environ.get("MKL_CBWR"))
record("99/heap", {{k: os.environ.get(k) for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")}})
from utils import headline
headline("99", [{{"name": "accuracy", "values": {{"run": "accuracy"}}, "n": 200}}], tiny_target_s=600)
import matplotlib.pyplot as plt
plt.plot([0, 1], [1, 0]); plt.title("a figure")
plt.show()"""

FAIL_BODY = 'print("about to fail")\nraise ValueError("the fake lesson is broken")'


def _make_lessons(nb_dir: Path) -> None:
    nb_dir.mkdir(parents=True, exist_ok=True)
    _lesson(nb_dir / "01_boom.ipynb", FAIL_BODY)  # fails first: the next lesson must still run
    _lesson(nb_dir / "02_fine.ipynb", OK_BODY, extra_params="\nRESUME = False")


def _main(args):
    """Run main() and return (exit code, console output)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = main([str(a) for a in args])
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """Both lessons, preset tiny, with --bench and --resume."""
    tmp = tmp_path_factory.mktemp("run")
    _make_lessons(tmp / "notebooks")
    out = tmp / "out"
    rc, console = _main(["--notebooks", tmp / "notebooks", "--out", out, "--preset", "tiny", "--bench", "--resume"])
    summary = {r["lesson"]: r for r in json.loads((out / "summary.json").read_text())}
    return {"rc": rc, "console": console, "out": out, "nb_dir": tmp / "notebooks", "summary": summary}


@pytest.fixture(scope="module")
def inplace_run(tmp_path_factory):
    """Both lessons with --inplace: the good one is written back cleaned, the failing one untouched."""
    tmp = tmp_path_factory.mktemp("inplace")
    _make_lessons(tmp / "notebooks")
    before = (tmp / "notebooks" / "01_boom.ipynb").read_bytes()
    rc, console = _main(["--notebooks", tmp / "notebooks", "--out", tmp / "out", "--inplace"])
    return {"rc": rc, "console": console, "nb_dir": tmp / "notebooks", "boom_before": before}


def test_failing_lesson_does_not_stop_the_next(full_run):
    assert full_run["rc"] == 1
    assert list(full_run["summary"]) == ["01_boom", "02_fine"]
    assert full_run["summary"]["02_fine"]["status"] == "ok"


def test_failure_is_reported_briefly_with_its_cell(full_run):
    boom = full_run["summary"]["01_boom"]
    assert boom["status"] == "failed"
    assert boom["error"]["ename"] == "ValueError"
    assert boom["error"]["evalue"] == "the fake lesson is broken"
    assert boom["error"]["exec_count"] is not None
    console = full_run["console"]
    assert "ValueError: the fake lesson is broken" in console
    assert "Traceback" not in console
    assert "1 of 2 lessons failed: 01_boom" in console


def test_records_parameters_and_environment(full_run):
    fine, out = full_run["summary"]["02_fine"], full_run["out"]
    rec = fine["records"]
    assert rec == read_records(out / "02_fine.ipynb")
    assert rec["99/preset"] == "tiny" and rec["99/accuracy"] == 0.5
    assert (fine["preset"], fine["model"], fine["device"]) == ("tiny", "fake-model", "cpu")
    assert rec["99/resume"] is True  # --resume reaches a lesson that declares RESUME ...
    assert Path(rec["99/output_dir"]) == (out / "02_fine").resolve() and (out / "02_fine").is_dir()
    assert Path(rec["99/cwd"]) == full_run["nb_dir"].resolve()
    assert rec["99/mplbackend"] == INLINE_BACKEND
    assert rec["99/tqdm_disable"] == os.environ.get("TQDM_DISABLE", "1")
    # a seeded run gives the same records on every machine: a fixed hash seed, and on x86-64 torch's CPU
    # kernels pinned to AVX2 (an AVX-512 machine would otherwise take other code paths)
    hash_seed = os.environ.get("PYTHONHASHSEED", "0")
    expected = subprocess.run([sys.executable, "-c", 'print(hash("post-training"))'], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed}, check=True).stdout.strip()
    assert rec["99/hash_of_a_string"] == int(expected)
    if platform.machine().lower() in ("x86_64", "amd64") and "ATEN_CPU_CAPABILITY" not in os.environ:
        assert rec["99/cpu_capability"] in ("AVX2", "DEFAULT")  # DEFAULT: a CPU without AVX2
    # ... and a tiny run on two CPU threads, whatever the machine has (the thread count changes a chaotic run)
    if "OMP_NUM_THREADS" not in os.environ:
        assert rec["99/torch_threads"] == 2
    # ... with MKL's matrix products in its strict mode (summed in one order on any number of threads)
    if platform.machine().lower() in ("x86_64", "amd64") and "MKL_CBWR" not in os.environ:
        assert rec["99/mkl_cbwr"] == "AVX2,STRICT"
    # ... and glibc's heap keeping what the kernel frees (no arithmetic changes; the system time of page faults goes)
    assert rec["99/heap"] == {k: os.environ.get(k, v) for k, v in GLIBC_HEAP_ENV.items()}
    assert fine["wall_s"] > 0
    # figures are embedded in the executed notebook
    fine_nb = nbformat.read(out / "02_fine.ipynb", as_version=4)
    assert any("image/png" in o.get("data", {}) for c in fine_nb.cells for o in c.get("outputs", []))
    # ... and the lesson without RESUME ran without it (papermill would have injected it otherwise)
    boom_nb = nbformat.read(out / "01_boom.ipynb", as_version=4)
    assert "RESUME" not in "".join(c.source for c in boom_nb.cells)


def test_only_cpu_runs_pin_the_cpu_code_paths(monkeypatch):
    # a tiny run is pinned to AVX2 (its records are compared across machines); a GPU preset, and so its CPU
    # rehearsal, is not: oneDNN's bf16 matrix products need AVX-512, pinned they fall back to a slow loop
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    for key in X86_KERNEL_ENV_DEFAULTS:
        monkeypatch.delenv(key, raising=False)
    for preset, pinned in (("tiny", True), ("auto", True), (None, True), ("t4-16g", False), (" 24G ", False)):
        with kernel_env(preset):
            assert all((os.environ.get(k) == v) == pinned for k, v in X86_KERNEL_ENV_DEFAULTS.items()), preset
    assert not any(k in os.environ for k in X86_KERNEL_ENV_DEFAULTS)   # restored after


# Shapes whose matrix product MKL splits differently over one and two threads in its plain AVX2 mode (seen on an
# AVX-512 Xeon: the first and last differ there); the strict mode adds in one order whatever the thread count.
GEMM_PROBE = """import hashlib, torch
torch.manual_seed(0)
for m, k, n in [(64, 512, 512), (256, 128, 1536), (1024, 128, 512), (33, 700, 129)]:
    a, b = torch.randn(m, k), torch.randn(k, n)
    print(hashlib.sha1((a @ b).numpy().tobytes()).hexdigest())
"""


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the pins are x86-64's")
def test_a_tiny_kernels_matrix_products_do_not_depend_on_the_thread_count():
    """Under a tiny run's pins, MKL's fp32 matrix products give the same bits on one thread and on two: its strict
    mode (MKL_CBWR=AVX2,STRICT) does not split a sum by the thread count, as its plain AVX2 mode does."""
    bits = []
    for threads in ("1", "2"):
        with kernel_env("tiny"):
            env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
            bits.append(subprocess.run([sys.executable, "-c", GEMM_PROBE], env=env, capture_output=True, text=True,
                                       check=True).stdout.split())
    assert len(bits[0]) == 4 and bits[0] == bits[1]


def test_summary_table_json_png_and_log(full_run):
    out, console = full_run["out"], full_run["console"]
    assert (out / "summary.png").stat().st_size > 0
    # each lesson: its status, time against its target, what it ran on, and its declared headline only
    assert re.search(r"^02_fine  ok  \d+ s of a 10 min target  \(tiny · fake-model · cpu\)$", console, re.M)
    assert "  accuracy (run)   0.500 ± 0.035   [SE over 200 problems]" in console
    assert "2.250" not in console and "99/accuracy" not in console  # every record: --all, and summary.json
    assert re.search(r"^01_boom  failed  \d+ s", console, re.M) and "declares no headline" in console
    saved = full_run["summary"]["02_fine"]
    assert saved["records"]["99/loss"] == 2.25 and saved["tiny_target_s"] == 600
    assert saved["headline"] == [{"name": "accuracy", "unit": "share", "noise": "SE over 200 problems", "compare": True,
                                  "stages": [{"label": "run", "value": 0.5, "se": (0.25 / 204) ** 0.5}]}]
    log = (out / "run.log").read_text()
    assert "hello from the kernel" in log and "about to fail" in log  # the kernels' output
    assert "start 01_boom" in log and "end 02_fine" in log
    assert "Traceback" in log or "ValueError" in log  # the full traceback goes to the log


def test_bench_report(full_run):
    out = full_run["out"]
    report = json.loads((out / "report.json").read_text())
    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["ram_gb"] > 0
    assert report["machine"]["torch"]
    lessons = {r["lesson"]: r for r in report["lessons"]}
    assert lessons["02_fine"]["peak_rss_mb"] > 0 and lessons["02_fine"]["wall_s"] > 0
    assert lessons["02_fine"]["records"]["99/accuracy"] == 0.5
    assert lessons["01_boom"]["status"] == "failed"
    assert "02_fine" in (out / "report.md").read_text()
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert len(history) == 1 and history[0]["lessons"]["02_fine"]["status"] == "ok"


def test_inplace_writes_cleaned_notebook_unless_the_lesson_failed(inplace_run):
    assert inplace_run["rc"] == 1
    nb_dir = inplace_run["nb_dir"]
    assert (nb_dir / "01_boom.ipynb").read_bytes() == inplace_run["boom_before"]
    assert "not overwriting" in inplace_run["console"]

    nb = nbformat.read(nb_dir / "02_fine.ipynb", as_version=4)
    assert "papermill" not in nb.metadata
    assert all("injected-parameters" not in c.metadata.get("tags", []) for c in nb.cells)
    assert all("papermill" not in c.metadata and "execution" not in c.metadata for c in nb.cells)
    assert read_records(nb)["99/preset"] == "tiny"
    assert nb.cells[2].execution_count is not None
    assert "OUTPUT_DIR = None" in nb.cells[1].source  # the lesson's own parameters cell is kept as is
    assert str(nb_dir.parent) not in "".join(c.source for c in nb.cells)  # no machine paths injected
    # the header's time is the run's measured wall time, not typed in
    assert header_time(nb) == "1 min 28 s when `make notebooks` last ran it on this machine; more on a slower machine"


def test_header_time_says_when_the_sft_start_was_loaded_from_an_earlier_lesson():
    records = {"06/wall_seconds": 62.4, "06/hardware": "CPU (2 cores)"}
    alone = tiny_time(records)
    assert alone == "1 min 02 s when `make notebooks` last ran it on CPU (2 cores); more on a slower machine"
    assert tiny_time({**records, "06/sft_reused": False}) == alone
    assert "its SFT start loaded from an earlier lesson's run" in tiny_time({**records, "06/sft_reused": True})


@pytest.mark.parametrize("lesson", find_lessons(), ids=lambda p: p.stem)
def test_committed_lesson_header_states_its_measured_time(lesson):
    nb = nbformat.read(lesson, as_version=4)
    assert header_time(nb) == tiny_time(read_records(nb)), "re-execute with `make notebooks`, which writes it"


def test_inplace_refuses_gpu_presets_and_unknown_lessons_exit_2(tmp_path):
    _make_lessons(tmp_path / "nb")
    rc, console = _main(["--notebooks", tmp_path / "nb", "--inplace", "--preset", "24g"])
    assert rc == 2 and "tiny" in console and "Traceback" not in console
    rc, console = _main(["07", "--notebooks", tmp_path / "nb", "--out", tmp_path / "out"])
    assert rc == 2 and "01_boom, 02_fine" in console and "Traceback" not in console
    assert not (tmp_path / "out").exists()


def test_timeout_names_the_running_cell(tmp_path):
    _lesson(tmp_path / "05_slow.ipynb", "import time\ntime.sleep(30)")
    rc, console = _main(["5", "--notebooks", tmp_path, "--out", tmp_path / "out", "--timeout", "1"])
    (slow,) = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert rc == 1 and slow["status"] == "failed"
    assert slow["error"]["ename"] == "CellTimeoutError"
    assert slow["error"]["cell"] == 3  # markdown, parameters, then the sleeping cell
    assert "cell 3 (In [" in console


def test_find_lessons(tmp_path):
    _make_lessons(tmp_path)
    boom, fine = tmp_path / "01_boom.ipynb", tmp_path / "02_fine.ipynb"
    assert find_lessons((), tmp_path) == [boom, fine]
    assert find_lessons(["2", "01", "02_fine", "02_fine.ipynb", "01_bo"], tmp_path) == [fine, boom]
    assert find_lessons([str(fine)], tmp_path) == [fine.resolve()]
    with pytest.raises(LookupError, match="Available lessons: 01_boom, 02_fine"):
        find_lessons(["03"], tmp_path)
    with pytest.raises(LookupError, match="no lessons found"):
        find_lessons((), tmp_path / "empty")


def test_clean_for_commit():
    injected = new_code_cell("PRESET = 'tiny'", execution_count=2)
    injected.metadata.update(tags=["injected-parameters"], papermill={"status": "completed"})
    work = new_code_cell("print(1)", execution_count=3, outputs=[
        new_output("stream", name="stdout", text="1\n"),
        new_output("error", ename="ValueError", evalue="x", traceback=["..."]),
        new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "m"}}),
    ])
    work.metadata.update(papermill={"duration": 0.1}, execution={"iopub.status.idle": "now"}, tags=["keep"])
    nb = new_notebook(cells=[new_markdown_cell("# T"), injected, work])
    nb.metadata.update(papermill={"parameters": {}}, widgets={"state": {}}, kernelspec={"name": "python3", "display_name": "Python 3"})

    clean = clean_for_commit(nb)
    assert [c.cell_type for c in clean.cells] == ["markdown", "code"]
    cell = clean.cells[1]
    assert cell.metadata == {"tags": ["keep"]} and cell.execution_count == 3
    assert [o.output_type for o in cell.outputs] == ["stream"]
    assert set(clean.metadata) == {"kernelspec"}
    assert len(nb.cells) == 3 and "papermill" in nb.metadata  # the input is left untouched
    nbformat.validate(clean)
