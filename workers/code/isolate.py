"""The per-rollout isolation step: new namespaces, private /tmp, hard rlimits, a
non-root uid, no capabilities, the system call filter of `seccomp`. Nothing else
lives here (issue 39, section 4).

It runs inside the bubblewrap sandbox, in the zygote (`workers.code.zygote`), which
bwrap started as root with only the capabilities this module needs. Each model process
is a `clone_isolated` child: fresh PID, mount, IPC, UTS and network namespaces in one
system call, so it is PID 1 of its own namespace and killing it kills every process it
started (the kernel reaps the whole namespace before the kill is reported). The child
then calls `enter_model_sandbox`; the trusted harness, which never runs model code,
only calls `drop_privileges` after a plain fork.

Why a uid per slot: RLIMIT_NPROC is not enforced for kernel uid 0 (nor with
CAP_SYS_ADMIN), and these machines run as root, so one fork bomb would starve the
machine. Each concurrent slot gets its own non-root uids (see `sandbox.SlotLease`),
so the process limit counts that slot's processes only.

Why a raw clone rather than `os.fork` + unshare: a new PID namespace only applies to
the caller's children, so unshare would need a second fork per rollout. `clone_isolated`
calls CPython's own before/after-fork hooks around the system call, as `os.fork` does;
the zygote is single-threaded, so no lock is held across it. Stdlib only (ctypes).
"""

from __future__ import annotations

import ctypes
import os
import resource
from dataclasses import dataclass

from workers.code.seccomp import install_denylist

__all__ = [
    "NAMESPACE_FLAGS",
    "IsolationError",
    "RlimitSet",
    "clone_isolated",
    "drop_privileges",
    "enter_model_sandbox",
    "prepare",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
)
_SIGCHLD = 17
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000
_PR_CAPBSET_READ, _PR_CAPBSET_DROP = 23, 24
_PR_SET_NO_NEW_PRIVS = 38
_EINVAL = 22
_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
# capset's header and its three 64-bit sets; array types made once (a new ctypes
# array type costs ~0.1 ms, in every child).
_CapHeader = ctypes.c_uint32 * 2
_CapData = ctypes.c_uint32 * 6
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4


class IsolationError(OSError):
    """A namespace, mount, limit or uid change failed: the rollout must not run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RlimitSet:
    """Hard limits of one sandboxed process; each is set with soft = hard, so the
    process cannot raise it again."""

    cpu_s: int
    address_space_bytes: int
    processes: int
    file_size_bytes: int
    open_files: int = 64

    def apply(self) -> None:
        for which, value in (
            (resource.RLIMIT_CPU, self.cpu_s),
            (resource.RLIMIT_AS, self.address_space_bytes),
            (resource.RLIMIT_NPROC, self.processes),
            (resource.RLIMIT_FSIZE, self.file_size_bytes),
            (resource.RLIMIT_NOFILE, self.open_files),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_MEMLOCK, 0),
            (resource.RLIMIT_MSGQUEUE, 0),
        ):
            # Never above an inherited hard limit (raising one needs a capability
            # the sandbox has dropped): the tighter of the two, soft = hard.
            _, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(which, (value, value))


def _check(result: int, what: str) -> None:
    if result < 0:
        errno = ctypes.get_errno()
        raise IsolationError(errno, f"{what}: {os.strerror(errno)}")


def clone_isolated() -> int:
    """Fork into fresh PID, mount, IPC, UTS and network namespaces.

    Returns 0 in the child (PID 1 of its namespace) and the child's pid in the
    parent, like `os.fork`. The caller must be single-threaded.
    """
    number = _SYS_CLONE.get(os.uname().machine)
    if number is None:
        raise IsolationError(0, f"clone: unsupported machine {os.uname().machine}")
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = _libc.syscall(number, ctypes.c_ulong(NAMESPACE_FLAGS | _SIGCHLD), 0, 0, 0, 0)
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0
    errno = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise IsolationError(errno, f"clone: {os.strerror(errno)}")
    return int(pid)


def _private_tmp(tmpfs_bytes: int) -> None:
    # Mount events must not propagate back to the zygote's namespace, and /tmp is a
    # new tmpfs (a new superblock), so nothing written there outlives the rollout.
    _check(
        _libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "mount private"
    )
    options = f"size={tmpfs_bytes},nr_inodes=1024,mode=1777".encode()
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    _check(_libc.mount(b"tmpfs", b"/tmp", b"tmpfs", flags, options), "mount /tmp")


def _bounding_caps() -> tuple[int, ...]:
    """The capabilities left in this process's bounding set."""
    held = []
    for cap in range(64):  # until EINVAL: past the kernel's last capability
        answer = _libc.prctl(_PR_CAPBSET_READ, cap, 0, 0, 0)
        if answer < 0:
            if ctypes.get_errno() == _EINVAL and cap > 0:
                break
            _check(-1, f"read capability {cap}")
        if answer == 1:
            held.append(cap)
    return tuple(held)


# The zygote's bounding set, read once (`prepare`): its children inherit it and a
# set only ever shrinks, so dropping these few empties a child's set, where asking
# the kernel about each of the 41 capabilities cost every rollout ~0.1 ms.
_BOUNDING: tuple[int, ...] | None = None


def prepare() -> None:
    """Read, once in the zygote, what every child's `drop_privileges` drops."""
    global _BOUNDING
    _BOUNDING = _bounding_caps()


def drop_privileges(uid: int, limits: RlimitSet) -> None:
    """Hard rlimits, no_new_privs, an empty capability bounding set, then `uid` (and
    gid = uid, no groups): the kernel clears every capability on the uid change."""
    if uid <= 0:
        raise IsolationError(0, "the sandboxed uid must not be root")
    limits.apply()
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    for cap in _bounding_caps() if _BOUNDING is None else _BOUNDING:
        _check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise IsolationError(0, "uid change did not take")
    # The uid change cleared the effective and permitted sets; the inheritable set
    # (which bwrap's --cap-add fills) is cleared here, so no set holds anything.
    _check(_libc.capset(_CapHeader(_CAPABILITY_VERSION_3, 0), _CapData()), "capset")


def enter_model_sandbox(uid: int, limits: RlimitSet, tmpfs_bytes: int) -> None:
    """In a `clone_isolated` child: a private writable /tmp, `drop_privileges`, then
    the system call filter (`seccomp`: no new user namespaces, mounts, ptrace...)."""
    _private_tmp(tmpfs_bytes)
    drop_privileges(uid, limits)
    install_denylist()
    os.chdir("/tmp")
