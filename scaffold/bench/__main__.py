"""`python -m scaffold.bench --worker REQUEST.json` runs one engine (how `Engine` starts its worker);
any other arguments run the `scaffold bench` command."""

from __future__ import annotations

import sys

from scaffold.bench.command import bench
from scaffold.bench.engine import worker

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        bench()
