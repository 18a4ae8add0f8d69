"""Ctrl-C: `make run` and `make test` stop within seconds and leave no kernel behind (utils.course.kernel).

A terminal's Ctrl-C sends SIGINT to its foreground process group; Jupyter kernels run in a session of their own,
so only the runner (or pytest) gets it. Each test starts the command in a new process group on a fake lesson
whose second cell never ends, waits until that cell runs, sends SIGINT to the group and checks the exit.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from utils.constants import REPO_ROOT
from utils.course import speed

pytestmark = pytest.mark.slow   # each starts a runner or a pytest session: `make test` only
STOPPED_WITHIN_S = 15   # seconds from SIGINT to exit on the reference machine (the runner kills the kernel at once),
                        # stretched by its measured slowdown (utils.course.speed) on a busy one


def _endless_lesson(folder: Path) -> tuple[Path, Path]:
    """A fake lesson whose second cell touches a marker file, then never ends: (notebook, marker)."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "running"
    params = new_code_cell('PRESET = "auto"\nSEED = 0\nOUTPUT_DIR = None')
    params.metadata["tags"] = ["parameters"]
    endless = new_code_cell(f"from pathlib import Path\nPath({str(marker)!r}).touch()\nwhile True:\n    sum(range(10_000))")
    nb = new_notebook(cells=[params, endless])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / "01_endless.ipynb"
    nbformat.write(nb, path)
    return path, marker


def _kernels_of(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [p for p in proc.children(recursive=True) if any("ipykernel" in a for a in p.cmdline())]
    except psutil.Error:
        return []


def _interrupt_when_running(cmd: list[str], log: Path, marker: Path) -> tuple[int, float, list, int]:
    """Start ``cmd`` (output to ``log``) in a new process group, SIGINT the group once ``marker`` exists (the
    endless cell runs); return (exit status, seconds from SIGINT to exit, its kernels still alive after it, the
    limit on those seconds)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    kernels = []
    try:
        deadline = time.time() + 180
        while not marker.exists():
            assert proc.poll() is None, f"{cmd} ended before its endless cell ran:\n{log.read_text()[-2000:]}"
            assert time.time() < deadline, f"the endless cell never started:\n{log.read_text()[-2000:]}"
            time.sleep(0.2)
        kernels = _kernels_of(psutil.Process(proc.pid))
        assert kernels, "no kernel found under the command"
        limit = speed.scaled(STOPPED_WITHIN_S)   # this moment's load counts
        sent = time.time()
        os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(timeout=120)
        took = time.time() - sent
        _, alive = psutil.wait_procs(kernels, timeout=2)
        return status, took, alive, limit
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for k in kernels:
            if k.is_running():
                k.kill()


def test_ctrl_c_stops_the_runner_and_its_kernel(tmp_path):
    lesson, marker = _endless_lesson(tmp_path / "nb")
    cmd = [sys.executable, "-m", "utils", "run", "01", "--preset", "tiny", "--notebooks", str(lesson.parent),
           "--out", str(tmp_path / "out")]
    status, took, alive, limit = _interrupt_when_running(cmd, tmp_path / "run.txt", marker)
    assert status == 130, f"exit status {status}, expected 130 (interrupted)"
    assert took < limit, f"stopped {took:.1f} s after Ctrl-C (limit {limit} s)"
    assert not alive, f"kernels left running: {[k.pid for k in alive]}"
    assert "interrupted after 0 of 1 lessons" in (tmp_path / "run.txt").read_text()


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_stops_pytest_in_a_lesson_execution(tmp_path, workers):
    """`make test` executes the lessons from pytest (tests/lesson_runs.py), in its own process (one worker) or
    side by side in processes of their own (two): Ctrl-C there ends the session and every kernel."""
    lesson, marker = _endless_lesson(tmp_path / "nb")
    test = tmp_path / "test_endless.py"
    test.write_text("from pathlib import Path\nfrom tests.lesson_runs import LessonRuns\n\n"
                    "def test_endless():\n"
                    f"    runs = LessonRuns(Path({str(tmp_path / 'runs')!r}), workers={workers})\n"
                    f"    runs.prefetch([{str(lesson)!r}])\n"
                    f"    runs.run({str(lesson)!r})\n\n"
                    "def test_after():\n    pass\n")
    log = tmp_path / "pytest.txt"
    cmd = [sys.executable, "-m", "pytest", str(test), "-p", "no:cacheprovider", "-v", "--rootdir", str(REPO_ROOT)]
    status, took, alive, limit = _interrupt_when_running(cmd, log, marker)
    assert status == 2, f"pytest exit status {status}, expected 2 (interrupted):\n{log.read_text()[-2000:]}"
    assert "KeyboardInterrupt" in log.read_text() and "test_after" not in log.read_text(), log.read_text()[-2000:]
    assert took < limit, f"stopped {took:.1f} s after Ctrl-C (limit {limit} s)"
    assert not alive, f"kernels left running: {[k.pid for k in alive]}"
