"""What the judge (``judge.py``) watches while answers run: its snapshots, the checks' view, returned values.

Loaded by ``judge.py`` from this file (it imports nothing of the course). :class:`Watch` takes, before
the first answer runs, the attribute tables the checks rely on (builtins; the public functions,
classes and modules of the libraries' modules; the classes the checks use and the setup objects'
own attributes) and frozen copies of the modules the setup cells bound. Each answer function the
checks call is wrapped: after every call the tables, the checks' namespace, trace hooks and threads
are compared with what was taken, and the value returned is checked to be plain data.
"""
import builtins
import os
import sys
import threading
import types

_exec, _compile, _isinstance, _type, _id, _getattr = builtins.exec, builtins.compile, isinstance, type, id, getattr
_settrace, _gettrace, _setprofile, _getprofile = sys.settrace, sys.gettrace, sys.setprofile, sys.getprofile
_threads, _getframe = threading.enumerate, sys._getframe
_ModuleType, _FunctionType = types.ModuleType, types.FunctionType

WATCHED_ROOTS = ("builtins", "math", "operator", "functools", "itertools", "collections", "re", "json", "random",
                 "statistics", "copy", "numpy", "torch", "transformers", "trl", "peft", "datasets", "utils")
TRUSTED_ROOTS = ("builtins", "collections", "_collections_abc", "torch", "numpy", "re", "enum", "typing", "pathlib",
                 "types", "fractions", "decimal", "transformers", "datasets", "tokenizers", "trl", "peft",
                 "bitsandbytes", "utils")
LYING = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__", "__float__", "__int__",
         "__index__", "__abs__", "__torch_function__", "__torch_dispatch__", "__array__", "__array_ufunc__")
CACHES = ("__slotnames__", "__abstractmethods__", "__annotations__")   # what copy, pickle and abc add to a class
PLAIN = (type(None), bool, int, float, complex, str, bytes)
LIBRARY_ROOTS = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
MUST_FAIL = ("assert torch.allclose(torch.zeros(3), torch.ones(3))",
             "assert torch.equal(torch.zeros(2), torch.ones(2))",
             "assert bool((torch.arange(3) == torch.arange(1, 4)).all())", "assert abs(-2) == 1",
             "assert abs(torch.tensor(-2.0)).item() == 1.0", "assert math.isclose(1.0, 2.0)", "assert 0.5 == 0.25",
             "assert [1, 2] == [2, 1]", "assert isinstance(1, str)", "assert len([1, 2]) == 3",
             "assert sum([1, 2]) == 4", "assert torch.tensor([1, 2]).tolist() == [2, 1]")
MUST_PASS = ("assert torch.allclose(torch.ones(3), torch.ones(3))", "assert torch.equal(torch.ones(2), torch.ones(2))",
             "assert abs(-2) == 2", "assert math.isclose(1.0, 1.0)", "assert [1, 2] == [1, 2]",
             "assert len([1, 2]) == 2", "assert torch.tensor([1, 2]).tolist() == [1, 2]")


class _NoIPython:
    """What ``get_ipython()`` gives an answer: any call (a magic's, a shell command's) does nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class Touched(BaseException):
    """Student code changed what the judge relies on (a BaseException: a check's ``except Exception`` lets it by;
    :class:`Watch` also keeps the first one in ``touched``, so that nothing that catches it hides it)."""


def library_made(value, roots=LIBRARY_ROOTS):
    """Whether a value is harmless where a watched one was: plain data (it cannot compare as anything), or a
    function the libraries or the course wrote (torch._dynamo wraps ``nn.Module.__init__`` as it is imported):
    its code compiled from a module's own file under the interpreter's prefixes or the course's ``utils``, where
    a run cannot write, and its globals that module's."""
    if _type(value) in PLAIN:
        return True
    value = _getattr(value, "__func__", value)
    if _type(value) is not _FunctionType:
        return False
    module = sys.modules.get(value.__globals__.get("__name__") or "")   # the module the code was compiled in
    path = value.__code__.co_filename
    return (module is not None and value.__globals__ is _getattr(module, "__dict__", None)
            and _getattr(module, "__file__", None) == path and _isinstance(path, str) and path.startswith(roots)
            and os.path.isfile(path))


