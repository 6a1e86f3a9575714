"""`report --html` opened in a real headless Chromium (Debian's `chromium`): the page
renders its table and three charts (DOM after rendering), and the screenshot is not
blank (pixels of the charts' colours)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from producer.cli import cli

pytestmark = pytest.mark.integration

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed (apt-get install chromium)")
    return path


def _browse(
    page: Path, profile: Path, *args: str
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            _chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )


def _graded(path: Path) -> Path:
    rows: list[dict[str, Any]] = []
    for level in ("Level 1", "Level 2"):
        for prompt in range(5):
            for sample in range(4):
                correct = (prompt + sample) % 3 != 0
                rows.append(
                    {
                        "uid": f"{level}-{prompt}",
                        "sample_idx": sample,
                        "level": level,
                        "response": f"\\boxed{{{sample}}}",
                        "gold": "1",
                        "correct": correct,
                        "status": "correct" if correct else "wrong",
                        "format_valid": True,
                        "canonical_pred": str(sample % 2),
                        "grader_version": "gradefleet-test",
                    }
                )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def page(tmp_path: Path) -> Path:
    out = tmp_path / "report.html"
    result = CliRunner().invoke(
        cli,
        [
            "report",
            str(_graded(tmp_path / "g.jsonl")),
            "--by",
            "level",
            "--html",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    return out


def test_report_html_is_self_contained(page: Path) -> None:
    # Nothing is fetched: no scripts, stylesheets, images or fonts by URL (the
    # xmlns="http://..." of inline SVG are names, not requests).
    text = page.read_text()
    for fetching in (
        "<script",
        "<link",
        "<img",
        "src=",
        'href="http',
        "@import",
    ):
        assert fetching not in text, fetching
    assert re.search(r"url\((?!#)", text) is None  # url(#clip) is in the page


def test_report_html_renders_in_headless_chromium(page: Path, tmp_path: Path) -> None:
    # When Chromium loads the page and prints the DOM it rendered
    dom = _browse(page, tmp_path / "profile-dom", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout.decode()
    # Then the table and the three charts are there, as inline SVG
    assert 'id="report-table"' in html
    for chart in ("accuracy-chart", "status-chart", "k-chart"):
        start = html.index(f'id="{chart}"')
        assert "<svg" in html[start : start + 500], chart
    assert "gradefleet-test" in html
    assert "level=Level 2" in html


def test_report_html_screenshot_is_not_blank(page: Path, tmp_path: Path) -> None:
    from PIL import Image

    shot = tmp_path / "shot.png"
    run = _browse(
        page,
        tmp_path / "profile-shot",
        f"--screenshot={shot}",
        "--window-size=1200,2200",
        "--hide-scrollbars",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 2200)
    colours = image.getcolors(maxcolors=1_000_000)
    assert colours is not None
    counts = {rgb: n for n, rgb in colours}
    total = image.size[0] * image.size[1]
    white = counts.get((255, 255, 255), 0)
    assert white < 0.95 * total, "the page rendered (nearly) blank"
    # matplotlib's first bar colour (#4c72b0, the accuracy bars) is painted
    bar_blue = sum(n for rgb, n in counts.items() if _near(rgb, (0x4C, 0x72, 0xB0)))
    assert bar_blue > 2000
    # and the status chart's default cycle blue (#1f77b4) too
    cycle_blue = sum(n for rgb, n in counts.items() if _near(rgb, (0x1F, 0x77, 0xB4)))
    assert cycle_blue > 2000


def _near(rgb: tuple[int, int, int], target: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 8 for a, b in zip(rgb, target, strict=True))


def test_report_html_shows_math_and_code_side_by_side(tmp_path: Path) -> None:
    from tests.code_reports import grade, labeled_rows, write_jsonl

    # Given a mixed math/code file graded by the real CLI (the code sandbox: bwrap)
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is not installed"
    graded = tmp_path / "mixed-graded.jsonl"
    records = grade(write_jsonl(tmp_path / "mixed.jsonl", labeled_rows()), graded)
    out = tmp_path / "mixed.html"
    result = CliRunner().invoke(cli, ["report", str(graded), "--html", str(out)])
    assert result.exit_code == 0, result.output
    # When Chromium renders it
    dom = _browse(out, tmp_path / "profile-kinds", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout.decode()
    # Then one table has a column per kind, math next to code, with each kind's
    # grader version and code's mean tests passed
    start = html.index('id="kinds-table"')
    table = html[start : html.index("</table>", start)]
    assert re.search(r"<th>metric</th>\s*<th>code</th>\s*<th>math</th>", table)
    versions = sorted({r["grader_version"] for r in records})
    assert all(v in table for v in versions)
    assert "tests passed % (mean)" in table
    # And a row per (kind, data source)
    start = html.index('id="sources-table"')
    sources = html[start : html.index("</table>", start)]
    for source in ("MATH", "mbpp", "nemo_gym", "humaneval-style"):
        assert f"<td>{source}</td>" in sources, source
