"""A student repository without the answers of the labs it withholds (``make handout``).

Usage (from the repository root)::

    python -m utils handout --out ../week4 --withhold 04 --labs 01 02 03 04   # labs 01-04; lesson 04's answers out
    python -m utils handout --out ../week9 --withhold 09                       # every lab; lesson 09's answers out

(Withholding 04 with every lab is refused: labs 05 and 07 import lesson 04's answers; the refusal says so.)

The handout holds the labs (student editions), the modules of ``utils/`` that the labs, the runner
(``python -m utils run``) and the answers it holds import, followed through every import
(:func:`student_utils`), the embedded model, the pinned requirements and a README for students. A lesson
module stays out unless something the handout holds imports it (``utils/ppo.py``, lesson 07's, computes
lesson 04's clipped surrogate in other words, which the verbatim search below cannot see). Of the answers
(``utils/solutions/``) it holds those its labs import and those of its own labs that are not withheld
(:func:`shipped_solutions`): a later lab's answers stay out. It leaves out the lessons (``notebooks/``: they
hold every answer), the tests, the grader and the other instructor tools.

It refuses, naming the dependency, when a lab it would hold (or a module of ``utils`` it copies)
imports an answer it withholds: lesson 05 uses lesson 04's ``group_advantages``, so withholding 04
means leaving lab 05 out (``--labs``) or handing it out later. Before it writes anything it also
checks that no function body of a withheld answer appears anywhere in the handout, under any name
(:func:`leaks`).
"""
from __future__ import annotations

import argparse
import ast
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

from ..constants import REPO_ROOT, SOLUTIONS_DIR, UTILS_DIR
from . import readme
from .cells import LabError, exercise_of, is_answer
from .labs import lab_text, lesson_paths
from .lessons import lesson_number
from .solutions import answer_source, module_name, needed_answers, parse_source, solution_imports

# What of utils/ a student needs: what these and the labs import, the packages they import whole, the folders of
# data (the embedded model); no instructor tools. A lesson module nothing in the handout imports stays out: a later
# lesson's helper may compute an earlier answer in other words (utils/ppo.py's policy_loss is lesson 04's clipped
# surrogate, per token), which leaks() cannot see.
STUDENT_ENTRY_POINTS = ("__init__.py", "__main__.py", "course/__init__.py", "course/run.py")   # python -m utils run
# the docs: the labs link them
TOP_FILES = ("requirements.txt", "environment.yml", ".gitignore", "docs/students.md", "docs/gpu.md")


class HandoutError(ValueError):
    """A handout that would give away a withheld answer, or that cannot be made as asked."""


# ----------------------------------------------------------------------------- what depends on which answers
def _answer_functions(lesson_path: Path):
    """``(answer cell, function node)`` for every function a lesson's answer cells define."""
    for cell in nbformat.read(lesson_path, as_version=4).cells:
        if is_answer(cell) and (tree := parse_source(answer_source(cell))) is not None:
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield cell, node


def exercises_of(lesson_path: Path) -> dict[str, str]:
    """``{function name: exercise id}`` for the functions a lesson's answer cells define."""
    return {node.name: exercise_of(cell) for cell, node in _answer_functions(lesson_path)}


# ----------------------------------------------------------------------------- finding an answer's body
class _Canonical(ast.NodeTransformer):
    """Renames every variable, argument and function to its order of appearance: v0, v1, ..."""

    def __init__(self):
        self.names: dict[str, str] = {}

    def _name(self, name: str) -> str:
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id=self._name(node.id), ctx=node.ctx), node)

    def visit_arg(self, node):
        return ast.copy_location(ast.arg(arg=self._name(node.arg), annotation=None), node)

    def visit_FunctionDef(self, node):
        node.name = "f"
        node.returns = None
        return self.generic_visit(node)


def _body(statements: list[ast.stmt]) -> list[ast.stmt]:
    """Statements without a leading docstring."""
    if statements and isinstance(statements[0], ast.Expr) and isinstance(statements[0].value, ast.Constant) \
            and isinstance(statements[0].value.value, str):
        return statements[1:]
    return statements


def _shape(statement: ast.stmt) -> str:
    """A statement with every name blanked: equal shapes are a cheap first test before :func:`fingerprint`."""
    tree = ast.parse(ast.unparse(statement)).body[0]
    for node in ast.walk(tree):
        for field in ("id", "arg", "name"):
            if isinstance(getattr(node, field, None), str) and not isinstance(node, ast.alias):
                setattr(node, field, "_")
    return ast.dump(tree, annotate_fields=False)


