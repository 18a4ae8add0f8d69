"""A sandbox for a student's code: bubblewrap (``bwrap``) namespaces plus cgroup or rlimit limits.

The grader (``grade``) runs every submission through :func:`command`: the grading process (the
judge, ``judge.py``) and whatever it starts see

* the Python environment and the course's ``utils/`` **read-only**, with ``utils/solutions/``
  holding only the answers of the lessons *before* the lab graded (lab 05 imports lesson 04's);
* one **scratch** folder of their own (writable; the grader removes it afterwards), an empty
  ``/tmp`` and an empty working folder; nothing else of the file system: no home, no other
  submission, no output folder, no ``.git``;
* **no network** (a network namespace of its own: its loopback is not the host's), a PID, IPC and
  UTS namespace of its own, no capabilities, a new session (no terminal to inject into);
* only the environment variables given;
* **limits** on memory, processes, CPU (a cgroup of its own where one can be made: root, or a
  delegated cgroup v2; else per-process rlimits, see :attr:`Sandbox.enforced`), file size and
  scratch size (``grading.execute`` polls the scratch);

and every process it started dies with it (the PID namespace ends with its first process,
``--die-with-parent`` ends it with the grader). Taught nowhere: course tooling.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..constants import REPO_ROOT, SOLUTIONS_DIR, UTILS_DIR

GiB, MiB = 1 << 30, 1 << 20
SCRATCH = Path("/scratch")  # where a run's scratch folder is inside its sandbox
DEFAULT_MEMORY_GIB = 2      # grading labs 01-06 on tiny peaks at 0.36-0.52 GiB (in a cgroup: docs/instructors.md)
DEFAULT_PROCESSES = 64      # tasks (processes and threads): grading labs 01-06 peaks at 22-24
DEFAULT_FILE_MIB = 512      # the largest file, and the whole scratch folder
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`, Fedora: `sudo dnf install "
                "bubblewrap`, Arch: `sudo pacman -S bubblewrap`; `make setup` does it where it can), or grade "
                "without a sandbox with --no-sandbox (every row is then flagged `unsandboxed`)")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "nsswitch.conf", "passwd", "group",
             "hosts", "localtime")


class SandboxUnavailable(RuntimeError):
    """No working sandbox on this machine; the message says why and what to do."""


@dataclass
class Limits:
    """What one sandbox may use. ``memory`` and ``processes`` hold for the whole sandbox where a
    cgroup enforces them, per process under the rlimit fallback (:attr:`Sandbox.enforced`)."""
    memory: int = DEFAULT_MEMORY_GIB * GiB        # bytes
    processes: int = DEFAULT_PROCESSES            # tasks (processes and threads)
    file_size: int = DEFAULT_FILE_MIB * MiB       # bytes: the largest file, and the scratch folder
    cpus: float = 1.0                             # CPU time per wall second (cgroup only)


@dataclass
class Sandbox:
    bwrap: str
    limits: Limits = field(default_factory=Limits)
    cgroups: dict = field(default_factory=dict)   # controller -> parent folder in which each run gets its own
    enforced: dict = field(default_factory=dict)  # limit -> how it is enforced, for docs/instructors.md and the summary
    no_nested_userns: bool = False                # bwrap >= 0.8: the sandbox cannot make user namespaces itself

    def describe(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in self.enforced.items())


# ----------------------------------------------------------------------------- finding bwrap and the cgroups
def _own_cgroups(proc_cgroup: str | None = None, root: Path = Path("/sys/fs/cgroup")) -> dict:
    """{controller: (version, folder)}: where each run's cgroup can be made, for the controllers we use.

    cgroup v1: this process's own cgroup of that controller, if writable. cgroup v2: the deepest
    writable ancestor of this process's cgroup (itself included) that hands the controller to its
    children (``cgroup.subtree_control``): the root cgroup for root, ``user@UID.service`` for a
    user whose systemd delegates it. ``proc_cgroup`` (the text of /proc/self/cgroup) and ``root``
    are for the tests.
    """
    found = {}
    try:
        lines = (proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()).splitlines()
    except OSError:
        return found
    for line in lines:
        _, names, path = line.split(":", 2)
        if names == "":  # cgroup v2 (the unified hierarchy)
            v2 = root if (root / "cgroup.controllers").exists() else root / "unified"
            parts = Path(path.lstrip("/")).parts
            for depth in range(len(parts), -1, -1):
                base = v2.joinpath(*parts[:depth])
                control = base / "cgroup.subtree_control"
                try:
                    enabled = control.read_text().split()
                except OSError:
                    continue
                for controller in ("pids", "memory", "cpu"):
                    if controller in enabled and os.access(base, os.W_OK) and os.access(control, os.W_OK):
                        found.setdefault(controller, ("v2", base))
            continue
        for controller in names.split(","):
            base = root / controller / path.lstrip("/")
            if controller in ("pids", "memory", "cpu") and base.is_dir() and os.access(base, os.W_OK):
                found[controller] = ("v1", base)  # v1 wins over v2 where both have it
    return found


def _enforcement(cgroups: dict) -> dict:
    root = os.geteuid() == 0
    return {
        "memory": f"cgroup {cgroups['memory'][0]} (whole sandbox)" if "memory" in cgroups else
        "address-space rlimit (per process)",
        "processes": f"cgroup {cgroups['pids'][0]} (whole sandbox)" if "pids" in cgroups else
        ("NOT ENFORCED (root without a writable pids cgroup)" if root else "RLIMIT_NPROC (this user)"),
        "cpu": f"cgroup {cgroups['cpu'][0]}" if "cpu" in cgroups else "not limited (no writable cpu cgroup)",
        "files": "RLIMIT_FSIZE per file, scratch polled",
    }


def find(limits: Limits | None = None) -> Sandbox:
    """The sandbox of this machine, checked by starting one; raises :class:`SandboxUnavailable`."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"the sandbox needs Linux namespaces and this is {sys.platform}; grade on a Linux "
                                 "machine (or VM), or " + INSTALL_HINT.split(", or ", 1)[1])
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (`bwrap`) is not installed: " + INSTALL_HINT)
    box = Sandbox(bwrap, limits or Limits())
    box.cgroups = _own_cgroups()
    box.enforced = _enforcement(box.cgroups)
    try:
        helped = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        helped = ""
    box.no_nested_userns = "--disable-userns" in helped
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as tmp:
        confinement = Confinement(box, f"probe-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            probe = subprocess.run(command(box, [sys.executable, "-c", "print('ok')"], scratch=Path(tmp), env={},
                                           cgroup_procs=confinement.procs), capture_output=True, text=True, timeout=60)
        finally:
            confinement.close()
    if probe.returncode != 0 or probe.stdout.strip() != "ok":
        why = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1][:300]
        hint = ("user namespaces look disabled (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 the "
                "AppArmor profile of bwrap must allow them; in Docker, run with --security-opt seccomp=unconfined "
                "or grade on the host)") if "namespace" in why or "uid map" in why or "Operation not permitted" in why \
            else "see bwrap's message"
        raise SandboxUnavailable(f"bubblewrap is installed but could not start a sandbox: {why}; {hint}. "
                                 "Or grade with --no-sandbox (rows flagged `unsandboxed`).")
    return box