def library_class(cls, roots=LIBRARY_ROOTS):
    """Whether a class is a library's: found under its own name in a module whose file is under ``roots``."""
    module = sys.modules.get(_getattr(cls, "__module__", None) or "")
    found = module
    for part in str(_getattr(cls, "__qualname__", "")).split("."):
        found = _getattr(found, part, None)
    path = _getattr(module, "__file__", None) or ""
    return found is cls and _isinstance(path, str) and path.startswith(roots)


def _public(module_name):
    """A module of a library's public face: no part of its name private (``torch.nn``, not ``torch._dynamo``)."""
    return not any(part.startswith("_") for part in module_name.split("."))


def freeze(module, memo, wanted):
    """A module object holding a copy of ``module``'s attribute table, its submodules named in ``wanted`` (the
    checks' attribute chains: ``torch.nn.functional``) frozen alike."""
    if _id(module) in memo:
        return memo[_id(module)]
    if _type(module) is not _ModuleType:  # a lazy module (transformers') keeps its own lookup: watched instead
        return module
    copy = _ModuleType(module.__name__)
    memo[_id(module)] = copy
    table = dict(module.__dict__)
    for k, v in table.items():
        if _type(v) is _ModuleType and f"{module.__name__}.{k}" in wanted:
            table[k] = freeze(v, memo, wanted)
    copy.__dict__.update(table)
    return copy


def attribute_chains(sources):
    """Every dotted name in the checks' sources (``torch.nn.functional.softmax``), as a set of strings."""
    import ast
    chains = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            parts = []
            while _type(node).__name__ == "Attribute":
                parts.append(node.attr)
                node = node.value
            if parts and _type(node).__name__ == "Name":
                chains.add(".".join([node.id, *reversed(parts)]))
    return chains


def _all_classes():
    """The ids of every class that exists now (all subclasses of ``object``, transitively)."""
    seen, todo = {_id(object)}, [object]
    while todo:
        try:
            subs = type.__subclasses__(todo.pop())
        except TypeError:
            continue
        for sub in subs:
            if _id(sub) not in seen:
                seen.add(_id(sub))
                todo.append(sub)
    return seen


