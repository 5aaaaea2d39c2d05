"""Pool the paired rounds of several `scaffold bench` runs: one median and interval per pair.

Every `bench.json` holds, for each metric, one value per round for each engine, measured side by
side. A run's paired ratios (port/native, port/backend, native/backend) are taken round by round
as `scaffold bench` takes them; this script puts the ratios of several runs together, per model
and mix and over all of them (`scaffold.bench.pool`), and prints the median of each pool with
the same order-statistic confidence interval the bench prints. Pooling keeps the pairing: no
ratio ever divides numbers from two runs.

    .venv/bin/python benchmarks/pool_ratios.py studies/perf/cpu-*-100m-12rounds.json /tmp/cpu16/*/bench.json
    .venv/bin/python benchmarks/pool_ratios.py --metric "decode-heavy tok/s" RUN.json ...

By default only the throughput metrics are pooled. It needs the scaffold package importable (the
.venv of scripts/install.sh has it installed; elsewhere `PYTHONPATH=.` from the repository root).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from scaffold.bench import PAIRS, median_interval, pool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench.json files")
    parser.add_argument("--metric", action="append", help="a metric to pool (default: every tok/s metric)")
    args = parser.parse_args()
    pools = pool([json.loads(path.read_text()) for path in args.runs], args.metric)
    print(f"{'model':<10} {'workload':<26}" + "".join(f"{a + '/' + b:>34}" for a, b in PAIRS))
    for (model, metric), by_pair in sorted(pools.items(), key=lambda item: item[0][0] == "all"):
        cells = []
        for a, b in PAIRS:
            ratios = by_pair.get(f"{a}/{b}", [])
            if not ratios:
                cells.append(f"{'-':>34}")
                continue
            low, high, coverage = median_interval(ratios)
            below = sum(r < 1 for r in ratios)
            cells.append(f"{statistics.median(ratios):>9.3f} [{low:.3f}-{high:.3f}] {100 * coverage:2.0f}% "
                         f"{below:>3}/{len(ratios):<3}<1")
        print(f"{model:<10} {metric:<26}" + "".join(f"{c:>34}" for c in cells))
    print("each cell: median of the pooled paired ratios [its confidence interval] coverage, and how many of the "
          "ratios are under 1 out of all")


if __name__ == "__main__":
    main()
