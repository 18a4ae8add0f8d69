"""Student editions of the lessons (``labs/``), built and validated like nbgrader's assignments.

Usage (from the repository root)::

    python -m utils labs build                  # write labs/ and utils/solutions/ from notebooks/ (`make labs`)
    python -m utils labs check                  # exit 1 when either is out of date with notebooks/
    python -m utils labs validate [NN ...]      # each lesson passes all of its graded checks
    python -m utils labs validate --invert      # each lab's stubs fail every graded check cleanly

A lesson marks its exercises the nbgrader way (:mod:`utils.course.cells`; the contract is
``docs/notebook-contract.md``). Validation and grading run only the parameters cell, the cells
tagged ``grader-setup``, the answer cells and the checks: never a lesson's training.

The lab of a lesson has every solution region replaced by a stub that raises
``NotImplementedError`` naming the exercise, every written question's marking guide replaced by
``YOUR ANSWER HERE``, the hidden tests and CI's markers removed, outputs cleared, the
checks locked (``editable``/``deletable`` false, as nbgrader's LockCells does) and every answer
and check cell's nbgrader checksum recorded (``compute_checksum`` is nbgrader 0.9's). The answers
themselves go to ``utils/solutions/lessonNN.py`` (:mod:`utils.course.solutions`), where the tests
and later lessons find them and a handout can leave them out.
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat

from ..constants import (
    COURSE_REPO,
    LABS_DIR,
    LESSON_GLOB,
    NOTEBOOKS_DIR,
    REPO_ROOT,
    SETUP_MARK,
    SETUP_TAG,
    SOLUTIONS_DIR,
)
from . import grading, solutions
from .cells import (
    TEXT_STUB,
    LabError,
    as_in_lab,
    check_contract,
    compute_checksum,
    exercise_of,
    is_answer,
    is_check,
    is_written,
    remove_hidden_tests,
    strip_tooling_markers,
    stub_solutions,
)
from .kernel import map_in_threads
from .lessons import find_lessons, lesson_number

LAB_META_KEY = "course_lab"          # notebook metadata of a lab: {"lesson": "01", "name": ...}
INSTRUCTIONS_ID = "lab-instructions"
INSTRUCTIONS = """\
> **Student edition.** Each exercise is a function whose body raises `NotImplementedError`:
> replace the `# YOUR CODE HERE` line and the `raise` under it with your code, then run the
> **graded check** right after it (a locked cell: do not edit or delete it).
>
> **How this lab is graded.** Your instructor's grader re-runs only your answer cells and the
> graded checks (plus hidden tests), on the tiny model and a CPU, so keep everything an answer
> needs (imports, helper functions) *inside its answer cell*. It does not re-run your training:
> the numbers your run records (`utils.record`) and your figures are read from the notebook you
> hand in, as self-reported results, with the preset and hardware you ran on. Hand in the
> executed notebook, under its own name.
>
> **Exercises first, if you like.** A graded check needs only the cells whose first line is
> `# [setup] ...` and the answer cells above it, never the training before it (the grader runs
> just those): to reach an exercise without waiting for that training, run those cells, then the check.
>
> **An exercise not done yet** stops "Run All" at its check. To go on past it, click the next cell and
> choose Run > "Run Selected Cell and All Below" (on Colab: Runtime > "Run after"): each cell that
> needs the exercise (or might: a function that calls it on one branch) is skipped with a note naming
> it, the others run, and the results cell at the end keeps the records of what ran. Once the
> exercise is done, run its check, then the sections it skipped again. A run from a terminal
> (`python -m utils run`) stops at the first check that fails.
>
> **Written questions** ask what *your* run showed: replace `YOUR ANSWER HERE` in the cell under
> each one with a few sentences (double-click the cell to edit it). Your instructor marks them by hand.
"""


COLAB_BADGE = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
               "(https://colab.research.google.com/github/{repo}/blob/main/labs/{name}.ipynb)")
CLONE_DEFAULT = re.compile(r'(os\.environ\.get\("COURSE_REPO_URL", )"https://github\.com/[^"]+\.git"\)')
# ipykernel's own kernelspec (its kernel.json), which JupyterLab writes into a notebook it opens
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}")


def course_repo(repo: str | None = None) -> str:
    """The GitHub repository the labs are opened from and cloned from: ``repo``, else ``$COURSE_REPO``, else
    :data:`utils.constants.COURSE_REPO`. An instructor who publishes a fork builds its labs with
    ``COURSE_REPO=owner/name make labs``: the Colab link of every lab and the address its setup cell clones
    then name the fork, and no code is edited."""
    repo = repo or os.environ.get("COURSE_REPO") or COURSE_REPO
    if not _REPO_RE.fullmatch(repo) or repo.endswith((".git", ".")):
        raise LabError(f"COURSE_REPO must be a GitHub repository as owner/name (e.g. {COURSE_REPO}), got {repo!r}")
    return repo


# ----------------------------------------------------------------------------- building labs
def _clean_cell(cell) -> None:
    """Outputs, execution counts, run metadata (papermill, execution timings) and CI's markers removed."""
    if cell.cell_type == "code":
        cell.outputs = []
        cell.execution_count = None
        cell.source = strip_tooling_markers(cell.source)
    for key in ("papermill", "execution", "collapsed", "scrolled"):
        cell.metadata.pop(key, None)


