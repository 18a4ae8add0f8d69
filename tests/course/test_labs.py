"""The lab builder: stubs, hidden tests, locks and nbgrader checksums; labs/ up to date; validate and --invert."""
import json

import nbformat
import pytest

from utils.constants import LABS_DIR, LOCKED_CHECK_HEAD, SETUP_TAG
from utils.course import cells, labs


def cell(source, **nbgrader):
    c = nbformat.v4.new_code_cell(source)
    if nbgrader:
        c.metadata["nbgrader"] = {"schema_version": 3, **nbgrader}
    return c


def test_checksum_is_nbgraders():
    # Values computed by nbgrader 0.9.6's nbgrader.utils.compute_checksum on the same two cells.
    check = cell('assert f(2) == 4, "f doubles"\nprint("ok")', grade=True, solution=False, locked=True,
                 grade_id="xx-check", points=2)
    answer = cell("def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()", grade=False, solution=True,
                  locked=False, grade_id="xx-check-answer")
    assert cells.compute_checksum(check) == "9f21f0ea74de4576591c084128a4c7ce"
    assert cells.compute_checksum(answer) == "083325e8035569290d68612de43daf58"
    check.source += " "
    assert cells.compute_checksum(check) != "9f21f0ea74de4576591c084128a4c7ce", "any edit changes the checksum"


def test_stub_keeps_indentation_and_names_the_exercise():
    src = ("IGNORE = -1\n\ndef f(x):\n    \"\"\"Doc.\"\"\"\n    ### BEGIN SOLUTION\n    y = 2 * x\n    ### END SOLUTION\n"
           "    return y\n\n\ndef g():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")
    out = cells.stub_solutions(src, "07-double")
    assert "y = 2 * x" not in out and "return 1" not in out and "BEGIN SOLUTION" not in out
    assert out.startswith("IGNORE = -1\n\ndef f(x):\n    \"\"\"Doc.\"\"\"\n    # YOUR CODE HERE\n    raise NotImplementedError(")
    assert "Exercise 07-double: write the body of f()" in out and "write the body of g()" in out
    assert out.endswith("    return y\n\n\ndef g():\n    # YOUR CODE HERE\n    raise NotImplementedError("
                        "'Exercise 07-double: write the body of g() (see the docstring), then run the graded check after it')")
    compile(out, "stub", "exec")


@pytest.mark.parametrize("src, message", [
    ("### BEGIN SOLUTION\nx = 1", "has no"),
    ("x = 1\n### END SOLUTION", "without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "nested"),
])
def test_unbalanced_markers_are_errors(src, message):
    with pytest.raises(cells.LabError, match=message):
        cells.stub_solutions(src, "x")


def test_tooling_markers_removed_and_nothing_else():
    src = "# Graded check: f\n# NBVAL_CHECK_OUTPUT\nx = 1  # NBVAL_CHECK_OUTPUT stays inside a line\nprint(x)"
    assert labs.strip_tooling_markers(src) == "# Graded check: f\nx = 1  # NBVAL_CHECK_OUTPUT stays inside a line\nprint(x)"
    assert labs.strip_tooling_markers("print(1)\n") == "print(1)\n"


def test_hidden_tests_removed():
    src = "assert f(1) == 2\n### BEGIN HIDDEN TESTS\nassert f(5) == 10\n### END HIDDEN TESTS\nprint('ok')"
    assert cells.remove_hidden_tests(src) == "assert f(1) == 2\nprint('ok')"
    # the judge runs the same parts, by line: shown, hidden, shown (the marker lines in none)
    assert cells.hidden_parts(src) == [[0, 1, False], [2, 3, True], [4, 5, False]]
    assert cells.hidden_parts("x = 1") == [[0, 1, False]]
    with pytest.raises(cells.LabError, match="has no"):
        cells.hidden_parts("### BEGIN HIDDEN TESTS\nassert 0")


def _lesson(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), *cells]
    return nb


