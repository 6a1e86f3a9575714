"""The terminal form of a report: plain-text tables (no colours, safe in a log): the
groups and overall, then, when the file holds several rollout kinds or data sources,
one row a kind and a (kind, data source)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from producer.reports.report import GroupStats, Report, group_label

__all__ = ["has_kind_table", "render_report", "render_table"]


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


def has_kind_table(report: Report) -> bool:
    """Whether the kinds table says more than overall does."""
    return len(report.kinds) > 1 or bool(report.sources)


def _kind_table(report: Report, statuses: Sequence[str]) -> str:
    header = ["kind / data source", "rollouts", "prompts", "acc%", "±se", "95% CI"]
    header += [f"pass@{k}" for k in report.ks]
    header += [f"maj@{k}" for k in report.ks]
    header += ["format%", *statuses, "tests%"]
    rows = [
        [*_row(g, report.ks, statuses), _pct(g.test_score)]
        for g in [*report.kinds, *report.sources]
    ]
    return render_table(header, rows)


def _versions(report: Report) -> str:
    if len(report.versions_by_kind) > 1:
        return "; ".join(
            f"{kind}: {', '.join(versions)}"
            for kind, versions in report.versions_by_kind.items()
        )
    return ", ".join(report.grader_versions) or "unknown"


def render_report(report: Report, corrected: str | None = None) -> str:
    """The whole report: a heading, one row per group, then overall (in %); then
    the kinds and data sources (`has_kind_table`), with tests% (mean fraction of
    tests passed, code rows)."""
    everything = [*report.groups, report.overall, *report.kinds, *report.sources]
    statuses = [
        s
        for s in report.overall.status_rates
        if s != "correct" and any(g.status_rates[s] > 0 for g in everything)
    ]
    header = ["group", "rollouts", "prompts", "acc%", "±se", "95% CI"]
    header += [f"pass@{k}" for k in report.ks]
    header += [f"maj@{k}" for k in report.ks]
    header += ["format%", *statuses]
    rows = [_row(g, report.ks, statuses) for g in [*report.groups, report.overall]]
    keyed = ", ".join(f"{how} ({n:,})" for how, n in report.prompt_key_fields.items())
    lines = [
        f"report of {report.source}",
        f"grader version: {_versions(report)}",
        f"prompts keyed by: {keyed or 'n/a'}; intervals clustered by prompt"
        if report.overall.clustered
        else f"prompts keyed by: {keyed or 'n/a'}",
        "maj@k: majority of canonical answers; ties go to the first in sample order"
        + ("; code prompts have none (math only)" if len(report.kinds) > 1 else ""),
        "",
    ]
    text = "\n".join(lines) + render_table(header, rows)
    if has_kind_table(report):
        text += "\n" + _kind_table(report, statuses)
    if corrected:
        text += corrected
    return text
