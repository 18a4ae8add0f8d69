"""Grade a folder of executed student labs without re-running their training.

Usage (from the repository root)::

    python -m utils.grade SUBMISSIONS_DIR --lab 01 [--out DIR] [--jobs 2] [--timeout 180] [--cell-timeout 30]

``SUBMISSIONS_DIR`` holds one notebook per student, either as ``<student>.ipynb`` or as
``<student>/<anything>.ipynb`` (an LMS export). For each submission:

1. **Integrity.** Every graded check is compared with the instructor's lab by nbgrader checksum;
   a changed or deleted check is flagged, and the lesson's own check (hidden tests included) is
   what runs, always.
2. **Implementation.** Only what the checks need is re-executed, with papermill in a separate
   kernel on the CPU with the ``tiny`` preset: the lesson's ``parameters`` and ``grader-setup``
   cells, the student's answer cells and the checks. An answer or check cell has ``--cell-timeout``
   seconds (then it is interrupted; if it ignores the interrupt for 10 s more, its kernel is killed) and the
   notebook ``--timeout`` seconds (then its kernel is killed); the cell that hung is set aside and
   the rest is graded again.
3. **Results.** The records (``utils.read_records``) and figures of the student's own run are
   reported as self-reported, with the preset, model, device and hardware they ran on.
4. **Output** in ``--out`` (default ``SUBMISSIONS_DIR-grades``): ``grades.csv`` (one row per
   submission, rewritten after each one, so a grade once computed is never lost) and
   ``feedback/<student>.md`` with ``feedback/<student>/figure-N.png``.

A broken submission (invalid JSON, missing cells, a syntax error, an infinite loop, a kernel
crash, a renamed file, the wrong lab) gets a row with flags saying what happened and never stops
the batch. Submissions are only read, never written. The grader runs the students' code: run it
as a user (or in a container) that can reach nothing you would not hand a student.

Exit status: 0 when the batch was graded (whatever the grades), 2 for a usage error.
"""
from __future__ import annotations

import argparse
import base64
import copy
import csv
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from utils import labs
from utils.records import read_records
from utils.run import META_KEYS, meta_of

REPO_ROOT = labs.REPO_ROOT
KERNEL_ENV = {  # the grading kernel: CPU only, one thread per kernel, offline, quiet
    "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1",
    "MPLBACKEND": "Agg", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore",
}
CELL_TIMEOUT_S, NOTEBOOK_TIMEOUT_S, MAX_ATTEMPTS = 30, 180, 3
INTERRUPT_GRACE_S = 10  # a cell still running this long after its interrupt is killed with its kernel


# ----------------------------------------------------------------------------- the grading notebook
def _defined_names(source: str) -> set[str]:
    return set(re.findall(r"^def\s+(\w+)\s*\(", source, flags=re.M))


def match_cells(lesson, submission) -> dict:
    """For each answer and check cell of the lesson (by grade_id), the submission's cell or None.

    A cell is found by its nbgrader grade_id, else by its cell id (labs keep the lesson's ids),
    else (answer cells) by the functions it defines.
    """
    code = [c for c in submission.cells if c.cell_type == "code"]
    by_gid, by_id = {}, {}
    for cell in code:
        gid = labs.grade_id(cell)
        if gid and gid not in by_gid:
            by_gid[gid] = cell
        if cell.get("id"):
            by_id.setdefault(cell["id"], cell)
    found = {}
    for cell in lesson.cells:
        if not (labs.is_solution(cell) or labs.is_grade(cell)):
            continue
        gid = labs.grade_id(cell)
        match = by_gid.get(gid) or by_id.get(cell.get("id"))
        if match is None and labs.is_solution(cell):
            names = _defined_names(cell.source)
            match = next((c for c in code if names and names <= _defined_names(c.source)), None)
        found[gid] = match
    return found


