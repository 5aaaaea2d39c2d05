"""`scaffold bench PORT`: the port against vLLM's own implementation and the transformers backend.

Three engines serve the same checkpoint with the same dtype and settings, each in a process of
its own, all alive at once; the parent sends them the same measurements, round by round, and
reports the median and spread of each metric and the paired per-round ratios with a confidence
interval for their median. Metrics: offline throughput (prompt + generated tokens per second)
for a prefill-heavy and a decode-heavy mix, and latency at low concurrency (time to first token
and inter-token latency, 1 and 4 requests at once) measured step by step in vLLM's own engine
loop. docs/performance.md has the figures and how to reproduce them.

  settings  what a run measures (Mix, Settings, the metric names)
  engine    the engine RPC: `Engine` (parent side) and `worker` (`python -m scaffold.bench --worker FILE`)
  stats     summaries, paired ratios, the median's confidence interval, pooling several runs
  report    the table and the plot
  run       the checkpoint views, the staged port, the rounds (`run_bench`)
  command   the click command `bench`
"""

from __future__ import annotations

from scaffold.bench.command import bench, parse_mix
from scaffold.bench.engine import Engine, EngineError, model_class_name, random_prompts, worker
from scaffold.bench.report import plot, render_table
from scaffold.bench.run import ALIAS_PLUGIN, checkpoint_view, has_gpu, hf_class_for, run_bench, write_alias_plugin
from scaffold.bench.settings import IMPLS, Mix, Settings, higher_is_better, metric_names
from scaffold.bench.stats import PAIRS, median_interval, paired, pool, ratios, summarize, verdict, workload

__all__ = [
    "ALIAS_PLUGIN",
    "IMPLS",
    "PAIRS",
    "Engine",
    "EngineError",
    "Mix",
    "Settings",
    "bench",
    "checkpoint_view",
    "has_gpu",
    "hf_class_for",
    "higher_is_better",
    "median_interval",
    "metric_names",
    "model_class_name",
    "paired",
    "parse_mix",
    "plot",
    "pool",
    "random_prompts",
    "ratios",
    "render_table",
    "run_bench",
    "summarize",
    "verdict",
    "worker",
    "workload",
    "write_alias_plugin",
]
