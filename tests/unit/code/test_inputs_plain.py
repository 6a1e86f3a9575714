"""The plain-data channel codec: exact builtin types round-trip; nothing else crosses.

A returned value of a user-defined type or a subclass of a builtin must never reach a
comparison on the trusted side, and bytes from the model's process are hostile.
"""

from __future__ import annotations

import json
import math
from collections import Counter, OrderedDict, defaultdict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.code.errors import CodeGraderError, PlainDataError
from workers.code.plain import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    decode_plain,
    encode_plain,
    from_tagged,
    to_tagged,
)

BIG = 1 << 20


def roundtrip(value: Any) -> Any:
    return decode_plain(encode_plain(value), BIG)


def same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (nan equal to nan)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


PLAIN_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    10**3000,
    -(10**3000),
    1.5,
    -0.0,
    float("inf"),
    float("-inf"),
    1e-320,
    "",
    "héllo\n\x00\u2028",
    "lone \ud800 surrogate",
    b"",
    b"\x00\xff bytes",
    3 + 4j,
    complex(float("inf"), -0.0),
    [],
    (),
    (1,),
    [1, [2, [3, []]]],
    (1, "a", (2.0, None)),
    {"a": 1, "b": [1, 2]},
    {1: "int key", (1, 2): "tuple key", None: 0, False: "bool key", 2.5: "float"},
    set(),
    {1, 2, 3},
    {(1, 2), "a", frozenset({1})},
    frozenset({"x", 1.5}),
    [[1, 2], (3, 4), {5: {6}}],
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=repr)
def test_plain_values_round_trip_with_their_types(value: Any) -> None:
    assert same(roundtrip(value), value)


def test_nan_round_trips() -> None:
    assert math.isnan(roundtrip(float("nan")))


def test_types_that_json_merges_stay_apart() -> None:
    decoded = roundtrip([1, 1.0, True, (1,), [1], {1}, "1", b"1"])
    assert [type(v) for v in decoded] == [
        int,
        float,
        bool,
        tuple,
        list,
        set,
        str,
        bytes,
    ]


def test_equal_sets_encode_identically() -> None:
    # Set order follows hashing (str hashes are randomized per process): the encoding
    # sorts elements, so it can serve as canonical text.
    # 1, 9 and 17 share a slot of a small set's table: insertion order decides.
    a, b = set(), set()
    for x in (1, 9, 17, "k"):
        a.add(x)
    for x in ("k", 17, 9, 1):
        b.add(x)
    assert a == b
    assert list(a) != list(b)
    assert encode_plain(a) == encode_plain(b)
    assert encode_plain(frozenset(a)) == encode_plain(frozenset(b))


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text()
        | st.binary(),
        lambda children: (
            st.lists(children)
            | st.tuples(children, children)
            | st.dictionaries(st.text() | st.integers(), children)
        ),
        max_leaves=30,
    )
)
def test_random_plain_values_round_trip(value: Any) -> None:
    assert same(roundtrip(value), value)


# ---------------------------------------------------------------- refused values


class IntSub(int):
    pass


class StrSub(str):
    pass


class ListSub(list):  # type: ignore[type-arg]
    pass


