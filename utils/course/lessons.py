"""Lessons as files: finding them, reading what a run was, and cleaning an executed copy for commit."""
from __future__ import annotations

import copy
from pathlib import Path

from ..constants import LESSON_GLOB, META_KEYS, NOTEBOOKS_DIR, PAPERMILL_TAGS
from ..records import read_records

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


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
            matches = [p for p in available if int(lesson_number(p)) == int(sel)]
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


def lesson_number(path) -> str:
    """'01' for notebooks/01_sft_from_scratch.ipynb."""
    return Path(path).name[:2]


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


def own_cells(cells: list) -> list:
    """A notebook's cells without those papermill adds (the injected parameters, its error banner)."""
    return [c for c in cells if not PAPERMILL_TAGS & set(c.get("metadata", {}).get("tags", []))]


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
    for cell in own_cells(nb.cells):
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


# ----------------------------------------------------------------------------- the header's measured time
TINY_ROW = "| `tiny` |"   # the header table's row of the tiny preset; its last column is the lesson's time


def duration(seconds: float) -> str:
    """'1 min 49 s', '2 min', '58 s' (the header's time column and the runner's summary)."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{secs} s" if not minutes else f"{minutes} min" if not secs else f"{minutes} min {secs:02d} s"


def wall_seconds(records: dict) -> float | None:
    """A run's measured ``NN/wall_seconds`` record (None when it has none)."""
    walls = [v for k, v in records.items() if k.split("/", 1)[-1] == "wall_seconds"]
    return walls[0] if walls else None


def tiny_time(records: dict) -> str:
    """The header's time column for ``tiny``, from a run's records: its measured ``NN/wall_seconds``.

    Example: "1 min 28 s when `make notebooks` last ran it on CPU (2 cores); more on a slower machine". A run that
    loaded its SFT model from an earlier lesson's (its ``NN/sft_reused`` record is True) says so.
    Raises ValueError when the run recorded no wall time.
    """
    wall = wall_seconds(records)
    if wall is None:
        raise ValueError("the run recorded no wall_seconds")
    hardware = meta_of(records)["hardware"] or "this machine"
    reused = any(k.split("/", 1)[-1] == "sft_reused" and v is True for k, v in records.items())
    shared = ", its SFT start loaded from an earlier lesson's run (`utils.sft.sft_checkpoint`)" if reused else ""
    return f"{duration(wall)} when `make notebooks` last ran it on {hardware}{shared}; more on a slower machine"


def _tiny_row(nb):
    """(the header cell -- the first markdown cell -- and its ``tiny`` row, or None when it has none)."""
    cell = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    rows = [line for line in (cell.source if cell else "").splitlines() if line.startswith(TINY_ROW)]
    if len(rows) > 1:
        raise ValueError(f"the lesson's header has {len(rows)} table rows starting {TINY_ROW!r}; it needs one")
    return cell, rows[0] if rows else None


def header_time(nb) -> str:
    """The time column of the ``tiny`` row in the header of a lesson (an nbformat notebook)."""
    row = _tiny_row(nb)[1]
    if row is None:
        raise ValueError(f"the lesson's header (its first markdown cell) has no table row starting {TINY_ROW!r}")
    return row.rsplit("|", 2)[1].strip()


def write_back(executed: Path, original: Path) -> None:
    """Clean the executed notebook and write it over the committed lesson ``original``, with the header's
    ``tiny`` time set from the run's measured wall time (when the lesson's header has that row)."""
    import nbformat

    nb = clean_for_commit(nbformat.read(executed, as_version=4))
    cell, row = _tiny_row(nb)
    if row is not None:
        cell.source = cell.source.replace(row, f"{row.rsplit('|', 2)[0]}| {tiny_time(read_records(nb))} |", 1)
    nbformat.write(nb, original)
