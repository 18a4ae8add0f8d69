"""The judge: a grading run's cells in a plain Python process, the checks out of the answers' reach.

``grading.execute`` starts this file as a script (it imports nothing of the course, so that a
handout's own ``utils`` is the one its setup cells import) and reads its results from standard
output. It runs, in the lesson's order:

- the ``parameters`` cell, then the run's parameters, then the ``grader-setup`` cells, as written;
- each **answer** as the definitions it is: its imports, ``def``/``class`` statements and
  assignments to names; any other top-level statement (a loop, a call, a patch) is not run and is
  reported as skipped;
- each **graded check**, compiled by the judge from the course's source, in a namespace of its own:
  the modules it names are copies of their attribute tables taken *before any answer ran*, its
  builtins a copy of the builtins of that moment, and each answer's function wrapped: after every
  call the judge looks again at everything it took (builtins, the attributes of the libraries'
  modules and of the classes the checks use, trace and profile hooks, threads). Student code that
  changed any of them has *touched the judge*: the run stops and earns nothing. After every check,
  canaries (comparisons that must fail and ones that must pass, through the live modules) must
  behave, or the run stops the same way. A value an answer returns whose class is not the
  libraries' own but redefines comparison (``__eq__`` always true, ...) fails its check.

No IPython: no input or AST transformers, no traceback display, no ``In``/``Out`` history. Results
go out as JSON lines carrying a nonce read from standard input before any course or student code
ran; standard output and error are pointed at /dev/null for everything else. A failure inside a
check's hidden tests is reported by the exception's type and, for the check's own ``assert``, the
constant text of its message (what an f-string formats is left out): nothing computed reaches the
student. What this cannot stop (code that searches the process's memory for the judge's own objects)
is said in ``docs/instructors.md``.
"""
import builtins
import json
import os
import signal
import sys
import threading
import types

# Taken before anything else runs: the judge's own references.
_dumps, _exec, _compile, _isinstance, _type, _id = json.dumps, builtins.exec, builtins.compile, isinstance, type, id
_settrace, _gettrace, _setprofile, _getprofile = sys.settrace, sys.gettrace, sys.setprofile, sys.getprofile
_signal, _setitimer, _threads = signal.signal, signal.setitimer, threading.enumerate
_getframe, _ModuleType = sys._getframe, types.ModuleType

WATCHED_ROOTS = ("builtins", "math", "operator", "functools", "itertools", "collections", "re", "json", "random",
                 "statistics", "copy", "numpy", "torch", "transformers", "trl", "peft", "datasets", "utils")
COMPARISON = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__float__", "__int__",
              "__index__", "__abs__", "__sub__", "__rsub__", "__len__", "__contains__", "__torch_function__",
              "__array__", "__getattr__", "__getattribute__", "__iter__", "__getitem__")
MUST_FAIL = ("assert torch.allclose(torch.zeros(3), torch.ones(3))",
             "assert torch.equal(torch.zeros(2), torch.ones(2))",
             "assert bool((torch.arange(3) == torch.arange(1, 4)).all())", "assert abs(-2) == 1",
             "assert abs(torch.tensor(-2.0)).item() == 1.0", "assert math.isclose(1.0, 2.0)", "assert 0.5 == 0.25",
             "assert [1, 2] == [2, 1]", "assert isinstance(1, str)", "assert len([1, 2]) == 3",
             "assert sum([1, 2]) == 4")
MUST_PASS = ("assert torch.allclose(torch.ones(3), torch.ones(3))", "assert torch.equal(torch.ones(2), torch.ones(2))",
             "assert abs(-2) == 2", "assert math.isclose(1.0, 1.0)", "assert [1, 2] == [1, 2]",
             "assert len([1, 2]) == 2")
DEFINITIONS = ("Import", "ImportFrom", "FunctionDef", "AsyncFunctionDef", "ClassDef", "Pass")


class Touched(BaseException):
    """Student code changed what the judge relies on (a BaseException: a check's ``except Exception`` lets it by;
    the judge also keeps the first one in ``Judge.touched``, so that nothing that catches it hides it)."""


