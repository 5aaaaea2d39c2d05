"""What a bench run measures: the three implementations, the workload mixes, the engine settings."""

from __future__ import annotations

from dataclasses import dataclass, field

IMPLS = ("port", "native", "backend")


@dataclass
class Mix:
    name: str
    prompt_len: int
    output_len: int
    num_prompts: int


@dataclass
class Settings:
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    enforce_eager: bool = False
    repeats: int = 3
    mixes: list[Mix] = field(default_factory=list)
    latency_prompt_len: int = 128
    latency_output_len: int = 64
    concurrencies: tuple[int, ...] = (1, 4)
    latency_batches: int = 2  # batches of `concurrency` requests per round
    multiprocessing: bool = False  # vLLM's engine core in a process of its own
    gpu_memory_utilization: float = 0.28  # per engine: three are alive at once
    kv_cache_gib: int = 2  # per engine, CPU only
    max_num_seqs: int | None = None
    model_runner: str = "auto"  # vLLM's choice, or "v1" / "v2" for every engine
    seed: int = 0


def metric_names(settings: Settings) -> list[str]:
    names = [f"{m.name} tok/s" for m in settings.mixes]
    for c in settings.concurrencies:
        names += [f"TTFT c={c} ms", f"ITL c={c} ms"]
    return names


def higher_is_better(metric: str) -> bool:
    return metric.endswith("tok/s")

