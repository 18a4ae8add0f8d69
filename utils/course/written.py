"""Written questions: the answers collected for the instructor to mark, and the marks kept.

A lesson asks a written question in a markdown cell and gives its marking guide in the markdown
cell after it (nbgrader's manually graded answer: ``grade`` and ``solution`` true; see
``utils.course.cells``). The student edition replaces the guide by ``YOUR ANSWER HERE``.

``grade`` reads each submission's answers (text only: nothing a student wrote is run or rendered
as HTML) and writes ``written.md`` beside ``grades.csv``: per question, its text, the marking guide
and every student's answer. Pictures pasted into an answer (the cell's attachments) are saved under
``written_images/`` by names of the grader's, when their bytes are the PNG, JPEG or GIF they claim.
The instructor marks in ``grades.csv``, one column per question;
automatic points (``auto_points`` of ``auto_max``) and manual ones (``manual_points`` of
``manual_max``) stay in columns of their own, and marks already in the file are kept when the
grader runs again.
"""
from __future__ import annotations

import base64
import binascii
import csv
import html
import math
import shutil
from pathlib import Path

from .cells import TEXT_STUB, grade_id, is_written, nbgrader_meta, question_of


class MarksUnreadable(ValueError):
    """An existing ``grades.csv`` whose marks could not be read (the grader stops rather than overwrite it)."""


MAX_ANSWER_CHARS = 6000   # what ``written.md`` shows of one answer (the rest is cut, and says so)
MAX_IMAGES, MAX_IMAGE_BYTES = 4, 2 << 20   # pictures pasted into one answer that are saved, and the largest
IMAGES_DIR = "written_images"              # beside written.md
IMAGE_TYPES = {"image/png": (b"\x89PNG\r\n\x1a\n", "png"), "image/jpeg": (b"\xff\xd8\xff", "jpg"),
               "image/gif": (b"GIF8", "gif")}   # no SVG: it can hold a script


def questions(lesson) -> list[dict]:
    """``[{"grade_id", "points", "question", "guide", "cell_id"}]`` for the lesson's written questions, in order."""
    return [{"grade_id": grade_id(c), "points": nbgrader_meta(c)["points"], "question": question_of(lesson, i),
             "guide": c.source, "cell_id": c.get("id")} for i, c in enumerate(lesson.cells) if is_written(c)]


def answers(nb, asked: list[dict]) -> dict[str, dict]:
    """``{grade_id: {"status", "text"}}``: what a submission wrote under each question.

    ``status`` is ``answered``, ``not-answered`` (the cell still holds ``YOUR ANSWER HERE`` or
    nothing) or ``missing`` (no markdown cell with that grade_id or the lab's cell id).
    """
    cells = [c for c in getattr(nb, "cells", []) if isinstance(c, dict) and c.get("cell_type") == "markdown"]
    by_key = {}
    for cell in cells:
        gid = grade_id(cell) if isinstance(cell.get("metadata"), dict) else None
        for key in (gid, cell.get("id")):   # the grade_id, else the lab's cell id (metadata stripped by an editor)
            if isinstance(key, str):
                by_key.setdefault(key, cell)
    found = {}
    for q in asked:
        cell = by_key.get(q["grade_id"]) or by_key.get(q.get("cell_id"))
        text = cell.get("source") if cell is not None else None
        if isinstance(text, list):
            text = "".join(t for t in text if isinstance(t, str))
        if not isinstance(text, str):
            found[q["grade_id"]] = {"status": "missing", "text": ""}
        elif text.strip() in ("", TEXT_STUB):
            found[q["grade_id"]] = {"status": "not-answered", "text": ""}
        else:   # kept short, and valid UTF-8 (a lone surrogate from the JSON would stop written.md being written)
            text = text[:MAX_ANSWER_CHARS + 1].encode("utf-8", "replace").decode("utf-8")
            found[q["grade_id"]] = {"status": "answered", "text": text}
        if cell is not None and cell.get("attachments"):
            found[q["grade_id"]]["images"], found[q["grade_id"]]["images_left"] = _images(cell.get("attachments"))
    return found


