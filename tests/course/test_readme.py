"""The README as a landing page, and the guides it points to: short, linked, and never behind the lessons.

(A lesson's time against its target is not asserted here: it depends on the hour the run was made. `make run`'s
summary and summary.png show it, as the docs/testing.md budget table shows the suite's.)"""
import json
import re

import pytest

from utils.constants import LESSON_GLOB, NOTEBOOKS_DIR, REPO_ROOT, TINY_MODEL_DIR
from utils.course import exercise_index, readme

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
           "3 | TRL (`GRPOTrainer`); verl (`compute_grpo_outcome_advantage`) | `tests/library/test_rl.py`, " \
           "`tests/side/test_verl.py` | 05, 07 |" in text
    # the student's version: what the graded check alone compares with (here values worked out in the check)
    student = readme.exercise_index(student=True)
    assert "tests/" not in student and "| `04-group-advantages` | 3. Group-relative advantages | `group_advantages` | " \
        f"group-relative advantages | 3 | {exercise_index.NO_LIBRARY} | 05, 07 |" in student
    assert "| `02-loss-mask` |" in student and "| TRL (`SFTTrainer`) |" in student   # a setup cell's SFTTrainer


# A made-up lesson and test file whose answers are known: what "checked against" derives from code.
SETUP = """from transformers import AutoModelForCausalLM
from trl import SFTTrainer, DataCollatorForLanguageModeling
model = AutoModelForCausalLM.from_pretrained("tiny")        # an input, not a reference
def prepared(rows):                                         # a setup cell's helper: what it calls counts
    return SFTTrainer(model=model, train_dataset=rows).train_dataset
batch = DataCollatorForLanguageModeling(pad_token_id=0)([1])
"""
ANSWER = "import torch.nn.functional as F\ndef answer(x):\n    return x\n"


@pytest.mark.parametrize("check, want", [
    ("rows = prepared([1])\nassert answer(rows) == rows\n### BEGIN HIDDEN TESTS\n"
     "assert answer(1) == F.cross_entropy(1, 1)\n### END HIDDEN TESTS\n",
     {("TRL", "SFTTrainer"), ("PyTorch", "F.cross_entropy")}),            # through a setup helper; a hidden test
    ("batch = [1]\nassert answer(batch) == [1]\n", set()),                 # its own batch, not the setup cell's
    ("assert answer(batch) == batch\n", {("TRL", "DataCollatorForLanguageModeling")}),   # the setup cell's batch
    ("saved = DataCollatorForLanguageModeling\nassert F.relu(answer(1)) == 1\n", set()),  # named, not called; relu
], ids=["setup-helper-and-hidden-test", "own-batch", "setup-batch", "named-not-called"])
def test_checked_against_follows_a_check_into_its_setup_cells(check, want):
    assert exercise_index.check_references(check, [SETUP], [ANSWER]) == want


TESTS = """import pytest
import torch.nn.functional as F
from trl import DPOConfig, DPOTrainer, GRPOTrainer
from ANSWERS import lesson03 as l03
from ANSWERS.lesson04 import k3_kl, group_advantages

CHECKER = "check_side.py"

@pytest.fixture
def trainer():
    return DPOTrainer(args=DPOConfig(beta=0.1))

def by_torch(x):
    return F.cross_entropy(x, x)

def test_against_trl(trainer):
    assert l03.dpo_loss(1) == trainer.compute_loss()

def test_by_hand():
    assert l03.kto_loss(1) == 0.5
    assert GRPOTrainer is not None

def test_through_a_helper():
    assert l03.sequence_logps(2) == by_torch(2)

def test_side_script():
    out = run(CHECKER)
    ours = k3_kl(1)
    close(ours, out["kl"])
    close(rloo(1), out["rloo"])

def test_something_else():
    GRPOTrainer(args=None)
""".replace("ANSWERS", "utils.solutions")   # written so, the index does not list this file as testing the answers
SCRIPT = """from verl.trainer.ppo import core_algos

def main():
    adv, _ = core_algos.compute_rloo_outcome_advantage(1)
    out = {}
    out["rloo"] = adv.tolist()
    kl = core_algos.kl_penalty(1, 2, "low_var_kl")
    out["kl"] = kl.tolist()
"""


@pytest.mark.parametrize("function, want", [
    ("lesson03.dpo_loss", "TRL (`DPOTrainer`)"),                  # its fixture's trainer; DPOConfig is an input
    ("lesson03.kto_loss", exercise_index.NO_LIBRARY),             # GRPOTrainer is named in its test, not called
    ("lesson03.sequence_logps", "PyTorch (`F.cross_entropy`)"),    # through a helper of the file
    ("lesson04.k3_kl", "verl (`kl_penalty`)"),                    # the script's out["kl"], not out["rloo"]
    ("lesson04.group_advantages", exercise_index.NO_LIBRARY),     # imported, never tested
], ids=["fixture", "named-not-called", "helper", "side-script-key", "untested"])
def test_checked_against_is_per_test_function(function, want):
    found = exercise_index.tested_against(TESTS, {f"utils.solutions.{function}"}, {"check_side.py": SCRIPT})
    assert exercise_index.describe(found) == want


def test_what_counts_as_a_reference():
    assert exercise_index.library_object("trl.DPOTrainer.compute_loss") == ("TRL", "DPOTrainer")
    assert exercise_index.library_object("bitsandbytes.functional.quantize_4bit") == ("bitsandbytes", "quantize_4bit")
    assert exercise_index.library_object("torch.nn.functional.cross_entropy") == ("PyTorch", "F.cross_entropy")
    for not_one in ("torch.nn.functional.relu", "torch.nn.utils.clip_grad_norm_", "torch.softmax",
                    "transformers.AutoModelForCausalLM.from_pretrained", "peft.LoraConfig", "trl.GRPOConfig",
                    "transformers.Trainer", "utils.sft.tokenize_sft_example"):
        assert exercise_index.library_object(not_one) is None, not_one
    assert exercise_index.describe({("verl", "b"), ("TRL", "z"), ("verl", "a"), ("verl", "c"), ("verl", "d")}) == \
        "TRL (`z`); verl (`a`, `b`, `c`, ...)"


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
