"""utils.course.kernel: a kernel that dies before it starts is started again; nothing else is retried.

The last test makes the real failure: the first kernel is given a port another socket holds, exits with
"Address already in use", and the notebook still runs, once, on the second kernel.
"""
import socket

import nbformat
import papermill
import pytest
from jupyter_client.connect import LocalPortCache
from nbformat.v4 import new_code_cell, new_notebook
from papermill.exceptions import PapermillExecutionError

from utils.course import kernel

DIED = RuntimeError("Kernel died before replying to kernel_info")


def _fake(monkeypatch, outcomes):
    """Make papermill.execute_notebook raise (or return) the given outcomes in turn; return its calls."""
    calls = []

    def fake(*args, **kwargs):
        calls.append((args, kwargs))
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    monkeypatch.setattr(papermill, "execute_notebook", fake)
    return calls


def test_a_kernel_that_dies_before_starting_is_started_again(monkeypatch):
    calls = _fake(monkeypatch, [DIED, DIED, "executed"])
    assert kernel.execute_notebook("in.ipynb", "out.ipynb", cwd="x") == "executed"
    assert calls == [(("in.ipynb", "out.ipynb"), {"cwd": "x"})] * 3


def test_the_last_start_failure_is_raised(monkeypatch):
    calls = _fake(monkeypatch, [DIED] * 5)
    with pytest.raises(RuntimeError, match="before replying to kernel_info"):
        kernel.execute_notebook("in.ipynb", "out.ipynb", attempts=2)
    assert len(calls) == 2


def test_a_kernel_that_never_answers_is_started_again(monkeypatch):
    calls = _fake(monkeypatch, [RuntimeError("Kernel didn't respond in 60 seconds"), "executed"])
    assert kernel.execute_notebook("in.ipynb", "out.ipynb") == "executed" and len(calls) == 2


@pytest.mark.parametrize("error", [
    RuntimeError("Kernel died"),                             # nbclient's DeadKernelError message: a cell was running
    PapermillExecutionError(0, 1, "boom", "ValueError", "x", []),  # a cell raised: the notebook's own result
    KeyboardInterrupt(),
])
def test_other_failures_are_not_retried(monkeypatch, error):
    calls = _fake(monkeypatch, [error, "executed"])
    with pytest.raises(type(error)):
        kernel.execute_notebook("in.ipynb", "out.ipynb")
    assert len(calls) == 1


@pytest.fixture
def first_port_taken(monkeypatch):
    """The first port jupyter_client hands a kernel is held by another socket, as another process could
    take it between the client's choice and the kernel's bind. Yields the list of ports so handed."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port, handed = taken.getsockname()[1], []
    find = LocalPortCache.find_available_port

    def first_one_taken(self, ip):
        if not handed:
            handed.append(port)
            return port
        return find(self, ip)
    monkeypatch.setattr(LocalPortCache, "find_available_port", first_one_taken)
    with taken:
        yield handed


def _notebook(path, source):
    nb = new_notebook(cells=[new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


RUN_ONCE = "open('ran', 'a').write('x')"  # a file in the kernel's folder: how many times the cell ran


def test_a_real_port_collision_is_survived(tmp_path, first_port_taken, caplog):
    _notebook(tmp_path / "in.ipynb", RUN_ONCE)
    kernel.execute_notebook(str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3",
                            cwd=str(tmp_path), progress_bar=False)
    assert len(first_port_taken) == 1
    assert (tmp_path / "ran").read_text() == "x"  # the cell ran once, on the second kernel
    assert "exited before it started (attempt 1 of 3" in caplog.text


def test_the_lesson_runner_survives_it(tmp_path, first_port_taken, caplog):
    from utils.course.run import execute_lesson
    (tmp_path / "lesson").mkdir()
    _notebook(tmp_path / "lesson" / "01_fake.ipynb", RUN_ONCE)
    result = execute_lesson(tmp_path / "lesson" / "01_fake.ipynb", tmp_path / "out", preset="tiny")
    assert len(first_port_taken) == 1
    assert result["status"] == "ok", result["error"]
    assert (tmp_path / "lesson" / "ran").read_text() == "x"
    assert "exited before it started (attempt 1 of 3" in caplog.text
    assert "Address already in use" in (tmp_path / "out" / "run.log").read_text()  # the first kernel's last words


def test_map_in_threads_keeps_order_and_drops_what_has_not_started_on_ctrl_c():
    import threading
    import time

    from utils.course.kernel import map_in_threads

    assert map_in_threads(lambda x: x * x, range(7), jobs=3) == [0, 1, 4, 9, 16, 25, 36]
    started, lock = [], threading.Lock()

    def work(x):
        with lock:
            started.append(x)
        if x == 0:
            raise KeyboardInterrupt
        time.sleep(0.2)

    with pytest.raises(KeyboardInterrupt):
        map_in_threads(work, range(20), jobs=2)
    time.sleep(0.5)
    assert len(started) <= 4, f"{len(started)} of 20 items started after Ctrl-C"
