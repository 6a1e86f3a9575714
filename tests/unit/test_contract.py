"""The wire contract: round trips and strict validation of task arguments."""

from __future__ import annotations

import json
from typing import Any

import pytest

from workers.errors import InvalidRequestError
from workers.models import ExtractionMethod, GradeOptions, Status, Verdict
from workers.sizing import (
    JOB_BATCHES,
    MAX_AUTO_BATCH_SIZE,
    MIN_BATCH_SIZE,
    batch_size_for,
)
from workers.wire.contract import (
    GRADE_BATCH,
    MAX_PAYLOAD_BYTES,
    QUEUE,
    attach_items,
    batch_from_wire,
    batch_to_wire,
    detach_items,
    items_reference,
)
from workers.wire.protocol import (
    SCHEMA_VERSION,
    batch_items_key,
    result_to_wire,
    results_from_wire,
)


def _wire(**changes: Any) -> dict[str, Any]:
    wire: dict[str, Any] = dict(
        batch_to_wire(
            job_id="job",
            batch_id="job.0",
            items=[(0, "a \\boxed{1}", "1"), (7, "b", "2")],
            options=GradeOptions(allow_fallback=False),
            enqueued_at=1_700_000_000.5,
        )
    )
    wire.update(changes)
    return wire


def test_contract_names_are_stable():
    assert GRADE_BATCH == "gradefleet.grade_batch"
    assert QUEUE == "gradefleet"
    assert SCHEMA_VERSION == 1


def test_contract_batch_round_trips_through_json():
    # Given a batch built by the producer, When it crosses JSON, Then nothing changes
    request = batch_from_wire(json.loads(json.dumps(_wire())))
    assert request.job_id == "job"
    assert request.batch_id == "job.0"
    assert request.attempt == 1
    assert request.enqueued_at == 1_700_000_000.5
    assert request.options == GradeOptions(allow_fallback=False)
    assert [item["index"] for item in request.items] == [0, 7]
    assert request.items[0]["response"] == "a \\boxed{1}"


def test_contract_items_by_reference_round_trip():
    # Given a batch whose items the producer stores apart (lone surrogate included)
    wire = _wire()
    wire["items"][1]["response"] = "b \ud800 é"
    detached, items_json = detach_items(wire)
    # Then the message names the key and carries no items; the payload is UTF-8-safe
    assert "items" not in detached
    assert items_reference(detached) == batch_items_key("job.0")
    # When the worker attaches what it read, Then it is the inline batch again
    request = batch_from_wire(
        attach_items(json.loads(json.dumps(detached)), items_json)
    )
    assert request == batch_from_wire(wire)
    assert "items" in wire  # the producer's own wire is left untouched


def test_contract_items_payload_is_utf8_json_without_lone_surrogates():
    # Given non-ASCII text without lone surrogates (the usual model text)
    wire = _wire()
    wire["items"][1]["response"] = "b é ∑ \\boxed{½}"
    detached, items_json = detach_items(wire)
    # Then the payload is JSON that decodes to the very same items
    assert "b é ∑".encode() in items_json  # UTF-8, not escapes
    assert json.loads(items_json) == wire["items"]
    request = batch_from_wire(attach_items(detached, items_json))
    assert request == batch_from_wire(wire)


def test_contract_inline_items_have_no_reference():
    assert items_reference(_wire()) is None


def test_contract_items_key_must_be_the_batch_own_key():
    # A message never picks which Redis key a worker reads
    wire = _wire(items_key="gradefleet:v1:items:other-job.0")
    with pytest.raises(InvalidRequestError, match="items_key must be"):
        items_reference(wire)
    with pytest.raises(InvalidRequestError, match="batch_id"):
        items_reference(_wire(items_key="x", batch_id=""))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (None, "not in Redis"),
        (b"", "not in Redis"),
        (b"[{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b" " * (MAX_PAYLOAD_BYTES + 1), "over"),
    ],
)
def test_contract_attach_items_rejects_bad_payloads(payload, message):
    detached, _ = detach_items(_wire())
    with pytest.raises(InvalidRequestError, match=message):
        attach_items(detached, payload)


