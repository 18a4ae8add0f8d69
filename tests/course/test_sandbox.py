"""The grader's sandbox (bubblewrap) on its own: what code inside it can see, reach and use.

Every test runs a few lines of Python in a sandbox as the grader makes it (``sandbox.command``)
and checks the outcome from outside. None skips: without ``bwrap`` they fail with the way to
install it (``make setup`` does). The red-team class graded end to end is ``tests/course/test_redteam.py``.
"""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests import grading_fixtures
from utils.constants import NOTEBOOKS_DIR, REPO_ROOT, SOLUTIONS_DIR, UTILS_DIR
from utils.course import grading, sandbox


@pytest.fixture(scope="module")
def box():
    try:
        return sandbox.find()
    except sandbox.SandboxUnavailable as e:
        pytest.fail(f"no sandbox on this machine: {e}")


PRELUDE = """
def write(path, text="x"):  # "written", or the error that stopped it
    try:
        with open(path, "a") as f:
            f.write(text)
        return "written"
    except OSError as e:
        return type(e).__name__
"""


def inside(box, code, scratch, lesson="01", timeout=60):
    """Run ``code`` in a sandbox (with its own cgroups) and return (exit status, stdout parsed as JSON or text)."""
    conf = sandbox.Confinement(box, f"test-{os.getpid()}-{scratch.name}")
    try:
        cmd = sandbox.command(box, [sys.executable, "-c", PRELUDE + textwrap.dedent(code)], scratch=scratch,
                              env=grading.kernel_env(sandbox.SCRATCH), empty_dirs=[NOTEBOOKS_DIR], lesson=lesson,
                              cgroup_procs=conf.procs)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
        oom = conf.oom_kills()
    finally:
        conf.close()
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        out = proc.stdout
    return proc.returncode, out, oom


def test_the_course_and_python_are_read_only_and_nothing_else_is_there(box, tmp_path):
    rc, out, _ = inside(box, f"""
        import json, os, sys
        print(json.dumps({{
            "utils": write("{UTILS_DIR / 'rewards.py'}"), "lesson": write("{NOTEBOOKS_DIR / '01_sft_from_scratch.ipynb'}"),
            "venv": write(os.path.join(sys.prefix, "pyvenv.cfg")), "root_csv": write("{REPO_ROOT / 'grades.csv'}"),
            "scratch": write("/scratch/mine.txt"), "tmp": write("/tmp/mine.txt"),
            "repo": sorted(os.listdir("{REPO_ROOT}")), "solutions": sorted(os.listdir("{SOLUTIONS_DIR}")),
            "etc": sorted(os.listdir("/etc")), "home": os.environ["HOME"]}}))
    """, tmp_path)
    assert rc == 0, out
    assert out["utils"] != "written" and out["lesson"] != "written" and out["venv"] != "written"
    assert out["root_csv"] != "written" and out["scratch"] == out["tmp"] == "written"
    assert set(out["repo"]) <= {"utils", "notebooks", ".venv"}, out["repo"]   # no .git, tests, labs, runs, bench
    assert out["solutions"] == ["__init__.py"], "lab 01 sees no reference solution"
    assert "shadow" not in out["etc"] and out["home"].startswith(str(sandbox.SCRATCH))
    assert (tmp_path / "mine.txt").is_file() and (tmp_path / "tmp" / "mine.txt").is_file()


def test_a_lab_sees_only_the_solutions_of_earlier_lessons(box, tmp_path):
    rc, out, _ = inside(box, f"import json, os; print(json.dumps(sorted(os.listdir('{SOLUTIONS_DIR}'))))",
                        tmp_path, lesson="05")
    assert rc == 0 and out == ["__init__.py", "lesson01.py", "lesson02.py", "lesson03.py", "lesson04.py"]


