"""A lesson's headline: the two to four results it exists to show, each with its noise.

Every lesson ends its results cell by declaring them, as plain data, after its records::

    utils.headline("04", [
        {"name": "greedy accuracy", "values": {"SFT": "sft_accuracy", "GRPO": "grpo_accuracy"},
         "n": "n_test"},                                        # binomial SE over n_test problems
        {"name": "naive reward, hacked run", "unit": "reward",
         "values": {"before": "hack_naive_reward_before", "after": "hack_naive_reward_after"},
         "noise": "one run"},                                   # no standard error: say why
    ], tiny_target_s=180)

An entry names the records it reads (``values``: stage label -> record name, without the lesson
prefix, in the order shown) and how noisy they are, in exactly one of these ways:

* ``"n"``: a record name or a number of problems: the binomial standard error of a share
  (``unit`` "share", the default), with the Agresti–Coull adjustment (:func:`binomial_se`). For a
  share averaged over several samples per problem it is an upper bound (a per-problem mean in
  [0, 1] varies no more than a coin).
* ``"se"``: stage label -> the record holding that value's standard error.
* ``"noise"``: a few words saying why there is no standard error ("exact", "one timing").

``"seed_std"`` (stage label -> record of the spread over seeds) with ``"seeds"`` (the record of
the seed count) adds to ``"n"``'s error, for those stages, when two or more seeds ran: the seeds'
spread of the mean, sd / sqrt(seeds), and the problems' binomial error, in quadrature.
``"of"`` names what ``n`` counts ("problems" by default). ``"compare": False`` shows the stages side by
side without their change against the first (stages that are not a before and an after).

``"per_problem"`` (stage label -> the record of that stage's score on each of the ``n`` problems, in one order
for every stage: 1/0 for a greedy answer, the share of right samples for several) makes a change against the
first stage *paired*: two models scored on the same problems share each problem's difficulty, so the error of
their difference is that of the mean per-problem difference, about sd(b_i - a_i) / sqrt(n) (:func:`paired_se`),
not the two stages' errors added as if independent, which is several times larger when most problems are
right, or wrong, for both. It is the error over problems, not over samples, where a problem has several.

:func:`headline` records the declaration as ``"NN/headline"`` and prints the block below from the
records made so far; ``python -m utils run`` prints the same block for each lesson it ran, and the
grader's feedback shows it for a student's self-reported run. Pure Python (no torch, no numpy).
"""
from __future__ import annotations

import math

from .records import RECORDS, record, show_records

SHARE = "share"
NOISE_KINDS = ("n", "se", "noise")
ENTRY_KEYS = {"name", "values", "unit", "of", "seed_std", "seeds", "compare", "per_problem", *NOISE_KINDS}
MAX_PROBLEMS = 100_000   # a per-problem record longer than this is not read (a student's notebook: any JSON)
PAIRED = "changes paired over them"
FOOTNOTE = ("± is one standard error: binomial over the problems for a share (Agresti–Coull; an upper bound for a "
            "mean over several samples per problem), with the seeds' spread added where several ran. A change "
            f"marked '{PAIRED}' has the standard error of the mean per-problem difference (the same problems "
            "scored on both sides); any other change's ± treats its two sides as independent (conservative when "
            "the problems are the same). 'Within noise' means the change is under two of its standard errors.")


