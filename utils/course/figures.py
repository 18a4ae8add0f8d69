"""``summary.png``: what a run of the lessons showed, as one small panel per lesson and one of wall times.

A lesson's panel draws its headline (``utils.headlines``): one axis per result, its stages as bars
with one standard error as the error bar, so that each axis holds one kind of quantity. The last
panel compares each lesson's wall time with its ``tiny`` target.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from ..headlines import SHARE, number

PANEL_IN = (7.0, 2.7)   # inches per panel: two panels side by side fill a laptop screen at 100 dpi


def _draw_result(ax, row: dict) -> None:
    """One headline result: a bar per stage, its standard error as an error bar, its value written above."""
    stages = row["stages"]
    xs = range(len(stages))
    heights = [s["value"] or 0.0 for s in stages]
    errors = [s["se"] or 0.0 for s in stages]
    ax.bar(xs, heights, color=[f"C{i % 10}" for i in xs])
    with_se = [i for i, s in enumerate(stages) if s["se"] is not None]   # none drawn where there is no error
    if with_se:
        ax.errorbar(with_se, [heights[i] for i in with_se], yerr=[errors[i] for i in with_se], fmt="none",
                    ecolor="k", elinewidth=1, capsize=3)
    share = row["unit"] == SHARE
    top = 1.0 if share else max([h + e for h, e in zip(heights, errors)] + [0.0])
    bottom = 0.0 if share else min([h - e for h, e in zip(heights, errors)] + [0.0])
    span = (top - bottom) or 1.0
    for x, s, h, e in zip(xs, stages, heights, errors):   # beyond the error bar's end, above or below
        ax.annotate(number(s["value"], row["unit"]) if s["value"] is not None else "not\nrecorded",
                    (x, h + e if h >= 0 else h - e), xytext=(0, 2 if h >= 0 else -2), textcoords="offset points",
                    ha="center", va="bottom" if h >= 0 else "top", fontsize=7)
    ax.set_ylim(bottom - (0.18 * span if bottom < 0 else 0), top + (0.18 * span if top > 0 else 0))
    if bottom < 0:
        ax.axhline(0, color="k", lw=0.8)
    if share:
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xticks(list(xs))
    long = len(stages) > 3 or max(len(s["label"]) for s in stages) > 9
    ax.set_xticklabels([s["label"] for s in stages], fontsize=7, rotation=25 if long else 0,
                       ha="right" if long else "center")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title("\n".join(textwrap.wrap(row["name"], 24)), fontsize=8)
    ax.set_ylabel("share" if share else row["unit"], fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def _lesson_panel(sub, result: dict) -> None:
    wall = result.get("wall_s")
    title = result["lesson"] + ("" if result["status"] == "ok" else f" ({result['status']})")
    title += f", {wall:.0f} s" if wall is not None else ""
    sub.suptitle(title, fontsize=9, fontweight="bold")
    rows = result.get("headline") or []
    axes = sub.subplots(1, max(1, len(rows)), squeeze=False)[0]
    if not rows:
        axes[0].text(0.5, 0.5, "no headline declared", ha="center", va="center", transform=axes[0].transAxes)
        axes[0].set(xticks=[], yticks=[], xlabel="", ylabel="")
    for ax, row in zip(axes, rows):
        _draw_result(ax, row)


def _wall_panel(sub, results: list[dict]) -> None:
    sub.suptitle("Wall time per lesson", fontsize=9, fontweight="bold")
    ax = sub.subplots()
    walls = [r.get("wall_s") or 0.0 for r in results]
    targets = {i: r["tiny_target_s"] for i, r in enumerate(results) if r.get("tiny_target_s")
               and r.get("preset") == "tiny"}
    ax.bar(range(len(results)), walls, color=["C3" if w > targets.get(i, float("inf")) else "C0"
                                              for i, w in enumerate(walls)])
    if targets:
        ax.scatter(list(targets), list(targets.values()), marker="_", s=600, color="k", zorder=3,
                   label="target (tiny)")
        ax.legend(fontsize=7, loc="upper left", markerscale=0.4)
    for i, r in enumerate(results):   # above the bar and its target marker, whichever is higher
        text = f"{walls[i]:.0f} s" if r.get("wall_s") is not None else "no time"
        ax.annotate(text, (i, max(walls[i], targets.get(i, 0.0))), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7)
    names = [r["lesson"][:2] + (f"\n≤ {targets[i]:.0f} s" if i in targets else "") for i, r in enumerate(results)]
    top = max(walls + list(targets.values()) + [1.0])
    ax.set_ylim(0, top * 1.2)
    ax.set_xticks(range(len(results)))
    ax.set_xticklabels(names, fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("lesson", fontsize=7)
    ax.set_ylabel("seconds", fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def plot_summary(results: list[dict], path: Path) -> None:
    """Save ``summary.png``: a panel per lesson (``result["headline"]``, the evaluated rows of
    ``utils.headlines.rows``) and a last panel of wall times against the ``tiny`` targets."""
    from matplotlib.figure import Figure  # no pyplot: works without a display, leaves no global state

    n = len(results) + 1
    ncols = 2 if n > 1 else 1
    nrows = -(-n // ncols)
    fig = Figure(figsize=(PANEL_IN[0] * ncols, PANEL_IN[1] * nrows), layout="constrained")
    subs = fig.subfigures(nrows, ncols, squeeze=False).ravel()
    for sub, result in zip(subs, results):
        _lesson_panel(sub, result)
    _wall_panel(subs[len(results)], results)
    fig.savefig(path, dpi=100)
