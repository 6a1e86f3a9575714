"""Line mode (`workers.lines.units`): the embedded pool's workers read and write the
JSONL lines. It must write what item mode writes, byte for byte, and keep the
pool's limits per item (real LocalPool processes)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from producer.cli import cli
from producer.commands.sweep import grade_file
from tests.helpers import (
    hostile_grade,
    kill_when_marked,
    misbehave_while_prepared,
    mixed_lines,
    real_rollouts,
)
from workers import verifier
from workers.cache.exact import ExactLayer
from workers.cache.results import SqliteResultCache
from workers.embedded import pool as local
from workers.embedded.pool import GradePairs, LocalPool
from workers.lines.fields import FieldSpec
from workers.lines.records import (
    InputRow,
    dump_line,
    graded_record,
    parse_line,
)
from workers.lines.units import (
    LineGrader,
    grade_line_unit,
    line_unit,
    replay_line_unit,
)
from workers.models import GradeOptions, Status

OPTIONS = GradeOptions()
MIB = 1 << 20


def _grade_rows(pool: LocalPool) -> Callable[[Sequence[InputRow], Any], list[Any]]:
    def grade_rows(rows: Sequence[InputRow], advance: Callable[[int], None]) -> Any:
        verdicts = pool.grade(rows, OPTIONS)
        advance(len(rows))
        return verdicts

    return grade_rows


def _run_units(pool: LocalPool) -> Any:
    def run_units(units: Any, weights: Any, advance: Callable[[int], None]) -> Any:
        done = 0

        def running(total: int) -> None:
            nonlocal done
            advance(total - done)
            done = total

        return pool.run_units(units, weights, on_progress=running)

    return run_units


def _pool(**kw: Any) -> LocalPool:
    args: dict[str, Any] = {
        "processes": 2,
        "item_timeout_s": 30.0,
        "item_memory_bytes": 512 * MIB,
        "cache_path": None,
        "unit_fn": grade_line_unit,
    }
    args.update(kw)
    return LocalPool(**args)


def test_line_mode_writes_what_item_mode_writes_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a file with every kind of line: samples, alternative golds, numbers
    # beyond 64 bits, floats, NaN, lone surrogates, a BOM, blank, malformed,
    # non-object, invalid UTF-8, overlong lines, clashing field names
    source = tmp_path / "in.jsonl"
    source.write_bytes(mixed_lines())
    outputs = {}
    with _pool() as pool:
        for mode in ("items", "lines"):
            grade_lines = None
            if mode == "lines":  # small units: lines of one row meet across units
                grade_lines = LineGrader(_run_units(pool), FieldSpec(), OPTIONS, 7)
            summary = grade_file(
                str(source),
                str(tmp_path / f"{mode}.jsonl"),
                _grade_rows(pool),
                spec=FieldSpec(),
                show_progress=False,
                grade_lines=grade_lines,
            )
            outputs[mode] = (
                (tmp_path / f"{mode}.jsonl").read_bytes(),
                summary,
                capsys.readouterr().err,
            )
    # Then line mode writes the same bytes, totals and error messages
    items, lines = outputs["items"], outputs["lines"]
    assert lines[0] == items[0]
    assert lines[1] == items[1]
    assert lines[2] == items[2]
    # (the 150 real rows, 3 samples, 8 other rows; 6 unusable lines: a number as
    # the response, a list, bad JSON, NaN, bad UTF-8, the overlong line)
    assert items[1].graded == 150 + 3 + 8
    assert items[1].input_errors == 6
    assert "line 16: line longer than" in items[2]


@pytest.mark.parametrize(
    ("response", "status"),
    [
        ("hang", Status.TIMEOUT),
        ("alloc-at-once", Status.MEMORY_LIMIT),
        ("abort", Status.ERROR),
        ("raise", Status.ERROR),
    ],
)
def test_line_mode_hostile_item_gets_item_modes_verdict_and_its_unit_is_graded(
    response: str, status: Status
) -> None:
    # Given a unit whose third line has samples, one of which hangs, bloats,
    # crashes or raises
    records: list[dict[str, Any]] = [
        {"response": f"\\boxed{{{i}}}", "gold": str(i)} for i in range(12)
    ]
    records[2] = {"responses": ["\\boxed{2}", response, "\\boxed{2}"], "gold": "2"}
    lines = [(n + 1, json.dumps(r).encode()) for n, r in enumerate(records)]
    rows = [row for n, raw in lines for row in _rows(raw, n)]
    with _pool(
        processes=1,
        item_timeout_s=2.0,
        item_memory_bytes=256 * MIB,
        grade_fn=hostile_grade,
    ) as pool:
        expected = pool.grade(rows, OPTIONS)
        started = time.monotonic()
        (result,) = pool.run_units([line_unit(lines, FieldSpec(), OPTIONS)], [12])
        took_s = time.monotonic() - started
    # Then it is answered as item mode answers it, once, and every other row of
    # the unit is graded
    assert expected[3].status is status
    assert sum(v.correct for v in expected) == 13
    assert result is not None
    assert result[1].decode() == "".join(
        dump_line(graded_record(row, verdict))
        for row, verdict in zip(rows, expected, strict=True)
    )
    assert took_s < 10


def _rows(raw: bytes, line_no: int) -> list[InputRow]:
    parsed = parse_line(raw, line_no)
    assert isinstance(parsed, list)
    return parsed


def test_line_mode_unit_killed_from_outside_is_run_again(tmp_path: Path) -> None:
    # Given a row that hangs the first time it is graded, its worker killed then
    mark = tmp_path / "worker.pid"
    records = [{"response": f"\\boxed{{{i}}}", "gold": str(i)} for i in range(30)]
    records[17] = {"response": f"once:{mark}", "gold": "x"}
    lines = [(n + 1, json.dumps(r).encode()) for n, r in enumerate(records)]
    units = [line_unit(lines[i : i + 10], FieldSpec(), OPTIONS) for i in (0, 10, 20)]
    with _pool(grade_fn=hostile_grade) as pool:
        out = kill_when_marked(mark, lambda: pool.run_units(units, [10, 10, 10]))
    # Then its unit is run again, and nothing is lost or out of order
    graded = [json.loads(line) for r in out for line in r[1].splitlines()]
    assert [g["gradefleet_line"] for g in graded] == list(range(1, 31))
    assert [g["correct"] for g in graded] == [i != 17 for i in range(30)]
    assert graded[17]["status"] != "error"


def _die_on_poison(unit: Any, body: bytes, grade: GradePairs) -> tuple[Any, bytes]:
    """A unit function that kills its worker outside any item on a marked unit."""
    if b"poison-unit" in body:
        os.kill(os.getpid(), signal.SIGKILL)
    return grade_line_unit(unit, body, grade)


def test_line_mode_unit_that_always_loses_its_worker_is_graded_as_rows(
    tmp_path: Path,
) -> None:
    # Given a unit whose worker dies each time, with no item to blame
    records = [{"response": f"\\boxed{{{i}}}", "gold": str(i)} for i in range(20)]
    records[12] = {"response": "\\boxed{12} poison-unit", "gold": "12"}
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    with _pool(unit_fn=_die_on_poison, max_attempts=2) as pool:
        fine = line_unit([(1, b'{"response": "1", "gold": "1"}')], FieldSpec(), OPTIONS)
        poison = line_unit(
            [(2, source.read_bytes().splitlines()[12])], FieldSpec(), OPTIONS
        )
        results = pool.run_units([fine, poison], [1, 1])
        assert results[0] is not None
        assert results[1] is None
        # Then the file still gets every row, graded in item mode
        out = tmp_path / "out.jsonl"
        summary = grade_file(
            str(source),
            str(out),
            _grade_rows(pool),
            spec=FieldSpec(),
            show_progress=False,
            grade_lines=LineGrader(_run_units(pool), FieldSpec(), OPTIONS, 5),
        )
    graded = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["gradefleet_line"] for g in graded] == list(range(1, 21))
    assert all(g["correct"] for g in graded)
    assert summary.graded == 20


def test_cli_deadline_in_line_mode_writes_stand_ins_only_where_no_result_came(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a file whose 150th row hangs (past --deadline-s, within the item
    # deadline), graded by the CLI in line mode (forked workers run this patch)
    misbehave_while_prepared(monkeypatch)
    records = [{"response": f"\\boxed{{{i}}}", "gold": str(i)} for i in range(200)]
    records[149] = {"response": "hang while prepared", "gold": "1"}
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out.jsonl"
    args = ["grade", str(source), "-o", str(out), "--no-cache", "--processes", "2"]
    result = CliRunner().invoke(
        cli, [*args, "--item-timeout-s", "60", "--deadline-s", "3"]
    )
    # Then every row is written in order; the hanging row's unit (lines 129-192)
    # and any unit queued behind it on its worker are `timeout` by the deadline,
    # the others graded, and exit 6 names the late lines
    assert result.exit_code == 6, result.output
    graded = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["gradefleet_line"] for g in graded] == list(range(1, 201))
    late = [g["gradefleet_line"] for g in graded if g["status"] == "timeout"]
    assert late in (list(range(129, 193)), list(range(129, 201)))
    assert f"input lines 129-{late[-1]}" in result.stderr
    assert all(g["correct"] for g in graded if g["status"] != "timeout")


def _cli_grade(source: Path, out: Path, *extra: str) -> list[dict[str, Any]]:
    args = ["grade", str(source), "-o", str(out), "--processes", "2", *extra]
    result = CliRunner().invoke(cli, [*args, "--item-timeout-s", "30", "-q"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in out.read_text().splitlines()]


def _cache_rows(cache_dir: Path) -> int:
    (path,) = cache_dir.iterdir()
    # Closed before the next run forks its workers: SQLite's locks do not survive
    # a connection open across a fork.
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (rows,) = conn.execute("SELECT COUNT(*) FROM results").fetchone()
    return int(rows)


def test_line_mode_cache_answers_a_graded_file_a_unit_at_a_time(
    tmp_path: Path,
) -> None:
    # Given 300 real rollouts (5 units of 64 lines), graded with the cache off,
    # then with a cold cache, then again
    rollouts = real_rollouts()[:300]
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            json.dumps({"response": r.response, "gold": r.gold}) + "\n"
            for r in rollouts
        )
    )
    cache = ["--cache-dir", str(tmp_path / "cache")]
    off = _cli_grade(source, tmp_path / "off.jsonl", "--no-cache")
    cold = _cli_grade(source, tmp_path / "cold.jsonl", *cache)
    rows_after_cold = _cache_rows(tmp_path / "cache")
    warm = _cli_grade(source, tmp_path / "warm.jsonl", *cache)
    # Then every run writes the same verdicts, the re-grade all from the cache,
    # and the cache holds a row per unit (5), no row per rollout or answer
    assert _without_cached(cold) == _without_cached(off) == _without_cached(warm)
    assert not any(r["cached"] for r in off + cold)
    assert all(r["cached"] for r in warm)
    assert rows_after_cold == 5
    assert _cache_rows(tmp_path / "cache") == rows_after_cold
    # When one line changes, only its unit is graded again
    lines = source.read_text().splitlines(keepends=True)
    lines[100] = json.dumps({"response": "\\boxed{7}", "gold": "7"}) + "\n"
    source.write_text("".join(lines))
    edited = _cli_grade(source, tmp_path / "edited.jsonl", *cache)
    fresh = [i for i, r in enumerate(edited) if not r["cached"]]
    assert 100 in fresh
    assert all(64 <= i < 128 for i in fresh)
    assert edited[100]["correct"] is True
    # When the cache's rows are not what this code stores (another layout, damage),
    # the units are graded again, not misread
    (path,) = (tmp_path / "cache").iterdir()
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("""UPDATE results SET value = '{"unit": {"rows": []}}'""")
    damaged = _cli_grade(source, tmp_path / "damaged.jsonl", *cache)
    assert _without_cached(damaged) == _without_cached(edited)
    assert not any(r["cached"] for r in damaged)


def _without_cached(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "cached"} for r in records]


def test_line_mode_cache_does_not_keep_a_unit_with_a_transient_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a unit whose one row times out (its worker killed on it), graded twice
    # with the cache on (the verifier's, so units are stored whole)
    misbehave_while_prepared(monkeypatch)
    records = [{"response": f"\\boxed{{{i}}}", "gold": str(i)} for i in range(10)]
    records[4] = {"response": "hang while prepared", "gold": "4"}
    lines = [(n + 1, json.dumps(r).encode()) for n, r in enumerate(records)]
    unit = line_unit(lines, FieldSpec(), OPTIONS)
    runs = []
    for _run in range(2):
        with _pool(
            processes=1, item_timeout_s=0.5, cache_path=tmp_path / "c.db"
        ) as pool:
            (result,) = pool.run_units([unit], [10])
        assert result is not None
        runs.append([json.loads(line) for line in result[1].splitlines()])
    # Then the second run grades it again rather than replaying it
    for graded in runs:
        assert graded[4]["status"] == "timeout"
        assert not any(r["cached"] for r in graded)
        assert all(r["correct"] for i, r in enumerate(graded) if i != 4)


def _boxed_units(count: int) -> tuple[list[tuple[int, bytes]], list[Any]]:
    """`count` lines of boxed answers (every fourth correct) and their units of 5."""
    records = [
        {"response": f"\\boxed{{{i}}}", "gold": str(i % 4)} for i in range(count)
    ]
    lines = [(n + 1, json.dumps(r).encode()) for n, r in enumerate(records)]
    units = [
        line_unit(lines[i : i + 5], FieldSpec(), OPTIONS) for i in range(0, count, 5)
    ]
    return lines, units


def test_line_mode_units_rows_are_in_the_cache_once_the_pool_idles(
    tmp_path: Path,
) -> None:
    # Given units graded with their keys on a pool with the cache on (rows held
    # back: 12 units are far under the write-behind bounds)
    path = tmp_path / "c.db"
    _lines, units = _boxed_units(60)
    layer = ExactLayer(SqliteResultCache(path), verifier.GRADER_VERSION)
    keys = layer.unit_keys(units)
    layer._cache.close()  # type: ignore[attr-defined]  # not open across the fork
    with _pool(cache_path=path) as pool:
        results = pool.run_units(units, [5] * 12, keys=keys)
        # When the call has returned and no other comes, the rows are written
        # while the pool still runs, not only when it closes
        found: dict[str, str] = {}
        for _attempt in range(100):  # 5 s at most
            found = layer.lookup_units(keys)
            if len(found) == len(keys):
                break
            time.sleep(0.05)
        layer._cache.close()  # type: ignore[attr-defined]
    # Then each unit's rows are there, as its output shows them
    assert len(found) == len(keys)
    for key, result in zip(keys, results, strict=True):
        assert result is not None
        shown = [json.loads(line)["status"] for line in result[1].splitlines()]
        kept = json.loads(found[key])["unit"]["rows"]
        status_at = json.loads(found[key])["unit"]["fields"].index("status")
        assert [row[status_at] for row in kept] == shown


def test_line_mode_workers_look_units_up_themselves_under_the_clis_keys(
    tmp_path: Path,
) -> None:
    # Given units graded on a pool with the cache on whose workers take and look
    # up each unit's key themselves (no keys from the caller)
    path = tmp_path / "c.db"
    lines, units = _boxed_units(40)
    with _pool(cache_path=path) as pool:
        first = pool.run_units(units, [5] * 8, look_up=True)
    # Then they are stored under the keys the CLI looks up
    layer = ExactLayer(SqliteResultCache(path), verifier.GRADER_VERSION)
    keys = layer.unit_keys(units)
    assert len(layer.lookup_units(keys)) == len(units)
    layer._cache.close()  # type: ignore[attr-defined]  # not open across the fork
    # When they are run again so, and once more with one unit's lines changed
    changed = list(units)
    new_line = (16, json.dumps({"response": "\\boxed{9}", "gold": "9"}).encode())
    changed[3] = line_unit([new_line, *lines[16:20]], FieldSpec(), OPTIONS)
    with _pool(cache_path=path) as pool:
        again = pool.run_units(units, [5] * 8, look_up=True)
        edited = pool.run_units(changed, [5] * 8, look_up=True)
    # Then the stored ones are rendered from the cache (the same lines, `cached`
    # set) and the changed one is graded
    for before, after in zip(first, again, strict=True):
        assert before is not None
        assert after is not None
        assert after[0]["totals"] == {**before[0]["totals"], "cached": 5}
        shown = [json.loads(line) for line in after[1].splitlines()]
        graded = [json.loads(line) for line in before[1].splitlines()]
        assert [{**r, "cached": False} for r in shown] == graded
        assert all(r["cached"] for r in shown)
    for index, result in enumerate(edited):
        assert result is not None
        shown = [json.loads(line) for line in result[1].splitlines()]
        assert all(r["cached"] is (index != 3) for r in shown)
    assert json.loads(edited[3][1].splitlines()[0])["correct"] is True


def test_line_mode_workers_after_a_run_of_misses_probe_until_one_is_found(
    tmp_path: Path,
) -> None:
    # Given units graded and stored, and new units that come before them, more of
    # them than a worker misses before it only probes (one worker: in order)
    path = tmp_path / "c.db"
    _lines, stored = _boxed_units(5 * 40)
    fresh = [
        line_unit(
            [
                (
                    n,
                    json.dumps(
                        {"response": f"{n} is \\boxed{{{n}}}", "gold": "1"}
                    ).encode(),
                )
                for n in range(i, i + 5)
            ],
            FieldSpec(),
            OPTIONS,
        )
        for i in range(1000, 1000 + 5 * (local._MISSES_BEFORE_PROBING + 4), 5)
    ]
    with _pool(processes=1, cache_path=path) as pool:
        first = pool.run_units(stored, [5] * len(stored), look_up=True)
    # When all are run, the workers looking them up
    units = fresh + stored
    with _pool(processes=1, cache_path=path) as pool:
        again = pool.run_units(units, [5] * len(units), look_up=True)
    # Then the stored units before the first probe are graded again, the rest are
    # found (once one is, every unit is looked up), and all give the same rows
    misses = len(fresh) - local._MISSES_BEFORE_PROBING
    first_found = -misses % local._PROBE_EVERY
    assert 0 < first_found < local._PROBE_EVERY
    cached = [result[0]["totals"]["cached"] for result in again if result is not None]
    assert cached == [0] * (len(fresh) + first_found) + [5] * (
        len(stored) - first_found
    )
    for before, after in zip(first, again[len(fresh) :], strict=True):
        assert before is not None
        assert after is not None
        shown = [
            {**json.loads(line), "cached": False} for line in after[1].splitlines()
        ]
        assert shown == [json.loads(line) for line in before[1].splitlines()]


def test_line_mode_unit_kept_without_the_cached_field_is_graded_again() -> None:
    # Given a unit graded once, and what the cache keeps of it, also as an older
    # gradefleet kept it (no `cached` value in its rows)
    records = [{"response": f"\\boxed{{{i}}}", "gold": str(i % 3)} for i in range(6)]
    lines = [(n + 1, json.dumps(r).encode()) for n, r in enumerate(records)]
    unit, body = line_unit(lines, FieldSpec(), OPTIONS)

    def grade(pairs: Any, options: GradeOptions) -> list[Any]:
        return [verifier.grade(r, g, options=options) for r, g in pairs]

    result, out = grade_line_unit(unit, body, grade)
    kept = result["store"]()
    at = kept["fields"].index("cached")
    older = {
        "fields": [f for f in kept["fields"] if f != "cached"],
        "rows": [row[:at] + row[at + 1 :] for row in kept["rows"]],
    }
    # When each is replayed
    replayed = replay_line_unit(unit, body, json.dumps({"unit": kept}))
    stale = replay_line_unit(unit, body, json.dumps({"unit": older}))
    # Then the kept one gives the graded lines with `cached` set, the older none
    assert replayed is not None
    again = [json.loads(line) for line in replayed[1].splitlines()]
    graded = [json.loads(line) for line in out.splitlines()]
    assert [{**r, "cached": False} for r in again] == graded
    assert all(r["cached"] for r in again)
    assert stale is None


_REGRADE = """
import sys
from producer.cli import main
try:
    main(sys.argv[1:])
