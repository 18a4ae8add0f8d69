"""Paths and constants that more than one module needs: each is defined here and nowhere else.

Lesson modules and course tooling (``utils.course``) import them from here; the lessons see
them through the modules that use them (``presets``, ``data``, ...).
"""
from __future__ import annotations

import re
from pathlib import Path

# ----------------------------------------------------------------------------- where things are
REPO_ROOT = Path(__file__).resolve().parent.parent
UTILS_DIR = REPO_ROOT / "utils"
ASSETS_DIR = UTILS_DIR / "assets"
TINY_MODEL_DIR = ASSETS_DIR / "tiny-qwen"            # the embedded model (built by `python -m utils tiny build`)
TINY_MODEL_LABEL = "tiny-qwen (embedded)"            # how tables and records name it (never a machine path)
TWIN_MEASUREMENTS = ASSETS_DIR / "twin-measurements.json"   # the GPU presets' architecture-twin figures
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"              # the lessons
LABS_DIR = REPO_ROOT / "labs"                        # their student editions (generated)
SOLUTIONS_DIR = UTILS_DIR / "solutions"              # reference solutions of the graded exercises (generated)
RUNS_DIR = REPO_ROOT / "runs"                        # default output of the runner: runs/<preset>/
LESSON_GLOB = "[0-9][0-9]_*.ipynb"                   # a lesson is notebooks/NN_name.ipynb
COURSE_REPO = "post-training-course/post-training-labs"   # GitHub owner/name the labs are opened from (Colab) and
                                                     # cloned from; `COURSE_REPO=you/fork make labs` for a fork

# ----------------------------------------------------------------------------- data
GSM8K = "openai/gsm8k"   # the Hub id of GSM8K (config "main": 7,473 train / 1,319 test); verl names it the same

# ----------------------------------------------------------------------------- notebooks
META_KEYS = ("preset", "model", "device", "hardware")   # recorded by every lesson: what a run was, not a result
SETUP_TAG = "grader-setup"          # cells that graded checks need besides the answers
SETUP_MARK = "# [setup] The graded checks need this cell: run it before the exercises below."   # ... their first line
CHECK_HEAD = "# Graded check:"   # a check's first line in a lesson ...
LOCKED_CHECK_HEAD = "# Graded check (a locked cell: run it, do not edit it):"   # ... and in its lab
STUB_MESSAGE = "Exercise {exercise}: {what} (see the docstring), then run the graded check after it"   # a lab's stub
STUB_RE = re.compile(r"^Exercise (\d\d-[A-Za-z0-9-]+): ")   # ... and how its exercise is read back
CHECK_MESSAGE_CHARS = 1000          # a failed check's message as the grader keeps it and the feedback shows it
INJECTED_TAG, ERROR_CELL_TAG = "injected-parameters", "papermill-error-cell-tag"   # the cells papermill adds
PAPERMILL_TAGS = frozenset({INJECTED_TAG, ERROR_CELL_TAG})
