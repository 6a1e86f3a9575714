"""The worker's handle on the code sandbox: two warm zygotes under bubblewrap.

`CodeSandbox` starts, per worker process, a *model* zygote and a *harness* zygote
(`workers.code.zygote`), each as `bwrap ... python3 -I -S -B` with a read-only view of
the runtime only (the interpreter, its stdlib without site-packages, the system's
shared libraries, and our `workers.code` package), no network, an empty environment,
fresh PID/IPC/UTS/mount namespaces, `--die-with-parent` and `--new-session`. Neither
sees a host file, the worker's environment (GRADEFLEET_* secrets, Redis passwords) or
/proc. Every rollout then runs in children those zygotes start (see `zygote`,
`isolate`, `seccomp`), as this sandbox's slot uids (`SlotLease`), and where cgroup v1
is writable in the slot's cpu and pids cgroups (`cgroup`).

One `CodeSandbox` grades one rollout at a time; a worker that wants several in flight
(so that a sleeping rollout does not hold up the others) keeps several, each with its
own slot (the benchmark runs 8 per worker process; each zygote is ~20 MB).

Where the sandbox cannot run (not root, no bwrap, namespaces refused), starting it
raises `SandboxUnavailableError` with the reason, and the grade is `error` (counted in
`UNAVAILABLE`): there is no unsandboxed fallback and no weaker mode.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from workers.code.cgroup import SlotCgroup
from workers.code.errors import CodeGraderError
from workers.code.wire import (
    FRAME_BYTES,
    WireError,
    WireTimeout,
    read_frame,
    send_frame,
)

__all__ = [
    "UNAVAILABLE",
    "CodeSandbox",
    "HarnessOutcome",
    "RunLimits",
    "SandboxObserver",
    "SandboxUnavailableError",
    "SlotLease",
]

# Sandbox starts refused, by reason (the metrics layer reads this).
UNAVAILABLE: Counter[str] = Counter()
# Far above real accounts; kernel uids only, no passwd entry. A worker in a user
# namespace that maps fewer ids (Kubernetes' hostUsers: false maps 65,536) passes a
# base inside its range (`CodeSandbox(uid_base=...)`, GRADEFLEET_CODE_UID_BASE).
UID_BASE = 1_600_000
MAX_SLOTS = 4096
_START_TIMEOUT_S = 20.0
# The slot's pids cgroup (where there is one): bwrap, its init, the zygote, and a
# rollout's processes (RLIMIT_NPROC, per uid, is the tighter bound on those).
_SLOT_PROCESSES = 64
_APP = Path(__file__).resolve().parents[2]  # the directory holding `workers/`
_MODEL_CAPS = ("SYS_ADMIN", "SETUID", "SETGID", "SETPCAP", "KILL")
_HARNESS_CAPS = ("SETUID", "SETGID", "SETPCAP")  # to drop to its uid, once


class SandboxUnavailableError(CodeGraderError):
    """The sandbox cannot run here; the message says why (the grade is `error`)."""


class SandboxObserver(Protocol):
    """Told of each zygote started (the worker's metrics)."""

    def sandbox_started(self, role: str, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLimits:
    """One rollout's limits, as the zygotes apply them."""

    time_limit_s: float  # per test (wall; CPU rlimit from it)
    wall_s: float  # the whole rollout
    memory_bytes: int  # RLIMIT_AS of the model process
    output_bytes: int  # stdout kept per test; more is `output_limit`
    processes: int = 16  # RLIMIT_NPROC of the model's uid
    file_size_bytes: int = 8 * 1024 * 1024
    tmpfs_bytes: int = 16 * 1024 * 1024
    startup_s: float = 1.0  # extra wall for loading the program (first test)
    max_value_bytes: int = 4 * 1024 * 1024  # one value on the harness/model channel


def _check_privileges() -> None:
    if os.geteuid() != 0:
        raise SandboxUnavailableError(
            "the code sandbox needs root (CAP_SYS_ADMIN and CAP_SETUID) to give"
            " each rollout fresh namespaces and its own uid"
        )


class SlotLease:
    """A machine-wide slot number, naming this worker's two uids.

    RLIMIT_NPROC counts per uid, so two sandboxes sharing a uid would share one
    process budget. The lease is a bound abstract Unix socket
    ("@gradefleet-code-slot-N"): the kernel frees the name when the process exits
    and it leaves no file behind (abstract names are per network namespace, which
    the worker processes of one machine share).
    """

    def __init__(
        self, prefix: str = "gradefleet-code-slot", uid_base: int = UID_BASE
    ) -> None:
        for slot in range(MAX_SLOTS):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(f"\0{prefix}-{slot}")
            except OSError:
                sock.close()
                continue
            self.slot, self._sock = slot, sock
            self.model_uid = uid_base + 2 * slot
            self.harness_uid = self.model_uid + 1
            return
        raise SandboxUnavailableError(f"all {MAX_SLOTS} sandbox slots are in use")

    def release(self) -> None:
        self._sock.close()


def _runtime_binds() -> list[str]:
    """bwrap arguments mounting the interpreter, its stdlib and our package at /rt."""
    python = Path(sys.executable).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    args: list[str] = []
    # bwrap makes missing parent directories 0700 (unreadable to the sandboxed uid).
    for directory in (
        "/rt",
        "/rt/python",
        "/rt/python/bin",
        "/rt/python/lib",
        "/rt/app",
    ):
        args += ["--perms", "0755", "--dir", directory]
    args += ["--perms", "0755", "--dir", "/rt/app/workers"]
    args += ["--ro-bind", str(python), "/rt/python/bin/python3"]
    args += ["--ro-bind", str(stdlib), f"/rt/python/lib/{version}"]
    if (stdlib / "site-packages").is_dir():  # installed packages are not the runtime
        args += ["--tmpfs", f"/rt/python/lib/{version}/site-packages"]
    libdir = sysconfig.get_config_var("LIBDIR")
    ldlibrary = sysconfig.get_config_var("LDLIBRARY") or ""
    shared = Path(libdir or "/nonexistent") / str(ldlibrary)
    if ldlibrary.endswith(".so") and shared.exists():
        for lib in shared.parent.glob(f"{ldlibrary}*"):
            args += ["--ro-bind", str(lib.resolve()), f"/rt/python/lib/{lib.name}"]
        # The interpreter's RUNPATH names the host path; point the loader at the copy.
        args += ["--setenv", "LD_LIBRARY_PATH", "/rt/python/lib"]
    for name in ("__init__.py", "errors.py", "code"):
        args += ["--ro-bind", str(_APP / "workers" / name), f"/rt/app/workers/{name}"]
    return args


def _system_binds() -> list[str]:
    """The system's shared libraries (libc, libffi, ...), as this host lays them out."""
    args = ["--ro-bind", "/usr/lib", "/usr/lib"]
    for top in ("/lib", "/lib64", "/lib32", "/libx32"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir() and top != "/lib32":
            args += ["--ro-bind", top, top]
    if Path("/usr/lib64").is_dir():
        args += ["--ro-bind", "/usr/lib64", "/usr/lib64"]
    return args


def bwrap_argv(role: str, sock_fd: int, harness_uid: int) -> list[str]:
    """The full bwrap command of one zygote (`role`: "model" or "harness")."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError("bubblewrap (bwrap) is not installed")
    caps = _MODEL_CAPS if role == "model" else _HARNESS_CAPS
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"]
    argv += ["--hostname", "sandbox", "--dev", "/dev", "--tmpfs", "/tmp"]
    argv += _system_binds() + _runtime_binds() + ["--remount-ro", "/"]
    argv += ["--cap-drop", "ALL"] + [a for c in caps for a in ("--cap-add", f"CAP_{c}")]
    code = (
        "import sys; sys.path[:0] = ['/rt/app']; from workers.code.zygote import main; "
        f"main({int(sock_fd)}, {role!r}, {int(harness_uid)})"
    )
    return [*argv, "/rt/python/bin/python3", "-I", "-S", "-B", "-c", code]


@dataclass(frozen=True, slots=True)
class HarnessOutcome:
    """What one harness/model pair reported: per-test results from `start` on, whether
    the model process went away with tests left, and how the model process ended."""

    results: list[list[Any]]
    stopped: bool
    model: dict[str, Any]
    harness_cpu_s: float = 0.0


class _Launcher:
    """Starts every zygote from one thread that lives as long as the process.

    bwrap's --die-with-parent is the kernel's parent-death signal, and that follows
    the *thread* that started the process: a zygote started from a pool thread
    would be killed when that thread ends. Started from here, a zygote dies with
    the worker process, and only then.
    """

    def __init__(self) -> None:
        self._pid = -1
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[_LaunchRequest] = queue.SimpleQueue()

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._pid != os.getpid():  # a new process (forked): a new thread
                self._pid = os.getpid()
                self._requests = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._serve, args=(self._requests,), daemon=True
                )
                thread.start()
            requests = self._requests
        request = _LaunchRequest(argv, kwargs)
        requests.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.proc is not None
        return request.proc

    @staticmethod
    def _serve(requests: queue.SimpleQueue[_LaunchRequest]) -> None:
        while True:
            request = requests.get()
            try:
                request.proc = subprocess.Popen(request.argv, **request.kwargs)
            except BaseException as exc:  # handed to the caller's thread
                request.error = exc
            request.done.set()


class _LaunchRequest:
    def __init__(self, argv: list[str], kwargs: dict[str, Any]) -> None:
        self.argv, self.kwargs = argv, kwargs
        self.proc: subprocess.Popen[bytes] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()


_LAUNCHER = _Launcher()


class _Zygote:
    """One bwrap'd zygote process and the socket to it."""

    def __init__(self, role: str, harness_uid: int, cgroup: SlotCgroup | None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            argv = bwrap_argv(role, theirs.fileno(), harness_uid)
        except SandboxUnavailableError:  # no bwrap: the pair would leak per rollout
            ours.close()
            theirs.close()
            raise
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        try:
            self.proc = _LAUNCHER.popen(  # bwrap hands the socket on to the zygote
                cgroup.wrap(argv) if cgroup else argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self.stderr,
                pass_fds=(theirs.fileno(),),
                env={},
            )
        finally:
            theirs.close()
        self.sock = ours
        try:
            read_frame(
                ours.fileno(),
                max_bytes=4096,
                deadline=time.monotonic() + _START_TIMEOUT_S,
            )
        except WireError as exc:
            why = self.why(exc)  # before close(), which closes the stderr file
            self.close()
            raise SandboxUnavailableError(
                f"the {role} sandbox did not start: {why}"
            ) from None

    def why(self, exc: BaseException) -> str:
        self.stderr.seek(0)
        said = self.stderr.read(2000).decode("utf-8", "replace").strip()
        return said or str(exc)

    def send(self, value: Any, fds: tuple[int, ...] = ()) -> None:
        send_frame(self.sock.fileno(), value, max_bytes=FRAME_BYTES, fds=fds)

    def read(self, deadline: float) -> Any:
        return read_frame(self.sock.fileno(), max_bytes=FRAME_BYTES, deadline=deadline)

    def close(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()


def _job_limits(limits: RunLimits, uid: int) -> dict[str, Any]:
    return {
        "uid": uid,
        "cpu_s": max(1, int(limits.wall_s + 1)),
        "memory_bytes": limits.memory_bytes,
        "file_size_bytes": limits.file_size_bytes,
        "processes": limits.processes,
        "tmpfs_bytes": limits.tmpfs_bytes,
        "wall_s": limits.wall_s,
        "max_bytes": limits.max_value_bytes,
    }


class CodeSandbox:
    """Runs rollouts in the two zygotes of this process, starting them on first use
    and again after one died (a zygote that misbehaves is replaced, never trusted)."""

    def __init__(
        self,
        slot_prefix: str = "gradefleet-code-slot",
        *,
        uid_base: int = UID_BASE,
        observer: SandboxObserver | None = None,
    ) -> None:
        self._slot_prefix = slot_prefix
        self._uid_base = uid_base
        self._observer = observer
        self._owner = -1
        self._lease: SlotLease | None = None
        self._model: _Zygote | None = None
        self._cgroup: SlotCgroup | None = None
        # At exit, so that the slot's cgroup directories go too (a SIGKILLed worker
        # leaves them; the next sandbox on that slot reuses them).
        atexit.register(self.close)
        self._harness: _Zygote | None = None

    def _zygotes(self) -> tuple[SlotLease, _Zygote, _Zygote]:
        if self._owner != os.getpid():  # forked: the parent's zygotes are not ours
            self._model = self._harness = self._lease = self._cgroup = None
            self._owner = os.getpid()
        try:
            _check_privileges()
            if self._lease is None:
                self._lease = SlotLease(self._slot_prefix, self._uid_base)
            if self._model is None:
                self._cgroup = SlotCgroup(self._lease.slot, _SLOT_PROCESSES)
                self._model = self._start("model", self._lease, self._cgroup)
            if self._harness is None:
                self._harness = self._start("harness", self._lease, None)
        except SandboxUnavailableError as exc:
            UNAVAILABLE[str(exc)[:200]] += 1
            raise
        return self._lease, self._model, self._harness

    def _start(self, role: str, lease: SlotLease, cgroup: SlotCgroup | None) -> _Zygote:
        started = time.monotonic()
        zygote = _Zygote(role, lease.harness_uid, cgroup)
        if self._observer is not None:
            self._observer.sandbox_started(role, time.monotonic() - started)
        return zygote

    def close(self) -> None:
        """Stop both zygotes (and every sandboxed process with them)."""
        for zygote in (self._model, self._harness):
            if zygote is not None and self._owner == os.getpid():
                zygote.close()
        self._model = self._harness = None
        if self._cgroup is not None and self._owner == os.getpid():
            self._cgroup.remove()
        self._cgroup = None
        if self._lease is not None and self._owner == os.getpid():
            self._lease.release()
        self._lease = None

    def _reset(self) -> None:
        """After a zygote failed to answer in time: replace both."""
        lease = self._lease
        self._lease = None
        self.close()
        self._lease = lease

    def zygote_times(self) -> list[float]:
        """CPU seconds of both zygotes and their reaped children (for benchmarks)."""
        _, model, harness = self._zygotes()
        total = [0.0, 0.0]
        for zygote in (model, harness):
            zygote.send({"op": "times"})
            times = zygote.read(time.monotonic() + 10)
            total[0] += times[0] + times[2]
            total[1] += times[1] + times[3]
        return total

    def run_stdio(
        self, program: str, setup: str, stdins: list[str], limits: RunLimits
    ) -> Generator[dict[str, Any], None, None]:
        """Run the program once per stdin, each in a fresh sandbox; yields each run's
        outcome (`exit`, `killed`, `ready`, `stdout`, `stderr_tail`) in order."""
        lease, model, _ = self._zygotes()
        job = _job_limits(limits, lease.model_uid)
        job.update(op="stdio", program=program, setup=setup, stdins=stdins)
        job.update(test_wall_s=limits.time_limit_s + limits.startup_s)
        job["cpu_s"] = int(limits.time_limit_s + limits.startup_s) + 1
        job["output_bytes"] = limits.output_bytes
        deadline = time.monotonic() + limits.wall_s + 5.0
        read = 0
        try:
            model.send(job)
            for _ in stdins:
                outcome = model.read(deadline)
                read += 1
                yield outcome
        except (WireError, OSError) as exc:
            self._reset()
            raise SandboxUnavailableError(f"model sandbox failed: {exc}") from None
        finally:
            if read < len(stdins):  # abandoned midway: its frames would be misread
                self._reset()

    def run_harnessed(
        self, program: str, harness_job: dict[str, Any], limits: RunLimits
    ) -> HarnessOutcome:
        """One harness/model pair for a call- or assert-mode suite, from test
        `harness_job["start"]` on."""
        lease, model, harness = self._zygotes()
        to_model_r, to_model_w = os.pipe()
        from_model_r, from_model_w = os.pipe()
        model_job = _job_limits(limits, lease.model_uid)
        model_job.update(op="serve", program=program, setup=harness_job["setup"])
        model_job["output_bytes"] = limits.output_bytes
        test_job = _job_limits(limits, lease.harness_uid)
        test_job.update(harness_job, op="harness", time_limit_s=limits.time_limit_s)
        test_job.update(startup_s=limits.startup_s, memory_bytes=1 << 30)
        deadline = time.monotonic() + limits.wall_s + 5.0
        try:
            try:
                model.send(model_job, (to_model_r, from_model_w))
                harness.send(test_job, (to_model_w, from_model_r))
            finally:  # the zygotes hold their own copies now
                for fd in (to_model_r, to_model_w, from_model_r, from_model_w):
                    os.close(fd)
            reply = harness.read(deadline)
            model.send({"op": "finish"})
            model_end = model.read(deadline)
        except WireTimeout:
            # The harness has its own deadlines on every call; overrunning them too
            # is the rollout's timeout (never a pass, and not the sandbox's error).
            self._reset()
            return HarnessOutcome([], False, {"ready": True, "killed": "timeout"})
        except (WireError, OSError) as exc:
            self._reset()
            raise SandboxUnavailableError(f"sandbox failed: {exc}") from None
        if "error" in reply:
            raise SandboxUnavailableError(str(reply["error"]))
        return HarnessOutcome(
            reply["results"], bool(reply["stopped"]), model_end, float(reply["cpu_s"])
        )
