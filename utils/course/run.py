"""Run the lessons end to end with papermill and summarise what they recorded.

Usage (from the repository root)::

    python -m utils run                        # every notebooks/NN_*.ipynb, preset "auto"
    python -m utils run 01 03 --preset 24g     # some lessons on a 24 GB GPU
    nohup python -m utils run --preset 80g &   # long run; follow it with: tail -f runs/80g/run.log
    python -m utils run --inplace              # `make notebooks`: re-execute on tiny, commit-ready
    python -m utils run --preset tiny --bench --out bench   # `make bench`

A lesson is named by its number ("01" or "1"), its file stem ("01_sft_from_scratch") or a
path to a notebook. Each lesson is executed with the parameters ``PRESET``, ``SEED`` and
``OUTPUT_DIR`` (and ``RESUME=True`` with ``--resume``, for lessons that declare it); only
parameters the notebook's ``parameters`` cell declares are passed.

Output layout, under ``--out`` (default ``runs/<preset>``)::

    NN_name.ipynb    the executed copy of the lesson (records are read back from it)
    NN_name/         the lesson's OUTPUT_DIR (checkpoints, adapters, ...)
    run.log          appended: timestamps, lesson start/end, everything the kernel printed
    summary.json     one dict per lesson run by this invocation: all its records, its headline evaluated
    summary.png      a panel per lesson with its headline results (± one standard error), and wall times

The console summary ends each lesson with its headline (``utils.headlines``): the two to four
results it exists to show, with their noise; ``--all`` prints every record as well.

Exit status: 0 when every lesson succeeded, 1 when one failed, 2 for a usage error
(unknown lesson, --inplace with a GPU preset), 130 when interrupted with Ctrl-C.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import platform
import sys
import threading
import time
from pathlib import Path

from ..constants import ERROR_CELL_TAG, INJECTED_TAG, LABS_DIR, NOTEBOOKS_DIR, REPO_ROOT, RUNS_DIR
from .kernel import execute_notebook, sigterm_as_interrupt
from .kernel import log as kernel_log
from .lessons import find_lessons, meta_of, write_back
from .summary import describe_error, summarize, write_bench

# Always set for the kernel. The inline backend embeds every figure as a PNG in the executed
# notebook (what a student, a grader and the committed lessons show); a GUI backend would open
# windows, and Agg (the Makefile's default for plain Python) would drop the figures.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
KERNEL_ENV = {"MPLBACKEND": INLINE_BACKEND, "TOKENIZERS_PARALLELISM": "false"}
KERNEL_ENV_DEFAULTS = {"TQDM_DISABLE": "1", "PYTHONHASHSEED": "0"}  # set unless the user already set them
# The same seed gave different records on two x86 CPUs (lesson 04's reward-hacking run ended at format
# compliance 0.0 on one and 0.725 on the other): torch picks its vector kernels (ATen), MKL and oneDNN their
# code paths by the CPU's instruction set, AVX-512 where there is one, and a chaotic run amplifies the
# last-bit differences. Pinned to AVX2, which every x86-64 CPU of the last decade has, an AVX-512 machine
# reproduces an AVX2 machine's records exactly, at no measured cost on the tiny preset. MKL's plain AVX2 mode
# still splits a matrix product's sums by the number of threads it runs, and MKL chooses that number from the
# machine's cores: on a 2-core Xeon with AVX-512 and AMX, lesson 01's losses moved in the sixth digit and the RL
# runs of lessons 04 and 07 ended elsewhere. Its strict mode (",STRICT") sums in one order on any number of
# threads (tests/course/test_run.py shows it), at no measured cost (lesson 08: 71.7 s strict, 72.3 s plain); with it
# that Xeon reproduced lessons 01 and 08's committed records exactly and kept the others' training runs, but
# not every last digit (docs/testing.md). A run whose preset is
# not a named GPU preset (tiny, auto) is pinned; a named GPU preset is not: it computes on its card, its CPU
# rehearsal (utils.course.rehearsal) records nothing that is compared, and oneDNN's bf16 matrix products need
# AVX-512: pinned, a bf16 rehearsal's backward passes fell back to a plain loop (a DPO step 19 s against 0.9 s).
X86_KERNEL_ENV_DEFAULTS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# The number of CPU threads changes a chaotic run too: from the same seed, lesson 09's reward-hacking run ended
# with 23 repeated calls on two threads and 33 on one (MKL strict; a reduction split over another number of
# threads adds in another order). A tiny run is pinned to the two threads of the course's machines, on which the
# committed lessons were executed (lesson 08 took 72 s on two, 125 s on one, and 100 s with only MKL on one).
# glibc's heap keeps what a kernel frees (unless the user set these): a block freed is reused by the next allocation,
# where by default glibc maps each large block afresh (mmap), unmaps it when freed, and faults in every page of the
# next one. Where the heap sits changes no arithmetic (torch aligns every tensor to 64 bytes either way): lesson 06
# gave the same records, and two of its tiny runs side by side took 122.9 s and 240 CPU-seconds against 126.5-130.1 s
# and 249-255 by default (system time 5 s against 8-11 s each). A rehearsal's kernel keeps it too
# (utils.course.rehearsal.KERNEL_ENV_DEFAULTS, where it saved most: Qwen's vocabulary makes every logits block large).
GLIBC_HEAP_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(4 << 30), "MALLOC_TOP_PAD_": str(256 << 20)}
TINY_KERNEL_ENV_DEFAULTS = {"OMP_NUM_THREADS": "2", **GLIBC_HEAP_ENV}
RSS_SAMPLE_S = 0.2

log = logging.getLogger("utils.course.run")


# ----------------------------------------------------------------------------- execution helpers
@contextlib.contextmanager
def kernel_env(preset: str | None = None):
    """Set the environment the kernel inherits (progress bars off, inline figures, a fixed hash seed and, on
    x86-64, CPU kernels pinned to AVX2 unless ``preset`` is a GPU preset, and a ``tiny`` run's CPU threads pinned
    to two, so that a seeded run gives the same records on every machine); restore it after."""
    from .. import presets  # here: it imports torch, which `python -m utils run --help` need not

    name = presets.preset_name(preset)
    saved = dict(os.environ)
    os.environ.update(KERNEL_ENV)
    defaults = dict(KERNEL_ENV_DEFAULTS)
    if platform.machine().lower() in ("x86_64", "amd64") and not presets.needs_gpu(name):
        defaults.update(X86_KERNEL_ENV_DEFAULTS)
    if name == "tiny":
        defaults.update(TINY_KERNEL_ENV_DEFAULTS)
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _strip_newlines(record: logging.LogRecord) -> bool:
    """Logging filter: drop the trailing newline of kernel output (the log adds its own)."""
    if isinstance(record.msg, str):
        record.msg = record.msg.rstrip("\n")
    return True


@contextlib.contextmanager
def log_to(path: Path):
    """Append this module's messages and everything the kernel prints (papermill's log) to ``path``.

    asyncio's log goes there too: an interrupted kernel leaves tasks that complain when collected.
    """
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s | %(message)s", "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(_strip_newlines)
    saved = []
    for logger in (log, kernel_log, logging.getLogger("papermill"), logging.getLogger("asyncio")):
        saved.append((logger, logger.level, logger.propagate))
        logger.addHandler(handler)
        if logger is not logging.getLogger("asyncio"):
            logger.setLevel(logging.INFO)
        logger.propagate = False  # the console gets short messages from print(), not the kernel's output
    try:
        yield
    finally:
        for logger, level, propagate in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
        handler.close()


@contextlib.contextmanager
def stderr_to(path: Path):
    """Point file descriptor 2 at ``path`` (appending), so the kernel process, which inherits it,
    writes its own start-up warnings and crash messages to the log instead of the console."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a", encoding="utf-8") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def peak_rss_of_children(result: dict):
    """Sample the summed RSS of this process's children (the kernel tree) every 0.2 s.

    On exit, ``result["peak_rss_mb"]`` holds the largest sum seen, in MiB.
    """
    import psutil

    me, stop, peak = psutil.Process(), threading.Event(), [0]

    def sample():
        while True:
            total = 0
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    total += child.memory_info().rss
            peak[0] = max(peak[0], total)
            if stop.wait(RSS_SAMPLE_S):
                return

    thread = threading.Thread(target=sample, name="peak-rss", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        result["peak_rss_mb"] = round(peak[0] / 2**20, 1)


def _short(text, limit=300) -> str:
    """First line of ``text``, cut to ``limit`` characters."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _locate_cell(executed: Path, cell_index: int | None = None) -> tuple[int | None, int | None]:
    """Where a lesson stopped: (1-based cell number in the lesson as written, execution count).

    ``cell_index`` is papermill's index into the executed notebook (which also holds the
    injected parameters cell). Without it -- the kernel died or a cell timed out -- the last
    cell papermill started is taken. Returns (None, None) when the executed copy is unreadable.
    """
    import nbformat

    try:
        cells = [c for c in nbformat.read(executed, as_version=4).cells
                 if ERROR_CELL_TAG not in c.metadata.get("tags", [])]
    except Exception:
        return None, None
    if cell_index is None:
        started = [i for i, c in enumerate(cells) if c.metadata.get("papermill", {}).get("start_time")]
        if not started:
            return None, None
        cell_index = started[-1]
    injected = sum(INJECTED_TAG in c.metadata.get("tags", []) for c in cells[:cell_index])
    return cell_index - injected + 1, cells[cell_index].get("execution_count")


def execute_lesson(notebook: Path, out_dir: Path, preset: str, seed: int = 0, resume: bool = False,
                   timeout: int | None = None, bench: bool = False) -> dict:
    """Execute one lesson with papermill and return its result dict.

    The executed copy goes to ``out_dir/<stem>.ipynb`` and the lesson's OUTPUT_DIR is
    ``out_dir/<stem>/``. The result holds lesson, notebook, preset, model, device,
    wall_s, status ("ok" or "failed"), error (None, or a dict with cell -- the 1-based
    cell number in the lesson as written --, exec_count, ename, evalue) and records (read
    back from the executed copy), plus peak_rss_mb with ``bench``. A failing lesson does
    not raise; KeyboardInterrupt does. Kernel output and tracebacks go to the log.
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    from utils.records import read_records

    notebook = Path(notebook)
    output = out_dir / notebook.name
    lesson_dir = out_dir / notebook.stem
    lesson_dir.mkdir(parents=True, exist_ok=True)
    output.unlink(missing_ok=True)  # never read the records of an earlier run

    log.info(f"===== start {notebook.stem}")
    declared = papermill.inspect_notebook(str(notebook))
    wanted = {"PRESET": preset, "SEED": seed, "OUTPUT_DIR": str(lesson_dir.resolve())}
    if resume:
        wanted["RESUME"] = True
    parameters = {k: v for k, v in wanted.items() if k in declared}
    for k in ("PRESET", "SEED", "OUTPUT_DIR"):
        if k not in declared:
            print(f"  note: {notebook.name} declares no {k} parameter; it runs with its own value")
            log.info(f"{notebook.name}: no {k} in its parameters cell")
    if resume and "RESUME" not in declared:
        print(f"  note: {notebook.name} declares no RESUME parameter; --resume has no effect on it")

    result = {"lesson": notebook.stem, "notebook": str(output), "preset": preset, "model": None,
              "device": None, "wall_s": None, "status": "running", "error": None, "records": {}}
    log.info(f"parameters: {parameters}")
    start = time.perf_counter()
    measure = peak_rss_of_children(result) if bench else contextlib.nullcontext()
    try:
        with kernel_env(preset), stderr_to(out_dir / "run.log"), measure:
            execute_notebook(
                str(notebook), str(output), parameters=parameters, kernel_name="python3",
                cwd=str(notebook.parent), progress_bar=False, log_output=True,
                execution_timeout=timeout,
            )
        result["status"] = "ok"
    except PapermillExecutionError as e:
        result["status"] = "failed"
        cell, _ = _locate_cell(output, e.cell_index)
        result["error"] = {"cell": cell, "exec_count": e.exec_count, "ename": e.ename, "evalue": _short(e.evalue)}
        log.info(f"{notebook.stem} failed in cell {result['error']['cell']}:{e}")  # str(e): full traceback
        if e.ename == "KeyboardInterrupt":
            raise KeyboardInterrupt from e
    except KeyboardInterrupt:
        raise
    except Exception as e:  # kernel died, cell timeout, unreadable notebook, ...
        result["status"] = "failed"
        cell, exec_count = _locate_cell(output) if output.is_file() else (None, None)
        evalue = _short(e)
        if type(e).__name__ == "DeadKernelError":
            evalue += " (killed, e.g. out of memory, or crashed in native code; the log may say more)"
        result["error"] = {"cell": cell, "exec_count": exec_count, "ename": type(e).__name__, "evalue": evalue}
        log.exception(f"{notebook.stem} failed: {type(e).__name__}")
    finally:
        result["wall_s"] = round(time.perf_counter() - start, 2)

    if output.is_file():
        try:
            result["records"] = read_records(output)
        except ValueError as e:
            print(f"  warning: could not read the records of {output}: {e}")
    for meta, value in meta_of(result["records"]).items():
        if value is not None:
            result[meta] = value
    log.info(f"===== end {notebook.stem}: {result['status']} in {result['wall_s']} s")
    return result


