"""utils.course.speed: the grader's time limits stretch with the machine's measured slowdown."""
import nbformat
import pytest

from utils.course import grading, speed


def test_slowdown_is_at_least_one_and_follows_the_workloads_time(monkeypatch):
    monkeypatch.setattr(speed, "_last", None)
    assert speed.measure() > 0 and 1.0 <= speed.slowdown() <= speed.MAX_SLOWDOWN
    for ratio, expected in ((2.5, 2.5), (0.4, 1.0), (9.0, speed.MAX_SLOWDOWN)):   # faster: as set; capped
        monkeypatch.setattr(speed, "_last", None)
        monkeypatch.setattr(speed, "measure", lambda rounds=speed.ROUNDS, r=ratio: r * speed.REFERENCE_S)
        assert speed.slowdown() == expected


def test_one_measurement_serves_the_calls_of_the_next_seconds_and_threads_take_turns(monkeypatch):
    import threading
    import time

    monkeypatch.setattr(speed, "_last", None)
    calls, inside = [], []

    def measure(rounds=speed.ROUNDS):
        inside.append(1)
        assert len(inside) == 1, "two measurements at once"
        time.sleep(0.05)
        calls.append(1)
        inside.pop()
        return 2 * speed.REFERENCE_S

    monkeypatch.setattr(speed, "measure", measure)
    threads = [threading.Thread(target=speed.slowdown) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and speed.slowdown() == 2.0
    monkeypatch.setattr(speed, "_last", (time.monotonic() - speed.SHARED_S - 1, 2.0))   # an old measurement
    speed.slowdown()
    assert calls == [1, 1]


@pytest.mark.parametrize("seconds,factor,expected", [(30, 1.0, 30), (30, 1.45, 44), (8, 2.0, 16), (0.6, 1.0, 1)])
def test_scaled_rounds_up_to_whole_seconds(seconds, factor, expected):
    assert speed.scaled(seconds, factor) == expected


def _notebook(*cells):
    """A grading notebook: (role, source) cells; a check is worth one point."""
    nb = nbformat.v4.new_notebook()
    for i, (role, source) in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["grading"] = {"role": role, "grade_id": f"x-{i}"}
        if role == "check":
            cell.metadata["nbgrader"] = {"grade": True, "points": 1, "grade_id": f"x-{i}"}
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.mark.slow
def test_a_busy_machine_stretches_the_cell_limit_of_a_grading_run(monkeypatch, tmp_path):
    """A check that takes 1.5 s, under a 1 s cell limit: timed out on the reference machine, passed where the
    machine measures twice as slow (the limit becomes 2 s)."""
    gnb = _notebook(("check", "import time\ntime.sleep(1.5)"))
    runs = {}
    for factor in (1.0, 2.0):
        monkeypatch.setattr(speed, "slowdown", lambda f=factor: f)
        runs[factor] = grading.execute(gnb, nbformat.v4.new_notebook(), tmp_path / str(factor), timeout=60,
                                       cell_timeout=1)
    slow, ok = runs[1.0]["checks"]["x-0"], runs[2.0]["checks"]["x-0"]
    assert not slow["passed"] and "timed out after 1 s" in slow["message"], slow
    assert ok["passed"], ok
    assert runs[2.0]["limits_scaled_by"] == 2.0
