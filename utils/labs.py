"""Student editions of the lessons (``labs/``), built and validated like nbgrader's assignments.

Usage (from the repository root)::

    python -m utils.labs build                  # write labs/NN_*.ipynb from notebooks/ (`make labs`)
    python -m utils.labs check                  # exit 1 when labs/ is out of date with notebooks/
    python -m utils.labs validate [NN ...]      # each lesson passes all of its graded checks
    python -m utils.labs validate --invert      # each lab's stubs fail every graded check cleanly

A lesson marks its exercises the nbgrader way (``../shared/CONVENTIONS.md`` section 2):

- an **answer cell** has ``nbgrader`` metadata ``{"solution": true, "grade": false, ...}`` and
  its solution between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
- a **graded check** has ``{"grade": true, "solution": false, "locked": true, "points": n, ...}``;
  instructor-only lines go between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``;
- cells tagged ``grader-setup`` (imports, the preset, the tokenizer, fixed examples) are what the
  checks need besides the answers. Validation and grading (``utils.grade``) run only the
  parameters cell, these cells, the answer cells and the checks: never a lesson's training.

The lab of a lesson has every solution region replaced by a stub that raises
``NotImplementedError`` naming the exercise, the hidden tests removed, outputs cleared, the
checks locked (``editable``/``deletable`` false, as nbgrader's LockCells does) and every answer
and check cell's nbgrader checksum recorded (``compute_checksum`` is nbgrader 0.9's).
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import re
import sys
import tempfile
from pathlib import Path

import nbformat

from utils.run import LESSON_GLOB, NOTEBOOKS_DIR, REPO_ROOT, find_lessons

LABS_DIR = REPO_ROOT / "labs"
SETUP_TAG = "grader-setup"
BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
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
"""


class LabError(ValueError):
    """A lesson that breaks the exercise contract (unbalanced markers, missing metadata, ...)."""


# ----------------------------------------------------------------------------- nbgrader's view of a cell
def nbgrader_meta(cell) -> dict:
    """The cell's ``nbgrader`` metadata ({} when it has none)."""
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def is_grade(cell) -> bool:
    """A graded check (nbgrader: ``grade`` true)."""
    return bool(nbgrader_meta(cell).get("grade", False))


def is_solution(cell) -> bool:
    """An answer cell (nbgrader: ``solution`` true)."""
    return bool(nbgrader_meta(cell).get("solution", False))


def is_locked(cell) -> bool:
    """nbgrader's ``is_locked``: grade cells are locked, solution cells never, others as marked."""
    meta = nbgrader_meta(cell)
    if not meta or is_solution(cell):
        return False
    return True if is_grade(cell) else bool(meta.get("locked", False))


def compute_checksum(cell) -> str:
    """nbgrader's checksum of a cell (``nbgrader.utils.compute_checksum``, nbgrader 0.9).

    md5 over the source, the cell type, ``str(is_grade)``, ``str(is_solution)``, ``str(is_locked)``,
    the grade_id and, for grade cells, ``str(float(points))``; returned as a hex string.
    """
    m = hashlib.md5()
    for part in (cell["source"], cell["cell_type"], str(is_grade(cell)), str(is_solution(cell)),
                 str(is_locked(cell)), nbgrader_meta(cell)["grade_id"]):
        m.update(part.encode("utf-8"))
    if is_grade(cell):
        m.update(str(float(nbgrader_meta(cell)["points"])).encode("utf-8"))
    return m.hexdigest()


def grade_id(cell) -> str | None:
    return nbgrader_meta(cell).get("grade_id")


def lesson_number(path) -> str:
    """'01' for notebooks/01_sft_from_scratch.ipynb."""
    return Path(path).name[:2]


# ----------------------------------------------------------------------------- source rewriting
def _regions(lines: list[str], begin: str, end: str, where: str) -> list[tuple[int, int]]:
    """(begin line, end line) index pairs of the delimited regions; LabError when unbalanced."""
    regions, start = [], None
    for i, line in enumerate(lines):
        if begin in line:
            if start is not None:
                raise LabError(f"{where}: nested '{begin}' (line {i + 1})")
            start = i
        elif end in line:
            if start is None:
                raise LabError(f"{where}: '{end}' without '{begin}' (line {i + 1})")
            regions.append((start, i))
            start = None
    if start is not None:
        raise LabError(f"{where}: '{begin}' (line {start + 1}) has no '{end}'")
    return regions


def _enclosing_function(lines: list[str], index: int) -> str | None:
    """Name of the innermost ``def`` above line ``index`` that is less indented than it."""
    indent = len(lines[index]) - len(lines[index].lstrip())
    for line in reversed(lines[:index]):
        m = re.match(r"(\s*)def\s+(\w+)\s*\(", line)
        if m and len(m.group(1)) < indent:
            return m.group(2)
    return None


