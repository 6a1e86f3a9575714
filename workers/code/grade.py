"""Grading one code rollout: `grade_code` turns a response and its row's tests into a
`Verdict` of kind "code" (issue 39, section 2).

The verdict is `correct` only when every test has a passing result recorded here or
by the harness and the number of results equals the number of tests; otherwise it is
`wrong`, with `tests_passed`, `tests_total`, `score` (the fraction passed) and the first
failure (`index`, `kind`: wrong_answer, runtime_error (+ `exception`), timeout, memory,
output_limit; `later`: timeout or memory when a later test failed so). Tests that
cannot be read give `invalid_gold`, a response without code `no_answer`, and a sandbox
that fails or cannot run `error`: never a pass.

A program that exceeds its time limit on one test gets no further test run (they
count as failed): a hostile rollout then costs one test's deadline, not one per test.
A model process that crashed is replaced for the remaining tests (that costs a fork).

A process exit code never decides anything: stdin/stdout runs are compared here, in
the worker, with `compare.stdout_matches`; call and assert tests are decided by the
harness (`harness`), which the model's code never runs in.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers.code.compare import stdout_matches
from workers.code.errors import InvalidTestsError
from workers.code.program import extract_program
from workers.code.sandbox import (
    CodeSandbox,
    RunLimits,
    SandboxObserver,
    SandboxUnavailableError,
)
from workers.code.suite import StdioCase, TestSuite, parse_suite
from workers.code.version import CODE_GRADER_VERSION
from workers.models import (
    LOAD_DEPENDENT_FAILURES,
    Status,
    Verdict,
    ungraded_verdict,
)

__all__ = ["CodeLimits", "configure_default_sandbox", "default_sandbox", "grade_code"]

_SIGKILL, _SIGXCPU = 9, 24
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeLimits:
    """The worker's limits; a row's own time and memory limits apply within them."""

    time_limit_s: float = 4.0  # per test, when the row gives none
    max_time_limit_s: float = 10.0  # cap on a row's per-test time limit
    wall_s: float = 60.0  # the whole rollout: every test, every process start
    memory_bytes: int = 1 << 30  # address space of the model process (the cap)
    output_bytes: int = 4 << 20  # stdout kept per test; more is `output_limit`
    processes: int = 16  # processes and threads the model may run at once
    startup_s: float = 1.0  # extra wall time to load the program (first test)

    def for_suite(self, suite: TestSuite) -> RunLimits:
        time_limit = suite.time_limit_s or self.time_limit_s
        memory = suite.memory_limit_bytes or self.memory_bytes
        return RunLimits(
            time_limit_s=min(time_limit, self.max_time_limit_s),
            wall_s=self.wall_s,
            # Headroom for the interpreter itself: a 256 MB problem still gets to
            # allocate 256 MB of its own objects.
            memory_bytes=min(memory + (64 << 20), self.memory_bytes),
            output_bytes=self.output_bytes,
            processes=self.processes,
            startup_s=self.startup_s,
        )


_DEFAULT: CodeSandbox | None = None
_DEFAULT_OPTIONS: dict[str, Any] = {}  # configure_default_sandbox's


def configure_default_sandbox(
    *, uid_base: int | None = None, observer: SandboxObserver | None = None
) -> None:
    """Options of this process's default sandbox: the slot uids' base (an entry
    point's setting) and who is told of its starts (the worker's metrics). A sandbox
    made before is stopped; the next use starts one with these options."""
    global _DEFAULT
    if uid_base is not None:
        _DEFAULT_OPTIONS["uid_base"] = uid_base
    if observer is not None:
        _DEFAULT_OPTIONS["observer"] = observer
    if _DEFAULT is not None:
        _DEFAULT.close()
        _DEFAULT = None


def default_sandbox() -> CodeSandbox:
    """This process's sandbox, started on first use and stopped at exit."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = CodeSandbox(**_DEFAULT_OPTIONS)
        atexit.register(_DEFAULT.close)
    return _DEFAULT


@dataclass(slots=True)
class _Tally:
    """Per-test results in test order: the only thing a verdict is built from."""

    total: int
    passed: int = 0
    seen: int = 0
    failure: dict[str, Any] | None = None

    def add(self, passed: bool, kind: str, detail: str = "") -> None:
        if passed is True:
            self.passed += 1
        elif self.failure is not None:
            # Only the first failure is shown, but a later test that ran out of time
            # or memory makes the score depend on the machine's load: said, so that
            # the verdict is never cached (`models.is_final`).
            first = self.failure["kind"]
            if kind in LOAD_DEPENDENT_FAILURES and first not in LOAD_DEPENDENT_FAILURES:
                self.failure.setdefault("later", kind)
        else:
            self.failure = {"index": self.seen, "kind": kind or "runtime_error"}
            if detail:
                key = "exception" if kind == "runtime_error" else "detail"
                self.failure[key] = detail[:200]
        self.seen += 1


def _exception_type(stderr_tail: str) -> str:
    lines = [line for line in stderr_tail.splitlines() if line.strip()]
    match = _EXCEPTION_LINE.match(lines[-1]) if lines else None
    return match.group(1)[-80:] if match else ""