# ----------------------------------------------------------------------------- the declaration
def check(declaration) -> dict:
    """``declaration`` ({"results": [...], "tiny_target_s": ...}) with each entry's ``values`` as a list
    of [label, record] pairs (the order a dict gave them, which a notebook's sorted JSON would lose);
    ValueError saying which entry is wrong and how when it is malformed."""
    if not isinstance(declaration, dict) or not isinstance(declaration.get("results"), list):
        raise ValueError("a headline is {'results': [entry, ...], 'tiny_target_s': seconds or None}")
    target = declaration.get("tiny_target_s")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not 0 < target < math.inf):
        raise ValueError(f"headline: tiny_target_s must be a positive number of seconds or None, got {target!r}")
    entries = list(declaration["results"])
    if not 1 <= len(entries) <= 4:
        raise ValueError(f"headline: declare the one to four results the lesson exists to show, not {len(entries)}")
    for i, e in enumerate(entries):
        where = f"headline entry {i}" + (f" ({e.get('name')!r})" if isinstance(e, dict) else "")
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"]:
            raise ValueError(f"{where}: needs a 'name' (str)")
        unknown = set(e) - ENTRY_KEYS
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}")
        values = e.get("values")
        if isinstance(values, dict):   # kept in order as [label, record] pairs: a notebook sorts JSON keys
            values = [[k, v] for k, v in values.items()]
        if not isinstance(values, list) or not values or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in values):
            raise ValueError(f"{where}: 'values' maps each stage label to a record name, e.g. "
                             "{'SFT': 'sft_accuracy', 'GRPO': 'grpo_accuracy'}")
        labels = [label for label, _ in values]
        if len(set(labels)) != len(labels):
            raise ValueError(f"{where}: stage labels repeat: {labels}")
        entries[i] = e = {**e, "values": [list(p) for p in values]}
        kinds = [k for k in NOISE_KINDS if k in e]
        if len(kinds) != 1:
            raise ValueError(f"{where}: say how noisy it is with exactly one of 'n' (binomial, a share), 'se' "
                             f"(a record per stage) or 'noise' (why there is none); got {kinds or 'none'}")
        unit = e.get("unit", SHARE)
        if not isinstance(unit, str):
            raise ValueError(f"{where}: 'unit' is a string such as 'share', 'MB' or 'tokens'")
        if "n" in e and (unit != SHARE or isinstance(e["n"], bool) or not isinstance(e["n"], (str, int))):
            raise ValueError(f"{where}: 'n' (a record name or a count) gives a binomial error, for a share only")
        for key in ("se", "seed_std"):
            if key in e and (not isinstance(e[key], dict) or set(e[key]) - set(labels)):
                raise ValueError(f"{where}: {key!r} maps stage labels of 'values' to record names")
        if "per_problem" in e and (not isinstance(e["per_problem"], dict) or set(e["per_problem"]) - set(labels)
                                   or not all(isinstance(v, str) for v in e["per_problem"].values())):
            raise ValueError(f"{where}: 'per_problem' maps stage labels of 'values' to the record of each "
                             "problem's score (one list per stage, the same problems in the same order)")
        if "per_problem" in e and "n" not in e:
            raise ValueError(f"{where}: 'per_problem' pairs shares over problems: it goes with 'n'")
        if ("seed_std" in e) != ("seeds" in e) or ("seed_std" in e and "n" not in e):
            raise ValueError(f"{where}: 'seed_std' goes with 'seeds' (the record of the seed count) and 'n' "
                             "(the binomial error used when one seed ran)")
        if not isinstance(e.get("compare", True), bool):
            raise ValueError(f"{where}: 'compare' is True (each stage against the first, the default) or False")
        if "noise" in e and not isinstance(e["noise"], str):
            raise ValueError(f"{where}: 'noise' is a few words saying why there is no standard error")
    return {"results": entries, "tiny_target_s": target}


def headline(lesson: str, results: list[dict], tiny_target_s: float | None = None) -> None:
    """Record lesson ``lesson``'s headline (``"NN/headline"``) and print it from the records made so far.

    ``results``: the entries described in the module docstring; ``tiny_target_s``: the wall time the
    lesson's ``tiny`` run is meant to stay within (its issue's target). Taught in every lesson's results cell.
    """
    declaration = check({"results": results, "tiny_target_s": tiny_target_s})
    record(f"{lesson}/headline", declaration, text=f"[record] {lesson}/headline ({len(results)} results, below)")
    show_records()
    print("\n".join(block(declaration, {k: v for k, v in RECORDS.items() if k.startswith(f"{lesson}/")})))