def stub_solutions(source: str, exercise: str, where: str = "cell") -> str:
    """Replace every solution region of ``source`` by a stub that raises NotImplementedError.

    The stub keeps the region's indentation (nbgrader's ``# YOUR CODE HERE`` line, then the
    ``raise``); its message names the exercise and the function to write.
    """
    lines = source.split("\n")
    out, last = [], 0
    for begin, end in _regions(lines, BEGIN_SOLUTION, END_SOLUTION, where):
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        func = _enclosing_function(lines, begin)
        what = f"write the body of {func}()" if func else "write this part"
        message = f"Exercise {exercise}: {what} (see the docstring), then run the graded check after it"
        out += lines[last:begin] + [f"{indent}# YOUR CODE HERE",
                                     f"{indent}raise NotImplementedError({message!r})"]
        last = end + 1
    return "\n".join(out + lines[last:])


def remove_hidden_tests(source: str, where: str = "cell") -> str:
    """Drop every hidden-test region (markers included) from ``source``."""
    lines = source.split("\n")
    keep, last = [], 0
    for begin, end in _regions(lines, BEGIN_HIDDEN, END_HIDDEN, where):
        keep += lines[last:begin]
        last = end + 1
    return "\n".join(keep + lines[last:]).rstrip("\n")


def exercise_of(answer_cell) -> str:
    """The exercise an answer cell belongs to: its grade_id without the '-answer' suffix."""
    return grade_id(answer_cell).removesuffix("-answer")


