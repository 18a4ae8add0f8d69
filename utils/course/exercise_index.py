"""What each exercise is checked against, read from the code (the "checked against" column of docs/exercises.md).

An exercise's function is checked against a library when the code that checks it *calls* that library:

- its graded check, hidden tests included, with the lesson's ``grader-setup`` cells it uses (a check that calls
  ``prepared(...)``, a setup cell's function that builds an ``SFTTrainer``, is checked against TRL); names resolve
  through the imports of the lesson's setup and answer cells;
- every test function of ``tests/`` that refers to the function's reference answer (``utils.solutions.lessonNN``),
  with what it uses of its own file: its fixtures, helpers, classes and module-level names, followed to their end;
- a side script such as ``tests/verl/check_core_algos.py`` that such a test runs (named by a ``"*.py"`` string it
  uses): the verl objects behind the output keys the test reads in a statement that involves the function
  (``close(group_advantages(...), verl["grpo"])`` reads ``out["grpo"]``, ``compute_grpo_outcome_advantage``'s).

The libraries are :data:`LIBRARIES`. Of PyTorch only its losses count (``F.cross_entropy`` as a causal-LM loss's
reference); torch's other functions are what answers are written with. Objects that only build an input (a model or
tokenizer loaded, a configuration, a dataset, a data or state container: :data:`INPUTS`) are not references. A
library object that is merely named (patched away by a hidden test, as ``get_soft_overlong_punishment`` in lesson 05)
is not called, so it does not count. Where nothing is found the check and tests compare with values of their own
(:data:`NO_LIBRARY`).
"""
from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

from ..constants import REPO_ROOT, SETUP_TAG
from . import cells

# module prefix -> how the column names the library, and the prefix its objects are shown with (longest first)
LIBRARIES = {"torch.nn.functional": ("PyTorch", "F."), "torch.nn": ("PyTorch", "nn."),
             "transformers": ("transformers", ""), "bitsandbytes": ("bitsandbytes", ""), "peft": ("PEFT", ""),
             "trl": ("TRL", ""), "verl": ("verl", "")}
ORDER = ("TRL", "PEFT", "bitsandbytes", "transformers", "verl", "PyTorch")
TORCH_LOSS = re.compile(r"cross_entropy|_loss$|^kl_div$|Loss$")
INPUTS = re.compile(r"^Auto[A-Z]|Config$|Arguments$|Tokenizer|[Dd]ataset|State$|Proto$|^Trainer$")
NO_LIBRARY = "its own expected values (no library)"
SOLUTIONS = "utils.solutions.lesson"
MAX_OBJECTS = 3
_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Assert, ast.Return)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _parse(source: str) -> ast.Module:
    """``source`` parsed; a notebook cell's IPython lines (``%magic``, ``!shell``) are left out."""
    try:
        return ast.parse(source)
    except SyntaxError:
        return ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n")))


def library_object(dotted: str) -> tuple[str, str] | None:
    """``("TRL", "DPOTrainer")`` for ``"trl.DPOTrainer"`` (or ``"trl.DPOTrainer.compute_loss"``), ``("PyTorch",
    "F.cross_entropy")`` for ``"torch.nn.functional.cross_entropy"``; None for anything that is not a reference: another
    module, an input (:data:`INPUTS`), torch other than a loss. The object is the first capitalised part of the path
    after the library's prefix (a class), else its last part (a function)."""
    prefix = next((p for p in LIBRARIES if dotted.startswith(p + ".")), None)
    if prefix is None:
        return None
    label, shown = LIBRARIES[prefix]
    parts = dotted[len(prefix) + 1:].split(".")
    name = next((p for p in parts if p[:1].isupper()), parts[-1])
    if INPUTS.search(name) or (label == "PyTorch" and not TORCH_LOSS.search(name)):
        return None
    return label, shown + name


def bindings(trees) -> dict[str, str]:
    """``{local name: dotted path}`` of every import in ``trees`` (inside functions too; relative imports left out)."""
    out = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return out


def dotted(node, names: dict[str, str]) -> str | None:
    """The dotted path a ``Name``/``Attribute`` chain stands for through the imports ``names``; None otherwise."""
    if isinstance(node, ast.Attribute):
        base = dotted(node.value, names)
        return f"{base}.{node.attr}" if base else None
    return names.get(node.id) if isinstance(node, ast.Name) else None


def _loads(node) -> set[str]:
    """The names ``node`` reads (a function's parameters count: they are its pytest fixtures)."""
    found = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if isinstance(node, _DEFS):
        found |= {a.arg for a in node.args.args + node.args.kwonlyargs}
    return found


def _outer(node) -> set[str]:
    """The names ``node`` reads from outside itself: those it never assigns (a check's own ``batch`` is not a setup
    cell's ``batch``; a test's parameters are its fixtures)."""
    stored = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    stored |= {n.name for n in ast.walk(node) if isinstance(n, (*_DEFS, ast.ClassDef)) and n is not node}
    return _loads(node) - stored


