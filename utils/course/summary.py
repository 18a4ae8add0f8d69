"""What a run of the lessons showed: the console table, ``summary.png``, and the benchmark report.

``python -m utils run`` ends with :func:`summarize`; ``--bench`` adds :func:`write_bench`.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path

from ..constants import REPO_ROOT
from .lessons import metrics_of


def describe_error(result: dict) -> str:
    """One line saying where and how a lesson failed, e.g. 'cell 7 (In [5]): ValueError: boom'."""
    err = result.get("error") or {}
    where = f"cell {err['cell']} (In [{err['exec_count']}]): " if err.get("cell") is not None else ""
    return f"{where}{err.get('ename', 'Error')}: {err.get('evalue', '')}".rstrip(": ")


# ----------------------------------------------------------------------------- summary
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

    from ..plots import bar_compare

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