# ----------------------------------------------------------------------------- what the sandbox sees
def _python_roots() -> list[tuple[str, str]]:
    """(source, destination) binds of the Python environment: its prefixes and site-packages (not the
    folders PYTHONPATH adds), each at its own path and, when reached through a symlink, at that path too."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages(),
             os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))}
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        paths.add(site.getusersitepackages())
    binds = {}
    for p in paths:
        if os.path.exists(p):
            for dest in {os.path.abspath(p), os.path.realpath(p)}:
                binds[Path(dest)] = os.path.realpath(p)
    kept = []
    for dest in sorted(binds, key=lambda d: len(d.parts)):  # inside one already bound, or in /usr: no bind
        system = any(dest.is_relative_to(d) for d in SYSTEM_DIRS) and not dest.is_relative_to(REPO_ROOT)
        if not any(dest.is_relative_to(k) for k in kept) and not system:
            kept.append(dest)
    return [(binds[d], str(d)) for d in kept]


def visible_solutions(lesson: str | None) -> list[Path]:
    """The reference solutions a lab may import: those of the lessons before it (none for ``None``)."""
    if lesson is None:
        return []
    return [p for p in sorted(SOLUTIONS_DIR.glob("lesson*.py")) if p.stem[len("lesson"):] < lesson]


def command(box: Sandbox, argv: list[str], *, scratch: Path | None, env: dict, cwd: Path = REPO_ROOT,
            empty_dirs: list[Path] = (), lesson: str | None = None, cgroup_procs: list[Path] = ()) -> list[str]:
    """The command line that runs ``argv`` in the sandbox (see the module docstring for what it sees).

    ``scratch`` (writable) is the sandbox's :data:`SCRATCH`, its ``tmp/`` and ``shm/`` the sandbox's
    ``/tmp`` and ``/dev/shm``;
    ``env`` is the whole environment; ``empty_dirs`` are made, empty and read-only (a kernel's working folder);
    ``lesson`` (e.g. "05") makes the solutions of the earlier lessons visible. The line starts with
    a small launcher that joins ``cgroup_procs``, sets the rlimits and becomes ``bwrap`` with ``env``
    as its only environment.
    """
    args = [box.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev"]
    if box.no_nested_userns:
        args += ["--unshare-user", "--disable-userns"]
    if scratch is not None:  # every writable place is in the scratch, where the grader counts it; /tmp comes
        for d in ("tmp", "shm"):  # first, so that a course or a Python under /tmp is bound over it, not hidden
            (scratch / d).mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(scratch / "tmp"), "/tmp", "--bind", str(scratch / "shm"), "/dev/shm"]
    args += ["--remount-ro", "/dev"]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    args += ["--tmpfs", str(REPO_ROOT)]  # the course's folder: empty but for what is bound into it below
    for src, dest in _python_roots():
        args += ["--ro-bind", src, dest]
    args += ["--ro-bind", str(UTILS_DIR), str(UTILS_DIR), "--tmpfs", str(SOLUTIONS_DIR)]
    init = SOLUTIONS_DIR / "__init__.py"
    for p in ([init] if init.is_file() else []) + visible_solutions(lesson):
        args += ["--ro-bind", str(p), str(p)]
    args += ["--remount-ro", str(SOLUTIONS_DIR)]
    for d in empty_dirs:  # empty and read-only wherever it is (even under /tmp, which is the scratch's)
        args += ["--tmpfs", str(d), "--remount-ro", str(d)]
    args += ["--remount-ro", str(REPO_ROOT)]
    if scratch is not None:
        args += ["--bind", str(scratch), str(SCRATCH)]
    args += ["--remount-ro", "/", "--chdir", str(cwd), "--", *argv]  # the folders bwrap made: read-only too
    rlimits = {"RLIMIT_FSIZE": box.limits.file_size, "RLIMIT_CORE": 0}
    if "memory" not in box.cgroups:
        rlimits["RLIMIT_AS"] = box.limits.memory
    if "pids" not in box.cgroups and os.geteuid() != 0:  # counted per user: what runs now plus the allowance
        rlimits["RLIMIT_NPROC"] = _user_tasks() + box.limits.processes
    spec = {"procs": [str(p) for p in cgroup_procs], "rlimits": rlimits, "env": {k: str(v) for k, v in env.items()}}
    return [sys.executable, "-I", "-S", "-c", LAUNCHER, json.dumps(spec), *args]


LAUNCH_FAILED = 97  # the launcher's exit status when it could not confine the run: the grader's problem
LAUNCHER = """import json, os, resource, sys
try:
    spec = json.loads(sys.argv[1])
    for procs in spec["procs"]:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    for name, value in spec["rlimits"].items():
        kind = getattr(resource, name)
        hard = resource.getrlimit(kind)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))