def _classify_exit(outcome: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, detail) of a run that did not finish cleanly (or "" when it did)."""
    killed, code = outcome["killed"], outcome["exit"]
    if killed in ("timeout", "output_limit"):
        return killed, ""
    if code in (-_SIGKILL, -_SIGXCPU):  # the CPU rlimit
        return "timeout", "cpu limit"
    if code == 0:
        return "", ""
    exception = _exception_type(str(outcome.get("stderr_tail", "")))
    if exception == "MemoryError":
        return "memory", ""
    if code < 0:
        return "runtime_error", f"signal {-code}"
    return "runtime_error", exception or f"exit code {code}"


def _run_stdio(
    sandbox: CodeSandbox, program: str, suite: TestSuite, limits: RunLimits
) -> _Tally:
    tally = _Tally(len(suite.stdio))
    stdins = [case.stdin for case in suite.stdio]
    outcomes = sandbox.run_stdio(program, suite.setup_code, stdins, limits)
    with contextlib.closing(outcomes):
        for case, outcome in zip(suite.stdio, outcomes, strict=True):
            _tally_stdio(tally, case, outcome, suite.float_tol)
    return tally


def _tally_stdio(
    tally: _Tally, case: StdioCase, outcome: Mapping[str, Any], tol: float | None
) -> None:
    if not outcome["ready"]:
        raise SandboxUnavailableError("a sandboxed process failed to start")
    kind, detail = _classify_exit(outcome)
    if kind:
        tally.add(False, kind, detail)
    elif stdout_matches(outcome["stdout"], case.expected_stdout, tol):
        tally.add(True, "")
    else:
        tally.add(False, "wrong_answer")


def _harness_job(suite: TestSuite) -> dict[str, Any]:
    return {
        "mode": suite.mode,
        "asserts": [case.source for case in suite.asserts],
        "calls": [
            [list(c.args), c.expected, list(c.also_expected)] for c in suite.calls
        ],
        "fn_name": suite.fn_name,
        "entry_point": suite.entry_point,
        "program_names": list(suite.program_names),
        "setup": suite.setup_code,
        "float_tol": suite.float_tol,
    }


def _model_gone(kind: str, model: Mapping[str, Any]) -> tuple[str, str]:
    """Why the model process stopped answering, from how it ended."""
    killed = model.get("killed")
    if killed in ("timeout", "output_limit"):
        return str(killed), ""
    if kind == "timeout":
        return "timeout", ""
    reason = _classify_exit(model)
    return reason if reason[0] else ("runtime_error", "exited")


def _run_harnessed(
    sandbox: CodeSandbox, program: str, suite: TestSuite, limits: RunLimits
) -> _Tally:
    tally = _Tally(len(suite))
    job = _harness_job(suite)
    deadline = time.monotonic() + limits.wall_s
    while tally.seen < tally.total and time.monotonic() < deadline:
        job["start"] = tally.seen
        outcome = sandbox.run_harnessed(program, job, limits)
        model = outcome.model
        if not model.get("ready") and model.get("killed") != "finish":
            # (killed by "finish": the harness was done before it needed the model)
            raise SandboxUnavailableError("the model process failed to start")
        for passed, kind, detail in outcome.results:
            if kind in ("timeout", "crashed") or detail == "model gone":
                kind, detail = _model_gone(kind, outcome.model)
            tally.add(passed is True, kind, detail)
        timed_out = tally.failure is not None and tally.failure["kind"] == "timeout"
        if not outcome.stopped or not outcome.results or timed_out:
            break
    while tally.seen < tally.total:  # after a timeout, or the rollout's wall budget
        tally.add(False, "timeout", "not run")
    return tally


def _code_verdict(status: Status, reason: str, **fields: Any) -> Verdict:
    return ungraded_verdict(status, reason, CODE_GRADER_VERSION).replace(
        kind="code", **fields
    )


def _verdict(tally: _Tally) -> Verdict:
    total = tally.total
    correct = tally.passed == total and tally.seen == total and total > 0
    failure = None if correct else tally.failure
    if not correct and failure is None:
        failure = {"index": tally.seen, "kind": "runtime_error", "detail": "no result"}
    reason = f"{tally.passed}/{total} tests passed"
    if failure is not None:
        reason += f"; test {failure['index']}: {failure['kind']}"
    return _code_verdict(
        Status.CORRECT if correct else Status.WRONG,
        reason,
        correct=correct,
        format_valid=True,
        score=tally.passed / total if total else 0.0,
        tests_passed=tally.passed,
        tests_total=total,
        failure=failure,
    )


def grade_code(
    response: str,
    suite_row: Mapping[str, Any] | TestSuite,
    *,
    prompt: str | None = None,
    entry_point: str | None = None,
    limits: CodeLimits | None = None,
    sandbox: CodeSandbox | None = None,
) -> Verdict:
    """The verdict of one code rollout (see the module docstring)."""
    try:
        suite = (
            suite_row if isinstance(suite_row, TestSuite) else parse_suite(suite_row)
        )
    except InvalidTestsError as exc:
        return _code_verdict(Status.INVALID_GOLD, f"tests unusable: {exc}")
    if len(suite) == 0:
        return _code_verdict(Status.INVALID_GOLD, "tests unusable: zero tests")
    program = extract_program(response, prompt, entry_point or suite.entry_point)
    if program is None:
        return _code_verdict(Status.NO_ANSWER, "no code in the response")
    run_limits = (limits or CodeLimits()).for_suite(suite)
    box = sandbox or default_sandbox()
    try:
        if suite.mode == "stdio":
            tally = _run_stdio(box, program, suite, run_limits)
        else:
            tally = _run_harnessed(box, program, suite, run_limits)
    except SandboxUnavailableError as exc:
        return _code_verdict(Status.ERROR, f"sandbox error: {exc}")
    return _verdict(tally)
