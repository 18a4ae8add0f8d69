"""Run the lessons end to end with papermill and summarise what they recorded.

Usage (from the repository root)::

    python -m utils.run                        # every notebooks/NN_*.ipynb, preset "auto"
    python -m utils.run 01 03 --preset 24g     # some lessons on a 24 GB GPU
    nohup python -m utils.run --preset 80g &   # long run; follow it with: tail -f runs/80g/run.log
    python -m utils.run --inplace              # `make notebooks`: re-execute on tiny, commit-ready
    python -m utils.run --preset tiny --bench --out bench   # `make bench`

A lesson is named by its number ("01" or "1"), its file stem ("01_sft_from_scratch") or a
path to a notebook. Each lesson is executed with the parameters ``PRESET``, ``SEED`` and
``OUTPUT_DIR`` (and ``RESUME=True`` with ``--resume``, for lessons that declare it); only
parameters the notebook's ``parameters`` cell declares are passed.

Output layout, under ``--out`` (default ``runs/<preset>``)::

    NN_name.ipynb    the executed copy of the lesson (records are read back from it)
    NN_name/         the lesson's OUTPUT_DIR (checkpoints, adapters, ...)
    run.log          appended: timestamps, lesson start/end, everything the kernel printed
    summary.json     one dict per lesson run by this invocation, with all its records
    summary.png      a bar chart per lesson of its records in [0, 1], and wall time per lesson

Exit status: 0 when every lesson succeeded, 1 when one failed, 2 for a usage error
(unknown lesson, --inplace with a GPU preset), 130 when interrupted with Ctrl-C.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import gc
import json
import logging
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
LESSON_GLOB = "[0-9][0-9]_*.ipynb"
META_KEYS = ("preset", "model", "device", "hardware")  # recorded by every lesson; shown as columns, not metrics
# Always set for the kernel. The inline backend embeds every figure as a PNG in the executed
# notebook (what a student, a grader and the committed lessons show); a GUI backend would open
# windows, and Agg (the Makefile's default for plain Python) would drop the figures.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
KERNEL_ENV = {"MPLBACKEND": INLINE_BACKEND, "TOKENIZERS_PARALLELISM": "false"}
KERNEL_ENV_DEFAULTS = {"TQDM_DISABLE": "1"}  # set unless the user already set them
RSS_SAMPLE_S = 0.2

log = logging.getLogger("utils.run")


# ----------------------------------------------------------------------------- finding lessons
def find_lessons(selectors=(), notebooks_dir=NOTEBOOKS_DIR) -> list[Path]:
    """Resolve lesson selectors to notebook paths, in the order given (no duplicates).

    With no selectors, every ``NN_*.ipynb`` in ``notebooks_dir`` in lesson order. A selector
    is a lesson number ("01", "1"), a file stem or name ("01_sft_from_scratch[.ipynb]"), a
    unique stem prefix ("01_sft"), or a path to an existing notebook. Raises LookupError
    naming the available lessons when a selector matches nothing (or more than one).
    """
    notebooks_dir = Path(notebooks_dir)
    available = sorted(notebooks_dir.glob(LESSON_GLOB))
    if not selectors:
        if not available:
            raise LookupError(f"no lessons found in {notebooks_dir} (expected files named NN_name.ipynb)")
        return available

    found = []
    for sel in selectors:
        sel = str(sel)
        path = Path(sel)
        if path.suffix == ".ipynb" and path.is_file():
            matches = [path.resolve()]
        elif sel.isdigit():
            matches = [p for p in available if int(p.name[:2]) == int(sel)]
        else:
            stem = sel.removesuffix(".ipynb")
            matches = [p for p in available if p.stem == stem] or [p for p in available if p.stem.startswith(stem)]
        if len(matches) != 1:
            names = ", ".join(p.stem for p in available) or f"none (no NN_name.ipynb in {notebooks_dir})"
            what = "is ambiguous" if matches else "matches no lesson"
            raise LookupError(f"lesson {sel!r} {what}. Available lessons: {names}")
        if matches[0] not in found:
            found.append(matches[0])
    return found


# ----------------------------------------------------------------------------- execution helpers
@contextlib.contextmanager
def kernel_env():
    """Set the environment the kernel inherits (progress bars off, inline figures); restore it after."""
    saved = dict(os.environ)
    os.environ.update(KERNEL_ENV)
    for key, value in KERNEL_ENV_DEFAULTS.items():
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
    for logger in (log, logging.getLogger("papermill"), logging.getLogger("asyncio")):
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
                 if "papermill-error-cell-tag" not in c.metadata.get("tags", [])]
    except Exception:
        return None, None
    if cell_index is None:
        started = [i for i, c in enumerate(cells) if c.metadata.get("papermill", {}).get("start_time")]
        if not started:
            return None, None
        cell_index = started[-1]
    injected = sum("injected-parameters" in c.metadata.get("tags", []) for c in cells[:cell_index])
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
        with kernel_env(), stderr_to(out_dir / "run.log"), measure:
            papermill.execute_notebook(
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


def describe_error(result: dict) -> str:
    """One line saying where and how a lesson failed, e.g. 'cell 7 (In [5]): ValueError: boom'."""
    err = result.get("error") or {}
    where = f"cell {err['cell']} (In [{err['exec_count']}]): " if err.get("cell") is not None else ""
    return f"{where}{err.get('ename', 'Error')}: {err.get('evalue', '')}".rstrip(": ")


# ----------------------------------------------------------------------------- summary
def meta_of(records: dict) -> dict:
    """What a run was: {"preset", "model", "device", "hardware"} from its records (None when not recorded)."""
    return {meta: next((v for k, v in records.items() if k.split("/", 1)[-1] == meta), None) for meta in META_KEYS}


def metrics_of(records: dict) -> dict:
    """Numeric records with the lesson prefix removed ('01/acc' -> 'acc'), minus preset/model/device."""
    out = {}
    for key, value in records.items():
        name = key.split("/", 1)[-1]
        if name in META_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[name] = value
    return out


def format_table(results: list[dict]) -> str:
    """The console summary: one row per lesson, then its metrics indented below it."""
    header = ("lesson", "preset", "model", "device", "wall_s", "status")
    rows = [tuple(str(r.get(k) if r.get(k) is not None else "-") if k != "wall_s"
                  else (f"{r['wall_s']:.1f}" if r.get("wall_s") is not None else "-") for k in header)
            for r in results]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i != 4 else str(c).rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    lines = [line(header), line(["-" * w for w in widths])]
    for r, row in zip(results, rows):
        lines.append(line(row))
        if r.get("error"):
            lines.append(f"    error: {describe_error(r)}")
        metrics = metrics_of(r.get("records", {}))
        width = max((len(k) for k in metrics), default=0)
        lines += [f"    {k.ljust(width)}  {v:.3f}" for k, v in metrics.items()]
    return "\n".join(lines)


def plot_summary(results: list[dict], path: Path) -> None:
    """Save one small bar chart per lesson (its records in [0, 1]) and one of wall time per lesson."""
    from matplotlib.figure import Figure  # no pyplot: works without a display, leaves no global state

    from utils.plots import bar_compare

    n = len(results) + 1
    ncols = min(3, n)
    nrows = -(-n // ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, r in zip(axes, results):
        title = r["lesson"] + ("" if r["status"] == "ok" else f" ({r['status']})")
        shares = {k: v for k, v in metrics_of(r.get("records", {})).items() if 0 <= v <= 1}
        if shares:
            bar_compare(shares, title=title, ylabel="value (0-1)", ax=ax, xlabel="record")
            ax.set_ylim(0, 1.12)
            ax.tick_params(axis="x", labelsize=7)
        else:
            ax.text(0.5, 0.5, "no records in [0, 1]", ha="center", va="center", transform=ax.transAxes)
            ax.set(title=title, xlabel="record", ylabel="value (0-1)", xticks=[], yticks=[])
    walls = {r["lesson"]: r["wall_s"] or 0.0 for r in results}
    bar_compare(walls, title="Wall time per lesson", ylabel="seconds", ax=axes[len(results)],
                fmt="{:.1f} s", xlabel="lesson")
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.savefig(path, dpi=100)


def summarize(results: list[dict], out_dir: Path) -> str:
    """Print the summary table and save summary.json and summary.png in ``out_dir``; return the table."""
    table = format_table(results)
    print("\n" + table)
    (out_dir / "summary.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    if results:
        plot_summary(results, out_dir / "summary.png")
    print(f"\nsummary: {out_dir / 'summary.json'}, {out_dir / 'summary.png'}; log: {out_dir / 'run.log'}")
    return table


# ----------------------------------------------------------------------------- bench
def machine_info() -> dict:
    """CPU count, total RAM, library versions and GPU name (torch is imported only here)."""
    from importlib import metadata

    import psutil

    info = {"cpu_count": os.cpu_count(), "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("torch", "transformers", "trl"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            info[pkg] = None
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception as e:  # a broken CUDA install should not lose the benchmark
        info["gpu"] = f"unknown ({type(e).__name__})"
    return info


def _git_commit() -> str | None:
    """Short commit hash of the repository, or None (no git, no commits yet)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def write_bench(results: list[dict], bench_dir: Path) -> dict:
    """Write report.json and report.md to ``bench_dir`` and append a line to history.jsonl."""
    bench_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "machine": machine_info(),
        "lessons": [{k: r.get(k) for k in ("lesson", "preset", "model", "device", "wall_s", "peak_rss_mb",
                                          "status", "error", "records")} for r in results],
    }
    (bench_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    m = report["machine"]
    md = [f"# Benchmark, {report['date']}", "",
          f"Commit {report['commit'] or 'none'}; {m['cpu_count']} CPUs, {m['ram_gb']} GB RAM, "
          f"GPU {m['gpu'] or 'none'}; Python {m['python']}, torch {m['torch']}, "
          f"transformers {m['transformers']}, trl {m['trl']}.", "",
          "| lesson | preset | status | wall (s) | peak RSS (MB) | metrics |",
          "|---|---|---|---:|---:|---|"]
    for r in report["lessons"]:
        metrics = ", ".join(f"{k} {v:.3f}" for k, v in metrics_of(r["records"] or {}).items())
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {describe_error(r)}"
        md.append(f"| {r['lesson']} | {r['preset']} | {status} | {r['wall_s']} | {r.get('peak_rss_mb')} "
                  f"| {metrics or '-'} |")
    (bench_dir / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")

    history = {"date": report["date"], "commit": report["commit"],
               "machine": {k: m[k] for k in ("cpu_count", "ram_gb", "gpu", "torch", "transformers", "trl")},
               "lessons": {r["lesson"]: {k: r[k] for k in ("preset", "status", "wall_s", "peak_rss_mb")}
                           for r in report["lessons"]}}
    with open(bench_dir / "history.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(history) + "\n")
    print(f"bench: {bench_dir / 'report.md'} (history in {bench_dir / 'history.jsonl'})")
    return report


# ----------------------------------------------------------------------------- committing
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
DROP_CELL_TAGS = {"injected-parameters", "papermill-error-cell-tag"}


def clean_for_commit(nb):
    """Return a copy of an executed notebook that is fit to commit.

    Removes the papermill-injected parameters cell (and papermill's error banner),
    ``metadata.papermill`` / ``metadata.execution`` / ``metadata.widgets`` of the notebook
    and of every cell, error outputs and widget views. Outputs and execution counts stay.
    """
    nb = copy.deepcopy(nb)
    for key in ("papermill", "execution", "widgets"):
        nb.metadata.pop(key, None)
    cells = []
    for cell in nb.cells:
        if DROP_CELL_TAGS & set(cell.get("metadata", {}).get("tags", [])):
            continue
        for key in ("papermill", "execution", "widgets"):
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            outputs = []
            for out in cell.outputs:
                if out.output_type == "error":
                    continue
                if WIDGET_MIME in out.get("data", {}):
                    del out.data[WIDGET_MIME]
                    if not out.data:
                        continue
                outputs.append(out)
            cell.outputs = outputs
        cells.append(cell)
    nb.cells = cells
    return nb


def write_back(executed: Path, original: Path) -> None:
    """Clean the executed notebook and write it over the committed lesson ``original``."""
    import nbformat

    nb = clean_for_commit(nbformat.read(executed, as_version=4))
    nbformat.write(nb, original)


# ----------------------------------------------------------------------------- command line
def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m utils.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lessons", nargs="*", metavar="LESSON",
                   help='"01", "1", "01_sft_from_scratch" or a notebook path (default: every lesson)')
    p.add_argument("--preset", default=None, help='preset passed to each lesson (default "auto"; "tiny" with --inplace)')
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/<preset>)")
    p.add_argument("--seed", type=int, default=0, help="SEED passed to each lesson (default 0)")
    p.add_argument("--resume", action="store_true", help="pass RESUME=True to lessons that declare it")
    p.add_argument("--timeout", type=int, default=None, metavar="S",
                   help="per-cell execution timeout in seconds (default: none)")
    p.add_argument("--inplace", action="store_true",
                   help="execute on tiny and write the cleaned notebooks back over notebooks/ (make notebooks)")
    p.add_argument("--bench", action="store_true",
                   help="also measure peak RSS per lesson; write report.json/report.md/history.jsonl")
    p.add_argument("--notebooks", type=Path, default=NOTEBOOKS_DIR, help="where the lessons live (default notebooks/)")
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

    out_dir = Path(args.out) if args.out else REPO_ROOT / "runs" / preset
    out_dir.mkdir(parents=True, exist_ok=True)
    results, interrupted = [], False
    with log_to(out_dir / "run.log"):
        log.info(f"===== python -m utils.run {' '.join(argv if argv is not None else sys.argv[1:])}")
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
                                "error": None, "records": {}})
                interrupted = True
                break
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

        summarize(results, out_dir)
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
