"""Written questions: the contract, the student edition's stub, the answers read from a submission, the marks kept."""
import base64
import csv
import json

import nbformat
import pytest

from utils.course import cells, grade, labs, written


def written_cell(gid="04-written-kl", points=2, source="**Marking guide (2 points).** Names the k3 estimator.",
                 **meta):
    cell = nbformat.v4.new_markdown_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "solution": True, "locked": False, "points": points,
                                 "grade_id": gid, "schema_version": 3, "task": False, **meta}
    return cell


def lesson_with(*extra):
    setup = nbformat.v4.new_code_cell("import torch")
    setup.metadata["tags"] = ["grader-setup"]
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Lesson"), setup,
                                           nbformat.v4.new_markdown_cell("**Written question 1.** Why?"), *extra])


def test_contract_accepts_a_written_question_after_its_question():
    cells.check_contract(lesson_with(written_cell()), "04_x")
    nb = lesson_with(written_cell())
    assert written.questions(nb) == [{"grade_id": "04-written-kl", "points": 2,
                                      "question": "**Written question 1.** Why?",
                                      "guide": "**Marking guide (2 points).** Names the k3 estimator.",
                                      "cell_id": nb.cells[-1].id}]


@pytest.mark.parametrize("bad,message", [
    (written_cell(gid="04-kl"), "<lesson>-written-<topic>"),
    (written_cell(points=0), "positive integer points"),
    (written_cell(locked=True), "locked=false"),
    (written_cell(source="### BEGIN SOLUTION\nx\n### END SOLUTION"), "without solution or hidden-test markers"),
])
def test_contract_refuses_a_broken_written_question(bad, message):
    with pytest.raises(cells.LabError, match=message):
        cells.check_contract(lesson_with(bad), "04_x")


def test_contract_wants_the_question_right_before_the_answer():
    nb = lesson_with(written_cell())
    nb.cells.insert(3, nbformat.v4.new_code_cell("x = 1"))
    with pytest.raises(cells.LabError, match="right after the markdown cell that asks it"):
        cells.check_contract(nb, "04_x")
    nb = lesson_with(written_cell(), written_cell(gid="04-written-two"))
    with pytest.raises(cells.LabError, match="right after the markdown cell that asks it"):
        cells.check_contract(nb, "04_x")


def test_a_markdown_cell_is_never_a_code_answer():
    bad = written_cell(gid="04-kl-answer")
    bad.metadata["nbgrader"]["grade"] = False
    with pytest.raises(cells.LabError, match="a solution cell must have a solution region"):
        cells.check_contract(lesson_with(bad), "04_x")
    bad.source = "### BEGIN SOLUTION\nx\n### END SOLUTION"
    with pytest.raises(cells.LabError, match="an answer cell is a code cell"):
        cells.check_contract(lesson_with(bad), "04_x")


def test_the_lab_replaces_the_guide_by_nbgraders_stub():
    lab = labs.build_lab(lesson_with(written_cell()), "04_x")
    cell = next(c for c in lab.cells if cells.is_written(c))
    assert cell.source == "YOUR ANSWER HERE" == cells.TEXT_STUB
    assert cell.metadata["deletable"] is False and "editable" not in cell.metadata, "the student writes in it"
    assert cell.metadata["nbgrader"]["checksum"] == cells.compute_checksum(cell)
    assert "Marking guide" not in nbformat.writes(lab)
    assert not cells.is_check(cell) and not cells.is_answer(cell)


def test_answers_read_from_a_submission_never_trust_its_shape():
    asked = written.questions(lesson_with(written_cell(), nbformat.v4.new_markdown_cell("Q2"),
                                          written_cell(gid="04-written-two"), nbformat.v4.new_markdown_cell("Q3"),
                                          written_cell(gid="04-written-three")))
    sub = labs.build_lab(lesson_with(written_cell()), "04_x")   # only the first question is in it
    assert written.answers(sub, asked)["04-written-kl"] == {"status": "not-answered", "text": ""}
    next(c for c in sub.cells if cells.is_written(c)).source = "Because the k3 estimator is unbiased."
    sub.cells.append(written_cell(gid="04-written-two", source=["a list ", "of lines"]))
    got = written.answers(sub, asked)
    assert got["04-written-kl"] == {"status": "answered", "text": "Because the k3 estimator is unbiased."}
    assert got["04-written-two"] == {"status": "answered", "text": "a list of lines"}
    assert got["04-written-three"]["status"] == "missing"
    stripped = written_cell(gid="x", source="An answer whose metadata an editor dropped")
    stripped.metadata = {}
    stripped.id = asked[2]["cell_id"]
    lone = written_cell(gid="04-written-two", source=json.loads('"half a pair \\ud800 of surrogates"'))
    got = written.answers(nbformat.v4.new_notebook(cells=[stripped, lone]), asked)
    assert got["04-written-three"]["text"] == "An answer whose metadata an editor dropped", "found by the lab's cell id"
    assert got["04-written-two"]["text"].encode("utf-8"), "always valid UTF-8 (written.md can be written)"
    odd = nbformat.v4.new_notebook(cells=[written_cell(source="  \n")])
    odd.cells.append(nbformat.from_dict({"cell_type": "markdown", "metadata": {"nbgrader": "x"}, "source": 3}))
    assert written.answers(odd, asked)["04-written-kl"]["status"] == "not-answered"
    assert written.answers(object(), asked)["04-written-kl"]["status"] == "missing"