def grading_notebook(lesson, answers, lab=None):
    """The notebook that grades ``answers`` (a submission, a lab, or the lesson itself).

    Cells, in the lesson's order: its ``parameters`` cell and ``grader-setup`` cells (the lesson's
    source), each answer cell (the submission's source; the lab's stub when it has none) and each
    graded check (the lesson's source, hidden tests included). Every cell is tagged
    ``raises-exception`` so that one failure does not stop the run.

    Returns ``(notebook, integrity)``; with ``lab`` given, ``integrity`` lists
    ``{"flag", "grade_id", "detail"}`` dicts: a check modified or deleted, an answer cell missing
    or left as the stub.
    """
    lab = lab if lab is not None else labs.build_lab(lesson, "lesson")
    lab_cells = {labs.grade_id(c): c for c in lab.cells if labs.grade_id(c)}
    found = match_cells(lesson, answers)
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    integrity = []
    for cell in lesson.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type != "code":
            continue
        gid = labs.grade_id(cell)
        if "parameters" in tags or labs.SETUP_TAG in tags:
            source, role = cell.source, "parameters" if "parameters" in tags else "setup"
        elif labs.is_solution(cell):
            sub, stub = found.get(gid), lab_cells[gid]
            if sub is None:
                integrity.append({"flag": "missing-answer", "grade_id": gid,
                                  "detail": "answer cell not found; graded as the unanswered stub"})
                source = stub.source
            else:
                source = sub.source
                if source == stub.source:
                    integrity.append({"flag": "not-attempted", "grade_id": gid, "detail": "the stub is unchanged"})
            role = "answer"
        elif labs.is_grade(cell):
            sub, ref = found.get(gid), lab_cells[gid]
            if sub is None:
                integrity.append({"flag": "deleted", "grade_id": gid,
                                  "detail": "graded check deleted; restored from the lesson"})
            else:
                theirs = copy.deepcopy(ref)
                theirs.source = sub.source
                if labs.compute_checksum(theirs) != ref.metadata.nbgrader["checksum"]:
                    integrity.append({"flag": "modified", "grade_id": gid,
                                      "detail": "graded check changed (checksum differs); restored from the lesson"})
            source, role = cell.source, "check"
        else:
            continue
        new = nbformat.v4.new_code_cell(source)
        new.metadata["tags"] = (["parameters"] if role == "parameters" else []) + ["raises-exception"]
        new.metadata["grading"] = {"role": role, "grade_id": gid}
        if labs.is_grade(cell):
            new.metadata["nbgrader"] = copy.deepcopy(cell.metadata["nbgrader"])
        nb.cells.append(new)
    return nb, integrity


# ----------------------------------------------------------------------------- executing it
def _limited(metadata) -> bool:
    """Whether a grading cell runs under the cell time limit (answers and checks do)."""
    return metadata.get("grading", {}).get("role") in ("answer", "check")


def _worker(argv) -> int:
    """Run in a child process: execute one grading notebook with papermill; write a status file."""
    src, dst, cell_timeout, cwd, status_path, params = argv
    import papermill

    def timeout_of(cell):  # answers and checks get the cell limit; setup cells only the notebook's
        return int(cell_timeout) if _limited(cell.metadata) else None

    status = {"status": "ok", "detail": ""}
    try:
        papermill.execute_notebook(src, dst, parameters=json.loads(params), kernel_name="python3", cwd=cwd,
                                   progress_bar=False, log_output=False, timeout_func=timeout_of,
                                   interrupt_on_timeout=True, start_timeout=120)
    except papermill.PapermillExecutionError:
        pass  # papermill reports the errors the cells were allowed to raise: read_run reads them
    except Exception as e:  # a dead kernel, a kernel that would not start, ...
        dead = type(e).__name__ == "DeadKernelError"
        first = (str(e).strip().splitlines() or [""])[0][:200]
        status = {"status": "kernel-died" if dead else "error", "detail": f"{type(e).__name__}: {first}"}
    Path(status_path).write_text(json.dumps(status), encoding="utf-8")
    return 0


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill a process and every descendant (papermill and the kernel it started)."""
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        family = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def _check_message(ename: str, evalue: str, cell_timeout: int) -> str:
    evalue = (evalue.strip().splitlines() or [""])[0][:300]
    if ename == "AssertionError":
        return evalue or "an assertion failed (it has no message)"
    if ename == "NotImplementedError":
        return f"not implemented: {evalue}"
    if ename == "KeyboardInterrupt":
        return f"timed out after {cell_timeout} s and was interrupted (an endless loop, or far too slow?)"
    return f"{ename}: {evalue}"


def read_run(executed, cell_timeout: int, stopped: str = "") -> dict:
    """Per-check results and the errors of answer/setup cells, from an executed grading notebook.

    ``running`` is the index of the cell the run stopped in: the one papermill marks as running
    (the process was killed), else, when ``stopped`` says the run stopped early, the cell the
    kernel died in: the one it started (nbclient records ``iopub.execute_input``) but never
    answered (no ``shell.execute_reply``), or, when the kernel died before it even announced the
    cell, the first cell it never started.
    """
    checks, answer_errors, setup_errors, running, first_unrun, unanswered = {}, [], [], None, None, None
    for i, cell in enumerate(_own_cells(executed.cells)):
        role = cell.metadata.get("grading", {}).get("role")
        gid = cell.metadata.get("grading", {}).get("grade_id")
        pm = cell.metadata.get("papermill", {})
        if pm.get("status") == "running":
            running = i
        error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
        # Only the kernel sets execution_count; papermill marks cells "completed" even after a dead kernel.
        ran = cell.get("execution_count") is not None
        if not ran and first_unrun is None:
            first_unrun = i
        timing = cell.metadata.get("execution", {})
        if unanswered is None and (ran or "iopub.execute_input" in timing) and "shell.execute_reply" not in timing:
            unanswered = i
        if role == "check":
            points = cell.metadata["nbgrader"]["points"]
            if error is not None:
                ename, evalue = error.get("ename", "Error"), error.get("evalue", "")
                res = {"passed": False, "ename": ename, "message": _check_message(ename, evalue, cell_timeout)}
            elif ran:
                res = {"passed": True, "ename": None, "message": ""}
            else:
                res = {"passed": False, "ename": "NotRun", "message": f"not run: {stopped or 'the run stopped before it'}"}
            checks[gid] = {**res, "points": points if res["passed"] else 0, "max_points": points}
        elif error is not None:
            entry = {"cell": i + 1, "grade_id": gid,
                     "error": _check_message(error.get("ename", "Error"), error.get("evalue", ""), cell_timeout)}
            (answer_errors if role == "answer" else setup_errors).append(entry)
    if running is None and stopped:  # a dead kernel: the cell it never answered
        running = unanswered if unanswered is not None else first_unrun
    return {"checks": checks, "answer_errors": answer_errors, "setup_errors": setup_errors, "running": running}


def _own_cells(cells: list) -> list:
    """The grading notebook's cells, without those papermill adds (injected parameters, error banner)."""
    return [c for c in cells if not {"injected-parameters", "papermill-error-cell-tag"}
            & set(c.get("metadata", {}).get("tags", []))]