def test_no_secret_no_home_no_network(box, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text("hf_planted_secret")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_TOKEN", "hf_env_secret")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with grading_fixtures.loopback_listener() as (port, accepted):
        rc, out, _ = inside(box, f"""
            import json, os, socket
            def read(path):
                try:
                    return open(path).read()
                except OSError as e:
                    return type(e).__name__
            def connect():
                try:
                    socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"hello")
                    return "connected"
                except OSError as e:
                    return type(e).__name__
            print(json.dumps({{"env": dict(os.environ), "token": read("{home}/.cache/huggingface/token"),
                               "my_home_token": read(os.path.expanduser("~/.cache/huggingface/token")),
                               "connect": connect(), "hostname": socket.gethostname()}}))
        """, scratch)
    assert rc == 0, out
    assert "hf_env_secret" not in json.dumps(out) and "hf_planted_secret" not in json.dumps(out)
    assert set(out["env"]) <= set(grading.kernel_env(sandbox.SCRATCH)) | {"PWD", "LC_CTYPE"}, out["env"]
    assert out["connect"] != "connected" and accepted == [], "the host's loopback listener was reached"


def test_every_process_dies_with_the_sandbox(box, tmp_path):
    marker = f"sandbox-orphan-{os.getpid()}"
    rc, out, _ = inside(box, f"""
        import os, subprocess, sys
        subprocess.Popen(["setsid", sys.executable, "-c", "import os, time\\nif os.fork(): os._exit(0)\\n"
                          "os.setsid(); time.sleep(600)  # {marker}"], start_new_session=True)
        print('"started"')
    """, tmp_path)
    assert rc == 0 and out == "started"
    time.sleep(0.5)
    left = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, marker)]
    assert left == [], f"processes outlived the sandbox: {left}"


def _cmdline_has(pid, marker):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except OSError:
        return False


def test_limits_stop_a_fork_bomb_a_memory_hog_and_a_huge_file(box, tmp_path):
    assert "NOT ENFORCED" not in box.describe(), box.describe()
    rc, out, _ = inside(box, f"""
        import json, os, time
        children, refused = [], None
        for _ in range({sandbox.DEFAULT_PROCESSES * 2}):
            try:
                pid = os.fork()
            except OSError as e:
                refused = type(e).__name__
                break
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            children.append(pid)
        written, error = 0, None
        try:
            with open("/scratch/big.bin", "wb") as f:
                for _ in range(5 * 1024):  # 5 GiB in MiB chunks
                    f.write(b"\\0" * (1 << 20))
                    written += 1 << 20
        except OSError as e:
            error = type(e).__name__ + str(e.errno)
        print(json.dumps({{"forked": len(children), "refused": refused, "written": written, "error": error}}))
    """, tmp_path)
    assert rc == 0, out
    assert out["refused"] == "BlockingIOError" and out["forked"] < sandbox.DEFAULT_PROCESSES
    assert out["error"] == "OSError27" and out["written"] <= box.limits.file_size  # EFBIG at the file limit
    rc, out, oom = inside(box, """
        try:
            x = bytearray(10 * 2**30)
            print('"allocated"')
        except MemoryError:
            print('"MemoryError"')
    """, tmp_path)
    assert (oom >= 1 and rc != 0) or (rc == 0 and out == "MemoryError"), (rc, out, oom)


def test_without_bwrap_the_grader_refuses_and_says_how_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        sandbox.find()
    from utils.course import grade
    (tmp_path / "subs").mkdir()
    assert grade.main([str(tmp_path / "subs"), "--lab", "01"]) == 2
    err = capsys.readouterr().err
    assert "bubblewrap" in err and "--no-sandbox" in err


def test_without_a_cgroup_memory_is_limited_per_process(box, tmp_path):
    # An instructor who is not root (and has no delegated cgroup v2) gets rlimits instead of cgroups.
    bare = dataclasses.replace(box, cgroups={}, enforced=sandbox._enforcement({}))
    assert "address-space rlimit" in bare.describe()
    rc, out, oom = inside(bare, """
        try:
            x = bytearray(3 * 2**30)
            print('"allocated"')
        except MemoryError:
            print('"MemoryError"')
    """, tmp_path)
    assert rc == 0 and out == "MemoryError" and oom == 0