finally:
    print("sympy imported:", "sympy" in sys.modules, file=sys.stderr)
"""


def test_line_mode_regrade_skips_the_warm_up_and_grades_what_is_new(
    tmp_path: Path,
) -> None:
    # Given a file of 2,048 rows (the CLI's first chunk) graded with the cache on
    rollouts = [r for r in real_rollouts() for _copy in range(2)][:2148]
    records = [
        {"response": f"[{i}] {r.response}", "gold": r.gold}
        for i, r in enumerate(rollouts)
    ]
    source = tmp_path / "in.jsonl"
    cache = ["--cache-dir", str(tmp_path / "cache"), "--processes", "2"]

    def grade(name: str, *extra: str) -> tuple[list[dict[str, Any]], str]:
        out = tmp_path / f"{name}.jsonl"
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _REGRADE,
                "grade",
                str(source),
                "-o",
                str(out),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in out.read_text().splitlines()], done.stderr

    source.write_text("".join(json.dumps(r) + "\n" for r in records[:2048]))
    cold, _ = grade("cold", *cache)
    # When it is graded again: every unit is stored, so no grading is needed (its
    # 32 units are rendered by a replay pool, which forks without a warm-up)
    again, stderr = grade("again", *cache)
    assert all(r["cached"] for r in again)
    assert _without_cached(again) == _without_cached(cold)
    assert "sympy imported: False" in stderr
    # When the stored rows do not fit (damage): the replay pool hands every unit
    # back, and they are graded again, as they were the first time
    (path,) = (tmp_path / "cache").iterdir()
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("""UPDATE results SET value = '{"fields": [], "rows": []}'""")
    damaged, stderr = grade("damaged", *cache)
    assert _without_cached(damaged) == _without_cached(cold)
    assert not any(r["cached"] for r in damaged)
    assert "sympy imported: True" in stderr
    # When 100 rows are added (a second chunk, not stored): the workers forked cold
    # are replaced by warm ones, and the new rows graded as without a cache
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    grown, stderr = grade("grown", *cache, "--item-timeout-s", "1")
    off, _ = grade("off", "--no-cache", "--processes", "2")
    assert _without_cached(grown) == _without_cached(off)
    assert all(r["cached"] for r in grown[:2048])
    assert "sympy imported: True" in stderr
    # When the first line changes: the first chunk has a unit the cache lacks, so
    # the workers look up the second chunk's units themselves, and find them
    records[0] = {"response": "\\boxed{12}", "gold": "12"}
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    edited, _ = grade("edited", *cache)
    assert [i for i, r in enumerate(edited) if not r["cached"]] == list(range(64))
    assert edited[0]["correct"] is True
    assert _without_cached(edited[64:]) == _without_cached(off[64:])


def test_line_mode_replay_changes_only_the_verdicts_cached_field(
    tmp_path: Path,
) -> None:
    # Given rows whose input already holds `cached` and `gradefleet_line` keys, at
    # the top or nested (a graded file graded again, metadata copied from one)
    records: list[dict[str, Any]] = [
        {"response": f"\\boxed{{{i}}}", "gold": str(i % 3)} for i in range(200)
    ]
    records[5]["meta"] = {"cached": False, "gradefleet_line": 3}
    records[70] = {"cached": "x", **records[70], "note": {"cached": False}}
    records[71] = {**records[71], "cached": True, "gradefleet_line": 9}
    records[140] = {"gradefleet_line": 1, **records[140], "cached": False}
    records[141]["text"] = '"cached":false,"gradefleet_line":1}'
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    cache = ["--cache-dir", str(tmp_path / "cache")]
    off = _cli_grade(source, tmp_path / "off.jsonl", "--no-cache")
    _cli_grade(source, tmp_path / "cold.jsonl", *cache)
    warm = _cli_grade(source, tmp_path / "warm.jsonl", *cache)
    # Then a re-grade, all from the cache, differs from a run without cache in the
    # verdict's `cached` alone
    assert [
        {**o, "cached": w["cached"]} for o, w in zip(off, warm, strict=True)
    ] == warm
    assert all(w["cached"] for w in warm)


def test_line_mode_replay_pool_renders_every_layout_as_the_cold_run(
    tmp_path: Path,
) -> None:
    # Given 1,200 lines (19 units: rendered by the replay pool on a re-grade), most
    # in the usual layout, some not: several samples on one line, other field
    # names, a list of golds, a float, a blank line and a malformed one, each in
    # a unit of its own and one unit holding several
    records: list[Any] = [
        {"response": f"\\boxed{{{i % 7}}}", "gold": str(i % 5)} for i in range(1200)
    ]
    records[70] = {"responses": ["\\boxed{1}", "\\boxed{2}", "3"], "gold": "2"}
    records[200] = {"completion": "so \\boxed{4}", "answer": "4", "id": 200}
    records[330] = {"response": "\\boxed{5}", "gold": ["6", "5"]}
    records[460] = {"response": "\\boxed{0.5}", "gold": "1/2", "score": 0.25}
    records[900:904] = [
        {"outputs": ["\\boxed{1}", "x"], "target": "1"},
        None,  # a blank line
        "{not json",
        {"response": 7, "gold": "7"},  # not text: the line's error
    ]
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            ("" if r is None else r if isinstance(r, str) else json.dumps(r)) + "\n"
            for r in records
        )
    )
    cache = ["--cache-dir", str(tmp_path / "cache"), "--processes", "2", "-q"]

    def grade(name: str) -> tuple[list[dict[str, Any]], str]:
        out = tmp_path / f"{name}.jsonl"
        args = ["grade", str(source), "-o", str(out), *cache]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 3, result.output  # malformed lines: exit 3
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        return rows, result.output

    cold, cold_said = grade("cold")
    again, again_said = grade("again")
    # Then the re-grade writes what the cold run wrote, `cached` aside, and
    # reports the same malformed lines
    assert len(again) == len(cold) == 1200 - 3 + 2 + 1
    assert all(r["cached"] for r in again)
    assert _without_cached(again) == _without_cached(cold)
    assert [r["gradefleet_line"] for r in again[70:73]] == [71, 71, 71]
    assert again_said == cold_said
    assert "line 903" in again_said
    assert "line 904" in again_said


def test_line_mode_cold_file_of_several_chunks_is_stored_whole(
    tmp_path: Path,
) -> None:
    # Given 3,000 new lines (a first chunk of 2,048: 32 units; then 15 units)
    records = [
        {"response": f"\\boxed{{{i % 11}}}", "gold": str(i % 4)} for i in range(3000)
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    cache = ["--cache-dir", str(tmp_path / "cache")]
    cold = _cli_grade(source, tmp_path / "cold.jsonl", *cache)
    # Then every unit of both chunks is stored under the key the CLI looks up: a
    # re-grade renders all 3,000 rows from the cache, as the cold run wrote them
    assert _cache_rows(tmp_path / "cache") == 47
    warm = _cli_grade(source, tmp_path / "warm.jsonl", *cache)
    assert all(r["cached"] for r in warm)
    assert not any(r["cached"] for r in cold)
    assert _without_cached(warm) == _without_cached(cold)


def test_line_mode_writes_nan_and_infinity_as_the_stdlib_graded_and_replayed(
    tmp_path: Path,
) -> None:
    # Given lines orjson cannot read (NaN, Infinity, a number past a double), in
    # the usual layout and with samples, among usual lines: the stdlib reads them,
    # and orjson would write their non-finite floats as null
    lines = [
        json.dumps({"response": f"\\boxed{{{i}}}", "gold": str(i % 4)}).encode()
        for i in range(300)
    ]
    lines[10] = b'{"response": "\\\\boxed{2}", "gold": "2", "score": NaN, "big": 1e400}'
    lines[250] = b'{"responses": ["\\\\boxed{3}", "x"], "gt": "3", "lp": -Infinity}'
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    cache = ["--cache-dir", str(tmp_path / "cache")]
    raw = {}
    for name, extra in (("off", ["--no-cache"]), ("cold", cache), ("again", cache)):
        out = tmp_path / f"{name}.jsonl"
        rows = _cli_grade(source, out, *extra)
        raw[name] = out.read_bytes().splitlines()
        assert all(r["cached"] for r in rows) is (name == "again")
    # Then graded (off, cold) and rendered from the cache (again), each of those
    # lines keeps its values as the stdlib writes them, not null
    for name, out_lines in raw.items():
        nan_line, inf_lines = out_lines[10], out_lines[250:252]
        assert b'"score": NaN' in nan_line, name
        assert b'"big": Infinity' in nan_line, name
        assert all(b'"lp": -Infinity' in line for line in inf_lines), name
        assert all(b"null" not in line for line in out_lines[:10]), name
    assert raw["off"] == raw["cold"]

    def uncached(line: bytes) -> bytes:  # either encoder's spelling
        line = line.replace(b'"cached":true', b'"cached":false')
        return line.replace(b'"cached": true', b'"cached": false')

    assert [uncached(line) for line in raw["again"]] == raw["cold"]
