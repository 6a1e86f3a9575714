"""`gradefleet audit LABELED`: the verifier as a classifier, against trusted labels.

With the verifier's false-negative rate alpha (correct rollouts it calls wrong) and
false-positive rate phi, a measured accuracy m estimates a(1 - alpha) + (1 - a) phi;
`producer.reports.stats.corrected_accuracy` inverts that. `report --audit` applies an
audit's alpha and phi to a report's accuracy.

The matrix is also given per rollout kind (`kinds[]`: math and code graders err
differently) and per (kind, data source) when rows name one (`sources[]`); a
disagreement on a code row names its first failing test.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from producer.errors import InputFormatError
from producer.reports.diff import Graded, read_graded
from producer.reports.report import DEFAULT_KIND, group_label
from producer.reports.stats import Interval, corrected_accuracy, wilson
from workers.lines.fields import FieldSpec, lookup

__all__ = ["LABEL_FIELDS", "audit_file", "corrected_from_audit", "parse_label"]

LABEL_FIELDS = ("label", "human_label", "is_correct", "reference_correct")
_TRUE = {"true", "1", "yes", "correct", "y", "t"}
_FALSE = {"false", "0", "no", "incorrect", "wrong", "n", "f"}


def parse_label(value: object) -> bool | None:
    """A trusted label as a bool (bool, 0/1, or words like true/false), else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    return None


@dataclass(slots=True)
class Confusion:
    """Counts of (label, verdict) pairs."""

    tp: int = 0  # label correct, verdict correct
    fn: int = 0  # label correct, verdict not
    fp: int = 0  # label wrong, verdict correct
    tn: int = 0

    def add(self, label: bool, verdict: bool) -> None:
        if label:
            self.tp += verdict
            self.fn += not verdict
        else:
            self.fp += verdict
            self.tn += not verdict

    @property
    def n(self) -> int:
        return self.tp + self.fn + self.fp + self.tn

    def alpha(self) -> Interval:
        return wilson(self.fn, self.tp + self.fn)

    def phi(self) -> Interval:
        return wilson(self.fp, self.fp + self.tn)

    def to_dict(self) -> dict[str, Any]:
        measured = wilson(self.tp + self.fp, self.n)
        return {
            "n": self.n,
            "confusion": {"tp": self.tp, "fn": self.fn, "fp": self.fp, "tn": self.tn},
            "alpha": _interval(self.alpha()),
            "phi": _interval(self.phi()),
            "measured_accuracy": _interval(measured),
            "labeled_accuracy": _interval(wilson(self.tp + self.fn, self.n)),
            "corrected_accuracy": _interval(
                corrected_accuracy(measured, self.alpha(), self.phi())
            ),
        }


def _interval(x: Interval) -> dict[str, float]:
    return {"value": x.value, "stderr": x.stderr, "ci95": [x.low, x.high]}  # type: ignore[dict-item]


def _label_of(row: Graded, label_fields: Sequence[str]) -> bool | None:
    assert row.record is not None
    for name in label_fields:
        value = lookup(row.record, name)
        if value is not None:
            return parse_label(value)
    return None


def audit_file(
    path: str,
    spec: FieldSpec,
    by: Sequence[str],
    label_fields: Sequence[str] = LABEL_FIELDS,
) -> dict[str, Any]:
    """The audit of a graded file with trusted labels, as a JSON-able dict.

    Raises:
        InputFormatError: no row has a usable label.
    """
    rows = read_graded(path, spec, by, keep_record=True)
    overall = Confusion()
    by_status: dict[str, Counter[str]] = {}
    groups: dict[tuple[str, ...], Confusion] = {}
    kinds: dict[tuple[str, ...], Confusion] = {}
    sources: dict[tuple[str, ...], Confusion] = {}
    false_pos: list[Graded] = []
    false_neg: list[Graded] = []
    unlabeled = 0
    for row in rows:
        label = _label_of(row, label_fields)
        if label is None:
            unlabeled += 1
            continue
        overall.add(label, row.correct)
        groups.setdefault(row.group, Confusion()).add(label, row.correct)
        kinds.setdefault((row.kind,), Confusion()).add(label, row.correct)
        if row.data_source is not None:
            pair = (row.kind, row.data_source)
            sources.setdefault(pair, Confusion()).add(label, row.correct)
        counts = by_status.setdefault(row.status, Counter())
        counts["label_correct" if label else "label_wrong"] += 1
        if row.correct != label:
            (false_pos if row.correct else false_neg).append(row)
    if overall.n == 0:
        raise InputFormatError(
            f"{path}: no row has a label (fields tried: {', '.join(label_fields)}; "
            "true/false, 1/0 or correct/incorrect)"
        )
    versions = sorted({r.version for r in rows if r.version})
    return {
        "schema": 1,
        "source": path,
        "grader_versions": versions,
        "label_fields": list(label_fields),
        "unlabeled": unlabeled,
        **overall.to_dict(),
        "by_status": {s: dict(c) for s, c in sorted(by_status.items())},
        "by": list(by),
        "groups": [
            {"key": dict(zip(by, key, strict=True)), **conf.to_dict()}
            for key, conf in sorted(groups.items())
        ]
        if by
        else [],
        "kinds": _confusions(kinds, ("kind",)),
        "sources": _confusions(sources, ("kind", "data_source")),
        "disagreements": [_disagreement(r, "false_positive") for r in false_pos]
        + [_disagreement(r, "false_negative") for r in false_neg],
    }