def test_dev_is_read_only_its_shm_in_the_scratch_and_no_nested_user_namespace(box, tmp_path):
    rc, out, _ = inside(box, """
        import json, subprocess
        nested = subprocess.run(["unshare", "--user", "true"], capture_output=True).returncode
        print(json.dumps({"null": write("/dev/null"), "dev": write("/dev/new"), "shm": write("/dev/shm/seg"),
                          "nested_userns": nested}))
    """, tmp_path)
    assert rc == 0, out
    assert out["null"] == "written" and out["dev"] != "written" and out["shm"] == "written"
    assert (tmp_path / "shm" / "seg").is_file(), "/dev/shm is counted with the scratch"
    if box.no_nested_userns:
        assert out["nested_userns"] != 0


def test_cgroup_v2_runs_go_under_the_deepest_ancestor_that_delegates(tmp_path):
    own = "user.slice/user-1000.slice/user@1000.service/app.slice/term.scope"
    for depth, controllers in [(0, "cpu memory pids"), (3, "memory pids"), (4, ""), (5, "")]:
        d = tmp_path.joinpath(*own.split("/")[:depth])
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.subtree_control").write_text(controllers)
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids")
    found = sandbox._own_cgroups(f"0::/{own}\n", root=tmp_path)
    service = tmp_path / "user.slice/user-1000.slice/user@1000.service"
    assert found == {"pids": ("v2", service), "memory": ("v2", service), "cpu": ("v2", tmp_path)}
    v1 = "12:pids:/a\n4:memory:/b\n0::/\n"
    (tmp_path / "pids" / "a").mkdir(parents=True)
    (tmp_path / "memory" / "b").mkdir(parents=True)
    found = sandbox._own_cgroups(v1, root=tmp_path)
    assert found["pids"] == ("v1", tmp_path / "pids" / "a") and found["memory"] == ("v1", tmp_path / "memory" / "b")


def test_what_a_run_leaves_is_read_safely(tmp_path):
    # Its JSON: a pathological file is refused within limits, not parsed in the grader.
    flood = b"[" + b"{}," * (1 << 20) + b"{}]"
    assert len(grading.parse_untrusted_json(flood)) == (1 << 20) + 1
    with pytest.raises(ValueError):
        grading.parse_untrusted_json(flood, memory=64 << 20)
    with pytest.raises(ValueError):
        grading.parse_untrusted_json(b"[" * 100_000 + b"]" * 100_000)
    # Its folders: counted whatever their depth, removed whatever their permissions.
    deep = tmp_path / "scratch"
    os.makedirs(deep)
    here = os.getcwd()
    try:
        os.chdir(deep)
        for _ in range(3000):
            os.mkdir("d")
            os.chdir("d")
        os.chmod(".", 0)
    finally:
        os.chdir(here)
    try:
        assert grading._scratch_bytes(deep) >= 3000 * 4096, "folders deeper than PATH_MAX count too"
    finally:
        grading.remove_scratch(deep)
    assert not deep.exists()


def test_only_the_judges_own_lines_count():
    # The judge's lines carry the nonce it read before any student code ran; one without it makes the run forged
    # (a student's print cannot add a result), and the cell it started last without finishing is the one running.
    import io
    nonce = "n0nce"
    lines = [json.dumps({"nonce": nonce, "start": 0}), json.dumps({"nonce": nonce, "cell": 0}),
             json.dumps({"nonce": nonce, "start": 1})]
    listener = grading._Listener(io.BytesIO("\n".join(lines).encode() + b"\n"), nonce)
    listener.thread.join()
    assert not listener.forged and listener.running() == 1
    for forged in ('{"nonce": "guess", "cell": 1}', '{"cell": 1, "done": true}', "ok", "[1]"):
        listener = grading._Listener(io.BytesIO((lines[0] + "\n" + forged + "\n").encode()), nonce)
        listener.thread.join()
        assert listener.forged and listener.said == [{"start": 0}], forged
    flood = grading._Listener(io.BytesIO((lines[0] + "\n").encode() * (grading.MAX_RESULT_BYTES // 30)), nonce)
    flood.thread.join()
    assert flood.forged, "a run that says more than MAX_RESULT_BYTES is not read on"

