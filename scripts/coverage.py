#!/usr/bin/env python
"""Regenerate docs/coverage.md: run the architecture suite, which writes it from its results.

Usage: python scripts/coverage.py [extra pytest args]

Every architecture in tests/test_architectures.py is built, ported, and verified in the
real vLLM engine; the module's fixture writes docs/coverage.md from the results (extra
pytest args such as `-k gemma` rerun a subset; the other rows keep their recorded result).
Exits with pytest's status.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    doc = REPO / "docs" / "coverage.md"
    before = doc.stat().st_mtime if doc.exists() else None
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(REPO / "tests" / "test_architectures.py"), *sys.argv[1:]], cwd=REPO, check=False)
    after = doc.stat().st_mtime if doc.exists() else None
    if after is not None and after != before:
        print(f"wrote {doc.relative_to(REPO)}")
    else:
        print(f"{doc.relative_to(REPO)} not rewritten (no architecture ran)", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
