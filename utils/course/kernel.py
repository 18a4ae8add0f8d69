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
worker (grading runs) and ``tests/test_records.py``'s own kernel.
"""
from __future__ import annotations

import logging

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


def execute_notebook(*args, attempts: int = KERNEL_START_ATTEMPTS, **kwargs):
    """``papermill.execute_notebook(*args, **kwargs)`` through :func:`started_again`."""
    import papermill

    return started_again(papermill.execute_notebook, *args, attempts=attempts, **kwargs)
