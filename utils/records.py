"""Record the numbers a lesson claims, and read them back from an executed notebook.

A lesson ends with a results cell that calls ``record("<lesson>/<metric>", value)``
for every number it claims, then ``show_records()``. Inside Jupyter that emits one
display output with its own MIME type, holding every value recorded since the last
call, so the values are stored *in the executed notebook* as JSON (and the cell shows
one line, not one per value); tests, the runner's summary and the grader then call
``read_records(path)`` instead of scraping printed text.

The results cell starts with ``%%results`` (:func:`results_cell`): each of its statements runs on its
own, so that a section that did not run (an exercise of the lab not done yet) costs only its own
records, and the others are still saved.

This module deliberately imports neither torch nor numpy: values such as numpy
scalars and 0-d tensors are converted by duck typing (they have ``.item()``).
"""
from __future__ import annotations

import ast
import json
import math
import re
import sys
from pathlib import Path

from . import stubs
from .stubs import unfinished

RECORD_MIME = "application/vnd.posttraining.record+json"
KEY_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.@/-]+$")

# Everything recorded in this process, key -> plain JSON value (scripts can read it).
RECORDS: dict[str, object] = {}
# Inside a kernel: keys recorded since the last show_records(), which saves them in the notebook.
PENDING: list[str] = []


# ----------------------------------------------------------------------------- conversion
def _to_json(value, key: str, allow_item: bool = True):
    """Convert ``value`` to plain JSON types (None, bool, int, float, str, list, dict).

    Raises ValueError for NaN/inf and TypeError for anything that has no JSON form.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(
                f"record({key!r}): value is {value!r}, which JSON cannot hold. "
                f"If the metric is undefined here, record None instead."
            )
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_to_json(v, key) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(
                    f"record({key!r}): dict keys must be str (JSON objects), got {type(k).__name__} key {k!r}"
                )
            out[k] = _to_json(v, key)
        return out
    item = getattr(value, "item", None)
    if allow_item and callable(item):  # numpy scalars, 0-d arrays, 0-d / 1-element tensors
        try:
            plain = item()
        except (ValueError, RuntimeError) as e:  # arrays / tensors with more than one element
            raise TypeError(
                f"record({key!r}): cannot record a {type(value).__name__} with more than one "
                f"element; convert it with .tolist() or record a scalar"
            ) from e
        return _to_json(plain, key, allow_item=False)
    raise TypeError(
        f"record({key!r}): cannot record a value of type {type(value).__name__}; "
        f"use None, bool, int, float, str, or lists/dicts of those"
    )


def _show(value) -> str:
    """Short human-readable form of a plain JSON value (floats to at most 4 decimals)."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e16:
            return repr(value)
        if abs(value) >= 1e16 or abs(value) < 1e-4:
            return f"{value:.4g}"
        text = f"{value:.4f}" if abs(value) >= 1 else f"{value:.4g}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_show(v)}" for k, v in value.items()) + "}"
    return repr(value)


# ----------------------------------------------------------------------------- writing
def _in_ipython() -> bool:
    """True inside an IPython kernel or shell (IPython is imported lazily and is optional)."""
    if "IPython" not in sys.modules:   # a kernel has imported it; a script need not
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def record(key: str, value, text: str | None = None) -> None:
    """Record ``value`` under ``key`` (e.g. ``"grpo/heldout_accuracy_after"``).

    The value is converted to plain JSON (numpy / torch scalars via ``.item()``,
    tuples to lists) and stored in ``RECORDS``. Inside an IPython kernel it waits for
    :func:`show_records`, which saves everything recorded since its last call in the
    notebook at once. Outside IPython a one-line summary is printed (``text``, when
    given, replaces that line: for a value too long to read on one).

    Raises ValueError for a malformed key or a NaN/inf value (record None when a
    metric is undefined), TypeError for a value that has no JSON form.
    """
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise ValueError(
            f"record: invalid key {key!r}. Keys look like '<lesson>/<metric>', e.g. "
            f"'grpo/heldout_accuracy_after': letters, digits, '_', '.', '-' before the first '/', "
            f"and letters, digits, '_', '.', '@', '/', '-' after it (no spaces)."
        )
    value = _to_json(value, key)
    RECORDS[key] = value
    if _in_ipython():
        PENDING.append(key)
    else:
        print(text or f"[record] {key} = {_show(value)}")


def show_records() -> None:
    """Save the values recorded since the last call in the executed notebook: one display output of type
    ``RECORD_MIME`` (``{"records": [[key, value], ...]}``) whose text is a single line saying how many
    there are. Outside IPython, where :func:`record` prints each value, there is nothing to do.
    Taught in lesson 01's results cell; every lesson ends its results cell with it.
    """
    if not _in_ipython() or not PENDING:
        return
    from IPython.display import display

    keys = list(dict.fromkeys(PENDING))
    PENDING.clear()
    span = keys[0] if len(keys) == 1 else f"{keys[0]} ... {keys[-1]}"
    text = (f"{len(keys)} value{'s' * (len(keys) > 1)} recorded ({span}): saved in this notebook "
            "(utils.read_records reads them back)")
    display({RECORD_MIME: {"records": [[k, RECORDS[k]] for k in keys]}, "text/plain": text}, raw=True)


