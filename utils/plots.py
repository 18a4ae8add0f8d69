"""Small plotting helpers shared by the lessons (matplotlib only).

Three functions cover what the lessons draw:

* :func:`plot_log_history` -- training curves from a Hugging Face ``Trainer``
  (``trainer.state.log_history``);
* :func:`plot_curves` -- curves from a hand-written training loop;
* :func:`bar_compare` -- labelled bars for before/after comparisons.

Each takes an optional ``ax`` (a new figure is made when it is None), always sets a
title and both axis labels, and returns the Axes so a lesson can add to it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence


def _new_axes(ax, figsize=(6, 3.5)):
    """Return ``ax``, or the Axes of a new figure when ``ax`` is None."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize)
    return ax


def _moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average: point i is the mean of values[max(0, i-window+1) : i+1].

    The output has the same length as the input (the first points average fewer values),
    so it can be drawn against the same x positions as the raw curve.
    """
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_log_history(log_history, keys=("loss", "eval_loss"), title="Training curves", ax=None,
                     xlabel="step", ylabel=None):
    """Plot metrics from ``trainer.state.log_history``, one line per key.

    ``log_history`` is a list of dicts, each with a ``"step"`` and some metric keys;
    training and evaluation logs are separate dicts, so every key is collected from
    the entries that have it. Keys that never appear are skipped; if none of ``keys``
    appears, ValueError lists the keys that are available. ``ylabel`` defaults to the
    plotted key names joined by " / ". Returns the Axes.
    """
    if isinstance(keys, str):
        keys = (keys,)
    series = {}
    for key in keys:
        points = [(entry["step"], entry[key]) for entry in log_history
                  if key in entry and "step" in entry and entry[key] is not None]
        if points:
            series[key] = points
    if not series:
        available = sorted({k for entry in log_history for k in entry if k != "step"})
        raise ValueError(
            f"plot_log_history: none of the keys {list(keys)} is in the log history; "
            f"available keys: {available or 'none (empty log history: did the trainer log anything?)'}"
        )

    ax = _new_axes(ax)
    for key, points in series.items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, markersize=3, label=key)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel or " / ".join(series))
    ax.legend()
    ax.grid(alpha=0.3)
    return ax


def plot_curves(curves: Mapping[str, Sequence[float] | tuple[Sequence, Sequence]], title: str,
                xlabel: str = "step", ylabel: str = "value", ax=None, smooth: int = 1):
    """Plot named curves from a hand-written loop, e.g. ``{"train loss": losses}``.

    A curve is either a list of values, drawn against steps 1..N (the value after the
    first optimizer step is step 1), or an ``(xs, ys)`` tuple drawn as given.
    With ``smooth > 1`` each curve is drawn as a trailing moving average over
    ``smooth`` points, with the raw curve drawn faintly behind it in the same colour.
    Returns the Axes.
    """
    if not curves:
        raise ValueError("plot_curves: no curves given (expected a dict name -> values or (xs, ys))")
    if not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"plot_curves: smooth must be an int >= 1 (a window length), got {smooth!r}")

    ax = _new_axes(ax)
    for name, curve in curves.items():
        if isinstance(curve, tuple) and len(curve) == 2:
            xs, ys = list(curve[0]), [float(y) for y in curve[1]]
            if len(xs) != len(ys):
                raise ValueError(f"plot_curves: curve {name!r} has {len(xs)} x values but {len(ys)} y values")
        else:
            ys = [float(y) for y in curve]
            xs = list(range(1, len(ys) + 1))
        if smooth > 1:
            (raw,) = ax.plot(xs, ys, alpha=0.25, linewidth=1)
            ax.plot(xs, _moving_average(ys, smooth), color=raw.get_color(), label=f"{name} (avg {smooth})")
        else:
            ax.plot(xs, ys, label=name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(alpha=0.3)
    return ax


def bar_compare(values: Mapping[str, float], title: str, ylabel: str, ax=None, fmt: str = "{:.2f}",
                xlabel: str = ""):
    """Draw one labelled bar per entry of ``values`` with its value written above it.

    Used for before/after comparisons, e.g. ``{"before SFT": 0.02, "after SFT": 0.97}``.
    ``fmt`` formats the annotations. The x axis is labelled ``xlabel`` (default: empty
    label set explicitly, since the bar names already say what each bar is). Returns the Axes.
    """
    if not values:
        raise ValueError("bar_compare: no values given (expected a dict label -> number)")
    labels = list(values)
    heights = [float(values[k]) for k in labels]
    ax = _new_axes(ax, figsize=(max(3.0, 1.1 * len(labels) + 1), 3.5))
    bars = ax.bar(range(len(labels)), heights, color=[f"C{i % 10}" for i in range(len(labels))])
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30 if len(labels) > 3 else 0, ha="right" if len(labels) > 3 else "center")
    for bar, h in zip(bars, heights):
        ax.annotate(fmt.format(h), (bar.get_x() + bar.get_width() / 2, h), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom" if h >= 0 else "top", fontsize=8)
    top = max(heights + [0.0])
    bottom = min(heights + [0.0])
    span = (top - bottom) or 1.0
    ax.set_ylim(bottom - (0.12 * span if bottom < 0 else 0), top + 0.15 * span)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    return ax


def log_series(log_history, key: str = "loss") -> tuple[list, list]:
    """``(steps, values)`` of one metric from ``trainer.state.log_history``, for :func:`plot_curves`."""
    pts = [(h["step"], h[key]) for h in log_history if key in h and "step" in h]
    if not pts:
        keys = sorted({k for h in log_history for k in h})
        raise ValueError(f"{key!r} is not in the log history; available keys: {keys}")
    return [s for s, _ in pts], [v for _, v in pts]
