"""requirements.txt and environment.yml pin the same, exact versions -- and this environment has them."""
import re
import sys
from importlib.metadata import PackageNotFoundError, version

import pytest
import yaml

from utils.constants import REPO_ROOT as ROOT

PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==([A-Za-z0-9_.+\-]+)$")


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(lines) -> dict:
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = PIN.match(line)
        assert m, f"not an exact pin (use name==version): {line!r}"
        name = _canon(m.group(1))
        assert name not in pins, f"{name} pinned twice"
        pins[name] = m.group(2)
    return pins


def requirements() -> dict:
    return parse_pins((ROOT / "requirements.txt").read_text().splitlines())


def conda_env() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def conda_pip_pins() -> dict:
    pip_sections = [d["pip"] for d in conda_env()["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip: section"
    return parse_pins(pip_sections[0])


def test_requirements_are_exact_pins_and_torch_is_pinned():
    pins = requirements()
    assert pins.get("torch") == "2.13.0", "torch must be pinned to 2.13.0 (never unpinned)"
    for must in ("transformers", "trl", "peft", "bitsandbytes", "datasets", "accelerate", "matplotlib",
                 "papermill", "nbval", "jupyterlab", "ipykernel", "pytest"):
        assert must in pins, f"{must} missing from requirements.txt"


def test_environment_yml_agrees_with_requirements():
    req, env = requirements(), conda_pip_pins()
    only_req = sorted(set(req) - set(env))
    only_env = sorted(set(env) - set(req))
    differ = sorted(k for k in set(req) & set(env) if req[k] != env[k])
    assert not (only_req or only_env or differ), (
        f"requirements.txt and environment.yml disagree: only in requirements.txt {only_req}, "
        f"only in environment.yml {only_env}, different versions {[(k, req[k], env[k]) for k in differ]}")


def test_environment_yml_python_matches_tested_python():
    deps = [d for d in conda_env()["dependencies"] if isinstance(d, str)]
    py = [d for d in deps if d.startswith("python")]
    assert py == ["python=3.11"], f"environment.yml should pin python=3.11, found {py}"
    if sys.version_info[:2] != (3, 11):
        pytest.skip("pins were tested on Python 3.11")


def test_installed_versions_match_pins():
    """What the tests run against is what the pins say (so the pins were tested together)."""
    wrong = {}
    for name, pinned in requirements().items():
        try:
            have = version(name)
        except PackageNotFoundError:
            wrong[name] = (pinned, "not installed")
            continue
        if have.split("+")[0] != pinned:  # torch reports 2.13.0+cpu
            wrong[name] = (pinned, have)
    assert not wrong, f"installed versions differ from the pins: {wrong}; run `make setup`"
