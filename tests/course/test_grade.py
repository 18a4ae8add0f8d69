"""The grader on a fixture class of lab 01 submissions: expected CSV, feedback, nothing modified, nothing lost."""
import base64
import contextlib
import csv
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests import grading_fixtures
from utils.constants import CHECK_MESSAGE_CHARS
from utils.course import cells, grade, grading, labs, submissions, written

EXPECTED = Path(__file__).parents[1] / "fixtures" / "grades_01.csv"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))


def digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, lesson_runs):
    root = tmp_path_factory.mktemp("class")
    subs = root / "submissions"
    grading_fixtures.write(subs)
    alice = nbformat.read(subs / "alice.ipynb", as_version=4)   # a picture pasted into her first written answer
    next(c for c in alice.cells if cells.is_written(c))["attachments"] = {
        "plot.png": {"image/png": base64.b64encode(PNG).decode()}}
    nbformat.write(alice, subs / "alice.ipynb")
    before = digest(subs)
    # an instructor's marks from an earlier run: every question for alice, one for bob
    asked = written.questions(nbformat.read(grading_fixtures.LESSON, as_version=4))
    (root / "out").mkdir()
    (root / "out" / "grades.csv").write_text("student,lab," + ",".join(q["grade_id"] for q in asked) + "\n"
                                             + "alice,01_sft_from_scratch," + ",".join("2" for _ in asked)
                                             + "\nbob,01_sft_from_scratch,1\n")
    (root / "out" / written.IMAGES_DIR).mkdir()
    (root / "out" / written.IMAGES_DIR / "001-stale-1.png").write_bytes(PNG)   # an earlier run's
    with a_busy_machine(lesson_runs):   # the marks must not depend on the load: the expected CSV is an idle machine's
        rows = grade.grade_folder(subs, "01", root / "out", jobs=2, timeout=120, cell_timeout=8,
                                  progress=lambda *_: None)
    return {"root": root, "subs": subs, "out": root / "out", "rows": rows, "before": before}


