"""docs/instructors.md's checklist, run as written: hand out, collect, grade (only the folders are moved to a temporary
place, so that nothing is written beside the repository)."""
import csv
import os
import re
import shlex
import shutil
import subprocess

import pytest

from utils.constants import REPO_ROOT

GUIDE = REPO_ROOT / "docs" / "instructors.md"
pytestmark = pytest.mark.slow


def checklist_commands() -> list[list[str]]:
    """The `make ...` commands of the guide's step-by-step list (before its first section of detail)."""
    steps = GUIDE.read_text(encoding="utf-8").split("\n\nEach lesson has", 1)[0]
    return [shlex.split(c) for c in re.findall(r"`(make (?:handout|grade) [^`]+)`", steps)]


def make(args, **kwargs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, **kwargs)


def test_the_checklist_runs_as_written(tmp_path):
    handout, grading = checklist_commands()
    assert handout[:2] == ["make", "handout"] and grading[:2] == ["make", "grade"], (handout, grading)
    where = {"../week4": tmp_path / "week4", "week4-submissions": tmp_path / "week4-submissions"}
    moved = [[f"{a.split('=')[0]}={where[a.split('=', 1)[1]]}" if "=" in a and a.split("=", 1)[1] in where else a
              for a in cmd] for cmd in (handout, grading)]

    done = make(moved[0])
    assert done.returncode == 0, done.stdout + done.stderr
    week4 = tmp_path / "week4"
    assert (week4 / "labs" / "04_grpo.ipynb").is_file() and (week4 / "README.md").is_file()   # step 1's promise

    subs = tmp_path / "week4-submissions"   # step 2: a student hands the lab back untouched, under their name
    subs.mkdir()
    shutil.copy(week4 / "labs" / "04_grpo.ipynb", subs / "ann.ipynb")
    done = make(moved[1])
    assert done.returncode == 0, done.stdout + done.stderr
    grades = tmp_path / "week4-submissions-grades"   # step 3: where the guide says the marks go
    (row,) = list(csv.DictReader((grades / "grades.csv").open(encoding="utf-8")))
    assert row["student"] == "ann" and row["auto_points"] == "0" and "not-attempted" in row["flags"]
    assert row["manual_points"] == "0", "step 4: the unanswered written questions are 0 already"
    assert (grades / "written.md").is_file() and (grades / "feedback" / "ann.md").is_file()   # steps 4 and 5