except Exception as e:
    print(f"sandbox launcher: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(LAUNCH_FAILED)
os.execve(sys.argv[2], sys.argv[2:], spec["env"])
""".replace("LAUNCH_FAILED", str(LAUNCH_FAILED))


def _user_tasks() -> int:
    uid, n = os.getuid(), 0
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and d.stat().st_uid == uid:
                n += len(os.listdir(d / "task"))
        except OSError:
            pass
    return n


# ----------------------------------------------------------------------------- one run's cgroups
class Confinement:
    """The cgroups of one sandboxed run: made with the limits, killed and removed by :meth:`close`."""

    def __init__(self, box: Sandbox, name: str):
        self.dirs, lim = {}, box.limits
        for controller, (version, parent) in box.cgroups.items():
            d = parent / name
            d.mkdir(exist_ok=True)
            self.dirs[controller] = (version, d)
            settings = {
                ("v1", "pids"): {"pids.max": lim.processes},
                ("v2", "pids"): {"pids.max": lim.processes},
                ("v1", "memory"): {"memory.limit_in_bytes": lim.memory, "memory.memsw.limit_in_bytes": lim.memory},
                ("v2", "memory"): {"memory.max": lim.memory, "memory.swap.max": 0},
                ("v1", "cpu"): {"cpu.cfs_period_us": 100_000, "cpu.cfs_quota_us": int(lim.cpus * 100_000)},
                ("v2", "cpu"): {"cpu.max": f"{int(lim.cpus * 100_000)} 100000"},
            }[(version, controller)]
            for key, value in settings.items():
                if (d / key).exists():
                    (d / key).write_text(str(value))

    @property
    def procs(self) -> list[Path]:
        return [d / "cgroup.procs" for _, d in self.dirs.values()]

    def process_limit_hits(self) -> int:
        """How many times a fork or a new thread was refused at the process limit."""
        _, d = self.dirs.get("pids", (None, None))
        try:
            return int((d / "pids.events").read_text().split()[1]) if d is not None else 0
        except (OSError, IndexError, ValueError):
            return 0

    def oom_kills(self) -> int:
        """How many processes the memory limit killed."""
        version, d = self.dirs.get("memory", (None, None))
        if d is None:
            return 0
        events = d / ("memory.events" if version == "v2" else "memory.oom_control")
        try:
            for line in events.read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def close(self) -> None:
        """Kill whatever is left in the cgroups (the PID namespace normally took it) and remove them."""
        for _, d in self.dirs.values():
            for _attempt in range(50):
                try:
                    pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
            try:
                d.rmdir()
            except OSError:
                pass