@contextlib.contextmanager
def a_busy_machine(lesson_runs, others=2):
    """The class is graded on a machine kept busy by two other processes: in `make test`, the two lessons
    executing beside this test (nothing is added); otherwise, or beside one, processes that spin in a loop
    take their places until the class is graded."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(max(0, others - lesson_runs.running()))]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def test_a_dead_judge_is_blamed_on_the_cell_it_started():
    # The judge says when it starts a cell and when the cell ends: a run that stops between the two
    # blames that cell (here an answer), not the check after it, which never ran.
    def cell(role, gid):
        c = nbformat.v4.new_code_cell("pass")
        c.metadata["grading"] = {"role": role, "grade_id": gid}
        if role == "check":
            c.metadata["nbgrader"] = {"points": 2}
        return c
    gnb = nbformat.v4.new_notebook(cells=[cell("setup", None), cell("answer", "x-answer"), cell("check", "x")])
    said = [{"start": 0}, {"cell": 0}, {"start": 1}]
    run = grading.read_run(said, gnb, cell_timeout=8, stopped="the run ended (exit status 1) before it finished")
    assert run["running"] == 1
    assert run["checks"]["x"]["passed"] is False and run["checks"]["x"]["ename"] == "NotRun"
    assert grading.read_run(said, gnb, cell_timeout=8)["running"] is None, "a run that did not stop early blames nobody"


def test_find_submissions_layouts(tmp_path):
    (tmp_path / "ann.ipynb").write_text("{}")
    (tmp_path / "ben.ipynb.txt").write_text("{}")
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "01_sft_from_scratch.ipynb").write_text("{}")
    (tmp_path / "dan" / ".ipynb_checkpoints").mkdir(parents=True)
    (tmp_path / "dan" / ".ipynb_checkpoints" / "x.ipynb").write_text("{}")
    (tmp_path / "dan" / "lab1 final.ipynb").write_text("{}")
    (tmp_path / "eve").mkdir()
    (tmp_path / ".DS_Store").write_text("")
    subs = {s["student"]: s for s in submissions.find_submissions(tmp_path, "01_sft_from_scratch")}
    assert sorted(subs) == ["ann", "ben", "cat", "dan", "eve"]
    assert subs["ann"]["flags"] == [] and subs["cat"]["flags"] == []
    assert subs["ben"]["flags"] == ["renamed"]
    assert subs["dan"]["flags"] == ["renamed"] and subs["dan"]["path"].name == "lab1 final.ipynb"
    assert subs["eve"]["flags"] == ["no-notebook"] and subs["eve"]["path"] is None


def test_grading_notebook_restores_checks_and_keeps_hidden_tests():
    lesson = nbformat.read(grading_fixtures.LESSON, as_version=4)
    sub = nbformat.reads(grading_fixtures.submission("tampered")[1], as_version=4)
    gnb, integrity = grading.grading_notebook(lesson, sub, labs.lab_for(grading_fixtures.LESSON))
    assert [(i["flag"], i["grade_id"]) for i in integrity] == [("modified", "01-collate"), ("deleted", "01-causal-loss")]
    roles = [c.metadata["grading"]["role"] for c in gnb.cells]
    assert roles[0] == "setup" and roles[1] == "parameters" and roles.count("check") == 4 and roles.count("answer") == 4
    checks = {c.metadata["grading"]["grade_id"]: c.source for c in gnb.cells if c.metadata["grading"]["role"] == "check"}
    assert "BEGIN HIDDEN TESTS" in checks["01-collate"], "the lesson's check runs, hidden tests included"
    assert all("raises-exception" in c.metadata["tags"] for c in gnb.cells)
    assert not any("train_by_hand" in c.source for c in gnb.cells), "never the student's training"


def test_a_check_as_nbgraders_release_shows_it_is_not_modified():
    # nbgrader's release keeps CI's "# NBVAL_CHECK_OUTPUT" lines, which our lab leaves out: same check
    lesson = nbformat.read(grading_fixtures.LESSON, as_version=4)
    sub = labs.lab_for(grading_fixtures.LESSON)
    ref = next(c for c in lesson.cells if cells.grade_id(c) == "01-causal-loss")
    assert "# NBVAL_CHECK_OUTPUT" in ref.source
    next(c for c in sub.cells if cells.grade_id(c) == "01-causal-loss").source = cells.remove_hidden_tests(ref.source)
    _, integrity = grading.grading_notebook(lesson, sub, labs.lab_for(grading_fixtures.LESSON))
    assert not [i for i in integrity if i["flag"] == "modified"], integrity


@pytest.mark.slow
def test_grades_match_the_expected_csv(graded):
    got = list(csv.DictReader((graded["out"] / "grades.csv").open()))
    want = list(csv.DictReader(EXPECTED.open()))
    cols = list(want[0])
    assert [{k: r[k] for k in cols} for r in got] == want


@pytest.mark.slow
def test_written_answers_collected_for_the_instructor(graded):
    asked = written.questions(nbformat.read(grading_fixtures.LESSON, as_version=4))
    text = (graded["out"] / "written.md").read_text(encoding="utf-8")
    for q in asked:
        assert f"## {q['grade_id']} ({q['points']} points)" in text and q["guide"].strip() in text
    alice = text.split("### alice")[1].split("###")[0]
    assert "&lt;b&gt;because&lt;/b&gt; &#91;the mask](http://example.com)" in alice and "<b>because" not in text
    assert "> # Not a heading" in alice, "a student's line never becomes a heading of the file"
    assert "still says YOUR ANSWER HERE" in text.split("### carol")[1].split("###")[0]
    assert "cell is missing" in text.split("### kim")[1].split("###")[0]
    pictures = sorted((graded["out"] / written.IMAGES_DIR).iterdir())
    assert len(pictures) == 1 and pictures[0].read_bytes() == PNG, "alice's picture, saved; the stale one gone"
    assert f"({written.IMAGES_DIR}/{pictures[0].name})" in alice
    rows = {r["student"]: r for r in csv.DictReader((graded["out"] / "grades.csv").open())}
    assert rows["alice"]["manual_points"] == str(2 * len(asked)) and rows["bob"]["manual_points"] == "", \
        "marks kept from the earlier grades.csv; a total only once every question is marked"
    assert rows["bob"][asked[0]["grade_id"]] == "1" and rows["carol"]["manual_max"] == str(sum(q["points"] for q in asked))
    assert len(list(graded["out"].glob("grades.csv.bak-*"))) == 1, "the file the marks were typed in is kept"


@pytest.mark.slow
def test_submissions_never_modified(graded):
    assert digest(graded["subs"]) == graded["before"]


@pytest.mark.slow
def test_feedback_per_student(graded):
    fb = graded["out"] / "feedback"
    assert sorted(p.stem for p in fb.glob("*.md")) == sorted(grading_fixtures.STUDENTS.values())
    alice = (fb / "alice.md").read_text()
    assert "**Score: 12 / 12** for the graded checks" in alice and "self-reported" in alice
    assert "## Written questions" in alice and ": answered" in alice
    asked = written.questions(nbformat.read(grading_fixtures.LESSON, as_version=4))
    full = sum(q["points"] for q in asked)
    # the marks typed in the earlier grades.csv reach the student, with the total
    assert f"**Score: 12 / 12** for the graded checks, **{2 * len(asked)} / {full}** for the written questions: " \
           f"{12 + 2 * len(asked)} / {12 + full} in all" in alice
    assert all(f"- {q['grade_id']}: answered; **2 / {q['points']}**" in alice for q in asked)
    bob_written = (fb / "bob.md").read_text().split("## Written questions")[1]
    assert f"{asked[0]['grade_id']}: answered; **1 / {asked[0]['points']}**" in bob_written
    assert bob_written.count("not marked yet") == len(asked) - 1, "a question without a mark says so"
    carol = (fb / "carol.md").read_text()   # nothing written: 0, with no one to type it
    assert f"**0 / {full}** for the written questions" in carol and "YOUR ANSWER HERE); **0 /" in carol
    assert "preset tiny" in alice and "hardware CPU" in alice and "01/accuracy_after" in alice
    # the change is paired over the same problems (every one of them moved: Agresti and Min's error, not 0)
    assert ("  format compliance, base → SFT   0.000 ± 0.007 → 1.000 ± 0.007   +100.0 ± 0.9 pts   [SE over 200 "
            "problems; changes paired over them]") in alice
    assert (fb / "alice" / "figure-1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bob = (fb / "bob.md").read_text()
    assert "hidden test: pad with the given pad_token_id" in bob, "a hidden test's message reaches the student"
    assert "shift logits and labels by one" in bob
    assert "not implemented: Exercise 01-sft-mask" in (fb / "carol.md").read_text()
    limit = re.search(r"timed out after (\d+) s", (fb / "erin.md").read_text())   # 8 s, stretched on a slow machine
    assert limit and int(limit.group(1)) >= 8
    assert "not valid JSON" in (fb / "frank.md").read_text()
    assert "SyntaxError" in (fb / "heidi.md").read_text()
    assert "a crash of the run" in (fb / "ivan.md").read_text()
    assert "no records" in (fb / "grace.md").read_text()
    assert "is the lab '06_quantization', not '01_sft_from_scratch'" in (fb / "kim.md").read_text()


def test_feedback_shows_the_course_headline_of_a_self_reported_run():
    course = grade.course_headline(nbformat.read(labs.lesson_paths(["01"])[0], as_version=4))
    assert [e["name"] for e in course["results"]] == ["format compliance", "accuracy"]
    records = {"01/preset": "tiny", "01/n_test": 100, "01/accuracy_before": 0.1, "01/accuracy_after": 0.3,
               "01/lora_accuracy": "|x|\n# fake", "01/format_compliance_after": float("nan"),
               "01/x|y\n\n# You scored 100%": "</details><!--", "01/accuracy_after_big": 10 ** 400,
               # a student's own declaration is never what the feedback reads
               "01/headline": {"results": [{"name": "PERFECT SCORE", "values": {"a": "n_test"}, "noise": "-"}]}}
    text = grade.feedback_markdown("ann", "01_sft_from_scratch", {"flags": []}, {"records": records}, "ann", course)
    assert "PERFECT SCORE" not in text.split("<details>")[0]
    assert "format compliance, base → SFT   not recorded → not recorded" in text
    assert "      full SFT  0.300 ± 0.045   +20.0 ± 5.5 pts vs base" in text
    assert '| 01/lora_accuracy | "&#124;x&#124;\\n# fake" |' in text    # a record never breaks the table ...
    assert '| 01/x&#124;y # You scored 100% | "&lt;/details&gt;&lt;!--" |' in text   # ... nor the page
    assert grade.course_headline(nbformat.v4.new_notebook()) is None
    failed = {"01/results_failed": ["line 9, utils.record('01/lora_accuracy', lora['accuracy']): NameError: x"]}
    text = grade.feedback_markdown("ann", "01_sft_from_scratch", {"flags": []}, {"records": failed}, "ann", course)
    assert "could not compute 1 statement(s)" in text and "- line 9, utils.record('01/lora_accuracy'" in text
    assert "| 01/results_failed |" not in text, "listed once, above the table"
    long = grading._check_message("ValueError", "x" * 3000, 30)
    assert len(long) == CHECK_MESSAGE_CHARS and long.endswith("…") and long.startswith("ValueError: xxx")


def test_usage_errors(tmp_path, capsys):
    assert grade.main([str(tmp_path / "nope"), "--lab", "01"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert grade.main([str(tmp_path), "--lab", "42"]) == 2
    assert "Available lessons" in capsys.readouterr().err


def test_every_student_gets_a_feedback_file_of_their_own():
    subs = [{"student": s} for s in ("名字", "张伟", "a b", "a_b", "A_B", "../etc", "")]
    submissions.unique_safe_names(subs)
    assert [s["safe"] for s in subs] == ["名字", "张伟", "a_b", "a_b-2", "A_B-3", "_etc", "student"]


def test_grades_csv_never_holds_a_formula(tmp_path):
    # A student's name or self-reported hardware is shown as text by a spreadsheet, whatever it is.
    long_flags = " ".join(f"missing-answer:01-ex{i}-answer" for i in range(12)) + " wrong-lab"
    rows = [{"student": "=HYPERLINK(\"http://x\",\"a\")", "total": -1, "hardware": "@SUM(A1)" + "x" * 500,
             "flags": long_flags},
            {"student": "bob", "total": 3, "hardware": "CPU (2 cores)", "flags": ""}]
    grade.write_csv(rows, ["student", "total", "hardware", "flags"], tmp_path / "grades.csv")
    with open(tmp_path / "grades.csv", newline="", encoding="utf-8") as f:
        got = list(csv.DictReader(f))
    assert got[0]["student"] == "'=HYPERLINK(\"http://x\",\"a\")" and got[0]["total"] == "-1"
    assert got[0]["hardware"].startswith("'@SUM") and len(got[0]["hardware"]) == 201
    assert got[1] == {"student": "bob", "total": "3", "hardware": "CPU (2 cores)", "flags": ""}
    assert got[0]["flags"] == long_flags and len(long_flags) > 200, "the grader's own flags are never cut"


def test_a_name_is_shown_as_text_whatever_its_bytes():
    raw = os.fsdecode(b"caf\xe9")   # Latin-1 from an old unzip: not UTF-8
    assert submissions.shown_name(raw) == "caf\ufffd"
    assert submissions.shown_name("a\rb\nc\x1b[2Kd\u202ee\u2028f") == "a?b?c?[2Kd?e?f", "no line break, escape or bidi"
    assert submissions.safe_name("名" * 100).encode("utf-8") == ("名" * 33).encode("utf-8"), "at most 100 bytes"
    assert len(submissions.safe_name("x" * 300)) == 100
    subs = [{"student": s} for s in ("alice", "alice.md.md", "Alice.MD")]   # no figures folder is a feedback file
    submissions.unique_safe_names(subs)
    assert [s["safe"] for s in subs] == ["alice", "alice-2", "Alice-3"]


def test_a_self_reported_run_is_one_short_line_per_cell_of_grades_csv():
    records = {"01/preset": "tiny\r\n=1+1,\x1b[2K" + "x" * 500, "01/model": 3.5, "01/device": None, "07/hardware": "GPU"}
    shown = submissions.shown_meta(records)
    head = "tiny??=1+1,?[2K"
    assert shown == {"preset": head + "x" * (submissions.MAX_META_CHARS - len(head)), "model": "3.5",
                     "device": "", "hardware": "GPU"}
    assert all(len(v) <= submissions.MAX_META_CHARS for v in shown.values())


def test_any_file_name_gets_a_row_of_its_own_and_a_feedback_file_it_names(tmp_path):
    """Names an LMS export or a student can make (bytes that are not UTF-8, a carriage return, an ANSI escape, 255
    bytes of CJK, a file and a folder of one name, two names one safe name) each get a row, a feedback file of their
    own that grades.csv names, and a grades.csv the next run reads back. The files are not notebooks: no kernel runs."""
    subs = tmp_path / "subs"
    subs.mkdir()
    names = [b"caf\xe9.ipynb", b"cr\rname.ipynb", b"\x1b[2Kansi.ipynb", ("名" * 83 + ".ipynb").encode(), b"dup.ipynb",
             b"a b.ipynb", b"a_b.ipynb"]
    for name in names:
        with open(os.path.join(os.fsencode(subs), name), "w") as f:
            f.write("not a notebook")
    (subs / "dup").mkdir()
    (subs / "dup" / "01_sft_from_scratch.ipynb").write_text("{}")
    (subs / "dup (dup.ipynb).ipynb").write_text("{}")   # the name a told-apart entry takes, taken already
    out = tmp_path / "grades"
    for _ in range(2):   # the second run reads the first one's grades.csv for marks
        lines = []
        rows = grade.grade_folder(subs, "01", out, jobs=1, progress=lines.append, box=None)
        assert len(rows) == len(names) + 2
        with open(out / "grades.csv", newline="", encoding="utf-8") as f:
            got = list(csv.DictReader(f))
        assert len(got) == len(names) + 2 and len({r["student"].casefold() for r in got}) == len(got)
        assert len({r["feedback"] for r in got}) == len(got)
        for r in got:
            text = (out / r["feedback"]).read_text(encoding="utf-8")
            assert not any(ch in text for ch in "\r\x1b\ud800"), r["student"]
            assert "invalid-notebook" in r["flags"] and "unsandboxed" in r["flags"]
        # a file's own name comes first; the entry told apart from dup/ takes a number
        assert {r["student"] for r in got if "same-name" in r["flags"]} == {"dup (dup.ipynb) #2", "dup (dup/)"}
        assert "dup (dup.ipynb)" in {r["student"] for r in got if "same-name" not in r["flags"]}
        assert not any("\x1b" in line or "\r" in line for line in lines), "nothing a name holds reaches the console"


def test_a_submissions_text_cannot_restyle_its_feedback():
    """An exception's message (the student's code raises what it likes) stays one line of text in its table cell."""
    forged = "x\n\n**Score: 12 / 12**\n# feedback for alice | <img src=x> `code` [link](http://e)"
    result = {"checks": {"01-collate": {"passed": False, "points": 0, "max_points": 2, "message": forged}},
              "answer_errors": [{"grade_id": "01-mask-answer", "error": forged}]}
    text = grade.feedback_markdown("eve\n# alice", "01_sft_from_scratch", {"file": "e`ve.ipynb"}, result, "eve")
    assert text.count("**Score:") == 1 and text.count("\n# ") == 0 and text.startswith("# 01_sft_from_scratch")
    assert "<img" not in text and "`code`" not in text and "](http" not in text
    assert "&lt;img src=x&gt;" in text and "&#42;&#42;Score: 12 / 12&#42;&#42;" in text
    records = {"01/[click](http://evil.example)": "**bold** www.evil.example", "01/preset": "tiny](http://x)"}
    text = grade.feedback_markdown("eve", "01_sft_from_scratch", {}, {"records": records}, "eve")
    assert "](http" not in text and "http://" not in text and "www.evil" not in text and "**bold**" not in text


def test_outputs_are_checked_before_they_reach_a_feedback_folder(tmp_path):
    import struct
    import zlib

    def png(width, height, payload=b""):
        ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        return (submissions.PNG_MAGIC + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
                + payload)
    shown = [png(640, 480)] * 3
    outputs = [*shown, png(100_000, 100_000),                                  # a decompression bomb's header
               b'<svg xmlns="http://www.w3.org/2000/svg"/>',                    # an SVG saved as image/png
               png(10, 10, b"x" * (submissions.MAX_FIGURE_BYTES + 1)), *[png(8, 8)] * submissions.MAX_FIGURES]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output(
        "display_data", data={"image/png": base64.b64encode(raw).decode()}) for raw in outputs])])
    kept, left = submissions.figures(nb)
    assert kept[:3] == shown and len(kept) == submissions.MAX_FIGURES
    assert left == ["1 figure(s) not shown: 100000 x 100000 pixels", "1 figure(s) not shown: not a PNG",
                    "1 figure(s) not shown: over 4 MB", f"3 figure(s) not shown: over {submissions.MAX_FIGURES} "
                    f"figures or {submissions.MAX_FIGURES_BYTES >> 20} MB in all"], left
    many = nbformat.v4.new_notebook(cells=[nbformat.v4.new_raw_cell("") for _ in range(submissions.MAX_CELLS + 1)])
    nbformat.write(many, tmp_path / "many.ipynb")
    assert submissions.load(tmp_path / "many.ipynb") == (None, f"{submissions.MAX_CELLS + 1} cells, over the "
                                                                f"{submissions.MAX_CELLS} a lab can have")


def test_grading_again_reuses_the_judges_result_of_an_unchanged_notebook(tmp_path, monkeypatch):
    """The second run (the instructor's marks typed in) runs no judge for a notebook that has not changed, nor the
    course, the limits or the sandbox; a changed notebook, a result a second run might not repeat (a time limit hit)
    and --rejudge are judged again."""
    lesson_path = labs.lesson_paths(["01"])[0]
    lesson = nbformat.read(lesson_path, as_version=4)
    checks = {cells.grade_id(c): cells.nbgrader_meta(c)["points"] for c in lesson.cells if cells.is_check(c)}
    judged, status = [], ["ok"]

    def judge(nb, *args, **kwargs):   # stands in for the judge: what grade_one keeps of it is what is tested here
        judged.append(len(nb.cells))
        return {"checks": {g: {"passed": True, "points": p, "max_points": p, "message": "", "ename": None}
                           for g, p in checks.items()}, "integrity": [], "notes": [], "status": status[0],
                "detail": "", "answer_errors": [], "setup_errors": [], "skipped": [], "attempts": 1}

    monkeypatch.setattr(grade, "grade_notebook", judge)
    subs, out = tmp_path / "subs", tmp_path / "grades"
    subs.mkdir()
    lab = nbformat.read(labs.LABS_DIR / lesson_path.name, as_version=4)
    nbformat.write(lab, subs / "ann.ipynb")

    def run(**kwargs):
        lines = []
        (row,) = grade.grade_folder(subs, "01", out, jobs=1, progress=lines.append, box=None, **kwargs)
        return row, any("the judge's result of the last run, reused" in line for line in lines)

    first, reused = run()
    assert len(judged) == 1 and not reused and (out / grade.JUDGED_DIR / "ann.json").is_file()
    again, reused = run()
    assert len(judged) == 1 and reused and again == first, "graded again: the same row, no judge"
    run(rejudge=True)
    assert len(judged) == 2
    lab.cells.append(nbformat.v4.new_markdown_cell("a change"))
    nbformat.write(lab, subs / "ann.ipynb")
    run()
    assert len(judged) == 3, "a changed notebook is judged again"
    status[0] = "timeout"
    lab.cells.pop()
    nbformat.write(lab, subs / "ann.ipynb")
    run()
    run()
    assert len(judged) == 5 and not (out / grade.JUDGED_DIR / "ann.json").exists(), "a time limit hit: judged again"
    status[0] = "ok"
    run()
    run()
    assert len(judged) == 6
    monkeypatch.setattr(grade, "course_digest", lambda *args: "the course changed")
    run()
    assert len(judged) == 7, "a change of the course (its checks, the judge, utils/) is judged again"
