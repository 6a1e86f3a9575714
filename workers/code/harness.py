"""The trusted test runner of call- and assert-based tests: it holds the tests and the
expected values and decides pass or fail; the model's code never runs in it.

It runs in its own process (forked by the harness zygote, dropped to its own non-root
uid, inside bubblewrap) and reaches the model's functions only through `ModelProxy`,
which sends `[name, args, kwargs]` down a pipe and gets plain data back (exact builtin
types, `workers.code.plain`): a returned object with a lying `__eq__`, or a subclass of
int, never exists here. A test passes only when its own code ran to the end here and
no call failed in the model (raised, died, timed out, or answered a non-plain value),
so a test that swallows exceptions with a bare `except` still fails a broken model.

Call mode (`fn_name`): `call_matches(proxy(*args), case)`. Assert mode: the test's
source (an MBPP assert, or a HumanEval `check` def with `check(entry_point)`) is exec'd
here with each name it reads from the program (`TestSuite.program_names`, the entry
point) bound to a proxy of the model's object of that name. Stdlib only.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import sys
import time
from typing import Any

from workers.code.compare import call_matches
from workers.code.suite import CallCase
from workers.code.wire import WireError, WireTimeout, read_frame, send_frame

__all__ = ["ModelGoneError", "ModelProxy", "run_harness"]

_STDLIB = frozenset(sys.stdlib_module_names)
# Raised as themselves they would steer the test's own code: a StopIteration from a
# function that `map` calls ends the map early, so `all(map(...))` would be True.
_CONTROL_FLOW = (StopIteration, StopAsyncIteration)


class ModelGoneError(BaseException):
    """The model process died, timed out or answered garbage: the test fails (a
    BaseException, so `except Exception` in a test does not swallow it)."""


class _ModelRaisedError(Exception):
    """The model's function raised an exception of a non-builtin type."""


class ModelProxy:
    """Calls the model's functions over the pipe, within the current test's deadline."""

    def __init__(self, fd_to: int, fd_from: int, max_bytes: int) -> None:
        self._fd_to, self._fd_from, self._max_bytes = fd_to, fd_from, max_bytes
        self.deadline = 0.0
        self.gone = ""  # "timeout" or "crashed": no further call can be answered
        self.failure: tuple[str, str] | None = None  # this test's (kind, detail)

    def function(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(name, args, kwargs)

        call.__name__ = call.__qualname__ = name
        return call

    def _fail(self, kind: str, detail: str) -> None:
        if self.failure is None:
            self.failure = (kind, detail)

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.gone:
            raise ModelGoneError(self.gone)
        try:
            send_frame(self._fd_to, [name, args, kwargs], max_bytes=self._max_bytes)
            answer = read_frame(
                self._fd_from,
                max_bytes=self._max_bytes,
                deadline=self.deadline,
                timed=True,
            )
        except WireTimeout:
            self.gone = "timeout"
        except (WireError, OSError):
            self.gone = "crashed"
        if self.gone:
            self._fail(self.gone, "")
            raise ModelGoneError(self.gone)
        return self._unpack(answer)

    def _unpack(self, answer: Any) -> Any:
        tag = answer[0] if type(answer) is list and len(answer) == 2 else None
        if tag == "ok":
            return answer[1]
        detail = str(answer[1])[:200] if tag else "malformed answer"
        if tag in ("raise", "load"):
            if tag == "load":  # no test passes a program that does not load
                self._fail("runtime_error", detail)
            exc_type = getattr(builtins, detail, None)
            if (
                isinstance(exc_type, type)
                and issubclass(exc_type, Exception)
                and not issubclass(exc_type, _CONTROL_FLOW)
            ):
                raise exc_type(f"raised in the model's code ({detail})")
            raise _ModelRaisedError(detail)
        self._fail("wrong_answer", f"non-plain value: {detail}")
        raise ModelGoneError("non-plain value")


def _free_names(tree: ast.Module) -> set[str]:
    """Names the test reads but never binds (its calls of the model's functions)."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return loaded - bound - set(dir(builtins))


def _test_namespace(
    tree: ast.Module, setup_env: dict[str, Any], proxy: ModelProxy, job: dict[str, Any]
) -> dict[str, Any]:
    """The test's globals: the setup's names, a proxy for each name the suite says
    the test reads from the program (a builtin's name too, when the program shadows
    it), and for any other free name a stdlib module of that name, else a proxy."""
    env = dict(setup_env)
    named = {
        *job["program_names"],
        *([job["entry_point"]] if job["entry_point"] else []),
    }
    for name in _free_names(tree) - set(env) - named:
        if name in _STDLIB:
            env[name] = importlib.import_module(name)
        else:
            named.add(name)
    for name in named:
        env[name] = proxy.function(name)
    return env


def _run_assert(tree: ast.Module, env: dict[str, Any]) -> tuple[bool, str, str]:
    try:
        exec(compile(tree, "<test>", "exec"), env)
    except AssertionError:
        return False, "wrong_answer", "assertion failed"
    except ModelGoneError:
        return False, "runtime_error", "model gone"
    except Exception as exc:
        return False, "runtime_error", type(exc).__name__
    return True, "", ""


def _run_call(
    proxy: ModelProxy, job: dict[str, Any], index: int
) -> tuple[bool, str, str]:
    args, expected, also = job["calls"][index]
    try:
        actual = proxy.call(job["fn_name"], tuple(args), {})
    except ModelGoneError:
        return False, "runtime_error", "model gone"
    except Exception as exc:
        return False, "runtime_error", type(exc).__name__
    case = CallCase(args=tuple(args), expected=expected, also_expected=tuple(also))
    if call_matches(actual, case, job["float_tol"]):
        return True, "", ""
    return False, "wrong_answer", ""


def run_harness(job: dict[str, Any], fd_to: int, fd_from: int) -> dict[str, Any]:
    """Run tests `job["start"]`.. in order; stop after the model process is gone.

    Returns `{"results": [[passed, kind, detail], ...], "stopped": bool}`: `stopped`
    when the model died or timed out and tests are left for a fresh model process.
    """
    proxy = ModelProxy(fd_to, fd_from, job["max_bytes"])
    setup_env: dict[str, Any] = {"__name__": "__test__", "__builtins__": builtins}
    if job["setup"]:
        exec(compile(job["setup"], "<setup>", "exec"), setup_env)
    total = len(job["asserts"]) if job["mode"] == "assert" else len(job["calls"])
    results: list[list[Any]] = []
    for index in range(job["start"], total):
        # The first test also waits for the program to load.
        slack = job["startup_s"] if index == job["start"] else 0.0
        proxy.deadline = time.monotonic() + job["time_limit_s"] + slack
        proxy.failure = None
        if job["mode"] == "assert":
            # Parsed once: for its free names, then compiled from the tree.
            tree = ast.parse(job["asserts"][index])
            env = _test_namespace(tree, setup_env, proxy, job)
            passed, kind, detail = _run_assert(tree, env)
        else:
            passed, kind, detail = _run_call(proxy, job, index)
        if proxy.failure is not None:  # a call failed, whatever the test made of it
            passed, (kind, detail) = False, proxy.failure
        results.append([passed, kind, detail])
        if proxy.gone:
            break
    stopped = bool(proxy.gone) and job["start"] + len(results) < total
    return {"results": results, "stopped": stopped}
