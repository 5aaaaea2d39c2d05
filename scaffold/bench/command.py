"""`scaffold bench PORT`: the click command, which turns its options into Settings and runs the bench."""

from __future__ import annotations

import time
from pathlib import Path

import click

from scaffold.bench.report import render_table
from scaffold.bench.run import has_gpu, run_bench
from scaffold.bench.settings import IMPLS, Mix, Settings
from scaffold.text import echo


def parse_mix(name: str, text: str, num_prompts: int) -> Mix:
    try:
        prompt_len, output_len = (int(x) for x in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not IN:OUT (prompt and generated tokens, e.g. 512:16)") from None
    return Mix(name, prompt_len, output_len, num_prompts)


@click.command()
@click.argument("port", type=click.Path(path_type=Path))
@click.option("--checkpoint", type=click.Path(path_type=Path),
              help="Checkpoint to serve (default: the one the port was generated from).")
@click.option("-o", "--out-dir", type=click.Path(path_type=Path), default=Path("bench-results"), show_default=True,
              help="Folder for bench.json, bench.txt, bench.png and the engines' logs.")
@click.option("--quick", is_flag=True, help="A smoke test: tiny workloads, two rounds, eager mode.")
@click.option("--repeats", type=int, help="Interleaved rounds (default 3; --quick: 2).")
@click.option("--prompts", "num_prompts", type=int, help="Prompts per throughput run (default 32; --quick: 4).")
@click.option("--prefill", "prefill", help="Prefill-heavy mix, IN:OUT tokens (default 512:16; --quick: 64:4).")
@click.option("--decode", "decode", help="Decode-heavy mix, IN:OUT tokens (default 32:128; --quick: 8:24).")
@click.option("--latency", "latency", help="Latency requests, IN:OUT tokens (default 128:64; --quick: 16:8).")
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--max-model-len", type=int, help="Default: the longest request, rounded up.")
@click.option("--max-num-seqs", type=int, help="vLLM's max_num_seqs (default: vLLM's).")
@click.option("--eager/--compiled", default=None, help="enforce_eager (default: compiled; --quick: eager).")
@click.option("--multiprocessing/--in-process", "multiprocessing", default=None,
              help="vLLM's engine core in its own process (default: on a GPU yes, on a CPU no).")
@click.option("--gpu-memory-utilization", type=float, default=0.28, show_default=True,
              help="Per engine (three engines share the GPU).")
@click.option("--kv-cache-gib", type=int, default=2, show_default=True, help="Per engine, CPU only.")
@click.option("--model-runner", type=click.Choice(["auto", "v1", "v2"]), default="auto", show_default=True,
              help="vLLM's model runner for every engine (VLLM_USE_V2_MODEL_RUNNER); auto: vLLM's choice, which "
              "in vLLM 0.24 is V2 only for an allowlist of architecture names that a port's name is not on.")
@click.option("--only", "only", multiple=True, type=click.Choice(IMPLS), help="Measure these implementations only.")
def bench(port: Path, checkpoint: Path | None, out_dir: Path, quick: bool, repeats: int | None,
          num_prompts: int | None, prefill: str | None, decode: str | None, latency: str | None, dtype: str,
          max_model_len: int | None, max_num_seqs: int | None, eager: bool | None, multiprocessing: bool | None,
          gpu_memory_utilization: float, kv_cache_gib: int, model_runner: str, only: tuple[str, ...]) -> None:
    """Measure PORT against vLLM's native implementation and the transformers backend, side by side."""
    n = num_prompts or (4 if quick else 32)
    settings = Settings(
        dtype=dtype,
        enforce_eager=quick if eager is None else eager,
        repeats=repeats or (2 if quick else 3),
        mixes=[parse_mix("prefill-heavy", prefill or ("64:4" if quick else "512:16"), n),
               parse_mix("decode-heavy", decode or ("8:24" if quick else "32:128"), n)],
        multiprocessing=has_gpu() if multiprocessing is None else multiprocessing,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_gib=kv_cache_gib,
        max_num_seqs=max_num_seqs,
        model_runner=model_runner,
    )
    lat = parse_mix("latency", latency or ("16:8" if quick else "128:64"), 1)
    settings.latency_prompt_len, settings.latency_output_len = lat.prompt_len, lat.output_len
    if quick:
        settings.latency_batches = 1
    longest = max([m.prompt_len + m.output_len for m in settings.mixes] + [lat.prompt_len + lat.output_len])
    settings.max_model_len = max_model_len or -(-longest // 256) * 256
    started = time.monotonic()
    report = run_bench(port, settings, out_dir, checkpoint, only or IMPLS,
                       progress=lambda line: echo(f"[{time.monotonic() - started:7.1f}s] {line}", err=True))
    echo(render_table(report))
    echo(f"wrote {out_dir / 'bench.json'}, {out_dir / 'bench.txt'} and {out_dir / 'bench.png'}")