# ----------------------------------------------------------------------------- what the judge watches
def _freeze(module, memo):
    """A module object holding a copy of ``module``'s attribute table, its submodules frozen alike."""
    if _id(module) in memo:
        return memo[_id(module)]
    if _type(module) is not _ModuleType:  # a lazy module (transformers') keeps its own lookup: watched instead
        return module
    copy = _ModuleType(module.__name__)
    memo[_id(module)] = copy
    table = dict(module.__dict__)
    root = module.__name__.split(".")[0] + "."
    for k, v in table.items():
        if _type(v) is _ModuleType and (v.__name__ + ".").startswith(root):
            table[k] = _freeze(v, memo)
    copy.__dict__.update(table)
    return copy


def _api(name, value):
    """Whether a module attribute is watched: a public name bound to a function, a class or a module (libraries
    fill their private caches and hooks, and rebind public data, as they run)."""
    return not name.startswith("_") and _isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType,
                                                           _ModuleType))


def _watched_tables(namespace):
    """(name, table, its items at this moment) for builtins, the libraries' modules, the classes the checks use."""
    tables, seen = [], set()

    def add(name, table, whole, items=None):
        if _id(table) not in seen:
            seen.add(_id(table))
            tables.append((name, table, dict(table) if items is None else items, whole))
    add("builtins", builtins.__dict__, False)
    for name, module in list(sys.modules.items()):   # lazy modules (transformers', trl's) rebind names they resolve
        if _type(module) is _ModuleType and name.split(".")[0] in WATCHED_ROOTS:
            add(name, module.__dict__, False, {k: v for k, v in list(module.__dict__.items()) if _api(k, v)})
    import torch
    classes = [torch.Tensor, torch._C.TensorBase, torch.nn.Module, torch.nn.Parameter, torch.Generator]
    for value in list(namespace.values()):
        if not _isinstance(value, _ModuleType):
            classes += [c for c in _type(value).__mro__ if c is not object]
    for cls in classes:
        add(f"{cls.__module__}.{cls.__qualname__}", cls.__dict__, True)
    return tables


def _all_classes():
    """The ids of every class that exists now (all subclasses of ``object``, transitively)."""
    seen, todo = set(), [object]
    while todo:
        cls = todo.pop()
        try:
            subs = type.__subclasses__(cls)
        except TypeError:
            continue
        for sub in subs:
            if _id(sub) not in seen:
                seen.add(_id(sub))
                todo.append(sub)
    seen.add(_id(object))
    return seen


LIBRARY_ROOTS = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}
                      | {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})


def _library_made(value):
    """Whether a new value is a function the libraries or the course wrote (one that patches a class as it is
    imported, as torch._dynamo does ``Module.__init__``): its code in a file under the interpreter's prefixes or
    the course's ``utils``, where a run cannot write."""
    code = getattr(value, "__code__", None) if _type(value) is types.FunctionType else None
    path = getattr(code, "co_filename", "")
    return _isinstance(path, str) and path.startswith(LIBRARY_ROOTS) and os.path.isfile(path)


CACHES = ("__slotnames__", "__abstractmethods__", "__annotations__")   # what copy, pickle and abc add to a class


def _differences(tables):
    """{(table index, name): value now} for every watched attribute that is not what it was taken as."""
    missing, found = object(), {}
    for i, (_, table, items, whole) in enumerate(tables):
        for k, v in items.items():
            now = table.get(k, missing)
            if now is not v:
                found[(i, k)] = now
        if whole and len(table) != len(items):   # a class gaining a special method (Tensor.__eq__ defined anew)
            for k in table:
                if k not in items and _isinstance(k, str) and k[:2] == k[-2:] == "__" and k not in CACHES:
                    found[(i, k)] = table[k]
    return found