def build_lab(lesson, name: str, repo: str | None = None):
    """The student edition of a lesson notebook (a new NotebookNode; the lesson is not changed).

    ``name`` is the lesson's file stem (e.g. "01_sft_from_scratch"), stored in the lab's metadata
    so that the grader can tell which lab a renamed submission is. ``repo`` (:func:`course_repo`): the
    repository its "Open in Colab" link opens it from and its setup cell clones on Colab.
    """
    repo = course_repo(repo)
    check_contract(lesson, name)
    lab = copy.deepcopy(lesson)
    lab.metadata = nbformat.from_dict({k: v for k, v in lesson.metadata.items()
                                       if k in ("kernelspec", "language_info")})
    lab.metadata[LAB_META_KEY] = {"lesson": lesson_number(name), "name": name, "repo": repo}
    lab.metadata["kernelspec"] = dict(KERNELSPEC)   # as JupyterLab writes it: opening a lab leaves it unmodified
    for i, cell in enumerate(lab.cells):
        _clean_cell(cell)
        where = f"{name}, cell {i + 1}"
        if is_answer(cell):
            cell.source = stub_solutions(cell.source, exercise_of(cell), where)
            cell.metadata["deletable"] = False
        elif is_written(cell):   # the marking guide gives way to nbgrader's text stub
            cell.source = TEXT_STUB
            cell.metadata["deletable"] = False
        elif is_check(cell):
            cell.source = as_in_lab(remove_hidden_tests(cell.source, where))
            cell.metadata["deletable"] = False
            cell.metadata["editable"] = False
        if is_answer(cell) or is_written(cell) or is_check(cell):
            cell.metadata["nbgrader"]["checksum"] = compute_checksum(cell)
        elif cell.cell_type == "markdown":   # a long run from a terminal runs the lab, not the lesson's answers
            cell.source = re.sub(rf"(python -m utils run ){lesson_number(name)}\b", rf"\g<1>labs/{name}.ipynb",
                                 cell.source)
        elif cell.cell_type == "code":
            if CLONE_DEFAULT.search(cell.source):   # the setup cell
                cell.source = CLONE_DEFAULT.sub(lambda m: f'{m.group(1)}"https://github.com/{repo}.git")',
                                                cell.source)
            if {SETUP_TAG, "parameters"} & set(cell.metadata.get("tags", [])):   # what the grader runs
                cell.source = f"{SETUP_MARK}\n{cell.source}"
    instructions = nbformat.v4.new_markdown_cell(COLAB_BADGE.format(repo=repo, name=name) + "\n\n" + INSTRUCTIONS)
    instructions.id = INSTRUCTIONS_ID
    lab.cells.insert(1 if lab.cells and lab.cells[0].cell_type == "markdown" else 0, instructions)
    nbformat.validate(lab)
    return lab


def lesson_paths(selectors=(), notebooks_dir=NOTEBOOKS_DIR) -> list[Path]:
    """Lessons named by number ('01' or '1') or stem; all of them when none is given."""
    return find_lessons(selectors, notebooks_dir)


def lab_text(lesson_path: Path, repo: str | None = None) -> str:
    """The lab of ``lesson_path`` as the exact text ``build`` writes (``repo``: :func:`course_repo`)."""
    lab = build_lab(nbformat.read(lesson_path, as_version=4), Path(lesson_path).stem, repo)
    return nbformat.writes(lab) + "\n"


def build(notebooks_dir=NOTEBOOKS_DIR, labs_dir=LABS_DIR, solutions_dir=SOLUTIONS_DIR) -> list[Path]:
    """Write ``labs/NN_name.ipynb`` and ``utils/solutions/lessonNN.py`` for every lesson; remove those whose
    lesson is gone. Returns the paths written."""
    labs_dir = Path(labs_dir)
    labs_dir.mkdir(parents=True, exist_ok=True)
    written, modules = [], []
    for lesson in lesson_paths(notebooks_dir=notebooks_dir):
        target = labs_dir / lesson.name
        text = lab_text(lesson)
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
        written.append(target)
        module = solutions.write(lesson, solutions_dir)
        if module is not None:
            modules.append(module)
    for old in labs_dir.glob(LESSON_GLOB):
        if old not in written:
            old.unlink()
    for old in Path(solutions_dir).glob("lesson[0-9]*.py"):
        if old not in modules:
            old.unlink()
    return written + modules


def _built_for(lab_text_: str) -> str | None:
    """The repository a committed lab was built for (its metadata), so that a fork's labs check clean."""
    try:
        return nbformat.reads(lab_text_, as_version=4).metadata.get(LAB_META_KEY, {}).get("repo")
    except Exception:   # unreadable: it will differ from what its lesson builds
        return None


