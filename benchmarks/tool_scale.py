"""Tool scale: `scaffold inspect` and `scaffold new` on checkpoints shaped like the largest releases.

Builds sparse checkpoints (real config.json, index and safetensors headers; the tensor data are
holes, so the disk holds a few megabytes) and runs each command in a child process, printing its
wall time and peak RSS (resource usage of that child alone, from os.wait4). Targets: under 2 s and
300 MB for each command.

  moe:   Qwen3-235B-A22B's shape, 94 layers x 128 experts, 118 shards (~36,000 tensors)
  dense: the same attention and 94 layers with a dense MLP, 118 shards (~1,100 tensors)

Usage: python benchmarks/tool_scale.py [--keep DIR] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script: its own folder is first on sys.path, so the sibling module imports as is.
from checkpoints import QWEN3_235B_A22B, decoder_tensors, write_sparse

TARGET_S, TARGET_MB = 2.0, 300.0
SHARDS = 118


def dense_config() -> dict:
    config = {k: v for k, v in QWEN3_235B_A22B.items()
              if k not in ("moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob",
                           "decoder_sparse_step", "mlp_only_layers", "output_router_logits", "router_aux_loss_coef")}
    return {**config, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}


def run(args: list[str]) -> tuple[float, float, float, int, str]:
    """Wall seconds, CPU seconds (user + system), peak RSS in MB, exit code and the last line of stderr,
    of one child process. On a shared machine the CPU time says more than the wall time."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "scaffold.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode, (err.strip().splitlines() or [""])[-1][:200]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="Build the checkpoints here and keep them.")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="tool-scale-"))
    failed = False
    try:
        for name, config, arch in (("moe", QWEN3_235B_A22B, "ScaleQwen3MoeForCausalLM"),
                                   ("dense", dense_config(), "ScaleQwen3ForCausalLM")):
            ckpt = root / name
            t0 = time.perf_counter()
            if not (ckpt / "model.safetensors.index.json").exists():
                write_sparse(ckpt, config, SHARDS, arch)
            claimed = sum(f.stat().st_size for f in ckpt.glob("*.safetensors")) / 2**30
            print(f"{name}: {len(decoder_tensors(config))} tensors in {SHARDS} shards, {claimed:.0f} GiB claimed "
                  f"(built in {time.perf_counter() - t0:.1f} s)")
            for command in (["inspect", str(ckpt)], ["new", str(ckpt), "-o", str(root / f"{name}-port"), "--force"]):
                for _ in range(args.repeats):
                    wall, cpu, rss, code, last = run(command)
                    ok = code == 0 and wall < TARGET_S and rss < TARGET_MB
                    failed |= not ok
                    print(f"  scaffold {command[0]:<8} {wall:6.2f} s wall  {cpu:5.2f} s CPU  {rss:6.0f} MB peak RSS  exit {code}"
                          f"{'' if ok else '  MISSES TARGET' if code == 0 else '  ' + last}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores. targets: < {TARGET_S} s and < {TARGET_MB:.0f} MB per command; "
          f"{'some missed' if failed else 'all met'} (wall times include Python's start; the machine may be shared)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