def fingerprint(statements: list[ast.stmt]) -> str:
    """A statement list, docstring dropped and every name canonical: equal for the same code renamed."""
    module = ast.Module(body=[_Canonical().visit(ast.parse(ast.unparse(s)).body[0]) for s in _body(statements)],
                        type_ignores=[])
    return ast.dump(module, annotate_fields=False)


def _statement_lists(tree: ast.AST):
    """Every list of statements in ``tree``: the module's, each function's, each block's."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def answer_bodies(lesson_path: Path) -> dict[str, tuple[tuple[str, ...], str]]:
    """``{"lesson04.group_advantages": (shapes, fingerprint)}`` of the body of each of a lesson's answer functions."""
    return {f"{module_name(lesson_path.stem)}.{node.name}": (tuple(_shape(s) for s in _body(node.body)),
                                                            fingerprint(node.body))
            for _, node in _answer_functions(lesson_path) if _body(node.body)}


def _sources(root: Path):
    """``(where, Python source)`` for every .py file and every notebook code cell under ``root``."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".py":
            yield rel, path.read_text(encoding="utf-8", errors="replace")
        elif path.suffix == ".ipynb":
            for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
                if cell.cell_type == "code":
                    yield f"{rel}, cell {i + 1}", cell.source


def leaks(root: Path, lesson_paths_withheld: list[Path]) -> list[str]:
    """Where, under ``root``, the body of a withheld answer appears: as a whole function body or as a run of
    statements anywhere, under any names (compared by :func:`fingerprint`). Empty when nothing leaks."""
    wanted = {}   # shapes -> [(fingerprint, name)]
    for path in lesson_paths_withheld:
        for name, (shapes, print_) in answer_bodies(path).items():
            wanted.setdefault(shapes, []).append((print_, name))
    lengths = {len(shapes) for shapes in wanted}
    found = []
    for where, source in _sources(Path(root)):
        tree = parse_source(source)
        if tree is None or not wanted:
            continue
        for block in _statement_lists(tree):
            body = _body(block)
            shapes = [_shape(s) for s in body]
            for n in lengths:
                for start in range(0, len(body) - n + 1):
                    for print_, name in wanted.get(tuple(shapes[start:start + n]), []):
                        if fingerprint(body[start:start + n]) == print_:
                            found.append(f"{where}: the body of {name}")
    return sorted(set(found))


# ----------------------------------------------------------------------------- building it
def _plan(withhold: list[str], labs: list[str] | None) -> tuple[list[Path], list[Path]]:
    """(lessons whose labs go in, lessons withheld), checked for the dependencies; raises HandoutError."""
    withheld = lesson_paths(withhold) if withhold else []
    included = lesson_paths(labs) if labs else lesson_paths()
    numbers = {lesson_number(p): p for p in lesson_paths()}
    withheld_modules = {module_name(p.stem): p for p in withheld}
    problems, blocked = [], set()
    for lesson in included:
        lab = nbformat.reads(lab_text(lesson), as_version=4)
        for module, where, names in needed_answers(lab):
            if module in withheld_modules:
                source = withheld_modules[module]
                exercises = exercises_of(source)
                what = ", ".join(f"{n} (exercise {exercises.get(n, '?')})" for n in names) if names != ["*"] \
                    else "its answers"
                number = lesson_number(source)
                problems.append(f"lab {lesson.stem} ({where}) imports {what} from utils.solutions.{module}, "
                                f"lesson {number}'s answers, which --withhold {number} leaves out")
                blocked.add(lesson)
            elif module.startswith("lesson") and module[6:] not in numbers:
                problems.append(f"lab {lesson.stem} ({where}) imports utils.solutions.{module}, which no lesson has")
    for path in sorted(UTILS_DIR.rglob("*.py")):
        rel = path.relative_to(UTILS_DIR)
        if rel.parts[0] in ("solutions", "course") or (tree := parse_source(path.read_text())) is None:
            continue
        for module, _ in solution_imports(tree):
            if module in withheld_modules:
                problems.append(f"utils/{rel.as_posix()} imports utils.solutions.{module}, which is withheld")
    if problems:
        without = [lesson_number(p) for p in included if p not in blocked]
        raise HandoutError("this handout would need answers it withholds:\n  - " + "\n  - ".join(problems)
                           + "\nLeave those labs out (e.g. --labs " + " ".join(without) + "), or hand them out "
                           "once the answers they use may be seen (leave that lesson out of --withhold).")
    return included, withheld


def _module_files(parts: list[str]) -> list[Path]:
    """The files of ``utils/`` behind a dotted name (``["utils", "ppo", "policy_loss"]``): the longest prefix that
    is a module or a package, with the ``__init__.py`` of the packages it is in; a package of ``utils/`` other than
    ``course/`` and ``solutions/`` comes whole (``presets`` imports its own modules by name). Empty for a name
    outside ``utils``."""
    while len(parts) > 1 and parts[0] == "utils":
        path = UTILS_DIR.joinpath(*parts[1:])
        found = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
        if found.is_file():
            top = UTILS_DIR / parts[1]
            if top.is_dir() and parts[1] not in ("course", "solutions"):
                return sorted(top.glob("*.py"))
            return [found] + [p / "__init__.py" for p in found.parents if UTILS_DIR in p.parents]
        parts = parts[:-1]
    return [UTILS_DIR / "__init__.py"] if parts == ["utils"] else []


def utils_imports(source: str, package: list[str]) -> set[Path]:
    """Files of ``utils/`` that ``source`` imports (absolute, or relative to the dotted ``package`` it is in), at any
    depth of the code (imports inside functions count)."""
    tree, found = parse_source(source), set()
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.update(_module_files(alias.name.split(".")))
        elif isinstance(node, ast.ImportFrom):
            base = (package[:len(package) - node.level + 1] if node.level else []) + \
                (node.module.split(".") if node.module else [])
            for alias in node.names:
                found.update(_module_files(base + [alias.name]) or _module_files(base))
    return found


def shipped_solutions(included: list[Path], withheld: list[Path]) -> list[Path]:
    """The answer modules a handout holds: those its labs import, and those of its own labs that are not withheld;
    never a later lab's answers it does not hand out (they would spoil that lab, and can hold an earlier answer in
    other words: lesson 07's ``gradient_coefficients`` computes lesson 04's group advantages)."""
    wanted = {module_name(p.stem) for p in included}
    for lesson in included:
        wanted.update(module for module, _, _ in needed_answers(nbformat.reads(lab_text(lesson), as_version=4)))
    wanted -= {module_name(p.stem) for p in withheld}
    return [SOLUTIONS_DIR / "__init__.py"] + [SOLUTIONS_DIR / f"{m}.py" for m in sorted(wanted)
                                               if (SOLUTIONS_DIR / f"{m}.py").is_file()]


def student_utils(included: list[Path], answers: list[Path]) -> list[Path]:
    """The Python files of ``utils/`` (``solutions/`` aside) a handout of the labs of ``included`` and the answer
    modules ``answers`` (:func:`shipped_solutions`) needs: the entry points, what the labs and the answers
    import, and everything those import in turn."""
    todo = [UTILS_DIR / p for p in STUDENT_ENTRY_POINTS]
    for path in answers:
        todo += utils_imports(path.read_text(encoding="utf-8"), ["utils", "solutions"])
    for lesson in included:
        for cell in nbformat.reads(lab_text(lesson), as_version=4).cells:
            if cell.cell_type == "code":
                todo += utils_imports(cell.source, [])
    needed = set()
    while todo:
        path = todo.pop()
        if path in needed or "solutions" in path.relative_to(UTILS_DIR).parts:
            continue
        needed.add(path)
        package = ["utils", *path.relative_to(UTILS_DIR).parent.parts]
        todo += utils_imports(path.read_text(encoding="utf-8"), package)
    return sorted(needed)


def _copy_utils(dest: Path, withheld: list[Path], included: list[Path]) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    answers = shipped_solutions(included, withheld)
    (dest / "utils").mkdir(parents=True)
    for path in student_utils(included, answers):
        target = dest / "utils" / path.relative_to(UTILS_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    for entry in sorted(UTILS_DIR.iterdir()):   # folders of data: the embedded model, the measured presets
        if entry.is_dir() and entry.name != "__pycache__" and not (entry / "__init__.py").exists():
            shutil.copytree(entry, dest / "utils" / entry.name, ignore=ignore)
        elif entry.is_file() and entry.suffix != ".py":
            shutil.copy2(entry, dest / "utils" / entry.name)
    (dest / "utils" / "solutions").mkdir()
    for path in answers:
        shutil.copy2(path, dest / "utils" / "solutions" / path.name)


def _readme(included: list[Path], withheld: list[Path]) -> str:
    labs = "\n".join(f"- `labs/{p.name}`" + (" (graded: its answers are not in this repository)"
                                             if p in withheld else "") for p in included)
    example = f"labs/{included[-1].name}"
    return f"""# LLM post-training labs

