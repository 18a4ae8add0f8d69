"""The judge: a grading run's cells in a plain Python process, the checks out of the answers' reach.

``grading.execute`` starts this file as a script (it imports nothing of the course, so that a
handout's own ``utils`` is the one its setup cells import), writes a nonce and the run's cells to
its standard input and reads its results from its standard output. It runs, in the lesson's order:

- the ``parameters`` cell, then the run's parameters, then the ``grader-setup`` cells, as written;
- each **answer** as the definitions it is: imports, ``def``/``class`` statements, assignments to
  names, and ``if``/``try``/``with`` blocks made only of those; any other top-level statement (a
  loop, a call, a patch) is not run and is reported as skipped. The checks see only the names the
  lab's stub of that cell defines (each function wrapped, see ``judge_watch.py``), never a module,
  builtin or setup name an answer rebinds;
- each **graded check**, compiled by the judge from the course's source, in a namespace of its own
  whose modules are copies of their attribute tables taken before any answer ran and whose
  builtins are a copy of that moment's. After every call of an answer function the judge compares
  what it took (``judge_watch.Watch``): student code that changed any of it has *touched the
  judge*, and the run stops and earns nothing. After every check, canaries must behave.
- a check's **hidden tests** run in a forked child of the judge: what an answer stores while they
  run (their arguments, their values) is gone with the child, and a failure there says only the
  exception's builtin type and, for the check's own ``assert``, the constant text of its message.

No IPython: no input or AST transformers, no traceback display, no ``In``/``Out``. Results go out
as JSON lines carrying the nonce; standard output and error are /dev/null for everything else.
What this cannot stop (code that searches the process's memory for the judge's own objects) is
said in ``docs/instructors.md``.
"""
import builtins
import json
import os
import signal
import sys
import time

_dumps, _exec, _compile, _isinstance, _type = json.dumps, builtins.exec, builtins.compile, isinstance, type
_signal, _setitimer, _fork, _pipe, _write, _read, _close = (signal.signal, signal.setitimer, os.fork, os.pipe,
                                                          os.write, os.read, os.close)
HERE = os.path.dirname(os.path.abspath(__file__))
_watch = {"__name__": "judge_watch", "__file__": os.path.join(HERE, "judge_watch.py")}
with open(_watch["__file__"], encoding="utf-8") as _f:
    _exec(_compile(_f.read(), _watch["__file__"], "exec"), _watch)
Watch, Touched = _watch["Watch"], _watch["Touched"]
KEPT = ("Import", "ImportFrom", "FunctionDef", "AsyncFunctionDef", "ClassDef", "Pass")
LIMITS = {}   # "message_chars": how much of a failure's message is said (set by run() from the spec)


# ----------------------------------------------------------------------------- answers as definitions
def _target_ok(node):
    kind = _type(node).__name__
    if kind in ("Tuple", "List"):
        return all(_target_ok(e) for e in node.elts)
    return kind == "Name" or (kind == "Starred" and _target_ok(node.value))


def _kept(node):
    """Whether a top-level statement of an answer is run: a definition, or a block made only of them."""
    kind = _type(node).__name__
    if kind in KEPT:
        return True
    if kind in ("Assign", "AnnAssign", "AugAssign"):
        return all(_target_ok(t) for t in (node.targets if kind == "Assign" else [node.target]))
    if kind == "Expr":
        return _type(node.value).__name__ == "Constant"   # a docstring
    if kind in ("If", "Try", "With"):
        parts = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
        parts += [s for h in getattr(node, "handlers", []) for s in h.body]
        return all(_kept(n) for n in parts)
    return False


def _definitions(source, filename):
    """(code of an answer's top-level definitions, line numbers of the statements left out)."""
    import ast
    tree = ast.parse(source, filename)
    kept = [n for n in tree.body if _kept(n)]
    skipped = [n.lineno for n in tree.body if not _kept(n)]
    tree.body = kept
    return _compile(tree, filename, "exec"), skipped


# ----------------------------------------------------------------------------- what a failure may say
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


def _hidden_message(source, line, own):
    """What a failure at ``line`` of a check's hidden tests may say: its type, and the assert's constant text."""
    import ast
    if own:
        for node in ast.walk(ast.parse(source)):
            if _type(node).__name__ in ("Assert", "Raise") and node.lineno <= line <= node.end_lineno:
                msg = node.msg if _type(node).__name__ == "Assert" else node.exc
                text = _static_text(msg) if msg is not None else ""
                if text:
                    return text
    return "a hidden test failed " + ("in the check" if own else "inside your code")


def _builtin_name(error):
    """The name of the nearest builtin class of an exception (an answer's own class may carry any name)."""
    for cls in _type(error).__mro__:
        if builtins.__dict__.get(cls.__name__) is cls:
            return cls.__name__
    return "Exception"


def _failure(error, filename, source, in_hidden):
    """(ename, message) of an exception a cell raised; in a check's hidden tests, nothing it computed."""
    tb, line, own = error.__traceback__, None, False
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line, own = tb.tb_lineno, tb.tb_next is None
        tb = tb.tb_next
    if in_hidden:
        ename = _builtin_name(error)
        return ename, _hidden_message(source, line or 0, own)
    text, limit = " ".join(str(error).split()), LIMITS["message_chars"]   # as grading.one_line, which checks it
    return _type(error).__name__[:100], text if len(text) <= limit else text[:limit - 1] + "…"


# ----------------------------------------------------------------------------- running cells
def _alarm(signum, frame):
    raise KeyboardInterrupt("the cell time limit")   # as a kernel's interrupt: an answer may swallow it


