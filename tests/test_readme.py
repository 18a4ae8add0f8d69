"""The README as a landing page, and the guides it points to: short, linked, and never behind the lessons."""
import json
import re

import pytest

from utils.constants import LESSON_GLOB, NOTEBOOKS_DIR, REPO_ROOT, TINY_MODEL_DIR
from utils.course import lessons, readme
from utils.headlines import declared
from utils.records import read_records

README = REPO_ROOT / "README.md"
DOCS = [README, REPO_ROOT / "CONTRIBUTING.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HARD_LIMIT_S = 240   # no lesson's tiny run over 4 minutes (the suite's budget rests on it)


def anchors(path) -> set[str]:
    """GitHub's anchors of a markdown file's headings ('## Reproducible `tiny` runs' -> 'reproducible-tiny-runs')."""
    heads = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_the_readme_is_a_landing_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, "README.md is a landing page: move detail to docs/"
    for guide in ("docs/students.md", "docs/instructors.md", "docs/gpu.md", "docs/testing.md", "CONTRIBUTING.md",
                  "LICENSE"):
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


@pytest.mark.parametrize("lesson", sorted(NOTEBOOKS_DIR.glob(LESSON_GLOB)), ids=lambda p: p.name[:2])
def test_every_committed_run_is_inside_its_target(lesson):
    """The committed tiny run took no longer than the target its headline declares, and no lesson's over 4 minutes."""
    records = read_records(lesson)
    wall = lessons.wall_seconds(records)
    target = declared(records)["tiny_target_s"]
    assert wall is not None and target <= HARD_LIMIT_S
    assert wall <= target, f"{lesson.name}: {wall:.0f} s against its target of {target} s"