# ----------------------------------------------------------------------------- command line
def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m utils run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lessons", nargs="*", metavar="LESSON",
                   help='"01", "1", "01_sft_from_scratch" or a notebook path (default: every lesson)')
    p.add_argument("--preset", default=None,
                   help='preset passed to each lesson (default "auto"; "tiny" with --inplace)')
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/<preset>)")
    p.add_argument("--seed", type=int, default=0, help="SEED passed to each lesson (default 0)")
    p.add_argument("--resume", action="store_true", help="pass RESUME=True to lessons that declare it")
    p.add_argument("--timeout", type=int, default=None, metavar="S",
                   help="per-cell execution timeout in seconds (default: none)")
    p.add_argument("--inplace", action="store_true",
                   help="execute on tiny and write the cleaned notebooks back over notebooks/ (make notebooks)")
    p.add_argument("--all", action="store_true", dest="show_all",
                   help="print every record of each lesson in the summary, not only its headline")
    p.add_argument("--bench", action="store_true",
                   help="also measure peak RSS per lesson; write report.json/report.md/history.jsonl")
    p.add_argument("--notebooks", type=Path, default=NOTEBOOKS_DIR if NOTEBOOKS_DIR.is_dir() else LABS_DIR,
                   help="where the lessons live (default notebooks/; labs/ in a student handout)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Run the selected lessons; return the exit status (0 ok, 1 a lesson failed, 2 usage, 130 Ctrl-C)."""
    args = parse_args(argv)
    preset = args.preset or ("tiny" if args.inplace else "auto")
    if args.inplace and preset != "tiny":
        print(f"error: --inplace writes the committed notebooks, which are always executed with preset "
              f"'tiny' on CPU; got --preset {preset!r}. Drop --preset or use --out to keep a {preset} run.",
              file=sys.stderr)
        return 2
    try:
        lessons = find_lessons(args.lessons, args.notebooks)
    except LookupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    out_dir = Path(args.out) if args.out else RUNS_DIR / preset
    out_dir.mkdir(parents=True, exist_ok=True)
    results, interrupted = [], False
    with log_to(out_dir / "run.log"), sigterm_as_interrupt():
        log.info(f"===== python -m utils run {' '.join(argv if argv is not None else sys.argv[1:])}")
        for i, notebook in enumerate(lessons, 1):
            print(f"[{i}/{len(lessons)}] {notebook.stem} (preset {preset}) ...", flush=True)
            try:
                result = execute_lesson(notebook, out_dir, preset, seed=args.seed, resume=args.resume,
                                        timeout=args.timeout, bench=args.bench)
            except KeyboardInterrupt:
                print(f"  interrupted; {notebook.stem} did not finish", flush=True)
                log.info(f"===== interrupted during {notebook.stem}")
                results.append({"lesson": notebook.stem, "notebook": str(out_dir / notebook.name), "preset": preset,
                                "model": None, "device": None, "wall_s": None, "status": "interrupted",
                                "source": str(notebook), "error": None, "records": {}})
                interrupted = True
                break
            result["source"] = str(notebook)
            results.append(result)
            if result["status"] == "ok":
                extra = f", peak RSS {result['peak_rss_mb']:.0f} MB" if args.bench else ""
                print(f"  ok in {result['wall_s']:.1f} s{extra}", flush=True)
                if args.inplace:
                    write_back(Path(result["notebook"]), notebook)
                    print(f"  wrote {notebook}", flush=True)
            else:
                print(f"  FAILED in {result['wall_s']:.1f} s: {describe_error(result)}\n"
                      f"  traceback: {out_dir / 'run.log'}; executed notebook: {result['notebook']}", flush=True)
                if args.inplace:
                    print(f"  not overwriting {notebook}: fix the failure first", flush=True)
        if interrupted:
            gc.collect()  # the interrupted kernel's asyncio tasks complain now, into the log

        summarize(results, out_dir, args.show_all)
        if args.bench:
            write_bench(results, Path(args.out) if args.out else REPO_ROOT / "bench")

        failed = [r["lesson"] for r in results if r["status"] != "ok"]
        if interrupted:
            message, status = f"interrupted after {len(results) - 1} of {len(lessons)} lessons", 130
        elif failed:
            message, status = f"{len(failed)} of {len(results)} lessons failed: {', '.join(failed)}", 1
        else:
            message, status = f"all {len(results)} lessons ok", 0
        log.info(f"===== done: {message}")
    print(message, file=sys.stderr if status else sys.stdout)
    return status


if __name__ == "__main__":
    sys.exit(main())