class Judge:
    def __init__(self, cell_timeout):
        self.cell_timeout = cell_timeout
        self.g = {"__name__": "__main__", "__builtins__": builtins}   # setup and answers
        self.c = None                                                   # the checks' namespace
        self.tables, self.frozen, self.memo, self.seen = None, {}, {}, {}
        self.threads, self.touched = set(), None

    # ------------------------------------------------------------------ before any answer
    def take(self):
        """Copy and record what the checks rely on; called before the first answer runs."""
        self.tables = _watched_tables(self.g)
        self.frozen_builtins = dict(builtins.__dict__)
        self.threads = {_id(t) for t in _threads()}
        self.c = {"__name__": "__main__", "__builtins__": self.frozen_builtins}
        self.known_types = _all_classes()

    def verify(self, where, allowed=None):
        """Raise Touched when a watched attribute differs from what was taken (or, with ``allowed``, from the
        differences there were before the student's call: a check may block a library shortcut for its length)."""
        if self.touched:
            raise Touched(self.touched)
        allowed, problem = allowed or {}, None
        for key, value in _differences(self.tables).items():
            if (key not in allowed or allowed[key] is not value) and not _library_made(value):
                problem = f"{where} changed {self.tables[key[0]][0]}.{key[1]}"
                break
        if problem is None and (_gettrace() is not None or _getprofile() is not None):
            problem = f"{where} left a trace or profile hook"
        for thread in _threads():
            if _id(thread) not in self.threads:
                target = getattr(thread, "_target", None) or _type(thread).run
                if problem is None and not _library_made(getattr(target, "__func__", target)):
                    problem = f"{where} left a thread of its own running"
        if problem is not None:
            self.touched = problem
            raise Touched(problem)

    # ------------------------------------------------------------------ the checks' view
    def _wrap(self, name, f):
        judge = self

        def judged(*args, **kwargs):
            allowed = _differences(judge.tables)
            try:
                value = f(*args, **kwargs)
            finally:
                frame = _getframe(1)
                hooked = _gettrace() is not None or _getprofile() is not None or frame.f_trace is not None
                _settrace(None)
                _setprofile(None)
                frame.f_trace = None
                if hooked:
                    judge.touched = judge.touched or f"calling {name} set a trace or profile hook"
                    raise Touched(judge.touched)
                judge.verify(f"calling {name}", allowed)
            judge.inspect_value(name, value)
            return value
        judged.__name__ = judged.__qualname__ = getattr(f, "__name__", name)
        judged.__doc__ = getattr(f, "__doc__", None)
        return judged

    def refresh(self, answered):
        """Bring the checks' namespace up to date with what setup cells and answers defined."""
        for k, v in list(self.g.items()):
            if k.startswith("__") or self.seen.get(k) is v:
                continue
            self.seen[k] = v
            if _type(v) is _ModuleType:
                self.c[k] = _freeze(v, self.memo)
            elif k in answered and callable(v) and not _isinstance(v, type):
                self.c[k] = self._wrap(k, v)
            else:
                self.c[k] = v

    def inspect_value(self, name, value, depth=0):
        """Fail a check whose answer returned an object that lies about comparison."""
        t = _type(value)
        if t in (dict, list, tuple) and depth < 4:
            items = value.values() if t is dict else value
            for i, v in enumerate(items):
                if i > 10000:
                    break
                self.inspect_value(name, v, depth + 1)
            return
        if _id(t) in self.known_types:
            return
        made_here = [c for c in t.__mro__ if _id(c) not in self.known_types]
        lying = sorted({k for c in made_here for k in COMPARISON if k in c.__dict__})
        if lying:
            raise AssertionError(f"{name} returned a {t.__name__} whose class redefines {', '.join(lying[:3])}: "
                                 "return plain values, tensors or containers of them")

    def canaries(self):
        import math

        import torch
        for code in MUST_FAIL + MUST_PASS:
            ns = {"torch": torch, "math": math, "__builtins__": builtins}
            try:
                _exec(_compile(code, "<canary>", "exec"), ns)
                failed = False
            except AssertionError:
                failed = True
            except Exception:
                failed = None
            if failed is not (code in MUST_FAIL):
                raise Touched(f"a canary misbehaved: `{code}` {'passed' if failed is False else 'failed'}")


# ----------------------------------------------------------------------------- running cells
def _definitions(source, filename):
    """(code of the top-level definitions, line numbers of the statements left out)."""
    import ast
    tree = ast.parse(source, filename)
    kept, skipped = [], []
    for node in tree.body:
        kind = _type(node).__name__
        plain_target = kind in ("Assign", "AnnAssign") and all(
            _type(t).__name__ == "Name" for t in (node.targets if kind == "Assign" else [node.target]))
        docstring = kind == "Expr" and _type(node.value).__name__ == "Constant"
        (kept if kind in DEFINITIONS or plain_target or docstring else skipped).append(node)
    tree.body = kept
    return _compile(tree, filename, "exec"), [n.lineno for n in skipped]


def _static_text(node):
    """The constant text of a message expression, each formatted value shown as '…'."""
    kind = _type(node).__name__
    if kind == "Constant" and _isinstance(node.value, str):
        return node.value
    if kind == "JoinedStr":
        return "".join(v.value if _type(v).__name__ == "Constant" else "…" for v in node.values)
    if kind == "Call" and node.args:
        return _static_text(node.args[0])
    return ""


