"""What a run of the lessons showed: each lesson's headline on the console, ``summary.json``, and the benchmark report.

``python -m utils run`` ends with :func:`summarize` (its picture, ``summary.png``, is drawn by
:mod:`utils.course.figures`); ``--bench`` adds :func:`write_bench`.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import textwrap
from pathlib import Path

from .. import headlines
from ..constants import REPO_ROOT
from ..records import read_records
from .figures import plot_summary
from .lessons import duration, meta_of, metrics_of


def describe_error(result: dict) -> str:
    """One line saying where and how a lesson failed, e.g. 'cell 7 (In [5]): ValueError: boom'."""
    err = result.get("error") or {}
    where = f"cell {err['cell']} (In [{err['exec_count']}]): " if err.get("cell") is not None else ""
    return f"{where}{err.get('ename', 'Error')}: {err.get('evalue', '')}".rstrip(": ")


# ----------------------------------------------------------------------------- summary
def declaration_of(result: dict) -> tuple[dict | None, str]:
    """(the headline a lesson declared, checked, or None; where it came from): from its run's records,
    else from the committed lesson it ran (``result["source"]``: a run that stopped before its headline
    cell), else (None, "")."""
    sources = [("run", result.get("records") or {})]
    if result.get("source"):
        with contextlib.suppress(OSError, ValueError):
            sources.append(("committed lesson", read_records(result["source"])))
    for origin, records in sources:
        found = headlines.declared(records)
        if found is not None:
            return found, origin
    return None, ""


def lesson_block(result: dict, show_all: bool = False) -> list[str]:
    """One lesson's part of the summary: status, wall time against its target, what it ran on, then its
    headline (``utils.headlines``) -- every numeric record too with ``show_all``. Never raises: the records
    may come from a student's notebook (``--notebooks labs``)."""
    records = result.get("records") or {}
    declaration, origin = declaration_of(result)
    wall = result.get("wall_s")
    time = duration(wall) if wall is not None else "-"
    target = (declaration or {}).get("tiny_target_s") if result.get("preset") == "tiny" else None
    if target and wall is not None:
        time += f" of a {duration(target)} target" + (" (OVER)" if wall > target else "")
    meta = meta_of(records)
    ran_on = " · ".join(str(v) for v in (result.get("preset"), meta["model"], meta["hardware"] or result.get("device"))
                        if v)
    lines = [f"{result['lesson']}  {result['status']}  {time}" + (f"  ({ran_on})" if ran_on else "")]
    if result.get("error"):
        lines.append(f"  error: {describe_error(result)}")
    if declaration is None:
        lines.append("  (this lesson declares no headline: see every record with --all)")
    else:
        if origin != "run":
            lines.append("  (the run stopped before its headline: the committed lesson's declaration, read on "
                         "what the run recorded)")
        try:
            lines += headlines.block(declaration, records)
        except Exception as e:  # noqa: BLE001 -- one lesson's odd records never cost the others their summary
            lines.append(f"  headline unreadable: {type(e).__name__}: {e}")
    if show_all:
        metrics = {k: f"{v:.4g}" if headlines.number_or_none(v) is not None else str(v)[:40]
                   for k, v in metrics_of(records).items()}
        width = max((len(k) for k in metrics), default=0)
        lines += [f"    {k.ljust(width)}  {v}" for k, v in metrics.items()]
    return lines


def format_summary(results: list[dict], show_all: bool = False) -> str:
    """The console summary: a block per lesson (:func:`lesson_block`) and what the ± means."""
    blocks = ["\n".join(lesson_block(r, show_all)) for r in results]
    return "\n\n".join(blocks + [textwrap.fill(headlines.FOOTNOTE, 110)])


def summarize(results: list[dict], out_dir: Path, show_all: bool = False) -> str:
    """Print the summary and save summary.json (every record, and each headline evaluated) and summary.png
    in ``out_dir``; return the printed text."""
    saved = []
    for r in results:
        declaration = declaration_of(r)[0]
        try:
            rows = headlines.rows(declaration, r.get("records") or {}) if declaration else None
            for row in rows or ():   # each stage's value and error; its per-problem scores stay in the records
                row["stages"] = [{k: s[k] for k in ("label", "value", "se")} for s in row["stages"]]
        except Exception:  # noqa: BLE001 -- as in lesson_block: the summary is written whatever a record holds
            rows = None
        saved.append({**r, "headline": rows, "tiny_target_s": (declaration or {}).get("tiny_target_s")})
    (out_dir / "summary.json").write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
    text = format_summary(results, show_all)
    print("\n" + text)
    if results:
        try:
            plot_summary(saved, out_dir / "summary.png")
        except Exception as e:  # noqa: BLE001 -- the printed summary and summary.json are what matter most
            print(f"summary.png could not be drawn: {type(e).__name__}: {e}")
    print(f"\nsummary: {out_dir / 'summary.json'}, {out_dir / 'summary.png'}; every record: --all; "
          f"log: {out_dir / 'run.log'}")
    return text


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


