"""What the model's process runs after `isolate.enter_model_sandbox`: the program.

Everything here runs as the sandboxed uid alongside model code, so nothing here is
trusted and nothing here decides a verdict: in stdin/stdout mode the worker compares
the captured stdout, in call/assert mode the harness compares what `serve_calls`
answered. Either entry point ends the process with `os._exit`, so no handler the
program registered (atexit, excepthook, `__del__`) can speak after it. Stdlib only.
"""

from __future__ import annotations

import builtins
import io
import os
import sys
import traceback
from typing import Any, NoReturn

from workers.code.errors import PlainDataError
from workers.code.wire import WireError, read_frame, send_frame

__all__ = ["run_stdio", "serve_calls"]


def _fresh_namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": builtins}


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _exec_program(setup: str, program: str, namespace: dict[str, Any]) -> None:
    if setup:
        exec(compile(setup, "<setup>", "exec"), namespace)
    exec(compile(program, "<program>", "exec"), namespace)


def run_stdio(program: str, setup: str) -> NoReturn:
    """Run the program once with fds 0/1/2 as the test's stdin and captured outputs."""
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace"
    )
    code = 0
    try:
        _exec_program(setup, program, _fresh_namespace())
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # a closed or replaced stream: the output is as it is
            code = code or 1
    os._exit(code)


def _resolve(namespace: dict[str, Any], name: str) -> Any:
    """A top-level function, else a method of a fresh `Solution()` (LeetCode style)."""
    target = namespace.get(name)
    if callable(target):
        return target
    solution = namespace.get("Solution")
    if callable(solution):
        return getattr(solution(), name)
    raise NameError(f"name {name!r} is not defined")


def _answer(namespace: dict[str, Any], request: Any) -> list[Any]:
    name, args, kwargs = request
    try:
        value = _resolve(namespace, name)(*args, **kwargs)
    except BaseException as exc:  # SystemExit too: a call that exits is an error
        return ["raise", type(exc).__name__[:80]]
    return ["ok", value]


def serve_calls(
    program: str, setup: str, fd_in: int, fd_out: int, max_bytes: int
) -> NoReturn:
    """Load the program, then answer the harness's calls until it closes the pipe.

    A request is `[name, args, kwargs]`; the answer `["ok", value]`, `["raise",
    exception type name]`, `["load", exception type name]` (the program failed to
    load), or `["nonplain", type name]` (a value the plain codec refuses).
    """
    namespace = _fresh_namespace()
    load_error = ""
    try:
        _exec_program(setup, program, namespace)
    except BaseException as exc:
        load_error = type(exc).__name__[:80]
    while True:
        try:
            request = read_frame(fd_in, max_bytes=max_bytes)
        except WireError:
            os._exit(0)
        answer = ["load", load_error] if load_error else _answer(namespace, request)
        try:
            send_frame(fd_out, answer, max_bytes=max_bytes)
        except PlainDataError as exc:
            send_frame(fd_out, ["nonplain", str(exc)[:200]], max_bytes=max_bytes)
        except (OSError, WireError):
            os._exit(0)
