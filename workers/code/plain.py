"""The plain-data codec of the channel between the test harness and the model's process.

Only values built from exact builtin types cross the channel: `None`, `bool`, `int`
(at most `MAX_INT_DIGITS` decimal digits), `float` (nan and infinities included),
`complex`, `str`, `bytes`, `list`, `tuple`, `dict`, `set` and `frozenset`, nested at
most `MAX_DEPTH` deep; `collections.Counter`, `OrderedDict` and `defaultdict` (exact
classes) are sent as the plain dict of their items (Python compares them equal to a
dict; MBPP's references return Counters), and arrive as `dict`. The check is
`type(x) is int`, never `isinstance`: a subclass of a builtin or any user-defined
object (one whose `__eq__` always returns True, one that lies about its type) is
refused with `PlainDataError`, so no object the model made ever reaches a comparison
on the trusted side. Cycles are refused by the depth
bound. Pickle is never used: decoding builds only the types above.

Encoding: compact ASCII JSON. `None`, `bool`, `int`, `float`, `str` and `list` are
themselves; every other type is a one-key JSON object naming it:

    {"t": [...]} tuple      {"s": [...]} set        {"f": [...]} frozenset
    {"d": [[k, v], ...]} dict (keys of any plain hashable type, insertion order)
    {"b": "<base64>"} bytes {"c": [re, im]} complex

Set elements are written sorted by their encoding, so equal sets encode equally
(the encoding doubles as canonical text for cache keys, see `suite.suite_key`).

`decode_plain` treats its bytes as hostile (the model's process writes them): a size
bound before parsing, UTF-8 and JSON strictly, integers bounded before conversion,
the depth bound, unknown or malformed tags, unhashable set elements or dict keys:
each is a `PlainDataError`, never another exception.

Stdlib only: the sandbox imports this module.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any

from workers.code.errors import PlainDataError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "PlainDataError",
    "decode_plain",
    "encode_plain",
    "from_tagged",
    "to_tagged",
]

# Nesting of containers (a top-level scalar has depth 0). Generous for real return
# values (matrices, trees as nested lists) and far below the interpreter's recursion
# limit, which both our walks and the stdlib's JSON parser would otherwise hit.
MAX_DEPTH = 100
# Below CPython's default int/str conversion limit (4300 digits), so encoding never
# trips it; 2**13_000 has 3914 digits, so every int we encode decodes again.
MAX_INT_DIGITS = 4000
_MAX_INT_BITS = 13_000
DEFAULT_MAX_BYTES = 4 * 1024 * 1024

_ENCODER = json.JSONEncoder(
    ensure_ascii=True, separators=(",", ":"), allow_nan=True, check_circular=False
)


class _Budget:
    """Nodes left to encode: every node costs at least one output byte, so a value
    with more nodes than `max_bytes` is refused before it is walked to the end."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise PlainDataError("value too large for the channel")


def to_tagged(value: Any, *, max_nodes: int = DEFAULT_MAX_BYTES) -> Any:
    """`value` as a JSON-able tree of the tagged form; `PlainDataError` if not plain."""
    return _tag(value, 0, _Budget(max_nodes))


def _tag(value: Any, depth: int, budget: _Budget) -> Any:
    kind = type(value)
    if kind is str or kind is bool or kind is float or value is None:
        return value
    if kind is int:
        if value.bit_length() > _MAX_INT_BITS:
            raise PlainDataError(f"int with more than {MAX_INT_DIGITS} digits")
        return value
    if depth >= MAX_DEPTH:
        raise PlainDataError(f"nesting deeper than {MAX_DEPTH} (or a cycle)")
    tagger = _TAGGERS.get(kind)
    if tagger is None:
        raise PlainDataError(f"not plain data: a {_type_name(kind)}")
    return tagger(value, depth + 1, budget)


def _type_name(kind: type) -> str:
    # Runs where the value was made (the model's process for a return value), so a
    # class whose name misbehaves only fails its own test; keep the text short and
    # say when it subclasses a builtin (the usual disguise).
    try:
        name = str(type.__dict__["__qualname__"].__get__(kind))[:60]
        disguised = any(base in _SCALARS or base in _TAGGERS for base in kind.__mro__)
    except Exception:
        return "object of an unnamed type"
    return f"{name} (a subclass of a builtin)" if disguised else name


def _tag_items(items: Any, depth: int, budget: _Budget) -> list[Any]:
    budget.take(len(items))
    # Fast path (a list of ints or of strings is the usual result): the type check
    # and the int bound run in C over the whole container.
    kinds = set(map(type, items))
    if kinds <= _TEXTS_AND_FLOATS:
        return list(items)
    if kinds <= _INTS and (
        not items or max(map(int.bit_length, items)) <= _MAX_INT_BITS
    ):
        return list(items)
    return [_tag(item, depth, budget) for item in items]


def _tag_list(value: list[Any], depth: int, budget: _Budget) -> Any:
    return _tag_items(value, depth, budget)


def _tag_tuple(value: tuple[Any, ...], depth: int, budget: _Budget) -> Any:
    return {"t": _tag_items(value, depth, budget)}


def _sorted_items(value: set[Any] | frozenset[Any], depth: int, budget: _Budget) -> Any:
    tagged = _tag_items(value, depth, budget)
    return sorted(tagged, key=_ENCODER.encode)


def _tag_set(value: set[Any], depth: int, budget: _Budget) -> Any:
    return {"s": _sorted_items(value, depth, budget)}


def _tag_frozenset(value: frozenset[Any], depth: int, budget: _Budget) -> Any:
    return {"f": _sorted_items(value, depth, budget)}