def _hidden_message(source, line, ename, own):
    """What a failure at ``line`` of a check's hidden tests may say: its type, and the assert's constant text."""
    import ast
    if own:
        for node in ast.walk(ast.parse(source)):
            if _type(node).__name__ in ("Assert", "Raise") and node.lineno <= line <= node.end_lineno:
                msg = node.msg if _type(node).__name__ == "Assert" else node.exc
                text = _static_text(msg) if msg is not None else ""
                if text:
                    return text
    return f"a hidden test failed ({ename} {'in the check' if own else 'raised inside your code'})"


def _failure(error, filename, source, in_hidden):
    """(ename, message) of an exception a cell raised; in a check's hidden tests, nothing it computed."""
    tb, line, own = error.__traceback__, None, False
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line, own = tb.tb_lineno, tb.tb_next is None
        tb = tb.tb_next
    ename = _type(error).__name__[:100]
    if in_hidden:
        return ename, _hidden_message(source, line or 0, ename, own)
    return ename, (str(error).strip().splitlines() or [""])[0][:300]


def _alarm(signum, frame):
    raise KeyboardInterrupt("the cell time limit")   # as a kernel's interrupt: an answer may swallow it


def _limit(seconds):
    _signal(signal.SIGALRM, _alarm)
    _setitimer(signal.ITIMER_REAL, seconds)


def _check_parts(source, segments):
    """Each (code text, hidden) part of a check: its lines in place, the others blank (tracebacks keep their lines)."""
    lines = source.splitlines(True)
    return [("\n" * a + "".join(lines[a:b]), hidden) for a, b, hidden in segments]


def _timed(code, namespace, seconds):
    _limit(seconds)
    try:
        _exec(code, namespace)
    finally:
        _setitimer(signal.ITIMER_REAL, 0)


def _cell(judge, cell, i, answered):
    """Run one cell; returns its result fields (raises Touched)."""
    role, source, filename = cell["role"], cell["source"], f"<{cell['role']} {cell['grade_id'] or i}>"
    result, in_hidden = {}, False
    try:
        if role in ("parameters", "setup"):
            _exec(_compile(source, filename, "exec"), judge.g)
            if role == "parameters":
                _exec(_compile(cell["injected"], "<parameters>", "exec"), judge.g)
        elif role == "answer":
            code, result["skipped"] = _definitions(source, filename)
            before = dict(judge.g)
            _timed(code, judge.g, judge.cell_timeout)
            answered |= {k for k, v in judge.g.items() if before.get(k) is not v}
            judge.verify(f"answer cell {cell['grade_id']}")
        else:
            judge.refresh(answered)
            for text, hidden in _check_parts(source, cell["segments"]):
                in_hidden, before = hidden, dict(judge.c) if hidden else None
                try:
                    _timed(_compile(text, filename, "exec"), judge.c, judge.cell_timeout)
                finally:
                    if hidden:   # what the hidden tests bound goes with them: no later call finds it
                        judge.c.clear()
                        judge.c.update(before)
            in_hidden = False
    except Touched:
        raise
    except BaseException as e:  # noqa: BLE001 -- a cell's failure, whatever it raised, is its result
        result["ename"], result["message"] = _failure(e, filename, source, in_hidden)
        result["hidden"] = in_hidden
    if role == "check":
        judge.verify(f"check {cell['grade_id']}")
        judge.canaries()
    return result


def run(spec, say):
    """Run the spec's cells in order, saying each one's start and result; the run stops when the judge is touched."""
    judge, answered = Judge(spec["cell_timeout"]), set()
    for i, cell in enumerate(spec["cells"]):
        if cell["role"] in ("answer", "check") and judge.tables is None:
            judge.take()
        say(start=i)
        try:
            result = _cell(judge, cell, i, answered)
        except Touched as e:
            say(touched=str(e)[:300])
            return
        say(cell=i, **result)
    say(done=True)


def main(argv):
    nonce = sys.stdin.readline().strip()
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    write = out.write

    def say(**fields):
        write(_dumps({"nonce": nonce, **fields}) + "\n")
    spec_path, cwd = argv
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    os.chdir(cwd)
    sys.argv = ["judge"]
    run(spec, say)
    out.flush()
    os._exit(0)   # no interpreter shutdown: nothing an answer registered at exit runs after the results