class Scope:
    """A file (or a lesson's setup cells) as the checks and tests see it: its imports and its top-level definitions."""

    def __init__(self, trees, names: dict[str, str] | None = None):
        self.names = names if names is not None else bindings(trees)
        self.defs: dict[str, list] = {}
        for tree in trees:
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.defs.setdefault(node.name, []).append(node)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                        for n in ast.walk(target):
                            if isinstance(n, ast.Name):
                                self.defs.setdefault(n.id, []).append(node)
        self._closures: dict[int, tuple] = {}   # id(node) -> (node, its closure): the node kept, so is its id

    def closure(self, node) -> list:
        """``node`` and every top-level definition it uses, and those they use, to the end (each once)."""
        if self._closures.get(id(node), (None,))[0] is not node:
            seen, todo, out = {id(node)}, [node], []
            while todo:
                current = todo.pop()
                out.append(current)
                for name in sorted(_outer(current)):
                    for d in self.defs.get(name, []):
                        if id(d) not in seen:
                            seen.add(id(d))
                            todo.append(d)
            self._closures[id(node)] = (node, out)
        return self._closures[id(node)][1]

    def called(self, nodes, names: dict[str, str] | None = None) -> set[tuple[str, str]]:
        """The library objects (:func:`library_object`) that ``nodes`` call (``names``: the imports, if not the
        scope's own)."""
        names, found = names or self.names, set()
        for node in nodes:
            for n in ast.walk(node):
                if isinstance(n, ast.Call) and (path := dotted(n.func, names)) and (obj := library_object(path)):
                    found.add(obj)
        return found

    def referred(self, nodes, prefix: str = SOLUTIONS) -> set[str]:
        """The dotted paths under ``prefix`` (a reference answer: ``utils.solutions.lesson04.k3_kl``) ``nodes`` use."""
        return {p for node in nodes for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))
                and isinstance(n.ctx, ast.Load) and (p := dotted(n, self.names)) and p.startswith(prefix)}


@functools.lru_cache(maxsize=64)
def script_outputs(text: str) -> dict[str, set[tuple[str, str]]]:
    """``{output key: library objects}`` of a side script such as tests/verl/check_core_algos.py: what it stores under
    ``out[key]``, traced back through the names it assigned (in the order of its lines) to the library calls that
    made it; ``"*"`` holds every library object the script calls."""
    tree = _parse(text)
    scope = Scope([tree])
    made: dict[str, set] = {}
    keys: dict[str, set] = {"*": scope.called([tree])}
    for stmt in sorted((n for n in ast.walk(tree) if isinstance(n, _SIMPLE)), key=lambda n: n.lineno):
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) or stmt.value is None:
            continue
        value = scope.called([stmt.value]) | {o for name in _loads(stmt.value) for o in made.get(name, ())}
        for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
            if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                keys.setdefault(str(target.slice.value), set()).update(value)
            for n in ast.walk(target):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    made[n.id] = value
    return keys


def _keys_read_with(test, scope: Scope, answers: set[str]) -> set[str]:
    """The string keys ``test`` reads (``verl["grpo"]``) in a statement that involves ``answers`` (dotted paths):
    uses one, calls a helper of the file that uses one, or reads a name such a statement assigned."""
    tainted, keys = set(), set()
    for stmt in sorted((n for n in ast.walk(test) if isinstance(n, _SIMPLE)), key=lambda n: n.lineno):
        loads = _loads(stmt)
        helpers = [d for name in loads for d in scope.defs.get(name, []) if isinstance(d, ast.FunctionDef)]
        if scope.referred([stmt]) & answers or loads & tainted or any(scope.referred(scope.closure(h)) & answers
                                                                      for h in helpers):
            keys |= {n.slice.value for n in ast.walk(stmt) if isinstance(n, ast.Subscript)
                     and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str)}
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            tainted |= {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}
    return keys


@functools.lru_cache(maxsize=256)
def _test_functions(text: str, script_names: frozenset[str]) -> tuple[Scope, list]:
    """A test file's scope and, for each of its test functions (``test_*``, in ``Test*`` classes too), ``(node, the
    reference answers it uses, the library objects it calls, the side scripts it names)``, each through what it uses
    of its file (:meth:`Scope.closure`)."""
    tree = _parse(text)
    scope = Scope([tree])
    nodes = [n for n in tree.body if isinstance(n, _DEFS) and n.name.startswith("test")]
    nodes += [m for c in tree.body if isinstance(c, ast.ClassDef) and c.name.startswith("Test") for m in c.body
              if isinstance(m, _DEFS) and m.name.startswith("test")]
    summary = []
    for node in nodes:
        reached = scope.closure(node)
        names = {n.value for r in reached for n in ast.walk(r)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in script_names}
        summary.append((node, scope.referred(reached), scope.called(reached), sorted(names)))
    return scope, summary


