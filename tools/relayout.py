"""The issue-38 layout: the table of module moves, applied with `git mv` and a rewrite
of every reference to a moved module (imports, dotted names in strings, file paths).

Run from the repository root:
  python3 tools/relayout.py move GROUP...   git mv the group's modules, then rewrite
  python3 tools/relayout.py rewrite         rewrite references only (after a merge
                                            brought back old names: idempotent)
Groups: wire sandbox cache embedded lines fleet client files reports serve adapters
commands (or `all`). workers/verifier/ is never rewritten (its imports do not move).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# group -> (old path, new path); every new folder gets its own __init__.py docstring.
MOVES: dict[str, list[tuple[str, str]]] = {
    "wire": [
        ("workers/urls.py", "workers/wire/urls.py"),
        ("workers/signing.py", "workers/wire/signing.py"),
        ("workers/connections.py", "workers/wire/connections.py"),
        ("workers/protocol.py", "workers/wire/protocol.py"),
        ("workers/contract.py", "workers/wire/contract.py"),
        ("workers/lanes.py", "workers/wire/lanes.py"),
        ("workers/refusals.py", "workers/wire/refusals.py"),
    ],
    "sandbox": [
        ("workers/childproc.py", "workers/sandbox/childproc.py"),
        ("workers/progress.py", "workers/sandbox/progress.py"),
        ("workers/sandbox.py", "workers/sandbox/process.py"),
        ("workers/sandbox_child.py", "workers/sandbox/child.py"),
        ("workers/verdicts.py", "workers/sandbox/verdicts.py"),
    ],
    "cache": [
        ("workers/cache.py", "workers/cache/results.py"),
        ("workers/exact_cache.py", "workers/cache/exact.py"),
        ("workers/redis_cache.py", "workers/cache/redis_store.py"),
    ],
    "embedded": [
        ("workers/batch.py", "workers/embedded/batch.py"),
        ("workers/local.py", "workers/embedded/pool.py"),
        ("workers/inline.py", "workers/embedded/inline.py"),
    ],
    "lines": [
        ("producer/fields.py", "workers/lines/fields.py"),
        ("producer/batching.py", "workers/lines/records.py"),
        ("producer/lines.py", "workers/lines/units.py"),
    ],
    "fleet": [
        (f"workers/{name}.py", f"workers/fleet/{name}.py")
        for name in (
            "app",
            "tasks",
            "runtime",
            "bookkeeping",
            "claim",
            "broker",
            "kombu_fixes",
            "timers",
            "metrics",
            "settings",
            "line_batch",
        )
    ],
    "client": [
        ("producer/client.py", "producer/client/fleet.py"),
        *(
            (f"producer/{name}.py", f"producer/client/{name}.py")
            for name in (
                "job",
                "board",
                "rollouts",
                "aio",
                "grader",
                "http_client",
                "backends",
                "coalesce",
                "grading",
                "status",
            )
        ),
    ],
    "files": [
        ("producer/formats.py", "producer/files/formats.py"),
        ("producer/overlap.py", "producer/files/overlap.py"),
    ],
    "reports": [
        (f"producer/{name}.py", f"producer/reports/{name}.py")
        for name in ("report", "report_text", "report_html", "stats", "diff", "audit")
    ],
    "serve": [
        (f"producer/{name}.py", f"producer/serve/{name}.py")
        for name in ("service", "grade_route", "schemas", "http_metrics")
    ],
    "adapters": [("producer/compat.py", "producer/adapters/compat.py")],
    "commands": [
        ("producer/cli_options.py", "producer/commands/options.py"),
        ("producer/report_cli.py", "producer/commands/report.py"),
        ("producer/serve_cli.py", "producer/commands/serve.py"),
        ("producer/sweep.py", "producer/commands/sweep.py"),
        ("producer/signals.py", "producer/commands/signals.py"),
        ("producer/watchdog.py", "producer/commands/watchdog.py"),
    ],
}

TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".cfg", ".ini", ".txt"}
TEXT_NAMES = {"Makefile", "Dockerfile"}
# Files that name the new packages themselves (`workers.cache` the folder, not the old
# module), which a rewrite must not touch: the layer table and the folder docstrings.
SKIP_PREFIXES = (
    "workers/verifier/",
    "tools/relayout.py",
    "tests/unit/test_import_graph.py",
    "docs/architecture.md",
)


NEW_INITS = {
    str(Path(new).parent / "__init__.py")
    for pairs in MOVES.values()
    for _, new in pairs
    if not new.startswith("producer/adapters/")
}


def _dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _pairs(groups: list[str]) -> list[tuple[str, str]]:
    return [pair for group in groups for pair in MOVES[group]]


def _pattern(pairs: list[tuple[str, str]]) -> tuple[re.Pattern[str], dict[str, str]]:
    """One regex for every old name (dotted and as a path), longest first, so each
    occurrence is replaced once; an old name that is now a package (workers.cache)
    is left alone where one of its new modules follows it (idempotent)."""
    table: dict[str, str] = {}
    alternatives = []
    new_children: dict[str, set[str]] = {}
    for _, new in _pairs(list(MOVES)):
        folder, _, leaf = _dotted(new).rpartition(".")
        new_children.setdefault(folder, set()).add(leaf)
    for old, new in sorted(pairs, key=lambda p: -len(p[0])):
        for before, after, sep in (
            (_dotted(old), _dotted(new), "."),
            (old, new, "/"),
        ):
            table[before] = after
            children = new_children.get(_dotted(old), set())
            guard = ""
            if sep == "." and children:
                guard = r"(?!\.(?:" + "|".join(sorted(children)) + r")\b)"
            tail = r"(?![\w])" if sep == "." else r"(?![\w/])"
            alternatives.append(
                r"(?<![\w./])" + re.escape(before) + tail + guard,
            )
    return re.compile("|".join(alternatives)), table


def rewrite(pairs: list[tuple[str, str]]) -> list[str]:
    pattern, table = _pattern(pairs)
    files = subprocess.run(
        ["git", "ls-files"], check=True, capture_output=True, text=True
    ).stdout.split()
    changed = []
    for name in files:
        path = Path(name)
        if name.startswith(SKIP_PREFIXES) or name in NEW_INITS or not path.is_file():
            continue
        if path.suffix not in TEXT_SUFFIXES and path.name not in TEXT_NAMES:
            continue
        text = path.read_text()
        new_text = pattern.sub(lambda m: table[m.group(0)], text)
        if new_text != text:
            path.write_text(new_text)
            changed.append(name)
    return changed


def move(groups: list[str]) -> None:
    for old, new in _pairs(groups):
        Path(new).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", old, new], check=True)


def main(argv: list[str]) -> None:
    command, *groups = argv
    if groups == ["all"] or command == "rewrite":
        groups = list(MOVES)
    if command == "move":
        move(groups)
    for name in rewrite(_pairs(groups)):
        print("rewrote", name)


if __name__ == "__main__":
    main(sys.argv[1:])