def stale(notebooks_dir=NOTEBOOKS_DIR, labs_dir=LABS_DIR, solutions_dir=SOLUTIONS_DIR) -> list[str]:
    """Why ``labs/`` or ``utils/solutions/`` is out of date with the lessons (empty when both are up to date).
    Each lab is compared with its lesson's lab for the repository it was built for (its metadata)."""
    labs_dir = Path(labs_dir)
    problems = []
    lessons = lesson_paths(notebooks_dir=notebooks_dir)
    for lesson in lessons:
        target = labs_dir / lesson.name
        if not target.is_file():
            problems.append(f"{target.name}: missing")
        elif (text := target.read_text(encoding="utf-8")) != lab_text(lesson, _built_for(text)):
            problems.append(f"{target.name}: differs from what its lesson builds")
    names = {p.name for p in lessons}
    problems += [f"{p.name}: no lesson of that name" for p in sorted(labs_dir.glob(LESSON_GLOB)) if p.name not in names]
    problems += [f"utils/solutions/{p}" for p in solutions.stale(lessons, solutions_dir)]
    return problems


def lab_for(lesson_path: Path):
    """The lab of a lesson, built in memory (the grader compares submissions with it)."""
    return build_lab(nbformat.read(lesson_path, as_version=4), Path(lesson_path).stem)


# ----------------------------------------------------------------------------- validation
def validate_notebook(lesson, answers, lab, invert: bool = False, timeout: int = 300,
                      kernel_cwd: Path = NOTEBOOKS_DIR) -> dict:
    """Run ``lesson``'s checks on ``answers`` (the lesson itself, a lab, a submission) and judge them.

    Without ``invert`` every check must pass; with it every check must fail with the
    NotImplementedError that names its exercise, and the run must go on to the next check.
    Returns ``{"ok", "checks": {grade_id: result}, "problems": [str], "wall_s"}``.
    """
    gnb, _ = grading.grading_notebook(lesson, answers, lab)
    with tempfile.TemporaryDirectory(prefix="validate-") as tmp:
        run = grading.execute(gnb, lab, Path(tmp), timeout=timeout, kernel_cwd=kernel_cwd)
    problems = [f"the grading run stopped: {run['status']} ({run['detail']})"] if run["status"] != "ok" else []
    problems += [f"setup cell {s['cell']} failed: {s['error']}" for s in run["setup_errors"]]
    for gid, r in run["checks"].items():
        if not invert and not r["passed"]:
            problems.append(f"{gid} fails with the lesson's solution: {r['message']}")
        if invert:
            if r["passed"]:
                problems.append(f"{gid} passes with the stubs: the check tests nothing")
            elif r["ename"] != "NotImplementedError" or "Exercise " not in r["message"]:
                problems.append(f"{gid} fails without naming an exercise: {r['message']}")
    return {"ok": not problems, "checks": run["checks"], "problems": problems, "wall_s": run["wall_s"]}


def validate(selectors=(), invert: bool = False, jobs: int = 1, timeout: int = 300) -> list[dict]:
    """nbgrader's ``validate`` (and ``--invert``) for the lessons named (all by default): each lesson's
    grading notebook on ``tiny``, with the lesson's own solutions (or, with ``invert``, the lab's stubs).
    Returns one :func:`validate_notebook` dict per lesson, with ``"lesson"`` added."""
    def one(path):
        lesson, lab = nbformat.read(path, as_version=4), lab_for(path)
        return {"lesson": path.stem, **validate_notebook(lesson, lab if invert else lesson, lab, invert, timeout)}

    return map_in_threads(one, lesson_paths(selectors), jobs)


# ----------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils labs", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="write labs/ and utils/solutions/ from notebooks/")
    sub.add_parser("check", help="exit 1 when labs/ or utils/solutions/ is out of date")
    v = sub.add_parser("validate", help="run the graded checks of lessons (or, with --invert, of labs)")
    v.add_argument("lessons", nargs="*", help="lesson numbers or names (default: all)")
    v.add_argument("--invert", action="store_true", help="every check must fail on the lab's stubs")
    v.add_argument("--jobs", type=int, default=1, help="lessons validated in parallel (default 1)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            for path in build():
                print(f"wrote {path.relative_to(REPO_ROOT)}")
            return 0
        if args.command == "check":
            problems = stale()
            for p in problems:
                print(p if p.startswith("utils/") else f"labs/{p}")
            if problems:
                print("labs/ or utils/solutions/ is out of date with notebooks/: run `make labs` "
                      "(python -m utils labs build) and commit both")
            return 1 if problems else 0
        results = validate(args.lessons, invert=args.invert, jobs=args.jobs)
    except (LabError, LookupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for r in results:
        passed = sum(c["passed"] for c in r["checks"].values())
        status = "ok" if r["ok"] else "FAILED"
        what = "stubs fail" if args.invert else "checks pass"
        print(f"{r['lesson']:<24} {status:<7} {what}: {len(r['checks']) - passed if args.invert else passed}/"
              f"{len(r['checks'])}  ({r['wall_s']:.0f} s)")
        for p in r["problems"]:
            print(f"    {p}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