def _confusions(
    found: dict[tuple[str, ...], Confusion], names: Sequence[str]
) -> list[dict[str, Any]]:
    return [
        {"key": dict(zip(names, key, strict=True)), **conf.to_dict()}
        for key, conf in sorted(found.items())
    ]


def _disagreement(row: Graded, kind: str) -> dict[str, Any]:
    """One disagreement; `kind` is false_positive/false_negative (the row's rollout
    kind is `rollout_kind`)."""
    out = {
        "kind": kind,
        "id": row.rid,
        "line": row.line_no,
        "status": row.status,
        "extracted": row.extracted,
        "gold": row.gold,
        "reason": row.reason,
        "rollout_kind": row.kind,
        "data_source": row.data_source,
    }
    if row.kind != DEFAULT_KIND:
        from workers.code.describe import describe_failure

        out["first_failure"] = describe_failure(row.record, row.failure)
    return out


def render_audit(audit: dict[str, Any], *, max_rows: int = 50) -> str:
    """The terminal form of an audit."""

    def pct(x: dict[str, Any]) -> str:
        low, high = x["ci95"]
        if x["value"] is None or low is None or high is None:
            return "n/a (no rows)"  # e.g. alpha of a group with no label-correct row
        return f"{100 * x['value']:.2f}% (95% CI {100 * low:.2f}-{100 * high:.2f})"

    c = audit["confusion"]
    lines = [
        f"audit of {audit['source']}: {audit['n']:,} labeled rollouts "
        f"({audit['unlabeled']:,} without a label)",
        f"grader version: {', '.join(audit['grader_versions']) or 'unknown'}",
        "                 verdict correct   verdict not correct",
        f"label correct    {c['tp']:>15,}   {c['fn']:>19,}",
        f"label wrong      {c['fp']:>15,}   {c['tn']:>19,}",
        f"alpha (false-negative rate): {pct(audit['alpha'])}  [Wilson]",
        f"phi (false-positive rate):   {pct(audit['phi'])}  [Wilson]",
        f"measured accuracy:  {pct(audit['measured_accuracy'])}",
        f"corrected accuracy: {pct(audit['corrected_accuracy'])}"
        "  (m - phi)/(1 - alpha - phi)",
        "by verdict status (label correct / label wrong):",
    ]
    for status, counts in audit["by_status"].items():
        lines.append(
            f"  {status}: {counts.get('label_correct', 0):,} / "
            f"{counts.get('label_wrong', 0):,}"
        )
    several = len(audit.get("kinds", [])) > 1
    for group in [
        *audit["groups"],
        *(audit.get("kinds", []) if several else []),
        *audit.get("sources", []),
    ]:
        lines.append(
            f"  {group_label(group['key'])}: n={group['n']:,} "
            f"alpha={pct(group['alpha'])} phi={pct(group['phi'])}"
        )
    rows = audit["disagreements"]
    lines.append(f"disagreements: {len(rows):,} (false positives first)")
    for row in rows[:max_rows]:
        lines.append(
            f"  {row['kind']}: {row['id'] or 'line ' + str(row['line'])} "
            f"[{row['status']}] extracted={row['extracted']!r} gold={row['gold']!r} "
            f"({row['reason']})"
        )
        if row.get("first_failure"):
            lines.append(f"    first failing {row['first_failure']}")
    if len(rows) > max_rows:
        lines.append(f"  ... and {len(rows) - max_rows} more (see --json)")
    return "\n".join(lines) + "\n"


def corrected_from_audit(audit_path: str, measured: Interval) -> dict[str, Any]:
    """A report's accuracy corrected with the alpha and phi of a saved audit.

    Raises:
        InputFormatError: the file is not an audit's --json output.
    """
    try:
        with open(audit_path, encoding="utf-8") as handle:
            audit = json.load(handle)
        alpha = Interval(audit["alpha"]["value"], audit["alpha"]["stderr"], 0, 0)
        phi = Interval(audit["phi"]["value"], audit["phi"]["stderr"], 0, 0)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputFormatError(
            f"{audit_path} is not an audit --json file: {exc}"
        ) from exc
    corrected = corrected_accuracy(measured, alpha, phi)
    return {
        "audit": audit_path,
        "audit_grader_versions": audit.get("grader_versions", []),
        "alpha": alpha.value,
        "phi": phi.value,
        "measured": measured.value,
        **_interval(corrected),
    }
