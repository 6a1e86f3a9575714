"""A code rollout as an ordinary (response, gold) item: the gold is the row's tests,
encoded, so the kind travels in the gold (issue 39, section 6).

`encode_code_gold(row)` keeps only the fields `suite.parse_suite` and
`program.extract_program` read (`CODE_ROW_FIELDS`, `CODE_NESTED_FIELDS`) as canonical
JSON behind `CODE_GOLD_PREFIX`, a prefix no math gold starts with (it opens with a NUL).
Everything that moves (response, gold) pairs — the wire format, batches, line mode,
the caches — then carries code rows unchanged; `is_code_gold` (a `startswith`) is how
the engine tells the kinds apart, and `grade_code_item` grades one.

`may_be_code_row` is the cheap gate for input records: a record with none of the
trigger fields is math without looking further (a set test on its keys); only a
record with one asks `suite.is_code_row`.

Import-light (stdlib only at import time): the CLI and every worker import this
through `workers.kinds`; the suite reader and the sandbox load on the first code row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from workers.code.version import CODE_GRADER_VERSION
from workers.errors import ConfigError
from workers.models import (
    CODE_GOLD_PREFIX,
    GradeOptions,
    Status,
    Verdict,
    ungraded_verdict,
)

if TYPE_CHECKING:
    from workers.code.grade import CodeLimits
    from workers.code.suite import TestSuite

__all__ = [
    "CODE_EXTRA_ALIASES",
    "CODE_GOLD_PREFIX",
    "CODE_NESTED_FIELDS",
    "CODE_ROW_FIELDS",
    "CODE_TEST_ALIASES",
    "TRIGGER_FIELDS",
    "code_limits_from_env",
    "code_row_limits",
    "code_uid_base_from_env",
    "decode_code_gold",
    "encode_code_gold",
    "grade_code_item",
    "is_code_gold",
    "may_be_code_row",
    "set_code_limits",
]


# The top-level fields `parse_suite` (tests, function names, limits, tolerance) and
# `extract_program` (prompt, entry point) read.
CODE_ROW_FIELDS = (
    "input_output",
    "tests",
    "official_tests",
    "ground_truth",
    "verification_info",
    "public_tests",
    "private_tests",
    "generated_tests",
    "public_test_cases",
    "private_test_cases",
    "test",
    "test_list",
    "test_setup_code",
    "assert_case",
    "entry_point",
    "fn_name",
    "func_name",
    "prompt",
    "time_limit_s",
    "time_limit",
    "memory_limit_bytes",
    "memory_limit_mb",
    "memory_limit",
    "float_tol",
    "atol",
    "abs_tol",
    "tolerance",
)
# Nested fields they read: only these keys of these objects are kept.
CODE_NESTED_FIELDS: dict[str, tuple[str, ...]] = {
    "reward_model": ("ground_truth",),
    "verifier_metadata": ("unit_tests",),
    "metadata": ("func_name", "fn_name", "entry_point"),
    "labels": ("test_setup_code",),
}
# A record with none of these keys is not a code row (`suite.is_code_row` reads no
# other top-level field to decide).
TRIGGER_FIELDS = frozenset(
    {
        "input_output",
        "tests",
        "official_tests",
        "verification_info",
        "public_tests",
        "private_tests",
        "generated_tests",
        "public_test_cases",
        "private_test_cases",
        "test",
        "test_list",
        "assert_case",
        "verifier_metadata",
        "reward_model",
        "ground_truth",
    }
)

# What `gradefleet grade --help` lists: the test fields a row is read as code by.
CODE_TEST_ALIASES = (
    "input_output",
    "tests",
    "verifier_metadata.unit_tests",
    "reward_model.ground_truth / ground_truth (when it holds tests)",
    "official_tests",
    "verification_info.test_cases",
    "public_tests/private_tests/generated_tests",
    "public_test_cases/private_test_cases",
    "test (+ entry_point)",
    "test_list (+ test_setup_code)",
    "assert_case",
)
CODE_EXTRA_ALIASES = (
    "fn_name",
    "prompt",
    "entry_point",
    "time_limit",
    "memory_limit",
    "float_tol",
)

_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
)
_SUITES_MAX = 256  # parsed suites kept per process, by gold text (a row's samples)
_suites: dict[str, TestSuite | str] = {}  # gold -> suite, or why it is unusable
_limits: list[CodeLimits] = []  # set_code_limits' value; empty: CodeLimits()


def may_be_code_row(record: Mapping[str, Any]) -> bool:
    """Whether `record` may carry tests (then ask `is_code_row`): a key test only."""
    return not TRIGGER_FIELDS.isdisjoint(record)


def is_code_row(record: Mapping[str, Any]) -> bool:
    """Whether `record` carries code tests (`suite.is_code_row`, behind the gate)."""
    if not may_be_code_row(record):
        return False
    from workers.code.suite import is_code_row as row_has_tests

    return row_has_tests(record)


def _code_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for name in CODE_ROW_FIELDS:
        value = record.get(name)
        if value is not None and not (name == "prompt" and not isinstance(value, str)):
            kept[name] = value  # a chat prompt (a list of messages) is not code
    for name, keys in CODE_NESTED_FIELDS.items():
        value = record.get(name)
        if isinstance(value, Mapping):
            inner = {key: value[key] for key in keys if value.get(key) is not None}
            if inner:
                kept[name] = inner
        elif isinstance(value, str):
            kept[name] = value  # JSON text of an object: read whole by the suite
    return kept


def encode_code_gold(record: Mapping[str, Any]) -> str:
    """The gold of a code row: `CODE_GOLD_PREFIX` + canonical JSON of its test fields
    (equal rows give equal golds, so the caches see one problem as one)."""
    return CODE_GOLD_PREFIX + _CANONICAL.encode(_code_fields(record))


def is_code_gold(gold: str) -> bool:
    return gold.startswith(CODE_GOLD_PREFIX)


def decode_code_gold(gold: str) -> dict[str, Any]:
    """The row fields of a code gold; ValueError when it is not one."""
    if not is_code_gold(gold):
        raise ValueError("not a code gold")
    row = json.loads(gold[len(CODE_GOLD_PREFIX) :])
    if not isinstance(row, dict):
        raise ValueError("a code gold holds a JSON object")
    return row


def set_code_limits(limits: CodeLimits) -> None:
    """This process's code limits (an entry point's settings; default CodeLimits())."""
    _limits[:] = [limits]


_LIMIT_VARIABLES = (
    "GRADEFLEET_CODE_TIME_LIMIT_S",
    "GRADEFLEET_CODE_WALL_S",
    "GRADEFLEET_CODE_MEMORY_MB",
)


def code_limits_from_env(env: Mapping[str, str]) -> CodeLimits | None:
    """The code limits an entry point's environment asks for (`GRADEFLEET_CODE_
    TIME_LIMIT_S`: per test when the row gives none, `GRADEFLEET_CODE_WALL_S`: a
    whole rollout, `GRADEFLEET_CODE_MEMORY_MB`: the model process's address space);
    the defaults of `CodeLimits` for those unset; None when none is set.

    Raises:
        ConfigError: a value that is not a positive number.
    """
    if not any(env.get(name) for name in _LIMIT_VARIABLES):
        return None
    from workers.code.grade import CodeLimits

    default = CodeLimits()
    time_limit_s = _positive(env, "GRADEFLEET_CODE_TIME_LIMIT_S", default.time_limit_s)
    memory_mb = _positive(env, "GRADEFLEET_CODE_MEMORY_MB", default.memory_bytes >> 20)
    return CodeLimits(
        time_limit_s=time_limit_s,
        max_time_limit_s=max(default.max_time_limit_s, time_limit_s),
        wall_s=_positive(env, "GRADEFLEET_CODE_WALL_S", default.wall_s),
        memory_bytes=int(memory_mb * (1 << 20)),
    )


# The slot uids run from the base to base + 2 x 4,096 slots; a user namespace of
# 65,536 ids (Kubernetes' hostUsers: false) holds 1,000 ... 57,344 with the ids of
# the image's own accounts below.
_UID_BASE_RANGE = (1_000, 2**32 - 2 - 2 * 4_096)


def code_uid_base_from_env(env: Mapping[str, str]) -> int | None:
    """The first uid of the code sandbox's slots (`GRADEFLEET_CODE_UID_BASE`;
    `workers.code.sandbox.UID_BASE` when unset: None).

    Raises:
        ConfigError: a value that is not an integer in range.
    """
    raw = env.get("GRADEFLEET_CODE_UID_BASE")
    if raw is None or raw.strip() == "":
        return None
    low, high = _UID_BASE_RANGE
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not low <= value <= high:
        raise ConfigError(
            f"GRADEFLEET_CODE_UID_BASE={raw!r} is not an integer in {low}..{high}"
        )
    return value


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ConfigError(f"{name}={raw!r} is not a positive number")
    return value


def code_row_limits() -> CodeLimits:
    """The limits `grade_code_item` grades with in this process."""
    if not _limits:
        from workers.code.grade import CodeLimits

        _limits.append(CodeLimits())
    return _limits[0]


def _invalid(reason: str) -> Verdict:
    verdict = ungraded_verdict(Status.INVALID_GOLD, reason, CODE_GRADER_VERSION)
    return verdict.replace(kind="code")


def _suite(gold: str, row: Mapping[str, Any]) -> TestSuite | str:
    """The row's parsed suite, or why it has none (memoised by gold text)."""
    found = _suites.get(gold)
    if found is not None:
        return found
    from workers.code.errors import InvalidTestsError
    from workers.code.suite import parse_suite

    try:
        suite: TestSuite | str = parse_suite(row)
    except InvalidTestsError as exc:
        suite = f"tests unusable: {exc}"
    except (RecursionError, MemoryError, ValueError, TypeError) as exc:
        suite = f"tests unusable: {type(exc).__name__}"
    if len(_suites) >= _SUITES_MAX:
        _suites.clear()
    _suites[gold] = suite
    return suite


def grade_code_item(
    response: str,
    gold: str,
    *,
    options: GradeOptions | None = None,
    limits: CodeLimits | None = None,
) -> Verdict:
    """The verdict of one code rollout whose gold is `encode_code_gold(row)`, graded
    in this process's default sandbox (`grade.default_sandbox`). `options` are the
    math verifier's and do not apply (accepted for the `KindGrader` signature)."""
    del options
    try:
        row = decode_code_gold(gold)
    except ValueError as exc:
        return _invalid(f"code gold unreadable: {exc}")
    suite = _suite(gold, row)
    if isinstance(suite, str):
        return _invalid(suite)
    from workers.code.grade import grade_code

    prompt = row.get("prompt")
    entry_point = row.get("entry_point")
    if entry_point is None and isinstance(row.get("metadata"), Mapping):
        entry_point = row["metadata"].get("entry_point")
    return grade_code(
        response,
        suite,
        prompt=prompt if isinstance(prompt, str) else None,
        entry_point=entry_point if isinstance(entry_point, str) else None,
        limits=limits or code_row_limits(),
    )
