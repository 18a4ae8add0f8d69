"""docs/instructors.md, as written: its checklist run (hand out, collect, grade, mark the written answers, grade
again; only the folders are moved to a temporary place, so that nothing is written beside the repository), and
every other `make` or `python -m utils` command it shows accepted as typed, without running it."""
import argparse
import contextlib
import csv
import io
import os
import re
import shlex
import subprocess
from unittest import mock

import nbformat
import pytest

import utils.__main__
from utils.constants import REPO_ROOT
from utils.course import cells

GUIDE = REPO_ROOT / "docs" / "instructors.md"
MAKEFILE = REPO_ROOT / "Makefile"
pytestmark = pytest.mark.slow


def checklist_commands() -> list[list[str]]:
    """The `make ...` commands of the guide's step-by-step list (before its first section of detail)."""
    steps = GUIDE.read_text(encoding="utf-8").split("\n\nEach lesson has", 1)[0]
    return [shlex.split(c) for c in re.findall(r"`(make (?:handout|grade) [^`]+)`", steps)]


def make(args, **kwargs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    env.update(kwargs.pop("env", {}))
    return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, **kwargs)


def grade_rows(grades) -> list[dict]:
    with (grades / "grades.csv").open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def type_marks(grades, student: str, marks: dict[str, str]) -> None:
    """Type marks into a student's row of ``grades.csv``, as an instructor does in a spreadsheet (a column that is
    not there is an error, every other cell stays as it is)."""
    with (grades / "grades.csv").open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    for row in rows:
        if row["student"] == student:
            row.update(marks)
    with (grades / "grades.csv").open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, reader.fieldnames, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def test_the_checklist_runs_as_written(tmp_path):
    """Steps 1-5 with the guide's own `make` commands: the handout holds the lab and its README; a submission gets
    its row in `week4-submissions-grades/grades.csv`, its unanswered written questions 0 and no total yet; the marks
    typed into the questions' columns (one over the grader's 0) survive the same `make grade` run again,
    `manual_points` is then filled in and the feedback file the row names shows each mark and the total."""
    handout, grading = checklist_commands()
    assert handout[:2] == ["make", "handout"] and grading[:2] == ["make", "grade"], (handout, grading)
    where = {"../week4": tmp_path / "week4", "week4-submissions": tmp_path / "week4-submissions"}
    moved = [[f"{a.split('=')[0]}={where[a.split('=', 1)[1]]}" if "=" in a and a.split("=", 1)[1] in where else a
              for a in cmd] for cmd in (handout, grading)]

    done = make(moved[0])
    assert done.returncode == 0, done.stdout + done.stderr
    week4 = tmp_path / "week4"
    assert (week4 / "labs" / "04_grpo.ipynb").is_file() and (week4 / "README.md").is_file()   # step 1's promise

    subs = tmp_path / "week4-submissions"   # step 2: a student hands the lab back under their name, one question
    subs.mkdir()                            # answered (a markdown cell with its grade id), nothing else done
    lab = nbformat.read(week4 / "labs" / "04_grpo.ipynb", as_version=4)
    questions = [c for c in lab.cells if cells.is_written(c)]
    answered, *blank = [cells.grade_id(c) for c in questions]
    points = {cells.grade_id(c): cells.nbgrader_meta(c)["points"] for c in questions}
    questions[0].source = "The reward rose while the answers got shorter."
    nbformat.write(lab, subs / "ann.ipynb")
    done = make(moved[1])
    assert done.returncode == 0, done.stdout + done.stderr
    grades = tmp_path / "week4-submissions-grades"   # step 3: where the guide says the marks go
    (row,) = grade_rows(grades)
    assert row["student"] == "ann" and row["auto_points"] == "0" and "not-attempted" in row["flags"]
    assert row[answered] == "" and all(row[g] == "0" and f"unanswered:{g}" in row["flags"].split() for g in blank), \
        "step 4: an unanswered written question is 0 already, flagged"
    assert row["manual_points"] == "", "no total while a question has no mark"
    assert "The reward rose" in (grades / "written.md").read_text(encoding="utf-8")   # step 4: what to mark
    assert " in all" not in (grades / row["feedback"]).read_text(encoding="utf-8")

    type_marks(grades, "ann", {answered: "2", blank[0]: "1"})   # step 4: marks typed in, then grade again
    done = make(moved[1])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the judge's result of the last run, reused" in done.stdout, "an unchanged notebook is not judged again"
    (row,) = grade_rows(grades)
    assert (row[answered], row[blank[0]], row[blank[1]]) == ("2", "1", "0"), "the marks typed are kept"
    assert f"unanswered:{blank[0]}" not in row["flags"].split() and f"unanswered:{blank[1]}" in row["flags"].split()
    manual_max = sum(points.values())
    assert (row["manual_points"], row["manual_max"]) == ("3", str(manual_max)), "filled in: every question has a mark"
    feedback = (grades / row["feedback"]).read_text(encoding="utf-8")   # step 5: the file the row names
    shown = dict(re.findall(r"^- (\S+): .*; \*\*(\S+) / \d+\*\*$", feedback, re.M))
    assert shown == {answered: "2", blank[0]: "1", blank[1]: "0"}, feedback
    auto_max = int(row["auto_max"])
    assert (f"**Score: 0 / {auto_max}** for the graded checks, **3 / {manual_max}** for the written questions: "
            f"3 / {auto_max + manual_max} in all") in feedback


