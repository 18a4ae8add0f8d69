"""A student's feedback file (``feedback/<student>.md``): the graded checks, notes, written marks and their run.

Everything a submission supplies (messages, record keys and values, file names) is text from a stranger: it is
escaped before it reaches the page. Written by :func:`utils.course.grade.grade_one` for every submission.
"""
from __future__ import annotations

import html
import json

from .. import headlines
from ..constants import CHECK_MESSAGE_CHARS, META_KEYS
from . import written
from .grading import one_line
from .lessons import meta_of


def _md_cell(text: str) -> str:
    """Text a student wrote as one markdown table cell: at most 200 characters, HTML escaped (no ``</details>``
    or ``<!--`` can end the page's structure), no ``|``, backtick or line break of its own."""
    return _md_text(text, 200)


def _md_text(text, limit: int = 600) -> str:
    """Text from a submission (a message its code raised, a name, a record) as one line of markdown that shows as
    what it says: HTML's ``& < >`` escaped, no line break (so no heading, list item or second score line of its
    own), no ``|``, backtick, ``*`` or ``](`` (no table cell, code span, emphasis, link or image), cut to ``limit``
    characters before it is escaped (:func:`grading.one_line`: a longer one ends in "…")."""
    text = html.escape(one_line(text, limit), quote=False)
    for ch, entity in (("|", "&#124;"), ("`", "&#96;"), ("*", "&#42;"), ("](", "]&#40;"), ("://", ":&#47;&#47;"),
                       ("www.", "www&#46;")):   # no link, and no address a viewer turns into one
        text = text.replace(ch, entity)
    return text


def _shown(value) -> str:
    """A self-reported record's value as a markdown table cell (any JSON a notebook holds)."""
    return _md_cell(f"{value:.4g}" if isinstance(value, float) else json.dumps(value)[:200])


def feedback_markdown(student: str, lab_name: str, sub: dict, result: dict, fig_dir: str,
                      headline: dict | None = None, asked: list[dict] | None = None, manual: dict | None = None
                      ) -> str:
    """The student's feedback; ``headline``: the lesson's declared headline (``utils.headlines``); ``asked`` and
    ``manual`` (:func:`written.manual_row`): the written questions and the instructor's marks typed so far."""
    checks = result.get("checks", {})
    total, maximum = sum(c["points"] for c in checks.values()), sum(c["max_points"] for c in checks.values())
    manual, points = manual or {}, {q["grade_id"]: q["points"] for q in asked or []}
    if result.get("written") and manual.get("manual_points") not in (None, ""):
        marked = (f" for the graded checks, **{manual['manual_points']} / {manual['manual_max']}** for the written "
                  f"questions: {total + manual['manual_points']:g} / {maximum + manual['manual_max']:g} in all")
    elif result.get("written"):
        marked = " for the graded checks; the written questions are marked by your instructor"
    else:
        marked = ""
    lines = [f"# {lab_name}: feedback for {_md_text(student)}", "",
             f"Submission: {_md_text(sub.get('file') or '-')}  ", f"**Score: {total} / {maximum}**{marked}", ""]
    if result.get("invalid-notebook"):
        lines += [f"**This file could not be graded:** {_md_text(result['invalid-notebook'])}. Open it in Jupyter "
                  "to check it, and hand in the .ipynb file that Jupyter saves.", ""]
    if checks:
        lines += ["## Graded checks", "",
                  "Re-run by the grader on the tiny model (CPU), with your answer cells and the instructor's checks "
                  "(hidden tests included).", "", "| check | points | result |", "|---|---|---|"]
        for gid, c in checks.items():
            verdict = "passed" if c["passed"] else "failed: " + _md_text(c["message"], CHECK_MESSAGE_CHARS)
            lines.append(f"| {gid} | {c['points']} / {c['max_points']} | {verdict} |")
        lines.append("")
    issues = [f"- {i['grade_id']}: {_md_text(i['detail'])}" for i in result.get("integrity", [])]
    if sub.get("detail"):
        issues.append(f"- {_md_text(sub['detail'])}")
    issues += [f"- answer cell {e['grade_id']} raised {_md_text(e['error'])}" for e in result.get("answer_errors", [])]
    issues += [f"- answer cell {s['grade_id']}: the grader runs only its definitions (imports, `def`, `class`, "
               f"assignments to names); the statements at line(s) {', '.join(map(str, s['lines']))} were not run"
               for s in result.get("skipped", []) if s.get("lines")]
    if result.get("status") == "touched":
        issues.append(f"- **no check counted:** {_md_text(result.get('detail', ''))}")
    issues += [f"- {_md_text(n)}" for n in result.get("notes", [])]
    if result.get("wrong-lab"):
        issues.append(f"- this notebook is the lab {_md_text(repr(result['wrong-lab']))}, not {lab_name!r}")
    if result.get("setup_errors"):
        issues += [f"- the grader's setup cell {e['cell']} raised {_md_text(e['error'])}"
                   for e in result["setup_errors"]]
    if issues:
        lines += ["## Notes", "", *issues, ""]
    if result.get("written"):
        lines += ["## Written questions", "", "Marked by your instructor, not by the grader.", ""]
        for gid, a in result["written"].items():
            status = {"answered": "answered", "not-answered": "not answered (the cell still says YOUR ANSWER HERE)",
                      "missing": "not answered (the cell is missing)"}[a["status"]]
            mark = written.number(manual.get(gid, ""), points.get(gid, 0)) if gid in points else None
            lines.append(f"- {gid}: {status}" + (f"; **{mark:g} / {points[gid]}**" if mark is not None else
                                                  "; not marked yet" if gid in points else ""))
        lines.append("")
    records, figures = result.get("records", {}), result.get("figures", 0)
    lines += ["## Your run (self-reported, not re-run by the grader)", ""]
    meta = meta_of(records)
    lines.append("Ran with " + ", ".join(f"{k} {_md_text(v if v is not None else 'unknown', 100)}"
                                         for k, v in meta.items()) + ".")
    lines.append("")
    failed = next((v for k, v in records.items() if k.split("/", 1)[-1] == "results_failed"), None)
    if isinstance(failed, list) and failed:   # %%results: the statements of the results cell that did not run
        lines += [f"Your results cell could not compute {len(failed)} statement(s), so their records are missing "
                  "(a section that did not run, or an exercise not done):", ""]
        lines += [f"- {_md_text(f, 300)}" for f in failed[:20]] + [""]
    metrics = {k: v for k, v in records.items()
               if k.split("/", 1)[-1] not in (*META_KEYS, "headline", "results_failed")}
    if metrics and headline:   # the course's declaration (never the student's), read against their records
        try:
            block = headlines.block(headline, records)
        except Exception as e:  # noqa: BLE001 -- a student's records must never cost them the feedback
            block = [f"(could not be read from your records: {type(e).__name__})"]
        lines += ["What the lesson exists to show, from your records (`make run` prints the same block):", "",
                  "```", *(line.replace("`", "'") for line in block), "```", "", headlines.FOOTNOTE, ""]
    if metrics:
        lines += ["<details><summary>Every record of your run</summary>", "", "| record | value |", "|---|---|"]
        lines += [f"| {_md_cell(k)} | {_shown(v)} |" for k, v in metrics.items()]
        lines += ["", "</details>", ""]
    for problem in result.get("result_problems", []):
        lines.append(f"- {_md_text(problem)}")
    if figures:
        lines += ["", f"{figures} figure(s) from your notebook:", ""]
        lines += [f"![figure {i + 1}]({fig_dir}/figure-{i + 1}.png)" for i in range(figures)]
    return "\n".join(lines).rstrip() + "\n"
