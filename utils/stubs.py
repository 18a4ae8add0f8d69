"""What a lab's kernel does about an exercise not done yet: the cells that need it are skipped, with a note.

A lab's exercise starts as a stub: a function (or a method of a class) that raises the NotImplementedError naming
its exercise (``STUB_MESSAGE``). Its graded check fails at once, and a "Run All" stops there. A student who runs on
past it (Run > "Run Selected Cell and All Below") then meets cells that would train with the stub, or read what
such a cell would have made. Inside IPython (:func:`register`, called by ``import utils``), before each cell runs:

- the cell is read, not run (:func:`read_cell`): the names its top-level code reads (not those inside a ``def`` or
  a ``lambda``, which run later), less the names it binds itself;
- *blocked* are the stubs, the notebook's functions and classes whose code reads a blocked name (from their
  bytecode, to a fixed point: ``train_rl`` calls ``gae``), and the names a skipped cell would have bound or filled
  (:func:`blocked`);
- a cell that reads a blocked name is replaced by one call of :func:`skipped_cell`, which prints the name and the
  exercise and blocks the names the cell binds, and the containers it fills (``runs["PPO"] = ...``), in turn.
  Nothing of the cell runs, nothing is raised, and the next cell runs.

Never skipped: a graded check (on a stub it must fail: nbgrader and the grader read that), a setup cell, and a
cell that reads no blocked name (an answer cell only defines). A name that a cell which ran binds is no longer
blocked (:func:`_after_cell`): finish the exercise, run its check, then its section again. What the reading cannot
see (a stub reached through a library, an attribute or a string) still fails where it is reached, and
:func:`_not_done_note` names the exercise. The results cell (``%%results``, :mod:`utils.records`) runs each
statement on its own and keeps the records of what ran.

Taught in every lab's instructions ("Exercises first"); docs/students.md says the same.
"""
from __future__ import annotations

import ast
import contextlib
import dis
import inspect
from types import CodeType, FunctionType

from .constants import CHECK_HEAD, LOCKED_CHECK_HEAD, SETUP_MARK, STUB_RE

NEVER_SKIPPED = (CHECK_HEAD, LOCKED_CHECK_HEAD, SETUP_MARK)   # first lines of the cells that always run
BLOCKED: dict[str, tuple[str, ...]] = {}   # a name a skipped cell would have bound -> the exercises it waited for
FILLED: set[str] = set()   # ... of which those it would only have filled (the container exists: a fill mends it)
_state = {"paused": False, "skipped": False}   # paused: :func:`paused`; skipped: the cell running now was


# ----------------------------------------------------------------------------- what is blocked
def _own(value) -> list[CodeType] | None:
    """The code of a function or class the notebook itself defined (``__module__ == "__main__"``): the function's
    (under its decorators, ``@torch.no_grad()``, ``@functools.cache``: the ``__wrapped__`` they keep), or each
    method's; None for anything else (an object of a library, an instance)."""
    if callable(value) and not isinstance(value, type):
        try:
            value = inspect.unwrap(value)
        except Exception:  # noqa: BLE001 -- an object whose attributes raise, or a cycle of wrappers: as it is
            pass
    if not isinstance(value, (type, FunctionType)) or value.__module__ != "__main__":
        return None
    return [f.__code__ for f in (vars(value).values() if isinstance(value, type) else [value])
            if isinstance(f, FunctionType)]


def stubs(namespace: dict) -> dict[str, tuple[str, ...]]:
    """The stubs in ``namespace``: ``{name: exercises}`` for each function or class of the notebook's own that raises
    the NotImplementedError naming its exercise (a class: in one of its methods), e.g. ``{"gae": ("07-gae",)}``."""
    found = {}
    for name, value in list(namespace.items()):
        exercises = {m.group(1) for code in _own(value) or [] if "NotImplementedError" in code.co_names
                     for c in code.co_consts if isinstance(c, str) and (m := STUB_RE.match(c))}
        if exercises:
            found[name] = tuple(sorted(exercises))
    return found


def unfinished(namespace: dict) -> list[str]:
    """The exercises whose stub is still defined in ``namespace``, sorted: e.g. ``["07-gae"]``."""
    return sorted({e for exercises in stubs(namespace).values() for e in exercises})


