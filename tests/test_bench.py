"""`scaffold bench --quick` on a tiny checkpoint: all three implementations run and report numbers.

No timing thresholds: the machines that run tests are shared and noisy. Speed is judged from
the ratios a full `scaffold bench` run prints (docs/performance.md).
"""

from __future__ import annotations

import json
import os

import pytest
from helpers import scaffold


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.extended  # ~55 s: four engines; what it measures is checked by the unit tests below
def test_bench_quick_measures_port_native_and_backend(tiny, workdir):
    ckpt = tiny("qwen3", "MyQwen3ForCausalLM")
    port = workdir / "bench-port"
    scaffold("new", ckpt, "-o", port, "--force")
    out = workdir / "bench-out"
    # 9 prompts of 480 tokens exceed the CPU engine's 4096-token step budget, so one prefill is
    # chunked: with per-request sampling seeds that killed vLLM's CPU engine (Generator.set_offset).
    temp = workdir / "bench-temp"  # the command's temp directory: what it leaves there is left on the user's disk
    temp.mkdir(exist_ok=True)
    proc = scaffold("bench", port, "--quick", "--prompts", "9", "--prefill", "480:4", "-o", out,
                    env=dict(os.environ, TMPDIR=str(temp)))
    assert not list(temp.glob("scaffold-*")), sorted(p.name for p in temp.iterdir())
    assert "port/native" in proc.stdout and "round 2/2" in proc.stderr  # the table and the progress display

    report = json.loads((out / "bench.json").read_text())
    impls = report["implementations"]
    assert impls["port"]["model_class"] == "my_qwen3_vllm.model.MyQwen3ForCausalLM"
    assert impls["native"]["model_class"] == "vllm.model_executor.models.qwen3.Qwen3ForCausalLM"
    assert impls["backend"]["model_class"].startswith("vllm.model_executor.models.transformers.")
    metrics = report["metrics"]
    assert len(metrics) == 6  # two throughput mixes; TTFT and ITL at concurrency 1 and 4
    for name in ("port", "native", "backend"):
        rounds = impls[name]["rounds"]
        for metric in metrics:
            values = rounds[metric]
            assert len(values) == report["settings"]["repeats"] == 2, (name, metric, values)
            assert all(v > 0 for v in values), (name, metric, values)
            assert impls[name]["summary"][metric]["median"] > 0
    for pair in ("port/native", "port/backend"):
        assert set(report["ratios"][pair]) == set(metrics)
        for r in report["ratios"][pair].values():  # two rounds: the interval is their range, 50% coverage
            assert r["ci_low"] == r["min"] <= r["median"] <= r["max"] == r["ci_high"] and r["ci_level"] == 0.5
    assert (out / "bench.png").stat().st_size > 10_000
    assert (out / "bench.txt").read_text().startswith("metric")


def test_median_interval_is_the_order_statistic_interval():
    """The interval's ranks and coverage against the binomial tables (e.g. n=10: x(2)..x(9), 97.9%)."""
    from scaffold.bench import median_interval, verdict

    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0, 0.75)  # too few rounds for 95%: the range
    low, high, level = median_interval([float(v) for v in range(10, 0, -1)])
    assert (low, high, round(level, 4)) == (2.0, 9.0, 0.9785)
    low, high, level = median_interval([float(v) for v in range(1, 21)])
    assert (low, high, round(level, 4)) == (6.0, 15.0, 0.9586)
    apart = {"ci_low": 1.02, "ci_high": 1.10}
    assert verdict("port/native", apart, higher_better=True) == "port faster"
    assert verdict("port/native", apart, higher_better=False) == "native faster"  # a latency ratio
    assert verdict("port/backend", {"ci_low": 0.96, "ci_high": 1.01}, higher_better=True) is None


def test_pooled_ratios_keep_the_pairing_and_the_workload():
    """scaffold.bench.pool (benchmarks/pool_ratios.py prints it): ratios are taken round by round
    within a run, runs of another workload get a pool of their own, and an engine a run did not
    measure adds nothing."""
    from scaffold.bench import pool

    def run(prompt_len, port, native, backend=None):
        impls = {"port": {"available": True, "rounds": {"decode-heavy tok/s": port}},
                 "native": {"available": True, "rounds": {"decode-heavy tok/s": native}},
                 "backend": {"available": False} if backend is None
                 else {"available": True, "rounds": {"decode-heavy tok/s": backend}}}
        mixes = [{"name": "decode-heavy", "num_prompts": 16, "prompt_len": prompt_len, "output_len": 64}]
        return {"model_type": "llama", "metrics": ["decode-heavy tok/s", "ITL c=1 ms"],
                "settings": {"mixes": mixes}, "implementations": impls}

    pools = pool([run(16, [2.0, 4.0], [1.0, 2.0], [4.0, 8.0]), run(16, [3.0], [6.0]), run(32, [5.0], [5.0])])
    assert pools[("llama", "decode-heavy 16x16:64")]["port/native"] == [2.0, 2.0, 0.5]  # never 4/1 or 2/2
    assert pools[("llama", "decode-heavy 16x16:64")]["port/backend"] == [0.5, 0.5]  # the second run has no backend
    assert pools[("llama", "decode-heavy 16x32:64")]["port/native"] == [1.0]
    assert pools[("all", "throughput")]["port/native"] == [2.0, 2.0, 0.5, 1.0]
    assert not any("ITL" in label for _, label in pools)  # only throughput unless asked
    selected = pool([run(16, [2.0], [1.0])], metrics=["decode-heavy tok/s"])
    assert selected[("all", "selected")]["port/native"] == [2.0]
