"""The README as a landing page, and the guides it points to: short, linked, and never behind the lessons.

(A lesson's time against its target is not asserted here: it depends on the hour the run was made. `make run`'s
summary and summary.png show it, as the docs/testing.md budget table shows the suite's.)"""
import json
import re

import pytest

from utils.constants import LESSON_GLOB, NOTEBOOKS_DIR, REPO_ROOT, TINY_MODEL_DIR
from utils.course import readme

README = REPO_ROOT / "README.md"
DOCS = [README, REPO_ROOT / "CONTRIBUTING.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path) -> set[str]:
    """GitHub's anchors of a markdown file's headings ('## Reproducible `tiny` runs' -> 'reproducible-tiny-runs')."""
    heads = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_the_readme_is_a_landing_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, "README.md is a landing page: move detail to docs/"
    for guide in ("docs/students.md", "docs/instructors.md", "docs/gpu.md", "docs/testing.md", "docs/exercises.md",
                  "CONTRIBUTING.md", "LICENSE"):
        assert f"]({guide})" in text, f"the README does not link {guide}"
    assert (REPO_ROOT / "LICENSE").read_text().startswith("MIT License")
    parameters = json.loads((TINY_MODEL_DIR / "manifest.json").read_text())["parameters"]
    assert f"{parameters / 1e6:.1f} M-parameter" in text, "the tiny model's size, as its manifest gives it"


def test_the_lesson_table_and_count_are_the_lessons():
    """`make labs` writes them; a lesson added, renamed or re-timed without it fails here."""
    text = README.read_text(encoding="utf-8")
    assert readme.refreshed(text) == text, "README.md's lesson table is out of date: run `make labs`"
    n = len(list(NOTEBOOKS_DIR.glob(LESSON_GLOB)))
    assert f"{readme.count_word(n)} Jupyter lessons" in text
    assert text.count("](labs/") == n and text.count("colab.research.google.com/github/") == n


def test_the_exercise_index_is_the_lessons():
    """docs/exercises.md is what `make labs` writes: every exercise once, with its check's points; the student's
    version (in a handout) names no test file."""
    text = (REPO_ROOT / "docs" / "exercises.md").read_text(encoding="utf-8")
    assert text == readme.exercise_index(), "docs/exercises.md is out of date: run `make labs`"
    every = [e for p in sorted(NOTEBOOKS_DIR.glob(LESSON_GLOB)) for e in readme.exercises(p)]
    assert all(text.count(f"| `{e['exercise']}` |") == 1 and e["points"] > 0 for e in every)
    assert "| `04-group-advantages` | 3. Group-relative advantages | `group_advantages` | group-relative advantages | " \
           "3 | `tests/library/test_rl.py`, `tests/side/test_verl.py` | 05, 07 |" in text
    student = readme.exercise_index(student=True)
    assert "tests/" not in student and "| `04-group-advantages` |" in student


def test_the_table_is_written_from_a_lessons_header_and_records(tmp_path):
    marked = f"Two Jupyter lessons\n\n{readme.START}\nold\n{readme.END}\nrest\n"
    new = readme.refreshed(marked)
    assert new.startswith(f"{readme.count_word()} Jupyter lessons") and new.endswith("\nrest\n")
    assert "| 04 | [GRPO with verifiable rewards](labs/04_grpo.ipynb)" in new
    with pytest.raises(ValueError, match="markers"):
        readme.refreshed("no table here")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_relative_link_resolves(doc):
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.exists(), f"{doc.name} links {target}, which does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{doc.name} links {target}: no such heading in {dest.name}"


def test_every_make_command_the_docs_show_exists():
    targets = set(re.findall(r"^([\w-]+):", (REPO_ROOT / "Makefile").read_text(), re.M))
    for doc in DOCS:
        for name in re.findall(r"`make ([\w-]+)", doc.read_text(encoding="utf-8")):
            assert name in targets, f"{doc.name} shows `make {name}`, which the Makefile does not have"
