#!/usr/bin/env python
"""Regenerate docs/coverage.md: run the architecture suite and write the document from its results.

Usage: python scripts/coverage.py [extra pytest args]

Every architecture in tests/test_architectures.py is built, ported, and verified in the real
vLLM engine; the suite hands its rows to this script (through the file named by
SCAFFOLD_COVERAGE_RESULTS) and this script writes docs/coverage.md. Extra pytest args such as
`-k gemma` rerun a subset; the other rows keep the result the document recorded. No test writes
the document; tests/test_architectures.py::test_coverage_doc_is_current says when it is stale.
Exits with pytest's status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The document's renderer lives with the tests that read it back; tests/ is not a package.
sys.path.insert(0, str(REPO / "tests"))

from coverage_doc import COVERAGE, recorded_results, render


def main(pytest_args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="coverage-") as tmp:
        results_file = Path(tmp) / "results.json"
        env = dict(os.environ, SCAFFOLD_COVERAGE_RESULTS=str(results_file))
        # The checks that the document is current would only report the staleness this run repairs.
        currency = [f"--deselect=tests/test_architectures.py::{name}"
                    for name in ("test_coverage_doc_is_current", "test_coverage_doc_is_what_the_script_renders")]
        # Every row, the `extended` ones too (the full suite runs a sample of them).
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not catalogue",
                               *currency,
                               "tests/test_architectures.py", "tests/test_architectures_second_half.py",
                               *pytest_args],
                              cwd=REPO, env=env, check=False)
        # One file per worker process (tests/test_architectures.py's coverage_results).
        runs = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(tmp).glob(results_file.name + ".*"))]
        if not runs:
            print(f"{COVERAGE.relative_to(REPO)} not rewritten (no architecture ran)", file=sys.stderr)
            return proc.returncode
        run = {**runs[0], "results": {k: v for r in runs for k, v in r["results"].items()}}
    order = run["order"]
    merged = {**recorded_results(), **run["results"]}  # rows this run did not reach keep their record
    merged = {name: row for name, row in merged.items() if name in order}  # entries removed from the tables go
    COVERAGE.write_text(render(merged, order, run["tolerance"]), encoding="utf-8")
    print(f"wrote {COVERAGE.relative_to(REPO)} ({len(run['results'])} rows from this run)")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
