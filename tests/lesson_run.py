"""Shared by the lesson tests: run one lesson on `tiny` under papermill and read its records."""
import pytest

from utils import read_records
from utils.run import main as run_main


def lesson_records(lesson: str, tmp_path_factory) -> dict:
    """Execute lesson ``lesson`` ("01", ...) with ``python -m utils.run`` into a temporary folder."""
    out = tmp_path_factory.mktemp("runs")
    assert run_main([lesson, "--preset", "tiny", "--out", str(out)]) == 0, f"lesson {lesson} failed; see {out}/run.log"
    (nb,) = out.glob(f"{lesson}_*.ipynb")
    return read_records(nb)


def records_fixture(lesson: str):
    """A module-scoped ``records`` fixture for lesson ``lesson``: ``records = records_fixture("04")``."""
    @pytest.fixture(scope="module")
    def records(tmp_path_factory):
        return lesson_records(lesson, tmp_path_factory)
    return records