def tested_against(text: str, answers: set[str], scripts: dict[str, str] | None = None) -> set[tuple[str, str]]:
    """The library objects that the test functions of one test file (``text``) compare ``answers`` with (dotted
    paths, ``{"utils.solutions.lesson04.k3_kl"}``): the objects called by each test function that uses one of them,
    with its fixtures and helpers; and, when such a test runs a side script (``scripts``: ``{file name: its text}``,
    named by a string in the test's code), that script's objects behind the keys the test reads with the answer
    (:func:`script_outputs`; all the script's objects when no statement with the answer reads one of its keys)."""
    scripts = scripts or {}
    scope, summary = _test_functions(text, frozenset(scripts))
    found = set()
    for node, used, called, run in summary:
        if not used & answers:
            continue
        found |= called
        for name in run:
            outputs = script_outputs(scripts[name])
            keys = _keys_read_with(node, scope, answers) & outputs.keys() or {"*"}
            found |= {o for k in keys for o in outputs[k]}
    return found


def check_references(check: str, setup: list[str], imports: list[str], lesson: Scope | None = None
                     ) -> set[tuple[str, str]]:
    """The library objects a graded check (``check``, its whole source: hidden tests too) calls, itself or through
    the definitions of the lesson's setup cells (``setup``) it uses; names resolve through the imports of the setup
    cells, the answer cells (``imports``) and the check. ``lesson``: :func:`lesson_scope` of the same cells, made
    once for all the lesson's checks."""
    lesson = lesson or lesson_scope(setup, imports)
    tree = _parse(check)
    return lesson.called(lesson.closure(tree), {**lesson.names, **bindings([tree])})


def lesson_scope(setup: list[str], imports: list[str]) -> Scope:
    """The scope a lesson's checks run in: the definitions of its setup cells, and the imports of its setup and
    answer cells."""
    trees = [_parse(s) for s in setup]
    return Scope(trees, names=bindings(trees + [_parse(s) for s in imports]))


def describe(found: set[tuple[str, str]]) -> str:
    """``"TRL (`DPOTrainer`); verl (`kl_penalty`)"``: each library with its objects (at most :data:`MAX_OBJECTS`, in
    alphabetical order, then "..."), libraries in :data:`ORDER`; :data:`NO_LIBRARY` when ``found`` is empty."""
    parts = []
    for label in ORDER:
        names = sorted(name for lib, name in found if lib == label)
        if names:
            shown = ", ".join(f"`{n}`" for n in names[:MAX_OBJECTS]) + (", ..." if len(names) > MAX_OBJECTS else "")
            parts.append(f"{label} ({shown})")
    return "; ".join(parts) or NO_LIBRARY


def read_tests(root: Path = REPO_ROOT) -> tuple[dict[str, str], dict[str, str]]:
    """``(tests, scripts)``: ``{path: text}`` of the test files of ``root/tests`` that import a reference answer, and
    ``{file name: text}`` of its other Python files (the side scripts a test may run)."""
    tests, scripts = {}, {}
    for path in sorted((root / "tests").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name.startswith("test_"):
            if "utils.solutions" in text:
                tests[path.relative_to(root).as_posix()] = text
        elif path.name != "__init__.py":
            scripts[path.name] = text
    return tests, scripts


def checked_against(lesson: Path, exercises: list[dict], sources=None) -> dict[str, str]:
    """``{exercise: what it is checked against}`` (:func:`describe`) for ``exercises`` (``readme.exercises(lesson)``'s
    rows: "exercise", "functions"), from the lesson's checks and setup cells and the tests (``sources``: what
    :func:`read_tests` returns, read once by the caller)."""
    tests, scripts = sources or read_tests()
    nb = json.loads(lesson.read_text(encoding="utf-8"))   # as nbformat stores it: no need to validate it again
    code = [(c, "".join(c["source"]) if isinstance(c["source"], list) else c["source"]) for c in nb["cells"]
            if c["cell_type"] == "code"]
    setup = [s for c, s in code if SETUP_TAG in c.get("metadata", {}).get("tags", [])]
    imports = [s for c, s in code if cells.is_answer(c)]
    checks = {cells.grade_id(c): s for c, s in code if cells.is_check(c)}
    scope = lesson_scope(setup, imports)
    number = lesson.name[:2]
    out = {}
    for e in exercises:
        found = check_references(checks[e["exercise"]], setup, imports, scope) if e["exercise"] in checks else set()
        answers = {f"{SOLUTIONS}{number}.{f}" for f in e["functions"]}
        for text in tests.values():
            found |= tested_against(text, answers, scripts)
        out[e["exercise"]] = describe(found)
    return out