def _running_cell(executed_path: Path) -> int | None:
    """Index (papermill's cells excluded) of the answer or check cell papermill marks as running, or None."""
    try:
        cells = json.loads(executed_path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not written yet, or caught mid-write
    return next((i for i, c in enumerate(_own_cells(cells)) if c.get("metadata", {}).get("papermill", {}).get("status") == "running"
                 and _limited(c.get("metadata", {}))), None)


def execute(gnb, workdir: Path, timeout: int = NOTEBOOK_TIMEOUT_S, cell_timeout: int = CELL_TIMEOUT_S) -> dict:
    """Execute a grading notebook once, in a separate process and kernel, within ``timeout`` seconds.

    Returns ``{"status": "ok" | "timeout" | "kernel-died" | "error", "detail", "wall_s", "checks",
    "answer_errors", "setup_errors", "running"}`` (``running``: index of the cell that was running
    when the run stopped, or None). The executed notebook is ``workdir/executed.ipynb``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    src, dst, status_path = workdir / "grading.ipynb", workdir / "executed.ipynb", workdir / "status.json"
    for p in (dst, status_path):
        p.unlink(missing_ok=True)
    nbformat.write(gnb, src)
    params = json.dumps({"PRESET": "tiny", "SEED": 0, "OUTPUT_DIR": str(workdir / "output")})
    cmd = [sys.executable, "-c", "import sys; from utils.grade import _worker; sys.exit(_worker(sys.argv[1:]))",
           str(src), str(dst), str(cell_timeout), str(labs.NOTEBOOKS_DIR), str(status_path), params]
    env = {**os.environ, **KERNEL_ENV}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    status, running_since = None, {}
    while status is None:
        try:
            proc.wait(timeout=1.0)
            status = json.loads(status_path.read_text()) if status_path.is_file() else \
                {"status": "error", "detail": f"the grading process exited with {proc.returncode}"}
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.perf_counter()
        stuck = _running_cell(dst)
        if stuck is not None:
            running_since.setdefault(stuck, now)
        if now - start > timeout:
            status = {"status": "timeout", "detail": f"the notebook ran past its {timeout} s limit; its kernel was killed"}
        elif stuck is not None and now - running_since[stuck] > cell_timeout + INTERRUPT_GRACE_S:
            status = {"status": "timeout", "detail": f"a cell ran past its {cell_timeout} s limit and ignored the "
                                                     "interrupt; its kernel was killed"}
        if status is not None:
            _kill_tree(proc)
    wall = round(time.perf_counter() - start, 1)
    executed = None
    if dst.is_file():
        try:
            executed = nbformat.read(dst, as_version=4)
        except Exception:
            executed = None
    stopped = "" if status["status"] == "ok" else status["detail"]
    run = read_run(executed if executed is not None else gnb, cell_timeout, stopped)
    return {**status, "wall_s": wall, **run}


# ----------------------------------------------------------------------------- one submission
def _load(path: Path):
    """(notebook, None) or (None, reason) for a file that is not a readable v4 notebook."""
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not a text file"
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg}, line {e.lineno})"
    except OSError as e:
        return None, f"unreadable ({e.strerror})"
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        return None, "JSON, but not a notebook (no 'cells' list)"
    if raw.get("nbformat") != 4:
        return None, f"notebook format {raw.get('nbformat')!r}; version 4 expected"
    try:
        return nbformat.reads(json.dumps(raw), as_version=4), None
    except Exception as e:  # nbformat's own reader refuses it
        return None, f"not a readable notebook ({type(e).__name__}: {str(e)[:200]})"


def grade_notebook(nb, lesson, lab, workdir: Path, timeout: int = NOTEBOOK_TIMEOUT_S,
                   cell_timeout: int = CELL_TIMEOUT_S) -> dict:
    """Grade one loaded submission: integrity, implementation (with retries), self-reported results.

    When a run is killed (notebook time limit) or its kernel dies, the cell that was running is
    set aside -- an answer cell is replaced by its stub, a check is failed with the reason -- and
    the notebook runs again, at most MAX_ATTEMPTS times.
    """
    gnb, integrity = grading_notebook(lesson, nb, lab)
    lab_cells = {labs.grade_id(c): c for c in lab.cells if labs.grade_id(c)}
    killed, notes, run = {}, [], None
    for attempt in range(MAX_ATTEMPTS):
        run = execute(gnb, workdir / f"attempt{attempt + 1}", timeout, cell_timeout)
        if run["status"] in ("ok", "error") or run["running"] is None:
            break
        cell = gnb.cells[run["running"]]
        role, gid = cell.metadata["grading"]["role"], cell.metadata["grading"]["grade_id"]
        why = "the notebook time limit" if run["status"] == "timeout" else "a kernel crash"
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
        gid = labs.grade_id(cell)
        if labs.is_grade(cell):
            checks[gid] = killed.get(gid) or run["checks"].get(gid) or {
                "passed": False, "ename": "NotRun", "points": 0, "max_points": cell.metadata.nbgrader["points"],
                "message": "not run"}
    return {"checks": checks, "integrity": integrity, "notes": notes, "status": run["status"],
            "detail": run["detail"], "answer_errors": run["answer_errors"], "setup_errors": run["setup_errors"],
            "attempts": attempt + 1}


def self_reported(nb) -> tuple[dict, list, list[str]]:
    """(records, figures as PNG bytes, problems) read from the student's executed notebook."""
    problems = []
    try:
        records = read_records(nb)
    except ValueError as e:
        records, problems = {}, [f"records unreadable: {e}"]
    figures = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            png = out.get("data", {}).get("image/png")
            if png:
                try:
                    figures.append(base64.b64decode(png))
                except (ValueError, TypeError):
                    problems.append("a figure could not be decoded")
    if not records:
        problems.append("no records: the lab was not run to its end (or not run at all)")
    return records, figures, problems


# ----------------------------------------------------------------------------- finding submissions
def find_submissions(folder: Path, lab_name: str, exclude: Path | None = None) -> list[dict]:
    """One dict per student: {"student", "path" (or None), "flags": [...], "detail"}.

    ``<student>.ipynb`` files and ``<student>/`` folders; in a folder, the notebook named like the
    lab, else its only notebook (flagged renamed), else its only file. Hidden files, checkpoints and
    the grader's own output are skipped.
    """
    skip = {".ipynb_checkpoints", "__MACOSX"}
    subs = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or entry.name in skip or (exclude and entry.resolve() == exclude.resolve()):
            continue
        if entry.is_file():
            student = entry.name[: -len(".ipynb")] if entry.name.endswith(".ipynb") else entry.name.split(".")[0]
            flags = [] if entry.suffix == ".ipynb" else ["renamed"]
            subs.append({"student": student, "path": entry, "flags": flags,
                         "detail": "" if not flags else f"file {entry.name!r} is not named .ipynb"})
        elif entry.is_dir():
            files = sorted(p for p in entry.rglob("*") if p.is_file() and not any(
                part.startswith(".") or part in skip for part in p.relative_to(entry).parts))
            notebooks = [p for p in files if p.suffix == ".ipynb"]
            exact = [p for p in notebooks if p.name == f"{lab_name}.ipynb"]
            chosen, flags, detail = None, [], ""
            if exact:
                chosen = exact[0]
            elif notebooks or files:
                candidates = notebooks or files
                chosen = candidates[0]
                flags.append("renamed")
                detail = f"expected {lab_name}.ipynb, graded {chosen.relative_to(entry)}"
                if len(candidates) > 1:
                    flags.append("several-notebooks")
                    detail += f" (first of {len(candidates)})"
            else:
                flags.append("no-notebook")
                detail = "empty folder"
            subs.append({"student": entry.name, "path": chosen, "flags": flags, "detail": detail})
    return subs


# ----------------------------------------------------------------------------- feedback and the CSV
def _flags(sub: dict, result: dict | None) -> list[str]:
    flags = list(sub["flags"])
    for item in (result or {}).get("integrity", []):
        flags.append(f"{item['flag']}:{item['grade_id']}")
    for key in ("wrong-lab", "invalid-notebook", "grader-error"):
        if result and result.get(key):
            flags.append(key)
    return flags


def feedback_markdown(student: str, lab_name: str, sub: dict, result: dict, fig_dir: str) -> str:
    checks = result.get("checks", {})
    total, maximum = sum(c["points"] for c in checks.values()), sum(c["max_points"] for c in checks.values())
    lines = [f"# {lab_name}: feedback for {student}", "",
             f"Submission: `{sub.get('file') or '-'}`  ", f"**Score: {total} / {maximum}**", ""]
    if result.get("invalid-notebook"):
        lines += [f"**This file could not be graded:** {result['invalid-notebook']}. Open it in Jupyter to check "
                  "it, and hand in the .ipynb file that Jupyter saves.", ""]
    if checks:
        lines += ["## Graded checks", "",
                  "Re-run by the grader on the tiny model (CPU), with your answer cells and the instructor's checks "
                  "(hidden tests included).", "", "| check | points | result |", "|---|---|---|"]
        for gid, c in checks.items():
            verdict = "passed" if c["passed"] else "failed: " + c["message"].replace("|", "\\|")
            lines.append(f"| {gid} | {c['points']} / {c['max_points']} | {verdict} |")
        lines.append("")
    issues = [f"- {i['grade_id']}: {i['detail']}" for i in result.get("integrity", [])]
    if sub.get("detail"):
        issues.append(f"- {sub['detail']}")
    issues += [f"- answer cell {e['grade_id']} raised {e['error']}" for e in result.get("answer_errors", [])]
    issues += [f"- {n}" for n in result.get("notes", [])]
    if result.get("wrong-lab"):
        issues.append(f"- this notebook is the lab {result['wrong-lab']!r}, not {lab_name!r}")
    if result.get("setup_errors"):
        issues += [f"- the grader's setup cell {e['cell']} raised {e['error']}" for e in result["setup_errors"]]
    if issues:
        lines += ["## Notes", "", *issues, ""]
    records, figures = result.get("records", {}), result.get("figures", 0)
    lines += ["## Your run (self-reported, not re-run by the grader)", ""]
    meta = meta_of(records)
    lines.append("Ran with " + ", ".join(f"{k} `{v if v is not None else 'unknown'}`" for k, v in meta.items()) + ".")
    lines.append("")
    metrics = {k: v for k, v in records.items() if k.split("/", 1)[-1] not in META_KEYS}
    if metrics:
        lines += ["| record | value |", "|---|---|"]
        lines += [f"| {k} | {json.dumps(v) if not isinstance(v, float) else f'{v:.4g}'} |" for k, v in metrics.items()]
        lines.append("")
    for problem in result.get("result_problems", []):
        lines.append(f"- {problem}")
    if figures:
        lines += ["", f"{figures} figure(s) from your notebook:", ""]
        lines += [f"![figure {i + 1}]({fig_dir}/figure-{i + 1}.png)" for i in range(figures)]
    return "\n".join(lines).rstrip() + "\n"


def grade_one(sub: dict, lesson, lab, lab_name: str, out: Path, tmp: Path, timeout: int, cell_timeout: int) -> dict:
    """Grade one submission and write its feedback; returns its CSV row (never raises)."""
    student = sub["student"]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", student) or "student"
    row = {"student": student, "lab": lab_name,
           "file": str(sub["path"].relative_to(sub["root"])) if sub.get("path") else ""}
    sub["file"] = row["file"]
    result: dict = {}
    try:
        nb, reason = _load(sub["path"]) if sub.get("path") else (None, sub.get("detail") or "no file")
        if nb is None:
            result = {"invalid-notebook": reason, "checks": {
                labs.grade_id(c): {"passed": False, "points": 0, "max_points": c.metadata.nbgrader["points"],
                                   "message": "not graded: the file is not a notebook", "ename": None}
                for c in lesson.cells if labs.is_grade(c)}}
        else:
            theirs = nb.metadata.get(labs.LAB_META_KEY, {}).get("name")
            result = grade_notebook(nb, lesson, lab, tmp / safe, timeout, cell_timeout)
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
    checks = result.get("checks", {})
    for gid, c in checks.items():
        row[gid] = c["points"]
    row["total"] = sum(c["points"] for c in checks.values())
    row["max"] = sum(c["max_points"] for c in checks.values())
    row["flags"] = " ".join(_flags(sub, result))
    for k, v in meta_of(result.get("records", {})).items():
        row[k] = "" if v is None else v
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    (out / "feedback" / f"{safe}.md").write_text(feedback_markdown(student, lab_name, sub, result, safe), encoding="utf-8")
    return row


def write_csv(rows: list[dict], columns: list[str], path: Path) -> None:
    """Write the rows (sorted by student) atomically: a crash never leaves a half-written file."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in sorted(rows, key=lambda r: r["student"]):
        writer.writerow(row)
    tmp = path.with_suffix(".csv.tmp")
    tmp.write_text(buf.getvalue(), encoding="utf-8")
    tmp.replace(path)


def grade_folder(folder, lab: str, out=None, jobs: int = 2, timeout: int = NOTEBOOK_TIMEOUT_S,
                 cell_timeout: int = CELL_TIMEOUT_S, progress=print) -> list[dict]:
    """Grade every submission in ``folder`` against lab ``lab`` ("01", a name, or a lesson path)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no such folder of submissions: {folder}")
    lesson_path = labs.lesson_paths([lab])[0]
    lab_name = lesson_path.stem
    lesson = nbformat.read(lesson_path, as_version=4)
    lab_nb = labs.lab_for(lesson_path)
    out = Path(out) if out else folder.with_name(folder.name + "-grades")
    out.mkdir(parents=True, exist_ok=True)
    subs = [dict(s, root=folder) for s in find_submissions(folder, lab_name, exclude=out)]
    check_ids = [labs.grade_id(c) for c in lesson.cells if labs.is_grade(c)]
    columns = ["student", "lab", "file", *check_ids, "total", "max", "flags", *META_KEYS]
    rows, lock = [], threading.Lock()
    csv_path = out / "grades.csv"
    write_csv(rows, columns, csv_path)
    progress(f"grading {len(subs)} submission(s) of {lab_name} from {folder} ({jobs} at a time) ...")

    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        def work(sub):
            t = time.perf_counter()
            row = grade_one(sub, lesson, lab_nb, lab_name, out, Path(tmp), timeout, cell_timeout)
            with lock:
                rows.append(row)
                write_csv(rows, columns, csv_path)
                progress(f"  {row['student']:<20} {row['total']:>3} / {row['max']:<3} {time.perf_counter() - t:6.1f} s"
                         f"  {row['flags']}".rstrip())
            return row

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            list(pool.map(work, subs))
    progress(f"wrote {csv_path} and {out / 'feedback'}/")
    return sorted(rows, key=lambda r: r["student"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("submissions", help="folder with <student>.ipynb files or <student>/ folders")
    parser.add_argument("--lab", required=True, help="the lab graded: its number (01) or name")
    parser.add_argument("--out", help="output folder (default: SUBMISSIONS-grades beside the folder)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="submissions graded at once")
    parser.add_argument("--timeout", type=int, default=NOTEBOOK_TIMEOUT_S, help="seconds per notebook run")
    parser.add_argument("--cell-timeout", type=int, default=CELL_TIMEOUT_S, help="seconds per cell before it is interrupted")
    args = parser.parse_args(argv)
    try:
        t = time.perf_counter()
        rows = grade_folder(args.submissions, args.lab, args.out, args.jobs, args.timeout, args.cell_timeout)
    except (FileNotFoundError, LookupError, labs.LabError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(rows)} submission(s) graded in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
