"""nbgrader itself takes the lessons as source notebooks, and its release equals our lab where it counts.

nbgrader 0.9.6 pins versions of its own (jupyter-server, sqlalchemy, ...), so, as for verl, the
``slow`` test builds a venv of its own (tests/side_venv.py) from tests/nbgrader/requirements.txt,
``~/.cache/post-training-course/nbgrader-venv/`` (``NBGRADER_VENV=/path`` moves it), and runs
``nbgrader generate_assignment`` on a course whose source is ``notebooks/`` as it is.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from utils.course import cells, labs

REQUIREMENTS = Path(__file__).parents[1] / "nbgrader" / "requirements.txt"
GENERATE = Path(__file__).parents[1] / "nbgrader" / "generate.py"
INSTALL_TIMEOUT = 900   # seconds; about 40 s on 2 cores


@pytest.fixture(scope="module")
def nbgrader(tmp_path_factory, side_python):
    """``nbgrader generate_assignment`` for every lesson, in one process of the nbgrader venv
    (tests/nbgrader/generate.py: nbgrader's own API, what its command line runs); return the course folder."""
    python = side_python("nbgrader", REQUIREMENTS, INSTALL_TIMEOUT)
    course = tmp_path_factory.mktemp("course")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"  # nbgrader calls alembic by name
    for lesson in labs.lesson_paths():
        (course / "source" / lesson.stem).mkdir(parents=True)
        shutil.copy(lesson, course / "source" / lesson.stem / lesson.name)
    proc = subprocess.run([str(python), str(GENERATE), str(course), *(p.stem for p in labs.lesson_paths())],
                          cwd=course, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"nbgrader failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for lesson, result in results.items():
        assert result["success"], f"nbgrader refused {lesson}:\n{result['log'][-3000:]}"
    return course


@pytest.mark.slow
@pytest.mark.parametrize("lesson", labs.lesson_paths(), ids=lambda p: p.stem)
def test_nbgrader_release_matches_our_lab(nbgrader, lesson):
    release = nbformat.read(nbgrader / "release" / lesson.stem / lesson.name, as_version=4)
    ours = {cells.grade_id(c): c for c in labs.lab_for(lesson).cells if cells.grade_id(c)}
    theirs = {cells.grade_id(c): c for c in release.cells if cells.grade_id(c)}
    assert set(theirs) == set(ours), "the same answer and check cells"
    for gid, cell in theirs.items():
        assert "BEGIN SOLUTION" not in cell.source and "HIDDEN TESTS" not in cell.source
        if cells.is_grade(cell):
            # ours leaves out CI's regression markers (cells.TOOLING_MARKERS), nbgrader keeps every line, and our
            # check's first line says it is locked (cells.as_in_lab: what the grader compares)
            assert cells.as_in_lab(labs.strip_tooling_markers(cell.source)) == ours[gid].source, \
                f"{gid}: nbgrader's student check differs from ours"
            assert cells.compute_checksum(cell) == cell.metadata.nbgrader["checksum"], \
                f"{gid}: our checksum of nbgrader's released cell is not nbgrader's"
        else:
            assert "raise NotImplementedError" in cell.source
