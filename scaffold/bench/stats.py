"""Statistics over interleaved rounds: summaries, paired ratios and a confidence interval for their median.

Ratios are only ever taken between two values measured side by side in the same round; pooling
several runs keeps that pairing and never divides numbers from two runs.
"""

from __future__ import annotations

import math
import statistics

PAIRS = (("port", "native"), ("port", "backend"), ("native", "backend"))


def summarize(values: list[float]) -> dict:
    if not values:
        return {}
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / median if median else 0.0, "n": len(values)}


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free confidence interval for the median of `values`: the order statistics
    x(k) and x(n+1-k) for the largest k whose coverage, 1 - 2 P(Binomial(n, 1/2) < k), is at
    least `level`. Returns (low, high, coverage); with fewer than six values no k reaches 95%,
    so it is the full range with the coverage that range has (e.g. 75% for three rounds)."""
    ordered = sorted(values)
    n = len(ordered)

    def coverage(k: int) -> float:  # P(x(k) <= median <= x(n+1-k))
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return ordered[k - 1], ordered[n - k], coverage(k)


def paired(results: dict, a: str, b: str, metric: str) -> list[float]:
    """The per-round ratios a/b of one metric, each of two values measured side by side in the
    same round; none where either implementation was not measured."""
    va = results.get(a, {}).get("rounds", {}).get(metric, [])
    vb = results.get(b, {}).get("rounds", {}).get(metric, [])
    return [x / y for x, y in zip(va, vb) if y > 0]


def ratios(results: dict, a: str, b: str, metrics: list[str]) -> dict:
    """Per metric: the median over rounds of a/b (`paired`), with the range and a confidence
    interval for that median (`median_interval`)."""
    out = {}
    for metric in metrics:
        values = paired(results, a, b, metric)
        if values:
            low, high, level = median_interval(values)
            out[metric] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                           "ci_low": low, "ci_high": high, "ci_level": level}
    return out


def verdict(pair: str, ratio: dict, higher_better: bool) -> str | None:
    """Which of the pair A/B is faster where the paired rounds tell them apart (the ratio's
    interval excludes 1), else None."""
    a, b = pair.split("/")
    if ratio["ci_low"] > 1:
        return f"{a if higher_better else b} faster"
    if ratio["ci_high"] < 1:
        return f"{b if higher_better else a} faster"
    return None


def workload(report: dict, metric: str) -> str:
    """The metric with its workload, so that only runs of the same workload share a pool:
    "decode-heavy tok/s" becomes "decode-heavy 16x16:64" (prompts x prompt tokens:generated)."""
    for mix in report["settings"]["mixes"]:
        if metric == f"{mix['name']} tok/s":
            return f"{mix['name']} {mix['num_prompts']}x{mix['prompt_len']}:{mix['output_len']}"
    return metric


def pool(reports: list[dict], metrics: list[str] | None = None) -> dict[tuple[str, str], dict[str, list[float]]]:
    """The paired ratios of several runs (bench.json reports) put together:
    {(model_type, workload): {"port/native": [ratios...], ...}}, plus one ("all", ...) pool over
    every run. By default only the throughput metrics are pooled."""
    pools: dict[tuple[str, str], dict[str, list[float]]] = {}
    for report in reports:
        for metric in report["metrics"]:
            wanted = metric in metrics if metrics else metric.endswith("tok/s")
            if not wanted:
                continue
            for a, b in PAIRS:
                values = paired(report["implementations"], a, b, metric)
                label = workload(report, metric)
                for key in ((report["model_type"], label), ("all", "throughput" if not metrics else "selected")):
                    pools.setdefault(key, {}).setdefault(f"{a}/{b}", []).extend(values)
    return pools