class AlwaysEqual:
    """The reward hack seen in production RL: equal to everything."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


class EqualInt(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class LyingClass:
    """Claims to be an int through __class__ (isinstance believes it)."""

    @property
    def __class__(self) -> type:  # type: ignore[override]
        return int


REFUSED: dict[str, Any] = {
    "int subclass": IntSub(3),
    "str subclass": StrSub("abc"),
    "list subclass": ListSub([1, 2]),
    "always-equal object": AlwaysEqual(),
    "int subclass with always-true __eq__": EqualInt(5),
    "object lying about __class__": LyingClass(),
    "subclass nested in a list": [1, [2, IntSub(3)]],
    "subclass as a dict key": {StrSub("k"): 1},
    "subclass as a dict value": {"k": AlwaysEqual()},
    "subclass in a set": {IntSub(1)},
    "subclass in a tuple": (1, StrSub("x")),
    "Counter subclass": type("C", (Counter,), {})(a=1),
    "OrderedDict subclass": type("O", (OrderedDict,), {})(a=1),
    "bytearray": bytearray(b"x"),
    "a function": len,
    "a type": int,
    "a generator": (i for i in range(3)),
    "range": range(3),
    "memoryview": memoryview(b"x"),
    "Ellipsis": ...,
    "int too long": 10**MAX_INT_DIGITS,
    "negative int too long": -(10**MAX_INT_DIGITS),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_non_plain_values_are_refused(name: str) -> None:
    with pytest.raises(PlainDataError):
        encode_plain(REFUSED[name])


def test_isinstance_would_have_been_fooled() -> None:
    # The reason the codec checks `type(x) is int`: isinstance trusts __class__.
    assert isinstance(LyingClass(), int)
    with pytest.raises(PlainDataError):
        encode_plain(LyingClass())


def test_stdlib_dict_kinds_arrive_as_plain_dicts() -> None:
    for value in (Counter("abca"), OrderedDict(b=1, a=2), defaultdict(list, k=[1])):
        decoded = roundtrip(value)
        assert type(decoded) is dict
        assert decoded == dict(value)


def test_patched_counter_methods_are_not_used() -> None:
    class Lying(Counter):  # type: ignore[type-arg]
        pass

    value = Counter(a=1)
    original = Counter.items
    Counter.items = lambda self: [("forged", 1)]  # type: ignore[method-assign]
    try:
        assert roundtrip(value) == {"a": 1}
    finally:
        Counter.items = original  # type: ignore[method-assign]
    with pytest.raises(PlainDataError):
        encode_plain(Lying(a=1))


def test_cycles_are_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(PlainDataError, match="deeper"):
        encode_plain(loop)
    table: dict[str, Any] = {}
    table["self"] = table
    with pytest.raises(PlainDataError):
        encode_plain(table)


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_up_to_the_bound_passes_and_deeper_is_refused() -> None:
    assert roundtrip(nested(MAX_DEPTH)) == nested(MAX_DEPTH)
    with pytest.raises(PlainDataError):
        encode_plain(nested(MAX_DEPTH + 1))


def test_each_container_type_counts_one_level() -> None:
    for wrap in (lambda v: {"k": v}, lambda v: (v,), lambda v: {0: [v]}):
        value: Any = 0
        for _ in range(MAX_DEPTH // 2):
            value = wrap(value)
        assert roundtrip(value) == value
    deep_tuple: Any = 0
    for _ in range(MAX_DEPTH):
        deep_tuple = (deep_tuple,)
    assert roundtrip(deep_tuple) == deep_tuple
    with pytest.raises(PlainDataError):
        decode_plain(b'{"t":[' * (MAX_DEPTH + 1) + b"0" + b"]}" * (MAX_DEPTH + 1), BIG)


def test_size_bound_on_encode() -> None:
    with pytest.raises(PlainDataError):
        encode_plain("x" * 1000, max_bytes=100)
    with pytest.raises(PlainDataError):
        # refused before the walk ends
        encode_plain(list(range(10_000)), max_bytes=1000)
    assert decode_plain(encode_plain("x" * 90, max_bytes=100), 100) == "x" * 90


def test_errors_belong_to_the_package_base() -> None:
    assert issubclass(PlainDataError, CodeGraderError)


# ---------------------------------------------------------------- hostile bytes

MALFORMED: dict[str, bytes] = {
    "empty": b"",
    "not json": b"hello",
    "truncated": b"[1,2",
    "trailing garbage": b"[1] [2]",
    "invalid utf-8": b'"\xff"',
    "utf-16 bom": '"x"'.encode("utf-16"),
    "object with two keys": b'{"t":[1],"s":[2]}',
    "object with no key": b"{}",
    "unknown tag": b'{"x":[1]}',
    "tag body of the wrong type": b'{"t":5}',
    "unhashable set element": b'{"s":[[1]]}',
    "unhashable dict key": b'{"d":[[[1],2]]}',
    "dict entry not a pair": b'{"d":[[1,2,3]]}',
    "dict entry not a list": b'{"d":[5]}',
    "bytes not base64": b'{"b":"!!!"}',
    "bytes not text": b'{"b":5}',
    "complex with ints": b'{"c":[1,2]}',
    "complex with one part": b'{"c":[1.0]}',
    "int too long": b"1" + b"0" * (MAX_INT_DIGITS + 1),
    "negative int too long": b"-" + b"9" * (MAX_INT_DIGITS + 1),
    "deep lists": b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
    "deep tuples": b'{"t":[' * (MAX_DEPTH + 1) + b"]}" * (MAX_DEPTH + 1),
    "deeper than the parser's recursion": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_bytes_raise_plain_data_error(name: str) -> None:
    with pytest.raises(PlainDataError):
        decode_plain(MALFORMED[name], 10 * BIG)


def test_decode_refuses_data_over_its_bound_before_parsing() -> None:
    with pytest.raises(PlainDataError, match="larger"):
        decode_plain(b"1" * 101, 100)


def test_decode_needs_bytes() -> None:
    with pytest.raises(PlainDataError):
        decode_plain("[1]", BIG)  # type: ignore[arg-type]
    with pytest.raises(PlainDataError):
        decode_plain(bytearray(b"[1]"), BIG)  # type: ignore[arg-type]


def test_int_at_the_digit_bound_decodes() -> None:
    text = "9" * MAX_INT_DIGITS
    assert decode_plain(text.encode(), BIG) == int(text)
    assert decode_plain(("-" + text).encode(), BIG) == -int(text)


def test_tagged_tree_is_json() -> None:
    value = {"k": (1, {2}), 3: b"x"}
    tree = to_tagged(value)
    assert from_tagged(json.loads(json.dumps(tree))) == value


def test_long_digit_strings_are_text_not_ints() -> None:
    digits = "7" * (MAX_INT_DIGITS + 10)
    assert roundtrip(digits) == digits
    assert roundtrip([digits, 1, [2]]) == [digits, 1, [2]]


def test_fast_paths_keep_the_checks() -> None:
    # Lists of scalars skip the per-item walk; the bounds and exact types still hold.
    with pytest.raises(PlainDataError):
        encode_plain([1, 2, 10**MAX_INT_DIGITS])
    with pytest.raises(PlainDataError):
        encode_plain(["a", StrSub("b")])
    with pytest.raises(PlainDataError):
        encode_plain([1.5, FloatSub(2.5)])
    assert roundtrip([True, 1, False, 0]) == [True, 1, False, 0]
    assert [type(v) for v in roundtrip([True, 1])] == [bool, int]


class FloatSub(float):
    pass
