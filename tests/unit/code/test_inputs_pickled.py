"""Pickled tests: plain data loads; whatever could name or call an object is refused.

Payloads try to run a command that leaves a file behind; the file must never appear.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib
from pathlib import Path
from typing import Any

import pytest

from workers.code.errors import InvalidTestsError
from workers.code.pickled import decode_pickled_tests, looks_pickled, restricted_loads

DATA = Path(__file__).resolve().parents[2] / "data" / "code"


def packed(raw: bytes) -> str:
    return base64.b64encode(zlib.compress(raw)).decode()


PLAIN: list[Any] = [
    "text",
    json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]}),
    {"input_output": "{}"},
    [1, -2, 3.5, None, True, False, "x", 10**40],
    (1, (2, 3)),
    {"nested": [{"a": [1, 2]}, ("t",)]},
]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_pickles_load_in_every_protocol(value: Any, protocol: int) -> None:
    raw = pickle.dumps(value, protocol=protocol)
    assert restricted_loads(raw) == value
    assert decode_pickled_tests(packed(raw)) == value


@pytest.mark.parametrize("protocol", [4, 5])
def test_sets_bytes_and_shared_references(protocol: int) -> None:
    shared = [1, 2]
    value = {"s": {1, 2}, "f": frozenset({"a"}), "b": b"\x00", "x": [shared, shared]}
    loaded = restricted_loads(pickle.dumps(value, protocol=protocol))
    assert loaded == value
    assert loaded["x"][0] is loaded["x"][1]


def test_livecodebench_sample_tests_load() -> None:
    with (DATA / "livecodebench_samples.jsonl").open(encoding="utf-8") as handle:
        data = [json.loads(line) for line in handle]
    for row in data:
        assert looks_pickled(row["test"])
        value = decode_pickled_tests(row["test"])
        assert isinstance(value, dict)
        assert set(value) == {"input_output"}
        spec = json.loads(value["input_output"])
        assert len(spec["inputs"]) == len(spec["outputs"]) > 0


# ------------------------------------------------------------------ refused


class Payload:
    """Unpickling this would run a shell command (the classic pickle exploit)."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.canary}",))


class Stateful:
    def __init__(self) -> None:
        self.x = 1


def hostile_pickles(canary: Path) -> dict[str, bytes]:
    command = f"touch {canary}".encode()
    return {
        **{
            f"reduce os.system, protocol {p}": pickle.dumps(Payload(canary), protocol=p)
            for p in range(pickle.HIGHEST_PROTOCOL + 1)
        },
        "reduce nested in plain data": pickle.dumps({"tests": [Payload(canary)]}),
        "object with state (BUILD)": pickle.dumps(Stateful(), protocol=2),
        "object, protocol 0 (INST)": pickle.dumps(Stateful(), protocol=0),
        "set in protocol 2 (REDUCE of builtins.set)": pickle.dumps({1}, protocol=2),
        "bytes in protocol 2 (REDUCE of codecs.encode)": pickle.dumps(b"x", protocol=2),
        "hand-written GLOBAL + REDUCE": b"cos\nsystem\n(S'" + command + b"'\ntR.",
        "hand-written INST": b"(S'" + command + b"'\nios\nsystem\n.",
        "hand-written STACK_GLOBAL": (
            b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c"
            + bytes([len(command)])
            + command
            + b"\x85R."
        ),
        "hand-written OBJ": b"(cos\nsystem\nS'" + command + b"'\no.",
        "NEWOBJ on a global": b"\x80\x02cbuiltins\nobject\n)\x81.",
        "EXT1 (copyreg registry)": b"\x80\x02\x82\x01.",
        "PERSID": b"Pfoo\n.",
        "BINPERSID": b"\x80\x02X\x03\x00\x00\x00foo Q.",
    }


def test_hostile_pickles_are_refused_and_run_nothing(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    for name, raw in hostile_pickles(canary).items():
        with pytest.raises(InvalidTestsError):
            restricted_loads(raw)
        with pytest.raises(InvalidTestsError):
            decode_pickled_tests(packed(raw))
        assert not canary.exists(), name


def test_refusal_names_the_opcode() -> None:
    with pytest.raises(InvalidTestsError, match=r"REDUCE|GLOBAL"):
        restricted_loads(pickle.dumps({1}, protocol=2))


MALFORMED: dict[str, bytes] = {
    "empty": b"",
    "truncated": pickle.dumps(["a" * 100])[:-5],
    "stop on an empty stack": b".",
    "setitem on nothing": b"\x80\x04s.",
    "garbage": b"\xff\xfe\xfd",
    "unknown memo index": b"\x80\x04h\x05.",
    "no stop": b"\x80\x04N",
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_pickles_are_invalid(name: str) -> None:
    with pytest.raises(InvalidTestsError):
        restricted_loads(MALFORMED[name])


def test_bad_text_is_invalid() -> None:
    with pytest.raises(InvalidTestsError, match="base64"):
        decode_pickled_tests("eJ not base64 at all!")
    with pytest.raises(InvalidTestsError, match="zlib"):
        decode_pickled_tests(base64.b64encode(b"not zlib data").decode())
    with pytest.raises(InvalidTestsError, match="base64"):
        decode_pickled_tests("eJé")


def test_wrapped_base64_loads() -> None:
    text = packed(pickle.dumps("y" * 500 + "".join(map(str, range(300)))))
    wrapped = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    assert "\n" in wrapped
    assert looks_pickled(wrapped)
    assert decode_pickled_tests(wrapped) == decode_pickled_tests(text)


def test_inflating_past_the_bound_is_refused() -> None:
    text = packed(pickle.dumps("x" * 100_000))
    assert len(text) < 2000  # compresses well: a small text, a large pickle
    with pytest.raises(InvalidTestsError, match="inflate"):
        decode_pickled_tests(text, max_bytes=10_000)
    assert decode_pickled_tests(text, max_bytes=200_000) == "x" * 100_000


def test_looks_pickled() -> None:
    assert looks_pickled(packed(pickle.dumps("x")))
    assert not looks_pickled("def check(candidate):\n    assert True\n")
    assert not looks_pickled('[{"input": "1"}]')
    assert not looks_pickled("eval")