class Parsed(Exception):
    """Raised instead of running a command, once its parser has accepted the arguments (``args[0]``: what it read)."""


def parsed(argv: list[str]) -> argparse.Namespace:
    """What `python -m utils ARGV` reads from its command line, by the command's own parser; the command is not run
    (the first ``parse_args`` that returns raises :class:`Parsed`). A refused argument fails, with argparse's
    message (an option shortened counts as refused); so does a command that reads no arguments."""
    parse_args = argparse.ArgumentParser.parse_args

    def no_abbreviations(parser):   # the guide names an option in full: a renamed `--memory-gib` fails `--memory`
        parser.allow_abbrev = False
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    no_abbreviations(sub)

    def parse_and_stop(parser, args=None, namespace=None):
        no_abbreviations(parser)
        raise Parsed(parse_args(parser, args, namespace))

    said = io.StringIO()
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_and_stop), \
            contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
        try:
            status = utils.__main__.main(argv)
        except Parsed as stop:
            return stop.args[0]
        except SystemExit as e:
            status = e.code
    pytest.fail(f"`python -m utils {shlex.join(argv)}` (exit {status}) was refused: {said.getvalue()[-600:]}")


COMMAND = re.compile(r"(?:[A-Z_][A-Z0-9_]*=\S+ +)*(make|python -m utils) ")   # after the NAME=value it sets


def guide_commands(text: str) -> list[tuple[str, ...]]:
    """Every `make ...` and `python -m utils ...` command in the guide's inline code and ```bash blocks, as words
    (the `NAME=value` words that set its environment first). A `# comment` after a command is not part of it; a
    comment that is itself a command is one more, and the `--option value`s another comment names after a
    `python -m utils` command (`# the same; --jobs 2, --timeout 180`) are added to that command."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    inline = re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    found = []
    for line in [" ".join(code.split()) for code in inline] + [ln for b in blocks for ln in b.splitlines()]:
        code, _, comment = (part.strip() for part in line.partition("#"))
        if not (kind := COMMAND.match(code + " ")):
            continue
        found.append(shlex.split(code))
        if COMMAND.match(comment + " "):
            found.append(shlex.split(comment))
        elif kind.group(1) != "make":
            found[-1] += [w for option in re.findall(r"--[\w-]+(?: \w+)?", comment) for w in option.split()]
    return list(dict.fromkeys(map(tuple, found)))


def check(words: list[str]) -> None:
    """Check one of the guide's commands without running it: a `make` target the Makefile has, which `make -n`
    accepts (the `python -m utils` lines it prints are then parsed in their turn); a `python -m utils` command whose
    parser accepts the arguments, or, named without arguments (or with `...`) in a sentence, a command that exists."""
    env = {}
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words[0].partition("=")
        env[name], words = value, words[1:]
    if words[0] == "make":
        target = next(w for w in words[1:] if "=" not in w)
        assert re.search(rf"^{re.escape(target)}:", MAKEFILE.read_text(encoding="utf-8"), re.M), \
            f"the Makefile has no target {target!r}"
        dry = make(["make", "-n", *words[1:]], env=env)
        assert dry.returncode == 0, f"`{shlex.join(words)}`: make -n failed: {dry.stdout + dry.stderr}"
        for line in re.findall(r"^\S*python\S* -m utils (.+)$", dry.stdout, re.M):
            parsed(shlex.split(line))
        return
    argv = words[3:]
    assert argv, f"`{shlex.join(words)}` names no command"
    if len(argv) < 2 or "..." in argv:
        assert argv[0] in utils.__main__.COMMANDS, f"`python -m utils {argv[0]}` is no command"
    else:
        parsed(argv)


def test_every_command_of_the_guide_is_accepted_as_written():
    """Every `make` and `python -m utils` command the guide shows, checked as typed without running anything:
    `make -n` on a target the Makefile has (and the `python -m utils` lines it would run, by their parsers), the
    `python -m utils` ones by the parser of the command they name (a renamed or removed option fails)."""
    makefile = MAKEFILE.read_text(encoding="utf-8")
    assert not re.search(r"\$[({](shell|MAKE)\b|^\t[@-]*\+", makefile, re.M), \
        "`make -n` runs $(shell ...), $(MAKE) and `+` lines: this test would run them"
    commands = guide_commands(GUIDE.read_text(encoding="utf-8"))
    assert len(commands) >= 10, commands   # the guide's checklist, its `make` and `python -m utils` examples
    for words in commands:
        check(list(words))