def _timed(code, namespace, seconds):
    _signal(signal.SIGALRM, _alarm)
    _setitimer(signal.ITIMER_REAL, seconds)
    try:
        _exec(code, namespace)
    finally:
        _setitimer(signal.ITIMER_REAL, 0)


def _check_parts(source, segments):
    """Each (code text, hidden) part of a check: its lines in place, the others blank (tracebacks keep their lines)."""
    lines = source.split("\n")   # as cells.hidden_parts counts them
    return [("\n" * a + "\n".join(lines[a:b]), hidden) for a, b, hidden in segments]


def _in_child(watch, code, filename, source, seconds):
    """Run a check's hidden part in a forked child within ``seconds``; its result as a dict, or raise Touched."""
    token = os.urandom(16).hex()
    r, w = _pipe()
    try:
        pid = _fork()
    except OSError:   # the process limit: the hidden tests cannot run, and the check fails
        _close(r)
        _close(w)
        return {"ename": "Exception", "message": "the hidden tests could not start (the run's process limit)"}
    if pid == 0:   # the child: what the hidden tests and the answers do here ends with it
        try:
            _close(r)
            try:
                _timed(code, watch.c, seconds)
                watch.verify("the hidden tests")
                out = {"ok": True}
            except Touched as t:
                out = {"touched": str(t)[:300]}
            except BaseException as e:  # noqa: BLE001 -- the hidden tests' failure, whatever it raised
                out = dict(zip(("ename", "message"), _failure(e, filename, source, True)))
            _write(w, _dumps({"token": token, **out}).encode())
        finally:
            os._exit(0)   # never back into the judge's loop: one judge says the results
    _close(w)
    chunks, size = [], 0
    while size <= 1 << 16 and (chunk := _read(r, 1 << 16)):
        chunks.append(chunk)
        size += len(chunk)
    _close(r)
    _, status = os.waitpid(pid, 0)
    try:
        out = json.loads(b"".join(chunks))
    except ValueError:
        out = None
    if not _isinstance(out, dict) or out.pop("token", None) != token:
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        out = {"ename": "Exception", "message": "the hidden tests did not finish (" + (
            "killed: the memory limit?" if killed else "the run ended inside them") + ")"}
    if "touched" in out:
        watch.touched = watch.touched or str(out["touched"])[:300]
        raise Touched(watch.touched)
    return out


def _cell(watch, cell, i):
    """Run one cell; returns its result fields (raises Touched)."""
    role, source, filename = cell["role"], cell["source"], f"<{cell['role']} {cell['grade_id'] or i}>"
    result, in_hidden = {}, False
    try:
        if role in ("parameters", "setup"):   # in the setup's namespace, which no answer writes
            before = dict(watch.s)
            _exec(_compile(source, filename, "exec"), watch.s)
            if role == "parameters":
                _exec(_compile(cell["injected"], "<parameters>", "exec"), watch.s)
            bound = [k for k, v in watch.s.items() if before.get(k, before) is not v and not k.startswith("__")]
            watch.setup_names += bound
            watch.setup_bound(bound)
        elif role == "answer":
            code, result["skipped"] = _definitions(source, filename)
            _timed(code, watch.g, watch.cell_timeout)
        else:   # the cell's time limit is for all its parts together
            deadline = time.monotonic() + watch.cell_timeout
            for text, hidden in _check_parts(source, cell["segments"]):
                in_hidden, left = hidden, max(0.05, deadline - time.monotonic())
                code = _compile(text, filename, "exec")
                if hidden:
                    outcome = _in_child(watch, code, filename, source, left)
                    if not outcome.get("ok"):
                        return {"ename": outcome.get("ename", "Exception"), "message": outcome.get("message", ""),
                                "hidden": True}
                else:
                    _timed(code, watch.c, left)
            in_hidden = False
    except Touched:
        raise
    except BaseException as e:  # noqa: BLE001 -- a cell's failure, whatever it raised, is its result
        result["ename"], result["message"] = _failure(e, filename, source, in_hidden)
        result["hidden"] = in_hidden
    finally:
        if role == "answer":
            for name, kind in cell["exports"].items():
                watch.export(name, kind)
            watch.verify(f"answer cell {cell['grade_id']}")
        elif role == "check":
            watch.verify(f"check {cell['grade_id']}")
            watch.canaries()
    return result


def run(spec, say):
    """Run the spec's cells in order, saying each one's start and result; the run stops when the judge is touched."""
    watch = Watch([os.path.dirname(HERE) + os.sep])
    watch.cell_timeout, watch.setup_names = spec["cell_timeout"], []
    LIMITS["message_chars"] = int(spec["message_chars"])
    for i, cell in enumerate(spec["cells"]):
        if cell["role"] in ("answer", "check") and watch.c is None:
            watch.take(watch.setup_names, [c["source"] for c in spec["cells"] if c["role"] == "check"])
        say(start=i)
        try:
            result = _cell(watch, cell, i)
        except Touched as e:
            say(touched=str(e)[:300])
            return
        say(cell=i, **result)
    say(done=True)


def main(argv):
    nonce = sys.stdin.readline().strip()
    spec = json.loads(sys.stdin.read())   # read whole before any cell runs: the run never sees the hidden tests
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    write = out.write

    def say(**fields):
        write(_dumps({"nonce": nonce, **fields}) + "\n")
    os.chdir(argv[0])
    sys.argv = ["judge"]
    run(spec, say)
    out.flush()
    os._exit(0)   # no interpreter shutdown: nothing an answer registered at exit runs after the results
