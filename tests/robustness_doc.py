"""docs/robustness.md: the rows the robustness tests record, and the committed table they are checked against.

Tests never write docs/robustness.md. Each catalogue row is checked against the
committed document instead (same exit code, same message; the measured memory and
time are left out of the comparison), so a change of behaviour shows up as a failing
test until the document is regenerated with

    PYTHONPATH=$PWD .venv/bin/python scripts/robustness_doc.py

That script runs the tests with ROWS_ENV naming a folder of its own: the tests then
append their rows there (one JSON line each) instead of comparing them, and the
script writes the document from those rows (scripts/robustness_doc.py).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "robustness.md"
ROWS_ENV = "SCAFFOLD_ROBUSTNESS_ROWS"
# The columns compared with the committed document: case, bad input, command, exit, message.
COMPARED = 5


def regenerating() -> bool:
    return bool(os.environ.get(ROWS_ENV))


def cell(text) -> str:
    """Text for one markdown table cell: on one line, pipes escaped, no '<' to open HTML (the cells quote
    hostile inputs; shown as &lt;, they read as typed)."""
    text = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
    return text.replace("\n", " ").replace("\r", " ")


def record(section: str, row: list) -> None:
    """Keep one row for the document: appended to ROWS_ENV/<section>.jsonl while regenerating."""
    folder = os.environ.get(ROWS_ENV)
    if folder:
        with open(Path(folder) / f"{section}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps([str(c) if not isinstance(c, (int, float)) else c for c in row]) + "\n")


def committed_rows(section: str) -> dict[str, list[str]]:
    """The rows of one section of the committed document, by their first cell, as the cells' text."""
    text = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    found = re.search(rf"<!-- section: {re.escape(section)} -->(.*?)<!-- end: {re.escape(section)} -->", text,
                      flags=re.DOTALL)
    rows: dict[str, list[str]] = {}
    for line in (found.group(1) if found else "").splitlines():
        if not line.startswith("| ") or line.startswith("| ---"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        rows.setdefault(cells[0], cells)
    return rows


def check_row(section: str, row: list) -> None:
    """Record `row` when regenerating; otherwise it must be the committed document's row, in its compared cells."""
    if regenerating():
        record(section, row)
        return
    committed = committed_rows(section)
    key = cell(row[0])
    assert key in committed, (f"docs/robustness.md has no row {key!r} in section {section!r}; regenerate it with "
                              "scripts/robustness_doc.py")
    got = [cell(c) for c in row[:COMPARED]]
    assert committed[key][:COMPARED] == got, (
        f"docs/robustness.md is stale for {key!r}; regenerate it with scripts/robustness_doc.py",
        committed[key][:COMPARED], got)


def defence(case: str, what: str, command: str, code: int, message: str, *paths: tuple[Path, str]) -> None:
    """A row of the "defences" section: a defence tested in a module of its own (consent, --force, injection,
    non-finite values, the backend's tensor check), its exit code and the message the user saw, with test
    folders shown as labels so the row is the same on every machine."""
    for path, label in sorted(paths, key=lambda p: -len(str(p[0]))):
        message = message.replace(str(path), label)
    check_row("defences", [case, what, f"`{command}`", code, " ".join(message.split())[:400]])
