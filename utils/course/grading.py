"""Re-running a notebook's answers and graded checks, and only those, in a judge process of their own.

:func:`grading_notebook` assembles the cells (the lesson's ``parameters`` and ``grader-setup`` cells,
the answers given, the lesson's checks); :func:`execute` runs them in the judge (``judge.py``: a plain
Python process, the checks out of the answers' reach) under cell and notebook time limits; :func:`read_run`
reads each check's result from what the judge said. The grader (``grade``) and the lab validation
(``labs validate``) both use it.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat

from ..constants import CHECK_MESSAGE_CHARS, NOTEBOOKS_DIR, REPO_ROOT, SETUP_TAG, UTILS_DIR
from . import sandbox as sb
from . import speed
from .cells import as_in_lab, compute_checksum, grade_id, hidden_parts, is_answer, is_check, strip_tooling_markers
from .kernel import kill_tree

KERNEL_ENV = {  # the grading run: CPU only, one thread, offline, quiet
    "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1",
    "MPLBACKEND": "Agg", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore",
    "PYTHONBREAKPOINT": "0",   # a breakpoint() left in an answer does nothing
}
CELL_TIMEOUT_S, NOTEBOOK_TIMEOUT_S, MAX_ATTEMPTS = 30, 180, 3
INTERRUPT_GRACE_S = 10  # a cell still running this long after its interrupt is killed with its run


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
        gid = grade_id(cell)
        if gid and gid not in by_gid:
            by_gid[gid] = cell
        if cell.get("id"):
            by_id.setdefault(cell["id"], cell)
    found = {}
    for cell in lesson.cells:
        if not (is_answer(cell) or is_check(cell)):
            continue
        gid = grade_id(cell)
        match = by_gid.get(gid) or by_id.get(cell.get("id"))
        if match is None and is_answer(cell):
            names = _defined_names(cell.source)
            match = next((c for c in code if names and names <= _defined_names(c.source)), None)
        found[gid] = match
    return found


def grading_notebook(lesson, answers, lab):
    """The notebook that grades ``answers`` (a submission, a lab, or the lesson itself).

    Cells, in the lesson's order: its ``parameters`` cell and ``grader-setup`` cells (the lesson's
    source), each answer cell (the submission's source; the lab's stub when it has none) and each
    graded check (the lesson's source, hidden tests included). Every cell is tagged
    ``raises-exception`` so that one failure does not stop the run.

    ``lab`` is the lesson's student edition (``labs.build_lab``): its stubs stand in for missing
    answers and its checksums tell modified checks. Returns ``(notebook, integrity)``, ``integrity``
    listing ``{"flag", "grade_id", "detail"}`` dicts: a check modified or deleted, an answer cell
    missing or left as the stub.
    """
    lab_cells = {grade_id(c): c for c in lab.cells if grade_id(c)}
    found = match_cells(lesson, answers)
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    integrity = []
    for cell in lesson.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type != "code":
            continue
        gid = grade_id(cell)
        if "parameters" in tags or SETUP_TAG in tags:
            source, role = cell.source, "parameters" if "parameters" in tags else "setup"
        elif is_answer(cell):
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
        elif is_check(cell):
            sub, ref = found.get(gid), lab_cells[gid]
            if sub is None:
                integrity.append({"flag": "deleted", "grade_id": gid,
                                  "detail": "graded check deleted; restored from the lesson"})
            else:
                theirs = copy.deepcopy(ref)
                theirs.source = as_in_lab(strip_tooling_markers(sub.source))   # as nbgrader releases it too
                if compute_checksum(theirs) != ref.metadata.nbgrader["checksum"]:
                    integrity.append({"flag": "modified", "grade_id": gid,
                                      "detail": "graded check changed (checksum differs); restored from the lesson"})
            source, role = cell.source, "check"
        else:
            continue
        new = nbformat.v4.new_code_cell(source)
        new.metadata["tags"] = (["parameters"] if role == "parameters" else []) + ["raises-exception"]
        new.metadata["grading"] = {"role": role, "grade_id": gid}
        if is_check(cell):
            new.metadata["nbgrader"] = copy.deepcopy(cell.metadata["nbgrader"])
        nb.cells.append(new)
    return nb, integrity


# ----------------------------------------------------------------------------- executing it
def _limited(metadata) -> bool:
    """Whether a grading cell runs under the cell time limit (answers and checks do)."""
    return metadata.get("grading", {}).get("role") in ("answer", "check")


# The command of the judge (``judge.py``), run as a script of its own: it imports nothing of the course, so that
# the setup cells import the ``utils`` of the folder they find (a handout's own).
JUDGE_PATH = UTILS_DIR / "course" / "judge.py"
JUDGE = ("import sys; p = sys.argv[1]; g = {'__name__': '__judge__', '__file__': p}; "
         "exec(compile(open(p, encoding='utf-8').read(), p, 'exec'), g); g['main'](sys.argv[2:])")
MAX_RESULT_BYTES = 4 << 20   # what the judge may say on standard output; a run that says more is not read on
MAX_LINE_BYTES = 64 << 10    # one line of it


def _as_python(source: str) -> str:
    """An answer cell's source as Python: IPython's magics and shell escapes as the calls they stand for (which
    the judge then leaves out: they are not definitions); a cell magic's body (``%%time``) as its own code."""
    from IPython.core.inputtransformer2 import TransformerManager
    if source.lstrip().startswith("%%"):   # the magic's line left blank: line numbers stay the student's
        source = "\n" + source.partition("\n")[2]
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 -- the judge reports the cell's own SyntaxError
        return source


def _exports(stub: str) -> dict:
    """What the checks may see of an answer cell: the names its stub defines (``def``, ``class``) or assigns."""
    import ast
    found = {}
    for node in ast.parse(stub).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = "def" if isinstance(node, ast.FunctionDef) else "class"
        elif isinstance(node, ast.Assign):
            found.update({t.id: "value" for t in node.targets if isinstance(t, ast.Name)})
    return found


def judge_spec(gnb, lab, cell_timeout: int, parameters: dict) -> dict:
    """What the judge runs: each cell's role, grade_id and source; an answer's exports (read from ``lab``'s stub of
    it); a check's parts, hidden or not, by line."""
    stubs = {grade_id(c): c.source for c in lab.cells if grade_id(c)}
    cells = []
    for cell in gnb.cells:
        role, gid = cell.metadata["grading"]["role"], cell.metadata["grading"]["grade_id"]
        entry = {"role": role, "grade_id": gid, "source": cell.source}
        if role == "parameters":
            entry["injected"] = "".join(f"{k} = {v!r}\n" for k, v in parameters.items())
        if role == "answer":
            entry["source"], entry["exports"] = _as_python(cell.source), _exports(stubs[gid])
        if role == "check":
            entry["segments"] = hidden_parts(cell.source, gid)
        cells.append(entry)
    return {"cells": cells, "cell_timeout": cell_timeout, "message_chars": CHECK_MESSAGE_CHARS}


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill a process and every descendant (the sandbox's launcher, the judge, whatever it started)."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        kill_tree([psutil.Process(proc.pid)])
    proc.wait()


def one_line(text, limit: int = CHECK_MESSAGE_CHARS) -> str:
    """``text`` on one line (its lines joined, runs of spaces made one), at most ``limit`` characters: a longer one
    is cut and ends in "…"."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _check_message(ename: str, evalue: str, cell_timeout: int) -> str:
    """What a failed cell's feedback says, one line of at most CHECK_MESSAGE_CHARS (cut with "…")."""
    ename, evalue = one_line(ename, 100), one_line(evalue)
    if ename == "AssertionError":
        return evalue or "an assertion failed (it has no message)"
    if ename == "KeyboardInterrupt":
        return f"timed out after {cell_timeout} s and was interrupted (an endless loop, or far too slow?)"
    return one_line(f"not implemented: {evalue}" if ename == "NotImplementedError" else f"{ename}: {evalue}")


def read_run(said: list[dict], gnb, cell_timeout: int, stopped: str = "") -> dict:
    """Per-check results and the errors of answer/setup cells, from what the judge said (its result lines).

    ``running`` is the index of the cell the judge started and never finished when the run stopped
    early (``stopped`` says why), else None. ``skipped`` lists the answer cells' top-level statements
    that the judge did not run (``{"grade_id", "lines"}``).
    """
    results = {r["cell"]: r for r in said if isinstance(r.get("cell"), int)}
    started = [r["start"] for r in said if isinstance(r.get("start"), int)]
    checks, answer_errors, setup_errors, skipped = {}, [], [], []
    for i, cell in enumerate(gnb.cells):
        role, gid = cell.metadata["grading"]["role"], cell.metadata["grading"]["grade_id"]
        res = results.get(i)
        error = None if res is None or not res.get("ename") else _check_message(
            res["ename"], res.get("message", ""), cell_timeout)
        if role == "check":
            points = cell.metadata["nbgrader"]["points"]
            if res is None:
                out = {"passed": False, "ename": "NotRun",
                       "message": f"not run: {stopped or 'the run stopped before it'}"}
            else:
                out = {"passed": error is None, "ename": res.get("ename"), "message": error or ""}
            checks[gid] = {**out, "points": points if out["passed"] else 0, "max_points": points}
        elif error is not None:
            entry = {"cell": i + 1, "grade_id": gid, "error": error}
            (answer_errors if role == "answer" else setup_errors).append(entry)
        if res is not None and res.get("skipped"):
            skipped.append({"grade_id": gid, "lines": [n for n in res["skipped"] if isinstance(n, int)][:20]})
    running = started[-1] if stopped and started and started[-1] not in results else None
    return {"checks": checks, "answer_errors": answer_errors, "setup_errors": setup_errors, "running": running,
            "skipped": skipped}


class _Listener:
    """Reads the judge's standard output in a thread: the lines with the run's nonce; whether any was forged."""

    def __init__(self, stream, nonce: str):
        import threading
        self.said, self.forged, self.nonce, self.size = [], False, nonce, 0
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        while line := stream.readline(MAX_LINE_BYTES + 1):   # a line without an end is cut, never held whole
            self.size += len(line)
            if self.size > MAX_RESULT_BYTES or len(line) > MAX_LINE_BYTES:
                self.forged = True
                break
            try:
                entry = json.loads(line)
            except Exception:  # noqa: BLE001 -- not JSON, or nested too deeply (RecursionError): not the judge's
                entry = None
            if not isinstance(entry, dict) or entry.pop("nonce", None) != self.nonce:
                self.forged = True
                continue
            self.said.append(entry)
        stream.close()

    def running(self) -> int | None:
        """The cell the judge started last and has not finished."""
        said = list(self.said)
        starts = [r["start"] for r in said if isinstance(r.get("start"), int)]
        done = {r.get("cell") for r in said}
        return starts[-1] if starts and starts[-1] not in done else None


def parse_untrusted_json(raw: bytes, memory: int = 2 << 30, timeout: int = 120):
    """``json.loads`` of bytes a student controls, safe for the grader: anything over 1 MiB is parsed
    first in a child process limited to ``memory`` bytes and ``timeout`` seconds (a file of a
    hundred million empty objects would take the grader's memory); raises ValueError when it fails."""
    if len(raw) > 1 << 20:
        check = (f"import json, resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory})); "
                 "json.loads(sys.stdin.buffer.read())")
        try:
            child = subprocess.run([sys.executable, "-I", "-S", "-c", check], input=raw, timeout=timeout,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ValueError(f"too slow to read (over {timeout} s)") from None
        if child.returncode != 0:
            raise ValueError("not JSON that can be read within the grader's limits")
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def kernel_env(workdir: Path) -> dict:
    """The whole environment of a grading run: KERNEL_ENV and what a Python needs, none of the grader's own
    variables (no tokens, no keys; a home inside the scratch folder)."""
    return {**KERNEL_ENV, "HOME": str(workdir / "home"), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])}


def _scratch_bytes(folder: Path) -> int:
    """Bytes a scratch folder takes: the larger of its disk use and 4 KiB per entry (so that a million
    empty files or folders fill it too). GNU ``du`` counts it, links not followed and at any depth
    (a path longer than the system's limit is still counted)."""
    used = []
    for unit in ("-B1", "--inodes"):
        out = subprocess.run(["du", "-sx", unit, "--", str(folder)], capture_output=True, text=True, check=False)
        try:
            used.append(int(out.stdout.split()[0]))
        except (IndexError, ValueError):
            used.append(0)
    return max(used[0], 4096 * used[1])


def remove_scratch(folder: Path) -> None:
    """Remove a scratch folder whatever the run left in it (a folder 100 000 levels deep, folders
    without permissions), never following a link out of it."""
    for cmd in (["rm", "-rf", "--", str(folder)], ["chmod", "-R", "u+rwx", "--", str(folder)],
                ["rm", "-rf", "--", str(folder)]):
        if not os.path.lexists(folder):
            return
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def execute(gnb, lab, workdir: Path, timeout: int = NOTEBOOK_TIMEOUT_S, cell_timeout: int = CELL_TIMEOUT_S,
            kernel_cwd: Path = NOTEBOOKS_DIR, sandbox=None, lesson: str | None = None) -> dict:
    """Run a grading notebook once, in the judge (``judge.py``, a separate process), within ``timeout`` seconds;
    ``lab`` is the lesson's student edition (its stubs say which names of an answer the checks may see).

    The judge starts in ``kernel_cwd``; the lesson's setup cell imports the ``utils`` of the first
    folder above it that has one (a handout's own, for a handout's labs). The environment is
    :func:`kernel_env` only. With ``sandbox`` (``sandbox.find()``), the run is confined to it,
    ``workdir`` being its scratch folder and ``lesson`` the lesson whose lab it grades; the run is
    stopped when the scratch outgrows the sandbox's file limit or a fork meets its process limit.

    Returns ``{"status": "ok" | "touched" | "timeout" | "kernel-died" | "memory-limit" | "process-limit" |
    "scratch-full" | "forged" | "sandbox-error", "detail", "wall_s", "checks", "answer_errors",
    "setup_errors", "skipped", "running"}`` (``running``: index of the cell that was running when the run
    stopped, or None). Results come only from the judge's lines that carry the nonce it was given; a line
    without it makes the run ``forged``, a judge that says its checks were tampered with ``touched``.

    Both limits are stretched by the machine's measured slowdown (:mod:`utils.course.speed`: 1.0 on the course's
    reference machine or a faster one, 2.0 where its workload takes twice as long now), so a slow or busy
    machine does not time out an honest cell; ``limits_scaled_by`` in the result says by how much.
    """
    factor = speed.slowdown()
    timeout, cell_timeout = speed.scaled(timeout, factor), speed.scaled(cell_timeout, factor)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "home").mkdir(exist_ok=True)
    inside = sb.SCRATCH if sandbox is not None else workdir  # the scratch folder as the run sees it
    spec = judge_spec(gnb, lab, cell_timeout, {"PRESET": "tiny", "SEED": 0, "OUTPUT_DIR": str(inside / "output")})
    cmd = [sys.executable, "-c", JUDGE, str(JUDGE_PATH), str(kernel_cwd)]
    env, confinement, max_bytes = kernel_env(inside), None, sb.DEFAULT_FILE_MIB * sb.MiB
    if sandbox is not None:
        confinement = sb.Confinement(sandbox, f"grade-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        cmd = sb.command(sandbox, cmd, scratch=workdir, env=env, empty_dirs=[kernel_cwd], lesson=lesson,
                         cgroup_procs=confinement.procs)
        max_bytes = sandbox.limits.file_size
    start, nonce = time.perf_counter(), uuid.uuid4().hex
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    listener = _Listener(proc.stdout, nonce)
    with contextlib.suppress(OSError):   # on standard input: no file of the run's ever holds the hidden tests
        proc.stdin.write(f"{nonce}\n{json.dumps(spec)}".encode())
        proc.stdin.close()
    status, running_since = None, {}
    try:
        while status is None:
            try:
                proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.perf_counter()
            stuck = listener.running()
            if stuck is not None and stuck < len(gnb.cells) and _limited(gnb.cells[stuck].metadata):
                running_since.setdefault(stuck, now)
            if now - start > timeout:
                status = {"status": "timeout",
                          "detail": f"the notebook ran past its {timeout} s limit; its run was killed"}
            elif stuck in running_since and now - running_since[stuck] > cell_timeout + INTERRUPT_GRACE_S:
                status = {"status": "timeout", "detail": f"a cell ran past its {cell_timeout} s limit and ignored "
                                                         "the interrupt; its run was killed"}
            elif confinement is not None and confinement.process_limit_hits():
                status = {"status": "process-limit", "detail": f"the run reached the limit of "
                                                               f"{sandbox.limits.processes} processes; it was stopped"}
            elif sandbox is not None and _scratch_bytes(workdir) > max_bytes:
                status = {"status": "scratch-full", "detail": f"the run wrote more than {max_bytes // sb.MiB} MiB "
                                                              "of files; it was stopped"}
            if status is not None:
                _kill_tree(proc)
        listener.thread.join(timeout=10)
        said = list(listener.said)
        touched = next((str(r["touched"])[:300] for r in said if "touched" in r), None)
        if status is None and proc.returncode == sb.LAUNCH_FAILED:
            status = {"status": "sandbox-error", "detail": "the sandbox could not be set up for this run (the "
                                                           "grader's problem, not the submission's)"}
        elif listener.forged:
            status = {"status": "forged", "detail": "the run wrote results the judge did not (or far too many); "
                                                    "no check is counted"}
        elif touched is not None:
            status = {"status": "touched", "detail": f"the answers changed what the checks rely on ({touched}); "
                                                     "no check is counted"}
        elif status is None and any(r.get("done") for r in said):
            status = {"status": "ok", "detail": ""}
        elif status is None:
            status = {"status": "kernel-died", "detail": f"the run ended (exit status {proc.returncode}) before it "
                                                         "finished"}
        if confinement is not None and confinement.oom_kills() and status["status"] == "kernel-died":
            status = {"status": "memory-limit", "detail": f"a process passed the {sandbox.limits.memory / sb.GiB:g} "
                                                          "GiB memory limit and was killed"}
    finally:
        if proc.poll() is None:
            _kill_tree(proc)
        if confinement is not None:
            confinement.close()
    wall = round(time.perf_counter() - start, 1)
    stopped = "" if status["status"] == "ok" else status["detail"]
    run = read_run([] if status["status"] == "forged" else said, gnb, cell_timeout, stopped)
    if status["status"] in ("touched", "forged"):
        for check in run["checks"].values():
            check.update(passed=False, points=0, ename=status["status"], message=status["detail"])
    return {**status, "wall_s": wall, "limits_scaled_by": factor, **run}
