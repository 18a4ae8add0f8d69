"""Re-running a notebook's answers and graded checks, and only those, in a kernel of their own.

:func:`grading_notebook` assembles the cells (the lesson's ``parameters`` and ``grader-setup`` cells,
the answers given, the lesson's checks); :func:`execute` runs it with papermill in a separate process
under cell and notebook time limits; :func:`read_run` reads each check's result back. The grader
(``grade``) and the lab validation (``labs validate``) both use it.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat

from ..constants import NOTEBOOKS_DIR, REPO_ROOT, SETUP_TAG
from . import sandbox as sb
from . import speed
from .cells import compute_checksum, grade_id, is_answer, is_check, strip_tooling_markers
from .kernel import kill_tree
from .lessons import own_cells

KERNEL_ENV = {  # the grading kernel: CPU only, one thread per kernel, offline, quiet
    "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1",
    "MPLBACKEND": "Agg", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore",
}
CELL_TIMEOUT_S, NOTEBOOK_TIMEOUT_S, MAX_ATTEMPTS = 30, 180, 3
MAX_EXECUTED_BYTES = 256 << 20   # an executed grading notebook bigger than this is not read (50 MB of output is)
PROGRESS_FILE = "progress.json"  # the run writes which cell it is in; the grader polls it
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
                theirs.source = strip_tooling_markers(sub.source)   # an nbgrader release keeps CI's markers
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


# The command of the worker process. nbformat validates notebooks with jsonschema, whose format checkers import
# ``rfc3987_syntax`` where it is installed (jupyterlab's dependencies install it): that import builds some 35 Earley
# parsers, 1.5 s of every worker's start here (jsonschema issue #1428), for the "iri" formats that no notebook
# schema uses. The worker marks the module absent first; jsonschema then leaves those two format checks out.
WITHOUT_IRI_PARSERS = "import sys; sys.modules.setdefault('rfc3987_syntax', None); "
WORKER = WITHOUT_IRI_PARSERS + "from utils.course.grading import _worker; sys.exit(_worker(sys.argv[1:]))"


def _worker(argv) -> int:
    """Run in a child process: execute one grading notebook with papermill; write a status file."""
    src, dst, cell_timeout, cwd, status_path, params = argv
    import papermill
    from papermill.engines import NotebookExecutionManager

    from .kernel import execute_notebook

    def timeout_of(cell):  # answers and checks get the cell limit; setup cells only the notebook's
        return int(cell_timeout) if _limited(cell.metadata) else None

    progress, cell_start = Path(status_path).with_name(PROGRESS_FILE), NotebookExecutionManager.cell_start

    def announce(self, cell, *args, **kwargs):  # which cell runs, in a small file the grader polls
        cell_start(self, cell, *args, **kwargs)
        index = next((i for i, c in enumerate(own_cells(self.nb.cells)) if c is cell), None)
        progress.write_text(json.dumps({"running": index}), encoding="utf-8")
    NotebookExecutionManager.cell_start = announce

    status = {"status": "ok", "detail": ""}
    try:
        execute_notebook(src, dst, parameters=json.loads(params), kernel_name="python3", cwd=cwd,
                         progress_bar=False, log_output=False, timeout_func=timeout_of,
                         interrupt_on_timeout=True, start_timeout=120,
                         shutdown_kernel="immediate")   # its outputs are in: no 1-2 s of a polite shutdown per run
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

    with contextlib.suppress(psutil.NoSuchProcess):
        kill_tree([psutil.Process(proc.pid)])
    proc.wait()


def _check_message(ename: str, evalue: str, cell_timeout: int) -> str:
    ename, evalue = str(ename)[:100], (str(evalue).strip().splitlines() or [""])[0][:300]
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
    for i, cell in enumerate(own_cells(executed.cells)):
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
                res = {"passed": False, "ename": "NotRun",
                       "message": f"not run: {stopped or 'the run stopped before it'}"}
            checks[gid] = {**res, "points": points if res["passed"] else 0, "max_points": points}
        elif error is not None:
            entry = {"cell": i + 1, "grade_id": gid,
                     "error": _check_message(error.get("ename", "Error"), error.get("evalue", ""), cell_timeout)}
            (answer_errors if role == "answer" else setup_errors).append(entry)
    if running is None and stopped:  # a dead kernel: the cell it never answered
        running = unanswered if unanswered is not None else first_unrun
    return {"checks": checks, "answer_errors": answer_errors, "setup_errors": setup_errors, "running": running}


def _running_cell(progress_path: Path, gnb) -> int | None:
    """Index of the answer or check cell the run announced last (its progress file), or None."""
    try:
        index = json.loads(_read_result(progress_path, 4096) or b"")["running"]
    except (ValueError, KeyError, TypeError):
        return None  # not written yet, caught mid-write, or not ours
    ok = isinstance(index, int) and 0 <= index < len(gnb.cells) and _limited(gnb.cells[index].metadata)
    return index if ok else None


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


def _read_result(path: Path, max_bytes: int) -> bytes | None:
    """A file the run left in its scratch folder, or None: missing, too big, or not a regular file (a
    symlink to one of the grader's files, a FIFO that would block) -- never followed, never waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        return f.read(max_bytes + 1)[:max_bytes]


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


def _same_cells(executed, gnb) -> bool:
    """Whether an executed notebook is the grading notebook that was run (not one the run wrote itself)."""
    try:
        ran = own_cells(executed.cells)
        return len(ran) == len(gnb.cells) and all(
            a.get("source") == b.source and a.get("metadata", {}).get("grading") == b.metadata["grading"]
            and a.get("metadata", {}).get("nbgrader") == b.metadata.get("nbgrader") for a, b in zip(ran, gnb.cells))
    except (AttributeError, TypeError):  # cells that are not cells
        return False


def execute(gnb, workdir: Path, timeout: int = NOTEBOOK_TIMEOUT_S, cell_timeout: int = CELL_TIMEOUT_S,
            kernel_cwd: Path = NOTEBOOKS_DIR, sandbox=None, lesson: str | None = None) -> dict:
    """Execute a grading notebook once, in a separate process and kernel, within ``timeout`` seconds.

    The kernel starts in ``kernel_cwd``; the lesson's setup cell imports the ``utils`` of the first
    folder above it that has one (a handout's own, for a handout's labs). The environment is
    :func:`kernel_env` only. With ``sandbox`` (``sandbox.find()``), the run is confined to it,
    ``workdir`` being its scratch folder and ``lesson`` the lesson whose lab it grades; the run is
    stopped when the scratch outgrows the sandbox's file limit or a fork meets its process limit.

    Returns ``{"status": "ok" | "timeout" | "kernel-died" | "memory-limit" | "process-limit" | "scratch-full" |
    "forged" | "sandbox-error" | "error",
    "detail", "wall_s", "checks", "answer_errors", "setup_errors", "running"}`` (``running``: index of
    the cell that was running when the run stopped, or None). The executed notebook is
    ``workdir/executed.ipynb``; what the run wrote is read back checked (sizes, types, the cells run).

    Both limits are stretched by the machine's measured slowdown (:mod:`utils.course.speed`: 1.0 on the course's
    reference machine or a faster one, 2.0 where its workload takes twice as long now), so a slow or busy
    machine does not time out an honest cell; ``limits_scaled_by`` in the result says by how much.
    """
    factor = speed.slowdown()
    timeout, cell_timeout = speed.scaled(timeout, factor), speed.scaled(cell_timeout, factor)
    workdir.mkdir(parents=True, exist_ok=True)
    src, dst, status_path = workdir / "grading.ipynb", workdir / "executed.ipynb", workdir / "status.json"
    for p in (dst, status_path, workdir / PROGRESS_FILE):
        p.unlink(missing_ok=True)
    nbformat.write(gnb, src)
    (workdir / "home").mkdir(exist_ok=True)
    inside = sb.SCRATCH if sandbox is not None else workdir  # the scratch folder as the run sees it
    params = json.dumps({"PRESET": "tiny", "SEED": 0, "OUTPUT_DIR": str(inside / "output")})
    cmd = [sys.executable, "-c", WORKER, *(str(inside / p.name) for p in (src, dst)), str(cell_timeout),
           str(kernel_cwd), str(inside / status_path.name), params]
    env, confinement, max_bytes = kernel_env(inside), None, sb.DEFAULT_FILE_MIB * sb.MiB
    if sandbox is not None:
        confinement = sb.Confinement(sandbox, f"grade-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        cmd = sb.command(sandbox, cmd, scratch=workdir, env=env, empty_dirs=[kernel_cwd], lesson=lesson,
                         cgroup_procs=confinement.procs)
        max_bytes = sandbox.limits.file_size
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    status, running_since = None, {}
    try:
        while status is None:
            try:
                proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.perf_counter()
            stuck = _running_cell(workdir / PROGRESS_FILE, gnb)
            if stuck is not None:
                running_since.setdefault(stuck, now)
            if now - start > timeout:
                status = {"status": "timeout",
                          "detail": f"the notebook ran past its {timeout} s limit; its kernel was killed"}
            elif stuck is not None and now - running_since[stuck] > cell_timeout + INTERRUPT_GRACE_S:
                status = {"status": "timeout", "detail": f"a cell ran past its {cell_timeout} s limit and ignored "
                                                         "the interrupt; its kernel was killed"}
            elif confinement is not None and confinement.process_limit_hits():
                status = {"status": "process-limit", "detail": f"the run reached the limit of "
                                                               f"{sandbox.limits.processes} processes; it was stopped"}
            elif sandbox is not None and _scratch_bytes(workdir) > max_bytes:
                status = {"status": "scratch-full", "detail": f"the run wrote more than {max_bytes // sb.MiB} MiB "
                                                              "of files; it was stopped"}
            if status is not None:
                _kill_tree(proc)
        if status is None and proc.returncode == sb.LAUNCH_FAILED:
            status = {"status": "sandbox-error", "detail": "the sandbox could not be set up for this run (the "
                                                           "grader's problem, not the submission's)"}
        if status is None:
            status = _read_status(status_path, proc.returncode)
        if confinement is not None and confinement.oom_kills() and status["status"] in ("kernel-died", "error"):
            status = {"status": "memory-limit", "detail": f"a process passed the {sandbox.limits.memory / sb.GiB:g} "
                                                          "GiB memory limit and was killed"}
    finally:
        if proc.poll() is None:
            _kill_tree(proc)
        if confinement is not None:
            confinement.close()
    wall = round(time.perf_counter() - start, 1)
    executed, raw = None, _read_result(dst, min(max_bytes, MAX_EXECUTED_BYTES))
    if raw is not None:
        try:
            shape = parse_untrusted_json(raw)  # safe to parse: now nbformat may (it joins the source lines)
            if isinstance(shape, dict) and shape.get("nbformat") == 4 and isinstance(shape.get("cells"), list):
                executed = nbformat.reads(raw.decode("utf-8"), as_version=4)
        except Exception:
            executed = None
    if executed is not None and not _same_cells(executed, gnb):
        executed = None
        status = {"status": "forged", "detail": "the executed notebook is not the one the grader ran (its cells "
                                               "were changed during the run); no check is counted"}
    stopped = "" if status["status"] == "ok" else status["detail"]
    run = read_run(executed if executed is not None else gnb, cell_timeout, stopped)
    return {**status, "wall_s": wall, "limits_scaled_by": factor, **run}


def _read_status(path: Path, returncode: int) -> dict:
    """The worker's status file, checked: a known status and a short detail."""
    raw = _read_result(path, 64 * 1024)
    try:
        status = json.loads(raw) if raw is not None else None
    except ValueError:
        status = None
    if not isinstance(status, dict) or status.get("status") not in ("ok", "error", "kernel-died"):
        return {"status": "error", "detail": f"the grading process exited with {returncode} and left no valid status"}
    return {"status": status["status"], "detail": str(status.get("detail", ""))[:300]}
