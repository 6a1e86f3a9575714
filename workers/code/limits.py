"""Per-problem limits a row asks for: time per test, memory, a float tolerance.

Read from the row's top level (the worker caps them; a row can never raise a cap):
- `time_limit_s`, or `time_limit`: seconds as a number, `{"seconds", "nanos"}`
  (CodeContests), or text such as "2 seconds", "1.5s", "500 ms";
- `memory_limit_bytes`, `memory_limit_mb`, or `memory_limit`: a number is megabytes
  (TACO, SandboxFusion), or text such as "256 megabytes", "1 GB";
- a float tolerance from `float_tol`, `atol`, `abs_tol` or `tolerance` (first found;
  its meaning, absolute-or-relative error, is in `compare`).
A limit that is present but unusable (negative, zero, not finite, unreadable text) is
an `InvalidTestsError`: the row is broken, not unlimited.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from workers.code.errors import InvalidTestsError

__all__ = ["row_limits"]

_UNITS_S = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "ms": 1e-3,
    "millisecond": 1e-3,
}
_UNITS_BYTES = {
    "": 1 << 20,  # a bare number is megabytes (TACO, SandboxFusion)
    "b": 1, "byte": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "kilobyte": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20, "megabyte": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "gigabyte": 1 << 30,
}  # fmt: skip
_QUANTITY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTestsError(f"{where}: expected a number")
    if not math.isfinite(value) or value <= 0:
        raise InvalidTestsError(f"{where}: expected a positive number")
    return float(value)


def _quantity(value: Any, units: Mapping[str, float], where: str) -> float:
    """A number, or text like "2 seconds" / "256 megabytes" in the given units."""
    if isinstance(value, str):
        match = _QUANTITY.fullmatch(value)
        unit = match.group(2).lower() if match else ""
        if unit not in units and unit.endswith("s"):  # "seconds", "megabytes"
            unit = unit[:-1]
        if match is None or unit not in units:
            raise InvalidTestsError(f"{where}: cannot read {value[:40]!r}")
        return _positive(float(match.group(1)) * units[unit], where)
    return _positive(value, where) * units[""]


def _time_limit_s(row: Mapping[str, Any]) -> float | None:
    if row.get("time_limit_s") is not None:
        return _positive(row["time_limit_s"], "time_limit_s")
    value = row.get("time_limit")
    if value is None:
        return None
    if isinstance(value, Mapping):  # CodeContests: {"seconds": 2, "nanos": 0}
        seconds = value.get("seconds") or 0
        nanos = value.get("nanos") or 0
        if not isinstance(seconds, int | float) or not isinstance(nanos, int | float):
            raise InvalidTestsError("time_limit: expected seconds and nanos")
        return _positive(seconds + nanos / 1e9, "time_limit")
    return _quantity(value, _UNITS_S, "time_limit")


def _memory_limit_bytes(row: Mapping[str, Any]) -> int | None:
    if row.get("memory_limit_bytes") is not None:
        return int(_positive(row["memory_limit_bytes"], "memory_limit_bytes"))
    if row.get("memory_limit_mb") is not None:
        return int(_positive(row["memory_limit_mb"], "memory_limit_mb") * (1 << 20))
    if row.get("memory_limit") is not None:
        return int(_quantity(row["memory_limit"], _UNITS_BYTES, "memory_limit"))
    return None


_TOLERANCE_FIELDS = ("float_tol", "atol", "abs_tol", "tolerance")


def _float_tol(row: Mapping[str, Any]) -> float | None:
    for name in _TOLERANCE_FIELDS:
        if row.get(name) is not None:
            return _positive(row[name], name)
    return None


def row_limits(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "time_limit_s": _time_limit_s(row),
        "memory_limit_bytes": _memory_limit_bytes(row),
        "float_tol": _float_tol(row),
    }
