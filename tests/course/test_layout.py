"""The shape of ``utils/``: who imports whom, one place per constant, short files, a clean linter."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from utils.constants import REPO_ROOT, UTILS_DIR

MAX_LINES = 450


def modules() -> dict[str, Path]:
    """``{"utils.presets.measured": path, ...}`` for every module of utils."""
    out = {}
    for path in sorted(UTILS_DIR.rglob("*.py")):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path) -> set[str]:
    """The utils modules ``name`` imports, anywhere in the file (inside functions too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    known = modules()
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    return {name: imports_of(name, path) for name, path in modules().items()}


def is_lesson_module(name: str) -> bool:
    """What a lesson imports: utils and its modules, except the course tooling and the generated answers."""
    return not name.startswith(("utils.course", "utils.solutions", "utils.__main__"))


def test_no_import_cycle():
    edges = graph()
    # a package importing its own submodules (utils.presets -> utils.presets.lesson04) is not a cycle of modules
    edges = {a: {b for b in bs if not b.startswith(a + ".")} for a, bs in edges.items()}
    done, stack = set(), []

    def visit(node):
        if node in stack:
            pytest.fail("import cycle: " + " -> ".join(stack[stack.index(node):] + [node]))
        if node in done:
            return
        stack.append(node)
        for nxt in sorted(edges[node]):
            visit(nxt)
        stack.pop()
        done.add(node)

    for node in sorted(edges):
        visit(node)


def test_lesson_modules_never_import_the_tooling_or_the_answers():
    bad = {(a, b) for a, bs in graph().items() if is_lesson_module(a) for b in bs if not is_lesson_module(b)}
    assert not bad, f"a lesson module imports course tooling or an answer: {sorted(bad)}"


def test_tooling_is_apart():
    """The course tooling lives in utils/course; what is left at the top of utils is what lessons import."""
    top = {p.stem for p in UTILS_DIR.glob("*.py")} - {"__init__", "__main__"}
    assert top == {"agent", "constants", "data", "dpo", "evaluation", "headlines", "plots", "ppo", "quant", "records",
                   "rewards", "rl", "runtime", "sft", "stubs", "tools", "training", "ttc", "verl_export"}, top
    notebooks = " ".join(p.read_text() for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))
    reexported = {"records": "utils.record(", "headlines": "utils.headline(",   # utils/__init__.py
                  "stubs": "import utils"}                                    # which registers it in the kernel
    for name in top - {"constants"}:
        assert f"{name}." in notebooks or f"import {name}" in notebooks or reexported.get(name, "?") in notebooks, \
            f"no lesson uses utils.{name}"


@pytest.mark.parametrize("path", sorted(UTILS_DIR.rglob("*.py")), ids=lambda p: p.relative_to(UTILS_DIR).as_posix())
def test_no_file_is_too_long(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def _string_constants(path: Path) -> list[str]:
    """String literals of a module, docstrings excluded."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


@pytest.mark.parametrize("literal", ["openai/gsm8k", "injected-parameters", "papermill-error-cell-tag", "grader-setup",
                                     "tiny-qwen (embedded)", "twin-measurements.json", "[0-9][0-9]_*.ipynb"])
def test_each_constant_is_defined_once(literal):
    where = [p.relative_to(REPO_ROOT).as_posix() for p in UTILS_DIR.rglob("*.py")
             if any(literal == s or (len(literal) > 12 and literal in s) for s in _string_constants(p))]
    assert where == ["utils/constants.py"], where


def test_paths_come_from_constants():
    where = [p.relative_to(REPO_ROOT).as_posix() for p in UTILS_DIR.rglob("*.py") if "Path(__file__)" in p.read_text()]
    assert where == ["utils/constants.py"], where


def test_no_dangling_reference_to_the_conventions_file():
    """The contract the code relies on is docs/notebook-contract.md, in the repository."""
    assert (REPO_ROOT / "docs" / "notebook-contract.md").is_file()
    files = [*UTILS_DIR.rglob("*.py"), *(REPO_ROOT / "tests").rglob("*.py"), REPO_ROOT / "README.md",
             *(REPO_ROOT / "notebooks").glob("*.ipynb"), REPO_ROOT / "Makefile"]
    assert not [p for p in files if "CONVENTIONS" + ".md" in p.read_text()]


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is pinned in requirements.txt: make setup"
    run = subprocess.run([ruff, "check", "--no-cache", str(REPO_ROOT)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