def test_contract_violations_are_named():
    setup = cell("import math")
    setup.metadata["tags"] = ["grader-setup"]
    check = cell("assert f(2) == 4", grade=True, solution=False, locked=True, grade_id="xx-f", points=1)
    answer = cell("def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
                  grade=False, solution=True, locked=False, grade_id="xx-f-answer")
    cells.check_contract(_lesson(setup, answer, check))
    with pytest.raises(cells.LabError, match="solution=true"):
        cells.check_contract(_lesson(setup, cell(answer.source), check))
    with pytest.raises(cells.LabError, match="used twice"):
        cells.check_contract(_lesson(setup, answer, check, cell("assert True", grade=True, solution=False, locked=True,
                                                                     grade_id="xx-f", points=1)))
    with pytest.raises(cells.LabError, match="hidden tests belong"):
        cells.check_contract(_lesson(setup, answer, check, cell("### BEGIN HIDDEN TESTS\n### END HIDDEN TESTS")))
    with pytest.raises(cells.LabError, match="grader-setup"):
        cells.check_contract(_lesson(answer, check))
    with pytest.raises(cells.LabError, match="points"):
        cells.check_contract(_lesson(setup, answer, cell("assert 1", grade=True, solution=False, locked=True,
                                                         grade_id="xx-g", points=0)))


@pytest.mark.parametrize("lesson", labs.lesson_paths(), ids=lambda p: p.stem)
def test_lab_of_each_lesson(lesson):
    src = nbformat.read(lesson, as_version=4)
    cells.check_contract(src, lesson.stem)
    lab = labs.lab_for(lesson)
    text = json.dumps(lab)
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text, "solutions and hidden tests must not reach students"
    assert "NBVAL" not in text, "CI's regression markers are test tooling: a student edition leaves them out"
    assert lab.metadata[labs.LAB_META_KEY] == {"lesson": lesson.stem[:2], "name": lesson.stem,
                                               "repo": labs.course_repo()}
    assert "widgets" not in lab.metadata and "papermill" not in lab.metadata
    from ipykernel.kernelspec import get_kernel_dict
    assert lab.metadata["kernelspec"]["display_name"] == get_kernel_dict()["display_name"], \
        "JupyterLab writes ipykernel's kernelspec into a notebook it opens: the lab carries it already, so it opens unmodified"
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in lab.cells if c.cell_type == "code")
    n_answers = n_checks = n_written = 0
    for c in lab.cells:
        if cells.is_check(c):
            n_checks += 1
            assert c.metadata["editable"] is False and c.metadata["deletable"] is False
            assert c.source.startswith(cells.LOCKED_CHECK_HEAD + " "), "a locked check says so on its first line"
        if cells.is_answer(c):
            n_answers += 1
            assert "raise NotImplementedError('Exercise " in c.source and c.metadata["deletable"] is False
        if cells.is_written(c):
            n_written += 1
            assert c.source == "YOUR ANSWER HERE" and c.metadata["deletable"] is False, "the guide never reaches students"
        if cells.is_grade(c) or cells.is_solution(c):
            assert c.metadata["nbgrader"]["checksum"] == cells.compute_checksum(c)
    assert n_checks >= 2 and n_answers >= 2 and 2 <= n_written <= 3
    ran = {"parameters", SETUP_TAG}   # the cells the grader runs besides the answers: marked, and only they
    assert [c.source.startswith(labs.SETUP_MARK + "\n") for c in lab.cells if c.cell_type == "code"] == \
        [bool(ran & set(c.metadata.get("tags", []))) for c in lab.cells if c.cell_type == "code"]
    assert "`# [setup] ...`" in lab.cells[1].source and labs.SETUP_MARK.startswith("# [setup] ")
    assert "Marking guide" not in text, "no marking guide in a student edition"
    assert [c.get("id") for c in lab.cells if c.get("id") != labs.INSTRUCTIONS_ID] == [c.get("id") for c in src.cells], \
        "labs keep the lesson's cell ids (the grader finds cells by them)"


