"""Starting a Jupyter kernel again when it dies before it runs anything.

A Jupyter client chooses the kernel's five TCP ports by binding port 0 and closing the socket, and the
kernel binds them a moment later, once Python has imported ipykernel. Any process may take one of those
ports in between; the kernel then exits with ``Address already in use`` and the client reports
``Kernel died before replying to kernel_info`` (jupyter/jupyter_client#154). One start rarely meets it;
a test run that starts a few hundred kernels, two at a time, does now and then (a CI run of this project
lost ``labs validate --invert`` to it). At that point no cell has run, so starting again changes nothing
a notebook records. A kernel that is alive but never answers within the start timeout (``Kernel didn't
respond in N seconds``) is started again too: no cell has run then either.

Used by ``utils run`` (lessons, and so the tests' lesson executions, which nbval reads), the grader's
worker (grading runs) and ``tests/library/test_records.py``'s own kernel.

Ctrl-C. A kernel runs in a session of its own (jupyter_client starts it so), so the terminal's SIGINT reaches
only this process; and nbclient, while it runs a notebook in the main thread, answers SIGINT by shutting the
kernel down and reporting a dead kernel, which a caller cannot tell from a crash (``make test`` then went on to
the next lesson). :func:`execute_notebook` therefore runs papermill in a worker thread (nbclient then leaves
the signals alone) and keeps the main thread waiting: Ctrl-C (or SIGTERM, with :func:`sigterm_as_interrupt`)
raises ``KeyboardInterrupt`` there, the kernel this call started is killed with its children, and the
``KeyboardInterrupt`` goes on to the caller within seconds.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time

KERNEL_START_ATTEMPTS = 3
log = logging.getLogger(__name__)


def died_before_starting(exc: BaseException) -> bool:
    """Whether ``exc`` is a kernel that exited, or never answered, before its first reply (so before any cell
    ran): jupyter_client's ``wait_for_ready`` raises these two, and nothing after the start does."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("before replying to kernel_info" in text
                                              or text.startswith("Kernel didn't respond"))


def started_again(start, *args, attempts: int = KERNEL_START_ATTEMPTS, **kwargs):
    """``start(*args, **kwargs)`` (anything that starts a kernel first), called up to ``attempts`` times while the
    kernel dies before it starts; any other error, and the last start's, is raised as ``start`` raised it."""
    for attempt in range(1, attempts + 1):
        try:
            return start(*args, **kwargs)
        except RuntimeError as e:
            if attempt == attempts or not died_before_starting(e):
                raise
            log.warning(f"the kernel exited before it started (attempt {attempt} of {attempts}: {e}); "
                        "starting a new one")


def _kernels() -> dict:
    """This process's descendants that are Jupyter kernels, by pid."""
    import psutil

    found = {}
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any("ipykernel" in part for part in child.cmdline()):
                found[child.pid] = child
    return found


def kill_tree(processes) -> None:
    """SIGKILL ``processes`` (psutil processes) and their descendants, and reap what can be reaped (waits up to
    5 s)."""
    import psutil

    victims = []
    for p in processes:
        with contextlib.suppress(psutil.Error):
            victims += [*p.children(recursive=True), p]
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(victims, timeout=5)


def interruptible(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (something that starts kernels) in a worker thread, the main thread waiting.

    ``KeyboardInterrupt`` (or any other exception) in the waiting thread kills every kernel started during the
    call (with its children), again until the worker has stopped (a kernel killed while starting is started
    again by :func:`started_again`: that one is killed too) or 10 s have passed, and is then raised again.
    Called from a thread that is not the main one, ``fn`` simply runs in it (signals reach only the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
    before, outcome = set(_kernels()), {}

    def work():
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 -- handed to the caller as it was raised
            outcome["error"] = e

    worker = threading.Thread(target=work, name="notebook-execution", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.25)
    except BaseException:
        deadline = time.monotonic() + 10
        while True:
            kill_tree([p for pid, p in _kernels().items() if pid not in before])
            worker.join(0.5)
            if not worker.is_alive() or time.monotonic() > deadline:
                break
        kill_tree([p for pid, p in _kernels().items() if pid not in before])
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def map_in_threads(fn, items, jobs: int) -> list:
    """``[fn(x) for x in items]``, ``jobs`` at a time in threads (notebooks graded or validated side by side). On
    Ctrl-C the items not started are dropped (a ``ThreadPoolExecutor`` left by an exception would run them all
    first); those running stop with their kernels, which the terminal's Ctrl-C reaches too."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        results = list(pool.map(fn, items))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Within the block, SIGTERM raises ``KeyboardInterrupt`` like Ctrl-C (so kernels are cleaned up the same
    way); the previous handler is restored after. Only in the main thread (elsewhere: no change)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def execute_notebook(*args, attempts: int = KERNEL_START_ATTEMPTS, **kwargs):
    """``papermill.execute_notebook(*args, **kwargs)`` through :func:`started_again`, interruptible by Ctrl-C
    (:func:`interruptible`)."""
    import papermill

    return interruptible(started_again, papermill.execute_notebook, *args, attempts=attempts, **kwargs)
