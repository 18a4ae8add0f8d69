"""Finding a class's submissions in a folder and reading each one, as the grader (``grade``) does.

A submission is never trusted: links are never followed, a file over :data:`MAX_SUBMISSION_BYTES`
is not read, and JSON is parsed first in a memory-limited child (``grading.parse_untrusted_json``).
"""
from __future__ import annotations

import json
import os
import re
import unicodedata
from pathlib import Path

import nbformat

from .grading import parse_untrusted_json
from .lessons import meta_of
from .written import IMAGE_TYPES

MAX_SUBMISSION_BYTES = 100 * 1024 * 1024   # a lab with every output is a few MB; bigger is not a lab
MAX_NAME_CHARS = 120                       # a student's name as the grader shows it
MAX_SAFE_BYTES = 100                       # a feedback file's name, in bytes (file systems allow 255)
MAX_CELLS = 5000                           # a lab has about 100 cells; a million would cost the grader gigabytes
MAX_FIGURES, MAX_FIGURE_BYTES, MAX_FIGURES_BYTES = 40, 4 << 20, 32 << 20   # figures copied into a feedback folder
MAX_FIGURE_PIXELS = 25_000_000             # width x height a PNG's header may declare (a lesson's figures: < 1 M)
PNG_MAGIC = IMAGE_TYPES["image/png"][0]
MAX_META_CHARS = 100                       # a self-reported preset, model, device or hardware in grades.csv


def shown_meta(records: dict) -> dict:
    """What a run says it was (preset, model, device, hardware: ``lessons.meta_of``), each one line of at most
    :data:`MAX_META_CHARS` characters as :func:`shown_name` writes it; "" when not recorded."""
    return {k: "" if v is None else shown_name(str(v))[:MAX_META_CHARS] for k, v in meta_of(records).items()}


def shown_name(name: str) -> str:
    """A file name as text the grader can write anywhere: bytes that are not UTF-8 (an old ``unzip``'s names, which
    Python reads as surrogates) become U+FFFD, control and format characters (line breaks, ANSI escapes, bidi
    overrides) become ``?``, and it is cut to :data:`MAX_NAME_CHARS` characters."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return "".join("?" if unicodedata.category(ch)[0] == "C" or unicodedata.category(ch) in ("Zl", "Zp") else ch
                   for ch in text)[:MAX_NAME_CHARS]


def find_submissions(folder: Path, lab_name: str, exclude: Path | None = None) -> list[dict]:
    """One dict per student: {"student", "path" (or None), "flags": [...], "detail"}.

    ``<student>.ipynb`` files and ``<student>/`` folders; in a folder, the notebook named like the
    lab, else its only notebook (flagged renamed), else its only file. Hidden files, checkpoints and
    the grader's own output are skipped.
    """
    skip = {".ipynb_checkpoints", "__MACOSX"}
    subs = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or entry.name in skip or (exclude and entry.resolve() == exclude.resolve()):
            continue
        student = entry.name[: -len(".ipynb")] if entry.name.endswith(".ipynb") else entry.name.split(".")[0]
        student = shown_name(student) or "?"
        if entry.is_symlink():  # never followed: it could point at the lesson (the answers) or anywhere
            subs.append({"student": student, "path": None, "flags": ["symlink"],
                         "detail": "a symbolic link, not a file: not graded (hand in the notebook itself)"})
        elif entry.is_file():
            flags = [] if entry.suffix == ".ipynb" else ["renamed"]
            subs.append({"student": student, "path": entry, "flags": flags,
                         "detail": "" if not flags else f"file {shown_name(entry.name)!r} is not named .ipynb"})
        elif entry.is_dir():
            files, links = _folder_files(entry, skip)
            notebooks = [p for p in files if p.suffix == ".ipynb"]
            exact = [p for p in notebooks if p.name == f"{lab_name}.ipynb"]
            chosen, flags, details = None, [], []
            if exact:
                chosen = exact[0]
            elif notebooks or files:
                candidates = notebooks or files
                chosen = candidates[0]
                flags.append("renamed")
                details.append(f"expected {lab_name}.ipynb, graded {shown_name(str(chosen.relative_to(entry)))}"
                               + (f" (first of {len(candidates)})" if len(candidates) > 1 else ""))
                if len(candidates) > 1:
                    flags.append("several-notebooks")
            else:
                flags.append("no-notebook")
                details.append("no notebook in the folder")
            if links:
                flags.append("symlink")
                details.append(f"{len(links)} symbolic link(s) in the folder ignored")
            subs.append({"student": shown_name(entry.name) or "?", "path": chosen, "flags": flags,
                         "detail": "; ".join(details), "folder": True})
        else:
            subs.append({"student": student, "path": None, "flags": ["not-a-file"],
                         "detail": "not a regular file or folder: not graded"})
        subs[-1]["entry"] = shown_name(entry.name) + ("/" if subs[-1].pop("folder", False) else "")
    _tell_apart(subs)
    return subs


def _tell_apart(subs: list[dict]) -> None:
    """Two entries that give one student name (``dup.ipynb`` beside ``dup/``, or two names that differ only in bytes
    shown as U+FFFD) get names of their own, the entry's in brackets, and the flag ``same-name``: marks typed for one
    row never go to the other."""
    by_name: dict[str, list[dict]] = {}
    for s in subs:
        by_name.setdefault(s["student"].casefold(), []).append(s)
    for group in by_name.values():
        if len(group) < 2:
            continue
        shown = group[0]["student"]
        for s in group:
            s["student"] = f"{s['student']} ({s['entry']})"
            s["flags"].append("same-name")
            s["detail"] = "; ".join(filter(None, [s["detail"], f"{len(group)} entries give the name {shown!r}: "
                                                                "told apart by the entry"]))
    seen: set[str] = set()
    for s in subs:   # a name told apart may meet another entry's own name: number what is left
        base, k = s["student"], 1
        while s["student"].casefold() in seen:
            k += 1
            s["student"] = f"{base} #{k}"
        seen.add(s["student"].casefold())


def _folder_files(folder: Path, skip: set) -> tuple[list[Path], list[Path]]:
    """(regular files, symbolic links) under a student's folder, hidden ones skipped, links not followed."""
    files, links = [], []
    for root, dirs, names in os.walk(folder):
        for d in [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            links.append(Path(root, d))
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in skip
                         and not os.path.islink(os.path.join(root, d)))
        for name in names:
            path = Path(root, name)
            if name.startswith("."):
                continue
            if path.is_symlink():
                links.append(path)
            elif path.is_file():
                files.append(path)
    return sorted(files), links