Your labs:

{labs}

## Set up

With Python 3.11:

```bash
python3 -m venv .venv && .venv/bin/pip install -r requirements.txt   # or: conda env create -f environment.yml
.venv/bin/jupyter lab labs/
```

Every lab runs on a laptop CPU with the embedded tiny model (`PRESET = "auto"` picks it), and on a
Colab T4 or a 24 GB / 80 GB GPU with a real Qwen model. In China, set `HF_ENDPOINT=https://hf-mirror.com`.
`docs/students.md` says how on each (Colab, AutoDL, a laptop) and which preset to pick; `docs/gpu.md` has
what each preset costs; `docs/exercises.md` lists every exercise with its graded check and points.

## Work on a lab

Each exercise is a function whose body raises `NotImplementedError`: write it, then run the graded
check right after it. Keep everything an answer needs inside its answer cell. Long GPU runs survive a
closed browser tab when started from a terminal:

```bash
nohup .venv/bin/python -m utils run {example} --preset 24g &    # the executed copy goes to runs/24g/
```

## Hand in

The **executed** notebook, under its own name. Your instructor re-runs your answers and the checks on
the tiny model; the numbers and figures of your own run are read from the notebook you hand in.
"""


def build(out, withhold=(), labs=None, force: bool = False) -> dict:
    """Write the handout to ``out``; returns ``{"labs", "withheld", "files"}``. Raises HandoutError (and
    writes nothing) when a lab needs a withheld answer, or when ``out`` exists and ``force`` is not set."""
    out = Path(out).resolve()
    if out == REPO_ROOT or REPO_ROOT in out.parents:
        raise HandoutError(f"--out {out} is inside the course repository; write the handout somewhere else")
    if out.exists() and any(out.iterdir()) and not force:
        raise HandoutError(f"{out} exists and is not empty; choose another folder or pass --force to replace it")
    included, withheld = _plan(list(withhold), list(labs) if labs else None)
    with tempfile.TemporaryDirectory(prefix="handout-", dir=out.parent if out.parent.exists() else None) as tmp:
        stage = Path(tmp) / "handout"
        (stage / "labs").mkdir(parents=True)
        for lesson in included:
            (stage / "labs" / lesson.name).write_text(lab_text(lesson), encoding="utf-8")
        _copy_utils(stage, withheld, included)
        for name in TOP_FILES:
            if (REPO_ROOT / name).exists():
                (stage / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO_ROOT / name, stage / name)
        (stage / "README.md").write_text(_readme(included, withheld), encoding="utf-8")
        (stage / "docs").mkdir(exist_ok=True)
        (stage / "docs" / "exercises.md").write_text(readme.exercise_index(student=True, selected=included),
                                                     encoding="utf-8")
        found = leaks(stage, withheld)
        if found:   # a helper that copies an answer: a bug of the course, never handed out
            raise HandoutError("a withheld answer appears in the handout:\n  - " + "\n  - ".join(found))
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(stage), str(out))
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    return {"labs": [p.stem for p in included], "withheld": [p.stem for p in withheld], "files": files}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils handout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the folder to write (outside this repository)")
    parser.add_argument("--withhold", nargs="*", default=[], metavar="NN",
                        help="lessons whose answers stay out (the labs being graded)")
    parser.add_argument("--labs", nargs="*", default=None, metavar="NN", help="the labs to hand out (default: all)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = parser.parse_args(argv)
    try:
        report = build(args.out, args.withhold, args.labs, args.force)
    except (HandoutError, LabError, LookupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    withheld = ", ".join(report["withheld"]) or "none"
    print(f"wrote {args.out}: {len(report['labs'])} labs ({', '.join(report['labs'])}), answers withheld: "
          f"{withheld}; {len(report['files'])} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