def test_written_md_shows_answers_as_text_only():
    asked = written.questions(lesson_with(written_cell()))
    hostile = "</details><script>x</script>\n## 10/10\n[click](javascript:x) `code`" + "y" * 7000
    text = written.markdown("04_x", asked, {"<b>eve</b>": {"04-written-kl": {"status": "answered", "text": hostile}},
                                            "bob": {}})
    assert "<script>" not in text and "</details><script>" not in text and "&lt;/details&gt;" in text
    assert "\n## 10/10" not in text and "> ## 10/10" in text
    assert "&#91;click](javascript:x) &#96;code&#96;" in text
    assert "### &lt;b&gt;eve&lt;/b&gt;" in text and "cut at 6000 characters" in text
    assert text.index("### bob") > text.index("### &lt;b&gt;eve"), "students sorted by name ('<' before 'b')"
    assert "no answer found" in text.split("### bob")[1]
    names = written.markdown("04_x", asked, {"x](http://e)\n# 10/10 ![img](http://h/i.png)": {}})
    assert "\n# 10/10" not in names and "](http" not in names and "![" not in names


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))


def test_pasted_pictures_saved_by_the_graders_names_and_nothing_else(tmp_path):
    asked = written.questions(lesson_with(written_cell()))
    b64 = lambda raw: base64.b64encode(raw).decode()   # noqa: E731
    sub = nbformat.v4.new_notebook(cells=[written_cell(source="See ![plot](attachment:plot.png)")])
    sub.cells[0]["attachments"] = {
        "plot.png": {"image/png": b64(PNG)}, "../../../etc/x.png": {"image/png": [b64(PNG)[:8], b64(PNG)[8:]]},
        "a.svg": {"image/svg+xml": b64(b"<svg onload='alert(1)'/>")}, "liar.png": {"image/png": b64(b"<html>")},
        "junk.png": {"image/png": "@@@not base64"}, "odd": "not a bundle", "big.png": {"image/png": b64(PNG + bytes(3 << 20))},
        **{f"p{k}.png": {"image/png": b64(PNG)} for k in range(3)}}
    found = written.answers(sub, asked)["04-written-kl"]
    assert len(found["images"]) == written.MAX_IMAGES and found["images_left"] == 6, "4 of the 5 PNGs; no other"
    stale = tmp_path / written.IMAGES_DIR / "007-04-written-kl-9.png"
    stale.parent.mkdir()
    stale.write_bytes(b"an earlier run's")
    written.clear_images(tmp_path)
    written.save_images(tmp_path, 7, {"04-written-kl": found})
    saved = sorted((tmp_path / written.IMAGES_DIR).iterdir())
    assert [p.name for p in saved] == [f"007-04-written-kl-{k}.png" for k in range(1, 5)], "names of the grader's only"
    assert all(p.read_bytes() == PNG for p in saved) and not (tmp_path / "etc").exists()
    text = written.markdown("04_x", asked, {"eve": {"04-written-kl": found}})
    assert "> ![picture 1 pasted into this answer](written_images/007-04-written-kl-1.png)" in text
    assert "(6 other attachment(s) not shown" in text and "![plot]" not in text
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (tmp_path / written.IMAGES_DIR).rename(tmp_path / "old")
    (tmp_path / written.IMAGES_DIR).symlink_to(outside, target_is_directory=True)
    written.clear_images(tmp_path)
    assert outside.is_dir() and not (tmp_path / written.IMAGES_DIR).exists(), "a link is removed, never followed"


def test_marks_kept_and_manual_points_once_all_are_marked(tmp_path):
    asked = [{"grade_id": "a-written", "points": 2}, {"grade_id": "b-written", "points": 3}]
    path = tmp_path / "grades.csv"
    assert written.previous_marks(path, asked) == ({}, [])
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerows([["student", "a-written", "b-written", "other"], ["ann", "2", "1.5", "9"], ["ben", "1", "", ""],
                     ["'=cmd", "0", "0", ""]])
    marks, notes = written.previous_marks(path, asked)
    assert marks == {"ann": {"a-written": "2", "b-written": "1.5"}, "ben": {"a-written": "1"},
                     "'=cmd": {"a-written": "0", "b-written": "0"}} and notes == []
    assert written.manual_row(asked, marks["ann"]) == {"a-written": "2", "b-written": "1.5", "manual_points": 3.5,
                                                       "manual_max": 5}
    assert written.manual_row(asked, marks["ben"])["manual_points"] == ""
    assert written.manual_row(asked, {"a-written": "good", "b-written": "3"})["manual_points"] == ""
    assert written.manual_row(asked, {"a-written": "2", "b-written": "3"})["manual_points"] == 5
    for bad in ("nan", "inf", "1e999", "-1", "2.5"):   # never a crash, never counted (2.5 > the 2 points)
        assert written.manual_row(asked, {"a-written": bad, "b-written": "3"})["manual_points"] == "", bad
    assert written.columns([]) == {"manual_points": "", "manual_max": 0}



