"""The `report`, `diff` and `audit` commands, and the option checks `grade` shares.

Exit codes: `report` and `audit` 0; `diff` 0 when no verdict flipped, 1 when some did;
2 usage errors; input errors as `producer.errors` says.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from producer.errors import InputFormatError
from producer.extras import install_line, require
from producer.files.formats import iter_records, require_format_extras
from workers.lines.fields import FieldSpec

__all__ = [
    "audit",
    "check_broker_url",
    "check_output_path",
    "diff",
    "report",
    "response_gold_options",
    "write_grade_report",
]

F = TypeVar("F", bound=Callable[..., Any])


def check_broker_url(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    """A broker is a Redis or Sentinel URL; anything else is a usage error (exit 2)."""
    if value and not value.startswith(
        ("redis://", "rediss://", "unix://", "sentinel://")
    ):
        scheme = value.split("://")[0]
        hint = (
            "; an http(s):// URL is a `gradefleet serve` service, which the "
            "library reaches with producer.open_grader(URL) (the serve extra: "
            f"{install_line('serve')})"
            if scheme in ("http", "https")
            else ""
        )
        raise click.BadParameter(
            f"{scheme}:// is not a Redis URL (redis://host:6379/0): --broker names "
            f"a fleet's Redis{hint}",
            param_hint="'--broker'",
        )
    return value


def check_output_path(input_path: str, output_path: str) -> None:
    """Refuse an output that would replace its own input, or a missing directory."""
    if output_path == "-":
        return
    out = Path(output_path)
    if not out.absolute().parent.is_dir():
        raise click.BadParameter(
            f"directory of {output_path!r} does not exist", param_hint="'-o'"
        )
    if input_path != "-" and out.exists() and os.path.samefile(input_path, out):
        raise click.BadParameter(
            "is the input file; write elsewhere (the input is read while the output "
            "is written)",
            param_hint="'-o'",
        )


def response_gold_options(func: F) -> F:
    """`--response-field` and `--gold-field` (dotted paths)."""
    func = click.option(
        "--gold-field",
        metavar="PATH",
        help="Dotted path of the gold field (replaces the alias table).",
    )(func)
    return click.option(
        "--response-field",
        metavar="PATH",
        help="Dotted path of the response field (replaces the alias table).",
    )(func)


def _key_options(func: F) -> F:
    func = click.option(
        "--id-field", metavar="PATH", help="Dotted path of the rollout id."
    )(func)
    func = click.option(
        "--prompt-field",
        metavar="PATH",
        help="Dotted path of the prompt key that groups samples of one prompt.",
    )(func)
    return click.option(
        "--by",
        metavar="FIELDS",
        default="",
        help="Comma-separated dotted paths to group by (data_source,level).",
    )(func)


def _split(by: str) -> list[str]:
    return [part.strip() for part in by.split(",") if part.strip()]


def _write_json(data: Any, path: str) -> None:
    text = json.dumps(_finite(data), indent=2, ensure_ascii=False) + "\n"
    if path == "-":
        click.echo(text, nl=False)
        return
    Path(path).write_text(text, encoding="utf-8")


def _finite(data: Any) -> Any:
    """NaN (no data) is written as null: JSON has no NaN."""
    if isinstance(data, float) and math.isnan(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data


def _ks(value: str) -> list[int] | None:
    if not value:
        return None
    try:
        ks = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            "a comma-separated list of integers", param_hint="'--k'"
        ) from None
    if not ks or min(ks) < 1:
        raise click.BadParameter("every k must be >= 1", param_hint="'--k'")
    return ks


def build_report(
    path: str,
    *,
    by: list[str],
    spec: FieldSpec,
    ks: list[int] | None = None,
    split_versions: bool = False,
) -> Any:
    if path != "-":  # the file's own extra (Parquet, Inspect) is named first
        require_format_extras(path, "")
    require("report", "numpy")
    from producer.reports.report import ReportBuilder

    builder = ReportBuilder(by, spec=spec, split_versions=split_versions)
    bad = builder.add_all(iter_records(path))
    if bad:
        raise InputFormatError(f"{path}: {bad} unreadable line(s)")
    return builder.build(path, ks)


def write_grade_report(output_path: str, report_path: str, spec: FieldSpec) -> None:
    """`grade --report`: the report of the file just written."""
    if output_path == "-":
        raise InputFormatError("--report needs -o to name a file, not -")
    report_obj = build_report(output_path, by=[], spec=spec)
    _write_json(report_obj.to_dict(), report_path)


@click.command()
@click.argument(
    "graded", metavar="GRADED", type=click.Path(exists=True, dir_okay=False)
)
@_key_options
@click.option(
    "--k",
    "k_list",
    default="",
    metavar="1,4,8",
    help="k values for pass@k and maj@k [default: 1, powers of 2, max samples].",
)
@click.option(
    "--json",
    "json_path",
    metavar="FILE",
    help="Write the report as JSON (- for stdout).",
)
@click.option(
    "--html",
    "html_path",
    metavar="FILE",
    help="Write a self-contained HTML page with charts (needs the html extra: "
    "pip install 'gradefleet[html]').",
)
@click.option(
    "--audit",
    "audit_path",
    metavar="AUDIT.json",
    type=click.Path(exists=True, dir_okay=False),
    help="An `audit --json` file: print the accuracy corrected for its alpha and phi.",
)
@click.option(
    "--split-versions",
    is_flag=True,
    help="Report each grader version on its own instead of refusing a mixed file.",
)
def report(
    graded: str,
    by: str,
    prompt_field: str | None,
    id_field: str | None,
    k_list: str,
    json_path: str | None,
    html_path: str | None,
    audit_path: str | None,
    split_versions: bool,
) -> None:
    """Accuracy (clustered 95% CI), pass@k, maj@k and status rates of GRADED."""
    from producer.reports.audit import corrected_from_audit
    from producer.reports.report_text import render_report
    from producer.reports.stats import Interval

    if html_path:  # before reading GRADED: without the extra, exit 2 at once
        require("html", "matplotlib")
    spec = FieldSpec(prompt=prompt_field, id=id_field)
    result = build_report(
        graded, by=_split(by), spec=spec, ks=_ks(k_list), split_versions=split_versions
    )
    corrected_line = None
    if audit_path:
        o = result.overall
        measured = Interval(
            o.accuracy, 0.0 if math.isnan(o.stderr) else o.stderr, *o.ci95
        )
        corrected = corrected_from_audit(audit_path, measured)
        result.extra["corrected"] = corrected
        low, high = corrected["ci95"]
        corrected_line = (
            f"\ncorrected accuracy {100 * corrected['value']:.2f}% "
            f"(95% CI {100 * low:.2f}-{100 * high:.2f}) vs measured "
            f"{100 * o.accuracy:.2f}%, with alpha={corrected['alpha']:.4f} "
            f"phi={corrected['phi']:.4f} from {audit_path}\n"
        )
    if json_path:
        _write_json(result.to_dict(), json_path)
    if html_path:
        from producer.reports.report_html import render_html

        Path(html_path).write_text(render_html(result), encoding="utf-8")
    if json_path != "-":
        click.echo(render_report(result, corrected_line), nl=False)


@click.command()
@click.argument("path_a", metavar="A", type=click.Path(exists=True, dir_okay=False))
@click.argument("path_b", metavar="B", type=click.Path(exists=True, dir_okay=False))
@_key_options
@click.option(
    "--json", "json_path", metavar="FILE", help="Write the diff as JSON (- for stdout)."
)
@click.option(
    "--max-flips",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Flips listed on the terminal (--json lists all).",
)
@click.pass_context
def diff(
    ctx: click.Context,
    path_a: str,
    path_b: str,
    by: str,
    prompt_field: str | None,
    id_field: str | None,
    json_path: str | None,
    max_flips: int,
) -> None:
    """Every verdict that changed between two gradings A and B of the same rollouts.

    Joined on id (else line position); `cached` is ignored. Exit code 0 when
    nothing flipped, 1 when something did.
    """
    from producer.reports.diff import diff_files, render_diff

    spec = FieldSpec(prompt=prompt_field, id=id_field)
    result = diff_files(path_a, path_b, spec, _split(by))
    if json_path:
        _write_json(result.to_dict(), json_path)
    if json_path != "-":
        click.echo(render_diff(result, max_flips=max_flips), nl=False)
    ctx.exit(1 if result.flips else 0)


@click.command()
@click.argument(
    "labeled", metavar="LABELED", type=click.Path(exists=True, dir_okay=False)
)
@_key_options
@click.option(
    "--label-field",
    metavar="PATH",
    help="Dotted path of the trusted label [default: label, human_label, "
    "is_correct, reference_correct].",
)
@click.option(
    "--json",
    "json_path",
    metavar="FILE",
    help="Write the audit as JSON (- for stdout); `report --audit` reads it.",
)
@click.option(
    "--max-rows",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Disagreements listed on the terminal (--json lists all).",
)
def audit(
    labeled: str,
    by: str,
    prompt_field: str | None,
    id_field: str | None,
    label_field: str | None,
    json_path: str | None,
    max_rows: int,
) -> None:
    """The verifier as a classifier on graded rollouts with trusted labels: confusion
    matrix, alpha and phi (Wilson 95%), disagreements, corrected accuracy."""
    from producer.reports.audit import LABEL_FIELDS, audit_file, render_audit

    spec = FieldSpec(prompt=prompt_field, id=id_field)
    fields = (label_field,) if label_field else LABEL_FIELDS
    result = audit_file(labeled, spec, _split(by), fields)
    if json_path:
        _write_json(result, json_path)
    if json_path != "-":
        click.echo(render_audit(_finite(result), max_rows=max_rows), nl=False)
