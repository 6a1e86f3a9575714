"""The kind registry: "math" is the verifier itself (same function, same version, so
cache keys and verdicts are unchanged), an unknown kind is a bad request, and a kind
is registered once."""

from __future__ import annotations

import pytest

from workers import kinds, verifier
from workers.code.item import encode_code_gold, grade_code_item
from workers.code.version import CODE_GRADER_VERSION
from workers.errors import ConfigError, InvalidRequestError


def test_math_is_the_verifier() -> None:
    math = kinds.grader_for()
    assert kinds.DEFAULT_KIND == "math"
    assert math.kind == "math"
    assert math.grade is verifier.grade
    assert math.version == verifier.GRADER_VERSION
    assert math.grade("so $\\boxed{1/2}$", "0.5") == verifier.grade(
        "so $\\boxed{1/2}$", "0.5"
    )


def test_unknown_kind_is_a_bad_request() -> None:
    with pytest.raises(InvalidRequestError, match="no grader for kind 'chess'"):
        kinds.grader_for("chess")


def test_a_kind_registers_once() -> None:
    with pytest.raises(ConfigError, match="registered already"):
        kinds.register(kinds.KindGrader(kind="math", version="x", grade=verifier.grade))
    assert kinds.kinds() == ["code", "math"]


def test_code_is_the_code_grader_and_its_kind_is_in_the_gold() -> None:
    code = kinds.grader_for("code")
    assert code.version == CODE_GRADER_VERSION
    assert code.grade is grade_code_item
    gold = encode_code_gold({"test_list": ["assert f() == 1"]})
    assert kinds.kind_of(gold) == "code"
    assert kinds.kind_of("42") == kinds.kind_of("\\boxed{x}") == "math"
