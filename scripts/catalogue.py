#!/usr/bin/env python
"""Regenerate docs/catalogue.md: run the catalogue suite and write the document from its rows.

Usage: python scripts/catalogue.py [--port-only | --render-only] [--types llama,gpt2] [extra pytest args]

Runs every test of tests/test_catalogue.py::test_catalogue_type (the full catalogue: one model_type of
the installed transformers per test; it starts a vLLM engine for each type that ports). Extra pytest
args such as `-k "llama or qwen3"` (or `--types llama,qwen3`, exact names) rerun a subset; the other
rows keep what the document recorded.
--port-only classifies, builds and ports without verifying (minutes instead of hours); a type measured
at parity before keeps that figure and its date. --render-only rewrites the document from the rows it
carries (after a change to the renderer). Exits with pytest's status.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The renderer lives with the tests that read the document back; tests/ is not a package.
sys.path.insert(0, str(REPO / "tests"))

from catalogue import CATALOGUE, catalogue, merge, recorded_rows, render


def main(args: list[str]) -> int:
    if "--render-only" in args:
        CATALOGUE.write_text(render(merge(recorded_rows(), {}, list(catalogue()))), encoding="utf-8")
        return 0
    port_only = "--port-only" in args
    pytest_args = [a for a in args if a != "--port-only"]
    tests = ["tests/test_catalogue.py::test_catalogue_type"]
    if "--types" in pytest_args:  # exact model types (-k would match gemma3_text for gemma)
        at = pytest_args.index("--types")
        tests = [f"{tests[0]}[{name}]" for name in pytest_args[at + 1].split(",")]
        del pytest_args[at:at + 2]
    with tempfile.TemporaryDirectory(prefix="catalogue-") as tmp:
        results_file = Path(tmp) / "rows.json"
        env = dict(os.environ, SCAFFOLD_CATALOGUE_RESULTS=str(results_file),
                   SCAFFOLD_CATALOGUE_VERIFY="0" if port_only else "1")
        # One worker: at most one vLLM engine at a time, and the rows are written by one process.
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "",
                               *tests, *pytest_args],
                              cwd=REPO, env=env, check=False)
        if not results_file.exists():
            print(f"{CATALOGUE.relative_to(REPO)} not rewritten (no model type ran)", file=sys.stderr)
            return proc.returncode
        run = json.loads(results_file.read_text(encoding="utf-8"))
    lock_path = Path(tempfile.gettempdir()) / "scaffold-catalogue.lock"
    with open(lock_path, "w") as lock:  # two runs ending together must not drop each other's rows
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = merge(recorded_rows(), run["rows"], run["order"])
        CATALOGUE.write_text(render(rows), encoding="utf-8")
    print(f"wrote {CATALOGUE.relative_to(REPO)} ({len(run['rows'])} rows from this run, {len(rows)} in all)")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