def load(path: Path):
    """(notebook, None) or (None, reason) for a file that is not a readable v4 notebook."""
    try:
        size = path.stat().st_size
        if size > MAX_SUBMISSION_BYTES:
            return None, f"{size / 2**20:.0f} MB, over the {MAX_SUBMISSION_BYTES // 2**20} MB a lab can be"
        data = path.read_bytes()
        data.decode("utf-8")
        if (cells := data.count(b'"cell_type"')) > MAX_CELLS:   # counted before anything is parsed
            return None, f"{cells} cells, over the {MAX_CELLS} a lab can have"
        raw = parse_untrusted_json(data)
    except UnicodeDecodeError:
        return None, "not a text file"
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg}, line {e.lineno})"
    except ValueError as e:
        return None, f"not readable ({e})"
    except OSError as e:
        return None, f"unreadable ({e.strerror})"
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        return None, "JSON, but not a notebook (no 'cells' list)"
    if raw.get("nbformat") != 4:
        return None, f"notebook format {raw.get('nbformat')!r}; version 4 expected"
    try:
        return nbformat.reads(json.dumps(raw), as_version=4), None
    except Exception as e:  # nbformat's own reader refuses it
        return None, f"not a readable notebook ({type(e).__name__}: {str(e)[:200]})"


def png_problem(raw: bytes) -> str | None:
    """Why these bytes are not a PNG the grader copies into a feedback folder, or None: a PNG's signature and
    header chunk, at most :data:`MAX_FIGURE_BYTES` bytes and :data:`MAX_FIGURE_PIXELS` pixels (what its header
    declares: a decompression bomb declares billions)."""
    if len(raw) > MAX_FIGURE_BYTES:
        return f"over {MAX_FIGURE_BYTES >> 20} MB"
    if not raw.startswith(PNG_MAGIC) or raw[12:16] != b"IHDR" or len(raw) < 24:
        return "not a PNG"
    width, height = int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")
    if not 0 < width * height <= MAX_FIGURE_PIXELS:
        return f"{width} x {height} pixels"
    return None


def figures(nb) -> tuple[list[bytes], list[str]]:
    """(the PNG figures of a notebook's outputs that pass :func:`png_problem`, at most :data:`MAX_FIGURES` and
    :data:`MAX_FIGURES_BYTES` in all; what was left out and why, one line per reason)."""
    import base64
    kept, left, total = [], {}, 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {}) if isinstance(out, dict) else {}
            png = data.get("image/png") if isinstance(data, dict) else None
            if not png:
                continue
            if not isinstance(png, str) or len(png) > MAX_FIGURE_BYTES * 4 // 3 + 8:
                why = f"over {MAX_FIGURE_BYTES >> 20} MB"
            else:
                try:
                    raw = base64.b64decode(png)
                    why = png_problem(raw)
                except (ValueError, TypeError):
                    why = "not base64"
            if why is None and (len(kept) >= MAX_FIGURES or total + len(raw) > MAX_FIGURES_BYTES):
                why = f"over {MAX_FIGURES} figures or {MAX_FIGURES_BYTES >> 20} MB in all"
            if why is None:
                kept.append(raw)
                total += len(raw)
            else:
                left[why] = left.get(why, 0) + 1
    return kept, [f"{n} figure(s) not shown: {why}" for why, n in left.items()]


def safe_name(student: str) -> str:
    """A file name for a student's feedback and scratch: letters of any script, digits, ``_.-``, at most
    :data:`MAX_SAFE_BYTES` bytes of UTF-8 (a name of 100 CJK characters is 300 bytes: too long for a file system)."""
    name = re.sub(r"[^\w.-]+", "_", shown_name(student))
    name = name.encode("utf-8")[:MAX_SAFE_BYTES].decode("utf-8", "ignore").strip(".")
    while name.lower().endswith(".md"):   # alice.md.md would name a figures folder feedback/alice.md/: alice's file
        name = name[: -len(".md")].strip(".")
    return name or "student"


def unique_safe_names(subs: list[dict]) -> None:
    """Give each submission its own ``safe`` name (``-2``, ``-3`` ... on a clash, case ignored)."""
    taken = set()
    for sub in subs:
        base = name = safe_name(sub["student"])
        k = 1
        while name.casefold() in taken:
            k += 1
            name = f"{base}-{k}"
        taken.add(name.casefold())
        sub["safe"] = name
