"""`scaffold bench --quick` on a tiny checkpoint: all three implementations run and report numbers.

No timing thresholds: the machines that run tests are shared and noisy. Speed is judged from
the ratios a full `scaffold bench` run prints (docs/performance.md).
"""

from __future__ import annotations

import json

from conftest import scaffold


def test_bench_quick_measures_port_native_and_backend(tiny, workdir):
    ckpt = tiny("qwen3", "MyQwen3ForCausalLM")
    port = workdir / "bench-port"
    scaffold("new", ckpt, "-o", port, "--force")
    out = workdir / "bench-out"
    proc = scaffold("bench", port, "--quick", "-o", out)
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
    assert (out / "bench.png").stat().st_size > 10_000
    assert (out / "bench.txt").read_text().startswith("metric")
