"""Pickled tests (LiveCodeBench's private tests), read as plain data only.

LiveCodeBench ships `private_test_cases` as base64(zlib(pickle(json text)));
SandboxFusion's copy ships `test` as base64(zlib(pickle({"input_output": json text}))).
A pickle is a program for a small stack machine that can import and call anything, so
it is never handed to `pickle.loads` as it is:

1. every opcode is checked first (`pickletools.genops` reads them without running
   any) against `_ALLOWED`: constants, strings, numbers, lists, tuples, dicts, sets and
   the memo. GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, EXT*, PERSID and
   everything else that names or calls an object is refused;
2. the allowed stream is then loaded by an `Unpickler` whose `find_class` and
   `persistent_load` refuse everything (a second wall, should the first have a gap).

Sizes are bounded before work: the base64 text, the inflated pickle (`zlib` with a
`max_length`, so a zip bomb stops at the bound).
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import pickletools
import re
import zlib
from typing import Any

from workers.code.errors import InvalidTestsError

__all__ = [
    "MAX_PICKLE_BYTES",
    "decode_pickled_tests",
    "looks_pickled",
    "restricted_loads",
]

# LiveCodeBench's largest private test sets are tens of MB once inflated.
MAX_PICKLE_BYTES = 256 * 1024 * 1024

_BASE64_HEAD = re.compile(r"[A-Za-z0-9+/=]{8,64}")

_ALLOWED = frozenset(
    {
        # framing and memo
        "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
        "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET",
        # constants and numbers
        "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2",
        "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
        # text and bytes
        "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
        "SHORT_BINBYTES", "BINBYTES", "BINBYTES8",
        # containers
        "EMPTY_LIST", "APPEND", "APPENDS", "LIST",
        "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
        "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS",
        "EMPTY_SET", "ADDITEMS", "FROZENSET",
    }
)  # fmt: skip


class _NoObjects(pickle.Unpickler):
    """An unpickler that can build no object of any named class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: global {module[:40]}.{name[:40]}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused: persistent id")


def restricted_loads(data: bytes) -> Any:
    """The plain value `data` pickles; `InvalidTestsError` for any other opcode."""
    try:
        for opcode, _arg, _pos in pickletools.genops(data):
            if opcode.name not in _ALLOWED:
                raise InvalidTestsError(
                    f"pickled tests use refused opcode {opcode.name}"
                )
        return _NoObjects(io.BytesIO(data)).load()
    except InvalidTestsError:
        raise
    except Exception as exc:  # a malformed stream raises many types (EOFError, ...)
        raise InvalidTestsError(
            f"malformed pickled tests: {type(exc).__name__}"
        ) from None


def decode_pickled_tests(text: str, *, max_bytes: int = MAX_PICKLE_BYTES) -> Any:
    """base64 text of a zlib-compressed pickle -> the plain value it holds."""
    if len(text) > max_bytes:
        raise InvalidTestsError("pickled tests larger than the bound")
    try:
        # Some exports wrap base64 at 76 columns: line breaks are not data.
        packed = base64.b64decode("".join(text.split()).encode("ascii"), validate=True)
    except (ValueError, binascii.Error):  # UnicodeEncodeError is a ValueError
        raise InvalidTestsError("pickled tests are not valid base64") from None
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(packed, max_bytes)
    except zlib.error:
        raise InvalidTestsError("pickled tests are not valid zlib data") from None
    if inflater.unconsumed_tail:
        raise InvalidTestsError(f"pickled tests inflate past {max_bytes} bytes")
    return restricted_loads(raw)


def looks_pickled(text: str) -> bool:
    """Cheap: base64 text of zlib data (a zlib stream opens with 0x78, base64 `e`)."""
    return _BASE64_HEAD.fullmatch(text[:64]) is not None and text.startswith("e")
