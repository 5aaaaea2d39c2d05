"""Pool the paired rounds of several `scaffold bench` runs: one median and interval per pair.

Every `bench.json` holds, for each metric, one value per round for each engine, measured side by
side. A run's paired ratios (port/native, port/backend, native/backend) are taken round by round
as `scaffold bench` takes them; this script puts the ratios of several runs together, per model
and mix and over all of them, and prints the median of each pool with the same order-statistic
confidence interval the bench prints. Pooling keeps the pairing: no ratio ever divides numbers
from two runs.

    python benchmarks/pool_ratios.py docs/perf/cpu-*-12rounds.json /tmp/cpu16/*/bench.json
    python benchmarks/pool_ratios.py --metric "decode-heavy tok/s" RUN.json ...

By default only the throughput metrics are pooled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scaffold.bench import median_interval, paired

PAIRS = (("port", "native"), ("port", "backend"), ("native", "backend"))


def workload(report: dict, metric: str) -> str:
    """The metric with its workload, so that only runs of the same workload share a pool:
    "decode-heavy tok/s" becomes "decode-heavy 16x16:64" (prompts x prompt tokens:generated)."""
    for mix in report["settings"]["mixes"]:
        if metric == f"{mix['name']} tok/s":
            return f"{mix['name']} {mix['num_prompts']}x{mix['prompt_len']}:{mix['output_len']}"
    return metric


def pool(paths: list[Path], metrics: list[str] | None) -> dict[tuple[str, str], dict[str, list[float]]]:
    """{(model_type, workload): {"port/native": [ratios...], ...}} over all runs, plus ("all", ...)."""
    pools: dict[tuple[str, str], dict[str, list[float]]] = {}
    for path in paths:
        report = json.loads(path.read_text())
        for metric in report["metrics"]:
            wanted = metric in metrics if metrics else metric.endswith("tok/s")
            if not wanted:
                continue
            for a, b in PAIRS:
                ratios = paired(report["implementations"], a, b, metric)
                label = workload(report, metric)
                for key in ((report["model_type"], label), ("all", "throughput" if not metrics else "selected")):
                    pools.setdefault(key, {}).setdefault(f"{a}/{b}", []).extend(ratios)
    return pools


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench.json files")
    parser.add_argument("--metric", action="append", help="a metric to pool (default: every tok/s metric)")
    args = parser.parse_args()
    pools = pool(args.runs, args.metric)
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