def globals_read(code: CodeType) -> set[str]:
    """The global names a code object (and the functions and comprehensions nested in it) loads."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= globals_read(const)
    return names


def blocked(namespace: dict, binds=frozenset(), fills=frozenset(), found: dict | None = None
            ) -> dict[str, tuple[tuple[str, ...], str, str]]:
    """What a cell that binds the names ``binds`` and fills the containers ``fills`` cannot use yet: ``{name:
    (exercises, why, root)}``, ``why`` one of ``"stub"`` (the exercise's own stub), ``"skipped"`` (a skipped cell
    would have set it: :data:`BLOCKED`) and ``"calls"`` (a function or class of the notebook whose code reads, at
    the end of a chain of such functions, the stub or skipped name ``root``). What the cell binds itself is not
    blocked (``runs = {}`` mends what a skipped cell left out), nor a container it fills that a skipped cell only
    filled. Empty when every exercise is done (the usual case, and then nothing more is read). ``found``: the
    namespace's :func:`stubs`, when the caller has them already."""
    mended = set(binds) | (set(fills) & FILLED)
    found = stubs(namespace) if found is None else found
    out = {name: (exercises, "stub", name) for name, exercises in found.items() if name not in mended}
    for name, exercises in BLOCKED.items():
        if name not in mended:
            out.setdefault(name, (exercises, "skipped", name))
    if not out:
        return out
    reads = {name: sorted(set().union(*map(globals_read, codes))) for name, value in list(namespace.items())
             if name not in out and (codes := _own(value))}
    grown = True
    while grown:   # to a fixed point: a function that calls a function that calls a stub is blocked too
        grown = False
        for name, names in reads.items():
            if name not in out and (via := next((n for n in names if n in out), None)):
                out[name], grown = (out[via][0], "calls", out[via][2]), True
    return out


# ----------------------------------------------------------------------------- reading a cell
class _Reader(ast.NodeVisitor):
    """The names a cell's top-level code reads (in order), binds, and fills (a subscript assigned, ``runs["PPO"] =
    ...``: the container must exist already). Bodies of ``def`` and ``lambda`` run later and are not read."""

    def __init__(self):
        self.reads, self.binds, self.fills = [], set(), set()
        self.bodies = {}   # a function the cell defines -> the names its body reads from outside (when it is called)

    def visit_Name(self, node):   # del x needs x as much as a read does
        (self.binds.add if isinstance(node.ctx, ast.Store) else self.reads.append)(node.id)

    def visit_AugAssign(self, node):   # steps += 1 reads steps first
        if isinstance(node.target, ast.Name):
            self.reads.append(node.target.id)
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if not isinstance(node.ctx, ast.Load):
            base = node.value
            while isinstance(base, (ast.Subscript, ast.Attribute)):
                base = base.value
            if isinstance(base, ast.Name):
                self.fills.add(base.id)
        self.generic_visit(node)

    def visit_FunctionDef(self, node):   # its name; its decorators, defaults and annotations run now
        self.binds.add(node.name)
        for part in (*node.decorator_list, node.args, node.returns):
            if part is not None:
                self.visit(part)
        self.bodies[node.name] = self._body(node.args, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.visit(node.args)

    def visit_Assign(self, node):   # score = lambda r: ...: a function too
        self.generic_visit(node)
        if isinstance(node.value, ast.Lambda) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.bodies[node.targets[0].id] = self._body(node.value.args, [node.value.body])

    @staticmethod
    def _body(args: ast.arguments, body: list) -> list[str]:
        """The names a function's body (and the functions nested in it) reads from outside: not its parameters,
        not what it binds."""
        inner = _Reader()
        for node in body:
            inner.visit(node)
        own = inner.binds | {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                             if a is not None}
        return [n for n in (*inner.reads, *(r for b in inner.bodies.values() for r in b)) if n not in own]

    def _inner(self, nodes):   # a scope of its own: what it reads from outside counts, what it binds does not
        inner = _Reader()
        for node in nodes:
            inner.visit(node)
        self.reads += [n for n in inner.reads if n not in inner.binds]
        self.fills |= inner.fills

    def visit_ClassDef(self, node):
        self.binds.add(node.name)
        for part in (*node.decorator_list, *node.bases, *node.keywords):
            self.visit(part)
        self._inner(node.body)

    def _comprehension(self, node):
        self._inner(list(ast.iter_child_nodes(node)))

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node):
        self.binds |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node):
        if node.name:
            self.binds.add(node.name)
        self.generic_visit(node)


