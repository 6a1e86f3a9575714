"""Rollouts as the producer takes them, validated once at its entry (no Celery here).

A rollout is a `workers.models.Rollout`, anything else with `response` and `gold`
attributes (a CLI input row), or a mapping with those keys. A code rollout is a
`code_rollout(response, row)` (its gold is the row's tests, encoded), or a mapping
with a `response` and no `gold` whose fields hold tests (`gradefleet grade --help`
lists them): graded by the code grader wherever math is graded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from producer.errors import InvalidRolloutError
from workers.code.item import encode_code_gold, is_code_row
from workers.models import Rollout, exact_gold_text
from workers.wire.contract import text_error

__all__ = ["code_rollout", "validate_rollouts"]


def code_rollout(response: str, row: Mapping[str, Any]) -> Rollout:
    """A code rollout: `response` (the model's text; its program is the last fenced
    Python block, or the text itself) graded against the tests in `row` (any shape
    the CLI reads: `test_list`, HumanEval `test` + `entry_point` + `prompt`,
    `input_output`, ...; the row's other fields are ignored).

    Raises:
        InvalidRolloutError: `row` carries no tests.
    """
    if not is_code_row(row):
        raise InvalidRolloutError("code_rollout: the row carries no code tests")
    return Rollout(response=response, gold=encode_code_gold(row))


def _texts(rollout: object, index: int) -> tuple[str, str]:
    response: object
    gold: object
    if type(rollout) is dict:
        # The usual shape (a service's coalesced batch is thousands of them a
        # second): two texts, checked without the generic path's ABC test.
        response, gold = rollout.get("response"), rollout.get("gold")
        if (
            type(response) is str
            and type(gold) is str
            and text_error(response, gold) is None
        ):
            return response, gold
    if isinstance(rollout, Mapping):
        response, gold = rollout.get("response"), rollout.get("gold")
        if gold is None and is_code_row(rollout):
            gold = encode_code_gold(rollout)
    elif hasattr(rollout, "response") and hasattr(rollout, "gold"):
        response, gold = rollout.response, rollout.gold
    else:
        kind = type(rollout).__name__
        raise InvalidRolloutError(
            f"rollout {index}: expected Rollout or mapping, got {kind}"
        )
    if not isinstance(response, str):
        kind = type(response).__name__
        raise InvalidRolloutError(
            f"rollout {index}: field 'response' must be a string, not {kind}"
        )
    try:
        gold = exact_gold_text(gold)  # a number is as good a gold as its text
    except TypeError:
        kind = type(gold).__name__
        raise InvalidRolloutError(
            f"rollout {index}: field 'gold' must be a string or number, not {kind}"
        ) from None
    if (error := text_error(response, gold)) is not None:
        raise InvalidRolloutError(f"rollout {index}: {error}")
    return response, gold


def validate_rollouts(rollouts: Iterable[object]) -> list[tuple[int, str, str]]:
    """`(index, response, gold)` for each rollout, or InvalidRolloutError naming one."""
    return [(i, *_texts(rollout, i)) for i, rollout in enumerate(rollouts)]