def declared(records: dict) -> dict | None:
    """The headline among ``records`` (the ``NN/headline`` record), checked; None when there is none or it
    is malformed (the records may come from a student's notebook)."""
    found = [v for k, v in records.items() if k.split("/", 1)[-1] == "headline"]
    try:
        return check(found[-1]) if found else None
    except ValueError:
        return None


# ----------------------------------------------------------------------------- reading it against records
def number_or_none(value):
    """A finite float, or None for anything else (a record may come from a student's notebook: any JSON,
    10**400 included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def binomial_se(p: float, n: float) -> float:
    """Standard error of a share ``p`` measured on ``n`` problems, with the Agresti–Coull adjustment
    (two successes and two failures added), so that 0/n and n/n are not shown as exact:
    sqrt(p~ (1 - p~) / (n + 4)) with p~ = (p n + 2) / (n + 4). For p = 0.2, n = 500: 0.0179 (Wald: 0.0179)."""
    adjusted = (p * n + 2) / (n + 4)
    return math.sqrt(adjusted * (1 - adjusted) / (n + 4))


def paired_se(a: list[float], b: list[float]) -> float:
    """Standard error of mean(b) - mean(a) for two scores of the same n >= 1 problems (``a[i]``, ``b[i]``: problem
    i's score under each side, in [0, 1]): the spread of the per-problem differences d_i = b_i - a_i, not the two
    sides' errors added, since a problem easy for one side is easy for the other. With Agresti and Min's (2005)
    adjustment, half a problem added to each cell of the 2x2 table, so that a change on which every problem agrees
    is not shown as exact (as :func:`binomial_se` does for a share): sqrt((sum d_i^2 + 1) - (sum d_i)^2 / (n + 2))
    / (n + 2). For 1/0 scores, with c problems right only under b and e only under a, that is their "Wald+2"
    error, sqrt((c + e + 1) - (c - e)^2 / (n + 2)) / (n + 2) (McNemar's setting). ``a = [1, 0, 1, 1]``,
    ``b = [1, 1, 1, 0]``: sqrt(3) / 6 = 0.289; 200 problems all going from 0 to 1: 0.0086."""
    n = len(a)
    if n != len(b) or n < 1:
        raise ValueError(f"paired_se needs two scores of the same n >= 1 problems, got {len(a)} and {len(b)}")
    diffs = [y - x for x, y in zip(a, b)]
    return math.sqrt(max(0.0, sum(d * d for d in diffs) + 1 - sum(diffs) ** 2 / (n + 2))) / (n + 2)


def clustered_se(hits: list[float], counts: list[float]) -> float:
    """Standard error of a share pooled over K >= 2 problems that each contribute several items (steps, samples):
    problem k has ``counts[k]`` items of which ``hits[k]`` count. Items of one problem are not independent (an easy
    problem's steps are all right), so the error is over problems, not items: with p = sum(hits) / sum(counts),
    sqrt(K / (K - 1) * sum((hits_k - p counts_k)^2)) / sum(counts) (the cluster-robust error of a ratio). Each
    problem contributing one item gives the Wald error with n - 1. ``hits = [3, 0]``, ``counts = [3, 1]``: 0.375."""
    K = len(hits)
    if K != len(counts) or K < 2 or sum(counts) <= 0:
        raise ValueError(f"clustered_se needs K >= 2 problems with items: {len(hits)} hits, {len(counts)} counts")
    p = sum(hits) / sum(counts)
    return math.sqrt(K / (K - 1) * sum((h - p * m) ** 2 for h, m in zip(hits, counts))) / sum(counts)


def scores_or_none(value, n: float | None) -> list[float] | None:
    """``value`` as a list of per-problem scores (shares: numbers in [0, 1], as many as ``n`` when it is known),
    or None (a record may come from a student's notebook: any JSON)."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_PROBLEMS or (n and len(value) != n):
        return None
    out = [number_or_none(x) for x in value]
    return None if any(x is None or not 0 <= x <= 1 for x in out) else out


def rows(declaration: dict, records: dict) -> list[dict]:
    """Each entry of ``declaration`` evaluated on ``records`` (full keys "NN/name" or bare names):
    ``{"name", "unit", "noise", "stages": [{"label", "value", "se", "per_problem"}, ...]}`` (with
    ``"seeds_var"``, the seeds' share of a stage's variance, when several seeds ran); a value or error that was
    not recorded is None, as are per-problem scores that were not, or that do not fit ``n``."""
    flat = {k.split("/", 1)[-1]: v for k, v in records.items()}
    out = []
    for e in check(declaration)["results"]:
        unit = e.get("unit", SHARE)
        values = {label: number_or_none(flat.get(key)) for label, key in e["values"]}
        ses: dict = {label: None for label in values}
        seeds_var: dict = {label: 0.0 for label in values}
        scores: dict = {label: None for label in values}
        if "n" in e:
            n = number_or_none(e["n"] if isinstance(e["n"], int) else flat.get(e["n"]))
            what = e.get("of", "problems")
            n = n if n and n >= 1 else None
            noise = f"SE over {n:g} {what}" if n else f"SE: the number of {what} was not recorded"
            ses = {label: binomial_se(v, n) if n and v is not None and 0 <= v <= 1 else None
                   for label, v in values.items()}
            seeds = number_or_none(flat.get(e["seeds"])) if "seeds" in e else None
            spread = {label: number_or_none(flat.get(key)) for label, key in e.get("seed_std", {}).items()}
            if n and seeds and seeds >= 2 and spread and None not in spread.values():
                # a mean over seeds, each measured on the same problems: the seeds' spread of that mean,
                # plus the problems' own sampling noise (which more seeds do not average away)
                ses.update({label: math.sqrt(spread[label] ** 2 / seeds + ses[label] ** 2)
                            if ses[label] is not None else None for label in spread})
                seeds_var.update({label: spread[label] ** 2 / seeds for label in spread})
                noise = f"SE over {seeds:g} seeds and {n:g} {what}"
            scores.update({label: scores_or_none(flat.get(key), n) for label, key in e.get("per_problem", {}).items()})
            if len(values) > 1 and all(scores[label] is not None for label in values):
                noise += f"; {PAIRED}"
        elif "se" in e:
            ses.update({label: number_or_none(flat.get(key)) for label, key in e["se"].items()})
            noise = "SE" + (f" over {e['of']}" if "of" in e else "")
        else:
            noise = e["noise"]
        ses = {label: se if se is not None and se >= 0 else None for label, se in ses.items()}
        out.append({"name": e["name"], "unit": unit, "noise": noise, "compare": e.get("compare", True),
                    "stages": [{"label": label, "value": values[label], "se": ses[label], "per_problem": scores[label],
                                "seeds_var": seeds_var[label]} for label in values]})
    return out


def difference(row: dict, i: int) -> dict | None:
    """Stage ``i`` against the first stage of ``row``: ``{"delta", "se", "ratio", "within_noise", "paired"}``
    (``delta`` in points for a share), or None when a value is missing. Paired (:func:`paired_se`) when both
    stages have per-problem scores, plus the seeds' spread of each side where several seeds ran; else the two
    stages' errors in quadrature."""
    a, b = row["stages"][0], row["stages"][i]
    if a["value"] is None or b["value"] is None:
        return None
    scale = 100.0 if row["unit"] == SHARE else 1.0
    delta = scale * (b["value"] - a["value"])
    paired = a.get("per_problem") is not None and b.get("per_problem") is not None
    if paired:
        se = scale * math.sqrt(paired_se(a["per_problem"], b["per_problem"]) ** 2
                               + a.get("seeds_var", 0.0) + b.get("seeds_var", 0.0))
    else:
        se = scale * math.hypot(a["se"], b["se"]) if a["se"] is not None and b["se"] is not None else None
    ratio = b["value"] / a["value"] if row["unit"] != SHARE and a["value"] > 0 and b["value"] >= 0 else None
    return {"delta": delta, "se": se, "ratio": ratio, "paired": paired,
            "within_noise": se is not None and abs(delta) < 2 * se}


# ----------------------------------------------------------------------------- the printed block
def number(value, unit: str = SHARE) -> str:
    """A value as the block shows it: a share with 3 decimals, anything else to about 3 significant digits."""
    if value is None:
        return "not recorded"
    if unit == SHARE:
        return f"{value:.3f}"
    size = abs(value)
    if size >= 100 or value == int(value) and size >= 10:
        return f"{value:,.0f}"
    return f"{value:.1f}" if size >= 10 else f"{value:.2f}" if size >= 1 else f"{value:.3g}"


def _value(stage: dict, unit: str) -> str:
    text = number(stage["value"], unit)
    return text if stage["se"] is None or stage["value"] is None else f"{text} ± {number(stage['se'], unit)}"


def _change(row: dict, i: int, vs: str = "") -> str:
    """Stage ``i`` against the first: '+14.0 ± 2.1 pts' (a share), '×2.86' (anything else), '' if missing."""
    d = difference(row, i) if row.get("compare", True) else None
    if d is None:
        return ""
    if row["unit"] != SHARE:
        text = f"×{d['ratio']:.3g}" if d["ratio"] is not None else f"{d['delta']:+,.3g} {row['unit']}"
    else:
        text = f"{d['delta']:+.1f}" + (f" ± {d['se']:.1f}" if d["se"] is not None else "") + " pts"
    return text + (f" vs {vs}" if vs else "") + (", within noise" if d["within_noise"] else "")


def block(declaration: dict, records: dict, indent: str = "  ") -> list[str]:
    """The headline's lines, e.g. ``accuracy, SFT → GRPO   0.062 ± 0.011 → 0.202 ± 0.018   +14.0 ± 2.1 pts``.

    Two stages make one line (before → after, the change); more stages make a line each under the
    entry's name, each compared with the first. The noise of each entry ends its line(s)."""
    lines = []
    evaluated = rows(declaration, records)
    pairs = [r for r in evaluated if len(r["stages"]) <= 2]
    width = max((len(_title(r)) for r in pairs), default=0)
    for r in evaluated:
        unit = "" if r["unit"] == SHARE else f" {r['unit']}"
        if len(r["stages"]) == 1:
            lines.append(f"{indent}{_title(r):<{width}}   {_value(r['stages'][0], r['unit'])}{unit}   [{r['noise']}]")
        elif len(r["stages"]) == 2:
            a, b = (_value(s, r["unit"]) for s in r["stages"])
            change = f"   {_change(r, 1)}" if _change(r, 1) else ""
            lines.append(f"{indent}{_title(r):<{width}}   {a} → {b}{unit}{change}   [{r['noise']}]")
        else:
            lines.append(f"{indent}{r['name']}{' (' + r['unit'] + ')' if unit else ''}   [{r['noise']}]")
            label_w = max(len(s["label"]) for s in r["stages"])
            first = r["stages"][0]["label"]
            for i, s in enumerate(r["stages"]):
                change = f"   {_change(r, i, first)}" if i and _change(r, i) else ""
                lines.append(f"{indent}    {s['label']:<{label_w}}  {_value(s, r['unit'])}{change}")
    return [line.rstrip() for line in lines]


def _title(row: dict) -> str:
    labels = [s["label"] for s in row["stages"]]
    return f"{row['name']}, {' → '.join(labels)}" if len(labels) == 2 else f"{row['name']} ({labels[0]})"
