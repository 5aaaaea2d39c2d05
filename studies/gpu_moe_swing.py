"""Why MoE throughput swings from round to round on the H200: one engine, the same measurement
repeated with fixed and with fresh prompts, interleaved, and the GPU's clocks beside each.

In the three-engine bench (studies/README.md, "H200: mixture of experts") vLLM's own
Qwen3-MoE class served the decode-heavy mix at 32,777 to 60,840 tok/s from one round to the
next, and greedy single-request decoding at 1.66 to 2.57 ms per token. Three explanations are
told apart here, with vLLM's `Qwen3MoeForCausalLM` alone on the GPU:

  data     the prompts (new every round in the bench) or the sampled tokens route tokens to
           experts differently, and the fused-MoE kernels cost what the routing makes them cost;
  sharing  the other engines on the same GPU and host;
  machine  the GPU's clocks or the host, whatever is served.

Each round runs, in this order: `fixed-greedy` (the same prompts every round, temperature 0:
the same tokens every time), `fixed-sampled` (the same prompts, temperature 1), `fresh-sampled`
(new prompts every round, temperature 1, as the bench does), and `c1-fixed` (one request,
greedy, the same prompt every round: seconds per generated token). Only `fresh-sampled` changes
its data between rounds, so if the data were the cause, the fixed kinds would hold still while
it swings. A thread samples the SM clock, power and utilization with nvidia-smi every 0.2 s.
Before each measurement a GPU probe (bf16 matmuls, CUDA events) and a pure-Python probe on
every host core in turn time the GPU's and the host cores' speed; the engine-core process's CPU
seconds are read from /proc around each measurement.

    PYTHONPATH=~/v024:$PWD python3 studies/gpu_moe_swing.py ~/ckpt-moe -o $OUT/swing.json

Writes the JSON after every round and prints a summary: per kind the median, the range, the
coefficient of variation and the correlation of tok/s with each of the readings above. The
answer it gave on the H200 is in studies/README.md ("Why the MoE rounds swing").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from scaffold.bench import checkpoint_view
from scaffold.bench import random_prompts as prompts  # the bench's own prompts: random token ids

KINDS = ("fixed-greedy", "fixed-sampled", "fresh-sampled", "c1-fixed")


def children() -> dict[int, tuple[int, float]]:
    """The processes started by this one (vLLM's engine core): the core each last ran on, and the
    CPU seconds it has used (all its threads, user and system)."""
    found, tick = {}, os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # fields[0] is field 3 of proc(5)
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            found[int(stat.parent.name)] = (int(fields[36]), (int(fields[11]) + int(fields[12])) / tick)
    return found


def core_speeds() -> list[float]:
    """The pure-Python probe on every host core in turn (this thread pinned to it), in ms."""
    cores = sorted(os.sched_getaffinity(0))
    speeds = []
    try:
        for core in cores:
            os.sched_setaffinity(0, {core})
            speeds.append(1000 * host_probe(repeats=1))
    finally:
        os.sched_setaffinity(0, set(cores))
    return speeds


class GpuSampler(threading.Thread):
    """Every `period` seconds: the GPU's SM clock (MHz), power (W) and utilization (%) from nvidia-smi."""

    def __init__(self, period: float = 0.2):
        super().__init__(daemon=True)
        self.period, self.rows, self.stop = period, [], threading.Event()

    def run(self) -> None:
        query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,utilization.gpu", "--format=csv,noheader,nounits"]
        while not self.stop.is_set():
            out = subprocess.run(query, capture_output=True, text=True, check=False).stdout.split("\n")[0]
            try:
                self.rows.append((time.perf_counter(), *[float(x) for x in out.split(",")]))
            except ValueError:
                pass
            self.stop.wait(self.period)

    def window(self, t0: float, t1: float) -> dict:
        rows = [r for r in self.rows if t0 <= r[0] <= t1]
        if not rows:
            return {}
        return {"sm_mhz": statistics.mean(r[1] for r in rows), "power_w": statistics.mean(r[2] for r in rows),
                "util_pct": statistics.mean(r[3] for r in rows), "samples": len(rows)}


def host_probe(repeats: int = 3) -> float:
    """Seconds for a fixed piece of pure-Python work (the best of `repeats`): the speed of one host core now."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - t0)
    return best


def gpu_probe() -> float:
    """Milliseconds for 20 bf16 matmuls of 4096 x 4096 on the GPU (CUDA events): the GPU's speed now."""
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        a @ a
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def host_cpu() -> tuple[int, int, int]:
    """Busy, steal and total jiffies of the host's CPUs (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, fields[7] if len(fields) > 7 else 0, sum(fields)


def correlation(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--architecture", default="Qwen3MoeForCausalLM")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.28)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    view = checkpoint_view(args.checkpoint, args.architecture, Path(tempfile.mkdtemp(prefix="swing-")))
    vocab = json.loads((args.checkpoint / "config.json").read_text())["vocab_size"]
    started = time.perf_counter()
    llm = LLM(model=str(view), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=2048, seed=0,
              gpu_memory_utilization=args.gpu_memory_utilization)
    load_s = time.perf_counter() - started
    sampler = GpuSampler()
    sampler.start()
    greedy = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True, detokenize=False)
    sampled = SamplingParams(temperature=1.0, max_tokens=args.output_len, ignore_eos=True, detokenize=False)
    c1 = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True, detokenize=False)
    fixed = prompts(1, args.prompts, args.prompt_len, vocab)
    report = {"checkpoint": str(args.checkpoint), "architecture": args.architecture, "load_s": load_s,
              "settings": vars(args) | {"checkpoint": str(args.checkpoint), "out": str(args.out)}, "rows": []}

    def measure(kind: str, r: int) -> dict:
        if kind == "c1-fixed":
            batch, params = fixed[:1], c1
        else:
            batch = fixed if kind.startswith("fixed") else prompts(1000 + r, args.prompts, args.prompt_len, vocab)
            params = greedy if kind == "fixed-greedy" else sampled
        probe_gpu, speeds = gpu_probe(), core_speeds()
        before = children()
        busy0, steal0, total0 = host_cpu()
        t0 = time.perf_counter()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params, use_tqdm=False)
        t1 = time.perf_counter()
        busy1, steal1, total1 = host_cpu()
        after = children()
        engine_cpu_s = sum(after[pid][1] - before[pid][1] for pid in after if pid in before)
        engine_core = max(after.items(), key=lambda item: item[1][1] - before.get(item[0], (0, 0.0))[1])[1][0]
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        row = {"round": r, "kind": kind, "elapsed_s": t1 - t0, "generated": generated,
               "tok_s": (generated + sum(len(p) for p in batch)) / (t1 - t0),
               "s_per_token": (t1 - t0) / generated if kind == "c1-fixed" else None,
               "host_busy_pct": 100 * (busy1 - busy0) / max(1, total1 - total0),
               "host_steal_pct": 100 * (steal1 - steal0) / max(1, total1 - total0),
               "gpu_probe_ms": probe_gpu,
               "engine_cpu_s": engine_cpu_s, "engine_cpu_share": engine_cpu_s / (t1 - t0),
               "core_probe_ms": speeds, "engine_core": engine_core,
               "engine_core_probe_ms": speeds[engine_core] if engine_core < len(speeds) else None,
               **sampler.window(t0, t1)}
        print(f"round {r} {kind:<14} {row['tok_s']:>10.0f} tok/s  {row['elapsed_s']:6.2f} s  "
              f"SM {row.get('sm_mhz', 0):6.0f} MHz  power {row.get('power_w', 0):5.0f} W  "
              f"util {row.get('util_pct', 0):3.0f}%  host busy {row['host_busy_pct']:4.1f}% "
              f"steal {row['host_steal_pct']:.1f}%  engine core: {row['engine_cpu_s']:.2f} CPU s "
              f"(x{row['engine_cpu_share']:.2f} of wall) on core {engine_core}  probes: GPU "
              f"{row['gpu_probe_ms']:.2f} ms, cores " + " ".join(f"{x:.0f}" for x in speeds) + " ms", flush=True)
        return row

    for kind in KINDS:  # warm-up: every kind once, not recorded
        measure(kind, -1)
    for r in range(args.rounds):
        for kind in KINDS:
            report["rows"].append(measure(kind, r))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    sampler.stop.set()

    print(f"\nvLLM's {args.architecture} alone, {args.rounds} rounds (load {load_s:.0f} s):")
    summary = {}
    for kind in KINDS:
        rows = [x for x in report["rows"] if x["kind"] == kind]
        v = [x["tok_s"] for x in rows]
        summary[kind] = {"median_tok_s": statistics.median(v), "min": min(v), "max": max(v),
                         "cv_pct": 100 * statistics.pstdev(v) / statistics.mean(v)}
        for key in ("sm_mhz", "util_pct", "gpu_probe_ms", "engine_cpu_s", "engine_core_probe_ms"):
            summary[kind][f"corr_with_{key}"] = correlation(v, [x.get(key) or 0.0 for x in rows])
        s = summary[kind]
        corrs = "  ".join(f"{key[10:]} {'n/a' if c is None else f'{c:+.2f}'}"
                          for key, c in s.items() if key.startswith("corr_with_"))
        print(f"  {kind:<14} median {s['median_tok_s']:>9.0f} tok/s  range {s['min']:.0f}-{s['max']:.0f}  "
              f"CV {s['cv_pct']:4.1f}%  correlation of tok/s with: {corrs}")
    fresh = [x["tok_s"] for x in report["rows"] if x["kind"] == "fresh-sampled"]
    same = [x["tok_s"] for x in report["rows"] if x["kind"] == "fixed-sampled"]
    summary["corr_fixed_vs_fresh_by_round"] = correlation(same, fresh)
    print(f"  round-by-round correlation of fixed-sampled with fresh-sampled: "
          f"{summary['corr_fixed_vs_fresh_by_round']}")
    report["summary"] = summary
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
