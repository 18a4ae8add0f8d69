"""utils.course.handout: a student repository without the withheld answers, in which every lab still works."""
import re
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from utils.constants import REPO_ROOT, UTILS_DIR
from utils.course import handout, labs
from utils.course.labs import lesson_paths

WITHHOLD, LABS = ["04"], ["01", "02", "03", "04", "06"]   # week 4: lab 05 needs lesson 04's answers, so it waits


@pytest.fixture(scope="module")
def week4(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("handout") / "week4"
    report = handout.build(out, WITHHOLD, LABS)
    assert report["withheld"] == ["04_grpo"] and len(report["labs"]) == 5
    return out


def test_refuses_a_lab_that_needs_a_withheld_answer(tmp_path):
    with pytest.raises(handout.HandoutError) as err:
        handout.build(tmp_path / "out", withhold=["04"])
    message = str(err.value)
    assert "lab 05_beyond_grpo" in message and "group_advantages (exercise 04-group-advantages)" in message
    assert "utils.solutions.lesson04" in message and "--labs 01 02 03 04 06" in message
    assert not (tmp_path / "out").exists(), "a refused handout writes nothing"


def test_the_docstrings_usage_examples_plan_without_a_refusal():
    """Each `python -m utils handout` line of handout.py's usage is accepted as written (the example withholding 04
    with every lab was refused once: labs 05 and 07 import lesson 04's answers)."""
    def values(words, flag):
        if flag not in words:
            return None
        rest = words[words.index(flag) + 1:]
        return rest[:next((i for i, w in enumerate(rest) if w.startswith("--")), len(rest))]

    commands = [line.split("#")[0].split() for line in handout.__doc__.splitlines()
                if line.strip().startswith("python -m utils handout")]
    assert len(commands) >= 2
    for words in commands:
        included, withheld = handout._plan(values(words, "--withhold") or [], values(words, "--labs"))
        assert included and withheld, words


def test_refuses_to_write_into_the_repository_or_over_a_folder(tmp_path):
    with pytest.raises(handout.HandoutError, match="inside the course repository"):
        handout.build(REPO_ROOT / "handout", withhold=["01"], labs=["01"])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    with pytest.raises(handout.HandoutError, match="--force"):
        handout.build(tmp_path / "full", withhold=["01"], labs=["01"])
    assert (tmp_path / "full" / "x").read_text() == "mine"


def test_what_a_handout_holds(week4):
    files = {p.relative_to(week4).as_posix() for p in week4.rglob("*") if p.is_file()}
    assert {f"labs/{p.name}" for p in lesson_paths(LABS)} == {f for f in files if f.startswith("labs/")}
    assert {"README.md", "requirements.txt", "environment.yml", "utils/records.py", "utils/course/run.py",
            "utils/assets/tiny-qwen/model.safetensors", "utils/solutions/lesson03.py",
            "docs/students.md", "docs/gpu.md", "docs/exercises.md"} <= files   # the guide the labs' headers link
    assert "utils/solutions/lesson04.py" not in files
    assert not files & {"utils/solutions/lesson05.py", "utils/solutions/lesson07.py"}, \
        "no later lab's answers (lesson 07's gradient_coefficients computes lesson 04's group advantages)"
    assert "utils/course/kernel.py" in files, "the runner's own imports come along"
    assert "utils/ppo.py" not in files, "no lab of week 4 imports it (its policy_loss is lesson 04's clipped surrogate)"
    for instructor_only in ("notebooks/", "tests/", "utils/course/grade", "utils/course/labs", "utils/course/handout",
                            "utils/course/solutions", "utils/course/twins", "docs/instructors.md", "docs/testing.md",
                            "docs/notebook-contract.md", "CONTRIBUTING.md"):
        assert not [f for f in files if f.startswith(instructor_only)], instructor_only
    readme = (week4 / "README.md").read_text()
    assert "04_grpo.ipynb` (graded" in readme
    commands = re.findall(r"utils run (labs/\S+)", readme)
    assert commands and all(c in files for c in commands), f"the README runs a lab the handout does not hold: {commands}"


def test_no_withheld_answer_appears_anywhere(week4):
    assert handout.leaks(week4, lesson_paths(WITHHOLD)) == []
    for lab in (week4 / "labs").glob("*.ipynb"):   # and the text of an answer region is nowhere either
        assert "BEGIN SOLUTION" not in lab.read_text()


def test_the_leak_finder_finds_an_answer_under_other_names(tmp_path):
    """A renamed copy of lesson 04's group_advantages, and k3_kl's two lines inside a larger function."""
    (tmp_path / "helper.py").write_text(textwrap.dedent('''\
        import torch


        def adv(r, g, how="group", e=1e-4):
            """Not an answer."""
            if how not in ("group", "batch", "none"):
                raise ValueError(f"scale must be 'group', 'batch' or 'none', got {how!r}")
            if len(r) % g:
                raise ValueError(f"{len(r)} rewards do not split into groups of {g}")
            r = r.float()
            x = r.view(-1, g)
            c = (x - x.mean(dim=1, keepdim=True)).view(-1)
            if how == "group":
                s = x.std(dim=1) if g > 1 else torch.zeros(len(x))
                return c / (s.repeat_interleave(g) + e)
            if how == "batch":
                return c / ((r.std() if len(r) > 1 else 0.0) + e)
            return c


        def outer(p, q):
            n = 1
            d = q - p
            return torch.exp(d) - d - 1
        '''))
    found = handout.leaks(tmp_path, lesson_paths(["04"]))
    assert found == ["helper.py: the body of lesson04.group_advantages", "helper.py: the body of lesson04.k3_kl"]
    assert handout.leaks(tmp_path, lesson_paths(["03"])) == []


def test_no_lesson_helper_holds_any_answer(tmp_path):
    """No module of utils/ (the answers' own solutions/ aside) holds the body of any lesson's answer, under any names;
    and a handout withholding every lesson at once holds no answer module."""
    shutil.copytree(UTILS_DIR, tmp_path / "utils", ignore=shutil.ignore_patterns("solutions", "assets", "__pycache__"))
    assert handout.leaks(tmp_path / "utils", lesson_paths()) == []
    out = tmp_path / "all"
    every = [p.name[:2] for p in lesson_paths()]
    report = handout.build(out, withhold=every, labs=["01", "02", "03", "04", "06"])
    assert len(report["withheld"]) == len(every) >= 7 and not list((out / "utils" / "solutions").glob("lesson*.py"))
    assert handout.leaks(out, lesson_paths()) == []


def test_utils_holds_what_its_labs_import(tmp_path):
    """A lesson module comes with the first lab that imports it; every module copied imports only what was copied."""
    week1 = tmp_path / "week1"
    handout.build(week1, withhold=["01"], labs=["01"])
    copied = {p.relative_to(week1 / "utils").as_posix() for p in (week1 / "utils").rglob("*.py")}
    assert {"sft.py", "evaluation.py", "presets/tiers.py", "course/run.py"} <= copied
    assert not copied & {"dpo.py", "rl.py", "ppo.py", "quant.py"}, copied
    assert {p.name for p in (week1 / "utils" / "solutions").glob("*.py")} == {"__init__.py"}, "no later lab's answers"
    handout.build(tmp_path / "week7", withhold=["07"], labs=["07"])
    assert (tmp_path / "week7" / "utils" / "ppo.py").is_file()
    answers = {p.name for p in (tmp_path / "week7" / "utils" / "solutions").glob("*.py")}
    assert answers == {"__init__.py", "lesson03.py", "lesson04.py"}, "what lab 07 imports, no more"
    dotted = handout.utils_imports("from utils.presets import tiers\nimport utils.course.kernel", [])
    assert {"presets/__init__.py", "presets/lesson07.py", "course/__init__.py", "course/kernel.py"} <= \
        {p.relative_to(UTILS_DIR).as_posix() for p in dotted}, "a package's __init__ and presets whole"
    importable = ("import pkgutil, importlib, utils\n"
                  "for m in pkgutil.walk_packages(utils.__path__, 'utils.'):\n    importlib.import_module(m.name)")
    for folder in (week1, tmp_path / "week7"):
        run = subprocess.run([sys.executable, "-c", importable], cwd=folder, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        run = subprocess.run([sys.executable, "-m", "utils", "run", "--help"], cwd=folder, capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0 and "--preset" in run.stdout, run.stderr[-2000:]


def test_instructor_commands_say_they_are_not_in_a_handout(week4):
    run = subprocess.run([sys.executable, "-m", "utils", "grade", "x", "--lab", "01"], cwd=week4,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "not part of this handout" in run.stderr


def test_a_module_missing_under_a_command_is_named_as_such(week4, tmp_path):
    """A student command whose own import fails says so (the error a broken handout gives), not "instructor's"."""
    broken = tmp_path / "broken"
    shutil.copytree(week4, broken)
    (broken / "utils" / "course" / "figures.py").unlink()
    run = subprocess.run([sys.executable, "-m", "utils", "run", "--help"], cwd=broken, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1 and "No module named 'utils.course.figures'" in run.stderr, run.stderr[-500:]
    assert "not part of this handout" not in run.stderr


@pytest.mark.slow
def test_every_lab_validates_inside_the_handout(week4):
    """With the lesson's answers filled in, each lab of the handout passes every check using the handout's own
    utils (the kernel starts in handout/labs); with its stubs, every check fails naming its exercise. These labs
    are validated here only (tests/course/test_labs.py validates the others)."""
    from tests.course.test_labs import assert_every_check_fails_naming_its_exercise, assert_every_check_passes

    def validate(args):
        lesson_path, invert = args
        lesson, lab = nbformat.read(lesson_path, as_version=4), labs.lab_for(lesson_path)
        result = labs.validate_notebook(lesson, lab if invert else lesson, lab, invert=invert, kernel_cwd=week4 / "labs")
        return invert, {"lesson": f"{lesson_path.stem} ({'stubs' if invert else 'answers'}, in the handout)", **result}

    jobs = [(p, invert) for p in lesson_paths(LABS) for invert in (False, True)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(validate, jobs))
    for invert, result in results:
        (assert_every_check_fails_naming_its_exercise if invert else assert_every_check_passes)(result)
