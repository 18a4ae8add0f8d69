"""The exercise contract in a notebook's cells, as nbgrader reads it (``docs/notebook-contract.md``).

- an **answer cell** has ``nbgrader`` metadata ``{"solution": true, "grade": false, ...}`` and its
  solution between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
- a **graded check** has ``{"grade": true, "solution": false, "locked": true, "points": n, ...}``;
  instructor-only lines go between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``;
- a **written question** is a markdown cell with ``{"grade": true, "solution": true, "locked": false,
  "points": n, ...}`` and a grade_id ``<lesson>-written-<topic>``, right after the markdown cell that asks
  it: its source is the instructor's marking guide, which the student edition replaces by
  nbgrader's ``YOUR ANSWER HERE``; the instructor marks it by hand (``grade`` collects the answers);
- cells tagged ``grader-setup`` are what the checks need besides the answers.

This module reads and rewrites such cells (checksums, stubs, hidden tests); ``labs`` builds the
student editions with it and ``grading`` re-runs answers and checks.
"""
from __future__ import annotations

import hashlib
import re

from ..constants import CHECK_HEAD, LOCKED_CHECK_HEAD, SETUP_TAG, STUB_MESSAGE

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
TEXT_STUB = "YOUR ANSWER HERE"   # nbgrader's ClearSolutions.text_stub: what a written answer starts as


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


def is_check(cell) -> bool:
    """An automatically graded check: a code cell with ``grade`` true and ``solution`` false."""
    return cell.get("cell_type") == "code" and is_grade(cell) and not is_solution(cell)


def is_answer(cell) -> bool:
    """An answer cell of code (its solution region becomes the stub), checked by the checks after it."""
    return cell.get("cell_type") == "code" and is_solution(cell) and not is_grade(cell)


def is_written(cell) -> bool:
    """A written question's answer cell (markdown, ``grade`` and ``solution`` true), marked by hand."""
    return cell.get("cell_type") == "markdown" and is_grade(cell) and is_solution(cell)


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


# ----------------------------------------------------------------------------- source rewriting
# Lines that only the project's CI reads (nbval's regression marker): a student edition leaves them out.
TOOLING_MARKERS = ("# NBVAL_CHECK_OUTPUT",)


def strip_tooling_markers(source: str) -> str:
    """``source`` without its lines that are only a test-tooling marker (:data:`TOOLING_MARKERS`)."""
    return "\n".join(line for line in source.split("\n") if line.strip() not in TOOLING_MARKERS)


def as_in_lab(check_source: str) -> str:
    """A check's source with its first line as the lab shows it (:data:`LOCKED_CHECK_HEAD`): a lab's check, and a
    check released some other way (by nbgrader, from the lesson), compare the same."""
    return LOCKED_CHECK_HEAD + check_source[len(CHECK_HEAD):] if check_source.startswith(CHECK_HEAD) else check_source


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
        message = STUB_MESSAGE.format(exercise=exercise, what=what)
        out += lines[last:begin] + [f"{indent}# YOUR CODE HERE",
                                     f"{indent}raise NotImplementedError({message!r})"]
        last = end + 1
    return "\n".join(out + lines[last:])


def hidden_parts(source: str, where: str = "cell") -> list[list]:
    """``[first line, end line, hidden]`` of each part of a check's ``source`` between the hidden-test markers (the
    marker lines belong to no part), in order; LabError when unbalanced."""
    lines, parts, start = source.split("\n"), [], 0
    for begin, end in _regions(lines, BEGIN_HIDDEN, END_HIDDEN, where):
        parts += [[start, begin, False], [begin + 1, end, True]]
        start = end + 1
    return parts + [[start, len(lines), False]]


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
def _check_written(nb, index: int, where: str, has_markers: bool) -> None:
    """LabError unless the written question at ``nb.cells[index]`` keeps the contract."""
    meta = nbgrader_meta(nb.cells[index])
    if has_markers:
        raise LabError(f"{where}: a written question's cell is its marking guide as a whole, without "
                       "solution or hidden-test markers")
    if "-written-" not in str(meta.get("grade_id", "")):
        raise LabError(f"{where}: a written question's grade_id reads '<lesson>-written-<topic>' "
                       "(e.g. '04-written-kl')")
    if not isinstance(meta.get("points"), int) or meta["points"] <= 0 or meta.get("locked"):
        raise LabError(f"{where}: a written question needs positive integer points and locked=false")
    if index == 0 or nb.cells[index - 1].cell_type != "markdown" or is_written(nb.cells[index - 1]):
        raise LabError(f"{where}: a written question's answer cell comes right after the markdown cell that asks it")


def question_of(nb, index: int) -> str:
    """The text of the question that the written answer cell ``nb.cells[index]`` answers."""
    return nb.cells[index - 1].source


def check_contract(nb, name: str = "lesson") -> None:
    """Raise LabError when a lesson breaks the exercise contract.

    Every code cell with a solution region is an answer cell and vice versa; grade_ids are unique
    and nbgrader-valid; every check has integer points, is locked and is not also a solution cell;
    every written question follows the markdown cell asking it, has points and no markers; hidden
    tests sit only in checks; markers are balanced; at least one cell is tagged ``grader-setup``
    when the lesson has checks.
    """
    seen = set()
    for i, cell in enumerate(nb.cells):
        where = f"{name}, cell {i + 1}"
        meta, src = nbgrader_meta(cell), cell.get("source", "")
        has_solution = bool(_regions(src.split("\n"), BEGIN_SOLUTION, END_SOLUTION, where))
        has_hidden = bool(_regions(src.split("\n"), BEGIN_HIDDEN, END_HIDDEN, where))
        if is_written(cell):
            _check_written(nb, i, where, has_solution or has_hidden)
        elif has_solution != is_solution(cell):
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
        if is_written(cell):
            continue
        if is_grade(cell):
            if is_solution(cell) or cell.cell_type != "code":
                raise LabError(f"{where}: a graded check is a code cell and not a solution cell "
                               "(a written question is a markdown cell with grade and solution true)")
            if not isinstance(meta.get("points"), int) or meta["points"] <= 0 or not meta.get("locked"):
                raise LabError(f"{where}: a graded check needs positive integer points and locked=true")
        elif is_solution(cell) and (cell.cell_type != "code" or not gid.endswith("-answer")):
            raise LabError(f"{where}: an answer cell is a code cell whose grade_id ends in '-answer' "
                           "(e.g. '01-collate-answer')")
    if any(is_check(c) for c in nb.cells) and not any(SETUP_TAG in c.metadata.get("tags", []) for c in nb.cells):
        raise LabError(f"{name}: no cell is tagged {SETUP_TAG!r}; the checks could not be run on their own")