# ----------------------------------------------------------------------------- the results cell
class ResultsIncomplete(Exception):
    """Some statements of a results cell failed; what the others recorded is saved."""

    def _render_traceback_(self) -> list[str]:   # IPython shows the message alone: the frames are the course's
        return [f"{type(self).__name__}: {self}"]


def run_each(source: str, namespace: dict, filename: str = "<results cell>", first_line: int = 1,
             flags: int = 0) -> list[str]:
    """Run ``source`` in ``namespace`` one top-level statement at a time; a statement that raises does not stop
    the others (a loop is one statement). Returns one line per failure, in order: ``"line 12, utils.record(...):
    NameError: ..."``, its line numbered from ``first_line`` (the cell's, where ``source`` follows a magic's line).
    ``flags``: the compiler flags (``__future__`` imports) to compile with, none of this module's."""
    failed = []
    for statement in ast.parse(source, filename).body:
        try:
            code = compile(ast.Module([statement], type_ignores=[]), filename, "exec", flags=flags, dont_inherit=True)
            exec(code, namespace)  # noqa: S102
        except Exception as e:  # noqa: BLE001 -- each failure is reported, and the next statement runs
            text = " ".join((ast.get_source_segment(source, statement) or "").split())
            text = text if len(text) <= 80 else text[:79] + "…"
            why = " ".join(str(e).split())[:200]
            failed.append(f"line {statement.lineno + first_line - 1}, {text}: {type(e).__name__}: {why}")
    return failed


def results_cell(line: str, cell: str) -> None:
    """``%%results``, the first line of a lesson's results cell: each statement of the cell runs on its own
    (:func:`run_each`), then :func:`show_records` saves what was recorded. When statements failed, their lines
    are recorded too (``"<lesson>/results_failed"``) and the cell ends in one error that names them and the
    exercises not done yet. Registered by ``import utils`` inside IPython; taught in lesson 01's results cell."""
    from IPython import get_ipython

    shell = get_ipython()
    with stubs.paused():   # the body runs statement by statement, never skipped whole
        source = shell.transform_cell(cell)   # which drops the body's leading blank lines
    first = 2 + len(cell) - len(cell.lstrip("\n"))   # the cell's line 1 is %%results
    failed = run_each(source, shell.user_ns, first_line=first, flags=shell.compile.flags)
    if failed:
        keys = PENDING or re.findall(r"""record\(\s*f?["']([A-Za-z0-9_.-]+)/""", source)
        lesson = (keys[0].split("/")[0] if keys else "lesson")
        record(f"{lesson}/results_failed", failed)
    show_records()
    if failed:
        todo = unfinished(shell.user_ns)
        raise ResultsIncomplete(
            f"{len(failed)} statement(s) of this cell failed; what the others recorded is saved:\n  "
            + "\n  ".join(failed)
            + (f"\nExercises not done yet: {', '.join(todo)}. Finish them, run their sections again, then this "
               "cell." if todo else "\nRun the sections these need, then this cell again."))


def register_magic() -> None:
    """In an IPython kernel: make ``%%results`` available, and skip the cells that need an exercise not done yet
    (:func:`utils.stubs.register`). Nothing to do outside one."""
    if not _in_ipython():
        return
    from IPython import get_ipython

    shell = get_ipython()
    shell.register_magic_function(results_cell, magic_kind="cell", magic_name="results")
    stubs.register(shell)


# ----------------------------------------------------------------------------- reading
def _load_notebook(path) -> tuple[dict, str]:
    """Return (notebook dict, name for messages) from a path or an already-loaded dict."""
    if isinstance(path, dict):
        return path, "<notebook dict>"
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"read_records: no such notebook file: {path}")
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"read_records: {path} is not a valid notebook (not JSON: {e})") from e
    return nb, str(path)


def read_records(path) -> dict:
    """Read the records of an executed notebook: ``{key: value}`` in order of appearance.

    ``path`` is a ``.ipynb`` path (str or Path) or an already-loaded notebook dict
    (e.g. an nbformat node). A key recorded twice keeps the later value. A notebook
    without records gives ``{}``. Raises FileNotFoundError for a missing file and
    ValueError for a file that is not a (v4) notebook or holds a malformed record.
    """
    nb, name = _load_notebook(path)
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise ValueError(f"read_records: {name} is not a valid notebook (no 'cells' list; nbformat v4 expected)")

    records = {}
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        for out in cell.get("outputs") or []:
            if not isinstance(out, dict) or out.get("output_type") not in ("display_data", "execute_result"):
                continue
            data = out.get("data")
            if not isinstance(data, dict) or RECORD_MIME not in data:
                continue
            payload = data[RECORD_MIME]
            if isinstance(payload, str):  # some tools store JSON MIME data as a string
                try:
                    payload = json.loads(payload)
                except json.JSONDecodeError:
                    payload = None
            if isinstance(payload, dict) and isinstance(payload.get("records"), list):    # show_records()
                pairs = payload["records"]
            elif isinstance(payload, dict) and isinstance(payload.get("key"), str) and "value" in payload:
                pairs = [[payload["key"], payload["value"]]]                               # one record per output
            else:
                pairs = None
            if pairs is None or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in pairs):
                raise ValueError(f"read_records: {name}: malformed record in cell {i}: {str(payload)[:300]}")
            records.update(pairs)
    return records
