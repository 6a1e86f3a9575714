"""The terminal form of a report: a plain-text table (no colours, safe in a log)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from producer.reports.report import GroupStats, Report, group_label

__all__ = ["render_report", "render_table"]


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}"


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the first column left-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = f"{cells[0]:<{widths[0]}}"
        rest = [f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)]) + "\n"


def _row(stats: GroupStats, ks: Sequence[int], statuses: Sequence[str]) -> list[str]:
    cells = [
        group_label(stats.key),
        f"{stats.n:,}",
        f"{stats.prompts:,}",
        _pct(stats.accuracy),
        _pct(stats.stderr),
        f"{_pct(stats.ci95[0])}-{_pct(stats.ci95[1])}",
    ]
    cells += [_pct(stats.pass_at.get(k, math.nan)) for k in ks]
    cells += [_pct(stats.maj_at.get(k, math.nan)) for k in ks]
    cells.append(_pct(stats.format_valid_rate))
    cells += [_pct(stats.status_rates[s]) for s in statuses]
    return cells


def render_report(report: Report, corrected: str | None = None) -> str:
    """The whole report: a heading, one row per group, then overall (in %)."""
    everything = [*report.groups, report.overall]
    statuses = [
        s
        for s in report.overall.status_rates
        if s != "correct" and any(g.status_rates[s] > 0 for g in everything)
    ]
    header = ["group", "rollouts", "prompts", "acc%", "±se", "95% CI"]
    header += [f"pass@{k}" for k in report.ks]
    header += [f"maj@{k}" for k in report.ks]
    header += ["format%", *statuses]
    rows = [_row(g, report.ks, statuses) for g in everything]
    keyed = ", ".join(f"{how} ({n:,})" for how, n in report.prompt_key_fields.items())
    lines = [
        f"report of {report.source}",
        f"grader version: {', '.join(report.grader_versions) or 'unknown'}",
        f"prompts keyed by: {keyed or 'n/a'}; intervals clustered by prompt"
        if report.overall.clustered
        else f"prompts keyed by: {keyed or 'n/a'}",
        "maj@k: majority of canonical answers; ties go to the first in sample order",
        "",
    ]
    text = "\n".join(lines) + render_table(header, rows)
    if corrected:
        text += corrected
    return text