def _tag_dict(value: dict[Any, Any], depth: int, budget: _Budget) -> Any:
    budget.take(2 * len(value))
    # `dict.items`, not `value.items`: a Counter's methods can be patched by the code
    # that made it; the dict's own storage cannot.
    return {
        "d": [
            [_tag(k, depth, budget), _tag(v, depth, budget)]
            for k, v in dict.items(value)
        ]
    }


def _tag_bytes(value: bytes, depth: int, budget: _Budget) -> Any:
    budget.take(len(value))
    return {"b": base64.b64encode(value).decode("ascii")}


def _tag_complex(value: complex, depth: int, budget: _Budget) -> Any:
    return {"c": [value.real, value.imag]}


_SCALARS = (int, float, str, bool)
_TEXTS_AND_FLOATS = frozenset({str, float, bool, type(None)})
_INTS = frozenset({int, bool})
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})
_TAGGERS: dict[type, Callable[[Any, int, _Budget], Any]] = {
    list: _tag_list,
    tuple: _tag_tuple,
    set: _tag_set,
    frozenset: _tag_frozenset,
    dict: _tag_dict,
    # The stdlib's dict kinds travel as plain dicts (exact classes only, read through
    # `dict.items`): Python compares them equal to dicts, and MBPP references return
    # Counters where the tests expect dicts.
    Counter: _tag_dict,
    OrderedDict: _tag_dict,
    defaultdict: _tag_dict,
    bytes: _tag_bytes,
    complex: _tag_complex,
}


def encode_plain(value: Any, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """`value` as channel bytes; `PlainDataError` if it is not plain data or too big."""
    text = _ENCODER.encode(to_tagged(value, max_nodes=max_bytes))
    if len(text) > max_bytes:
        raise PlainDataError(f"value encodes to more than {max_bytes} bytes")
    return text.encode("ascii")


_LONG_DIGITS = re.compile(f"[0-9]{{{MAX_INT_DIGITS + 1}}}")


def _bounded_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS + 1:  # + 1: a minus sign
        raise PlainDataError(f"int with more than {MAX_INT_DIGITS} digits")
    return int(text)


def decode_plain(data: bytes, max_bytes: int) -> Any:
    """The value `data` encodes; `PlainDataError` for anything but a valid encoding."""
    if type(data) is not bytes:
        raise PlainDataError("channel data must be bytes")
    if len(data) > max_bytes:
        raise PlainDataError(f"channel data larger than {max_bytes} bytes")
    try:
        text = data.decode("utf-8")
        # Integers are bounded before conversion; the per-int hook is only needed
        # when some digit run is that long (most data never has one).
        hook = _bounded_int if _LONG_DIGITS.search(text) else None
        tree = json.loads(text, parse_int=hook)
    except PlainDataError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise PlainDataError(f"malformed channel data: {type(exc).__name__}") from None
    return from_tagged(tree)


def from_tagged(tree: Any) -> Any:
    """The value a tagged JSON tree (as `json.loads` returns it) stands for."""
    return _untag(tree, 0)


def _untag(node: Any, depth: int) -> Any:
    kind = type(node)
    if kind is list:
        if depth >= MAX_DEPTH:
            raise PlainDataError(f"nesting deeper than {MAX_DEPTH}")
        if set(map(type, node)) <= _JSON_SCALARS:  # nothing to untag (checked in C)
            return node
        return [_untag(item, depth + 1) for item in node]
    if kind is dict:
        if depth >= MAX_DEPTH:
            raise PlainDataError(f"nesting deeper than {MAX_DEPTH}")
        return _untag_object(node, depth + 1)
    return node  # str, int, float, bool, None: json.loads makes nothing else


def _untag_object(node: dict[str, Any], depth: int) -> Any:
    if len(node) != 1:
        raise PlainDataError("malformed tag: an object must have exactly one key")
    ((tag, body),) = node.items()
    builder = _BUILDERS.get(tag)
    if builder is None:
        raise PlainDataError(f"unknown tag {tag[:20]!r}")
    try:
        return builder(body, depth)
    except TypeError:  # unhashable set element or dict key, wrong body shape
        raise PlainDataError(f"malformed {tag!r} value") from None


def _items(body: Any, depth: int) -> list[Any]:
    if type(body) is not list:
        raise PlainDataError("malformed tag: expected a list")
    return [_untag(item, depth) for item in body]


def _build_dict(body: Any, depth: int) -> dict[Any, Any]:
    if type(body) is not list:
        raise PlainDataError("malformed tag: expected a list")
    out: dict[Any, Any] = {}
    for pair in body:  # a [key, value] pair is not a container level of the value
        if type(pair) is not list or len(pair) != 2:
            raise PlainDataError("malformed dict entry")
        out[_untag(pair[0], depth)] = _untag(pair[1], depth)
    return out


def _build_bytes(body: Any, depth: int) -> bytes:
    if type(body) is not str:
        raise PlainDataError("malformed bytes")
    try:
        return base64.b64decode(body.encode("ascii"), validate=True)
    except (ValueError, binascii.Error):
        raise PlainDataError("malformed bytes") from None


def _build_complex(body: Any, depth: int) -> complex:
    parts = _items(body, depth)
    if len(parts) != 2 or any(type(p) is not float for p in parts):
        raise PlainDataError("malformed complex")
    return complex(parts[0], parts[1])


_BUILDERS: dict[str, Callable[[Any, int], Any]] = {
    "t": lambda body, depth: tuple(_items(body, depth)),
    "s": lambda body, depth: set(_items(body, depth)),
    "f": lambda body, depth: frozenset(_items(body, depth)),
    "d": _build_dict,
    "b": _build_bytes,
    "c": _build_complex,
}
