"""The README's table of lessons, written from the lessons themselves (``make labs`` refreshes it).

Each row: the lesson's title (its header's first line), its lab and its answered notebook, the time its
committed ``tiny`` run took (the notebook's ``NN/wall_seconds`` record), the estimated upper bound on a T4
(``t4-16g``) and an RTX 4090 (``24g``) (:func:`utils.presets.estimate`, docs/gpu.md), and the lab's Colab link.
Nothing in the table is typed by hand, so it cannot fall behind a lesson; ``tests/test_readme.py`` holds it to
what this module writes.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

from ..constants import LABS_DIR, NOTEBOOKS_DIR, REPO_ROOT
from ..records import read_records
from . import labs, lessons

README = REPO_ROOT / "README.md"
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


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils readme", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the README's table is out of date")
    args = parser.parse_args(argv)
    if args.check:
        stale = refreshed(README.read_text(encoding="utf-8")) != README.read_text(encoding="utf-8")
        print("README.md's lesson table is out of date: run `make labs`" if stale else "README.md is up to date")
        return 1 if stale else 0
    print("rewrote README.md's lesson table" if refresh() else "README.md's lesson table is up to date")
    return 0
