"""A fleet's line mode, the pure parts: the unit payload a producer stores, the
batch a worker makes of it (`workers.fleet.line_batch`), the result envelope and its MAC
(`protocol.line_result_json`), and what the producer reads back. The fleet runs of
it are in tests/integration/test_cli_fleet.py."""

from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import hostile_grade
from workers import verifier
from workers.embedded.pool import LocalPool
from workers.fleet.line_batch import grade_fleet_unit, is_line_unit, line_unit_task
from workers.lines.fields import FieldSpec
from workers.lines.records import (
    InputRow,
    alternative_items,
    choose_alternatives,
    grade_alternatives,
)
from workers.lines.units import (
    UNIT_MAX_BYTES,
    LineGrader,
    fleet_unit_lines,
    fleet_unit_payload,
    fleet_unit_result,
    grade_line_unit,
    line_unit,
    read_fleet_unit,
)
from workers.models import ExtractionMethod, GradeOptions, Status, Verdict
from workers.sizing import MAX_LINE_UNIT_LINES, MIN_BATCH_SIZE, line_unit_lines_for
from workers.wire.contract import MAX_ITEMS_PER_BATCH
from workers.wire.protocol import (
    read_task_meta,
    result_json,
    result_rejection,
    task_meta,
)
from workers.wire.signing import Keyring

OPTIONS = GradeOptions()
MIB = 1 << 20
KEYRING = Keyring.from_text("k1:" + "ab" * 32)
WIRE = {
    "schema": 1,
    "job_id": "job",
    "batch_id": "job.0",
    "attempt": 1,
    "enqueued_at": 1.0,
    "options": OPTIONS.to_dict(),
    "items_key": "gradefleet:v1:items:job.0",
}


def _verdict(response: str, gold: str) -> Verdict:
    """A made-up verdict that depends on its pair (correct when they are equal)."""
    correct = response.endswith(f"{{{gold}}}")
    return Verdict(
        correct=correct,
        status=Status.CORRECT if correct else Status.WRONG,
        format_valid=True,
        extracted=response[-3:],
        extraction_method=ExtractionMethod.BOXED,
        grader_version="test",
    )


def _grade(pairs: list[tuple[str, str]], _options: GradeOptions) -> list[Verdict]:
    return [_verdict(response, gold) for response, gold in pairs]


LINES = [
    (1, b'{"response": "so \\\\boxed{4}", "gold": "4", "id": 7}\n'),
    (2, b"not json\n"),
    (3, b'{"responses": ["\\\\boxed{1}", "\\\\boxed{2}"], "gold": "2"}\n'),
    (5, b'{"response": "\\\\boxed{b}", "gold": ["a", "b"]}\n'),
    (6, b'{"response": "caf\xc3\xa9 \\\\boxed{9}", "gold": "8"}\n'),
]


def _payload(lines: list[tuple[int, bytes]] = LINES) -> bytes:
    return fleet_unit_payload(*line_unit(lines, FieldSpec(), OPTIONS))


def test_fleet_unit_payload_reads_back_the_rows_and_errors_item_mode_reads() -> None:
    # Given a unit of lines of every kind
    payload = _payload()
    # When a worker reads it
    assert is_line_unit(payload)
    read = read_fleet_unit(payload)
    # Then it finds the rows and the malformed line that grade_line_unit finds
    assert read is not None
    rows, errors = read
    embedded, _out = grade_line_unit(*line_unit(LINES, FieldSpec(), OPTIONS), _grade)
    assert errors == embedded["errors"] == [[2, errors[0][1]]]
    assert [(r.line_no, r.response) for r in rows][:3] == [
        (1, "so \\boxed{4}"),
        (3, "\\boxed{1}"),
        (3, "\\boxed{2}"),
    ]


@pytest.mark.parametrize(
    "tamper",
    [
        lambda p: p[:-1],  # a byte short of the sizes
        lambda p: p + b"x",  # a byte over
        lambda p: p.replace(b'"numbers":[1,', b'"numbers":["1",'),
        lambda p: p.replace(b'"spec":[null,null]', b'"spec":[1,null]'),
        lambda p: p.split(b"\n", 1)[0],  # no JSON line
    ],
)
def test_fleet_unit_that_does_not_add_up_is_not_read(tamper: Any) -> None:
    assert read_fleet_unit(tamper(_payload())) is None
    assert fleet_unit_lines(tamper(_payload())) is None


