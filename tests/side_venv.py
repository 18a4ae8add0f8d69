"""A virtual environment of its own for a tool whose pins clash with the lessons' (verl, nbgrader).

Built outside the repository (``~/.cache/post-training-course/<name>-venv/``, or the path in an
environment variable), from a requirements file that is the complete frozen environment
(``pip install --no-deps``: pip resolves nothing and cannot wander off to CUDA builds), and reused
while its stamp -- the requirements file and this interpreter -- matches. An install that fails
FAILS the test (no skip).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import budget

CACHE = Path.home() / ".cache" / "post-training-course"


def venv_dir(name: str, env_var: str) -> Path:
    """``$env_var`` if set, else ``~/.cache/post-training-course/<name>-venv``."""
    return Path(os.environ.get(env_var, CACHE / f"{name}-venv"))


def stamp(requirements: Path) -> str:
    """Identifies a venv: the requirements file and the interpreter that built it."""
    h = hashlib.sha256(Path(requirements).read_bytes())
    h.update(sys.version.encode())
    return h.hexdigest()


def ensure(venv: Path, requirements: Path, timeout: float, what: str) -> Path:
    """Python of ``venv``, created (or reused when its stamp matches) from ``requirements``.

    ``--no-compile`` halves the install; the tool then caches the bytecode of what it imports.
    """
    python, stamp_file = venv / "bin" / "python", venv / ".installed"
    if python.exists() and stamp_file.exists() and stamp_file.read_text() == stamp(requirements):
        return python
    shutil.rmtree(venv, ignore_errors=True)
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    log = venv / "install.log"
    with open(log, "w") as f:
        try:
            rc = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                                 "--no-deps", "--no-compile", "-r", str(requirements)],
                                stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        pytest.fail(f"installing the {what} venv failed (pip: {rc}); last lines of {log}:\n{tail}", pytrace=False)
    stamp_file.write_text(stamp(requirements))
    budget.note("side venv installs", time.time() - t0, f"{what} venv")
    print(f"\n{what} venv installed in {time.time() - t0:.0f} s at {venv}")
    return python