# ----------------------------------------------------------------------------- contract check
def check_contract(nb, name: str = "lesson") -> None:
    """Raise LabError when a lesson breaks the exercise contract.

    Every cell with a solution region is an answer cell and vice versa; grade_ids are unique and
    nbgrader-valid; every check has integer points, is locked and is not also a solution cell;
    hidden tests sit only in checks; markers are balanced; at least one cell is tagged
    ``grader-setup`` when the lesson has checks.
    """
    seen = set()
    for i, cell in enumerate(nb.cells):
        where = f"{name}, cell {i + 1}"
        meta, src = nbgrader_meta(cell), cell.get("source", "")
        has_solution = bool(_regions(src.split("\n"), BEGIN_SOLUTION, END_SOLUTION, where))
        has_hidden = bool(_regions(src.split("\n"), BEGIN_HIDDEN, END_HIDDEN, where))
        if has_solution != is_solution(cell):
            raise LabError(f"{where}: a cell with '{BEGIN_SOLUTION}' must have nbgrader metadata "
                           f"solution=true, and a solution cell must have a solution region")
        if has_hidden and not is_grade(cell):
            raise LabError(f"{where}: hidden tests belong in a graded check cell")
        if not meta:
            continue
        gid = meta.get("grade_id")
        if not isinstance(gid, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", gid):
            raise LabError(f"{where}: grade_id {gid!r} must be letters, digits, '_' or '-'")
        if gid in seen:
            raise LabError(f"{where}: grade_id {gid!r} is used twice")
        seen.add(gid)
        if meta.get("schema_version") != 3:
            raise LabError(f"{where}: nbgrader schema_version must be 3")
        if is_grade(cell):
            if is_solution(cell) or cell.cell_type != "code":
                raise LabError(f"{where}: a graded check is a code cell and not a solution cell")
            if not isinstance(meta.get("points"), int) or meta["points"] <= 0 or not meta.get("locked"):
                raise LabError(f"{where}: a graded check needs positive integer points and locked=true")
        elif is_solution(cell) and not gid.endswith("-answer"):
            raise LabError(f"{where}: an answer cell's grade_id ends in '-answer' (e.g. '01-collate-answer')")
    if any(is_grade(c) for c in nb.cells) and not any(SETUP_TAG in c.metadata.get("tags", []) for c in nb.cells):
        raise LabError(f"{name}: no cell is tagged {SETUP_TAG!r}; the checks could not be run on their own")


# ----------------------------------------------------------------------------- building labs
def _clean_cell(cell) -> None:
    """Outputs, execution counts and run metadata (papermill, execution timings) removed."""
    if cell.cell_type == "code":
        cell.outputs = []
        cell.execution_count = None
    for key in ("papermill", "execution", "collapsed", "scrolled"):
        cell.metadata.pop(key, None)


def build_lab(lesson, name: str):
    """The student edition of a lesson notebook (a new NotebookNode; the lesson is not changed).

    ``name`` is the lesson's file stem (e.g. "01_sft_from_scratch"), stored in the lab's metadata
    so that the grader can tell which lab a renamed submission is.
    """
    check_contract(lesson, name)
    lab = copy.deepcopy(lesson)
    lab.metadata = nbformat.from_dict({k: v for k, v in lesson.metadata.items() if k in ("kernelspec", "language_info")})
    lab.metadata[LAB_META_KEY] = {"lesson": name[:2], "name": name}
    for i, cell in enumerate(lab.cells):
        _clean_cell(cell)
        where = f"{name}, cell {i + 1}"
        if is_solution(cell):
            cell.source = stub_solutions(cell.source, exercise_of(cell), where)
            cell.metadata["deletable"] = False
        elif is_grade(cell):
            cell.source = remove_hidden_tests(cell.source, where)
            cell.metadata["deletable"] = False
            cell.metadata["editable"] = False
        if is_solution(cell) or is_grade(cell):
            cell.metadata["nbgrader"]["checksum"] = compute_checksum(cell)
    instructions = nbformat.v4.new_markdown_cell(INSTRUCTIONS)
    instructions.id = INSTRUCTIONS_ID
    lab.cells.insert(1 if lab.cells and lab.cells[0].cell_type == "markdown" else 0, instructions)
    nbformat.validate(lab)
    return lab


def lesson_paths(selectors=(), notebooks_dir=NOTEBOOKS_DIR) -> list[Path]:
    """Lessons named by number ('01' or '1') or stem; all of them when none is given."""
    return find_lessons(selectors, notebooks_dir)


def lab_text(lesson_path: Path) -> str:
    """The lab of ``lesson_path`` as the exact text ``build`` writes."""
    lab = build_lab(nbformat.read(lesson_path, as_version=4), Path(lesson_path).stem)
    return nbformat.writes(lab) + "\n"


def build(notebooks_dir=NOTEBOOKS_DIR, labs_dir=LABS_DIR) -> list[Path]:
    """Write ``labs/NN_name.ipynb`` for every lesson; remove labs whose lesson is gone. Returns the paths."""
    labs_dir = Path(labs_dir)
    labs_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for lesson in lesson_paths(notebooks_dir=notebooks_dir):
        target = labs_dir / lesson.name
        text = lab_text(lesson)
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
        written.append(target)
    for old in labs_dir.glob(LESSON_GLOB):
        if old not in written:
            old.unlink()
    return written


def stale(notebooks_dir=NOTEBOOKS_DIR, labs_dir=LABS_DIR) -> list[str]:
    """Why ``labs/`` is out of date with the lessons (an empty list when it is up to date)."""
    labs_dir = Path(labs_dir)
    problems = []
    lessons = lesson_paths(notebooks_dir=notebooks_dir)
    for lesson in lessons:
        target = labs_dir / lesson.name
        if not target.is_file():
            problems.append(f"{target.name}: missing")
        elif target.read_text(encoding="utf-8") != lab_text(lesson):
            problems.append(f"{target.name}: differs from what its lesson builds")
    names = {p.name for p in lessons}
    problems += [f"{p.name}: no lesson of that name" for p in sorted(labs_dir.glob(LESSON_GLOB)) if p.name not in names]
    return problems


def lab_for(lesson_path: Path):
    """The lab of a lesson, built in memory (the grader compares submissions with it)."""
    return build_lab(nbformat.read(lesson_path, as_version=4), Path(lesson_path).stem)


# ----------------------------------------------------------------------------- validation
def validate(selectors=(), invert: bool = False, jobs: int = 1, timeout: int = 300) -> list[dict]:
    """nbgrader's ``validate`` (and ``--invert``) for the lessons named (all by default).

    Runs each lesson's grading notebook (parameters, ``grader-setup`` cells, answer cells, checks)
    with papermill on ``tiny``: with the lesson's own solutions every check must pass; with
    ``invert``, with the lab's stubs, every check must fail with the NotImplementedError that names
    its exercise, and the run must go on to the next check. Returns one dict per lesson:
    ``{"lesson", "ok", "checks": {grade_id: result}, "problems": [str]}``.
    """
    from concurrent.futures import ThreadPoolExecutor

    from utils import grade

    def one(path):
        lesson = nbformat.read(path, as_version=4)
        answers = lab_for(path) if invert else lesson
        gnb, _ = grade.grading_notebook(lesson, answers)
        with tempfile.TemporaryDirectory(prefix="validate-") as tmp:
            run = grade.execute(gnb, Path(tmp), timeout=timeout)
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
        return {"lesson": path.stem, "ok": not problems, "checks": run["checks"], "problems": problems,
                "wall_s": run["wall_s"]}

    paths = lesson_paths(selectors)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, paths))


# ----------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils.labs", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="write labs/ from notebooks/")
    sub.add_parser("check", help="exit 1 when labs/ is out of date")
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
                print(f"labs/{p}")
            if problems:
                print("labs/ is out of date with notebooks/: run `make labs` (python -m utils.labs build) and commit labs/")
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