def test_fleet_unit_lines_are_counted_from_its_head() -> None:
    assert fleet_unit_lines(_payload()) == len(LINES) == 5


def test_items_payload_is_not_a_line_unit() -> None:
    assert not is_line_unit(b'[{"index": 0, "response": "1", "gold": "1"}]')
    assert not is_line_unit(None)


def test_alternative_items_then_choose_is_grade_alternatives() -> None:
    read = read_fleet_unit(_payload())
    assert read is not None
    rows = read[0]
    items, owners = alternative_items(rows)
    assert len(items) == len(rows) + 1  # the row with two golds
    chosen = choose_alternatives(len(rows), owners, _grade_rows(items))
    assert chosen == grade_alternatives(rows, lambda todo, _a: _grade_rows(todo), print)


def _grade_rows(rows: list[InputRow]) -> list[Verdict]:
    return _grade([(row.response, row.gold) for row in rows], OPTIONS)


def _rendered(payload: bytes, keyring: Keyring | None = None) -> Any:
    """What a worker stores for `payload`: the result meta and the output."""
    batch = line_unit_task(WIRE, payload, "digest", keyring).batch()
    verdicts = _grade(
        [(it["response"], it["gold"]) for it in batch.request.items], OPTIONS
    )
    text, output = batch.render(verdicts)
    return batch, text, output


def test_line_batch_renders_what_the_embedded_line_mode_writes() -> None:
    # Given a unit of lines graded by a fleet worker and by an embedded worker
    batch, text, output = _rendered(_payload())
    embedded, embedded_out = grade_line_unit(
        *line_unit(LINES, FieldSpec(), OPTIONS), _grade
    )
    # Then the output lines and totals are the same bytes, stored under the key
    # the result names, with their size
    assert output is not None
    key, out = output
    assert out == embedded_out
    meta = read_task_meta(task_meta("SUCCESS", text, "job.0"))
    assert meta.lines is not None
    assert meta.lines["out_key"] == key
    assert key.startswith("gradefleet:v1:lines:job.0:")
    assert meta.lines["out_bytes"] == len(out)
    assert meta.lines["totals"] == embedded["totals"]
    assert meta.lines["errors"] == embedded["errors"]
    assert len(batch.request.items) == 6  # five rows, one with two golds
    # And the producer's reading of it is the embedded unit result
    assert fleet_unit_result({**meta.lines, "out": out}) == (
        {"totals": embedded["totals"], "errors": embedded["errors"]},
        embedded_out,
    )


def test_line_batch_of_malformed_lines_only_is_an_empty_batch() -> None:
    batch, text, output = _rendered(_payload([(1, b"nope\n"), (2, b"[1]\n")]))
    assert batch.request.items == ()
    assert output is not None
    assert output[1] == b""
    meta = read_task_meta(task_meta("SUCCESS", text, "job.0"))
    assert meta.lines is not None
    assert len(meta.lines["errors"]) == 2


def test_line_batch_too_big_or_not_adding_up_is_answered_unfit() -> None:
    big = [
        (
            1,
            json.dumps(
                {"responses": ["1"] * (MAX_ITEMS_PER_BATCH + 1), "gold": "1"}
            ).encode(),
        )
    ]
    for payload in (_payload(big), _payload()[:-1]):
        batch, text, output = _rendered(payload)
        assert batch.request.items == ()
        assert output is None
        lines = read_task_meta(task_meta("SUCCESS", text, "job.0")).lines
        assert lines is not None
        assert "unfit" in lines
        assert fleet_unit_result(lines) is None  # its lines go as rows


