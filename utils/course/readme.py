"""The README's table of lessons and the exercise index (docs/exercises.md), written from the lessons themselves
(``make labs`` refreshes both).

Each row: the lesson's title (its header's first line), its lab and its answered notebook, the time its
committed ``tiny`` run took (the notebook's ``NN/wall_seconds`` record), the estimated upper bound on a T4
(``t4-16g``) and an RTX 4090 (``24g``) (:func:`utils.presets.estimate`, docs/gpu.md), and the lab's Colab link.
Nothing in the table is typed by hand, so it cannot fall behind a lesson; ``tests/course/test_readme.py`` holds it to
what this module writes. The exercise index (:func:`exercise_index`) lists every exercise: its lesson section,
the functions it asks for, its graded check and points, the library objects its check and tests compare it with
(derived from their code by :mod:`utils.course.exercise_index`), the test files that exercise those functions, and the
later labs that import its reference answer (so a handout's refusals are predictable).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat

from ..constants import LABS_DIR, NOTEBOOKS_DIR, REPO_ROOT
from ..records import read_records
from . import cells, labs, lessons, solutions
from .exercise_index import NO_LIBRARY, checked_against, read_tests

README = REPO_ROOT / "README.md"
EXERCISES = REPO_ROOT / "docs" / "exercises.md"
START, END = "<!-- lesson table: written by `make labs` (utils/course/readme.py) -->", "<!-- end of lesson table -->"
CARDS = {"t4-16g": "Colab T4", "24g": "RTX 4090"}
NUMBERS = {1: "One", 2: "Two", 3: "Three", 4: "Four", 5: "Five", 6: "Six", 7: "Seven", 8: "Eight", 9: "Nine",
           10: "Ten", 11: "Eleven", 12: "Twelve"}


def title(lesson: Path) -> str:
    """'Reward models, PPO with a critic, ...' from the header's first line '# Lesson 07 — Reward models, ...'."""
    first = nbformat.read(lesson, as_version=4).cells[0].source.splitlines()[0]
    match = re.match(r"# Lesson \d\d\s*[—-]\s*(.+)", first)
    if not match:
        raise ValueError(f"{lesson.name}: its header's first line is not '# Lesson NN — title': {first!r}")
    return match[1].strip()


def count_word(n: int | None = None) -> str:
    """'Nine' for the nine lessons of notebooks/ (the README's first sentence)."""
    n = len(labs.lesson_paths()) if n is None else n
    return NUMBERS.get(n, str(n))


def lesson_table(repo: str | None = None) -> str:
    """The README's lesson table (markdown, between :data:`START` and :data:`END`)."""
    from .. import presets  # here: it imports torch

    repo = labs.course_repo(repo)
    rows = ["| # | lesson (the lab to open; the answers in `notebooks/`) | `tiny`, CPU | "
            + " | ".join(f"{card} (`{p}`)" for p, card in CARDS.items()) + " | |",
            "| --- | --- | ---: | " + " | ".join("---:" for _ in CARDS) + " | --- |"]
    for path in labs.lesson_paths():
        number = lessons.lesson_number(path)
        wall = lessons.wall_seconds(read_records(path))
        tiny = lessons.duration(wall) if wall is not None else "not run"
        gpus = [f"≤ {presets.estimate(p, number)['minutes']:.0f} min" for p in CARDS]
        colab = labs.COLAB_BADGE.format(repo=repo, name=path.stem)
        lab = (LABS_DIR / path.name).relative_to(REPO_ROOT).as_posix()
        notebook = (NOTEBOOKS_DIR / path.name).relative_to(REPO_ROOT).as_posix()
        rows.append(f"| {number} | [{title(path)}]({lab}) ([answers]({notebook})) | {tiny} | "
                    + " | ".join(gpus) + f" | {colab} |")
    return "\n".join([START, *rows, END])


def refreshed(text: str, repo: str | None = None) -> str:
    """``text`` (the README) with its lesson table and its count of lessons rewritten."""
    if START not in text or END not in text:
        raise ValueError(f"README.md has no lesson table markers ({START} ... {END})")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    head = re.sub(r"\b(One|Two|Three|Four|Five|Six|Seven|Eight|Nine|Ten|Eleven|Twelve|\d+) Jupyter lessons",
                  f"{count_word()} Jupyter lessons", head, count=1)
    return head + lesson_table(repo) + tail


