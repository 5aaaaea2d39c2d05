"""A bench run's report: the table (stdout and bench.txt) and the plot (bench.png)."""

from __future__ import annotations

from pathlib import Path

from scaffold.bench.settings import IMPLS, higher_is_better
from scaffold.bench.stats import verdict


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"


def render_table(report: dict) -> str:
    metrics = report["metrics"]
    impls = [i for i in IMPLS if report["implementations"].get(i, {}).get("available")]
    head = f"{'metric':<24}" + "".join(f"{i + ' (median, spread)':>28}" for i in impls)
    pairs = [(a, b) for a, b in (("port", "native"), ("port", "backend")) if a in impls and b in impls]
    head += "".join(f"{a + '/' + b + ' [interval]':>26}" for a, b in pairs)
    lines = [head, "-" * len(head)]
    for metric in metrics:
        row = f"{metric:<24}"
        for impl in impls:
            s = report["implementations"][impl]["summary"].get(metric)
            row += f"{_fmt(s['median']):>16} ±{100 * s['spread'] / 2:>5.1f}%    " if s else f"{'-':>28}"
        for a, b in pairs:
            r = report["ratios"][f"{a}/{b}"].get(metric)
            shown = f"{r['median']:.3f} [{r['ci_low']:.3f}-{r['ci_high']:.3f}]" if r else "-"
            row += f"{shown:>26}"
        lines.append(row)
    lines.append("spread: half the range over rounds, as a share of the median; ratios: median of the "
                 "paired per-round ratios (throughput: > 1 means the port is faster; latency: < 1 means it is).")
    levels = {r["ci_level"] for pair in report["ratios"].values() for r in pair.values()}
    if levels:
        lines.append(f"[interval]: a {100 * min(levels):.0f}% confidence interval for that median (order "
                     "statistics of the paired rounds); where it holds 1, the rounds do not tell the two apart.")
    told = [f"{pair} {metric}: {found}" for pair, by_metric in report["ratios"].items()
            for metric, r in by_metric.items() if (found := verdict(pair, r, higher_is_better(metric)))]
    lines.append("told apart at that level: " + ("; ".join(told) if told else "none"))
    runners = {report["implementations"][i].get("model_runner") for i in impls}
    if len(runners) > 1:
        lines.append(f"WARNING: the engines ran different vLLM model runners ({', '.join(map(str, runners))}); "
                     "pass --model-runner v1 or v2 to compare the models alone.")
    for impl in IMPLS:
        info = report["implementations"].get(impl, {})
        if info.get("available"):
            lines.append(f"{impl}: {info['model_class']} (model runner {info.get('model_runner')}, "
                         f"engine ready in {info['load_s']:.1f} s)")
        else:
            lines.append(f"{impl}: not measured: {info.get('reason', 'left out by --only')}")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    # matplotlib is optional (only --plot needs it) and slow to import.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display here

    impls = [i for i in IMPLS if report["implementations"].get(i, {}).get("available")]
    metrics = report["metrics"]
    groups = [("throughput (tokens/s, higher is better)", [m for m in metrics if higher_is_better(m)]),
              ("time to first token (ms)", [m for m in metrics if m.startswith("TTFT")]),
              ("inter-token latency (ms)", [m for m in metrics if m.startswith("ITL")])]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    colors = {"port": "tab:blue", "native": "tab:orange", "backend": "tab:green"}
    width = 0.8 / max(1, len(impls))
    for ax, (title, names) in zip(axes, groups):
        for k, impl in enumerate(impls):
            summary = report["implementations"][impl]["summary"]
            med = [summary.get(m, {}).get("median", 0.0) for m in names]
            low = [med[j] - summary.get(m, {}).get("min", med[j]) for j, m in enumerate(names)]
            high = [summary.get(m, {}).get("max", med[j]) - med[j] for j, m in enumerate(names)]
            xs = [j + (k - (len(impls) - 1) / 2) * width for j in range(len(names))]
            ax.bar(xs, med, width, yerr=[low, high], capsize=3, label=impl, color=colors[impl])
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([m.rsplit(" ", 1)[0] for m in names], fontsize=8)
        ax.set_title(title, fontsize=10)
    axes[0].legend()
    s = report["settings"]
    fig.suptitle(f"{report['architecture']} on {report['device']} (vLLM {report['vllm_version']}, {s['dtype']}, "
                 f"{s['repeats']} interleaved rounds; bars: median, whiskers: min-max)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


