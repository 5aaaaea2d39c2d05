#!/usr/bin/env python
"""Regenerate the golden ports under tests/golden/ (tests/test_golden.py diffs against them).

Usage: python scripts/update_golden.py [NAME ...]

Builds each golden checkpoint (helpers.GOLDEN_PORTS: shipped examples and tiny transformers
families), runs `scaffold new` on it, and replaces tests/golden/<name>/ with what it wrote, the
checkpoint's absolute path replaced by a placeholder. Review the resulting `git diff` as you
would review the generator change that caused it. With no NAME, every golden port is rewritten
and folders of ports no longer declared are removed.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The golden table lives with the tests that use it; tests/ is not a package.
sys.path.insert(0, str(REPO / "tests"))

from helpers import GOLDEN, GOLDEN_PORTS, generate_golden, golden_checkpoint, golden_workdir, write_golden


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in GOLDEN_PORTS]
    if unknown:
        print(f"error: unknown golden port(s) {', '.join(unknown)}; known: {', '.join(GOLDEN_PORTS)}",
              file=sys.stderr)
        return 2
    with golden_workdir() as work:
        for name in names or list(GOLDEN_PORTS):
            port = GOLDEN_PORTS[name]
            files = generate_golden(port, golden_checkpoint(port, work), work / f"port-{name}")
            write_golden(name, files)
            print(f"wrote tests/golden/{name}/ ({len(files)} files)")
    if not names:
        for stale in sorted(p for p in GOLDEN.iterdir() if p.is_dir() and p.name not in GOLDEN_PORTS):
            shutil.rmtree(stale)
            print(f"removed tests/golden/{stale.name}/ (no longer a golden port)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