@pytest.mark.parametrize("lesson", labs.lesson_paths(), ids=lambda p: p.stem)
def test_a_check_says_what_its_hidden_tests_look_at(lesson):
    """A hidden test must not take points for a mistake the student cannot see coming: the visible check, which the
    lab keeps, names what the hidden tests also try, on the lines right before them."""
    for c in nbformat.read(lesson, as_version=4).cells:
        if cells.is_check(c) and "### BEGIN HIDDEN TESTS" in c.source:
            before = c.source.split("### BEGIN HIDDEN TESTS")[0].rstrip("\n").splitlines()
            said = [line for line in before if line.startswith("#")][-3:]
            assert any(line.startswith("# The grader's hidden tests also check: ") for line in said), \
                f"{cells.grade_id(c)}: say what the hidden tests check, in a comment right before them"
            lab_cell = next(x for x in labs.lab_for(lesson).cells if cells.grade_id(x) == cells.grade_id(c))
            assert "# The grader's hidden tests also check: " in lab_cell.source


@pytest.mark.parametrize("lesson", labs.lesson_paths(), ids=lambda p: p.stem)
def test_lab_opens_in_colab_and_clones_the_course_it_came_from(lesson, monkeypatch):
    """Every lab links to itself in Colab, and its setup cell clones the same repository: the course's, or the
    fork named by COURSE_REPO when the labs are built (nothing else in the lab changes)."""
    from utils.constants import COURSE_REPO

    monkeypatch.delenv("COURSE_REPO", raising=False)
    src = nbformat.read(lesson, as_version=4)
    ours = labs.lab_for(lesson)
    colab = f"https://colab.research.google.com/github/{COURSE_REPO}/blob/main/labs/{lesson.name})"
    assert ours.cells[1].id == labs.INSTRUCTIONS_ID and colab in ours.cells[1].source
    assert (labs.LABS_DIR / lesson.name).exists()
    setup = [c.source for c in ours.cells if 'os.environ.get("COURSE_REPO_URL", ' in c.source]
    assert setup == [f"{labs.SETUP_MARK}\n{c.source}" for c in src.cells if 'os.environ.get("COURSE_REPO_URL", ' in c.source], \
        "the lessons' setup cells clone the course's repository (utils.constants.COURSE_REPO)"
    assert f'"https://github.com/{COURSE_REPO}.git"' in setup[0]
    monkeypatch.setenv("COURSE_REPO", "an-instructor/our-course")
    fork = labs.build_lab(src, lesson.stem)
    assert "https://colab.research.google.com/github/an-instructor/our-course/blob/main/labs/" in fork.cells[1].source
    assert '"https://github.com/an-instructor/our-course.git"' in "".join(c.source for c in fork.cells)
    assert COURSE_REPO not in json.dumps(fork)
    differ = [i for i, (a, b) in enumerate(zip(ours.cells, fork.cells)) if a != b]
    assert len(ours.cells) == len(fork.cells) and len(differ) == 2     # the link and the setup cell
    assert fork.metadata[labs.LAB_META_KEY]["repo"] == "an-instructor/our-course"


def test_a_forks_labs_check_clean_without_its_setting(tmp_path, monkeypatch):
    """Labs built for a fork (COURSE_REPO set) are up to date for `labs check` whatever COURSE_REPO says later:
    each is compared with its lesson's lab for the repository it was built for."""
    lesson = labs.lesson_paths(["02"])[0]
    monkeypatch.setenv("COURSE_REPO", "an-instructor/our-course")
    (tmp_path / lesson.name).write_text(labs.lab_text(lesson), encoding="utf-8")
    monkeypatch.delenv("COURSE_REPO")
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / lesson.name).write_bytes(lesson.read_bytes())
    problems = labs.stale(notebooks, tmp_path, labs.SOLUTIONS_DIR)
    assert not [p for p in problems if p.startswith(lesson.name)], problems
    (tmp_path / lesson.name).write_text(labs.lab_text(lesson).replace("Student edition", "Student"), encoding="utf-8")
    assert f"{lesson.name}: differs from what its lesson builds" in labs.stale(notebooks, tmp_path, labs.SOLUTIONS_DIR)