@pytest.mark.parametrize(
    "payload",
    [
        b'[{"index": 0, "response": "\\boxed{1}", "gold": "1"}]',
        b'[{"index": 0, "response": "\\ud800 lone", "gold": "\\udfff"}]',
        b'[{"index": 123456789012345678901234567890, "response": "r", "gold": "g"}]',
        b'[{"index": 0, "response": "r", "gold": "g", "extra": NaN}]',
        b'[{"index": 1.0, "response": "r", "gold": "g"}]',
        b'[{"index": 0, "response": "a", "response": "b", "gold": "g"}]',
        b'{"index": 0}',
        b"[1, 2]",
    ],
)
def test_contract_attach_items_reads_what_json_loads_reads(payload):
    # orjson reads most payloads; those it reads otherwise (NaN, lone surrogates,
    # integers beyond 64 bits) must still come out as the stdlib reads them.
    detached, _ = detach_items(_wire())
    attached = attach_items(detached, payload)
    assert repr(attached["items"]) == repr(json.loads(payload))


def test_contract_attached_items_are_validated_like_inline_ones():
    detached, _ = detach_items(_wire())
    bad = json.dumps([{"index": -1, "response": "r", "gold": "g"}]).encode()
    with pytest.raises(InvalidRequestError, match="index"):
        batch_from_wire(attach_items(detached, bad))


BAD_BATCHES = [
    ("not-a-dict", ["x"]),
    ("schema", {"schema": 2}),
    ("job_id-empty", {"job_id": ""}),
    ("job_id-type", {"job_id": 5}),
    ("batch_id-long", {"batch_id": "x" * 201}),
    ("attempt-zero", {"attempt": 0}),
    ("attempt-bool", {"attempt": True}),
    ("enqueued_at-str", {"enqueued_at": "now"}),
    ("enqueued_at-nan", {"enqueued_at": float("nan")}),
    ("options-unknown", {"options": {"nope": 1}}),
    ("options-list", {"options": [1]}),
    ("items-empty", {"items": []}),
    ("items-not-list", {"items": {"index": 0}}),
    ("item-not-dict", {"items": [3]}),
    ("item-index-negative", {"items": [{"index": -1, "response": "", "gold": ""}]}),
    ("item-index-bool", {"items": [{"index": True, "response": "", "gold": ""}]}),
    ("item-response-none", {"items": [{"index": 0, "response": None, "gold": ""}]}),
    ("item-gold-int", {"items": [{"index": 0, "response": "", "gold": 3}]}),
    ("item-huge", {"items": [{"index": 0, "response": "x" * 1_000_001, "gold": ""}]}),
    (
        "item-duplicate-index",
        {"items": [{"index": 1, "response": "", "gold": ""}] * 2},
    ),
]


@pytest.mark.parametrize(
    ("name", "change"), BAD_BATCHES, ids=[name for name, _ in BAD_BATCHES]
)
def test_contract_rejects_malformed_batch(name, change):
    wire = change if not isinstance(change, dict) else _wire(**change)
    with pytest.raises(InvalidRequestError):
        batch_from_wire(wire)


def test_contract_missing_options_means_defaults():
    wire = _wire()
    del wire["options"]
    assert batch_from_wire(wire).options == GradeOptions()


def test_contract_results_sorted_and_parsed_back():
    verdict = Verdict(
        correct=True,
        status=Status.CORRECT,
        format_valid=True,
        extracted="1",
        extraction_method=ExtractionMethod.BOXED,
    )
    pairs_in = [(5, verdict), (2, verdict)]
    wire = result_to_wire(job_id="j", batch_id="j.0", results=pairs_in)
    pairs = results_from_wire(json.loads(json.dumps(wire)))
    assert [index for index, _ in pairs] == [2, 5]
    assert pairs[0][1] == verdict


@pytest.mark.parametrize(
    "payload",
    [None, {"schema": 1}, {"schema": 1, "results": [{"index": 0}]}, {"schema": 9}],
    ids=["none", "no-results", "no-verdict", "schema"],
)
def test_contract_rejects_malformed_result(payload):
    with pytest.raises(InvalidRequestError):
        results_from_wire(payload)


def test_contract_batch_size_follows_the_job():
    # 32 tasks per job while each holds 16 to 512 rollouts
    assert batch_size_for(0) == MIN_BATCH_SIZE
    assert batch_size_for(100) == MIN_BATCH_SIZE
    assert batch_size_for(8_192) == 256
    assert batch_size_for(10_000) == 313  # 32 tasks, the last one shorter
    assert batch_size_for(1_000_000) == MAX_AUTO_BATCH_SIZE
    for n in range(1, 40_000, 97):
        size = batch_size_for(n)
        assert MIN_BATCH_SIZE <= size <= MAX_AUTO_BATCH_SIZE
        tasks = -(-n // size)
        assert tasks <= JOB_BATCHES or size == MAX_AUTO_BATCH_SIZE
        assert batch_size_for(n + 1) >= size