def _images(attachments) -> tuple[list[tuple[str, bytes]], int]:
    """``([(extension, bytes)], left)``: the pictures of a cell's attachments whose bytes are the PNG, JPEG or
    GIF they say they are, at most :data:`MAX_IMAGES` of :data:`MAX_IMAGE_BYTES` each; ``left``: the others."""
    kept, left = [], 0
    bundles = [attachments[k] for k in sorted(attachments)] if isinstance(attachments, dict) else []
    for bundle in bundles:
        found = None
        for mime, (magic, ext) in IMAGE_TYPES.items():
            data = bundle.get(mime) if isinstance(bundle, dict) else None
            if isinstance(data, list):
                data = "".join(d for d in data if isinstance(d, str))
            if not isinstance(data, str) or len(data) > 2 * MAX_IMAGE_BYTES:
                continue
            try:
                raw = base64.b64decode(data)
            except (binascii.Error, ValueError):
                continue
            if raw.startswith(magic) and len(raw) <= MAX_IMAGE_BYTES:
                found = (ext, raw)
                break
        if found is not None and len(kept) < MAX_IMAGES:
            kept.append(found)
        else:
            left += 1
    return kept, left


def clear_images(out: Path) -> None:
    """Remove the pictures an earlier run saved under ``out`` (a folder of the grader's, never a link)."""
    folder = Path(out) / IMAGES_DIR
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.is_dir():
        shutil.rmtree(folder)


def save_images(out: Path, number: int, found: dict[str, dict]) -> None:
    """Save one submission's pasted pictures as ``written_images/<number>-<grade_id>-<k>.<ext>`` (names of the
    grader's: nothing of the student's in a path) and note each file's path in its answer, for :func:`markdown`."""
    for gid, answer in found.items():
        files = []
        for k, (ext, raw) in enumerate(answer.pop("images", []), 1):
            path = Path(out) / IMAGES_DIR / f"{number:03d}-{gid}-{k}.{ext}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(raw)
            files.append(f"{IMAGES_DIR}/{path.name}")
        if files:
            answer["image_files"] = files


def _quoted(text: str) -> list[str]:
    """A student's answer as a markdown block quote of escaped text (no HTML, no link, no heading of theirs)."""
    cut = len(text) > MAX_ANSWER_CHARS
    text = html.escape(text[:MAX_ANSWER_CHARS]).replace("[", "&#91;").replace("`", "&#96;")
    lines = [f"> {line}".rstrip() for line in text.splitlines()]
    if cut:
        lines.append(f"> *(cut at {MAX_ANSWER_CHARS} characters: read the rest in the notebook)*")
    return lines


def _name(student: str) -> str:
    """A student's name (from a file name) as one line of plain text: escaped, no link, image or line break."""
    text = html.escape(str(student)[:200]).encode("utf-8", "replace").decode("utf-8")
    for ch, code in (("[", "&#91;"), ("]", "&#93;"), ("`", "&#96;"), ("!", "&#33;"), ("*", "&#42;"), ("_", "&#95;")):
        text = text.replace(ch, code)
    return " ".join(text.split()) or "(no name)"