_COMPOUND = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try, ast.TryStar, ast.Match,
             ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def read_cell(source: str) -> tuple[list[str], set[str], set[str]] | None:
    """``(reads, binds, fills)`` of a cell's Python source (after IPython's own transforms): the names its top-level
    code reads before it binds them, in order (``model = model.to(device)`` reads ``model``; within a loop or a
    ``with`` block, what the block binds is its own), and those read by the bodies of the functions it defines and
    uses (calls, passes on); the names it binds; the containers it fills. None when the source does not parse
    (IPython then reports the error as usual)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    reads, seen, binds, fills, bodies = [], [], set(), set(), {}
    for statement in tree.body:
        reader = _Reader()
        reader.visit(statement)
        own = reader.binds if isinstance(statement, _COMPOUND) else set()
        reads += [n for n in reader.reads if n not in binds and n not in own]
        seen += reader.reads
        binds, fills = binds | reader.binds, fills | reader.fills
        bodies.update(reader.bodies)
    called, waiting = set(), [n for n in seen if n in bodies]
    while waiting:   # a function the cell defines and uses: what its body reads is read now too
        name = waiting.pop(0)
        if name not in called:
            called.add(name)
            reads += [n for n in bodies[name] if n not in binds]
            waiting += [n for n in bodies[name] if n in bodies]
    return list(dict.fromkeys(reads)), binds, fills


# ----------------------------------------------------------------------------- in the kernel
@contextlib.contextmanager
def paused():
    """Within it, no cell is skipped: ``%%results`` reads its own body, which runs statement by statement."""
    _state["paused"] = True
    try:
        yield
    finally:
        _state["paused"] = False


def skip_if_blocked(lines: list[str]) -> list[str]:
    """IPython's input transformer (run on each cell's lines before it is compiled): the cell as it is, or, when it
    reads a blocked name and is neither a graded check nor a setup cell, one call of :func:`skipped_cell`. Never
    raises: on any error of its own the cell runs as written."""
    if _state["paused"]:
        return lines
    try:
        first = next((line.strip() for line in lines if line.strip()), "")
        if first.startswith(NEVER_SKIPPED):
            return lines
        from IPython import get_ipython

        namespace = get_ipython().user_ns
        found = stubs(namespace)
        cell = read_cell("".join(lines)) if BLOCKED or found else None
        block = blocked(namespace, cell[1], cell[2], found) if cell else {}
        need = next((n for n in cell[0] if n in block), None) if block else None
        if need is None:
            return lines
        exercises = tuple(sorted({e for n in cell[0] if n in block for e in block[n][0]}))   # all it waits for
        _, why, root = block[need]
        args = (sorted(cell[1]), sorted(cell[2]), need, exercises, why, root, block[root][1])
        return [f"__import__({__name__!r}, fromlist=['_']).skipped_cell(*{args!r})\n"]
    except Exception:  # noqa: BLE001 -- a skip is a courtesy: it never stops a cell from running
        return lines


def skipped_cell(binds: list[str], fills: list[str], need: str, exercises: tuple[str, ...], why: str, root: str,
                 root_why: str) -> None:
    """What a skipped cell runs instead of its code: block what it binds and fills, and print why, e.g. ``Skipped
    (nothing in this cell ran): it uses `train_rl`, which calls `gae` (exercise 07-gae, not done yet).``, then what
    to do: finish the exercise or, when it is done and only what a skipped cell would have set is missing, run
    the cells that set it again. ``need``, ``why`` and ``root``: :func:`blocked`'s entry for the name the cell
    needs; ``root_why``: the ``why`` of ``root`` ("stub" or "skipped")."""
    _state["skipped"] = True
    FILLED.update(n for n in fills if n not in binds and (n in FILLED or n not in BLOCKED))
    FILLED.difference_update(binds)
    BLOCKED.update({name: tuple(exercises) for name in (*binds, *fills)})
    many = len(exercises) > 1
    todo = f"exercise{'s' * many} {', '.join(exercises)}"
    try:
        from IPython import get_ipython

        done = not set(exercises) & set(unfinished(get_ipython().user_ns))
    except Exception:  # noqa: BLE001 -- outside a kernel: as if not done
        done = False
    set_above = "which a cell skipped above would have set"
    what = f"calls `{root}`" if root_why == "stub" else f"needs `{root}`, {set_above}"
    reason = {"stub": f"it calls `{need}`", "skipped": f"it needs `{need}`, {set_above}",
              "calls": f"it uses `{need}`, which {what}"}[why]
    how = "their answer cells, then their graded checks" if many else "its answer cell, then its graded check"
    advice = (f"{todo[0].upper()}{todo[1:]} {'are' if many else 'is'} done now: run again the cells above that set "
              f"`{root}`, then this one." if done else
              f"Finish {todo} ({how}), then run this section again. The results cell at the end keeps the records "
              "of what ran.")
    print(f"Skipped (nothing in this cell ran): {reason} ({todo}{'' if done else ', not done yet'}).\n{advice}")


def _after_cell(result) -> None:
    """IPython's ``post_run_cell`` event: what a cell that ran without an error binds and fills is no longer
    blocked (a cell that failed half-way may have set none of it)."""
    skipped, _state["skipped"] = _state["skipped"], False
    if skipped or not BLOCKED or not getattr(result, "success", False):
        return
    try:
        from IPython import get_ipython

        cell = read_cell(get_ipython().input_transformer_manager.transform_cell(result.info.raw_cell))
    except Exception:  # noqa: BLE001 -- an event handler must not raise
        return
    for name in (cell[1] | cell[2]) if cell else ():
        BLOCKED.pop(name, None)
        FILLED.discard(name)


# The errors a cell that needs an unfinished exercise meets (a stub's own NotImplementedError is a RuntimeError); not
# SyntaxError, which IPython shows its own way at parse time, nor ResultsIncomplete, which names the exercises itself.
NOTED = (ArithmeticError, AssertionError, AttributeError, LookupError, NameError, RuntimeError, TypeError, ValueError)


def _not_done_note(shell, etype, value, tb, tb_offset=None):
    """IPython's handler of a cell's error in a lab: a stub's NotImplementedError is shown as its one line and what
    to do (not the frames of the training that called it); any other error as usual, followed by the exercises
    still stubs, when there are any (a later section fails where it needs what they compute)."""
    try:
        stub = isinstance(value, NotImplementedError) and STUB_RE.match(str(value))
        todo = unfinished(shell.user_ns)
    except Exception:  # noqa: BLE001 -- the handler never raises: IPython would drop it and the error's output
        stub, todo = None, []
    if not stub:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)
        if todo:
            print(f"(Exercises not done yet: {', '.join(todo)}. This cell may need what they compute.)")
        return None
    shell._get_exc_info((etype, value, tb))   # sys.last_traceback and friends, for %tb and %debug
    shell._showtraceback(etype, value, [
        f"NotImplementedError: {value}",
        f"Exercise {stub.group(1)} is not done yet: write its answer cell, run its graded check, then the cells "
        "that need it (this one too). Until then, cells that need it are skipped with a note; the results cell at "
        "the end keeps the records of what ran."])
    if shell.call_pdb:
        shell.debugger(force=True)
    return None


def register(shell) -> None:
    """In an IPython ``shell``: skip the cells that need an exercise not done yet (:func:`skip_if_blocked`,
    :func:`_after_cell`) and name those exercises under a cell's error (:func:`_not_done_note`). Called by
    ``import utils``; a second call (a reload) replaces what the first registered."""
    mine = lambda f: getattr(f, "__module__", None) == __name__   # noqa: E731
    shell.input_transformers_post[:] = [t for t in shell.input_transformers_post if not mine(t)] + [skip_if_blocked]
    for callback in [c for c in shell.events.callbacks["post_run_cell"] if mine(c)]:
        shell.events.unregister("post_run_cell", callback)
    shell.events.register("post_run_cell", _after_cell)
    shell.set_custom_exc(NOTED, _not_done_note)
