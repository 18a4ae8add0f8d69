"""Grade a folder of executed student labs without re-running their training.

Usage (from the repository root)::

    python -m utils grade SUBMISSIONS_DIR --lab 01 [--out DIR] [--jobs 2] [--timeout 180] [--cell-timeout 30]
                          [--memory 2] [--no-sandbox]

``SUBMISSIONS_DIR`` holds one notebook per student, either as ``<student>.ipynb`` or as
``<student>/<anything>.ipynb`` (an LMS export). For each submission:

1. **Integrity.** Every graded check is compared with the instructor's lab by nbgrader checksum;
   a changed or deleted check is flagged, and the lesson's own check (hidden tests included) is
   what runs, always.
2. **Implementation.** Only what the checks need is re-executed, in the judge (:mod:`judge`: a
   separate plain Python process on the CPU, the checks out of the answers' reach) with the ``tiny``
   preset: the lesson's ``parameters`` and ``grader-setup`` cells, the definitions in the student's
   answer cells and the checks. An answer or check cell has ``--cell-timeout`` seconds (then it is
   interrupted; if it ignores the interrupt for 10 s more, the run is killed) and the notebook
   ``--timeout`` seconds (then the run is killed); the cell that hung is set aside and the rest is
   graded again. Answers that change what the checks rely on earn nothing (``judge-touched``).
3. **Results.** The records (``utils.read_records``) and figures of the student's own run are
   reported as self-reported, with the preset, model, device and hardware they ran on.
4. **Output** in ``--out`` (default ``SUBMISSIONS_DIR-grades``): ``grades.csv`` (one row per
   submission, rewritten after each one, so a grade once computed is never lost; the checks'
   points, ``auto_points`` of ``auto_max``, then one empty column per written question for the
   instructor's mark, ``manual_points`` of ``manual_max``), ``written.md`` (every student's
   written answers beside each question and its marking guide: :mod:`written`) and
   ``feedback/<student>.md`` with ``feedback/<student>/figure-N.png``. ``.judged/<student>.json`` keeps each
   judge's result: grading again (the instructor's marks typed in) reuses it for a notebook that has not changed,
   nor has the course, the limits or the sandbox (``--rejudge``: run the judge again all the same).

A broken submission (invalid JSON, missing cells, a syntax error, an infinite loop, a crashed
run, a renamed file, a symbolic link, the wrong lab) gets a row with flags saying what happened
and never stops the batch. Submissions are only read, never written, never followed as links.

Every run of a student's code is confined to a bubblewrap sandbox of its own (``sandbox``: the
course read-only, a scratch folder, no network, no secrets, memory/process/file limits, every
process killed with it). Without one the grader refuses, unless ``--no-sandbox`` is given: then
every row, and the summary, is flagged ``unsandboxed``.

Exit status: 0 when the batch was graded (whatever the grades), 2 for a usage error.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat

from .. import headlines
from ..constants import META_KEYS, UTILS_DIR
from ..records import read_records
from . import labs, sandbox, written
from .cells import LabError, grade_id, is_check
from .feedback import feedback_markdown
from .grading import (
    CELL_TIMEOUT_S,
    MAX_ATTEMPTS,
    NOTEBOOK_TIMEOUT_S,
    execute,
    grading_notebook,
    remove_scratch,
)
from .kernel import map_in_threads
from .lessons import lesson_number
from .submissions import figures as submission_figures
from .submissions import find_submissions, load, shown_meta, shown_name, unique_safe_names

JUDGED_DIR = ".judged"   # under the output folder: each submission's judge result, for the next run to reuse
STOPPED_BY = {"timeout": "the notebook time limit", "kernel-died": "a crash of the run",
              "memory-limit": "the memory limit", "process-limit": "the process limit",
              "scratch-full": "the scratch size limit"}


# ----------------------------------------------------------------------------- one submission
def grade_notebook(nb, lesson, lab, workdir: Path, timeout: int = NOTEBOOK_TIMEOUT_S,
                   cell_timeout: int = CELL_TIMEOUT_S, box: sandbox.Sandbox | None = None,
                   lesson_no: str | None = None) -> dict:
    """Grade one loaded submission: integrity, implementation (with retries), self-reported results.

    When a run is killed (notebook time limit) or dies, the cell that was running is
    set aside -- an answer cell is replaced by its stub, a check is failed with the reason -- and
    the notebook runs again, at most MAX_ATTEMPTS times. With ``box`` every run is confined to that
    sandbox (``lesson_no``, e.g. "05", says which earlier lessons' solutions it may import).
    """
    gnb, integrity = grading_notebook(lesson, nb, lab)
    lab_cells = {grade_id(c): c for c in lab.cells if grade_id(c)}
    killed, notes, run = {}, [], None
    for attempt in range(MAX_ATTEMPTS):
        run = execute(gnb, lab, workdir / f"attempt{attempt + 1}", timeout, cell_timeout, sandbox=box,
                      lesson=lesson_no)
        if run["status"] == "sandbox-error":
            notes.append("the sandbox could not be set up for this run: grade it again (or by hand)")
            break
        if run["status"] in ("ok", "forged", "touched") or run["running"] is None:
            break
        cell = gnb.cells[run["running"]]
        role, gid = cell.metadata["grading"]["role"], cell.metadata["grading"]["grade_id"]
        why = STOPPED_BY.get(run["status"], "a crash of the run")
        if role == "answer":
            notes.append(f"answer cell {gid} stopped the run ({why}); it was replaced by the stub and the rest re-run")
            integrity.append({"flag": run["status"], "grade_id": gid, "detail": f"answer cell hit {why}"})
            cell.source = lab_cells[gid].source
        elif role == "check":
            notes.append(f"check {gid} stopped the run ({why}); it was failed and the rest re-run")
            integrity.append({"flag": run["status"], "grade_id": gid, "detail": f"check hit {why}"})
            points = cell.metadata["nbgrader"]["points"]
            killed[gid] = {"passed": False, "ename": run["status"], "points": 0, "max_points": points,
                           "message": f"stopped by {why} while running this check"}
            gnb.cells.pop(run["running"])
        else:
            notes.append(f"a setup cell stopped the run ({why}); grading could not go on")
            break
    checks = {}
    for cell in lesson.cells:  # lesson order
        gid = grade_id(cell)
        if is_check(cell):
            checks[gid] = killed.get(gid) or run["checks"].get(gid) or {
                "passed": False, "ename": "NotRun", "points": 0, "max_points": cell.metadata.nbgrader["points"],
                "message": "not run"}
    return {"checks": checks, "integrity": integrity, "notes": notes, "status": run["status"],
            "detail": run["detail"], "answer_errors": run["answer_errors"], "setup_errors": run["setup_errors"],
            "skipped": run["skipped"],
            "attempts": attempt + 1}


def course_headline(lesson) -> dict | None:
    """The headline the course's executed lesson declared (``NN/headline``), or None when it has none."""
    try:
        return headlines.declared(read_records(lesson))
    except ValueError:   # the lesson's records unreadable
        return None


def self_reported(nb) -> tuple[dict, list, list[str]]:
    """(records, figures as PNG bytes, problems) read from the student's executed notebook."""
    problems = []
    try:
        records = read_records(nb)
    except ValueError as e:
        records, problems = {}, [f"records unreadable: {e}"]
    figures, left_out = submission_figures(nb)
    problems += left_out
    if not records:
        problems.append("no records: the lab was not run to its end (or not run at all)")
    return records, figures, problems


# ----------------------------------------------------------------------------- feedback and the CSV
def _flags(sub: dict, result: dict | None) -> list[str]:
    flags = list(sub["flags"])
    for item in (result or {}).get("integrity", []):
        flags.append(f"{item['flag']}:{item['grade_id']}")
    for key in ("wrong-lab", "invalid-notebook", "grader-error"):
        if result and result.get(key):
            flags.append(key)
    if result and result.get("status") in ("sandbox-error", "forged", "touched"):
        flags.append({"sandbox-error": "grader-error", "forged": "forged-run", "touched": "judge-touched"}[
            result["status"]])
    return flags


def course_digest(lesson_path: Path, lab) -> str:
    """What a judge's result depends on besides the submission: every ``.py`` file under ``utils/`` (the judge, the
    checks' helpers, the earlier lessons' answers a later lab imports), the lesson (its checks and hidden tests)
    and its lab (the stubs an answer is compared with)."""
    digest = hashlib.sha256()
    for path in sorted(UTILS_DIR.rglob("*.py")):
        digest.update(path.relative_to(UTILS_DIR).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(Path(lesson_path).read_bytes() + b"\0" + nbformat.writes(lab).encode())
    return digest.hexdigest()


def _judged(path: Path, key: str) -> dict | None:
    """The judge's result saved at ``path`` by an earlier run under the same ``key``; None when there is none."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        return saved["result"] if saved["key"] == key and isinstance(saved["result"], dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _reusable(result: dict) -> bool:
    """A judge's result that running it again would give again: the run finished at its first attempt (no time,
    memory or process limit, no crash, no sandbox failure) and no cell was interrupted at its time limit."""
    text = json.dumps(result)
    return result.get("status") == "ok" and result.get("attempts") == 1 and not result.get("notes") \
        and "KeyboardInterrupt" not in text


def grade_one(sub: dict, lesson, lab, lab_name: str, out: Path, tmp: Path, timeout: int, cell_timeout: int,
              box: sandbox.Sandbox | None = None, headline: dict | None = None, marks: dict | None = None,
              digest: str | None = None) -> dict:
    """Grade one submission and write its feedback; returns its CSV row (never raises).

    ``marks``: the instructor's marks of this student's written questions from an earlier run
    (:func:`written.previous_marks`); they go into the row and into the feedback. ``digest``
    (:func:`course_digest`): the judge's result an earlier run saved for this notebook, under the same digest,
    limits and sandbox, is reused (``sub["reused"]`` says so); None runs the judge whatever was saved.

    Its runs' scratch folders (under ``tmp``) are removed once it is graded."""
    student = sub["student"]
    safe = sub["safe"]
    row = {"student": student, "lab": lab_name,
           "file": shown_name(str(sub["path"].relative_to(sub["root"]))) if sub.get("path") else "",
           "feedback": f"feedback/{safe}.md"}
    sub["file"] = row["file"]
    result: dict = {}
    asked = written.questions(lesson)
    try:
        nb, reason = load(sub["path"]) if sub.get("path") else (None, sub.get("detail") or "no file")
        if nb is None:
            result = {"invalid-notebook": reason, "checks": {
                grade_id(c): {"passed": False, "points": 0, "max_points": c.metadata.nbgrader["points"],
                                   "message": "not graded: the file is not a notebook", "ename": None}
                for c in lesson.cells if is_check(c)}}
        else:
            theirs = nb.metadata.get(labs.LAB_META_KEY, {}).get("name")
            answered = written.answers(nb, asked)   # read first: a grading error keeps them
            result = {"written": answered}
            key = hashlib.sha256(json.dumps([nb, digest, timeout, cell_timeout, box.describe() if box else None],
                                            sort_keys=True).encode()).hexdigest()
            saved = out / JUDGED_DIR / f"{safe}.json"
            judged = _judged(saved, key) if digest else None
            sub["reused"] = judged is not None
            if judged is None:
                judged = grade_notebook(nb, lesson, lab, tmp / safe, timeout, cell_timeout, box,
                                        lesson_number(lab_name))
                try:   # kept for the next run; a result that cannot be kept is judged again then
                    saved.unlink(missing_ok=True)
                    if digest and _reusable(judged):
                        saved.parent.mkdir(parents=True, exist_ok=True)
                        saved.write_text(json.dumps({"key": key, "result": judged}), encoding="utf-8")
                except (OSError, TypeError, ValueError):
                    pass
            result = {**judged, "written": answered}
            if theirs and theirs != lab_name:
                result["wrong-lab"] = theirs
            records, figures, problems = self_reported(nb)
            result.update(records=records, figures=len(figures), result_problems=problems)
            fig_dir = out / "feedback" / safe
            for i, png in enumerate(figures):
                fig_dir.mkdir(parents=True, exist_ok=True)
                (fig_dir / f"figure-{i + 1}.png").write_bytes(png)
    except Exception as e:  # a bug or an unforeseen submission: this student gets a flagged row, the batch goes on
        result = {**result, "grader-error": f"{type(e).__name__}: {e}"}
        result.setdefault("notes", []).append(f"the grader failed on this submission ({type(e).__name__}: {e}); "
                                              "grade it by hand")
    remove_scratch(tmp / safe)
    checks = result.get("checks", {})
    for gid, c in checks.items():
        row[gid] = c["points"]
    row["auto_points"] = sum(c["points"] for c in checks.values())
    row["auto_max"] = sum(c["max_points"] for c in checks.values())
    row["_written"] = result.get("written", {})
    row["flags"] = " ".join(_flags(sub, result) + ([] if box else ["unsandboxed"]))
    row.update(shown_meta(result.get("records", {})))   # the student's text: one short line each in the CSV
    manual = written.manual_row(asked, marks or {}, result.get("written"))
    row.update(manual)
    row["flags"] = " ".join([*row["flags"].split(), *(f for f in written.unanswered(asked, result.get("written"))
                                                      if manual.get(f.split(":", 1)[1]) == "0")])
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    feedback = feedback_markdown(student, lab_name, sub, result, safe, headline, asked, manual)
    (out / "feedback" / f"{safe}.md").write_text(feedback, encoding="utf-8")
    return row


def _cell_text(value, cut: int | None = 200):
    """A CSV cell a spreadsheet shows as text: what a student wrote (a name, a self-reported record) is
    cut to ``cut`` characters and never starts like a formula (``=HYPERLINK(...)`` is quoted). The
    grader's own ``flags`` are never cut (``cut=None``): a long list must not lose ``wrong-lab``."""
    if not isinstance(value, str):
        return value
    value = value[:cut]
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def write_csv(rows: list[dict], columns: list[str], path: Path) -> None:
    """Write the rows (sorted by student) atomically: a crash never leaves a half-written file."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in sorted(rows, key=lambda r: r["student"]):
        writer.writerow({k: _cell_text(v, None if k == "flags" else 200) for k, v in row.items()})
    tmp = path.with_suffix(".csv.tmp")
    tmp.write_text(buf.getvalue(), encoding="utf-8")
    tmp.replace(path)


def grade_folder(folder, lab: str, out=None, jobs: int = 2, timeout: int = NOTEBOOK_TIMEOUT_S,
                 cell_timeout: int = CELL_TIMEOUT_S, progress=print, box: sandbox.Sandbox | None | bool = True,
                 rejudge: bool = False) -> list[dict]:
    """Grade every submission in ``folder`` against lab ``lab`` ("01", a name, or a lesson path).

    ``box``: True finds this machine's sandbox (:func:`sandbox.find`, which raises
    :class:`sandbox.SandboxUnavailable` when there is none), a :class:`sandbox.Sandbox` is used as
    it is, and False or None grades unsandboxed: every row is then flagged ``unsandboxed``. A notebook graded
    before reuses its judge's result (:func:`grade_one`) unless ``rejudge``.
    """
    folder = Path(folder)
    box = sandbox.find() if box is True else (box or None)
    if not folder.is_dir():
        raise FileNotFoundError(f"no such folder of submissions: {folder}")
    lesson_path = labs.lesson_paths([lab])[0]
    lab_name = lesson_path.stem
    lesson = nbformat.read(lesson_path, as_version=4)
    lab_nb = labs.lab_for(lesson_path)
    headline = course_headline(lesson)
    digest = None if rejudge else course_digest(lesson_path, lab_nb)
    out = Path(out) if out else folder.with_name(folder.name + "-grades")
    out.mkdir(parents=True, exist_ok=True)
    subs = [dict(s, root=folder) for s in find_submissions(folder, lab_name, exclude=out)]
    unique_safe_names(subs)
    check_ids = [grade_id(c) for c in lesson.cells if is_check(c)]
    asked = written.questions(lesson)
    columns = ["student", "lab", "file", "feedback", *check_ids, "auto_points", "auto_max", *written.columns(asked),
               "flags", *META_KEYS]
    rows, lock, answers, used = [], threading.Lock(), {}, set()
    csv_path = out / "grades.csv"
    marks, notes = written.previous_marks(csv_path, asked, lab_name)   # an instructor's marks survive a new run
    if marks:   # and a copy of the file they were typed in stays, whatever happens to this run
        backup = csv_path.with_name(f"grades.csv.bak-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.copy2(csv_path, backup)
        notes.append(f"marks kept from {csv_path.name} (a copy: {backup.name})")
    for note in notes:
        progress(note)
    write_csv(rows, columns, csv_path)
    written.clear_images(out)   # an earlier run's pictures: this run saves its own
    progress(f"grading {len(subs)} submission(s) of {lab_name} from {folder} ({jobs} at a time) ...")
    progress(f"sandbox: bubblewrap; {box.describe()}" if box else
             "UNSANDBOXED (--no-sandbox): the students' code runs with your rights; every row is flagged")

    tmp = Path(tempfile.mkdtemp(prefix=f"grade-{os.getpid()}-"))   # whose it is, as its cgroups

    def work(sub):
        t = time.perf_counter()
        try:
            row = grade_one(sub, lesson, lab_nb, lab_name, out, tmp, timeout, cell_timeout, box, headline,
                            marks.get(_cell_text(sub["student"]), {}), digest)
        except Exception as e:  # even the row or the feedback could not be written: a bare row, the batch goes on
            row = {"student": sub["student"], "lab": lab_name, "auto_points": 0, "auto_max": 0,
                   "flags": " ".join([*sub["flags"], "grader-error"]), "file": "",
                   "feedback": f"feedback/{sub['safe']}.md"}
            progress(f"  the grader failed on {sub['student']!r} ({type(e).__name__}: {str(e)[:200]}): "
                     "grade it by hand")
            row.update(written.manual_row(asked, marks.get(_cell_text(row["student"]), {})))
        with lock:
            rows.append(row)
            used.add(_cell_text(row["student"]))
            name = row["student"] if not row.get("file") else f"{row['student']} ({row['file']})"
            answers[name] = row.pop("_written", {})
            write_csv(rows, columns, csv_path)
            if asked:
                try:   # a picture that cannot be saved is left out; written.md is still written
                    written.save_images(out, len(answers), answers[name])
                except OSError as e:
                    progress(f"  pictures of {name!r} could not be saved ({type(e).__name__}: {str(e)[:200]})")
                try:
                    (out / "written.md").write_text(written.markdown(lab_name, asked, answers), encoding="utf-8")
                except (OSError, UnicodeError) as e:   # never stops the batch: grades.csv is written
                    progress(f"  written.md could not be written ({type(e).__name__}: {str(e)[:200]})")
            progress(f"  {row['student']:<20} {row['auto_points']:>3} / {row['auto_max']:<3} "
                     f"{time.perf_counter() - t:6.1f} s  {row['flags']}".rstrip()
                     + ("  (the judge's result of the last run, reused)" if sub.get("reused") else ""))
        return row

    try:
        map_in_threads(work, subs, jobs)
    finally:
        remove_scratch(tmp)
    for student in sorted(set(marks) - used):
        progress(f"marks of {student!r} not carried: no submission under that name this time (see the copy)")
    wrote = f"{csv_path}, {out / 'written.md'} (written answers to mark in grades.csv)" if asked else str(csv_path)
    progress(f"wrote {wrote} and {out / 'feedback'}/" + ("" if box else " (UNSANDBOXED)"))
    return sorted(rows, key=lambda r: r["student"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("submissions", help="folder with <student>.ipynb files or <student>/ folders")
    parser.add_argument("--lab", required=True, help="the lab graded: its number (01) or name")
    parser.add_argument("--out", help="output folder (default: SUBMISSIONS-grades beside the folder)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="submissions graded at once")
    parser.add_argument("--timeout", type=int, default=NOTEBOOK_TIMEOUT_S, help="seconds per notebook run")
    parser.add_argument("--cell-timeout", type=int, default=CELL_TIMEOUT_S,
                        help="seconds per cell before it is interrupted")
    parser.add_argument("--memory", type=float, default=sandbox.DEFAULT_MEMORY_GIB,
                        help="GiB of memory per submission (the sandbox's limit)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="grade without the sandbox (the students' code runs with your rights); every row is "
                             "flagged `unsandboxed`")
    parser.add_argument("--rejudge", action="store_true",
                        help="run the judge again on every notebook, even one graded before and unchanged since")
    args = parser.parse_args(argv)
    try:
        t = time.perf_counter()
        if not Path(args.submissions).is_dir():
            raise FileNotFoundError(f"no such folder of submissions: {args.submissions}")
        labs.lesson_paths([args.lab])  # a wrong lab is said before a missing sandbox
        box = None if args.no_sandbox else sandbox.find(sandbox.Limits(memory=int(args.memory * sandbox.GiB)))
        rows = grade_folder(args.submissions, args.lab, args.out, args.jobs, args.timeout, args.cell_timeout,
                            box=box, rejudge=args.rejudge)
    except sandbox.SandboxUnavailable as e:
        print(f"error: no sandbox: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, LookupError, LabError, written.MarksUnreadable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(rows)} submission(s) graded in {time.perf_counter() - t:.1f} s"
          + ("" if box else "; UNSANDBOXED: every row is flagged"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
