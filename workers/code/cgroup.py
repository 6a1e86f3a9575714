"""A slot's CPU and process-count cgroup, when the host lets the worker make one.

Why: the model's uid bounds how many processes a rollout can have (RLIMIT_NPROC), not
how much CPU they take; a fork bomb's processes would each get a full share of the
CPU against every honest rollout on the machine. With the slot's model zygote (and so
every rollout it starts) in its own `cpu` cgroup, a rollout gets one share however
many processes it runs, and a `pids` cgroup bounds the slot's processes a second time.

cgroup v1 hierarchies only (`/sys/fs/cgroup/cpu`, `/sys/fs/cgroup/pids`), where this
host has them; where they are missing or not writable the slot runs without (the uid
limit still holds). The directories are removed when the sandbox closes.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["SlotCgroup"]

_V1_ROOT = Path("/sys/fs/cgroup")
_GROUP = "gradefleet-code"
# A rollout's weight against one ordinary process (1024): the trusted processes that
# keep the pipeline moving (workers, harness) come first when the CPU is contended.
CPU_SHARES = 128


class SlotCgroup:
    """The `cpu` and `pids` cgroups of one slot (those that could be made)."""

    def __init__(self, slot: int, max_processes: int, root: Path = _V1_ROOT) -> None:
        self.dirs: list[Path] = []
        for controller in ("cpu", "pids"):
            # Directly under the root: a slot competes as one task does, where under
            # a common group all slots together would get one task's share.
            path = root / controller / f"{_GROUP}-slot-{slot}"
            try:
                path.mkdir(parents=True, exist_ok=True)
                if controller == "pids":
                    (path / "pids.max").write_text(str(max_processes))
                else:
                    (path / "cpu.shares").write_text(str(CPU_SHARES))
            except OSError:
                continue
            self.dirs.append(path)

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` started from a shell that first moves itself into the cgroups, so
        every process the command starts is in them from its first instruction."""
        if not self.dirs:
            return argv
        moves = " && ".join(f"echo $$ > {d / 'cgroup.procs'}" for d in self.dirs)
        return ["/bin/sh", "-c", f'{moves} && exec "$0" "$@"', *argv]

    def remove(self) -> None:
        """Remove the cgroups, waiting up to a second for the killed sandbox's
        processes to leave them."""
        deadline = time.monotonic() + 1.0
        for path in self.dirs:
            while path.exists():
                try:
                    path.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
        self.dirs = []