def refresh(path: Path = README, repo: str | None = None) -> bool:
    """Rewrite ``path``'s lesson table; True when it changed."""
    text = path.read_text(encoding="utf-8")
    new = refreshed(text, repo)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def exercises(lesson: Path) -> list[dict]:
    """``[{"exercise", "section", "functions", "check", "points", "what"}]`` for a lesson's answer cells, in order."""
    found, section = [], ""
    nb = nbformat.read(lesson, as_version=4)
    checks = {cells.grade_id(c): c for c in nb.cells if cells.is_check(c)}
    for c in nb.cells:
        if c.cell_type == "markdown":
            section = next((line[3:].strip() for line in reversed(c.source.splitlines()) if line.startswith("## ")),
                           section)
        elif cells.is_answer(c):
            name = cells.exercise_of(c)
            tree = ast.parse(solutions.answer_source(c))
            check = checks.get(name)
            what = check.source.splitlines()[0].removeprefix(cells.CHECK_HEAD).strip() if check is not None else ""
            found.append({"exercise": name, "section": section.replace("`", ""), "check": name if check else "",
                          "functions": [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))],
                          "points": check.metadata.nbgrader["points"] if check is not None else 0, "what": what})
    return found


def _users(paths: list[Path]) -> dict[tuple[str, str], list[str]]:
    """``{(lessonNN, function): [lab numbers that import it]}``."""
    users: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        for module, _, names in solutions.needed_answers(labs.lab_for(path)):
            for name in names:
                users.setdefault((module, name), []).append(lessons.lesson_number(path))
    return users


def exercise_index(student: bool = False, selected: list[Path] | None = None) -> str:
    """docs/exercises.md (markdown): every exercise of the lessons (``selected``: those lessons only), with what it is
    checked against (:mod:`utils.course.exercise_index`). ``student``: the handout's version, without the course's
    test files (a handout holds none); its "checked against" is what the graded check alone compares with, the check
    that grades the student's answer (the course's tests check the reference answer, which the student has not)."""
    paths = selected or labs.lesson_paths()
    users = _users(labs.lesson_paths())
    sources = read_tests() if not student else ({}, {})
    checkers = "graded check (hidden tests included) calls to compare your answer with" if student else \
        "graded check (hidden tests included) and the course's tests of those functions call to compare them with"
    tests = {p.relative_to(REPO_ROOT).as_posix(): p.read_text(encoding="utf-8")
             for p in sorted((REPO_ROOT / "tests").rglob("test_*.py"))} if not student else {}
    lines = ["# Exercises", "",
             "Every exercise of the labs, in order. Each asks for the functions named, in its answer cell; the graded "
             "check right after it gives the points (the grader re-runs it with hidden tests, which the check names). "
             f"*Checked against* names the library objects that the {checkers}, as found in the code (TRL, PEFT, "
             f"bitsandbytes, transformers, verl, PyTorch's losses); \"{NO_LIBRARY}\" where there are none. "
             "A lesson's reference answers are `utils/solutions/lessonNN.py` (not in a student's handout while its lab "
             "is graded); a later lab that imports one waits until that lesson's answers may be seen. "
             "Written by `make labs` from the lessons.", ""]
    for path in paths:
        number = lessons.lesson_number(path)
        columns = ["exercise", "section", "write", "graded check", "points", "checked against",
                   *([] if student else ["its answer tested in"]), "imported by labs"]
        lines += [f"## Lesson {number}: {title(path)}", "", "| " + " | ".join(columns) + " |",
                  "| " + " | ".join("---:" if c == "points" else "---" for c in columns) + " |"]
        found = exercises(path)
        against = checked_against(path, found, sources)
        for e in found:
            later = sorted({lab for f in e["functions"] for lab in users.get((f"lesson{number}", f), [])}
                           | set(users.get((f"lesson{number}", "*"), [])))
            imports = re.compile(rf"^\s*from utils\.solutions(\.lesson{number} import| import lesson{number}\b)", re.M)
            where = sorted(name for name, text in tests.items() if imports.search(text)
                           and any(re.search(rf"\b{re.escape(f)}\b", text) for f in e["functions"]))
            row = [f"`{e['exercise']}`", e["section"], ", ".join(f"`{f}`" for f in e["functions"]),
                   e["what"] or "-", str(e["points"]), against[e["exercise"]]]
            if not student:
                row.append(", ".join(f"`{w}`" for w in where) or "-")
            row.append(", ".join(later) or "-")
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils readme", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the README's table is out of date")
    args = parser.parse_args(argv)
    index = exercise_index()
    if args.check:
        stale = refreshed(README.read_text(encoding="utf-8")) != README.read_text(encoding="utf-8")
        stale = stale or not EXERCISES.is_file() or EXERCISES.read_text(encoding="utf-8") != index
        print("README.md or docs/exercises.md is out of date: run `make labs`" if stale else "both are up to date")
        return 1 if stale else 0
    print("rewrote README.md's lesson table" if refresh() else "README.md's lesson table is up to date")
    if not EXERCISES.is_file() or EXERCISES.read_text(encoding="utf-8") != index:
        EXERCISES.write_text(index, encoding="utf-8")
        print("rewrote docs/exercises.md")
    return 0
