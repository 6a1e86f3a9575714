"""Each namespace of a sandboxed rollout holds: no network (loopback included), no host
files, an empty environment, its own PID namespace, a non-root uid without
capabilities, a private /tmp, only its own descriptors. Real processes, no mocks:
every program below runs in the code sandbox as a rollout would."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from workers.code.sandbox import CodeSandbox, RunLimits

LIMITS = RunLimits(
    time_limit_s=2.0, wall_s=10.0, memory_bytes=512 << 20, output_bytes=1 << 20
)
SECRET = "gf-secret-9f2c1d"


@pytest.fixture(scope="module")
def sandbox():
    # The worker's secrets are in its environment when the sandbox starts.
    os.environ["GRADEFLEET_SIGNING_KEY"] = SECRET
    box = CodeSandbox()
    try:
        yield box
    finally:
        box.close()
        del os.environ["GRADEFLEET_SIGNING_KEY"]


def run(box: CodeSandbox, program: str, stdin: str = "") -> dict:
    (outcome,) = box.run_stdio(program, "", [stdin], LIMITS)
    assert outcome["ready"], outcome
    return outcome


def run_json(box: CodeSandbox, program: str) -> object:
    outcome = run(box, program)
    assert outcome["exit"] == 0, outcome["stderr_tail"]
    return json.loads(outcome["stdout"])


def test_sandbox_network_is_unreachable_even_to_a_host_listener(sandbox):
    # Given a listener on the host's loopback
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        program = f"""
import json, socket
out = {{}}
for host in ("127.0.0.1", "10.0.0.1"):
    try:
        socket.create_connection((host, {port}), timeout=1).close()
        out[host] = "connected"
    except OSError as exc:
        out[host] = type(exc).__name__
print(json.dumps(out))
"""
        # When the sandboxed program tries to connect, Then nothing connects
        result = run_json(sandbox, program)
        assert "connected" not in result.values(), result
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()


def test_sandbox_sees_no_host_files(sandbox):
    here = Path(__file__).resolve()
    paths = ["/etc/passwd", "/etc/shadow", "/work", "/root", "/home", "/var"]
    paths += [str(here), str(here.parent), "/proc/1/environ", "/proc/self/environ"]
    program = f"""
import json, os
print(json.dumps({{p: os.path.exists(p) for p in {paths!r}}}))
"""
    visible = run_json(sandbox, program)
    assert not any(visible.values()), visible


def test_sandbox_runtime_is_read_only_and_tmp_is_private(sandbox):
    program = """
import json, os
out = {}
for path in ("/rt/app/workers/code/x.py", "/usr/lib/x", "/x", "/dev/shm/x"):
    try:
        open(path, "w").close()
        out[path] = "written"
    except OSError as exc:
        out[path] = type(exc).__name__
out["tmp_before"] = os.path.exists("/tmp/marker")
open("/tmp/marker", "w").write("left by an earlier rollout")
print(json.dumps(out))
"""
    first = run_json(sandbox, program)
    second = run_json(sandbox, program)
    assert "written" not in first.values(), first
    # A file written to /tmp by one rollout is gone in the next one.
    assert first["tmp_before"] is False
    assert second["tmp_before"] is False


def test_sandbox_environment_is_empty_without_the_workers_secrets(sandbox):
    program = """
import json, os
print(json.dumps(dict(os.environ)))
"""
    assert run_json(sandbox, program) == {}
    # nor anywhere the program could print it from (no /proc, see above)
    outcome = run(sandbox, "import os, sys\nprint(sys.argv, os.listdir('/'))")
    assert SECRET not in outcome["stdout"]


def test_sandbox_is_pid_1_of_its_own_namespace_as_a_non_root_uid(sandbox):
    program = """
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
data = (ctypes.c_uint32 * 6)()
libc.capget(hdr, data)
out = {"pid": os.getpid(), "uid": os.getuid(), "euid": os.geteuid(),
       "gid": os.getgid(), "groups": os.getgroups(), "caps": list(data),
       "bounding": [libc.prctl(23, c, 0, 0, 0) for c in range(41)],
       "no_new_privs": libc.prctl(39, 0, 0, 0, 0), "hostname": socket.gethostname()}
for name, call in (("setuid0", lambda: os.setuid(0)),
                   ("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))):
    try:
        out[name] = call()
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""
    result = run_json(sandbox, program)
    assert result["pid"] == 1
    assert result["uid"] == result["euid"] == result["gid"] > 0
    assert result["groups"] == []
    assert result["caps"] == [0] * 6  # effective, permitted, inheritable
    assert set(result["bounding"]) == {0}
    assert result["no_new_privs"] == 1
    assert result["setuid0"] == "PermissionError"
    assert result["mount"] == -1
    assert result["hostname"] != socket.gethostname()


def test_sandbox_rlimits_are_hard(sandbox):
    program = """
import json, resource
names = ["CPU", "AS", "NPROC", "FSIZE", "NOFILE", "CORE"]
out = {n: resource.getrlimit(getattr(resource, "RLIMIT_" + n)) for n in names}
try:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard * 2, hard * 2))
    out["raised"] = True
except (ValueError, OSError):
    out["raised"] = False
print(json.dumps(out))
"""
    result = run_json(sandbox, program)
    assert result.pop("raised") is False
    for name, (soft, hard) in result.items():
        assert soft == hard != -1, (name, soft, hard)
    assert result["CORE"] == [0, 0]
    assert result["AS"][0] == LIMITS.memory_bytes
    assert result["NPROC"][0] == LIMITS.processes


def test_sandbox_child_holds_only_its_own_descriptors(sandbox):
    program = """
import json, os
open_fds = []
for fd in range(1024):
    try:
        os.fstat(fd)
        open_fds.append(fd)
    except OSError:
        pass
print(json.dumps(open_fds))
"""
    assert run_json(sandbox, program) == [0, 1, 2]


def _uid_processes(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) == uid:
                found.append(int(entry.name))
    return found


def test_sandbox_background_processes_die_with_the_rollout(sandbox):
    # Given a program that leaves a child and a grandchild sleeping, and exits
    program = """
import os, time
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        time.sleep(60)
    time.sleep(60)
print(os.getuid())
"""
    outcome = run(sandbox, program)
    uid = int(outcome["stdout"])
    # Then nothing of that uid is left on the machine
    assert _uid_processes(uid) == []


def test_sandbox_filters_namespace_mount_and_debug_system_calls(sandbox):
    # Without the filter an unprivileged process may make a user namespace (and be
    # root in it): the kernel attack surface the seccomp denylist takes away.
    program = """
import ctypes, json, os, threading
libc = ctypes.CDLL(None, use_errno=True)
calls = {"unshare_user": (272, 0x10000000), "unshare_net": (272, 0x40000000),
         "clone_newuser": (56, 0x10000000 | 17, 0, 0, 0, 0),
         "ptrace": (101, 16, 1, 0, 0), "io_uring_setup": (425, 1, 0),
         "bpf": (321, 0, 0, 0), "mount": (165, 0, 0, 0, 0, 0)}
out = {}
for name, args in calls.items():
    result = libc.syscall(*args)
    out[name] = [result, ctypes.get_errno()]
thread = threading.Thread(target=lambda: out.__setitem__("thread", "ran"))
thread.start()
thread.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(out))
"""
    result = run_json(sandbox, program)
    assert result.pop("thread") == "ran"  # threads and fork still work
    assert result.pop("fork") == 7
    assert result == {name: [-1, 1] for name in result}, result  # EPERM, each
    assert len(result) == 7