def test_the_graders_zero_is_not_carried_as_a_mark(tmp_path):
    """The 0 the grader gave an unanswered question (flagged) is decided again at the next run: a resubmission that
    answers it is not stuck at 0. A 0 the instructor typed (no flag) and any other mark are kept."""
    asked = [{"grade_id": "a-written", "points": 2}, {"grade_id": "b-written", "points": 3}]
    path = tmp_path / "grades.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["student", "a-written", "b-written", "flags"],
                                 ["ann", "0", "0", "unanswered:a-written renamed"], ["ben", "0", "1", ""],
                                 ["cy", "1", "", "unanswered:a-written"]])
    marks, _ = written.previous_marks(path, asked)
    assert marks == {"ann": {"b-written": "0"}, "ben": {"a-written": "0", "b-written": "1"}, "cy": {"a-written": "1"}}
    assert written.unanswered(asked, {"a-written": {"status": "missing"}, "b-written": {"status": "answered"}}) == \
        ["unanswered:a-written"]


def test_an_unanswered_question_is_zero_unless_the_instructor_typed_a_mark():
    asked = [{"grade_id": "a-written", "points": 2}, {"grade_id": "b-written", "points": 3}]
    answered = {"a-written": {"status": "not-answered"}, "b-written": {"status": "missing"}}
    assert written.manual_row(asked, {}, answered) == {"a-written": "0", "b-written": "0", "manual_points": 0,
                                                        "manual_max": 5}
    assert written.manual_row(asked, {"b-written": "1", "a-written": " "}, answered)["manual_points"] == 1, \
        "a typed mark wins; a blank one does not erase the zero"
    half = written.manual_row(asked, {}, {"a-written": {"status": "answered"}, "b-written": {"status": "missing"}})
    assert half["a-written"] == "" and half["b-written"] == "0" and half["manual_points"] == ""


@pytest.mark.parametrize("lesson", labs.lesson_paths(), ids=lambda p: p.stem)
def test_every_lesson_asks_two_or_three_written_questions(lesson):
    nb = nbformat.read(lesson, as_version=4)
    asked = written.questions(nb)
    assert 2 <= len(asked) <= 3, f"{lesson.name}: {len(asked)} written questions"
    for q in asked:
        assert q["grade_id"].startswith(lesson.stem[:2] + "-written-")
        assert q["question"].startswith("**Written question") and "Marking guide" in q["guide"]


def test_unreadable_marks_stop_the_grader_before_it_overwrites_them(tmp_path):
    asked = [{"grade_id": "a-written", "points": 2}]
    path = tmp_path / "grades.csv"
    path.write_bytes("\ufeffstudent,a-written\nann, 2 \n".encode("utf-8"))   # Excel's UTF-8 CSV
    assert written.previous_marks(path, asked) == ({"ann": {"a-written": "2"}}, [])
    path.write_bytes("student,a-written\nJos\xe9,2\n".encode("latin-1"))
    with pytest.raises(written.MarksUnreadable, match="save it as UTF-8 CSV"):
        written.previous_marks(path, asked)
    path.write_text("name,a-written\nann,2\n")
    with pytest.raises(written.MarksUnreadable, match="no 'student' column"):
        written.previous_marks(path, asked)
    assert path.read_text() == "name,a-written\nann,2\n", "nothing overwritten"


def test_grade_refuses_to_overwrite_marks_it_cannot_read(tmp_path, capsys):
    (tmp_path / "subs").mkdir()
    (tmp_path / "out").mkdir()
    broken = "student,x\nJos\xe9,2\n".encode("latin-1")
    (tmp_path / "out" / "grades.csv").write_bytes(broken)
    assert grade.main([str(tmp_path / "subs"), "--lab", "01", "--out", str(tmp_path / "out"), "--no-sandbox"]) == 2
    assert "save it as UTF-8 CSV" in capsys.readouterr().err
    assert (tmp_path / "out" / "grades.csv").read_bytes() == broken


def test_marks_of_another_lab_or_of_two_students_under_one_name(tmp_path):
    asked = [{"grade_id": "a-written", "points": 2}]
    path = tmp_path / "grades.csv"
    path.write_text("student,lab,a-written\nann,06_quantization,2\n")
    with pytest.raises(written.MarksUnreadable, match="not '01_sft_from_scratch'"):
        written.previous_marks(path, asked, "01_sft_from_scratch")
    path.write_text("student,lab,a-written\nann,01_x,2\nann,01_x,1\nbob,01_x,2\nbob,01_x,2\n")
    marks, notes = written.previous_marks(path, asked, "01_x")
    assert marks == {"bob": {"a-written": "2"}} and notes == ["'ann' is on two rows of the old grades.csv with "
                                                              "different marks: neither carried"]
