"""`report --html`: one self-contained page (inline SVG charts drawn by matplotlib,
inline CSS, no scripts, nothing fetched) with the report's tables and pictures:
accuracy by group with 95% intervals, the status breakdown, pass@k / maj@k curves;
and, when the file holds several rollout kinds or data sources, the kinds side by side
(one column a kind: math next to code, with code's tests passed and first-failure
kinds) and one row a (kind, data source).
"""

from __future__ import annotations

import html
import io
import math
from typing import Any

from producer.reports.report import GroupStats, Report, group_label

__all__ = ["render_html"]

_MAX_CURVES = 8  # groups drawn on the pass@k chart besides overall
_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
th{background:#f0f0f0}
.meta{color:#555}
figure{margin:1em 0}
"""


def _figure(width_in: float, height_in: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def _svg(fig: Any) -> str:
    import matplotlib

    matplotlib.rcParams["svg.hashsalt"] = "gradefleet"  # stable ids between runs
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})  # same page twice
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE


def _kinds(report: Report) -> list[GroupStats]:
    """The kinds, when there are several (one kind is overall again)."""
    return report.kinds if len(report.kinds) > 1 else []


def _rows(report: Report) -> list[GroupStats]:
    """What the charts draw: the groups, the kinds, overall."""
    return [*report.groups, *_kinds(report), report.overall]


def _accuracy_chart(report: Report) -> str:
    rows = _rows(report)
    fig = _figure(8, 0.4 * len(rows) + 1.2)
    ax = fig.add_subplot()
    labels = [group_label(g.key) for g in rows]
    values = [0.0 if math.isnan(g.accuracy) else 100 * g.accuracy for g in rows]
    lows = [0.0 if math.isnan(g.ci95[0]) else 100 * g.ci95[0] for g in rows]
    highs = [0.0 if math.isnan(g.ci95[1]) else 100 * g.ci95[1] for g in rows]
    errors = [
        [max(0.0, v - lo) for v, lo in zip(values, lows, strict=True)],
        [max(0.0, hi - v) for v, hi in zip(values, highs, strict=True)],
    ]
    ax.barh(labels, values, xerr=errors, color="#4c72b0", capsize=3)
    ax.set_xlim(0, 100)
    ax.set_xlabel("accuracy, % (95% interval, clustered by prompt)")
    ax.invert_yaxis()
    return _svg(fig)


def _status_chart(report: Report) -> str:
    rows = _rows(report)
    statuses = [
        s for s in report.overall.status_rates if report.overall.status_rates[s] > 0
    ]
    fig = _figure(8, 0.4 * len(rows) + 1.4)
    ax = fig.add_subplot()
    labels = [group_label(g.key) for g in rows]
    left = [0.0] * len(rows)
    for status in statuses:
        widths = [100 * g.status_rates[status] for g in rows]
        ax.barh(labels, widths, left=left, label=status)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of rollouts by status, %")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    return _svg(fig)


def _k_chart(report: Report) -> str:
    fig = _figure(8, 4)
    ax = fig.add_subplot()
    for group in [report.overall, *_kinds(report), *report.groups[:_MAX_CURVES]]:
        ks = sorted(group.pass_at)
        label = group_label(group.key)
        ax.plot(
            ks,
            [100 * group.pass_at[k] for k in ks],
            marker="o",
            label=f"pass@k {label}",
        )
        ks = sorted(group.maj_at)
        ax.plot(
            ks,
            [100 * group.maj_at[k] for k in ks],
            marker="x",
            linestyle="--",
            label=f"maj@k {label}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per prompt)")
    ax.set_ylabel("%")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    return _svg(fig)


def _pct(x: float) -> str:
    return "" if math.isnan(x) else f"{100 * x:.1f}"


def _table(report: Report) -> str:
    head = ["group", "rollouts", "prompts", "accuracy %", "± se", "95% CI"]
    head += [f"pass@{k}" for k in report.ks] + [f"maj@{k}" for k in report.ks]
    statuses = list(report.overall.status_rates)
    head += ["format valid %", *statuses]
    lines = ["<table id='report-table'><tr>"]
    lines += [f"<th>{html.escape(h)}</th>" for h in head]
    lines.append("</tr>")
    for g in [*report.groups, report.overall]:
        cells = [
            group_label(g.key),
            f"{g.n:,}",
            f"{g.prompts:,}",
            _pct(g.accuracy),
            _pct(g.stderr),
            f"{_pct(g.ci95[0])}–{_pct(g.ci95[1])}",
        ]
        cells += [_pct(g.pass_at.get(k, math.nan)) for k in report.ks]
        cells += [_pct(g.maj_at.get(k, math.nan)) for k in report.ks]
        cells += [_pct(g.format_valid_rate)]
        cells += [_pct(g.status_rates[s]) for s in statuses]
        lines.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells))
        lines.append("</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def _kinds_table(report: Report) -> str:
    """Metrics down, kinds across: math and code side by side."""
    kinds = report.kinds
    rows: list[tuple[str, list[str]]] = [
        (
            "grader version",
            [", ".join(report.versions_by_kind.get(k.key["kind"], [])) for k in kinds],
        ),
        ("rollouts", [f"{k.n:,}" for k in kinds]),
        ("prompts", [f"{k.prompts:,}" for k in kinds]),
        ("accuracy %", [_pct(k.accuracy) for k in kinds]),
        ("95% CI", [f"{_pct(k.ci95[0])}–{_pct(k.ci95[1])}" for k in kinds]),
    ]
    rows += [
        (f"pass@{n}", [_pct(k.pass_at.get(n, math.nan)) for k in kinds])
        for n in report.ks
    ]
    rows += [
        (f"maj@{n}", [_pct(k.maj_at.get(n, math.nan)) for k in kinds])
        for n in report.ks
    ]
    rows.append(("tests passed % (mean)", [_pct(k.test_score) for k in kinds]))
    statuses = [
        s for s in report.overall.status_rates if report.overall.status_rates[s]
    ]
    rows += [(f"{s} %", [_pct(k.status_rates[s]) for k in kinds]) for s in statuses]
    failures = sorted({f for k in kinds for f in k.failure_rates})
    rows += [
        (f"first failure: {f} %", [_pct(k.failure_rates.get(f, 0.0)) for k in kinds])
        for f in failures
    ]
    head = "".join(f"<th>{html.escape(k.key['kind'])}</th>" for k in kinds)
    body = "\n".join(
        f"<tr><td>{html.escape(name)}</td>"
        + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
        + "</tr>"
        for name, cells in rows
    )
    return f"<table id='kinds-table'><tr><th>metric</th>{head}</tr>\n{body}\n</table>"


def _sources_table(report: Report) -> str:
    head = ["kind", "data source", "rollouts", "prompts", "accuracy %", "95% CI"]
    head += [f"pass@{k}" for k in report.ks] + ["tests passed %"]
    lines = ["<table id='sources-table'><tr>"]
    lines += [f"<th>{html.escape(h)}</th>" for h in head]
    lines.append("</tr>")
    for g in report.sources:
        cells = [
            g.key["kind"],
            g.key["data_source"],
            f"{g.n:,}",
            f"{g.prompts:,}",
            _pct(g.accuracy),
            f"{_pct(g.ci95[0])}–{_pct(g.ci95[1])}",
        ]
        cells += [_pct(g.pass_at.get(k, math.nan)) for k in report.ks]
        cells.append(_pct(g.test_score))
        lines.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells))
        lines.append("</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def _kinds_section(report: Report) -> str:
    if len(report.kinds) < 2 and not report.sources:
        return ""
    parts = [
        "<h2>By kind</h2>",
        "<p class='meta'>maj@k votes on canonical answers; code has none, so its "
        "maj@k is empty. Tests passed: mean fraction of a code row's tests.</p>",
        _kinds_table(report),
    ]
    if report.sources:
        parts += ["<h2>By data source</h2>", _sources_table(report)]
    return "<section id='kinds'>\n" + "\n".join(parts) + "\n</section>"


def render_html(report: Report) -> str:
    """The whole page as one string."""
    versions = (
        "; ".join(f"{k}: {', '.join(v)}" for k, v in report.versions_by_kind.items())
        if len(report.versions_by_kind) > 1
        else ", ".join(report.grader_versions) or "unknown"
    )
    keyed = ", ".join(f"{h} ({n:,})" for h, n in report.prompt_key_fields.items())
    corrected = report.extra.get("corrected")
    corrected_html = ""
    if corrected:
        low, high = corrected["ci95"]
        corrected_html = (
            f"<p id='corrected'>Corrected accuracy {100 * corrected['value']:.2f}% "
            f"(95% CI {100 * low:.2f}–{100 * high:.2f}) with "
            f"α={corrected['alpha']:.4f}, φ={corrected['phi']:.4f} from "
            f"{html.escape(corrected['audit'])}</p>"
        )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>gradefleet report: {html.escape(report.source)}</title>
<style>{_STYLE}</style></head>
<body>
<h1>gradefleet report</h1>
<p class="meta">Source: {html.escape(report.source)}<br>
Grader version: <span id="grader-version">{html.escape(versions)}</span><br>
Prompts keyed by: {html.escape(keyed or "n/a")}<br>
maj@k: majority of canonical answers over the first k samples; a tie goes to the
answer seen first in sample order.</p>
{corrected_html}
{_table(report)}
{_kinds_section(report)}
<h2>Accuracy by group</h2>
<figure id="accuracy-chart">{_accuracy_chart(report)}</figure>
<h2>Status breakdown</h2>
<figure id="status-chart">{_status_chart(report)}</figure>
<h2>pass@k and maj@k</h2>
<figure id="k-chart">{_k_chart(report)}</figure>
</body></html>
"""