def test_line_result_mac_covers_the_output_and_is_its_own_kind() -> None:
    # Given a signed line result
    _batch, text, output = _rendered(_payload(), KEYRING)
    assert output is not None
    envelope = json.loads(text)
    assert envelope["lines"]["out_sha256"] == hashlib.sha256(output[1]).hexdigest()

    def rejection(data: Any) -> str | None:
        return result_rejection(
            data, job_id="job", batch_id="job.0", items_digest="digest", keyring=KEYRING
        )

    # Then it verifies, and not once its totals or its output's digest change
    assert rejection(envelope) is None
    for field, value in (("out_sha256", "0" * 64), ("totals", {})):
        forged = {**envelope, "lines": {**envelope["lines"], field: value}}
        assert rejection(forged) == "result MAC does not verify"
    # And a verdicts result's MAC does not pass for lines
    signed = json.loads(
        result_json(
            job_id="job",
            batch_id="job.0",
            results=[],
            items_digest="digest",
            keyring=KEYRING,
        )
    )
    assert rejection({**envelope, "mac": signed["mac"]}) == "result MAC does not verify"


def test_fleet_unit_result_refuses_what_a_worker_does_not_store() -> None:
    good = {"totals": {}, "errors": [[2, "bad"]], "out": b"{}\n"}
    assert fleet_unit_result(good) is not None
    for bad in (
        {**good, "out": "{}\n"},
        {**good, "errors": [["2", "bad"]]},
        {**good, "totals": []},
        None,
    ):
        assert fleet_unit_result(bad) is None


def test_line_grader_cuts_units_by_lines_and_by_bytes() -> None:
    # Given lines of which two are big, and units of at most 3 lines
    lines = [(n, b"x\n") for n in range(1, 8)]
    lines[3] = (4, b"y" * (UNIT_MAX_BYTES - 10))
    lines[4] = (5, b"z" * 100)
    seen: list[list[int]] = []

    def run_units(units: Any, weights: Any, _advance: Any) -> list[None]:
        seen.extend(unit["numbers"] for unit, _body in units)
        assert list(weights) == [len(unit["numbers"]) for unit, _body in units]
        return [None] * len(units)

    # When a chunk is cut (the unit size a function of the chunk's lines)
    LineGrader(run_units, FieldSpec(), OPTIONS, lambda n: 3 if n == 7 else 0)(
        lines, print
    )
    # Then no unit passes either bound, unless one line is the whole unit
    assert seen == [[1, 2, 3], [4], [5, 6, 7]]


def test_line_units_are_sixteen_a_chunk_within_bounds() -> None:
    assert line_unit_lines_for(20_000) == 1_250
    assert line_unit_lines_for(2_048) == 128
    assert line_unit_lines_for(10) == MIN_BATCH_SIZE
    assert line_unit_lines_for(10**6) == MAX_LINE_UNIT_LINES


def _json_line(line_no: int, response: str, gold: str) -> tuple[int, bytes]:
    return line_no, json.dumps({"response": response, "gold": gold}).encode() + b"\n"


def test_fleet_unit_graded_whole_is_the_unit_read_as_a_batch(tmp_path: Path) -> None:
    # Given a unit of lines of every kind, and one of lines that do not add up
    payload = _payload()
    # When a pool worker grades each whole (the fleet's line pool)
    with LocalPool(
        processes=1,
        item_timeout_s=5.0,
        item_memory_bytes=512 * MIB,
        cache_path=None,
        unit_fn=grade_fleet_unit,
        collect_graded=True,
    ) as pool:
        whole, unfit = pool.run_units(
            [({"options": OPTIONS.to_dict()}, p) for p in (payload, payload[:-1])],
            [1, 1],
        )
    # Then its output and totals are those of the unit read as a batch and graded
    # in process, byte for byte, and every rollout is counted once
    batch = line_unit_task(WIRE, payload, "digest", None).batch()
    pairs = [(it["response"], it["gold"]) for it in batch.request.items]
    _text, output = batch.render([verifier.grade(r, g) for r, g in pairs])
    assert whole is not None
    assert output is not None
    meta, out = whole
    assert out == output[1]
    _rows, errors = read_fleet_unit(payload) or ([], [])
    assert meta["lines"]["errors"] == errors
    assert meta["rollouts"] == len(pairs) == 6
    assert sum(meta["graded"]["statuses"].values()) == 6
    assert len(meta["graded"]["durations_s"]) == 6
    # And the unit that does not add up is answered unfit, with no lines
    assert unfit == (
        {"unfit": "its line numbers, sizes or field spec do not add up"},
        b"",
    )


CODE_LINE = (
    7,
    b'{"response": "def add(a, b):\\n    return a + b", '
    b'"test_list": ["assert add(1, 2) == 3"]}\n',
)


