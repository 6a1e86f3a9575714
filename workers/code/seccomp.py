"""The model process's system call filter: a seccomp denylist of the calls that open
kernel attack surface and that no test program needs.

Why: namespaces and a non-root uid confine what the model's code can reach, but an
unprivileged process may still create a *user* namespace (and with it every other
kind, with full capabilities inside), the usual first step of a kernel exploit. The
filter refuses that (`unshare`, `setns`, `clone` with any CLONE_NEW* flag; `clone3`
answers ENOSYS, so the C library falls back to `clone`), and mounts, ptrace and
cross-process memory access, bpf, keyrings, userfaultfd, io_uring, perf events,
module and kexec loading. Refused calls fail with EPERM; the process lives on.

x86_64 only (the numbers are that ABI's; the x32 ABI is refused whole). Elsewhere
`install_denylist` returns False and the sandbox relies on the rest of `isolate`.
It is installed after `no_new_privs`, as the kernel requires of an unprivileged
process, and is inherited by every process the model starts. Stdlib only (ctypes).
"""

from __future__ import annotations

import ctypes
import os
import struct

__all__ = ["DENIED_X86_64", "install_denylist"]

# From the kernel's asm/unistd_64.h.
DENIED_X86_64 = {
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
    "chroot": 161, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "perf_event_open": 298, "kexec_load": 246, "kexec_file_load": 320,
    "init_module": 175, "finit_module": 313, "delete_module": 176,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163,
    "quotactl": 179, "syslog": 103, "modify_ldt": 154, "iopl": 172, "ioperm": 173,
    "pidfd_getfd": 438, "fanotify_init": 300, "lookup_dcookie": 212, "uselib": 134,
    "vhangup": 153,
}  # fmt: skip
_CLONE, _CLONE3 = 56, 435
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (NEWTIME, 0x80, is
# the exit signal's byte in clone's flags; only clone3 and unshare can ask for it).
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000
_CLONE_NAMESPACES |= 0x10000000 | 0x20000000 | 0x40000000
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_EPERM, _ENOSYS = 0x00050000 | 1, 0x00050000 | 38
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _program() -> list[bytes]:
    denied = sorted(DENIED_X86_64.values())
    prog = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ, _AUDIT_ARCH_X86_64, jt=1),
        _insn(_RET, _KILL),  # another ABI's numbers mean other calls
        _insn(_LD_W_ABS, _NR),
        _insn(_JGE, _X32_BIT, jt=0, jf=1),
        _insn(_RET, _EPERM),
        _insn(_JEQ, _CLONE3, jf=1),
        _insn(_RET, _ENOSYS),
    ]
    for number in denied:
        prog += [_insn(_JEQ, number, jf=1), _insn(_RET, _EPERM)]
    prog += [
        _insn(_JEQ, _CLONE, jf=3),
        _insn(_LD_W_ABS, _ARG0),  # clone's flags (their low 32 bits hold every NEW*)
        _insn(_JSET, _CLONE_NAMESPACES, jt=0, jf=1),
        _insn(_RET, _EPERM),
        _insn(_RET, _ALLOW),
    ]
    return prog


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_X86_64 = os.uname().machine == "x86_64"
# Built once, at import (in the zygote): a child only makes the one prctl call.
_CODE = b"".join(_program())
_BUFFER = ctypes.create_string_buffer(_CODE, len(_CODE))
_PROG = _SockFprog(len(_CODE) // 8, ctypes.cast(_BUFFER, ctypes.c_void_p))
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


def install_denylist() -> bool:
    """Install the filter on this process (and its future children); False where
    this machine is not x86_64. Needs no_new_privs set first; OSError if refused."""
    if not _X86_64:
        return False
    if _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(_PROG)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"seccomp: {os.strerror(errno)}")
    return True