@pytest.mark.parametrize("repo", ["not a repo", "https://github.com/a/b", "a/b.git", "a/b/c", "../x"])
def test_a_malformed_course_repo_is_a_clear_error(repo):
    with pytest.raises(cells.LabError, match="COURSE_REPO must be a GitHub repository as owner/name"):
        labs.course_repo(repo)


STEP = (".backward(", "clip_grad_norm_", "p -= lr * p.grad")   # a training step written out


@pytest.mark.parametrize("lab,gid,pieces", [
    ("01", "01-sft-step", (*STEP, "cross_entropy")),                              # causal_lm_loss's answer
    ("03", "03-dpo-step", (*STEP, "logsigmoid", "log_softmax", ".gather(")),      # dpo_loss's, sequence_logps'
    ("04", "04-grpo-step", (*STEP, ".std(", ".clamp(1 -", "exp(ref - lp)", "mask.sum(1)")),  # lesson 04's four
    ("06", "06-nf4-model", ("NF4_CODE[", "repeat_interleave(blocksize)")),        # nf4_dequantize's answer
])
def test_a_capstone_check_shows_neither_the_step_nor_the_labs_other_answers(lab, gid, pieces):
    """A capstone check runs the student's function with stand-ins (or a library) for the lab's other exercises
    and checks what it does; the step written out is in its hidden tests only."""
    lesson = next(p for p in labs.lesson_paths() if p.stem.startswith(lab))
    check = next(c for c in labs.lab_for(lesson).cells if cells.grade_id(c) == gid).source
    for piece in pieces:
        assert piece not in check, f"the student edition's {gid} check shows an answer ({piece})"


def test_labs_are_up_to_date():
    problems = labs.stale()
    assert not problems, "labs/ is out of date with notebooks/; run `make labs`: " + "; ".join(problems)


def test_stale_labs_and_solutions_are_detected(tmp_path):
    lesson = labs.lesson_paths(["06"])[0]
    dirs = tmp_path / "nb", tmp_path / "labs", tmp_path / "solutions"
    for d in dirs:
        d.mkdir()
    (tmp_path / "nb" / lesson.name).write_text(lesson.read_text())
    (tmp_path / "solutions" / "lesson05.py").write_text("# a lesson that is gone\n")
    written = labs.build(*dirs)
    assert {p.name for p in written} == {lesson.name, "lesson06.py"} and not (tmp_path / "solutions" / "lesson05.py").exists()
    assert labs.stale(*dirs) == []
    nb = nbformat.read(tmp_path / "nb" / lesson.name, as_version=4)
    next(c for c in nb.cells if cells.is_grade(c)).source += "\nassert True"
    nbformat.write(nb, tmp_path / "nb" / lesson.name)
    assert labs.stale(*dirs) == [f"{lesson.name}: differs from what its lesson builds"]
    answer = next(c for c in nb.cells if cells.is_solution(c))
    indent = answer.source.split("### END SOLUTION")[0].rsplit("\n", 1)[1]     # the marker's own indentation
    answer.source = answer.source.replace("### END SOLUTION", "pass  # changed\n" + indent + "### END SOLUTION", 1)
    nbformat.write(nb, tmp_path / "nb" / lesson.name)
    assert "utils/solutions/lesson06.py: differs from the answers of 06_quantization.ipynb" in labs.stale(*dirs)
    (tmp_path / "labs" / "09_gone.ipynb").write_text("{}")
    assert "09_gone.ipynb: no lesson of that name" in labs.stale(*dirs)


# Each lab is validated once: those of the handout in tests/course/test_handout.py (inside the handout, on its own utils/),
# the others here, in the repository.
def not_in_the_handout():
    from tests.course.test_handout import LABS

    return [p.name[:2] for p in labs.lesson_paths() if p.name[:2] not in LABS]