def markdown(lab_name: str, asked: list[dict], by_student: dict[str, dict]) -> str:
    """The text of ``written.md``: each question, its guide, and every student's answer (sorted by name)."""
    lines = [f"# {lab_name}: written questions", "",
             "Mark each answer in `grades.csv`, in the question's column (0 to its points); marks already in "
             "`grades.csv` are kept when the grader runs again. Answers are shown as text, escaped; pictures "
             f"pasted into them as files the grader saved in `{IMAGES_DIR}/`.", ""]
    for q in asked:
        lines += [f"## {q['grade_id']} ({q['points']} points)", "", q["question"].strip(), "",
                  "<details><summary>Marking guide</summary>", "", q["guide"].strip(), "", "</details>", ""]
        for student in sorted(by_student):
            a = by_student[student].get(q["grade_id"], {"status": "missing", "text": ""})
            lines += [f"### {_name(student)}", ""]
            if a["status"] == "answered":
                lines += _quoted(a["text"])
                lines += [">", *(f"> ![picture {k} pasted into this answer]({f})" for k, f in
                                 enumerate(a.get("image_files", []), 1))] if a.get("image_files") else []
                if a.get("images_left"):
                    lines.append(f"> *({a['images_left']} other attachment(s) not shown: only PNG, JPEG or GIF under "
                                 f"{MAX_IMAGE_BYTES >> 20} MB, {MAX_IMAGES} per answer; see the notebook)*")
            else:
                lines.append("*(no answer: the cell still says YOUR ANSWER HERE)*" if a["status"] == "not-answered"
                             else "*(no answer found: the cell is missing, or the notebook could not be read)*")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def number(value: str, points: int) -> float | None:
    """A mark as a number from 0 to ``points``, or None (text, nan, inf, out of range: not counted)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and 0 <= v <= points else None


def previous_marks(csv_path: Path, asked: list[dict], lab_name: str | None = None
                   ) -> tuple[dict[str, dict[str, str]], list[str]]:
    """``({student: {grade_id: mark}}, notes)``: the marks an instructor already wrote in ``grades.csv``.

    Raises :class:`MarksUnreadable` when the file cannot be read as CSV, has no ``student`` column or
    is another lab's (the grader would overwrite it). A name on two rows with different marks (two
    submissions under one name) carries none of them, and ``notes`` says so. A 0 the grader gave an unanswered
    question (the row's ``unanswered:<grade_id>`` flag) is not a mark: the next run decides again.
    """
    if not asked or not Path(csv_path).is_file():
        return {}, []
    ids = [q["grade_id"] for q in asked]
    try:   # a spreadsheet may have saved it with a byte-order mark
        with open(csv_path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise MarksUnreadable(f"{csv_path} holds marks that could not be read ({e}); the grader would overwrite "
                              "them: save it as UTF-8 CSV, or move it away, and grade again") from None
    if rows and "student" not in rows[0]:
        raise MarksUnreadable(f"{csv_path} has no 'student' column; the grader would overwrite it: restore the "
                              "column, or move the file away, and grade again")
    labs = {row.get("lab") for row in rows} - {None, ""}
    if lab_name and labs and labs != {lab_name}:
        raise MarksUnreadable(f"{csv_path} holds grades of {sorted(labs)}, not {lab_name!r}: grade into another "
                              "--out folder")
    marks, notes, seen, conflicted = {}, [], {}, set()
    for row in rows:
        if not isinstance(row.get("student"), str):
            continue
        automatic = set(str(row.get("flags") or "").split())   # the grader's 0 for an unanswered question
        got = {g: row[g].strip() for g in ids if isinstance(row.get(g), str) and row[g].strip()
               and not (row[g].strip() == "0" and f"{UNANSWERED}:{g}" in automatic)}
        student = row["student"]
        if student in seen and seen[student] != got and student not in conflicted:
            conflicted.add(student)
            notes.append(f"{student!r} is on two rows of the old grades.csv with different marks: neither carried")
        seen[student] = got
        if got:
            marks[student] = got
    return {k: v for k, v in marks.items() if k not in conflicted}, notes


UNANSWERED = "unanswered"   # flag: the grader marked this written question 0 (not the instructor)


def unanswered(asked: list[dict], answered: dict[str, dict] | None) -> list[str]:
    """The flags of the written questions a submission left unanswered (the stub, or the cell missing)."""
    return [f"{UNANSWERED}:{q['grade_id']}" for q in asked
            if (answered or {}).get(q["grade_id"], {}).get("status") in ("not-answered", "missing")]


def columns(asked: list[dict]) -> dict[str, str]:
    """Empty manual columns of a row: one per question, ``manual_points`` and ``manual_max``."""
    return {**{q["grade_id"]: "" for q in asked}, "manual_points": "",
            "manual_max": sum(q["points"] for q in asked)}


def manual_row(asked: list[dict], marks: dict[str, str], answered: dict[str, dict] | None = None) -> dict:
    """A row's manual columns: the kept marks, and ``manual_points`` once every question has a numeric mark.

    ``answered`` (:func:`answers`): a question the submission left unanswered (the stub, or the cell missing)
    is marked 0 unless the instructor typed a mark for it; there is nothing to read."""
    row = columns(asked)
    for flag in unanswered(asked, answered):
        row[flag.split(":", 1)[1]] = "0"
    row.update({g: m for g, m in marks.items() if g in row and str(m).strip()})
    values = [number(row[q["grade_id"]], q["points"]) for q in asked]
    if asked and all(v is not None for v in values):
        total = sum(values)
        row["manual_points"] = int(total) if total == int(total) else total
    return row