def test_fleet_unit_with_code_rows_is_unfit_on_a_worker_that_takes_math_only() -> None:
    # Given a unit of math lines and one code line
    payload = _payload([*LINES, CODE_LINE])
    # When a worker that takes code reads it, and one that takes math only
    graded = line_unit_task(WIRE, payload, "digest", None).batch()
    unfit = line_unit_task(WIRE, payload, "digest", None, code=False).batch()
    # Then the first makes it a batch with the code rollout, the second answers it
    # unfit (its producer grades the rows in item mode, each kind on its queues)
    assert len(graded.request.items) == 7
    assert unfit.request.items == ()
    text, output = unfit.render([])
    lines = read_task_meta(task_meta("SUCCESS", text, "job.0")).lines
    assert output is None
    assert lines is not None
    assert "code rows" in lines["unfit"]
    assert fleet_unit_result(lines) is None
    # And a unit of math lines only is a batch for either
    math_only = line_unit_task(WIRE, _payload(), "digest", None, code=False).batch()
    assert len(math_only.request.items) == 6
    # And the line pool's grading process answers the same (`grade_fleet_unit`)
    with LocalPool(
        processes=1,
        item_timeout_s=5.0,
        item_memory_bytes=512 * MIB,
        cache_path=None,
        unit_fn=grade_fleet_unit,
        collect_graded=True,
    ) as pool:
        (whole,) = pool.run_units(
            [({"options": OPTIONS.to_dict(), "code": False}, payload)], [1]
        )
    assert whole is not None
    assert whole[0] == {"unfit": lines["unfit"]}


def test_fleet_unit_keeps_slow_verdicts_and_answers_them_when_sent_again(
    tmp_path: Path,
) -> None:
    # Given a unit whose first chunk (16 items) holds two items of 0.3 s each, and
    # whose 30th item hangs past the 1 s deadline
    naps = tmp_path / "naps"
    lines = [_json_line(1, f"logged-nap:{naps}", "1")]
    lines += [_json_line(2, f"logged-nap:{naps}", "2")]
    lines += [_json_line(n, f"so \\boxed{{{n}}}", str(n % 3)) for n in range(3, 30)]
    lines += [_json_line(30, "hang", "1")]
    lines += [_json_line(n, f"so \\boxed{{{n}}}", "4") for n in range(31, 36)]
    kept: list[tuple[dict[int, Verdict], Any]] = []
    restarts: list[str] = []
    # When a pool worker grades it whole
    with LocalPool(
        processes=1,
        item_timeout_s=1.0,
        item_memory_bytes=512 * MIB,
        cache_path=None,
        grade_fn=hostile_grade,
        unit_fn=grade_fleet_unit,
        collect_graded=True,
        on_restart=restarts.append,
    ) as pool:
        [whole] = pool.run_units(
            [({"options": OPTIONS.to_dict()}, _payload(lines))],
            [1],
            on_kept=lambda _unit, verdicts, summary: kept.append((verdicts, summary)),
        )
    assert whole is not None
    meta, out = whole
    # Then the slow chunk's verdicts were kept as it ended, before the hang
    assert len(kept) == 2
    assert set(kept[0][0]) == set(range(16))
    # And after the hang cost the worker, the unit sent again answered them from
    # there (each nap was graded once) and kept the hang's verdict with the chunk
    # it ends
    assert restarts == ["timeout"]
    assert len(naps.read_text().splitlines()) == 2
    assert max(kept[1][0]) == 29
    assert kept[1][0][29].status is Status.TIMEOUT
    # And every item is counted once, in a keep or in the result, the hang as
    # `timeout`; its output line says so, the others say what grade() says
    summaries = [summary for _v, summary in kept] + [meta["graded"]]
    counted = collections.Counter[str]()
    for summary in summaries:
        counted.update(summary["statuses"])
    assert sum(counted.values()) == 35
    assert counted["timeout"] == 1
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["status"] for row in rows].count("timeout") == 1
    assert rows[29]["status"] == "timeout"
    for row in rows[2:29] + rows[30:]:
        want = verifier.grade(row["response"], row["gold"])
        assert (row["correct"], row["status"]) == (want.correct, want.status.value)