class Watch:
    """The judge's snapshots and the checks' namespace (``c``); ``g`` is the setup cells' and answers'."""

    def __init__(self, roots):
        self.roots = LIBRARY_ROOTS + tuple(roots)
        self.s = {"__name__": "__main__", "__builtins__": builtins}   # the setup cells': no answer writes it
        self.g = dict(self.s, get_ipython=lambda: _NoIPython())        # the answers': what setup bound, copied
        self.c, self.tables, self.memo, self.touched, self.threads = None, None, {}, None, set()
        self.base, self.exports = {}, {}   # what each name of the checks' namespace was bound to; the answers'

    def setup_bound(self, names):
        """Names a setup cell bound: the answers get them too, and the checks (after the first answer) at once."""
        for k in names:
            self.g[k] = self.s[k]
            if self.c is not None:
                self.bind(k)

    # ------------------------------------------------------------------ before any answer
    def take(self, setup_names, check_sources):
        """Record what the checks rely on and make their namespace from what the setup cells bound."""
        self.chains = attribute_chains(check_sources)
        self.tables, seen = [], set()

        def add(name, table, kind, items=None):   # kind: "module" (names kept), "class", "instance"
            if _id(table) not in seen:
                seen.add(_id(table))
                self.tables.append((name, table, dict(table) if items is None else items, kind))
        self.frozen_builtins = dict(builtins.__dict__)
        add("builtins", builtins.__dict__, "module")
        for name, module in list(sys.modules.items()):   # lazy modules (transformers', trl's) rebind what they resolve
            if _type(module) is _ModuleType and name.split(".")[0] in WATCHED_ROOTS and _public(name):
                add(name, module.__dict__, "module", {k: v for k, v in list(module.__dict__.items()) if
                    not k.startswith("_") and _isinstance(v, (type, _FunctionType, types.BuiltinFunctionType,
                                                              _ModuleType))})
        import torch
        classes = [torch.Tensor, torch._C.TensorBase, torch.nn.Module, torch.nn.Parameter, torch.Generator]
        self.c = {"__name__": "__main__", "__builtins__": self.frozen_builtins}
        self.add = add
        for k in setup_names:
            self.bind(k)
        for cls in classes:
            add(f"{cls.__module__}.{cls.__qualname__}", cls.__dict__, "class")
        add("the checks' builtins", self.frozen_builtins, "frozen")
        self.known, self.exported = _all_classes(), set()
        self.threads = {_id(t) for t in _threads()}

    def bind(self, name):
        """Put a name a setup cell bound into the checks' namespace (a module as its frozen copy, watched from
        now on; an object with its class's and its own attributes watched)."""
        value = self.s[name]
        if _type(value) is _ModuleType:   # the submodules the checks name through it: torch.nn.functional
            wanted = {value.__name__ + chain[len(name):] for chain in self.chains if chain.startswith(name + ".")}
            wanted = {w.rsplit(".", i)[0] for w in wanted for i in range(w.count(".") + 1)}
            before = set(self.memo)
            self.c[name] = freeze(value, self.memo, wanted)
            for key in set(self.memo) - before:
                self.add(f"{self.memo[key].__name__} (the checks' copy)", self.memo[key].__dict__, "frozen")
        else:
            self.c[name] = value
            if not _isinstance(value, type):
                for cls in _type(value).__mro__[:-1]:
                    self.add(f"{cls.__module__}.{cls.__qualname__}", cls.__dict__, "class")
                plain_function = _isinstance(value, (_FunctionType, types.BuiltinFunctionType, types.MethodType))
                if _isinstance(_getattr(value, "__dict__", None), dict) and not plain_function:
                    self.add(f"{name}'s attributes", value.__dict__, "instance")
        self.base[name] = self.c[name]

    def differences(self):
        """{(table index, name): value now} for every watched attribute that is not what it was."""
        missing, found = object(), {}
        for i, (_, table, items, kind) in enumerate(self.tables):
            for k, v in items.items():
                now = table.get(k, missing)
                if now is not v:
                    found[(i, k)] = now
            if kind in ("class", "instance", "frozen") and len(table) != len(items):
                for k in table:
                    if k not in items and k not in CACHES:
                        found[(i, k)] = table[k]
        return found

    def verify(self, where, allowed=None):
        """Raise Touched when a watched attribute differs from what was taken (or, with ``allowed``, from the
        differences there were before the student's call: a check may block a library shortcut for its length)."""
        if self.touched:
            raise Touched(self.touched)
        allowed, problem = allowed or {}, None
        for key, value in self.differences().items():
            name, _, items, kind = self.tables[key[0]]
            if key in allowed and allowed[key] is value:
                continue
            harmless = library_made(value, self.roots) and kind != "frozen"
            if kind == "instance":
                harmless = not callable(value) or library_made(value, self.roots)
            if not harmless:
                problem = f"{where} changed {name}" + (f".{key[1]}" if key[1] in items else " (an attribute added)")
                break
        if problem is None and (_gettrace() is not None or _getprofile() is not None):
            problem = f"{where} left a trace or profile hook"
        for thread in _threads():
            if problem is None and _id(thread) not in self.threads:
                target = _getattr(thread, "_target", None) or _type(thread).run
                if not library_made(target, self.roots):
                    problem = f"{where} left a thread of its own running"
        if problem is not None:
            self.touched = problem
            raise Touched(problem)

    # ------------------------------------------------------------------ the checks' view of the answers
    def export(self, name, kind):
        """Put an answer's ``name`` into the checks' namespace: a function wrapped, a class with its methods
        wrapped, a value only when it is plain data; anything else (or a def turned into a class) a stand-in
        that says what is wrong."""
        value, problem = self.g.get(name), None
        if kind == "def" and callable(value) and not _isinstance(value, type):   # lru_cache'd, compiled: callable
            self.c[name] = self.wrap(name, value)
        elif kind == "class" and _isinstance(value, type) and _id(value) not in self.known:
            for k, v in list(value.__dict__.items()):
                if _type(v) is _FunctionType:
                    setattr(value, k, self.wrap(f"{name}.{k}", v))
            self.exported.add(_id(value))
            self.c[name] = value
        elif kind == "value" and self.plain_problem(value) is None:
            self.c[name] = value
        else:
            problem = f"{name} is not the {'function' if kind == 'def' else kind} the lab asks for"

        def stand_in(*args, **kwargs):
            raise TypeError(problem)
        if problem is not None:
            self.c[name] = stand_in
        self.base[name] = self.exports[name] = self.c[name]

    def _overrides(self):
        """The check's own functions bound where a setup name or an answer's name was (a library shortcut
        blocked: ``get_soft_overlong_punishment = not_yours``): the answers see them during their call too."""
        return {k: v for k, v in self.c.items() if _type(v) is _FunctionType and k in self.g
                and k not in self.exports and self.base.get(k) is not v
                and v.__code__.co_filename.startswith("<check")}

    def wrap(self, name, f):
        watch = self

        def judged(*args, **kwargs):
            allowed, names, overrides = watch.differences(), dict(watch.c), watch._overrides()
            saved = {k: watch.g[k] for k in overrides}
            watch.g.update(overrides)
            try:
                value = f(*args, **kwargs)
            finally:
                for k, v in saved.items():
                    if watch.g.get(k) is overrides[k]:
                        watch.g[k] = v
                frame = _getframe(1)
                hooked = _gettrace() is not None or _getprofile() is not None or frame.f_trace is not None
                _settrace(None)
                _setprofile(None)
                frame.f_trace = None
                if hooked:
                    watch.touched = watch.touched or f"calling {name} set a trace or profile hook"
                if len(watch.c) != len(names) or any(watch.c.get(k) is not v for k, v in names.items()):
                    watch.touched = watch.touched or f"calling {name} changed the check's own variables"
                watch.verify(f"calling {name}", allowed)
            problem = watch.plain_problem(value)
            if problem is not None:
                raise AssertionError(f"{name} returned {problem}: return plain values, tensors, containers of "
                                     "them or the objects you were given")
            return value
        judged.__name__ = judged.__qualname__ = _getattr(f, "__name__", name)
        judged.__doc__ = _getattr(f, "__doc__", None)
        return judged

    def plain_problem(self, value, depth=0):
        """Why an answer's value may lie about comparison, or None: plain data, plain tensors, containers of them
        (any depth up to 6) and objects whose classes were there before the answers ran and, unless they are the
        libraries', redefine no comparison."""
        import collections.abc as abc

        import torch
        t = _type(value)
        if t in PLAIN or t in (torch.Tensor, torch.nn.Parameter, torch.Size, torch.dtype, torch.device):
            return None
        if _isinstance(value, torch.Tensor):
            return f"a tensor of class {t.__name__}, not torch.Tensor"
        for cls in t.__mro__[:-1]:   # the class first: an answer's own __iter__ or items() never runs
            made_here = _id(cls) not in self.known and not library_class(cls, self.roots)
            allowed = (_id(cls) in self.exported or issubclass(cls, torch.nn.Module)
                       or (issubclass(cls, tuple) and hasattr(cls, "_fields")))   # a namedtuple of the answer's
            if made_here and not allowed:
                return f"a {t.__name__}, a class of the answer's own"
            lying = [k for k in LYING if k in cls.__dict__]
            if lying and (made_here or cls.__module__.split(".")[0] not in TRUSTED_ROOTS):
                return f"a {t.__name__}, whose class redefines {lying[0]}"
        if _isinstance(value, abc.Iterator):
            return f"a {t.__name__}, an iterator: return a list"
        if _getattr(_getattr(value, "dtype", None), "hasobject", False):
            return "an array of Python objects"
        if _isinstance(value, (abc.Mapping, abc.Sequence, abc.Set)) and not _isinstance(value, (str, bytes)):
            if depth > 6:
                return "a container nested too deeply"
            items = list(value.items()) if _isinstance(value, abc.Mapping) else list(value)
            for item in items[:100000]:
                for v in (item if _isinstance(value, abc.Mapping) else (item,)):
                    problem = self.plain_problem(v, depth + 1)
                    if problem is not None:
                        return problem
        return None

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
                self.touched = f"a canary misbehaved: `{code}` {'passed' if failed is False else 'failed'}"
                raise Touched(self.touched)