def assert_every_check_passes(result):
    assert result["ok"], f"{result['lesson']}: {result['problems']}"
    assert result["checks"] and all(c["passed"] for c in result["checks"].values())


def assert_every_check_fails_naming_its_exercise(result):
    assert result["ok"], f"{result['lesson']}: {result['problems']}"
    assert result["checks"]
    for gid, c in result["checks"].items():
        assert not c["passed"] and c["ename"] == "NotImplementedError", gid
        assert f"Exercise {gid}:" in c["message"], f"{gid} should fail naming its own exercise: {c['message']}"


def test_every_lab_is_validated_once():
    from tests.course.test_handout import LABS

    assert sorted([*LABS, *not_in_the_handout()]) == sorted(p.name[:2] for p in labs.lesson_paths())
    assert not_in_the_handout(), "the repository's own validation keeps at least one lab (lesson 05 needs 04)"


@pytest.mark.slow
def test_validate_lessons_pass_every_check():
    for result in labs.validate(not_in_the_handout(), jobs=2):
        assert_every_check_passes(result)


@pytest.mark.slow
def test_validate_invert_labs_fail_every_check_cleanly():
    for result in labs.validate(not_in_the_handout(), invert=True, jobs=2):
        assert_every_check_fails_naming_its_exercise(result)


@pytest.mark.slow
def test_a_lab_with_every_exercise_undone_runs_on_past_its_checks(tmp_path):
    """Lab 06 with every stub in place, run on past its failing checks (as "Run Selected Cell and All Below" does,
    utils/stubs.py): each cell that needs an exercise is skipped with a note naming it, the others run, and
    only the checks and the results cell (which keeps the records of what ran) end in an error."""
    nbclient = pytest.importorskip("nbclient")
    from utils.course.kernel import started_again
    from utils.records import read_records

    (path,) = [p for p in LABS_DIR.glob("06_*.ipynb")]
    nb = nbformat.read(path, as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    params.source = params.source.replace('PRESET = "auto"', 'PRESET = "tiny"').replace(
        "OUTPUT_DIR = None", f"OUTPUT_DIR = {str(tmp_path)!r}")
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300, allow_errors=True,
                                     resources={"metadata": {"path": str(LABS_DIR)}})
    started_again(client.execute)
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = {i: o["ename"] for i, c in enumerate(code) for o in c.outputs if o["output_type"] == "error"}
    checks = {i for i, c in enumerate(code) if c.source.startswith(LOCKED_CHECK_HEAD)}
    (results,) = [i for i, c in enumerate(code) if c.source.startswith("%%results")]
    assert errors == {**{i: "NotImplementedError" for i in checks}, results: "ResultsIncomplete"}, errors
    notes = ["".join(o.get("text", "") for o in c.outputs) for c in code]
    skipped = [n for n in notes if n.startswith("Skipped (nothing in this cell ran): ")]
    assert len(skipped) >= 5 and all("(exercise" in n and "not done yet" in n for n in skipped), notes
    ran = [i for i, c in enumerate(code) if i not in errors and not notes[i].startswith("Skipped")]
    assert len(ran) >= 8, "the cells that need no exercise run (setup, the formats' table, the NF4 code)"
    nbformat.write(nb, str(tmp_path / "executed.ipynb"))
    assert "06/results_failed" in read_records(tmp_path / "executed.ipynb")


@pytest.mark.parametrize("lesson", labs.lesson_paths(), ids=lambda p: p.stem)
def test_a_labs_long_run_command_runs_the_lab_not_the_lessons_answers(lesson):
    markdown = lambda path: "\n".join(c.source for c in nbformat.read(path, as_version=4).cells  # noqa: E731
                                      if c.cell_type == "markdown")
    said, lab = markdown(lesson), markdown(LABS_DIR / lesson.name)
    assert f"python -m utils run {lesson.stem[:2]} " not in lab
    assert (f"python -m utils run labs/{lesson.name} " in lab) == (f"python -m utils run {lesson.stem[:2]} " in said)
