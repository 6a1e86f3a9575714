"""The Redis protocol: key names match Celery's and kombu's, the result envelope round
trips in every state, and no other module spells a key."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
from celery import Celery
from kombu.transport.redis import Channel

from workers.models import ExtractionMethod, Status, Verdict
from workers.wire import protocol
from workers.wire.protocol import (
    TaskMeta,
    progress_meta,
    read_task_meta,
    result_json,
    result_to_wire,
    task_meta,
    task_meta_key,
)
from workers.wire.signing import Keyring

REPO = Path(__file__).resolve().parents[2]
# Substrings that only a key name contains: ours, Celery's result keys, kombu's hash.
# (kombu's "unacked" hash is checked against kombu above: the same word is also a
# queue-depth label.)
KEY_MARKERS = ("gradefleet:v", "celery-task-meta", "\x06\x16")


def _verdict(n: int) -> Verdict:
    return Verdict(
        correct=n % 2 == 0,
        status=Status.CORRECT if n % 2 == 0 else Status.WRONG,
        format_valid=True,
        extracted=str(n),
        extraction_method=ExtractionMethod.BOXED,
        canonical_pred=str(n),
        canonical_gold="0",
        grader_version="test",
    )


def test_protocol_task_meta_key_is_celerys_result_key() -> None:
    app = Celery("t", broker="memory://", backend="redis://127.0.0.1:1/0")
    try:
        assert task_meta_key("job.3").encode() == app.backend.get_key_for_task("job.3")
    finally:
        app.close()


def test_protocol_queue_keys_are_kombus() -> None:
    steps = [s for s in Channel.priority_steps if s]
    assert protocol.priority_queue_keys("q") == [
        "q",
        *(f"q{Channel.sep}{s}" for s in steps),
    ]
    assert Channel.unacked_key == protocol.UNACKED_KEY


def test_protocol_success_envelope_round_trips() -> None:
    pairs = [(2, _verdict(2)), (0, _verdict(0)), (1, _verdict(1))]
    text = result_json(job_id="j", batch_id="j.0", results=pairs)
    meta = read_task_meta(task_meta("SUCCESS", text, "j.0"))
    assert meta == TaskMeta("SUCCESS", results=sorted(pairs, key=lambda p: p[0]))
    raw = json.loads(task_meta("SUCCESS", text, "j.0"))
    assert raw["task_id"] == "j.0"
    assert raw["date_done"] is not None


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("digest", [None, "d\u00e9\ud800"])
def test_protocol_result_json_is_json_dumps_of_result_to_wire(
    signed: bool, digest: str | None
) -> None:
    # result_json builds the text around the verdicts' (encoded once, for the MAC
    # too): it must be exactly the text of the wire dict, MAC included.
    keyring = Keyring([b"k" * 32]) if signed else None
    pairs = [(2, _verdict(2)), (0, _verdict(0))]
    args = {"job_id": "j\u00e9", "batch_id": "j.0", "results": pairs}
    text = result_json(**args, items_digest=digest, keyring=keyring)
    wire = result_to_wire(**args, items_digest=digest, keyring=keyring)
    assert text == json.dumps(wire)
    if signed and digest is not None:
        assert "mac" in wire


@pytest.mark.parametrize(
    ("index", "extracted"),
    [
        (1, "x \u00e9 \u2211"),  # the usual: orjson reads it
        (1, "a \ud800 lone surrogate"),  # escaped in the JSON: orjson refuses it
        (2**64 + 1, "7"),  # orjson would read the index as a float
    ],
    ids=["usual", "lone-surrogate", "huge-index"],
)
def test_protocol_result_reads_as_the_stdlib_reads_it(
    index: int, extracted: str
) -> None:
    # Given a SUCCESS whose verdict text or index orjson reads otherwise
    verdict = dataclasses.replace(_verdict(1), extracted=extracted)
    text = result_json(job_id="j", batch_id="j.0", results=[(index, verdict)])
    payload = task_meta("SUCCESS", text, "j.0").encode()
    # Then it reads exactly as `json.loads` reads it
    meta = read_task_meta(payload)
    assert meta.results == [(index, verdict)]
    assert meta.envelope == json.loads(payload)["result"]


def test_protocol_progress_and_started_envelopes_are_running() -> None:
    # As Celery's update_state stores it: {"status": ..., "result": meta, ...}
    progress = json.dumps(
        {"status": "PROGRESS", "result": progress_meta(done=3, total=8, beat=2)}
    )
    assert read_task_meta(progress) == TaskMeta("PROGRESS")
    assert read_task_meta(progress).running
    started = task_meta("STARTED", json.dumps({"pid": 1}), "j.0")
    assert read_task_meta(started).running
    assert json.loads(started)["date_done"] is None


def test_protocol_failure_envelope_names_the_exception() -> None:
    raw = json.dumps(
        {
            "status": "FAILURE",
            "result": {"exc_type": "InvalidRequestError", "exc_message": ["bad"]},
        }
    )
    meta = read_task_meta(raw)
    assert meta.status == "FAILURE"
    assert meta.failure == "InvalidRequestError: ['bad']"
    assert not meta.running


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1, 2]",
        json.dumps({"status": "SUCCESS", "result": {"schema": 99}}).encode(),
        json.dumps({"status": "SUCCESS", "result": {"schema": 1}}).encode(),
        json.dumps(
            {"status": "SUCCESS", "result": {"schema": 1, "results": [{"x": 1}]}}
        ).encode(),
    ],
    ids=["not-json", "not-object", "wrong-schema", "no-results", "bad-item"],
)
def test_protocol_unreadable_result_is_a_failure_not_an_exception(
    payload: bytes,
) -> None:
    meta = read_task_meta(payload)
    assert meta.results is None
    assert meta.failure


def _key_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(
            node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        )
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                part.value
                for part in node.values
                if isinstance(part, ast.Constant) and isinstance(part.value, str)
            )
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            text = node.value
        else:
            continue
        if any(mark in text for mark in KEY_MARKERS):
            found.append(text)
    return found


def test_protocol_no_other_module_spells_a_redis_key() -> None:
    sources = sorted((REPO / "workers").rglob("*.py"))
    sources += sorted((REPO / "producer").rglob("*.py"))
    spelled = {
        str(path.relative_to(REPO)): literals
        for path in sources
        if path.name != "protocol.py" and (literals := _key_literals(path))
    }
    assert spelled == {}
    assert _key_literals(
        REPO / "workers" / "wire" / "protocol.py"
    )  # the check can see keys
