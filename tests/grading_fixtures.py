"""Student submissions of lab 01, made from the lab and the lesson, for the grader's tests and benchmark.

    python -m tests.grading_fixtures DIR                # the eleven fixture submissions
    python -m tests.grading_fixtures DIR --count 30     # 30 submissions for the benchmark (`make bench-grade`)

Each kind is one way a submission comes back (EXPECTED in tests/fixtures/grades_01.csv):

correct       all three answers right, executed: the lesson's records and figures; every written
              question answered (WRITTEN_ANSWER, with markup that written.md shows as text)
partial       the mask right; collate pads with 0 whatever the pad id (passes the visible check,
              fails the hidden test); the loss without the shift (fails)
stub          the lab handed back untouched
tampered      right answers; the collate check edited to print "ok", the loss check deleted
loop          collate loops forever (interrupted at the cell time limit); the loss swallows the
              interrupt and never ends (its check is killed at the cell limit, failed, the rest re-run)
invalid       a truncated file: not JSON
renamed       right answers, in a folder, under the name the download gave it
syntax        a syntax error in the mask answer
crash         collate kills the grading run (its check is failed, the rest re-run)
missing       the mask answer cell and its check deleted
wrong         lab 06 handed in for lab 01
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import socket
import threading
from pathlib import Path

import nbformat

from utils.constants import NOTEBOOKS_DIR
from utils.course import cells, labs

LESSON = NOTEBOOKS_DIR / "01_sft_from_scratch.ipynb"
NAME = LESSON.stem

PARTIAL_COLLATE = '''def collate(examples, pad_token_id):
    T = max(len(e["input_ids"]) for e in examples)
    return {"input_ids": torch.tensor([e["input_ids"] + [0] * (T - len(e["input_ids"])) for e in examples]),
            "labels": torch.tensor([e["labels"] + [-100] * (T - len(e["labels"])) for e in examples]),
            "attention_mask": torch.tensor([[1] * len(e["input_ids"]) + [0] * (T - len(e["input_ids"])) for e in examples])}
'''
PARTIAL_LOSS = '''def causal_lm_loss(logits, labels):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)
'''
LOOP_COLLATE = '''def collate(examples, pad_token_id):
    while True:
        pass
'''
STUCK_LOSS = '''import time
def causal_lm_loss(logits, labels):
    while True:      # swallows the interrupt: only killing the run stops it
        try:
            time.sleep(0.2)
        except KeyboardInterrupt:
            pass
'''
SYNTAX_MASK = '''IGNORE_INDEX = -100
def build_sft_example(tokenizer, messages, max_length)
    return {}
'''
CRASH_COLLATE = '''import os
def collate(examples, pad_token_id):
    os._exit(1)      # the run dies inside the check that calls it
'''
WRITTEN_ANSWER = "The loss fell <b>because</b> [the mask](http://example.com) keeps `only` the answer.\n# Not a heading"
KINDS = ("correct", "partial", "stub", "tampered", "loop", "invalid", "renamed", "syntax", "crash", "missing", "wrong")
STUDENTS = {"correct": "alice", "partial": "bob", "stub": "carol", "tampered": "dave", "loop": "erin",
            "invalid": "frank", "renamed": "grace", "syntax": "heidi", "crash": "ivan", "missing": "judy",
            "wrong": "kim"}


def _cell(nb, gid):
    return next(c for c in nb.cells if cells.grade_id(c) == gid)


def solved_lab(executed: bool):
    """The lab with the lesson's answers in it (and, with ``executed``, the lesson's outputs)."""
    lesson = nbformat.read(LESSON, as_version=4)
    lab = labs.lab_for(LESSON)
    by_id = {c.get("id"): c for c in lesson.cells}
    for cell in lab.cells:
        ref = by_id.get(cell.get("id"))
        if ref is None:
            continue
        if cells.is_answer(cell):
            cell.source = ref.source
        elif cells.is_written(cell):   # markup and a link: written.md must show it as text
            cell.source = WRITTEN_ANSWER
        if executed and cell.cell_type == "code":
            cell.outputs = copy.deepcopy(ref.outputs)
            cell.execution_count = ref.execution_count
    return lab


def submission(kind: str):
    """(relative path, text) of one submission of the given kind."""
    student = STUDENTS[kind]
    nb = solved_lab(executed=kind in ("correct", "tampered", "partial"))
    if kind == "stub":
        nb = labs.lab_for(LESSON)
    elif kind == "partial":
        _cell(nb, "01-collate-answer").source = PARTIAL_COLLATE
        _cell(nb, "01-causal-loss-answer").source = PARTIAL_LOSS
    elif kind == "tampered":
        _cell(nb, "01-collate").source = 'print("ok")'
        nb.cells.remove(_cell(nb, "01-causal-loss"))
    elif kind == "loop":
        _cell(nb, "01-collate-answer").source = LOOP_COLLATE
        _cell(nb, "01-causal-loss-answer").source = STUCK_LOSS
    elif kind == "syntax":
        _cell(nb, "01-sft-mask-answer").source = SYNTAX_MASK
    elif kind == "crash":
        _cell(nb, "01-collate-answer").source = CRASH_COLLATE
    elif kind == "wrong":
        nb = labs.lab_for(NOTEBOOKS_DIR / "06_quantization.ipynb")
    elif kind == "missing":
        nb.cells.remove(_cell(nb, "01-sft-mask-answer"))
        nb.cells.remove(_cell(nb, "01-sft-mask"))
    text = nbformat.writes(nb)
    if kind == "invalid":
        return f"{student}.ipynb", text[: len(text) // 2]
    if kind == "renamed":
        return f"{student}/{NAME} (1).ipynb", text
    return f"{student}.ipynb", text


@contextlib.contextmanager
def loopback_listener():
    """A TCP listener of the instructor's on 127.0.0.1 that records every connection: ``(port, connections)``."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    connections, stop = [], threading.Event()

    def listen():
        while not stop.is_set():
            try:
                connections.append(server.accept())
            except OSError:
                pass
    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], connections
    finally:
        stop.set()
        thread.join()
        server.close()


def write(folder, kinds=KINDS) -> list[Path]:
    """Write one submission per kind into ``folder``; returns the paths."""
    folder = Path(folder)
    paths = []
    for kind in kinds:
        rel, text = submission(kind)
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def write_many(folder, count: int) -> list[Path]:
    """``count`` submissions for the benchmark: a class where most work came back whole.

    Per ten students: four correct, two partial, one stub, one tampered, one syntax error, one
    invalid file; and once in the batch each of the loop, crash, renamed and missing kinds.
    """
    folder = Path(folder)
    cycle = ["correct", "partial", "correct", "stub", "correct", "tampered", "partial", "syntax", "correct", "invalid"]
    kinds = [cycle[i % len(cycle)] for i in range(count)]
    for j, rare in enumerate(("loop", "crash", "renamed", "missing")):
        if count > 4 * (j + 1):
            kinds[4 * j + 3] = rare
    paths = []
    for i, kind in enumerate(kinds):
        rel, text = submission(kind)
        rel = rel.replace(STUDENTS[kind], f"student{i + 1:02d}", 1)
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--count", type=int, default=0, help="benchmark set of this many (default: one of each kind)")
    args = parser.parse_args()
    made = write_many(args.folder, args.count) if args.count else write(args.folder)
    print(json.dumps({"folder": args.folder, "submissions": len(made)}))
